"""Static shape checks at trace time, and a value check for arrays entering from outside.

Core functions only check static things (ranks, matching dimensions, option
strings) and raise ``ValueError`` naming the argument. Value checks (NaN, inf,
norms) need concrete arrays: :func:`validate_embeddings` is for the IO layer to
call before anything reaches a jitted function.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import numpy as np
from jax import Array


def as_query_matrix(queries: Array, notes: Array, name: str = "query") -> Array:
    """Returns ``queries`` as ``[m, d]``; raises ``ValueError`` on a bad rank or dimension."""
    queries = jnp.asarray(queries)
    notes = jnp.asarray(notes)
    if notes.ndim != 2:
        raise ValueError(f"notes must have rank 2 [n, d], got shape {notes.shape}")
    if queries.ndim == 1:
        queries = queries[None, :]
    if queries.ndim != 2:
        raise ValueError(f"{name} must have shape [d] or [m, d], got {queries.shape}")
    if queries.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one query vector")
    if queries.shape[1] != notes.shape[1]:
        raise ValueError(
            f"{name} dimension {queries.shape[1]} does not match notes dimension {notes.shape[1]}"
        )
    return queries


def query_similarity(notes: Array, queries: Array, query_scores: Optional[Array] = None) -> Array:
    r"""``[m, n]`` the query--note similarities every relevance in the core starts from: :math:`q_k^\top z_i`, or
    the caller's ``query_scores`` in its place (a relevance fused from lexical and dense scores, on the cosine's
    scale, computed above the core). ``queries`` is ``[m, d]``; ``query_scores`` ``[m, n]`` or ``[n]`` (one row)."""
    if query_scores is None:
        return queries @ notes.T
    scores = jnp.asarray(query_scores)
    if scores.ndim == 1:
        scores = scores[None, :]
    if scores.shape != (queries.shape[0], notes.shape[0]):
        raise ValueError(f"query_scores must have shape {(queries.shape[0], notes.shape[0])} (one row per query, "
                         f"one column per note), got {scores.shape}")
    return scores.astype(jnp.result_type(notes.dtype, queries.dtype))


def check_notes_valid(notes: Array, valid: Array) -> Array:
    """Returns ``valid`` as a bool array; raises ``ValueError`` if it does not match ``notes``."""
    notes = jnp.asarray(notes)
    if notes.ndim != 2:
        raise ValueError(f"notes must have rank 2 [n, d], got shape {notes.shape}")
    if notes.shape[0] < 1:
        raise ValueError("notes must hold at least one row")
    valid = jnp.asarray(valid)
    if valid.shape != (notes.shape[0],):
        raise ValueError(f"valid must have shape ({notes.shape[0]},), got {valid.shape}")
    return valid.astype(bool)


def check_budget(budget) -> int:
    """Returns ``budget`` as an int; raises ``ValueError`` unless it is an integer >= 1."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"budget must be an integer >= 1, got {budget!r}")
    if budget < 1:
        raise ValueError(f"budget must be an integer >= 1, got {budget}")
    return int(budget)


def check_positive(name: str, value) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def check_int_range(name: str, value, cap: int) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``value`` is an integer in ``[1, cap]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= cap:
        raise ValueError(f"{name} must be an integer in [1, {cap:,}], got {value!r}")


def check_option(name: str, value, allowed) -> None:
    """Raises ``ValueError`` naming ``name`` if ``value`` is not one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def validate_embeddings(
    notes,
    query=None,
    valid: Optional[np.ndarray] = None,
    *,
    norm_atol: Optional[float] = 1e-3,
) -> None:
    """Checks concrete embeddings before they enter the core.

    Args:
      notes: ``[n, d]`` array of note embeddings.
      query: optional ``[d]`` or ``[m, d]`` query embedding(s).
      valid: optional ``[n]`` bool mask; only valid rows are checked.
      norm_atol: if not None, rows must be L2-normalised within this tolerance.

    Raises:
      ValueError: naming the argument, on a bad rank, mismatched dimension,
        empty input, NaN/inf values or (with ``norm_atol``) un-normalised rows.
    """
    notes = np.asarray(notes)
    if notes.ndim != 2:
        raise ValueError(f"notes must have rank 2 [n, d], got shape {notes.shape}")
    if notes.shape[0] == 0:
        raise ValueError("notes is empty: there is nothing to select from")
    if valid is None:
        valid = np.ones(notes.shape[0], bool)
    valid = np.asarray(valid, bool)
    if valid.shape != (notes.shape[0],):
        raise ValueError(f"valid must have shape ({notes.shape[0]},), got {valid.shape}")
    if not valid.any():
        raise ValueError("valid has no True entry: there is nothing to select from")
    rows = notes[valid]
    _check_finite_rows("notes", rows)
    if norm_atol is not None:
        _check_norms("notes", rows, norm_atol)
    if query is not None:
        q = np.asarray(query)
        if q.ndim == 1:
            q = q[None]
        if q.ndim != 2 or q.shape[1] != notes.shape[1]:
            raise ValueError(
                f"query must have shape [{notes.shape[1]}] or [m, {notes.shape[1]}], got {np.shape(query)}"
            )
        _check_finite_rows("query", q)
        if norm_atol is not None:
            _check_norms("query", q, norm_atol)


def check_unit_norm(notes, queries, valid, *, atol: float = 1e-3) -> None:
    """The unit-norm precondition of the game at the API edge (:func:`cdsjax.core.cds_equilibrium`, what
    :func:`cdsjax.core.retrieval_surrogates` differentiates): with concrete arrays, every valid note row and every
    query row must have L2 norm 1 within ``atol`` (the affinity uses dot products as cosines, so scaled inputs
    change the picks); ``ValueError`` naming the argument otherwise. Traced arrays (inside ``jit``, ``vmap`` or a
    derivative with respect to the embeddings) are not checked: check them before tracing
    (:func:`validate_embeddings`)."""
    import jax

    arrays = (notes, queries, valid)
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        return
    q = np.asarray(queries)
    validate_embeddings(np.asarray(notes), q.reshape(-1, q.shape[-1]), np.asarray(valid, bool), norm_atol=atol)


def _check_finite_rows(name: str, rows: np.ndarray) -> None:
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} has {int(bad.sum())} row(s) with NaN or inf values (first: row {first})")


def _check_norms(name: str, rows: np.ndarray, atol: float) -> None:
    norms = np.linalg.norm(rows, axis=1)
    bad = np.abs(norms - 1.0) > atol
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name} rows must be L2-normalised; row {first} has norm {norms[first]:.4g}"
        )
