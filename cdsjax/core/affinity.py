r"""The query-augmented affinity and its spectral penalty: the one affinity builder of every game.

:func:`problem_affinity` is what every strategy of :func:`cdsjax.core.cds` and the differentiable
equilibrium call: the paper's game for :class:`~cdsjax.core.CDSParams` (:func:`build_affinity`), a
parametric game's own edges for any other :class:`~cdsjax.core.protocols.Game` (the learned game,
:class:`~cdsjax.core.learned.LearnedParams`). Both assemble their matrix, constraint set and penalty with
:func:`assemble_affinity`, so pinned notes and the penalty rule mean the same in every game.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array

from cdsjax.core.certified import certified_bound
from cdsjax.core.types import Affinity, CDSParams, CDSProblem
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


def block_bound(matrix: Array, mask: Array, params, bound: Optional[Array] = None) -> Array:
    r"""The spectral bound :math:`b \ge \lambda_{\max}(\text{matrix}[\text{mask}, \text{mask}]) + \varepsilon`
    of a game's penalty: ``bound`` when given (a corpus's, precomputed) and ``alpha_from`` is ``"free"``, else
    one eigendecomposition (:func:`spectral_penalty`) or, with ``alpha_bound="certified"``, the certified
    Lanczos bound (:func:`cdsjax.core.spectral.certified_bound`)."""
    dtype = matrix.dtype
    if bound is not None and params.alpha_from == "free":
        return jnp.asarray(bound).astype(dtype)
    if getattr(params, "alpha_bound", "exact") == "certified":
        return certified_bound(matrix, mask, params.eps).astype(dtype)
    return spectral_penalty(matrix, mask, params.eps).astype(dtype)


def build_affinity(
    notes: Array,
    queries: Array,
    valid: Array,
    params: CDSParams = CDSParams(),
    pinned: Optional[Array] = None,
    bound: Optional[Array] = None,
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
      bound: optional ``[]`` spectral bound precomputed for the corpus (:func:`block_bound`).

    Returns:
      The :class:`Affinity` over ``m + n`` vertices.
    """
    params.check()
    queries = as_query_matrix(queries, notes)
    valid = check_notes_valid(notes, valid)
    dtype = jnp.result_type(notes.dtype, queries.dtype)
    notes = notes.astype(dtype)
    queries = queries.astype(dtype)
    rel = query_relevance(notes, queries, valid, params).astype(dtype)
    return assemble_affinity(rel, note_coupling(notes, valid, params), valid, params, pinned=pinned, bound=bound)


def check_pinned(pinned: Optional[Array], valid: Array) -> Array:
    """``[n]`` bool pinned notes (real ones only; none when ``pinned`` is None); ``ValueError`` on a bad shape."""
    n = valid.shape[0]
    if pinned is None:
        return jnp.zeros((n,), bool)
    pinned = jnp.asarray(pinned)
    if pinned.shape != (n,):
        raise ValueError(f"pinned must have shape ({n},), got {pinned.shape}")
    return pinned.astype(bool) & valid


def assemble_affinity(rel: Array, w: Array, valid: Array, params, *, pinned: Optional[Array] = None,
                      bound: Optional[Array] = None) -> Affinity:
    r"""The :class:`Affinity` of query edges ``rel`` and note block ``w``, with its constraint set and penalty.

    Args:
      rel: ``[m, n]`` query--note edges (0 at padding), in the affinity's dtype.
      w: ``[n, n]`` note--note block (zero diagonal, zero at padding), same dtype.
      valid: ``[n]`` bool, True on real notes.
      params: the game (:class:`~cdsjax.core.protocols.Game`): ``alpha_from`` and ``eps`` give the
        spectral bound :math:`b`, ``params.penalty(b)`` the penalty :math:`\alpha`.
      pinned: optional ``[n]`` bool, notes that join the constraint set.
      bound: optional ``[]`` spectral bound precomputed for the corpus (:func:`block_bound`).
    """
    m, n = rel.shape
    dtype = w.dtype
    pinned = check_pinned(pinned, valid)
    top = jnp.concatenate([jnp.zeros((m, m), dtype), rel], axis=1)
    bottom = jnp.concatenate([rel.T, w], axis=1)
    matrix = jnp.concatenate([top, bottom], axis=0)
    all_valid = jnp.concatenate([jnp.ones((m,), bool), valid])
    constraint = jnp.concatenate([jnp.ones((m,), bool), pinned])
    mask = all_valid & ~constraint if params.alpha_from == "free" else all_valid
    alpha = params.penalty(block_bound(matrix, mask, params, bound))
    return Affinity(matrix=matrix, constraint=constraint, valid=all_valid, alpha=alpha, num_queries=m)


def problem_affinity(problem: CDSProblem, params) -> Affinity:
    """The affinity of ``problem`` under the game ``params``: the one builder every strategy calls.

    :class:`CDSParams` builds the paper's game (:func:`build_affinity`, pinned notes kept); any other game
    (:class:`~cdsjax.core.protocols.Game`, e.g. :class:`~cdsjax.core.learned.LearnedParams`) builds its own
    with ``params.affinity(problem)``, which reads the problem's structure arrays and pinned notes.
    """
    if isinstance(params, CDSParams):
        return build_affinity(problem.notes, problem.queries, problem.valid, params, pinned=problem.pinned,
                              bound=problem.bound)
    if not callable(getattr(params, "affinity", None)):
        raise TypeError(f"params must be CDSParams or a game with an affinity(problem) method, got "
                        f"{type(params).__name__}")
    return params.affinity(problem)
