r"""The strategies on one question: a single extraction (:class:`Single`) and peeling (:class:`Peel`)
(affinity -> equilibrium -> top-B notes), for any game (:class:`~cdsjax.core.protocols.Game`)."""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.games.affinity import block_bound, problem_affinity
from cdsjax.core.strategies.corpus import NoCorpusBlock, check_block_problem, problem_block, solve_on_block
from cdsjax.core.adjoints import Adjoint
from cdsjax.core.equilibrium import cds_equilibrium, equilibrium
from cdsjax.core.protocols import Game
from cdsjax.core.ranking import isolated_query, kkt_slack, query_cosine, read_out, read_selection
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import CONVERGED, Affinity, BlockProblem, CDSProblem, Selection, refuse_block_problem


def solve_single(problem: CDSProblem, params: Game, options: SolveOptions, *, budget: int,
                 x0: Optional[Array] = None, adjoint: Optional[Adjoint] = None) -> Selection:
    r"""The :class:`Single` strategy: one extraction on the query-augmented affinity.

    Solves :math:`\max_{x\in\Delta} x^\top M x` with :func:`~cdsjax.core.equilibrium.cds_equilibrium` (from
    ``x0``, else ``options.init``; differentiated by ``adjoint``) and reads the top-``budget`` notes off the
    equilibrium (:func:`~cdsjax.core.ranking.read_out`). ``options`` arrive checked.
    A :class:`~cdsjax.core.types.BlockProblem` (the question with its corpus's note block and bound) is solved on
    them instead, by the same solver and :func:`~cdsjax.core.equilibrium.equilibrium`, without a dense affinity
    (:func:`cdsjax.core.strategies.corpus.solve_on_block`; it has no derivative, and an ``adjoint`` asking for one
    raises ``ValueError``).
    """
    if isinstance(problem, BlockProblem):
        check_block_problem(problem, options, x0, adjoint)
        return solve_on_block(problem, params, options, budget=budget, adjoint=adjoint)
    result, affinity = cds_equilibrium(problem, params, options, x0=x0, adjoint=adjoint)
    dtype = result.x.dtype
    return read_selection(result, affinity, options, budget=budget,
                          cosine=query_cosine(problem.notes, problem.queries, problem.query_scores).astype(dtype),
                          beta=params.strength(dtype))


def solve_peel(problem: CDSProblem, params: Game, options: SolveOptions, *, budget: int,
               adjoint: Optional[Adjoint] = None) -> Selection:
    r"""The :class:`Peel` strategy: peeling extraction for several constraint vertices.

    Extracts a constrained dominant set, removes its support (the notes and the
    constraint vertices it covers), and repeats on what is left until every
    constraint vertex is covered (at most one round per constraint vertex). Notes
    are ranked by round, then by their weight within the round; ``scores`` hold
    those weights. ``result`` is the first round's solver result, with
    ``num_iters`` summed over rounds and ``status`` the first unconverged round's
    (:data:`~cdsjax.core.types.CONVERGED` only if every round converged). ``support_size`` counts the notes of every round's
    support; when they are fewer than ``budget``, the fill rule
    (:mod:`cdsjax.core.ranking`) completes the picks using the first round's slack.
    Every round starts uniformly (``options.init`` is not used); each round's equilibrium is found on its
    dense payoff and differentiated by ``adjoint``. A :class:`~cdsjax.core.types.BlockProblem` raises ``ValueError``.
    """
    refuse_block_problem(problem, "Peel()")
    notes, query = problem.notes, problem.queries
    solver = options.limited_solver()
    threshold = options.threshold
    base = problem_affinity(problem, params)
    m = base.num_queries
    n = notes.shape[0]
    max_rounds = m + n
    dtype = base.matrix.dtype

    def extract(state):
        active, uncovered, rank_key, total_iters, status, r = state
        res = equilibrium(_restrict(base, active, params), solver, adjoint=adjoint, threshold=threshold)
        support = active & (res.x > threshold)
        new_notes = support & ~base.constraint
        # Earlier rounds rank above later ones: key = (max_rounds - r) + x, x in [0, 1].
        rank_key = jnp.where(new_notes, (max_rounds - r).astype(dtype) + res.x, rank_key)
        covered = uncovered & support
        # A round that covers nothing would repeat forever: give up on the rest.
        uncovered = jnp.where(jnp.any(covered), uncovered & ~covered, jnp.zeros_like(uncovered))
        # the first round that did not converge decides the status
        status = jnp.where(status == CONVERGED, res.status, status)
        state = (active & ~support, uncovered, rank_key, total_iters + res.num_iters, status, r + 1)
        return state, res

    init = (
        base.valid,
        base.constraint & base.valid,
        jnp.full((m + n,), -jnp.inf, dtype),
        jnp.asarray(0, jnp.int32),
        jnp.asarray(0, jnp.int32),
        jnp.asarray(0, jnp.int32),
    )
    state, first = extract(init)
    state = lax.while_loop(
        lambda s: jnp.any(s[1]) & (s[5] < max_rounds),
        lambda s: extract(s)[0],
        state,
    )
    _, _, rank_key, total_iters, status, _ = state
    note_key = rank_key[m:]
    result = first.replace(num_iters=total_iters, status=status)
    # every round's support has key >= 1 > threshold; the fill uses the first round's point and slack
    sel = read_out(result, base.valid[m:], budget=budget, threshold=threshold,
                   slack=kkt_slack(_restrict(base, base.valid, params), first.x) if options.fill else None,
                   cosine=query_cosine(notes, query, problem.query_scores).astype(dtype), isolated=isolated_query(base),
                   beta=params.strength(dtype), rank=note_key)
    # support picks fill the first slots; their score is the weight within their round
    in_support = jnp.arange(budget) < sel.support_size
    picked = jnp.where(in_support, note_key[sel.indices], 0.0)
    return sel.replace(scores=jnp.where(in_support, picked - jnp.ceil(picked - 1.0), sel.scores))


def _restrict(base: Affinity, active: Array, params: Game) -> Affinity:
    """The affinity of the subgraph on ``active`` vertices, with its own penalty (the game's rule)."""
    # An empty graph would make the uniform start 0/0; solve the base one instead
    # (callers only read rounds that still have an active constraint vertex).
    active = jnp.where(jnp.any(active), active, base.valid)
    pair = active[:, None] & active[None, :]
    matrix = jnp.where(pair, base.matrix, 0.0)
    constraint = base.constraint & active
    if params.alpha_from == "free":
        mask = active & ~constraint
    else:
        mask = active
    alpha = params.penalty(block_bound(matrix, mask, params))
    return Affinity(matrix=matrix, constraint=constraint, valid=active, alpha=alpha, num_queries=base.num_queries)


def refuse_start(x0: Optional[Array], strategy: str) -> None:
    """Raises ``ValueError`` when a start ``x0`` is given to ``strategy`` (its name), which takes none."""
    if x0 is not None:
        raise ValueError(f"x0 is only used by the Single() strategy, not {strategy}")


@struct.dataclass
class Single:
    r"""One extraction (:func:`solve_single`): every query row is a constraint vertex; a
    :class:`~cdsjax.core.types.BlockProblem` is solved on its corpus's note block."""

    def __call__(self, problem: CDSProblem, params: Game, options: SolveOptions, *, budget: int,
                 adjoint: Optional[Adjoint] = None, x0: Optional[Array] = None) -> Selection:
        return solve_single(problem, params, options, budget=budget, x0=x0, adjoint=adjoint)

    def corpus_bound(self, problem: CDSProblem, params: Game) -> Optional[Array]:
        """The game's corpus bound (:meth:`~cdsjax.core.protocols.Game.corpus_bound`)."""
        return params.corpus_bound(problem)

    def corpus_block(self, problem: CDSProblem, params: Game, options: SolveOptions) -> Optional[Array]:
        """The game's note block where a question can be solved on it
        (:func:`~cdsjax.core.strategies.corpus.problem_block`), None where it cannot."""
        try:
            return problem_block(problem, params, options)
        except NoCorpusBlock:
            return None


@struct.dataclass
class Peel:
    r"""Peeling extraction (:func:`solve_peel`): supports removed round by round until every constraint vertex
    is covered. Takes no start and no :class:`~cdsjax.core.types.BlockProblem`."""

    def __call__(self, problem: CDSProblem, params: Game, options: SolveOptions, *, budget: int,
                 adjoint: Optional[Adjoint] = None, x0: Optional[Array] = None) -> Selection:
        refuse_start(x0, "Peel()")
        return solve_peel(problem, params, options, budget=budget, adjoint=adjoint)

    def corpus_bound(self, problem: CDSProblem, params: Game) -> Optional[Array]:
        """The game's corpus bound, which the first round uses (later rounds find their own)."""
        return params.corpus_bound(problem)

    def corpus_block(self, problem: CDSProblem, params: Game, options: SolveOptions) -> None:
        """None: every round solves its dense game."""
        return None
