r"""Baseline selectors (paper Appendix B) and the graph-diffusion prior.

Every selector takes the same padded inputs as :func:`cdsjax.core.compat.cds_select`
and returns a :class:`Selection` (``result=None``), so comparisons run on
identical inputs. All of them are pure, handle one query, and ``jit`` / ``vmap``
with trailing padding (the PageRank walk lives in :mod:`cdsjax.core.graph`). Relevance is :math:`\mathrm{rel}_i = q^\top z_i` (cosine:
inputs are L2-normalised); with several query rows it is the largest over them.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from cdsjax.core.graph import ppr_vector
from cdsjax.core.ranking import top_b
from cdsjax.core.types import Selection
from cdsjax.core.validation import as_query_matrix, check_budget, check_notes_valid, check_option, query_similarity

DPP_QUALITIES = ("exp", "relu")


def key_from_query_id(query_id: str, *, seed: Optional[Union[int, str]] = None) -> Array:
    """A PRNG key derived from the md5 digest of a query id.

    The same id always gives the same key, on any machine and with or without
    64-bit mode, so random baselines are reproducible per query.

    Args:
      query_id: the query's identifier.
      seed: optional run seed; the digest is then taken of ``f"{seed}:{query_id}"``
        (the paper's per-query seed for repeated runs).

    Returns:
      A typed threefry key built from the first 8 bytes of the digest.
    """
    if not isinstance(query_id, str):
        raise TypeError(f"query_id must be a str, got {type(query_id).__name__}")
    text = query_id if seed is None else f"{seed}:{query_id}"
    digest = hashlib.md5(text.encode("utf-8")).digest()
    words = np.frombuffer(digest[:8], dtype=">u4").astype(np.uint32)
    return jax.random.wrap_key_data(jnp.asarray(words), impl="threefry2x32")


def relevance(notes: Array, query: Array, valid: Array, query_scores: Optional[Array] = None) -> Array:
    r"""``[n]`` cosine relevance :math:`\max_k q_k^\top z_i` (0 at padding), or the best of ``query_scores``.

    Args:
      notes: ``[n, d]`` float, L2-normalised, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised.
      valid: ``[n]`` bool, True on real notes.
      query_scores: optional ``[m, n]`` (or ``[n]``) similarities in place of :math:`q_k^\top z_i`
        (:attr:`~cdsjax.core.CDSProblem.query_scores`: a relevance fused above the core).
    """
    notes = jnp.asarray(notes)
    queries = as_query_matrix(query, notes)
    valid = check_notes_valid(notes, valid)
    dtype = jnp.result_type(notes.dtype, queries.dtype)
    rel = jnp.max(query_similarity(notes.astype(dtype), queries.astype(dtype), query_scores), axis=0)
    return jnp.where(valid, rel, 0.0)


def select_cosine(notes: Array, query: Array, valid: Array, *, budget: int,
                  query_scores: Optional[Array] = None) -> Selection:
    """Top-``budget`` notes by cosine relevance (ties to the lowest index).

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes.
      budget: static number of picks; fewer (masked) when fewer notes are valid.

    Returns:
      :class:`Selection` with ``scores`` the relevances.
    """
    budget = check_budget(budget)
    rel = relevance(notes, query, valid, query_scores)
    idx, ok, scores = top_b(rel, jnp.asarray(valid, bool), budget)
    return Selection(indices=idx, selected_valid=ok, scores=scores)


def select_random(valid: Array, *, budget: int, key: Array) -> Selection:
    """``budget`` valid notes drawn uniformly without replacement.

    Each note gets an independent uniform priority from ``fold_in(key, i)``, so a
    note's draw does not depend on how much padding follows it.

    Args:
      valid: ``[n]`` bool, True on real notes.
      budget: static number of picks; fewer (masked) when fewer notes are valid.
      key: PRNG key, e.g. :func:`key_from_query_id`.

    Returns:
      :class:`Selection` with ``scores`` the priorities in ``[0, 1)``.
    """
    budget = check_budget(budget)
    valid = jnp.asarray(valid)
    if valid.ndim != 1:
        raise ValueError(f"valid must have shape [n], got {valid.shape}")
    if key is None:
        raise ValueError("key is required for select_random (see key_from_query_id)")
    n = valid.shape[0]
    priority = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i)))(jnp.arange(n))
    idx, ok, scores = top_b(priority, valid.astype(bool), budget)
    return Selection(indices=idx, selected_valid=ok, scores=scores)


def select_mmr(notes: Array, query: Array, valid: Array, *, budget: int, lam: float = 0.5,
               query_scores: Optional[Array] = None) -> Selection:
    r"""Maximal marginal relevance, greedily.

    The first pick is :math:`\arg\max_i \mathrm{rel}_i`; each later pick is
    :math:`\arg\max_{i\notin R} \lambda\,\mathrm{rel}_i - (1-\lambda)\max_{j\in R} S_{ij}`
    with :math:`S_{ij} = z_i^\top z_j`. Ties go to the lowest index. Rows of
    :math:`S` are formed only for picked notes (``O(budget n d)``).

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes.
      budget: static number of picks; fewer (masked) when fewer notes are valid.
      lam: trade-off :math:`\lambda \in [0, 1]` (1: pure relevance).

    Returns:
      :class:`Selection`; ``scores`` are the objective at each pick (the
      relevance for the first).
    """
    budget = check_budget(budget)
    if not 0.0 <= float(lam) <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    rel = relevance(notes, query, valid, query_scores)
    valid = jnp.asarray(valid, bool)
    notes = jnp.asarray(notes, rel.dtype)
    n = notes.shape[0]

    def step(t, state):
        picked, max_sim, idx, ok, scores = state
        # max_sim starts at -inf; the first pick is by relevance alone.
        redundancy = jnp.where(t == 0, 0.0, max_sim)
        score = jnp.where(t == 0, rel, lam * rel - (1.0 - lam) * redundancy)
        eligible = valid & ~picked
        masked = jnp.where(eligible, score, -jnp.inf)
        j = jnp.argmax(masked)
        has = eligible[j]
        max_sim = jnp.where(has, jnp.maximum(max_sim, notes @ notes[j]), max_sim)
        picked = picked.at[j].set(picked[j] | has)
        idx = idx.at[t].set(jnp.where(has, j, 0).astype(jnp.int32))
        ok = ok.at[t].set(has)
        scores = scores.at[t].set(jnp.where(has, masked[j], 0.0))
        return picked, max_sim, idx, ok, scores

    init = (
        jnp.zeros((n,), bool),
        jnp.full((n,), -jnp.inf, rel.dtype),
        jnp.zeros((budget,), jnp.int32),
        jnp.zeros((budget,), bool),
        jnp.zeros((budget,), rel.dtype),
    )
    _, _, idx, ok, scores = lax.fori_loop(0, budget, step, init)
    return Selection(indices=idx, selected_valid=ok, scores=scores)


def dpp_quality(rel: Array, theta: float = 1.0, quality: str = "exp") -> Array:
    r"""Quality :math:`q_i = \exp(\theta\,\mathrm{rel}_i)` (``"exp"``) or :math:`\max(\mathrm{rel}_i, 0)` (``"relu"``)."""
    check_option("quality", quality, DPP_QUALITIES)
    if quality == "exp":
        return jnp.exp(theta * rel)
    return jnp.maximum(rel, 0.0)


def select_dpp(
    notes: Array,
    query: Array,
    valid: Array,
    *,
    budget: int,
    theta: float = 1.0,
    quality: str = "exp",
    gain_tol: Optional[float] = None,
    query_scores: Optional[Array] = None,
) -> Selection:
    r"""Greedy MAP of the DPP with kernel :math:`L = \mathrm{diag}(q)\,S\,\mathrm{diag}(q)`.

    Chen et al.'s (2018) incremental Cholesky greedy: residual gains
    :math:`d_i^2` start at :math:`L_{ii}`; each step picks
    :math:`j = \arg\max_{i\notin R} d_i^2` (ties to the lowest index), then for
    every :math:`i` sets :math:`e_i = (L_{ji} - \langle c_j, c_i\rangle)/d_j`,
    appends :math:`e_i` to :math:`c_i` and subtracts :math:`e_i^2` from
    :math:`d_i^2`. It stops early when no remaining gain is positive, so it may
    return fewer than ``budget`` notes (the mask says so). A gain counts as
    positive when :math:`d_i^2 > \text{gain\_tol}\cdot L_{ii}`, which absorbs
    the rounding left in the gain of a note already in the span of the picks.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes.
      budget: static maximum number of picks.
      theta: quality temperature :math:`\theta` of the ``"exp"`` quality.
      quality: ``"exp"`` (:math:`e^{\theta\,\mathrm{rel}}`, default) or
        ``"relu"`` (:math:`\max(\mathrm{rel}, 0)`, the paper's Section 4.2).
      gain_tol: relative gain tolerance; None uses ``100 * finfo(dtype).eps``.

    Returns:
      :class:`Selection`; ``scores`` are the gains :math:`d_j^2` at each pick.
    """
    budget = check_budget(budget)
    check_option("quality", quality, DPP_QUALITIES)
    rel = relevance(notes, query, valid, query_scores)
    valid = jnp.asarray(valid, bool)
    dtype = rel.dtype
    notes = jnp.asarray(notes, dtype)
    n = notes.shape[0]
    if gain_tol is None:
        gain_tol = 100.0 * float(jnp.finfo(dtype).eps)
    q = jnp.where(valid, dpp_quality(rel, theta, quality), 0.0)
    diag = q * q  # S_ii = 1 for unit-norm notes

    def step(t, state):
        chol, gains, picked, idx, ok, scores = state
        eligible = valid & ~picked & (gains > gain_tol * diag) & (gains > 0)
        j = jnp.argmax(jnp.where(eligible, gains, -jnp.inf))
        has = eligible[j]
        d_j = jnp.sqrt(jnp.where(has, gains[j], 1.0))
        l_row = q[j] * q * (notes @ notes[j])
        e = (l_row - chol[:, j] @ chol) / d_j
        e = jnp.where(has & valid, e, 0.0)
        chol = chol.at[t].set(e)
        gains = gains - e * e
        picked = picked.at[j].set(picked[j] | has)
        idx = idx.at[t].set(jnp.where(has, j, 0).astype(jnp.int32))
        ok = ok.at[t].set(has)
        scores = scores.at[t].set(jnp.where(has, d_j * d_j, 0.0))
        return chol, gains, picked, idx, ok, scores

    init = (
        jnp.zeros((budget, n), dtype),
        diag,
        jnp.zeros((n,), bool),
        jnp.zeros((budget,), jnp.int32),
        jnp.zeros((budget,), bool),
        jnp.zeros((budget,), dtype),
    )
    *_, idx, ok, scores = lax.fori_loop(0, budget, step, init)
    return Selection(indices=idx, selected_valid=ok, scores=scores)


def select_ppr(
    links: Array,
    notes: Array,
    query: Array,
    valid: Array,
    *,
    budget: int,
    damping: float = 0.85,
    temperature: float = 0.1,
    tol: float = 1e-9,
    max_iter: int = 1000,
    query_scores: Optional[Array] = None,
) -> Selection:
    r"""Top-``budget`` notes by personalised PageRank from a query-softmax teleport.

    The teleport is :math:`s_i \propto \exp(\mathrm{rel}_i / T)` over valid notes;
    see :func:`ppr_vector` for the walk. Ties go to the lowest index.

    Args:
      links: ``[n, n]`` bool note-link adjacency (symmetrised here).
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes.
      budget: static number of picks; fewer (masked) when fewer notes are valid.
      damping: :math:`\gamma` (paper: 0.85).
      temperature: softmax temperature :math:`T` (paper: 0.1).
      tol: stopping tolerance :math:`\|\Delta r\|_\infty` (paper: 1e-9).
      max_iter: cap on power iterations.

    Returns:
      :class:`Selection` with ``scores`` the PageRank values.
    """
    budget = check_budget(budget)
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    rel = relevance(notes, query, valid, query_scores)
    valid = jnp.asarray(valid, bool)
    seed = jax.nn.softmax(jnp.where(valid, rel / temperature, -jnp.inf))
    r = ppr_vector(links, seed, valid, damping=damping, tol=tol, max_iter=max_iter)
    idx, ok, scores = top_b(r, valid, budget)
    return Selection(indices=idx, selected_valid=ok, scores=scores)




def cut_to_budget(order: Array, eligible: Array, budget: int) -> tuple[Array, Array]:
    """The first ``budget`` positions of ``order`` (padded with 0 past ``n``) as ``(indices int32, ok)``, where ``ok``
    says the position holds an eligible note; indices of positions that do not are 0."""
    n = order.shape[0]
    if budget > n:
        order = jnp.concatenate([order, jnp.zeros((budget - n,), order.dtype)])
        ok = jnp.concatenate([eligible[order[:n]], jnp.zeros((budget - n,), bool)])
    else:
        order = order[:budget]
        ok = eligible[order]
    return jnp.where(ok, order, 0).astype(jnp.int32), ok

def same_unit(pages: Array, valid: Array, doc_ids: Optional[Array] = None) -> Array:
    """``[n, n]`` bool: valid notes ``i`` and ``j`` lie in one unit (page, or ``(document, page)`` with ``doc_ids``)."""
    n = valid.shape[0]
    pages = jnp.asarray(pages)
    if pages.shape != (n,):
        raise ValueError(f"pages must have shape ({n},), got {pages.shape}")
    same = pages[:, None] == pages[None, :]
    if doc_ids is not None:
        doc_ids = jnp.asarray(doc_ids)
        if doc_ids.shape != (n,):
            raise ValueError(f"doc_ids must have shape ({n},), got {doc_ids.shape}")
        same = same & (doc_ids[:, None] == doc_ids[None, :])
    return same & valid[:, None] & valid[None, :]

def select_cosine_pages(
    notes: Array,
    query: Array,
    valid: Array,
    pages: Array,
    *,
    budget: int,
    doc_ids: Optional[Array] = None,
    fill: bool = True,
    query_scores: Optional[Array] = None,
) -> Selection:
    r"""Cosine top-``budget`` keeping at most one note per page, then (``fill``) the next best.

    A note's *tier* is its rank by relevance among the valid notes of its own unit (its page, or
    its ``(document, page)`` pair when ``doc_ids`` is given): the best note of every unit is tier 0.
    Notes are taken by tier, then by relevance, then by index, so the first picks are the best note
    of each unit in cosine order. With ``fill=False`` only tier-0 notes are eligible (fewer than
    ``budget`` picks, masked, when there are fewer units); with ``fill=True`` the remaining slots go
    to the second-best note of each unit, and so on. Page recall is the same either way; ``fill``
    only adds notes from pages already covered.

    The ranking is exact (a lexicographic sort, no float key), ``O(n^2)`` in the unit comparison,
    and ``jit`` / ``vmap``-able; padding (``valid`` False) is never picked and does not change the
    tiers of real notes.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes.
      pages: ``[n]`` int unit of each note (a page; on text benchmarks the caller's paragraph group).
      budget: static number of picks; fewer (masked) when fewer notes are eligible.
      doc_ids: optional ``[n]`` int document of each note (units are then ``(document, page)``).
      fill: complete the selection with lower tiers once every unit has given its best note.

    Returns:
      :class:`Selection` with ``scores`` the relevances.
    """
    budget = check_budget(budget)
    rel = relevance(notes, query, valid, query_scores)
    valid = jnp.asarray(valid, bool)
    n = rel.shape[0]
    same = same_unit(pages, valid, doc_ids)
    pos = jnp.arange(n)
    # ahead[i, j]: note j comes before note i in cosine order (ties to the lower index)
    ahead = (rel[None, :] > rel[:, None]) | ((rel[None, :] == rel[:, None]) & (pos[None, :] < pos[:, None]))
    tier = jnp.sum(same & ahead & valid[None, :], axis=1)
    eligible = valid if fill else valid & (tier == 0)
    tier = jnp.where(eligible, tier, n + 1)
    order = jnp.lexsort((pos, -rel, tier))  # last key is the primary one
    idx, ok = cut_to_budget(order, eligible, budget)
    return Selection(indices=idx, selected_valid=ok, scores=jnp.where(ok, rel[idx], 0.0))
