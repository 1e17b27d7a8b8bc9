"""The query-augmented affinity and its spectral penalty."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array

from cdsjax.core.types import Affinity, CDSParams
from cdsjax.core.validation import as_query_matrix, check_notes_valid


def query_relevance(notes: Array, queries: Array, valid: Array, params: CDSParams) -> Array:
    r"""Query--note edge weights after sparsification.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings; rows past the valid
        prefix are padding and are ignored.
      queries: ``[m, d]`` float, L2-normalised query embeddings.
      valid: ``[n]`` bool, True on real notes.
      params: the :class:`CDSParams` (uses ``tau``, ``tau_mode``, ``tau_temperature``).

    Returns:
      ``[m, n]`` float, :math:`r_{ki} = \max(q_k^\top z_i, 0)` with the
      :math:`\tau` rule applied per query row, 0 at padding.
    """
    sims = queries @ notes.T
    rel = jnp.maximum(sims, 0.0)
    if params.tau_mode == "soft":
        gate = jax.nn.sigmoid((sims - params.tau) / params.tau_temperature)
        rel = rel * gate
    else:
        keep = sims >= params.tau
        any_keep = jnp.any(keep & valid[None, :], axis=1, keepdims=True)
        masked = jnp.where(valid[None, :], sims, -jnp.inf)
        strongest = jnp.arange(notes.shape[0])[None, :] == jnp.argmax(masked, axis=1)[:, None]
        keep = jnp.where(any_keep, keep, strongest)
        rel = jnp.where(keep, rel, 0.0)
    return jnp.where(valid[None, :], rel, 0.0)


def note_coupling(notes: Array, valid: Array, params: CDSParams) -> Array:
    r"""The note--note block :math:`W` [n, n] (zero diagonal, zero at padding)."""
    n = notes.shape[0]
    if params.coupling == "none":
        return jnp.zeros((n, n), notes.dtype)
    gram = notes @ notes.T
    if params.coupling == "dissimilarity":
        block = params.beta * (1.0 - gram)
    else:
        block = params.beta * jnp.maximum(gram, 0.0)
    pair = valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
    return jnp.where(pair, block, 0.0).astype(notes.dtype)


def spectral_penalty(matrix: Array, mask: Array, eps: float) -> Array:
    r"""Largest eigenvalue of ``matrix`` restricted to ``mask``, plus ``eps``.

    The rows and columns outside ``mask`` are not zero-padded before ``eigvalsh``
    (that would add spurious zero eigenvalues, wrong whenever the true spectrum is
    negative). They are cut off and their diagonal set to a sentinel strictly below
    the spectrum of the restricted block, so the top eigenvalue is the block's own.

    Args:
      matrix: ``[N, N]`` float, symmetric.
      mask: ``[N]`` bool, the vertices of the block.
      eps: margin added to the eigenvalue.

    Returns:
      ``[]`` float, :math:`\lambda_{\max}(\text{matrix}[\text{mask}, \text{mask}]) + \varepsilon`;
      just ``eps`` when the mask is empty.
    """
    pair = mask[:, None] & mask[None, :]
    block = jnp.where(pair, matrix, 0.0)
    # Every eigenvalue of the block is >= -(sum of |entries|); go one below that.
    sentinel = -jnp.sum(jnp.abs(block)) - 1.0
    block = block + jnp.diag(jnp.where(mask, 0.0, sentinel))
    lam = jnp.linalg.eigvalsh(block)[-1]
    return jnp.where(jnp.any(mask), lam, 0.0) + eps


def build_affinity(
    notes: Array,
    queries: Array,
    valid: Array,
    params: CDSParams = CDSParams(),
    pinned: Optional[Array] = None,
) -> Affinity:
    r"""Builds the query-augmented affinity graph of one problem.

    Vertices are the ``m`` queries, then the ``n`` notes. Note--note edges follow
    ``params.coupling`` (scaled by :math:`\beta`), query--note edges are
    :math:`\max(q^\top z, 0)` after the :math:`\tau` rule, query--query edges and
    the diagonal are 0. The penalty is
    :math:`\alpha = \lambda_{\max}(A|_{\bar S}) + \varepsilon` (``alpha_from="free"``)
    or :math:`\lambda_{\max}(A) + \varepsilon` (``"full"``).

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      queries: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes (a valid prefix).
      params: :class:`CDSParams`.
      pinned: optional ``[n]`` bool, notes that join the constraint set.

    Returns:
      The :class:`Affinity` over ``m + n`` vertices.
    """
    params.check()
    queries = as_query_matrix(queries, notes)
    valid = check_notes_valid(notes, valid)
    n = notes.shape[0]
    m = queries.shape[0]
    if pinned is None:
        pinned = jnp.zeros((n,), bool)
    else:
        pinned = jnp.asarray(pinned)
        if pinned.shape != (n,):
            raise ValueError(f"pinned must have shape ({n},), got {pinned.shape}")
        pinned = pinned.astype(bool) & valid

    dtype = jnp.result_type(notes.dtype, queries.dtype)
    notes = notes.astype(dtype)
    queries = queries.astype(dtype)
    rel = query_relevance(notes, queries, valid, params).astype(dtype)
    w = note_coupling(notes, valid, params)
    top = jnp.concatenate([jnp.zeros((m, m), dtype), rel], axis=1)
    bottom = jnp.concatenate([rel.T, w], axis=1)
    matrix = jnp.concatenate([top, bottom], axis=0)

    all_valid = jnp.concatenate([jnp.ones((m,), bool), valid])
    constraint = jnp.concatenate([jnp.ones((m,), bool), pinned])
    if params.alpha_from == "free":
        mask = all_valid & ~constraint
    else:
        mask = all_valid
    alpha = spectral_penalty(matrix, mask, params.eps).astype(dtype)
    return Affinity(matrix=matrix, constraint=constraint, valid=all_valid, alpha=alpha, num_queries=m)
