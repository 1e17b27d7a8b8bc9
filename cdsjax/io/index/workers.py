"""The worker pool: documents parsed, enriched and embedded in processes of their own."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

from cdsjax.io import doccache
from cdsjax.io.child import die_with_parent, pin
from cdsjax.io.elements import IngestError
from cdsjax.io.index.context import BuildContext, Doc
from cdsjax.io.index.stages import build_doc, finish_doc, prepare_doc
from cdsjax.io.memory import (freed_memory_kept, keep_freed_memory, started_with, stop_keeping_freed_memory,
                              worker_environment)
from cdsjax.io.util import one_line, usable_core_ids, usable_cores

EMBED_IN = ("parent", "worker")


def resolve_workers(workers: Optional[int]) -> int:
    """``workers`` (None: the number of cores this process may use), checked to be >= 1."""
    if workers is None:
        return usable_cores()
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return int(workers)


def build_documents(docs: Sequence[Doc], ctx: BuildContext) -> Iterator[Tuple[Doc, Optional[IngestError]]]:
    """Parses, enriches and embeds ``docs``, committing each to ``ctx.cache`` as soon as it is done.

    With ``ctx.workers > 1`` and more than one document, the documents go to a pool of ``ctx.workers``
    processes (started with ``spawn``: nothing initialised here, such as torch or JAX, is forked), longest
    first. ``ctx.embed_in="parent"`` (default): a worker parses and enriches, and this process embeds each
    document the moment it comes back and commits it, so the workers never import torch or load the model;
    ``"worker"``: each worker loads the embedding model and embeds and commits its own documents. Workers start with
    :func:`cdsjax.io.memory.worker_environment` (2 MB pages for their large blocks), and this process, which
    then only embeds and writes, keeps its freed blocks until each document is committed
    (:mod:`cdsjax.io.memory`).

    Yields ``(doc, None)`` for each finished document (filled in place) and ``(doc, IngestError)`` for each
    that failed, in the order they finish. A worker that fails or dies is reported as an error naming its
    document; the other documents still finish (a dead worker's pool is replaced once).
    """
    docs = list(docs)
    if ctx.ray is not None:
        from cdsjax.io.index.on_ray import build_documents_ray

        yield from build_documents_ray(docs, ctx, ctx.ray)
        return
    if ctx.embed_in not in EMBED_IN:
        raise ValueError(f"embed_in must be one of {EMBED_IN}, got {ctx.embed_in!r}")
    if ctx.workers <= 1 or len(docs) <= 1:
        yield from _build_here(docs, ctx)
        return
    yield from _build_in_pool(docs, ctx)


def _build_here(docs: List[Doc], ctx: BuildContext):
    """:func:`build_documents` in this process, embedding one document while the next one is parsed.

    The embedding model loads on a second thread while the first document is parsed; each prepared document
    is embedded and committed on that thread while this one parses the next (torch and onnxruntime release
    the GIL while they compute, so the embedding fills the core the parser's Python work leaves idle).
    Documents are committed and yielded in order; the index is the same as one document after another.
    """
    from concurrent.futures import ThreadPoolExecutor

    if not docs:
        return
    embedder = ctx.embedder
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdsjax-embed") as pool:
        if embedder is not None and len(docs) > 0:
            pool.submit(_preload, embedder)
        pending = None  # (doc, future of its embedding and commit)
        try:
            for doc in docs:
                try:
                    staging, redo = prepare_doc(doc, ctx)
                except IngestError as err:
                    if pending is not None:
                        yield _finished(*pending)
                        pending = None
                    yield doc, err
                    continue
                if pending is not None:
                    yield _finished(*pending)
                # the last document is embedded while this process no longer parses: freed blocks are kept
                finish = _finish_last if doc is docs[-1] else finish_doc
                pending = (doc, pool.submit(finish, doc, ctx, staging, redo))
                if ctx.on_prepared is not None:
                    try:
                        ctx.on_prepared(doc)
                    except Exception:  # the caller's own work (e.g. a compilation ahead): never the build's
                        pass
            if pending is not None:
                yield _finished(*pending)
                pending = None
        finally:
            if pending is not None:  # stopped early (strict mode, an interrupt): let the commit end first
                pending[1].exception()


def _finish_last(doc: Doc, ctx: BuildContext, staging, redo: bool) -> None:
    """:func:`finish_doc` with freed memory kept (:func:`cdsjax.io.memory.freed_memory_kept`): nothing parses in
    this process meanwhile."""
    with freed_memory_kept():
        finish_doc(doc, ctx, staging, redo)


def _preload(embedder) -> None:
    try:
        embedder.load()
    except Exception:  # raised again, as each document's one-line error, where the model is used
        pass


def _finished(doc: Doc, future):
    """``(doc, None)`` once its embedding and commit are done, ``(doc, IngestError)`` if they failed that way."""
    try:
        future.result()
    except IngestError as err:
        return doc, err
    return doc, None


def _build_in_pool(docs: List[Doc], ctx: BuildContext):
    """:func:`build_documents` with a pool of ``ctx.workers`` processes."""
    import copy
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    workers, embedder = ctx.workers, ctx.embedder
    in_worker = ctx.embed_in == "worker"
    fresh = None
    if in_worker:
        fresh = copy.copy(embedder)
        fresh._model = fresh._jax = None  # each worker loads the model itself
    docs = sorted(docs, key=_doc_size, reverse=True)  # longest first: no long document starts last
    loader = None
    if not in_worker:  # load the model here while the workers parse their first documents
        keep_freed_memory()  # this process only embeds and writes: its large blocks are reused, not faulted in
        import threading

        def preload() -> None:
            try:
                embedder.load()
            except Exception:  # raised again, as each document's one-line error, where the model is used
                pass

        loader = threading.Thread(target=preload, daemon=True, name="cdsjax-embedder-load")
        loader.start()
    threads = max(1, resolve_workers(None) // workers)
    context = multiprocessing.get_context("spawn")
    cores = usable_core_ids()  # with a core per worker, each worker is pinned to its own
    slots = context.Value("i", 0)
    pin = cores if len(cores) >= workers else []
    todo, broke = list(docs), collections.Counter()
    try:
        while todo:
            pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=context,
                                       initializer=_worker_init,
                                       initargs=(ctx.config, fresh, str(ctx.cache.root), threads, os.getpid(),
                                                 slots, pin))
            try:
                with started_with(worker_environment()):  # read by each worker's C library as it starts
                    futures = {pool.submit(_worker_build, doc, in_worker): doc for doc in todo}  # starts the workers
                todo = []
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        doc = futures[fut]
                        try:
                            result, err, stage_seconds, lines, staged = fut.result()
                        except BrokenProcessPool:
                            broke[id(doc)] += 1
                            if broke[id(doc)] >= 2:
                                yield doc, IngestError(doc.path, "its worker process died while indexing it "
                                                                 "(killed, or out of memory)")
                            else:
                                todo.append(doc)  # retried in a fresh pool
                            continue
                        for line in lines:
                            ctx.log(line)
                        for k, v in stage_seconds.items():
                            ctx.seconds[k] += v
                        if err is None and staged is not None:  # prepared there; embedded and committed here
                            loader.join()
                            try:
                                finish_doc(result, ctx, Path(staged[0]), staged[1])
                            except Exception as exc:
                                err = _as_ingest_error(doc, exc)
                        if err is not None:
                            yield doc, err
                            continue
                        doc.__dict__.update(result.__dict__)
                        yield doc, None
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        stop_keeping_freed_memory()  # this process may parse next (one document, or --workers 1)


_WORKER: dict = {}


def _worker_init(config, embedder, cache_root_dir: str, threads: int, parent: int, slots=None,
                 cores: Sequence[int] = ()) -> None:
    if cores and slots is not None:
        with slots.get_lock():
            slot, slots.value = slots.value, slots.value + 1
        pin(cores[slot % len(cores)])
    if not die_with_parent(parent):  # the parent was killed (kill -9): stop rather than work for no one
        os._exit(1)
    # a fair share of the cores for torch's intra-op threads (read when torch is first imported)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    from cdsjax.io.parse import limit_layout_threads

    limit_layout_threads(threads)
    _WORKER.update(config=config, embedder=embedder, cache=doccache.DocCache(Path(cache_root_dir)))


def _worker_build(doc: Doc, embed: bool = True):
    """One document in a worker: ``(doc, None, seconds, log lines, staged)`` or ``(None, IngestError, ...)``.

    With ``embed`` the document is embedded and committed here (``staged`` is None); without, it is only
    prepared and ``staged`` is ``(staging directory, redo)`` for the parent to finish.
    """
    lines: List[str] = []
    ctx = BuildContext(config=_WORKER["config"], cache=_WORKER["cache"], embedder=_WORKER["embedder"],
                       log=lines.append)
    staged = None
    try:
        if embed:
            build_doc(doc, ctx)
        else:
            staging, redo = prepare_doc(doc, ctx)
            staged = (str(staging), redo)
    except Exception as err:  # any failure is this document's, reported in one line; the others go on
        return None, _as_ingest_error(doc, err), dict(ctx.seconds), lines, None
    return doc, None, dict(ctx.seconds), lines, staged


def _as_ingest_error(doc: Doc, err: Exception) -> IngestError:
    """``err`` as this document's one-line :class:`IngestError` (kept as it is when it already is one)."""
    if isinstance(err, IngestError):
        return err
    return IngestError(doc.path, one_line(f"{type(err).__name__}: {err}", 300))


def _doc_size(doc: Doc) -> tuple:
    """How long a document takes to build, roughly: ``(pages, bytes)`` (0 pages when it cannot be opened)."""
    try:
        size = Path(doc.path).stat().st_size
    except OSError:
        return (0, 0)
    try:
        from cdsjax.io.parse.layout import import_pymupdf

        pymupdf = import_pymupdf()

        with pymupdf.open(doc.path) as pdf:
            return (pdf.page_count, size)
    except Exception:  # a damaged file fails in its worker, with its own message
        return (0, size)
