r"""Many questions over one corpus (the :class:`Shared` strategy of :func:`cdsjax.core.strategies.cds`): one note block.

For a single query vertex and no pinned notes the payoff of question :math:`k` is

.. math:: M_k = \begin{pmatrix} 0 & r_k^\top \\ r_k & W - \alpha I \end{pmatrix},

where only the relevance row :math:`r_k` depends on the question: the note--note
block :math:`W`, the penalty :math:`\alpha = \lambda_{\max}(W) + \varepsilon`
(``alpha_from="free"``) and the replicator shift
:math:`c = \max(0, -\min M) + \varepsilon` are properties of the corpus
(:math:`r_k \ge 0` and the query's zero diagonal never lower :math:`\min M` below
:math:`\min(0, \min(W - \alpha I))`). :func:`corpus_affinity` computes them once;
:func:`solve_replicator_shared` then runs paper mode for a batch of ``b``
questions on a :class:`~cdsjax.core.games.payoff.SharedPayoff` (the same
:class:`~cdsjax.core.solvers.replicator.Replicator` and loop as one question), with one
``[b, n] @ [n, n]`` product per step instead of ``b`` matrix--vector products over
``b`` materialised payoffs. Each question keeps its
own stopping rule (its row is frozen once it stops), so points, step counts and
diagnostics are those of :func:`cdsjax.core.solvers.replicator.solve_replicator` on the
per-question affinity, up to the summation order of the products.

The converged solvers (InImDyn, the active set) run on the same payoff one question at a time (their
``solve`` maps a batched payoff's questions, :func:`~cdsjax.core.solvers.loop.each_question`): InImDyn needs
rows and products only, and the active set assembles each Newton system from the payoff's rows, so the batch
never holds ``b`` dense ``[n+1, n+1]`` matrices (``experiments/bench_core.py`` measures both paths).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.games.affinity import CDSParams, note_coupling, query_relevance, spectral_penalty
from cdsjax.core.games.payoff import SHIFT_EPS, SharedPayoff
from cdsjax.core.solvers.replicator import Replicator
from cdsjax.core.ranking import read_out
from cdsjax.core.strategies.select import refuse_start, solve_single
from cdsjax.core.adjoints import ForwardLoopAdjoint, ImplicitAdjoint
from cdsjax.core.equilibrium import equilibrium
from cdsjax.core.solvers.loop import iterate
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import Affinity, CDSProblem, Selection, SolverResult, refuse_block_problem
from cdsjax.core.validation import as_query_matrix, check_notes_valid, query_similarity


@struct.dataclass
class CorpusAffinity:
    r"""The question-independent part of the CDS problem on one corpus.

    Attributes:
      notes: ``[n, d]`` note embeddings (needed for each question's relevance row).
      coupling: ``[n, n]`` note--note block :math:`W` (zero diagonal, zero at padding).
      valid: ``[n]`` bool, True on real notes.
      alpha: ``[]`` penalty :math:`\lambda_{\max}(W|_{\text{valid}}) + \varepsilon`.
      shift: ``[]`` replicator shift :math:`c` shared by every question.
      params: the :class:`CDSParams` used (static options, leaves ``beta``/``tau``).
    """

    notes: Array
    coupling: Array
    valid: Array
    alpha: Array
    shift: Array
    params: CDSParams


def corpus_affinity(
    notes: Array, valid: Array, params: CDSParams = CDSParams(), *, shift_eps: float = SHIFT_EPS
) -> CorpusAffinity:
    r"""Computes :math:`W`, :math:`\alpha` and the replicator shift once for a corpus.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      valid: ``[n]`` bool, True on real notes.
      params: :class:`CDSParams`; ``alpha_from`` must be ``"free"`` (with
        ``"full"`` the penalty depends on each question's relevance row).
      shift_eps: the :math:`\varepsilon` of the replicator shift.

    Returns:
      :class:`CorpusAffinity`.
    """
    params.check()
    if params.alpha_from != "free":
        raise ValueError(
            f"params.alpha_from must be 'free' for a shared corpus (got {params.alpha_from!r}): "
            "with 'full' the penalty depends on the question"
        )
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    w = note_coupling(notes, valid, params)
    alpha = spectral_penalty(w, valid, params.eps).astype(w.dtype)
    free_block = w - jnp.diag(jnp.where(valid, alpha, 0.0))
    pair = valid[:, None] & valid[None, :]
    # The query row holds 0 (its diagonal) and r >= 0, so min M = min(0, min(W - alpha I)).
    lowest = jnp.minimum(0.0, jnp.min(jnp.where(pair, free_block, jnp.inf)))
    shift = (jnp.maximum(0.0, -lowest) + shift_eps).astype(w.dtype)
    return CorpusAffinity(notes=notes, coupling=w, valid=valid, alpha=alpha, shift=shift, params=params)


def question_relevance(corpus: CorpusAffinity, queries: Array, query_scores: Optional[Array] = None) -> Array:
    """``[b, n]`` relevance rows of ``b`` questions (``queries`` ``[b, d]``, one vertex each; ``query_scores``
    ``[b, n]``: their similarities in place of the cosine, :attr:`CDSProblem.query_scores`)."""
    queries = jnp.asarray(queries)
    if queries.ndim != 2:
        raise ValueError(f"queries must have shape [b, d] (one query vector per question), got {queries.shape}")
    as_query_matrix(queries, corpus.notes, name="queries")
    dtype = corpus.coupling.dtype
    rel = query_relevance(corpus.notes.astype(dtype), queries.astype(dtype), corpus.valid, corpus.params,
                          query_scores)
    return rel.astype(dtype)


def question_affinity(corpus: CorpusAffinity, rel: Array) -> Affinity:
    """The per-question :class:`Affinity` of one relevance row ``rel`` ``[n]`` (for vmap)."""
    dtype = corpus.coupling.dtype
    top = jnp.concatenate([jnp.zeros((1, 1), dtype), rel[None, :]], axis=1)
    bottom = jnp.concatenate([rel[:, None], corpus.coupling], axis=1)
    matrix = jnp.concatenate([top, bottom], axis=0)
    n = rel.shape[0]
    return Affinity(
        matrix=matrix,
        constraint=jnp.concatenate([jnp.ones((1,), bool), jnp.zeros((n,), bool)]),
        valid=jnp.concatenate([jnp.ones((1,), bool), corpus.valid]),
        alpha=corpus.alpha,
        num_queries=1,
    )


def shared_payoff(corpus: CorpusAffinity, rel: Array) -> SharedPayoff:
    """The :class:`~cdsjax.core.games.payoff.SharedPayoff` of ``b`` questions (``rel`` ``[b, n]``) on ``corpus``."""
    return SharedPayoff(coupling=corpus.coupling, rel=rel, note_valid=corpus.valid, alpha=corpus.alpha,
                        corpus_shift=corpus.shift)


def solve_replicator_shared(
    corpus: CorpusAffinity,
    rel: Array,
    x0: Optional[Array] = None,
    *,
    tol: float = 1e-7,
    max_iter: int = 10_000,
    unroll: int = 4,
) -> SolverResult:
    r"""Paper-mode replicator dynamics for ``b`` questions on one corpus.

    Args:
      corpus: from :func:`corpus_affinity`.
      rel: ``[b, n]`` relevance rows (:func:`question_relevance`), 0 at padding.
      x0: optional ``[b, n+1]`` initial points (query first; masked to the valid
        vertices and renormalised); uniform over the valid vertices if None.
      tol: per-question stopping tolerance on the L1 step (paper: 1e-7).
      max_iter: maximum number of steps per question (paper: 10,000).
      unroll: steps per loop trip (a speed knob; results do not depend on it).

    Returns:
      :class:`SolverResult` whose leaves carry a leading ``b`` axis.
    """
    dtype = corpus.coupling.dtype
    rel = jnp.asarray(rel, dtype)
    n = corpus.coupling.shape[0]
    if rel.ndim != 2 or rel.shape[1] != n:
        raise ValueError(f"rel must have shape [b, {n}], got {rel.shape}")
    return iterate(Replicator(tol=tol, max_iter=max_iter, unroll=unroll), shared_payoff(corpus, rel), x0)


def solve_shared(problem: CDSProblem, params, options: SolveOptions, *, budget: int,
                 corpus: Optional[CorpusAffinity] = None, adjoint=None) -> Selection:
    r"""The :class:`Shared` strategy: ``b`` single-vertex questions on one corpus.

    ``problem.queries`` ``[b, d]`` are ``b`` questions. The note block :math:`W`, :math:`\alpha` and the
    replicator shift are computed once (:func:`corpus_affinity`, or ``corpus`` when given: reuse it
    across batches) and the solver runs on the batched :class:`~cdsjax.core.games.payoff.SharedPayoff`:
    replicator dynamics in one loop, one ``[b, n] @ [n, n]`` product per step; a converged solver question by
    question (``lax.map``), its Newton systems assembled from the payoff's rows, so no per-question
    ``[n+1, n+1]`` matrix is ever materialised for the batch. The read-out (slack for the fill rule) uses
    the payoff's products too. Every question starts uniformly; pinned notes are not supported. The
    shared payoff has no implicit derivative: ``adjoint`` None differentiates through the iterations
    (:class:`~cdsjax.core.adjoints.ForwardLoopAdjoint`), :class:`~cdsjax.core.adjoints.ImplicitAdjoint` raises
    ``ValueError``, any other adjoint is used.

    A game whose note block depends on the question (any game but :class:`CDSParams`, e.g. the learned
    one with its relevance-scaled repulsion and structure) has no shared block: each question is then
    solved as the ``Single`` strategy on its own dense payoff (``jax.vmap`` over the questions), with
    ``adjoint``, and the result has the same form.

    Returns:
      :class:`Selection` whose leaves (and ``result``'s) carry a leading ``b`` axis.
    """
    refuse_block_problem(problem, "Shared()")
    if problem.pinned is not None:
        raise ValueError("the shared strategy does not support pinned notes (each question has one vertex)")
    if not params.shares_note_block:
        if corpus is not None:
            raise ValueError("corpus (a CorpusAffinity) is the paper's game's shared block; this game has none")
        scores = problem.query_scores
        if scores is None:
            return jax.vmap(lambda q: solve_single(problem.replace(queries=q[None, :]), params, options,
                                                   budget=budget, adjoint=adjoint))(problem.queries)
        return jax.vmap(lambda q, s: solve_single(problem.replace(queries=q[None, :], query_scores=s[None, :]), params,
                                                  options, budget=budget, adjoint=adjoint))(problem.queries, scores)
    if isinstance(adjoint, ImplicitAdjoint):
        raise ValueError("Shared() solves the questions on the corpus's note block, which has no implicit "
                         "derivative: pass ForwardLoopAdjoint(), NoDerivative() or NoAdjoint()")
    if corpus is None:
        corpus = corpus_affinity(problem.notes, problem.valid, params)
    rel = question_relevance(corpus, problem.queries, problem.query_scores)
    result = equilibrium(shared_payoff(corpus, rel), options.limited_solver(),
                         adjoint=ForwardLoopAdjoint() if adjoint is None else adjoint)
    dtype = corpus.coupling.dtype
    cosine = query_similarity(corpus.notes.astype(dtype), problem.queries.astype(dtype), problem.query_scores)

    def read(res, r, cos):
        payoff = shared_payoff(corpus, r)
        mx = payoff.matvec(res.x)
        slack = (mx - payoff.value(res.x, mx))[1:] if options.fill else None
        isolated = ~jnp.any((r > 0) & corpus.valid)
        return read_out(res, corpus.valid, budget=budget, threshold=options.threshold, slack=slack, cosine=cos,
                        isolated=isolated, beta=corpus.params.beta)

    return jax.vmap(read)(result, rel, cosine)


@struct.dataclass
class Shared:
    r"""``b`` questions (the problem's query rows, one vertex each) on one corpus's note block
    (:func:`solve_shared`). Takes no start and no :class:`~cdsjax.core.types.BlockProblem`.

    Attributes:
      corpus: a precomputed :func:`corpus_affinity` of the notes, reused across batches (None: computed per call).
    """

    corpus: Optional[CorpusAffinity] = None

    def __call__(self, problem: CDSProblem, params, options: SolveOptions, *, budget: int, adjoint=None,
                 x0: Optional[Array] = None) -> Selection:
        refuse_start(x0, "Shared()")
        return solve_shared(problem, params, options, budget=budget, corpus=self.corpus, adjoint=adjoint)

    def corpus_bound(self, problem: CDSProblem, params) -> None:
        """None: the strategy computes its corpus's penalty itself (:func:`corpus_affinity`)."""
        return None

    def corpus_block(self, problem: CDSProblem, params, options: SolveOptions) -> None:
        """None: the strategy builds its own shared block."""
        return None
