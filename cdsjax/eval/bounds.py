"""The spectral bound of each corpus once, for a batch of problems that share corpora.

Questions on the same document (or the same pool) are separate problems with the same padded notes. A
selector whose penalty does not depend on the question (:func:`cdsjax.core.registry.corpus_bound_fn`) gets
that bound computed once per distinct corpus of a bucket instead of one eigendecomposition per question;
:func:`group_bounds` finds the distinct corpora by content and returns one bound per row.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, Sequence

import numpy as np


def corpus_key(arrays: Sequence[np.ndarray]) -> str:
    """A content hash of one problem's corpus arrays (notes, valid, links, structure; queries excluded)."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def group_bounds(bound_fn: Callable[..., Any], corpus_rows: Sequence[Sequence[np.ndarray]],
                 make_problem: Callable[[int], Any], cache: Dict[str, Any]) -> np.ndarray:
    """One bound per row: ``bound_fn(make_problem(i))`` for the first row of each distinct corpus.

    Args:
      bound_fn: jitted ``fn(problem) -> [] bound`` of one (unbatched) problem.
      corpus_rows: per row, the arrays that define its corpus (hashed by :func:`corpus_key`).
      make_problem: ``i -> CDSProblem`` of row ``i`` (its query rows only give their count).
      cache: content hash -> bound, shared across calls (a run's buckets and chunks).

    Returns:
      ``[rows]`` bounds, in the rows' dtype.
    """
    out = []
    for i, arrays in enumerate(corpus_rows):
        key = corpus_key(arrays)
        if key not in cache:
            cache[key] = np.asarray(bound_fn(make_problem(i)))
        out.append(cache[key])
    return np.stack(out)
