r"""One corpus, many questions one at a time: the note block built once, each question O(n d) plus its solve.

A served corpus answers one question after another with the same notes. For the paper's game and the
learned game without relevance-weighted repulsion the payoff of a single-vertex question is

.. math:: M = \begin{pmatrix} 0 & r^\top \\ r & W - \alpha I \end{pmatrix},

where only the relevance row :math:`r` reads the question: the note block :math:`W` and the penalty
:math:`\alpha` are the corpus's (:mod:`cdsjax.core.games` gives the bound once). Building :math:`W` costs
O(n² d) per question (0.4 GFLOP at n = 1024, 38 at 10,000), and solving on the dense ``[n+1, n+1]``
affinity adds copies of it; :func:`problem_block` builds :math:`W` once (the same functions as the dense
affinity), and a question posed with it (a :class:`~cdsjax.core.types.BlockProblem`, with ``bound``) is solved by
:func:`solve_on_block` on a :class:`~cdsjax.core.games.payoff.SharedPayoff` (products and rows of :math:`W`, no
per-question matrix).

The equilibrium is found by the selector's solver (``SolveOptions.solver``) on that payoff: the
serving solver (:data:`~cdsjax.core.solvers.options.SERVING_SOLVER`, whose ``block`` part runs on it) runs the
primal-dual active set from the query and the most relevant quarter of the notes (2-5 face solves, each gathered
into the smallest capacity that holds the support) and, where it does not converge (a payoff it cycles on, a
support past 8,192 notes), the active set from the uniform start with its vertex steps first and its Newton
systems gathered; InImDyn and the others run as configured (replicator dynamics with the shift of the dense
payoff). Whether a selector poses its questions on the block at all is the selector's choice (the registry's
``cds`` keeps paper mode on the dense payoff it is defined on).

The block is stored, not built from the game's differentiable values, so this solve has no derivative: it
runs under :class:`~cdsjax.core.adjoints.NoAdjoint` (differentiating it raises ``ValueError`` as JAX traces the
derivative), and asking for one (an adjoint other than ``NoAdjoint`` / ``NoDerivative``) raises at the call;
give the question as a plain :class:`~cdsjax.core.types.CDSProblem` (the dense path) to differentiate a
selection.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax import Array

from cdsjax.core.adjoints import NoAdjoint
from cdsjax.core.equilibrium import equilibrium
from cdsjax.core.games.payoff import SHIFT_EPS, SharedPayoff
from cdsjax.core.ranking import query_cosine, read_out
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import BlockProblem, CDSProblem, Selection

BLOCK_ADJOINT = NoAdjoint("a BlockProblem is solved on its corpus block, which has no derivative: give the question "
                          "as a CDSProblem (BlockProblem.dense_problem(), the dense path) to differentiate the selection")


class NoCorpusBlock(ValueError):
    """A question that cannot be solved on its corpus's note block; the message says why."""


def problem_block(problem: CDSProblem, params, options: SolveOptions) -> Array:
    r"""The note block :math:`W` ``[n, n]`` the game ``params`` uses on ``problem``'s corpus, built once for every
    question (as the dense affinity builds it).

    Raises:
      NoCorpusBlock: where :func:`solve_on_block` does not apply, saying why: several query rows, pinned notes,
        ``alpha_from="full"``, a start other than uniform (``init``), or a note block that reads the question
        (a learned game with relevance-weighted repulsion, any other game). Every reason is static (shapes,
        options, the game's kind), so it is raised while tracing.
    """
    options = options.check()
    reasons = [why for bad, why in (
        (problem.queries.shape[-2] != 1, "it has several query rows"),
        (problem.pinned is not None, "it pins notes"),
        (params.alpha_from != "free", 'its penalty reads the question (alpha_from="full")'),
        (options.init != "uniform", f"its start is not uniform (init={options.init!r})"),
    ) if bad]
    block = None if reasons else params.corpus_block(problem)
    if block is None:
        raise NoCorpusBlock("no corpus block for this question: "
                            + ("; ".join(reasons) or f"the note block of {type(params).__name__} reads the question"))
    return block


def check_block_problem(problem: BlockProblem, options: SolveOptions, x0: Optional[Array], adjoint) -> None:
    """Raises ``ValueError`` naming what keeps ``problem`` (a :class:`BlockProblem`) off its corpus block:
    several query rows, pinned notes, a start (``x0``, ``init``), or an ``adjoint`` that asks for a derivative
    (the corpus block has none; ``NoAdjoint()`` / ``NoDerivative()`` are taken as given)."""
    reasons = [why for bad, why in (
        (problem.queries.shape[-2] != 1, "it has several query rows"),
        (problem.pinned is not None, "it pins notes"),
        (x0 is not None or options.init != "uniform", "a start is given"),
        (adjoint is not None and getattr(adjoint, "gives_derivative", True),
         f"an adjoint ({type(adjoint).__name__}) asks for a derivative, and the corpus block has none"),
    ) if bad]
    if reasons:
        raise ValueError(f"a BlockProblem is solved on its corpus block, but {'; '.join(reasons)}: give the "
                         "question as a CDSProblem (BlockProblem.dense_problem(), the dense path)")


def block_shift(note_block: Array, rel: Array, valid: Array, alpha: Array, eps: float = SHIFT_EPS) -> Array:
    r"""The replicator shift :math:`c = \max(0, -\min M) + \varepsilon` of one question's dense payoff, read off
    its block: :math:`M` holds 0 (the query's diagonal), the relevance row and :math:`W - \alpha I` on the notes.
    Only replicator dynamics read it (under ``jit`` it is not computed for another solver)."""
    pair = valid[:, None] & valid[None, :]
    free = note_block - jnp.diag(jnp.where(valid, alpha, 0.0))
    lowest = jnp.minimum(jnp.minimum(0.0, jnp.min(jnp.where(valid, rel, jnp.inf))),
                         jnp.min(jnp.where(pair, free, jnp.inf)))
    return (jnp.maximum(0.0, -lowest) + eps).astype(note_block.dtype)


def solve_on_block(problem: BlockProblem, params, options: SolveOptions, *, budget: int, adjoint=None) -> Selection:
    r"""One question's ``Single`` selection on the corpus's note block (module docstring).

    ``problem`` is a :class:`BlockProblem`: its ``note_block`` (:func:`problem_block`) and ``bound`` (the game's
    ``corpus_bound``) of the game ``params`` (:func:`check_block_problem` says
    where it may not); the read-out (threshold, fill rule by the KKT slack, then cosine) is that of the dense
    path. :func:`~cdsjax.core.equilibrium.equilibrium` runs it under ``adjoint`` (None: :data:`BLOCK_ADJOINT`, or a
    ``NoDerivative()`` the caller gave): differentiating it (in
    the notes, the question, the block or the game) raises :class:`ValueError`; the dense path
    (:meth:`BlockProblem.dense_problem`) is differentiable.
    """
    solver = options.limited_solver()
    n = problem.notes.shape[0]
    if problem.note_block.shape[-2:] != (n, n):
        raise ValueError(f"note_block must have shape ({n}, {n}), got {problem.note_block.shape}")

    rel = params.relevance(problem)
    dtype = rel.dtype
    block = jnp.asarray(problem.note_block, dtype)
    alpha = params.penalty(jnp.asarray(problem.bound).astype(dtype))
    payoff = SharedPayoff(coupling=block, rel=rel[0], note_valid=problem.valid, alpha=alpha,
                          corpus_shift=block_shift(block, rel[0], problem.valid, alpha))
    result = equilibrium(payoff, solver, adjoint=BLOCK_ADJOINT if adjoint is None else adjoint,
                         threshold=options.threshold)
    rel = payoff.rel
    slack = None
    if options.fill:
        mx = payoff.matvec(result.x)
        slack = (mx - payoff.value(result.x, mx))[1:]
    return read_out(result, problem.valid, budget=budget, threshold=options.threshold, slack=slack,
                    cosine=query_cosine(problem.notes, problem.queries, problem.query_scores).astype(dtype),
                    isolated=~jnp.any((rel > 0) & problem.valid), beta=params.strength(dtype))
