"""How :func:`~cdsjax.core.strategies.cds.cds` turns equilibria into a selection, one module per job.

* :mod:`~cdsjax.core.strategies.cds`: the entry point, ``cds(problem, strategy, game, options)``;
* :mod:`~cdsjax.core.strategies.select`: ``Single`` (one equilibrium) and ``Peel`` (supports peeled off);
* :mod:`~cdsjax.core.strategies.support`: ``Support`` (the note block scaled until the support holds the budget);
* :mod:`~cdsjax.core.strategies.shared`: ``Shared`` (a batch of questions over one corpus's note block);
* :mod:`~cdsjax.core.strategies.corpus`: a :class:`~cdsjax.core.types.BlockProblem` solved on its corpus's block.

Import a name from its module; this package re-exports nothing.
"""
