r"""The one solve: :func:`equilibrium` (a game, a solver, a start, an adjoint) and :func:`cds_equilibrium`, a
problem's equilibrium on its dense game, differentiable in the game's parameters.

:func:`equilibrium` is the one solve every strategy runs and the one place an adjoint is applied;
:func:`cds_equilibrium` is what :func:`cdsjax.core.strategies.cds` reads its selections off, and what the
retrieval objectives of :mod:`cdsjax.core.surrogates` differentiate, for the paper's game and the learned one alike.
"""

from __future__ import annotations

from typing import Optional

from jax import Array

from cdsjax.core.adjoints import Adjoint, check_adjoint
from cdsjax.core.games.affinity import CDSParams, problem_affinity
from cdsjax.core.games.payoff import DensePayoff
from cdsjax.core.graph import diffusion_prior
from cdsjax.core.protocols import Game
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.solvers.replicator import softmax_prior
from cdsjax.core.types import INITS, SUPPORT_THRESHOLD, Affinity, CDSProblem, SolverResult
from cdsjax.core.validation import check_option


def equilibrium(game, solver, x0=None, *, adjoint=None, threshold: float = SUPPORT_THRESHOLD) -> SolverResult:
    r"""The equilibrium of ``game`` found by ``solver`` and differentiated by ``adjoint``: the one solve every
    strategy runs, the adjoint applied here and nowhere else.

    Args:
      game: the problem of :math:`\max_{x\in\Delta} x^\top M x`: an :class:`Affinity` (a question's dense
        game, solved on its :class:`~cdsjax.core.games.payoff.DensePayoff`) or a payoff stored in another form
        (:class:`~cdsjax.core.games.payoff.SharedPayoff`: a question's corpus block, or the questions of the
        ``Shared`` strategy).
      solver: the solver object (:mod:`cdsjax.core.solvers.options`).
      x0: the start: None (the solver's own), a point, or a function of the game (as the adjoint hands it to
        the solve: gradient-stopped under :class:`~cdsjax.core.adjoints.ImplicitAdjoint`) that returns one.
      adjoint: :class:`~cdsjax.core.adjoints.ImplicitAdjoint` (None; a dense game only: ``TypeError`` on another payoff),
        :class:`~cdsjax.core.adjoints.ForwardLoopAdjoint` (through the iterations), :class:`~cdsjax.core.adjoints.NoDerivative` (a constant) or :class:`~cdsjax.core.adjoints.NoAdjoint`
        (a derivative refused, saying why); used as given.
      threshold: the support threshold of the implicit derivative.

    Returns:
      The :class:`~cdsjax.core.SolverResult`; its ``solvers`` / ``ran`` say which solver gave the point (a
      fallback taken included).
    """
    adjoint = check_adjoint(adjoint)

    def run(g):
        start = x0(g) if callable(x0) else x0
        return solver.solve(DensePayoff.from_affinity(g) if isinstance(g, Affinity) else g, start)

    return adjoint.apply(run, game, threshold)


def initial_point(
    affinity: Affinity, init: str = "uniform", temperature: float = 0.1, links: Optional[Array] = None
) -> Optional[Array]:
    """The solver's starting point: None (uniform), the query-softmax or the graph-diffusion prior."""
    check_option("init", init, INITS)
    if init == "softmax":
        return softmax_prior(affinity, temperature)
    if init == "diffusion":
        if links is None:
            raise ValueError("init='diffusion' needs links ([n, n] bool note-link adjacency)")
        return diffusion_prior(affinity, links, temperature)
    return None


def cds_equilibrium(
    problem: CDSProblem,
    params: Game = CDSParams(),
    options: Optional[SolveOptions] = None,
    *,
    x0: Optional[Array] = None,
    adjoint: Optional[Adjoint] = None,
    **overrides,
) -> tuple[SolverResult, Affinity]:
    r"""The equilibrium of a CDS problem, differentiable in the game's parameters: the one solve every
    dense strategy of :func:`cdsjax.core.strategies.cds` runs, and the entry point for derivatives.

    Args:
      problem: the :class:`CDSProblem` (one question; its structure arrays reach a game that reads them, its
        ``pinned`` notes join the constraint set). Notes and queries must be L2-normalised (the game reads dot
        products as cosines; :func:`~cdsjax.core.surrogates.retrieval_surrogates` checks concrete ones,
        :func:`~cdsjax.core.validation.check_unit_norm`).
      params: the game: :class:`CDSParams` (``beta`` and ``tau`` are differentiable leaves; ``tau`` only in
        ``tau_mode="soft"``) or :class:`~cdsjax.core.games.learned.LearnedParams` (every leaf).
      options: :class:`SolveOptions`: ``solver`` (default ``Replicator()``, paper mode; pass a converged one,
        e.g. ``ActiveSet()`` or ``WarmStart(Replicator(), ActiveSet())``, for exact derivatives), ``tol`` /
        ``max_iter``, ``init`` (the start when ``x0`` is None) and ``threshold`` (the support of the implicit
        system).
      x0: optional ``[m+n]`` initial point (overrides ``options.init``).
      adjoint: how to differentiate: :class:`~cdsjax.core.adjoints.ImplicitAdjoint` (None; KKT implicit function, forward and
        reverse mode, solver-independent), :class:`~cdsjax.core.adjoints.ForwardLoopAdjoint` (forward mode through the iterations),
        :class:`~cdsjax.core.adjoints.NoDerivative` or :class:`~cdsjax.core.adjoints.NoAdjoint`.
      **overrides: :class:`SolveOptions` fields replacing those of ``options``.

    Returns:
      ``(result, affinity)``: the :class:`SolverResult` with differentiable ``x`` (``[m+n]``, queries first;
      the diagnostics are those of the solve, without derivatives) and the differentiable
      :class:`Affinity`. The derivative is only right where ``result.status == CONVERGED`` holds.
    """
    options = solve_options(options, **overrides)
    solver = options.limited_solver()

    def start(aff):
        return initial_point(aff, options.init, options.prior_temperature, problem.links) if x0 is None else x0

    affinity = problem_affinity(problem, params.check())
    return equilibrium(affinity, solver, start, adjoint=adjoint, threshold=options.threshold), affinity
