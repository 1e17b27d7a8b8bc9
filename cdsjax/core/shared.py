r"""Many questions over one corpus: shared note--note block, batched replicator steps.

For a single query vertex and no pinned notes the payoff of question :math:`k` is

.. math:: M_k = \begin{pmatrix} 0 & r_k^\top \\ r_k & W - \alpha I \end{pmatrix},

where only the relevance row :math:`r_k` depends on the question: the note--note
block :math:`W`, the penalty :math:`\alpha = \lambda_{\max}(W) + \varepsilon`
(``alpha_from="free"``) and the replicator shift
:math:`c = \max(0, -\min M) + \varepsilon` are properties of the corpus
(:math:`r_k \ge 0` and the query's zero diagonal never lower :math:`\min M` below
:math:`\min(0, \min(W - \alpha I))`). :func:`corpus_affinity` computes them once;
:func:`solve_replicator_shared` then runs paper mode for a batch of ``b``
questions with one ``[b, n] @ [n, n]`` product per step instead of ``b``
matrix--vector products over ``b`` materialised payoffs. Each question keeps its
own stopping rule (its row is frozen once it stops), so points, step counts and
diagnostics are those of :func:`cdsjax.core.solve_replicator` on the
per-question affinity, up to the summation order of the products.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.affinity import note_coupling, query_relevance, spectral_penalty
from cdsjax.core.replicator import SHIFT_EPS, SUPPORT_THRESHOLD
from cdsjax.core.select import SOLVERS, selection_from_solution, solve
from cdsjax.core.types import Affinity, CDSParams, Selection, SolverResult
from cdsjax.core.validation import as_query_matrix, check_budget, check_notes_valid, check_option


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


def question_relevance(corpus: CorpusAffinity, queries: Array) -> Array:
    """``[b, n]`` relevance rows of ``b`` questions (``queries`` ``[b, d]``, one vertex each)."""
    queries = jnp.asarray(queries)
    if queries.ndim != 2:
        raise ValueError(f"queries must have shape [b, d] (one query vector per question), got {queries.shape}")
    as_query_matrix(queries, corpus.notes, name="queries")
    dtype = corpus.coupling.dtype
    rel = query_relevance(corpus.notes.astype(dtype), queries.astype(dtype), corpus.valid, corpus.params)
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


def _payoff_times(corpus: CorpusAffinity, rel: Array, x: Array) -> Array:
    r"""``[b, n+1]`` rows :math:`M_k x_k` for all questions with one matrix--matrix product."""
    xq, y = x[:, :1], x[:, 1:]
    # W is symmetric: y @ W is (W y_k)_k without a transpose.
    notes_part = xq * rel + y @ corpus.coupling - jnp.where(corpus.valid, corpus.alpha, 0.0) * y
    query_part = jnp.sum(rel * y, axis=1, keepdims=True)
    return jnp.concatenate([query_part, notes_part], axis=1)


def _diagnostics(corpus: CorpusAffinity, rel: Array, x: Array, num_iters, converged, step) -> SolverResult:
    """Batched :class:`SolverResult` with the same diagnostics as :func:`cdsjax.core.replicator.finish`."""
    mx = _payoff_times(corpus, rel, x)
    obj = jnp.sum(x * mx, axis=1)
    valid = jnp.concatenate([jnp.ones((1,), bool), corpus.valid])
    r = mx - obj[:, None]
    kkt = jnp.max(jnp.where(valid, jnp.abs(jnp.minimum(x, -r)), 0.0), axis=1)
    support = jnp.sum(valid & (x > SUPPORT_THRESHOLD), axis=1).astype(jnp.int32)
    b = x.shape[0]
    return SolverResult(
        x=x,
        num_iters=num_iters.astype(jnp.int32),
        converged=converged,
        step=step.astype(x.dtype),
        objective=obj,
        kkt_residual=kkt,
        support_size=support,
        alpha=jnp.broadcast_to(corpus.alpha, (b,)).astype(x.dtype),
    )


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
    if not isinstance(max_iter, int) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer, got {max_iter!r}")
    if not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"unroll must be a positive integer, got {unroll!r}")
    dtype = corpus.coupling.dtype
    rel = jnp.asarray(rel, dtype)
    n = corpus.coupling.shape[0]
    if rel.ndim != 2 or rel.shape[1] != n:
        raise ValueError(f"rel must have shape [b, {n}], got {rel.shape}")
    b = rel.shape[0]
    valid = jnp.concatenate([jnp.ones((1,), bool), corpus.valid])
    if x0 is None:
        x = jnp.broadcast_to(valid.astype(dtype) / jnp.sum(valid), (b, n + 1))
    else:
        x0 = jnp.asarray(x0, dtype)
        if x0.shape != (b, n + 1):
            raise ValueError(f"x0 must have shape {(b, n + 1)}, got {x0.shape}")
        x = jnp.where(valid, jnp.maximum(x0, 0.0), 0.0)
        x = x / jnp.sum(x, axis=1, keepdims=True)
    c = corpus.shift

    def cond(state):
        _, step, it = state
        return jnp.any((step >= tol) & (it < max_iter))

    def body(state):
        x, step, it = state
        for _ in range(unroll):
            active = (step >= tol) & (it < max_iter)
            mx = _payoff_times(corpus, rel, x)
            x_new = x * (mx + c) / (jnp.sum(x * mx, axis=1, keepdims=True) + c)
            step_new = jnp.sum(jnp.abs(x_new - x), axis=1)
            x = jnp.where(active[:, None], x_new, x)
            step = jnp.where(active, step_new, step)
            it = it + active.astype(it.dtype)
        return x, step, it

    init = (x, jnp.full((b,), jnp.inf, dtype), jnp.zeros((b,), jnp.int32))
    x, step, it = lax.while_loop(cond, body, init)
    return _diagnostics(corpus, rel, x, it, step < tol, step)


def cds_select_shared(
    notes: Array,
    queries: Array,
    valid: Array,
    *,
    budget: int = 10,
    params: CDSParams = CDSParams(),
    solver: str = "replicator",
    threshold: float = 1e-6,
    tol: Optional[float] = None,
    max_iter: Optional[int] = None,
    corpus: Optional[CorpusAffinity] = None,
) -> Selection:
    r""":func:`cdsjax.core.cds_select` for ``b`` single-vertex questions on one corpus.

    Paper mode (``solver="replicator"``) runs :func:`solve_replicator_shared`;
    any other registered solver runs under ``vmap`` on per-question affinities
    assembled from the shared :math:`W` and :math:`\alpha` (no per-question
    eigenvalue problem).

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      queries: ``[b, d]`` float, one L2-normalised query per question.
      valid: ``[n]`` bool, True on real notes.
      budget, params, solver, threshold, tol, max_iter: as :func:`cds_select`.
      corpus: optional precomputed :func:`corpus_affinity` of ``notes`` / ``valid`` /
        ``params`` (reuse it across batches of questions).

    Returns:
      :class:`Selection` whose leaves (and ``result``'s) carry a leading ``b`` axis.
    """
    budget = check_budget(budget)
    check_option("solver", solver, tuple(SOLVERS))
    if corpus is None:
        corpus = corpus_affinity(notes, valid, params)
    rel = question_relevance(corpus, queries)
    if solver == "replicator":
        _, default_tol, default_iter = SOLVERS["replicator"]
        result = solve_replicator_shared(
            corpus,
            rel,
            tol=default_tol if tol is None else tol,
            max_iter=default_iter if max_iter is None else max_iter,
        )
    else:
        result = jax.vmap(
            lambda r: solve(question_affinity(corpus, r), None, solver=solver, tol=tol, max_iter=max_iter)
        )(rel)
    dtype = corpus.coupling.dtype
    cosine = jnp.asarray(queries, dtype) @ corpus.notes.astype(dtype).T
    return jax.vmap(
        lambda res, r, cos: selection_from_solution(
            res, 1, corpus.valid, budget=budget, threshold=threshold, affinity=question_affinity(corpus, r),
            cosine=cos, beta=corpus.params.beta)
    )(result, rel, cosine)
