r"""One corpus, many questions one at a time: the note block built once, each question O(n d) plus its solve.

A served corpus answers one question after another with the same notes. For the paper's game and the
learned game without relevance-weighted repulsion the payoff of a single-vertex question is

.. math:: M = \begin{pmatrix} 0 & r^\top \\ r & W - \alpha I \end{pmatrix},

where only the relevance row :math:`r` reads the question: the note block :math:`W` and the penalty
:math:`\alpha` are the corpus's (:mod:`cdsjax.core.games.spectral` gives the bound once). Building :math:`W` costs
O(n² d) per question (0.4 GFLOP at n = 1024, 38 at 10,000), and solving on the dense ``[n+1, n+1]``
affinity adds copies of it; :func:`problem_block` builds :math:`W` once (the same functions as the dense
affinity), and a question posed with it (a :class:`~cdsjax.core.types.BlockProblem`, with ``bound``) is solved by
:func:`solve_on_block` on a :class:`~cdsjax.core.games.payoff.SharedPayoff` (products and rows of :math:`W`, no
per-question matrix).

The equilibrium is found by the selector's solver (``SolveOptions.solver``) on that payoff: the
serving solver (:data:`~cdsjax.core.solvers.options.SERVING_SOLVER`) runs the primal-dual active set from the query
and the most relevant quarter of the notes (2-5 face solves, each gathered into the smallest capacity that
holds the support) and, where it does not converge (a payoff it cycles on, a support past 8,192 notes), the
active set from the uniform start with its vertex steps first and its Newton systems gathered; InImDyn runs
as configured. Paper mode (replicator dynamics, whose ``uses_corpus_block`` is False) keeps the dense payoff it
is defined on: no block is built for it. It stops, as every converged solve does, on the Nash error over all ``n`` vertices.

The block is stored, not built from the game's differentiable values, so this solve has no derivative: it
runs under :class:`~cdsjax.core.implicit.NoAdjoint` (differentiating it raises ``ValueError`` as JAX traces the
derivative), and asking for one (an ``adjoint``) raises at the call; give the question as a plain
:class:`~cdsjax.core.types.CDSProblem` (the dense path) to differentiate a selection.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax import Array

from cdsjax.core.implicit import NoAdjoint, equilibrium
from cdsjax.core.games.payoff import SharedPayoff
from cdsjax.core.ranking import query_cosine, read_out
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import BlockProblem, CDSProblem, Selection

BLOCK_ADJOINT = NoAdjoint("a BlockProblem is solved on its corpus block, which has no derivative: give the question "
                          "as a CDSProblem (BlockProblem.dense_problem(), the dense path) to differentiate the selection")


def problem_block(problem: CDSProblem, params, options: SolveOptions, strategy: str = "single") -> Optional[Array]:
    r"""The note block :math:`W` ``[n, n]`` the game ``params`` uses on ``problem``'s corpus, built once for every
    question (as the dense affinity builds it); None where :func:`solve_on_block` does not apply: another
    strategy than ``"single"``, several query rows, pinned notes, ``alpha_from="full"``, a start other than
    uniform (``init``, ``warm_start``), paper mode, or a note block that reads the question (a learned game
    with relevance-weighted repulsion, any other game)."""
    options = options.check()
    if (strategy != "single" or problem.queries.shape[-2] != 1 or problem.pinned is not None
            or params.alpha_from != "free" or options.init != "uniform" or options.warm_start is not None
            or not options.solver.uses_corpus_block):
        return None
    return params.corpus_block(problem)


def check_block_problem(problem: BlockProblem, options: SolveOptions, x0: Optional[Array], adjoint) -> None:
    """Raises ``ValueError`` naming what keeps ``problem`` (a :class:`BlockProblem`) off its corpus block:
    no ``bound``, several query rows, pinned notes, a start (``x0``, ``init``, ``warm_start``), paper mode, or
    an ``adjoint`` (a derivative asked of a solve that has none)."""
    reasons = [why for bad, why in (
        (problem.bound is None, "it carries no bound"),
        (problem.queries.shape[-2] != 1, "it has several query rows"),
        (problem.pinned is not None, "it pins notes"),
        (x0 is not None or options.init != "uniform" or options.warm_start is not None, "a start is given"),
        (not options.solver.uses_corpus_block, f"its solver ({options.solver.name}) runs on the dense payoff"),
        (adjoint is not None, "a derivative (adjoint) is asked of it, and the corpus block has none"),
    ) if bad]
    if reasons:
        raise ValueError(f"a BlockProblem is solved on its corpus block, but {'; '.join(reasons)}: give the "
                         "question as a CDSProblem (BlockProblem.dense_problem(), the dense path)")


def solve_on_block(problem: BlockProblem, params, options: SolveOptions, *, budget: int) -> Selection:
    r"""One question's ``"single"`` selection on the corpus's note block (module docstring).

    ``problem`` is a :class:`BlockProblem`: its ``note_block`` (:func:`problem_block`) and ``bound``
    (:func:`cdsjax.core.games.spectral.problem_bound`) of the game ``params`` (:func:`check_block_problem` says
    where it may not); the read-out (threshold, fill rule by the KKT slack, then cosine) is that of the dense
    path. :func:`~cdsjax.core.implicit.equilibrium` runs it under :data:`BLOCK_ADJOINT`: differentiating it (in
    the notes, the question, the block or the game) raises :class:`ValueError`; the dense path
    (:meth:`BlockProblem.dense_problem`) is differentiable.
    """
    solver = options.limited_solver()
    n = problem.notes.shape[0]
    if problem.note_block.shape[-2:] != (n, n):
        raise ValueError(f"note_block must have shape ({n}, {n}), got {problem.note_block.shape}")

    rel = params.relevance(problem)
    dtype = rel.dtype
    payoff = SharedPayoff(coupling=jnp.asarray(problem.note_block, dtype), rel=rel[0], note_valid=problem.valid,
                          alpha=params.penalty(jnp.asarray(problem.bound).astype(dtype)),
                          corpus_shift=jnp.zeros((), dtype))
    result = equilibrium(payoff, solver, adjoint=BLOCK_ADJOINT, threshold=options.threshold)
    rel = payoff.rel
    slack = None
    if options.fill:
        mx = payoff.matvec(result.x)
        slack = (mx - payoff.value(result.x, mx))[1:]
    return read_out(result, problem.valid, budget=budget, threshold=options.threshold, slack=slack,
                    cosine=query_cosine(problem.notes, problem.queries).astype(dtype),
                    isolated=~jnp.any((rel > 0) & problem.valid), beta=params.strength(dtype))
