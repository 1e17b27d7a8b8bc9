"""Running a registry selector over ragged problems: note-count buckets, compiled batches sharded over a
1-D device mesh, and the caches that let a second run in the same process skip compilation.

* :func:`make_mesh` / :func:`jax_local_devices` — the ``"batch"`` mesh.
* :func:`cached_selector` — :func:`cdsjax.core.make_selector` (parameters resolved at the edge), kept in the
  caller's cache.
* :class:`Executables` — a run's compiled calls (each selector's batched call, each executable per input shape),
  created by the run and handed to what it calls.
* :func:`corpus_arrays_cache` — the caller's :class:`~cdsjax.pipeline.selection.CorpusArrays` (each corpus's bound
  and note block once).
* :func:`run_selector` — one NumPy :class:`~cdsjax.core.Selection` per problem.

How several processes split the problems: :mod:`cdsjax.eval.distributed`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from cdsjax.eval.problems import Problem
from cdsjax.pipeline.selection import STRUCTURE_ARRAYS, CorpusArrays


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


@contextlib.contextmanager
def compiling_on_one_core():
    """Runs the block with this thread allowed on one core only (on CPU platforms), then restores it.

    XLA:CPU splits large operations into as many parallel parts as the compiling thread may use cores
    (its parallel task assignment), and the split decides the order of float reductions. Without this, a
    process pinned to one core (``run_eval.py --processes N``) compiles other executables than a process
    on all the cores, and near-tied scores round differently (measured: 15 of 324 paper-mode selections in
    five-document pools came out in another order). Compiled as for one core, every process, on any
    machine, runs the same executables; they still run on all of the process's cores, since only this
    thread's affinity changes, and only while compiling.
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


class Executables:
    """The compiled calls of an evaluation run: each selector's jitted batch call (:meth:`batched`) and each
    call's executable per input shape (:meth:`executable`), compiled as for one core
    (:func:`compiling_on_one_core`).

    A run creates one and hands it to every :func:`run_selector` call and to its :func:`corpus_arrays_cache`,
    so a second selector call with the same shapes does not compile again; what is handed none compiles for
    that call only. ``batch_calls`` and ``compiled`` are the kept entries, ``new`` counts executables compiled
    so far (every :data:`MAP_CHECK_EVERY` of them the process's memory mappings are counted).
    """

    def __init__(self):
        self.batch_calls: Dict[Any, Any] = {}
        self.compiled: Dict[Any, Any] = {}
        self.new = 0

    def executable(self, call, args):
        """``call`` compiled for ``args`` (a list of pytrees; their leaves' shapes, dtypes, placement, and the
        tree structure) once, as for one core (:func:`compiling_on_one_core`).

        Every :data:`MAP_CHECK_EVERY` new executables it counts the process's memory mappings, and past
        :data:`MAP_SHARE` of ``vm.max_map_count`` drops what this object and JAX keep (:meth:`release_all`)
        before compiling: each loaded executable holds a few mappings, and at the limit XLA crashes in the
        next compile."""
        import jax

        leaves, tree = jax.tree_util.tree_flatten(args)
        key = (call, str(tree), tuple((a.shape, str(a.dtype), a.sharding) for a in leaves))
        if key not in self.compiled:
            self.new += 1
            if self.new % MAP_CHECK_EVERY == 0 and near_memory_map_limit():
                self.release_all()
            with compiling_on_one_core():
                self.compiled[key] = call.lower(*args).compile()
        return self.compiled[key]

    def batched(self, fn, sharded: bool, chunk=None):
        """The jitted batch call, kept per function (:meth:`executable` compiles it once per input shape).

        Sharded over several devices: ``jit(vmap(fn))`` (each device solves its slice).
        On one device: :func:`cdsjax.core.batched` with ``chunk``, the selector's
        :func:`batch_chunk` (paper-mode CDS: cache-sized chunks on a CPU, one
        ``vmap`` on an accelerator).
        """
        from cdsjax import core

        key = (fn, sharded, chunk)
        if key not in self.batch_calls:
            self.batch_calls[key] = core.batched(fn, chunk=None if sharded else chunk)
        return self.batch_calls[key]

    def release(self, fn: Callable[..., Any], corpus: Optional[CorpusArrays] = None) -> int:
        """Drops every executable and wrapper kept for ``fn`` (a selector built for one use, e.g. one fitted
        game per cross-validation task), and its arrays in ``corpus`` (the :class:`CorpusArrays` the runs
        used), so a long run does not keep one set of loaded executables per such function; returns how many
        cache entries were dropped."""
        dropped = 0
        for wrapped in ([] if corpus is None else corpus.drop(fn)):
            dropped += 1
            for key in [k for k in self.compiled if k[0] is wrapped.jitted]:
                del self.compiled[key]
                dropped += 1
        batched = [k for k in self.batch_calls if k[0] is fn]
        calls = {id(self.batch_calls[k]) for k in batched}
        for key in batched:
            del self.batch_calls[key]
            dropped += 1
        for key in [k for k in self.compiled if k[0] is fn or id(k[0]) in calls]:
            del self.compiled[key]
            dropped += 1
        return dropped

    def release_all(self) -> int:
        """Drops every executable this object keeps (the batched calls and their compiled executables) and
        JAX's own caches of jitted functions (:func:`clear_jax_caches`); returns how many of this object's
        entries were dropped.

        Each loaded executable holds a few memory mappings: a process that evaluates thousands of selector
        shapes (a long cross-validation run, a notebook, a test worker) otherwise reaches Linux's
        ``vm.max_map_count`` (65,530 by default), and XLA then crashes while compiling the next one. What was
        dropped compiles again (or loads from the persistent cache) on its next use."""
        dropped = len(self.compiled) + len(self.batch_calls)
        self.compiled.clear()
        self.batch_calls.clear()
        clear_jax_caches()
        return dropped


def clear_jax_caches() -> None:
    """Drops JAX's own caches of jitted functions and collects what they held (their executables' memory
    mappings go back); what an :class:`Executables` keeps stays."""
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@dataclasses.dataclass(frozen=True, eq=False)
class OneCoreJit:
    """``function`` jitted and compiled once per input shape as for one core (:meth:`Executables.executable`,
    in ``executables``), so what it computes per corpus (a bound, a note block) reduces in the order the
    selectors' executables do; a problem for which it returns None (a game without a corpus bound) gives None
    without compiling."""

    function: Callable
    jitted: Any
    executables: Executables = dataclasses.field(default_factory=Executables)

    @classmethod
    def of(cls, function: Callable, role: str = "", executables: Optional[Executables] = None) -> "OneCoreJit":
        """The wrapper of ``function`` (``role`` unused: the signature of :class:`CorpusArrays`'s ``wrap``),
        compiled into ``executables`` (None: its own)."""
        import jax

        return cls(function, jax.jit(function), Executables() if executables is None else executables)

    def __call__(self, problem):
        import jax

        if jax.eval_shape(self.function, problem) is None:
            return None
        problem = jax.device_put(problem)
        return self.executables.executable(self.jitted, [problem])(problem)


def corpus_arrays_cache(executables: Optional[Executables] = None, **kwargs) -> CorpusArrays:
    """A :class:`CorpusArrays` for :func:`run_selector`: bounds and note blocks compiled as for one core, into
    ``executables`` (the run's :class:`Executables`; None: one for this cache)."""
    executables = Executables() if executables is None else executables

    def wrap(function: Callable, role: str = "") -> OneCoreJit:
        return OneCoreJit.of(function, role, executables)

    return CorpusArrays(wrap=wrap, **kwargs)


def solver_chunk(solver: Any) -> Optional[Any]:
    """The ``chunk`` of :func:`cdsjax.core.batched` for a one-device batch of questions solved by ``solver``: an
    evaluation choice, made here from the solver's algorithm. ``"auto"`` (cache-sized chunks on a CPU) for
    replicator dynamics, which sweep each payoff thousands of times; ``"each"`` (one question at a time) for a
    :class:`~cdsjax.core.WithFallback`, whose ``lax.cond`` would run both branches under ``vmap``; None (one
    ``vmap``) for the other solvers and the baselines (``solver`` None). A combination takes the first of
    ``"each"``, ``"auto"`` its parts ask for."""
    from cdsjax import core

    if solver is None:
        return None
    if isinstance(solver, core.Replicator):
        return "auto"
    if isinstance(solver, core.WithFallback):
        return "each"
    parts = {core.ByPayoff: ("block", "dense"), core.WarmStart: ("start", "solver")}.get(type(solver), ())
    chunks = [solver_chunk(getattr(solver, part)) for part in parts]
    return next((c for c in ("each", "auto") if c in chunks), None)


def batch_chunk(selector: Any) -> Optional[Any]:
    """The ``chunk`` to run ``selector`` (a built selector) with on one device: :func:`solver_chunk` of the solver
    it carries (``Selector.solver``; a baseline carries none)."""
    return solver_chunk(getattr(selector, "solver", None))


def cached_selector(name: str, budget: int, options: Mapping[str, Any], cache: Optional[Dict[str, Any]] = None):
    """:func:`cdsjax.core.make_selector` with a learned selector's ``params`` resolved to a value
    (:func:`cdsjax.pipeline.selection.resolve_options`: a file, or the shipped fit), kept in the caller's ``cache``
    (None: not kept) on (name, budget, options with the parameters' content hash), so a second run with the
    same cache does not compile again."""
    from cdsjax.pipeline.selection import resolve_options, resolve_selector, selector_key

    options = resolve_options(name, options)
    key = json.dumps(selector_key(name, budget, options), sort_keys=True, default=repr)
    if cache is None:
        return resolve_selector(name, budget, options)[1]
    if key not in cache:
        cache[key] = resolve_selector(name, budget, options)[1]
    return cache[key]


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
    corpus: Optional[CorpusArrays] = None,
    executables: Optional[Executables] = None,
) -> List[Any]:
    """Runs a registry selector over ragged problems, batched and sharded.

    Problems are padded (trailing) into note-count buckets; each bucket is cut into
    chunks of at most ``max_batch`` problems, and a chunk's batch axis is padded
    (repeating its first problem) to a size the mesh size divides
    (:func:`cdsjax.core.batching.padded_batch`: a power of two, or less where padded slots
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
      chunk: how a one-device batch is cut: the selector's :func:`batch_chunk`.
      spec: the selector's :class:`~cdsjax.core.SelectorSpec`. When it reads structure
        (``spec.structure``), each problem carries the arrays of :meth:`Problem.structure` (printed pages
        only with ``spec.pages_only``), padded like the notes (padding 0; ``valid`` says which notes are
        real); other selectors get problems without them and compile as they always did.
      corpus: the :class:`~cdsjax.pipeline.selection.CorpusArrays` each problem's spectral bound and note block
        come from (:func:`corpus_arrays_cache`; None: one for this call): computed once per distinct corpus, so a
        selector solves each question on its corpus block with its solver, as the pipeline and the
        integrations do.
      executables: the run's :class:`Executables` (None: one for this call), so that the run's next call with
        the same selector and shapes does not compile again.

    Returns:
      One Selection with NumPy leaves per problem, in input order.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from cdsjax import core
    from cdsjax.core.baselines import key_from_query_id
    from cdsjax.core.batching import make_buckets, padded_batch

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
        keys = [key_from_query_id(p.query.qid) for p in problems]
    keys = jnp.stack(list(keys))

    names = STRUCTURE_ARRAYS if spec is not None and spec.structure else ()
    extras = {"links": [np.asarray(p.links, bool) for p in problems]}
    scored = problems[0].query_scores is not None
    if any((p.query_scores is not None) != scored for p in problems):
        raise ValueError("every problem of a batch carries a relevance row (query_scores), or none does")
    if scored:
        extras["query_scores"] = [np.asarray(p.query_scores, dtype) for p in problems]
    if names:
        structures = [p.structure(pages_only=spec.pages_only) for p in problems]
        extras.update({a: [s[a] for s in structures] for a in names})
    groups = make_buckets(
        [np.asarray(p.notes, dtype) for p in problems],
        [np.asarray(p.query_emb, dtype) for p in problems],
        buckets=buckets, extras=extras, pad_batch=False)
    executables = Executables() if executables is None else executables
    call = executables.batched(fn, sharded=ndev > 1, chunk=chunk)
    corpus = corpus_arrays_cache(executables) if corpus is None else corpus
    out: List[Any] = [None] * len(problems)
    for g in groups:
        for start in range(0, len(g.positions), max_batch):
            rows = np.arange(start, min(start + max_batch, len(g.positions)))
            k = len(rows)
            size = padded_batch(k, g.size, multiple=ndev)
            padded = np.concatenate([rows, np.full(size - k, rows[0])])
            queries = g.queries[padded]
            problem = core.CDSProblem(notes=g.notes[padded], queries=queries[:, None, :] if queries.ndim == 2 else queries,
                                      valid=g.valid[padded], links=g.extras["links"][padded],
                                      query_scores=g.extras["query_scores"][padded][:, None, :] if scored else None,
                                      **{a: g.extras[a][padded] for a in names})
            problem = corpus.attach_rows(fn, problem)
            problem = jax.device_put(problem, sharding)
            key_batch = jax.device_put(keys[g.positions[padded]], sharding)
            sel = jax.device_get(executables.executable(call, [problem, key_batch])(problem, key_batch))
            positions = [int(g.positions[r]) for r in rows]
            chunk = [jax.tree_util.tree_map(lambda a, i=i: np.asarray(a[i]), sel)
                     for i in range(k)]
            for pos, s in zip(positions, chunk):
                out[pos] = s
            if on_chunk is not None:
                on_chunk(positions, chunk)
    return out
