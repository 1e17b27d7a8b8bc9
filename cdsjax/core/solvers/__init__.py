"""Solvers of :math:`\\max_{x\\in\\Delta} x^\\top M x`, one module per job.

* :mod:`~cdsjax.core.solvers.loop`: the one ``lax.while_loop`` every iterative solver runs (:func:`iterate`,
  :class:`LoopState`, :func:`stop_rule`);
* the step rules: :mod:`~cdsjax.core.solvers.replicator` (:class:`Replicator`), :mod:`~cdsjax.core.solvers.inimdyn`
  (:class:`InImDyn`), :mod:`~cdsjax.core.solvers.active_set` (:class:`ActiveSet`) and
  :mod:`~cdsjax.core.solvers.pdas` (:class:`PrimalDualActiveSet`);
* :mod:`~cdsjax.core.solvers.options`: :class:`SolveOptions`, the combinations :class:`WithFallback`,
  :class:`WarmStart` and :class:`ByPayoff`, :data:`SERVING_SOLVER`, :func:`solver_from_name` (the one conversion
  of a solver's name) and :func:`solve`.

Import a name from its module; this package re-exports nothing.
"""
