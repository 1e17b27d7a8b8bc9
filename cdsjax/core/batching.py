"""Padding ragged problems into a few bucket sizes, and mapping results back.

A run over thousands of queries with different note counts should compile a
handful of times, not once per query. Problems are padded (trailing) to the
smallest bucket that fits and the batch axis to a power of two, then each bucket
runs as one jitted ``vmap`` (or, with ``chunk``, as cache-sized vmapped chunks; see
:func:`batched`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, List, Optional, Sequence, Union

import jax
import numpy as np

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def bucket_size(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Smallest bucket >= ``n``; past the largest, the next multiple of it."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for b in sorted(buckets):
        if n <= b:
            return int(b)
    top = int(max(buckets))
    return int(-(-n // top) * top)


def pad_rows(x: np.ndarray, size: int, value=0) -> np.ndarray:
    """Pads axis 0 of ``x`` to ``size`` with ``value`` (trailing)."""
    x = np.asarray(x)
    if x.shape[0] > size:
        raise ValueError(f"cannot pad {x.shape[0]} rows down to {size}")
    pad = [(0, size - x.shape[0])] + [(0, 0)] * (x.ndim - 1)
    return np.pad(x, pad, constant_values=value)


def next_pow2(k: int) -> int:
    return 1 << max(0, int(k - 1).bit_length())


COMPILE_COST = 16 * 512 ** 2
"""What compiling one batch shape of paper-mode CDS costs, in units of padded problems x notes^2 (the
per-step cost of a dense solver): on one CPU core a shape compiles in 2-3 s, about as long as 16 problems of
512 notes take to solve. Only padding and the balance of a multi-process split depend on it."""


def padded_batch(k: int, n: int, *, multiple: int = 1, compile_cost: float = COMPILE_COST) -> int:
    """The batch size a chunk of ``k`` problems of ``n`` (padded) notes is padded to.

    A power of two keeps the number of compiled shapes small, but a padded slot is solved like a real
    problem, so for large ``n`` that costs more than a compilation: a chunk of 48 problems of 1024 notes
    padded to 64 solves 16 problems for nothing. So the chunk pads to the next power of two or to the next
    multiple of ``g``, whichever is smaller, where ``g`` is the largest power of two whose ``g - 1`` wasted
    slots cost no more than ``compile_cost``; then up to a multiple of ``multiple`` (the devices sharing the
    batch). Depends only on ``(k, n)``, so every process of a split pads a chunk alike.
    """
    if k < 1 or n < 1:
        raise ValueError(f"k and n must be >= 1, got k={k}, n={n}")
    g = 1
    while 2 * g - 1 <= compile_cost / float(n) ** 2:
        g *= 2
    size = min(next_pow2(k), -(-k // g) * g)
    return -(-size // multiple) * multiple


@dataclasses.dataclass
class Bucket:
    """One padded group: stacked arrays and the original positions of its rows.

    Attributes:
      size: padded note count ``n``.
      positions: ``[b_real]`` indices into the caller's list.
      notes: ``[b, n, d]`` padded notes (batch padded to a power of two by
        repeating the first problem; those rows are dropped on the way back).
      queries: ``[b, ...]`` queries.
      valid: ``[b, n]`` bool.
      extras: dict of further per-problem ``[b, n, ...]`` arrays (e.g. links, pinned).
    """

    size: int
    positions: np.ndarray
    notes: np.ndarray
    queries: np.ndarray
    valid: np.ndarray
    extras: dict


def make_buckets(
    notes_list: Sequence[np.ndarray],
    queries_list: Sequence[np.ndarray],
    *,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    extras: Optional[dict] = None,
    pad_batch: bool = True,
) -> List[Bucket]:
    """Groups ragged problems by bucket size and pads them.

    Args:
      notes_list: per problem, ``[n_i, d]`` note embeddings.
      queries_list: per problem, ``[d]`` or ``[m, d]`` queries (same shape across problems).
      buckets: allowed padded sizes of the note axis.
      extras: optional ``{name: list of per-problem arrays}`` whose first axis (and,
        for square ``[n_i, n_i]`` arrays, second axis) is the note axis.
      pad_batch: pad the batch axis of each bucket to a power of two.

    Returns:
      A list of :class:`Bucket`, one per size used.
    """
    if len(notes_list) != len(queries_list):
        raise ValueError("notes_list and queries_list must have the same length")
    if len(notes_list) == 0:
        raise ValueError("notes_list is empty")
    extras = extras or {}
    for name, arrs in extras.items():
        if len(arrs) != len(notes_list):
            raise ValueError(f"extras[{name!r}] must have one entry per problem")
    groups: dict[int, list[int]] = {}
    for i, z in enumerate(notes_list):
        z = np.asarray(z)
        if z.ndim != 2:
            raise ValueError(f"notes_list[{i}] must have rank 2, got shape {z.shape}")
        groups.setdefault(bucket_size(z.shape[0], buckets), []).append(i)
    out = []
    for size in sorted(groups):
        pos = groups[size]
        rows = pos + [pos[0]] * ((next_pow2(len(pos)) if pad_batch else len(pos)) - len(pos))
        notes = np.stack([pad_rows(notes_list[i], size) for i in rows])
        queries = np.stack([np.asarray(queries_list[i]) for i in rows])
        valid = np.stack([np.arange(size) < np.asarray(notes_list[i]).shape[0] for i in rows])
        ex = {}
        for name, arrs in extras.items():
            padded = []
            for i in rows:
                a = np.asarray(arrs[i])
                n_i = np.asarray(notes_list[i]).shape[0]
                a = pad_rows(a, size)
                if a.ndim >= 2 and a.shape[1] == n_i:
                    a = np.swapaxes(pad_rows(np.swapaxes(a, 0, 1), size), 0, 1)
                padded.append(a)
            ex[name] = np.stack(padded)
        out.append(Bucket(size, np.asarray(pos), notes, queries, valid, ex))
    return out


def run_buckets(
    fn: Callable[..., Any],
    buckets: Sequence[Bucket],
    num_problems: int,
    *,
    extra_names: Sequence[str] = (),
    chunk: Union[int, str, None] = None,
) -> List[Any]:
    """Runs ``batched(fn, chunk=chunk)(notes, queries, valid, *extras)`` per bucket.

    Args:
      fn: per-problem function ``fn(notes [n, d], query, valid [n], *extras) -> pytree``.
      buckets: from :func:`make_buckets`.
      num_problems: length of the caller's list.
      extra_names: names of bucket extras passed positionally after ``valid``.
      chunk: see :func:`batched`.

    Returns:
      A list with one pytree of NumPy arrays per problem, in the caller's order.
    """
    run = batched(fn, chunk=chunk)
    results: List[Any] = [None] * num_problems
    for b in buckets:
        out = run(b.notes, b.queries, b.valid, *[b.extras[k] for k in extra_names])
        out = jax.device_get(out)
        for row, pos in enumerate(b.positions):
            results[int(pos)] = jax.tree_util.tree_map(lambda a: a[row], out)
    return results


def batch_apply(
    fn: Callable[..., Any],
    notes_list: Sequence[np.ndarray],
    queries_list: Sequence[np.ndarray],
    *,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    extras: Optional[dict] = None,
    chunk: Union[int, str, None] = None,
) -> List[Any]:
    """Pads ragged problems into buckets, runs ``fn`` batched, and returns per-problem results.

    Example::

        fn = functools.partial(cds_select, budget=5)  # from cdsjax.core.compat
        sels = batch_apply(fn, [z1, z2, z3], [q1, q2, q3])
        sels[1].indices[sels[1].selected_valid]

    Args:
      fn: per-problem function ``fn(notes, query, valid, *extras)``.
      notes_list, queries_list: ragged problems.
      buckets: allowed padded note counts.
      extras: optional ``{name: per-problem arrays}`` passed after ``valid`` in
        the order of the dict.
      chunk: see :func:`batched`.

    Returns:
      One result pytree (NumPy leaves) per problem, in input order.
    """
    extras = extras or {}
    bs = make_buckets(notes_list, queries_list, buckets=buckets, extras=extras)
    return run_buckets(fn, bs, len(notes_list), extra_names=tuple(extras), chunk=chunk)


CPU_CACHE_BYTES = 1 << 19
"""Working-set budget of one ``"auto"`` chunk on CPU: half of a 1 MiB per-core L2.

Measured at b = 64 on a 2-core EPYC (``experiments/bench_core.py``): the best
fixed chunk was 16 at n = 64, 4 at n = 128 and 1 at n >= 256, which this budget
reproduces; a vmapped chunk of 2 at n = 256 was half as fast as chunks of 1.
"""


def auto_chunk(batch: int, n: int, itemsize: int, *, platform: str, cache_bytes: int = CPU_CACHE_BYTES) -> Optional[int]:
    """The chunk ``batched(..., chunk="auto")`` uses for a ``[batch, n, ...]`` input.

    Iterative solvers sweep one ``[n+1, n+1]`` matrix per problem on every step. On a
    CPU, a vmapped step over the whole batch streams all of them from memory each
    time; a chunk whose matrices fit in the core's cache re-reads them from cache.
    So on CPU the chunk is the largest power of two whose matrices fit in
    ``cache_bytes`` (at least 1); on accelerators the batch stays one ``vmap``
    (``None``), which is what they are built for.

    Args:
      batch: batch size.
      n: padded note count.
      itemsize: bytes per float.
      platform: ``jax.default_backend()`` (``"cpu"``, ``"gpu"``, ``"tpu"``, ...).
      cache_bytes: the cache budget of one chunk.
    """
    if platform != "cpu":
        return None
    per_problem = itemsize * (n + 1) ** 2
    fit = max(1, cache_bytes // per_problem)
    chunk = 1 << (int(fit).bit_length() - 1)
    return None if chunk >= batch else chunk


def batched(fn: Callable[..., Any], *, chunk: Union[int, str, None] = None, **kwargs) -> Callable[..., Any]:
    """A per-query core function over a padded batch, jitted.

    Args:
      fn: per-query function; its positional arguments get a leading batch axis.
        With ``chunk="auto"`` the first one is the ``[b, n, ...]`` notes.
      chunk: how the batch axis runs.

        * ``None`` (default): one ``vmap`` over the whole batch (``jit(vmap(fn))``).
        * an int ``k``: a sequence of vmapped chunks of ``k`` queries
          (``lax.map(..., batch_size=k)``). Replicator dynamics sweep every
          query's ``[n+1, n+1]`` payoff on each of thousands of steps; a chunk whose
          matrices fit in cache runs much faster on CPUs than one sweep over the
          whole batch per step.
        * ``"auto"``: :func:`auto_chunk` picks per input shape; on CPU a
          cache-sized chunk, elsewhere one ``vmap``. Use it for paper-mode CDS
          (the evaluation picks a selector's chunk from its solver, :func:`cdsjax.eval.run.batch_chunk`); solvers
          that touch one column per step (InImDyn) or stop within a few hundred
          steps run faster as one ``vmap``.

        * ``"each"``: one query after another (``lax.map`` without ``vmap``), so a query's own control flow
          runs as written: under ``vmap`` a ``lax.cond`` becomes a select that runs both branches (the serving
          solver's fallback after every converged primal-dual solve), and a ``while_loop`` runs until the
          slowest query stops.

        Results are identical whichever is used.
      **kwargs: static keyword arguments bound to ``fn``.
    """
    f = functools.partial(fn, **kwargs)
    if chunk is None:
        return jax.jit(jax.vmap(f))
    if chunk == "each":
        return jax.jit(lambda *args: jax.lax.map(lambda a: f(*a), args))
    if chunk == "auto":
        def run_auto(*args):
            lead = jax.tree_util.tree_leaves(args[0])[0]
            k = auto_chunk(lead.shape[0], lead.shape[1] if lead.ndim > 1 else 1,
                           jax.numpy.dtype(lead.dtype).itemsize, platform=jax.default_backend())
            if k is None:
                return jax.vmap(f)(*args)
            return jax.lax.map(lambda a: f(*a), args, batch_size=k)

        return jax.jit(run_auto)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, None, 'auto' or 'each', got {chunk!r}")
    return jax.jit(lambda *args: jax.lax.map(lambda a: f(*a), args, batch_size=chunk))
