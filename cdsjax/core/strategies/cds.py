r"""One entry point for constrained-dominant-set selection: :func:`cds` on a :class:`CDSProblem`.

Every CDS selection goes through :func:`cds`, which checks the budget, the options and the solver
once, then runs a **strategy**:

* ``"single"`` (:func:`~cdsjax.core.strategies.select.solve_single`): one extraction; every query row is a
  constraint vertex.
* ``"peel"`` (:func:`~cdsjax.core.strategies.select.solve_peel`): repeated extraction until every constraint
  vertex is covered.
* ``"support"`` (:func:`~cdsjax.core.strategies.support.solve_support`): :math:`\beta` chosen per question so
  the support holds about ``budget`` notes.
* ``"shared"`` (:func:`~cdsjax.core.strategies.shared.solve_shared`): ``b`` questions (the query rows) on one
  corpus, without per-question dense payoffs.

The game is data: ``params`` is the paper's :class:`CDSParams` or the learned game's
:class:`~cdsjax.core.games.learned.LearnedParams` (any :class:`~cdsjax.core.protocols.Game`), built by the one
affinity builder (:func:`cdsjax.core.games.affinity.problem_affinity`) under every strategy. How to
differentiate is an argument too (``adjoint``, as in optimistix), applied once, by
:func:`cdsjax.core.implicit.equilibrium`, the one solve every strategy runs; a question posed with its corpus
block (a :class:`~cdsjax.core.types.BlockProblem`, :func:`cdsjax.core.strategies.corpus.solve_on_block`) has no derivative,
and says so.

Each strategy reads its notes with the one read-out (:func:`cdsjax.core.ranking.read_out`), so
``options.fill`` and ``options.threshold`` mean the same everywhere, and every strategy runs the solver object
``options.solver`` (default ``Replicator()``, paper mode; registry selectors give theirs).

The array-taking wrappers (``cds_select``, ``cds_peel``, ``cds_support``, ``cds_select_shared``) are in
:mod:`cdsjax.core.compat`.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from jax import Array

from cdsjax.core.games.affinity import CDSParams
from cdsjax.core.implicit import Adjoint, check_adjoint
from cdsjax.core.protocols import Game
from cdsjax.core.strategies.select import solve_peel, solve_single
from cdsjax.core.strategies.shared import CorpusAffinity, solve_shared
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.strategies.support import solve_support
from cdsjax.core.types import CDSProblem, Selection
from cdsjax.core.validation import check_budget, check_option

# strategy name -> fn(problem, params, options (checked), *, budget, adjoint, **extra) -> Selection
STRATEGIES: Dict[str, Callable[..., Selection]] = {
    "single": solve_single,
    "peel": solve_peel,
    "support": solve_support,
    "shared": solve_shared,
}


def cds(
    problem: CDSProblem,
    strategy: str = "single",
    params: Game = CDSParams(),
    options: Optional[SolveOptions] = None,
    *,
    budget: int = 10,
    x0: Optional[Array] = None,
    corpus: Optional[CorpusAffinity] = None,
    adjoint: Optional[Adjoint] = None,
    num_steps: Optional[int] = None,
    scale_range: Optional[tuple] = None,
    **overrides,
) -> Selection:
    r"""Selects evidence for ``problem`` as a constrained dominant set.

    Builds the query-augmented affinity, solves :math:`\max_{x\in\Delta} x^\top M x` and keeps the
    top-``budget`` notes by equilibrium weight above ``options.threshold``; when fewer clear it and
    ``options.fill`` is set, the fill rule (:mod:`cdsjax.core.ranking`: KKT slack, then cosine)
    completes the picks and ``num_filled`` / ``fill_reason`` say so.

    Args:
      problem: the :class:`CDSProblem` (``CDSProblem.create(notes, query, valid, ...)``).
      strategy: ``"single"``, ``"peel"``, ``"support"`` or ``"shared"`` (module docstring).
      params: the game: :class:`CDSParams` (the paper's) or :class:`~cdsjax.core.games.learned.LearnedParams`
        (the learned one; it reads the problem's structure arrays).
      options: :class:`SolveOptions` (the solver object, threshold, limits, init, warm start, fill); its
        default solver is ``Replicator()`` (paper mode).
      budget: static number of notes to return.
      x0: ``"single"`` only, an ``[m+n]`` initial point; overrides ``options.init``.
      corpus: ``"shared"`` only, a precomputed :func:`~cdsjax.core.strategies.shared.corpus_affinity` of the notes.
      adjoint: how the equilibrium is differentiated: :class:`~cdsjax.core.ImplicitAdjoint` (None: the
        default) or :class:`~cdsjax.core.LoopAdjoint`; ``Selection.result.x`` and ``scores`` then carry
        that derivative (``"shared"`` with the paper's game differentiates through its loop). A
        :class:`~cdsjax.core.types.BlockProblem` has no derivative: an adjoint given with it raises
        ``ValueError``.
      num_steps, scale_range: ``"support"`` only, its bisection steps and the bracket of
        :math:`\gamma = \beta n` (:func:`~cdsjax.core.strategies.support.support_settings`; None: the defaults).
      **overrides: :class:`SolveOptions` fields replacing those of ``options``.

    Returns:
      :class:`Selection` with ``result`` (the solver diagnostics), ``support_size`` (notes only),
      ``num_filled``, ``fill_reason`` and ``beta``; for ``"shared"`` every leaf has a leading
      question axis.

    Raises:
      ValueError: an unknown strategy, a bad budget or option value, or an argument the strategy does not take.
      TypeError: an override that is not a :class:`SolveOptions` field, or a solver that is not a solver object.
    """
    check_option("strategy", strategy, tuple(STRATEGIES))
    if not isinstance(problem, CDSProblem):
        raise TypeError(f"problem must be a CDSProblem (CDSProblem.create), got {type(problem).__name__}")
    budget = check_budget(budget)
    options = solve_options(options, **overrides)
    params = params.check()
    # None reaches the strategy as None: the dense solves take ImplicitAdjoint for it, the corpus block (which
    # has no derivative) takes it as no derivative asked
    extra = {"adjoint": None if adjoint is None else check_adjoint(adjoint)}
    if x0 is not None:
        if strategy != "single":
            raise ValueError(f"x0 is only used by the 'single' strategy, not {strategy!r}")
        extra["x0"] = x0
    for name, value in (("num_steps", num_steps), ("scale_range", scale_range)):
        if value is not None:
            if strategy != "support":
                raise ValueError(f"{name} is only used by the 'support' strategy, not {strategy!r}")
            extra[name] = value
    if corpus is not None:
        if strategy != "shared":
            raise ValueError(f"corpus is only used by the 'shared' strategy, not {strategy!r}")
        extra["corpus"] = corpus
    return STRATEGIES[strategy](problem, params, options, budget=budget, **extra)
