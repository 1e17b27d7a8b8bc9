r"""One entry point for constrained-dominant-set selection: :func:`cds` on a :class:`CDSProblem`.

Every CDS selection goes through :func:`cds`, which checks the budget, the options and the solver
once, then runs a **strategy**, an object the caller picks:

* :class:`~cdsjax.core.strategies.select.Single` (the default): one extraction; every query row is a
  constraint vertex; a :class:`~cdsjax.core.types.BlockProblem` is solved on its corpus's note block.
* :class:`~cdsjax.core.strategies.select.Peel`: repeated extraction until every constraint vertex is covered.
* :class:`~cdsjax.core.strategies.support.Support` (``num_steps``, ``scale_range``): :math:`\beta` chosen per
  question so the support holds about ``budget`` notes.
* :class:`~cdsjax.core.strategies.shared.Shared` (``corpus``): ``b`` questions (the query rows) on one corpus,
  without per-question dense payoffs.

A strategy carries its own settings and says what it computes once per corpus (``corpus_bound``,
``corpus_block``), so neither a game nor the registry asks which one it is; a strategy that cannot use what it
is given (a start, a :class:`~cdsjax.core.types.BlockProblem`, an adjoint) raises ``ValueError`` saying why.

The game is data: ``params`` is the paper's :class:`CDSParams` or the learned game's
:class:`~cdsjax.core.games.learned.LearnedParams` (any :class:`~cdsjax.core.protocols.Game`), built by the one
affinity builder (:func:`cdsjax.core.games.affinity.problem_affinity`) under every strategy. How to
differentiate is an argument too (``adjoint``, as in optimistix), applied once, by
:func:`cdsjax.core.equilibrium.equilibrium`, the one solve every strategy runs; the caller's adjoint is used or
refused, never replaced.

Each strategy reads its notes with the one read-out (:func:`cdsjax.core.ranking.read_out`), so
``options.fill`` and ``options.threshold`` mean the same everywhere, and every strategy runs the solver object
``options.solver`` (default ``Replicator()``, paper mode; registry selectors give theirs) as it is given.

The array-taking wrappers (``cds_select``, ``cds_peel``, ``cds_support``, ``cds_select_shared``) are in
:mod:`cdsjax.core.compat`.
"""

from __future__ import annotations

from typing import Optional

from jax import Array

from cdsjax.core.games.affinity import CDSParams
from cdsjax.core.adjoints import Adjoint, check_adjoint
from cdsjax.core.protocols import Game, Strategy
from cdsjax.core.strategies.select import Single
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.types import CDSProblem, Selection
from cdsjax.core.validation import check_budget


def check_strategy(strategy) -> Strategy:
    """``strategy`` if it is a strategy object (callable, with ``corpus_bound`` and ``corpus_block``);
    ``TypeError`` otherwise (a name is not one: pick ``Single()``, ``Peel()``, ``Support()`` or ``Shared()``)."""
    if not (callable(strategy) and callable(getattr(strategy, "corpus_bound", None))
            and callable(getattr(strategy, "corpus_block", None))):
        raise TypeError(f"strategy must be a strategy object such as Single(), Peel(), Support() or Shared(), "
                        f"got {strategy!r}")
    return strategy.check() if callable(getattr(strategy, "check", None)) else strategy


def cds(
    problem: CDSProblem,
    strategy: Strategy = Single(),
    params: Game = CDSParams(),
    options: Optional[SolveOptions] = None,
    *,
    budget: int,
    x0: Optional[Array] = None,
    adjoint: Optional[Adjoint] = None,
    **overrides,
) -> Selection:
    r"""Selects evidence for ``problem`` as a constrained dominant set.

    Builds the query-augmented affinity, solves :math:`\max_{x\in\Delta} x^\top M x` and keeps the
    top-``budget`` notes by equilibrium weight above ``options.threshold``; when fewer clear it and
    ``options.fill`` is set, the fill rule (:mod:`cdsjax.core.ranking`: KKT slack, then cosine)
    completes the picks and ``num_filled`` / ``fill_reason`` say so.

    Args:
      problem: the :class:`CDSProblem` (``CDSProblem.create(notes, query, valid, ...)``) or a
        :class:`~cdsjax.core.types.BlockProblem` (``Single`` only).
      strategy: ``Single()`` (default), ``Peel()``, ``Support(num_steps=, scale_range=)`` or
        ``Shared(corpus=)`` (module docstring), or a user's own :class:`~cdsjax.core.protocols.Strategy`.
      params: the game: :class:`CDSParams` (the paper's) or :class:`~cdsjax.core.games.learned.LearnedParams`
        (the learned one; it reads the problem's structure arrays).
      options: :class:`SolveOptions` (the solver object, threshold, limits, init, fill); its default solver is
        ``Replicator()`` (paper mode).
      budget: static number of notes to return (no default here: the product layer holds it, cdsjax.defaults.DEFAULT_BUDGET).
      x0: ``Single`` only, an ``[m+n]`` initial point; overrides ``options.init``.
      adjoint: how the equilibrium is differentiated: :class:`~cdsjax.core.ImplicitAdjoint`,
        :class:`~cdsjax.core.ForwardLoopAdjoint`, :class:`~cdsjax.core.NoDerivative` or :class:`~cdsjax.core.NoAdjoint`;
        None: the strategy's default (the implicit one on a dense game, through the loop for ``Shared`` on the
        paper's game, none on a :class:`~cdsjax.core.types.BlockProblem`). A given adjoint is used or refused
        (``ValueError``), never replaced.
      **overrides: :class:`SolveOptions` fields replacing those of ``options``.

    Returns:
      :class:`Selection` with ``result`` (the solver diagnostics), ``support_size`` (notes only),
      ``num_filled``, ``fill_reason`` and ``beta``; for ``Shared`` every leaf has a leading
      question axis.

    Raises:
      ValueError: a bad budget or option value, or an input the strategy cannot use.
      TypeError: a strategy or solver that is not an object of its kind, or an override that is not a
        :class:`SolveOptions` field.
    """
    strategy = check_strategy(strategy)
    if not isinstance(problem, CDSProblem):
        raise TypeError(f"problem must be a CDSProblem (CDSProblem.create), got {type(problem).__name__}")
    budget = check_budget(budget)
    options = solve_options(options, **overrides)
    params = params.check()
    adjoint = None if adjoint is None else check_adjoint(adjoint)
    return strategy(problem, params, options, budget=budget, adjoint=adjoint, x0=x0)
