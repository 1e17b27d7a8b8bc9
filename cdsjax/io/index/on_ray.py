"""Documents built on a Ray cluster (``cdsjax index --ray [ADDRESS]``), committed here as they arrive.

Each document is one Ray task: the PDF's bytes travel to the task (no shared filesystem), which parses and
enriches it in a scratch directory of its own worker and sends back its rows and crops. The notes are embedded
by Ray actors that load the embedding model once and take the parse results straight from the tasks. This
process (the driver) commits each finished document to the document cache the moment it arrives, so a run
that is killed resumes with every document it had finished; the index is then written as by the local path
(:mod:`cdsjax.io.index.build`), and is the same index.

A task whose worker dies (killed, out of memory, a node lost) is retried by Ray (``RETRIES`` times); a document
that still fails is reported in one line, and the others go on. Without an address, a local Ray is started
with the cores this process may use and stopped at the end.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from cdsjax.io.elements import IngestError
from cdsjax.io.index.context import BuildContext, Doc
from cdsjax.io.index.keys import entry_key
from cdsjax.io.util import one_line

RETRIES = 2  # extra attempts for a document whose worker died
FAULT_ENV = "CDSJAX_RAY_KILL_ONCE"  # tests: the first task to claim this marker file kills its own worker
ROWS = ("num_pages", "elements", "notes", "edges", "ocr", "enrichment", "enrichment_reasons", "warnings")


class RayUnavailable(RuntimeError):
    """Ray is not installed or the cluster cannot be reached (one line)."""


def build_documents_ray(docs: List[Doc], ctx: BuildContext, address: str = "") -> Iterator[
        Tuple[Doc, Optional[IngestError]]]:
    """Builds ``docs`` as Ray tasks; yields ``(doc, None)`` or ``(doc, IngestError)`` as each finishes.

    Each finished document is committed to ``ctx.cache`` before it is yielded. ``address``: a Ray cluster
    (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); empty starts a local Ray.
    """
    if not docs:
        return
    ray = _ray()
    started = _connect(ray, address)
    try:
        yield from _run(ray, docs, ctx)
    finally:
        if started:
            ray.shutdown()


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'cdsjax[ray]'") from None
    return ray


def _connect(ray, address: str) -> bool:
    """Connects to ``address`` or starts a local Ray; True when this process started it (and stops it)."""
    if ray.is_initialized():
        return False
    from cdsjax.io.util import usable_cores

    kwargs = dict(log_to_driver=False, configure_logging=False, include_dashboard=False)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            # a task whose worker Ray's memory monitor killed is retried RETRIES times, not forever
            ray.init(num_cpus=usable_cores(), _system_config={"task_oom_retries": RETRIES}, **kwargs)
    except Exception as err:  # ConnectionError, RuntimeError, ...: one line, not Ray's traceback
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise RayUnavailable(f"cannot start or reach {where} ({type(err).__name__}: "
                             f"{one_line(err, 200)})") from None
    return True


def _run(ray, docs: List[Doc], ctx: BuildContext):
    parse = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_parse_task)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    fresh = copy.copy(ctx.embedder)
    fresh._model = fresh._jax = None  # each actor loads the model itself, once
    actors = [ray.remote(num_cpus=0, max_restarts=RETRIES, max_task_retries=RETRIES)(EmbedActor).remote(fresh)
              for _ in range(max(1, cpus // 4))]  # embedding is about a quarter of the work
    window = 2 * cpus  # documents in flight: enough to keep every core busy, not the whole corpus in memory
    todo = sorted(docs, key=_size, reverse=True)  # longest first: no long document starts last
    config = ray.put(ctx.config)
    inflight: Dict[object, Tuple[Doc, object]] = {}  # embedding ref -> (doc, parse ref)
    n = 0
    while todo or inflight:
        while todo and len(inflight) < window:
            doc = todo.pop(0)
            try:
                pdf = Path(doc.path).read_bytes()
            except OSError as err:
                yield doc, IngestError(doc.path, f"cannot read ({err.strerror or err})")
                continue
            parsed = parse.remote(pdf, _doc_fields(doc), config, os.environ.get(FAULT_ENV, ""))
            embedded = actors[n % len(actors)].embed.remote(parsed)
            n += 1
            inflight[embedded] = (doc, parsed)
        if not inflight:
            continue
        ready, _ = ray.wait(list(inflight), num_returns=1)
        doc, parsed = inflight.pop(ready[0])
        t0 = time.perf_counter()
        try:
            result = ray.get(parsed)
            embeddings, embed_seconds = ray.get(ready[0])
        except Exception as err:  # the task's worker died RETRIES + 1 times, or the actor did
            yield doc, IngestError(doc.path, _died(err))
            continue
        if result.get("error"):
            yield doc, IngestError(doc.path, result["error"])
            continue
        for line in result["lines"]:
            ctx.log(line)
        for k, v in result["seconds"].items():
            ctx.seconds[k] += v
        ctx.seconds["embed"] += embed_seconds
        try:
            _commit(doc, result, embeddings, ctx)
        except OSError as err:
            yield doc, IngestError(doc.path, f"cannot commit to the document cache ({err.strerror or err})")
            continue
        ctx.seconds["commit"] += time.perf_counter() - t0
        yield doc, None


def _died(err: Exception) -> str:
    name = type(err).__name__
    if "WorkerCrashed" in name or "ActorDied" in name or "NodeDied" in name or "OutOfMemory" in name:
        return f"its Ray worker died while indexing it, {RETRIES + 1} times (killed, or out of memory)"
    return f"Ray task failed ({name}: {one_line(err, 200)})"


def _doc_fields(doc: Doc) -> dict:
    return dict(sha=doc.sha, doc_id=doc.doc_id, keys=doc.keys, name=Path(doc.path).name, path=str(doc.path))


def _size(doc: Doc) -> int:
    try:
        return Path(doc.path).stat().st_size
    except OSError:
        return 0


def _commit(doc: Doc, result: dict, embeddings: np.ndarray, ctx: BuildContext) -> None:
    """Writes the crops into a staging entry of the cache and commits the document (as the local path does)."""
    for name in ROWS:
        setattr(doc, name, result[name])
    doc.embeddings = np.asarray(embeddings, np.float32)
    staging = ctx.cache.staging()
    try:
        for rel, data in result["crops"].items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            target.write_bytes(data)
        meta = dict(sha256=doc.sha, path=str(doc.path), doc_id=doc.doc_id, num_pages=doc.num_pages, keys=doc.keys,
                    ocr=doc.ocr, enrichment=doc.enrichment, enrichment_reasons=doc.enrichment_reasons,
                    embedder=ctx.embedder.info(), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        final = ctx.cache.write(entry_key(doc.sha, doc.keys), staging, meta=meta, elements=doc.elements,
                                notes=doc.notes, embeddings=doc.embeddings, edges=doc.edges)
        staging = None
        doc.crop_root = final
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------------------- on the workers


def _parse_task(pdf: bytes, fields: dict, config, fault: str = "") -> dict:
    """One document on a Ray worker: parse and enrich in a scratch directory; rows and crops come back."""
    if fault:
        _maybe_die(fault)
    from cdsjax.io import doccache
    from cdsjax.io.index.stages import prepare_doc
    from cdsjax.io.parse.layout import prepare_models

    prepare_models(threads=1)  # one core per task; the models stay loaded for the worker's next documents
    scratch = Path(tempfile.mkdtemp(prefix="cdsjax-ray-"))
    lines: List[str] = []
    try:
        path = scratch / fields["name"]
        path.write_bytes(pdf)
        doc = Doc(path=path, sha=fields["sha"], doc_id=fields["doc_id"], keys=fields["keys"], is_input=True,
                  status="added")
        ctx = BuildContext(config=config, cache=doccache.DocCache(scratch / "cache"), log=lines.append)
        try:
            staging, _ = prepare_doc(doc, ctx)
        except Exception as err:  # this document's failure, in one line (the path is the driver's to name)
            reason = err.reason if isinstance(err, IngestError) else f"{type(err).__name__}: {err}"
            return dict(error=one_line(reason, 300))
        from cdsjax.io.notes import embedding_text
        from cdsjax.io.relevance import settings_of

        crops = {str(p.relative_to(staging)): p.read_bytes() for p in sorted(staging.rglob("*.png"))}
        out = {name: getattr(doc, name) for name in ROWS}
        out["notes"] = [n if isinstance(n, dict) else n.to_dict() for n in doc.notes]
        out["elements"] = [e if isinstance(e, dict) else e.to_dict() for e in doc.elements]
        out["warnings"] = [w.replace(str(path), fields["path"]) for w in doc.warnings]  # the driver's path
        out.update(crops=crops, lines=[line.replace(str(path), fields["path"]) for line in lines],
                   seconds=dict(ctx.seconds),
                   texts=[embedding_text(n, settings_of(ctx.config)["context"]) for n in doc.notes])
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _maybe_die(marker: str) -> None:
    """Fault injection for tests: the first task to create ``marker`` kills its own worker process."""
    import signal

    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


class EmbedActor:
    """A Ray actor that loads the embedding model once and embeds the notes of each parsed document."""

    def __init__(self, embedder):
        from cdsjax.io.memory import keep_freed_memory

        keep_freed_memory()  # this process only embeds: its large buffers are reused, not faulted in again
        self.embedder = embedder  # the driver's embedder (same model, prefixes, batch size), model not loaded

    def embed(self, parsed: dict):
        """``(embeddings [n, d] float32, seconds)`` of a parse result (nothing for a failed document)."""
        if parsed.get("error"):
            return np.zeros((0, 0), np.float32), 0.0
        t0 = time.perf_counter()
        out = self.embedder.encode_documents(parsed["texts"], show_progress=False)
        return np.asarray(out, np.float32), time.perf_counter() - t0
