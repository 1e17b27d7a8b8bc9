r"""The CDS penalty :math:`\alpha \ge \lambda_{\max}` without a per-question eigendecomposition.

The penalty of a CDS game is :math:`\alpha = \lambda_{\max}(A|_F) + \varepsilon` over the free block
:math:`F` (:func:`cdsjax.core.affinity.spectral_penalty`, one ``eigvalsh`` of the padded
``[m+n, m+n]`` matrix: O(n³), 0.3-0.6 s at n = 1024 on two cores). Two ways to avoid paying it per
question:

* **Once per corpus, exactly.** With ``alpha_from="free"`` and no pinned notes the free block is
  the note block :math:`W`, and for the paper game (and the learned game when its
  relevance-weighted repulsion is 0) :math:`W` does not depend on the question: the query rows are
  masked out before ``eigvalsh``, so the matrix it sees is the same for every question.
  :func:`corpus_bound` and :func:`learned_corpus_bound` build that same matrix once (the note block
  by the same functions, zero query rows, the same padded size) and return the same number, bit for
  bit; a problem carrying it (``bound=``) skips the eigendecomposition.
* **Per question, certified.** Where the block does depend on the question (``alpha_from="full"``,
  pinned notes, peeling rounds, a learned game with relevance-weighted repulsion),
  :func:`certified_bound` returns an upper bound of :math:`\lambda_{\max}` in O(k n²) (k Lanczos
  steps): for *any* unit vector :math:`v` with :math:`\theta = v^\top A v` and residual
  :math:`r = Av - \theta v`,

  .. math:: A = A' + \theta vv^\top + (rv^\top + vr^\top), \qquad A'v = 0,

  so by Weyl :math:`\lambda_{\max}(A) \le \max(\theta, \lambda_{\max}(A'|_{v^\perp})) + \|r\|` and
  :math:`\lambda_{\max}(A'|_{v^\perp}) \le` the Gershgorin bound of :math:`A'`. Lanczos only finds a good
  :math:`v` (the top Ritz vector); the certificate does not depend on how :math:`v` was found. When the
  top eigenvalue stands clear of the rest (the CDS note block's Perron eigenvalue does), the bound is
  :math:`\theta + \|r\|`, within :math:`\|r\|` of :math:`\lambda_{\max}`; otherwise it is never worse
  than Gershgorin's bound of :math:`A` itself. A margin of :math:`2 n u \|A\|_\infty` (u the unit
  roundoff) covers the rounding of the products.

The CDS guarantee needs only :math:`\alpha > \lambda_{\max}(A|_F)`: with a larger :math:`\alpha` the
query still stays in the support; the free notes are penalised a little more, so the equilibrium
(and where :math:`\alpha` moves, the picks) can change.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array

from cdsjax.core.affinity import note_coupling, spectral_penalty
from cdsjax.core.certified import LANCZOS_STEPS, certified_bound, gershgorin  # noqa: F401 (re-exported)
from cdsjax.core.types import CDSParams
from cdsjax.core.validation import check_notes_valid



def padded_note_penalty(block: Array, valid: Array, num_queries: int, eps: float) -> Array:
    r""":func:`spectral_penalty` of an ``[n, n]`` note block laid out as in a problem with ``num_queries``
    query rows: the same ``[m+n, m+n]`` matrix (query rows zero, as the mask leaves them) and the same
    mask, so the result equals the per-question penalty bit for bit."""
    n = block.shape[0]
    m = int(num_queries)
    dtype = block.dtype
    top = jnp.zeros((m, m + n), dtype)
    bottom = jnp.concatenate([jnp.zeros((n, m), dtype), block], axis=1)
    matrix = jnp.concatenate([top, bottom], axis=0)
    mask = jnp.concatenate([jnp.zeros((m,), bool), valid])
    return spectral_penalty(matrix, mask, eps).astype(dtype)


def corpus_bound(notes: Array, valid: Array, params: CDSParams = CDSParams(), *, num_queries: int = 1) -> Array:
    r"""The paper game's penalty :math:`\lambda_{\max}(W|_{\text{valid}}) + \varepsilon`, once per corpus.

    Equal bit for bit to the ``alpha`` of :func:`~cdsjax.core.build_affinity` on any question with
    ``num_queries`` query rows and no pinned notes, when ``params.alpha_from`` is ``"free"``.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding (the padded corpus).
      valid: ``[n]`` bool, True on real notes.
      params: :class:`CDSParams` (``coupling``, ``beta``, ``eps``).
      num_queries: query rows of the questions it will serve (1 for a single question vector).

    Raises:
      ValueError: ``alpha_from="full"`` (that penalty depends on the question).
    """
    params.check()
    if params.alpha_from != "free":
        raise ValueError(f"a corpus bound needs alpha_from='free' (got {params.alpha_from!r}): "
                         "with 'full' the penalty depends on each question's relevance row")
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    return padded_note_penalty(note_coupling(notes, valid, params), valid, num_queries, params.eps)


def learned_is_corpus_level(theta) -> bool:
    """True when the learned game's note block does not read the question: a relevance-weighted repulsion
    of exactly 0 (``theta`` must hold concrete numbers, not tracers)."""
    try:
        return float(theta.rel_repulsion) <= 0.0
    except (TypeError, jax.errors.ConcretizationTypeError):
        return False


def learned_corpus_bound(notes: Array, valid: Array, theta, *, links=None, pages=None, doc_ids=None, kinds=None,
                         num_queries: int = 1) -> Array:
    r"""The learned game's spectral bound :math:`b = \lambda_{\max}(W|_{\text{valid}}) + \varepsilon` once per
    corpus (before ``alpha_factor``, which :func:`~cdsjax.core.learned.learned_affinity` applies).

    Built by :func:`~cdsjax.core.learned.learned_affinity` itself on an all-zero question (its rows are masked
    out of the bound). With ``rel_repulsion`` 0 the note block :math:`C` does not read the question and this is
    the per-question bound bit for bit. Otherwise the block is
    :math:`W(q) = (1-\lambda)C + \lambda D_\rho C D_\rho` with :math:`0 \le \rho_i \le 1`, and for a unit
    :math:`x`, :math:`x^\top W x \le (1-\lambda)\lambda_{\max}(C) + \lambda \max(\lambda_{\max}(C), 0)\|D_\rho x\|^2
    \le \max(\lambda_{\max}(C), 0)`: the bound of :math:`C`, raised to at least :math:`\varepsilon`, is then an
    upper bound for every question (certified, not exact: the picks can change).
    """
    from cdsjax.core.learned import learned_affinity

    exact = learned_is_corpus_level(theta)
    probe = theta.replace(alpha_factor=1.0) if exact else theta.replace(alpha_factor=1.0, rel_repulsion=0.0)
    notes = jnp.asarray(notes)
    queries = jnp.zeros((int(num_queries), notes.shape[1]), notes.dtype)
    bound = learned_affinity(notes, queries, valid, probe, links=links, pages=pages, doc_ids=doc_ids,
                             kinds=kinds).alpha
    return bound if exact else jnp.maximum(bound, jnp.asarray(theta.eps, bound.dtype))


def problem_bound(problem, params, strategy: str = "single") -> Optional[Array]:
    r"""The spectral bound the game ``params`` uses on ``problem``'s corpus under ``strategy``, computed once
    for every question on it; None when the penalty must be found per question.

    ``"single"`` and ``"peel"`` (its first round) use the game's bound, ``"support"`` the bound at
    :math:`\beta = 1` (which it rescales); ``"shared"`` computes its own, ``alpha_from="full"`` reads each
    question's relevance row, and so does a learned game with relevance-weighted repulsion (None for all
    three: their penalty stays per question; :func:`learned_corpus_bound` is a valid but loose bound for the
    last, measured to change most picks). Exact (equal bit for bit to the per-question bound) for the paper's
    game and a learned game without that repulsion when no notes are pinned; with pinned notes an upper bound
    (interlacing), so the guarantee holds. The query rows only give their count.
    """
    from cdsjax.core.learned import LearnedParams

    if strategy == "shared" or params.alpha_from != "free":
        return None
    m = problem.queries.shape[-2]
    if isinstance(params, CDSParams):
        game = params.replace(beta=1.0) if strategy == "support" else params
        return corpus_bound(problem.notes, problem.valid, game, num_queries=m)
    if isinstance(params, LearnedParams) and strategy in ("single", "peel") and learned_is_corpus_level(params):
        return learned_corpus_bound(problem.notes, problem.valid, params, links=problem.links, pages=problem.pages,
                                    doc_ids=problem.doc_ids, kinds=problem.kinds, num_queries=m)
    return None
