"""Running a registry selector over ragged problems: note-count buckets, compiled batches sharded over a
1-D device mesh, and the caches that let a second run in the same process skip compilation.

* :func:`make_mesh` / :func:`jax_local_devices` — the ``"batch"`` mesh.
* :func:`cached_selector` — :func:`cdsjax.core.make_selector` (parameters resolved at the edge), memoised.
* :func:`run_selector` — one NumPy :class:`~cdsjax.core.Selection` per problem.

How several processes split the problems: :mod:`cdsjax.eval.distributed`.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from cdsjax.eval.problems import Problem
from cdsjax.selection import STRUCTURE_ARRAYS


def jax_local_devices():
    """This process's devices (all of them unless several processes joined through jax.distributed)."""
    import jax

    return jax.local_devices()


def make_mesh(devices: Optional[Sequence[Any]] = None):
    """A 1-D mesh with axis ``"batch"`` over ``devices`` (default: all devices)."""
    import jax
    from jax.sharding import Mesh

    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.asarray(devices), ("batch",))


_BATCHED: Dict[Any, Any] = {}
_COMPILED: Dict[Any, Any] = {}


@contextlib.contextmanager
def compiling_on_one_core():
    """Runs the block with this thread allowed on one core only (on CPU platforms), then restores it.

    XLA:CPU splits large operations into as many parallel parts as the compiling thread may use cores
    (its parallel task assignment), and the split decides the order of float reductions. Without this, a
    process pinned to one core (``run_eval.py --processes N``) compiles other executables than a process
    on all the cores, and near-tied scores round differently (measured: 15 of 324 paper-mode selections in
    five-document pools came out in another order). Compiled as for one core, every process, on any
    machine, runs the same executables; they still run on all of the process's cores, since only this
    thread's affinity changes, and only while compiling. RESULTS.md, "Scale: workers and processes", has
    what it costs a single process.
    """
    import jax

    if jax.default_backend() != "cpu" or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)  # pid 0: this thread
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


MAP_SHARE = 0.6  # of vm.max_map_count: past it, the executables kept here are dropped before another compiles
MAP_CHECK_EVERY = 32  # new executables between two counts of the process's memory mappings
_NEW_EXECUTABLES = [0]


def memory_maps() -> int:
    """How many memory mappings this process holds (0 where ``/proc`` does not say)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def memory_map_limit() -> int:
    """Linux's ``vm.max_map_count`` (0 where unknown)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def near_memory_map_limit(share: float = MAP_SHARE) -> bool:
    """True when this process holds more than ``share`` of the memory mappings Linux allows it."""
    limit = memory_map_limit()
    return limit > 0 and memory_maps() > share * limit


def _executable(call, args):
    """``call`` compiled for ``args`` (a list of pytrees; their leaves' shapes, dtypes, placement, and the tree
    structure) once per process, as for one core (:func:`compiling_on_one_core`).

    Every :data:`MAP_CHECK_EVERY` new executables it counts the process's memory mappings, and past
    :data:`MAP_SHARE` of ``vm.max_map_count`` drops what this module and JAX keep (:func:`release_all`) before
    compiling: each loaded executable holds a few mappings, and at the limit XLA crashes in the next compile."""
    import jax

    leaves, tree = jax.tree_util.tree_flatten(args)
    key = (call, str(tree), tuple((a.shape, str(a.dtype), a.sharding) for a in leaves))
    if key not in _COMPILED:
        _NEW_EXECUTABLES[0] += 1
        if _NEW_EXECUTABLES[0] % MAP_CHECK_EVERY == 0 and near_memory_map_limit():
            release_all()
        with compiling_on_one_core():
            _COMPILED[key] = call.lower(*args).compile()
    return _COMPILED[key]


def release(fn: Callable[..., Any]) -> int:
    """Drops every executable and wrapper kept for ``fn`` (a selector built for one use, e.g. one fitted
    game per cross-validation task), so a long run does not keep one set of loaded executables per such
    function; returns how many cache entries were dropped."""
    dropped = 0
    bound = _BOUNDS.pop(fn, None)
    dropped += int(bound is not None)
    _CORPUS_BOUNDS.pop(fn, None)
    for key in [k for k in _COMPILED if bound is not None and k[0] is bound]:
        del _COMPILED[key]
        dropped += 1
    batched = [k for k in _BATCHED if k[0] is fn]
    calls = {id(_BATCHED[k]) for k in batched}
    for key in batched:
        del _BATCHED[key]
        dropped += 1
    for key in [k for k in _COMPILED if k[0] is fn or id(k[0]) in calls]:
        del _COMPILED[key]
        dropped += 1
    return dropped


def release_all() -> int:
    """Drops every executable this module keeps (the batched calls, their compiled executables, the bounds)
    and JAX's own caches of jitted functions; returns how many of this module's entries were dropped.

    Each loaded executable holds a few memory mappings: a process that evaluates thousands of selector
    shapes (a long cross-validation run, a notebook, a test worker) otherwise reaches Linux's
    ``vm.max_map_count`` (65,530 by default), and XLA then crashes while compiling the next one. What was
    dropped compiles again (or loads from the persistent cache) on its next use."""
    import gc

    import jax

    dropped = len(_COMPILED) + len(_BATCHED) + len(_BOUNDS)
    for cache in (_COMPILED, _BATCHED, _BOUNDS, _HAS_BOUND):
        cache.clear()
    jax.clear_caches()
    gc.collect()
    return dropped


def _batched(fn, sharded: bool, chunk=None):
    """The jitted batch call, kept per function (:func:`_executable` compiles it once per input shape).

    Sharded over several devices: ``jit(vmap(fn))`` (each device solves its slice).
    On one device: :func:`cdsjax.core.batched` with ``chunk``, the selector's
    ``SelectorSpec.batch_chunk`` (paper-mode CDS: cache-sized chunks on a CPU, one
    ``vmap`` on an accelerator).
    """
    from cdsjax import core

    key = (fn, sharded, chunk)
    if key not in _BATCHED:
        _BATCHED[key] = core.batched(fn, chunk=None if sharded else chunk)
    return _BATCHED[key]


_SELECTOR_FNS: Dict[Any, Any] = {}


_BOUNDS: Dict[Any, Any] = {}
_CORPUS_BOUNDS: Dict[Any, Dict[str, Any]] = {}  # selector -> {corpus content hash: bound}, kept across runs
_HAS_BOUND: Dict[Any, bool] = {}  # (bound function, problem structure and shapes) -> whether it gives one


def _bound_call(fn):
    """The jitted corpus-bound function of a registry selector (:func:`cdsjax.core.registry.corpus_bound_fn`),
    kept per selector; None for a selector without one."""
    import jax

    from cdsjax.core import registry

    if fn not in _BOUNDS:
        make = registry.corpus_bound_fn(fn)
        _BOUNDS[fn] = None if make is None else jax.jit(make)
    return _BOUNDS[fn]


def _with_bounds(bound, batch, cache: Dict[str, Any]):
    """``batch`` (a CDSProblem with a leading axis) with each row's corpus bound, computed once per distinct
    corpus (:func:`cdsjax.eval.bounds.group_bounds`); unchanged where the selector's game has none for it."""
    import jax

    from cdsjax.eval.bounds import group_bounds

    one = lambda i: jax.tree_util.tree_map(lambda a: a[i], batch)  # noqa: E731
    leaves, tree = jax.tree_util.tree_flatten(batch)
    shape_key = (bound, str(tree), tuple((np.shape(a), str(np.asarray(a).dtype)) for a in leaves))
    if shape_key not in _HAS_BOUND:  # e.g. alpha_from="full": found per question (traced once per shape)
        _HAS_BOUND[shape_key] = jax.eval_shape(bound, one(0)) is not None
    if not _HAS_BOUND[shape_key]:
        return batch
    leaves = [a for a in (batch.notes, batch.valid, batch.links, batch.pages, batch.doc_ids, batch.kinds,
                          batch.pinned) if a is not None]
    rows = [[np.asarray(a[i]) for a in leaves] + [np.asarray(batch.queries.shape[1:])]
            for i in range(batch.notes.shape[0])]
    def compute(problem):  # compiled as the selectors are, for one core, so its reductions are theirs
        problem = jax.device_put(problem)
        return _executable(bound, [problem])(problem) if hasattr(bound, "lower") else bound(problem)

    return batch.replace(bound=group_bounds(compute, rows, one, cache))


def cached_selector(name: str, budget: int, options: Mapping[str, Any]):
    """:func:`cdsjax.core.make_selector` with a learned selector's ``params`` resolved to a value
    (:func:`cdsjax.selection.resolve_options`: a file, or the shipped fit), memoised on (name, budget,
    options with the parameters' content hash), so a second :func:`evaluate` in the same process does not
    compile again."""
    from cdsjax.selection import resolve_options, resolve_selector, selector_key

    options = resolve_options(name, options)
    key = json.dumps(selector_key(name, budget, options), sort_keys=True, default=repr)
    if key not in _SELECTOR_FNS:
        _SELECTOR_FNS[key] = resolve_selector(name, budget, options)[1]
    return _SELECTOR_FNS[key]


def run_selector(
    fn: Callable[..., Any],
    problems: Sequence[Problem],
    *,
    buckets: Sequence[int],
    max_batch: int = 64,
    mesh=None,
    keys: Optional[Sequence[Any]] = None,
    on_chunk: Optional[Callable[[List[int], List[Any]], None]] = None,
    dtype: Any = np.float32,
    chunk: Optional[Any] = None,
    spec: Optional[Any] = None,
) -> List[Any]:
    """Runs a registry selector over ragged problems, batched and sharded.

    Problems are padded (trailing) into note-count buckets; each bucket is cut into
    chunks of at most ``max_batch`` problems, and a chunk's batch axis is padded
    (repeating its first problem) to a size the mesh size divides
    (:func:`cdsjax.core.padded_batch`: a power of two, or less where padded slots
    would cost more than a compilation), so a run compiles once per (bucket, chunk
    size). Inputs are placed with ``NamedSharding(mesh, P("batch"))``: each device
    solves its slice of the batch.

    Args:
      fn: ``fn(problem: CDSProblem, key) -> Selection`` (see :func:`cdsjax.core.make_selector`).
      problems: the problems, any note counts.
      buckets: allowed padded note counts.
      max_batch: most problems per compiled call (memory bound: CDS holds an
        ``[n+1, n+1]`` matrix per problem).
      mesh: a 1-D mesh from :func:`make_mesh` (default: all devices).
      keys: one PRNG key per problem (default: derived from each query id).
      on_chunk: called with (problem positions, their selections) after each chunk,
        e.g. to write records as they come.
      dtype: float type of the embeddings fed to the selector (float64 needs
        ``jax_enable_x64``, set by the entry point; it lets converged-mode solvers go below
        float32's KKT floor).
      chunk: the selector's ``SelectorSpec.batch_chunk`` (how a one-device batch is cut).
      spec: the selector's :class:`~cdsjax.core.SelectorSpec`. When it reads structure
        (``spec.structure``), each problem carries the arrays of :meth:`Problem.structure` (printed pages
        only with ``spec.pages_only``), padded like the notes (padding 0; ``valid`` says which notes are
        real); other selectors get problems without them and compile as they always did.

    Returns:
      One Selection with NumPy leaves per problem, in input order.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from cdsjax import core

    if not problems:
        return []
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    dtype = np.dtype(dtype)
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        raise ValueError("dtype float64 needs jax_enable_x64 (turned on by the entry point)")
    mesh = make_mesh() if mesh is None else mesh
    ndev = int(mesh.devices.size)
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    if keys is None:
        keys = [core.key_from_query_id(p.query.qid) for p in problems]
    keys = jnp.stack(list(keys))

    names = STRUCTURE_ARRAYS if spec is not None and spec.structure else ()
    extras = {"links": [np.asarray(p.links, bool) for p in problems]}
    if names:
        structures = [p.structure(pages_only=spec.pages_only) for p in problems]
        extras.update({a: [s[a] for s in structures] for a in names})
    groups = core.make_buckets(
        [np.asarray(p.notes, dtype) for p in problems],
        [np.asarray(p.query_emb, dtype) for p in problems],
        buckets=buckets, extras=extras, pad_batch=False)
    call = _batched(fn, sharded=ndev > 1, chunk=chunk)
    bound = _bound_call(fn)
    bounds = _CORPUS_BOUNDS.setdefault(fn, {})  # corpus content hash -> its bound (questions on one document share it)
    out: List[Any] = [None] * len(problems)
    for g in groups:
        for start in range(0, len(g.positions), max_batch):
            rows = np.arange(start, min(start + max_batch, len(g.positions)))
            k = len(rows)
            size = core.padded_batch(k, g.size, multiple=ndev)
            padded = np.concatenate([rows, np.full(size - k, rows[0])])
            queries = g.queries[padded]
            problem = core.CDSProblem(notes=g.notes[padded], queries=queries[:, None, :] if queries.ndim == 2 else queries,
                                      valid=g.valid[padded], links=g.extras["links"][padded],
                                      **{a: g.extras[a][padded] for a in names})
            if bound is not None:
                problem = _with_bounds(bound, problem, bounds)
            problem = jax.device_put(problem, sharding)
            key_batch = jax.device_put(keys[g.positions[padded]], sharding)
            sel = jax.device_get(_executable(call, [problem, key_batch])(problem, key_batch))
            positions = [int(g.positions[r]) for r in rows]
            chunk = [jax.tree_util.tree_map(lambda a, i=i: np.asarray(a[i]), sel)
                     for i in range(k)]
            for pos, s in zip(positions, chunk):
                out[pos] = s
            if on_chunk is not None:
                on_chunk(positions, chunk)
    return out
