"""Build, cache and load a corpus index: PDFs -> elements -> notes -> embeddings -> one directory.

    from cdsjax.io.index import build_index, load_index, default_config
    summary = build_index(["a.pdf", "b.pdf"], "runs/index", config=default_config())
    corpus = load_index("runs/index")
    corpus.embeddings   # [n, d] float32, rows L2-normalised
    corpus.links        # [n, n] bool, symmetric, no self-links
    corpus.notes        # list of dicts (note_id, doc_id, page, bbox, kind, text, summary, ...)

An index is a set of documents: ``build_index(paths, out)`` adds the PDFs in
``paths`` to the index in ``out`` (re-doing those whose content or settings
changed) and keeps the others; ``replace=True`` starts from an empty set and
``remove=[doc_id]`` drops documents. Each document is keyed by the sha256 of
its bytes plus stage keys (parser, enrichment and embedder versions and
settings) in a content-addressed document cache shared by every index and by
``ask PDF`` (:func:`doc_cache`); a finished document is committed to it at once,
so a killed run resumes. Every read checks hashes; damaged documents are
rebuilt (from the cache, else from their PDF) and named. Writers of one index
take a lock; publication is atomic; if nothing changed the directory is left
untouched.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from cdsjax.config import get_config
from cdsjax.io import store
from cdsjax.io.elements import Element, IngestError
from cdsjax.io.embed import embedder_key
from cdsjax.io.memory import keep_freed_memory, release_freed_memory, stop_keeping_freed_memory, worker_environment


def default_config():
    """The default configuration (:func:`cdsjax.config.get_config`; ``configs/default.py`` re-exports it)."""
    return get_config()


@dataclasses.dataclass
class IndexSummary:
    """What :func:`build_index` did."""

    out_dir: str
    documents: int = 0  # documents in the index
    pages: int = 0
    elements_by_kind: Dict[str, int] = dataclasses.field(default_factory=dict)
    notes: int = 0
    links: int = 0
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)  # per stage
    reused: int = 0  # documents not processed in this run (taken from the previous index or the cache)
    processed: int = 0  # documents parsed/enriched/embedded in this run
    from_cache: int = 0  # documents taken from the shared document cache
    written: bool = False  # False when nothing changed and the index was left as it was
    added: List[str] = dataclasses.field(default_factory=list)  # doc ids
    updated: List[str] = dataclasses.field(default_factory=list)
    kept: List[str] = dataclasses.field(default_factory=list)
    removed: List[str] = dataclasses.field(default_factory=list)
    repaired: List[tuple] = dataclasses.field(default_factory=list)  # (doc_id, what was wrong)
    failures: List[tuple] = dataclasses.field(default_factory=list)  # (path, reason)
    warnings: List[str] = dataclasses.field(default_factory=list)
    enrichment: Dict[str, int] = dataclasses.field(default_factory=dict)  # note status -> count
    enrichment_failures: List[str] = dataclasses.field(default_factory=list)  # one line per document
    ocr: List[str] = dataclasses.field(default_factory=list)  # one line per document with pages without text

    @property
    def ok(self) -> bool:
        return not self.failures and self.documents > 0


@dataclasses.dataclass
class CorpusIndex:
    """An index loaded for retrieval.

    Attributes:
      embeddings: ``[n, d]`` float32, rows L2-normalised (one per note).
      links: ``[n, n]`` bool, symmetric note-link adjacency (no self-links, no cross-document links).
      notes: n dicts: note_id, doc_id, page (0-based), bbox [x0, y0, x1, y1] (points, top-left origin),
        kind ("text" | "figure" | "table" | "chart"), role, text, summary, keywords, tags, caption,
        footnote, image_path (absolute path of the PNG crop, or None), reading_order, label.
      manifest: the index manifest (versions, config, documents, hashes).
      embedder: model name, prefixes and normalisation used for the notes.
      root: the index directory.
    """

    embeddings: np.ndarray
    links: np.ndarray
    notes: List[dict]
    manifest: dict
    embedder: dict
    root: Path

    def __len__(self) -> int:
        return len(self.notes)

    @property
    def doc_ids(self) -> List[str]:
        return [d["doc_id"] for d in self.manifest["documents"]]

    @property
    def link_edges(self) -> np.ndarray:
        """``[E, 2]`` int32 undirected edges ``i < j`` (the sparse form of :attr:`links`)."""
        i, j = np.nonzero(np.triu(self.links, 1))
        return np.stack([i, j], axis=1).astype(np.int32)

    def elements(self) -> List[dict]:
        """The parsed elements (same order as the notes), with surrounding context; read on demand."""
        return store.read_jsonl(self.root / "elements.jsonl")

    def make_embedder(self, *, device: str = "cpu"):
        """An :class:`~cdsjax.io.embed.Embedder` that encodes questions like these notes were encoded."""
        from cdsjax.io.embed import Embedder

        return Embedder.from_info(self.embedder, device=device)


# --------------------------------------------------------------------------- keys


def _library_versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("pymupdf", "pymupdf4llm", "sentence-transformers", "langchain-text-splitters", "yake",
                 "orbax-checkpoint", "openai"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    import cdsjax

    out["cdsjax"] = cdsjax.__version__
    return out


def stage_keys(config, versions: dict, embedder_info: dict) -> dict:
    """Hashes that decide which stages of a cached document can be reused."""
    from cdsjax.io.notes import NOTES_VERSION
    from cdsjax.io.parse import PARSER_VERSION

    ingest = config.ingest.to_dict()
    # Whether OCR ran is recorded per document (it depends on Tesseract being installed, not only on the
    # config), and a document is re-done when OCR becomes possible; the key keeps the old value so
    # indexes written before OCR existed stay valid.
    ingest["use_ocr"] = False
    parser = ingest.get("parser", "pymupdf")
    parse_key = store.sha256_json(
        dict(parser=parser, parser_version=PARSER_VERSION, pymupdf=versions.get("pymupdf"),
             pymupdf4llm=versions.get("pymupdf4llm"), splitter=versions.get("langchain-text-splitters"),
             ingest={k: v for k, v in ingest.items() if k not in ("mineru_command",)})
    )
    enrich = config.enrich.to_dict()
    enrich.pop("vlm_api_key", None)
    enrich.pop("concurrency", None)
    if enrich.get("mode") != "vlm":
        enrich = {k: v for k, v in enrich.items() if not k.startswith("vlm") and k not in (
            "evolution_rounds", "verify_links", "max_text_chars", "max_tokens", "timeout", "max_retries")}
    notes_key = store.sha256_json(dict(parse=parse_key, notes_version=NOTES_VERSION, yake=versions.get("yake"),
                                       enrich=enrich))
    emb = {k: v for k, v in embedder_info.items() if k != "dim"}
    embed_key = store.sha256_json(dict(notes=notes_key, embedder=emb))
    return dict(parse=parse_key, notes=notes_key, embed=embed_key)


# --------------------------------------------------------------------------- inputs


def expand_paths(paths: Sequence) -> List[Path]:
    """Files as given; directories expand to the PDFs under them (sorted). Missing paths are kept (reported later)."""
    out: List[Path] = []
    for p in paths:
        p = Path(p).expanduser()
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() == ".pdf"))
        else:
            out.append(p)
    seen, unique = set(), []
    for p in out:
        key = p.resolve() if p.exists() else p.absolute()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


# --------------------------------------------------------------------------- build


@dataclasses.dataclass
class _Doc:
    path: Path
    sha: str
    doc_id: str = ""
    keys: dict = dataclasses.field(default_factory=dict)
    is_input: bool = False  # named on this run's command line
    status: str = ""  # "added" | "updated" | "kept" | "unchanged"
    source: str = ""  # "index" (taken from the previous index), "cache", "built"
    num_pages: int = 0
    elements: list = dataclasses.field(default_factory=list)  # Element objects or dicts
    notes: list = dataclasses.field(default_factory=list)  # Note objects or dicts
    embeddings: Optional[np.ndarray] = None
    edges: Optional[np.ndarray] = None  # [E, 2] local indices
    crop_root: Optional[Path] = None  # directory that notes' image_path (crops/<sha16>/...) resolve against
    ocr: dict = dataclasses.field(default_factory=dict)  # no_text_pages, state
    enrichment: dict = dataclasses.field(default_factory=dict)  # status -> count
    repaired: str = ""  # why the previous index's copy was not usable
    enrichment_reasons: str = ""  # VLM failure reasons of this run
    warnings: list = dataclasses.field(default_factory=list)  # the parser's, except the OCR line

    @property
    def crop_rel(self) -> str:
        return f"crops/{self.sha[:16]}/"


def entry_key(sha: str, keys: dict) -> str:
    """The document-cache key: the PDF's sha256 and the last stage key (which chains all the others)."""
    return store.sha256_json(dict(pdf=sha, embed=keys["embed"]))


def doc_cache(config) -> store.DocCache:
    """The document cache shared by every index and by ``ask PDF``: ``<cache_root>/docs``."""
    return store.DocCache(cache_root(config) / "docs")


def _progress(iterable, *, desc: str, total: int, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit="doc", leave=False, file=sys.stderr)


def build_index(
    paths: Sequence,
    out_dir,
    *,
    config=None,
    strict: Optional[bool] = None,
    progress: bool = False,
    log: Optional[Callable[[str], None]] = None,
    replace: bool = False,
    remove: Sequence[str] = (),
    wait: bool = True,
    cache_dir=None,
    workers: Optional[int] = 1,
    embed_in: str = "parent",
) -> IndexSummary:
    """Adds, updates or removes documents of the index in ``out_dir`` (one corpus: the notes of all documents).

    An index is a set of documents. PDFs named in ``paths`` are added, or re-done when their content (or the
    settings) changed; documents already in the index and not named stay as they are (``replace=True``
    starts from an empty set). Every finished document is first committed to the shared document cache
    (:func:`doc_cache`), so a killed run resumes with the documents it had finished, and the same PDF
    indexed elsewhere is not parsed again. Damaged documents of the previous index (hash mismatch, missing
    or truncated files) are rebuilt from the cache or their PDF and listed in ``summary.repaired``.
    The new index is published atomically, under a writer lock (:func:`store.writer_lock`).

    Args:
      paths: PDF files and/or directories (searched recursively for ``*.pdf``); may be empty (then the run
        only removes, repairs or verifies).
      out_dir: the index directory.
      config: the full config (``configs/default.py``); None for the defaults.
      strict: stop at the first bad document or enrichment failure, writing nothing
        (default ``config.index.strict``).
      progress: show progress bars on stderr.
      log: called with one line per skipped document, repair or warning (default: nothing).
      replace: drop the documents of the previous index that are not in ``paths``.
      remove: doc ids (or file names) to remove from the index.
      wait: wait for another writer of ``out_dir``; False raises :class:`store.LockBusy` instead.
      cache_dir: the document cache directory (default :func:`doc_cache` of ``config``).
      workers: documents parsed, enriched and embedded at once, each in its own process
        (:func:`build_documents`); None means one per core. Each finished document is committed to the
        cache as soon as it is done; the index is the same for any number of workers.
      embed_in: with several workers, where the notes are embedded: ``"parent"`` (this process, as each
        document comes back) or ``"worker"`` (see :func:`build_documents`).

    Returns:
      an :class:`IndexSummary`.

    Raises:
      IngestError: in strict mode, for the first bad document (nothing is written).
      store.StoreError: the output directory cannot be written, is locked (``wait=False``), or names no
        such document to remove.
    """
    config = default_config() if config is None else config
    strict = bool(config.index.strict) if strict is None else bool(strict)
    log = log or (lambda line: None)
    out_dir = Path(out_dir)
    store.check_output_dir(out_dir, replace=replace)
    with store.writer_lock(out_dir, wait=wait, on_wait=log):
        return _build_locked(paths, out_dir, config, strict, progress, log, replace, list(remove), cache_dir,
                             resolve_workers(workers), embed_in)


def resolve_workers(workers: Optional[int]) -> int:
    """``workers`` (None: the number of cores this process may use), checked to be >= 1."""
    if workers is None:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            return max(1, os.cpu_count() or 1)
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return int(workers)


def _build_locked(paths, out_dir: Path, config, strict, progress, log, replace, remove,
                  cache_dir, workers: int = 1, embed_in: str = "parent") -> IndexSummary:
    from cdsjax.io.embed import Embedder

    summary = IndexSummary(out_dir=str(out_dir))
    seconds = collections.defaultdict(float)
    store.recover(out_dir)
    store.check_output_dir(out_dir, replace=replace)
    cache = doc_cache(config) if cache_dir is None else store.DocCache(Path(cache_dir))
    cache.clean_staging()
    versions = _library_versions()

    t0 = time.perf_counter()
    previous = _PreviousIndex.open(out_dir)
    prev_docs = [] if previous is None else previous.documents()
    inputs: List[_Doc] = []
    for path in expand_paths(paths):
        try:
            if not path.exists():
                raise IngestError(path, "no such file or directory")
            from cdsjax.io.parse import check_pdf_file

            check_pdf_file(path)
            inputs.append(_Doc(path=path, sha=store.sha256_file(path), is_input=True))
        except IngestError as err:
            _fail(summary, err, strict, log)

    # the embedder: this run's, unless the run only removes or repairs (then the index's own)
    if not inputs and previous is not None:
        embedder = Embedder.from_info(previous.manifest["embedder"], device=str(config.embedder.device))
    else:
        embedder = Embedder(config)
    emb_info = embedder.info()
    keys = stage_keys(config, versions, emb_info)

    # ---- the new document set: previous documents (unless replaced/removed), updated in place, then new ones
    removed = _match_removals(remove, prev_docs, out_dir)
    summary.removed = [d["doc_id"] for d in removed]
    removed_ids = {d["doc_id"] for d in removed}
    docs: List[_Doc] = []
    by_path, by_sha = {}, {}
    if not replace:
        for entry in prev_docs:
            if entry["doc_id"] in removed_ids:
                continue
            d = _Doc(path=Path(entry["path"]), sha=entry["sha256"], doc_id=entry["doc_id"],
                     keys=entry.get("keys") or {}, status="kept")
            docs.append(d)
            by_path[str(d.path)] = d
            by_sha.setdefault(d.sha, d)
    if inputs and any(d.status == "kept" for d in docs):
        old, new = embedder_key(previous.manifest["embedder"]), embedder_key(emb_info)
        if old != new:
            raise store.StoreError(
                f"{out_dir}: the index was embedded with {old[0]} and this run embeds with {new[0]}; "
                f"use the same --embedder, or --replace to rebuild the whole index")
    for d in inputs:
        d.keys = keys
        same = by_path.get(str(d.path.absolute())) or by_sha.get(d.sha)
        if same is not None and same.is_input:
            continue  # named twice
        if same is not None:
            same.is_input = True
            same.keys = keys
            same.status = "unchanged" if same.sha == d.sha else "updated"
            same.path, same.sha = d.path.absolute(), d.sha
            continue
        d.path = d.path.absolute()
        d.status = "added"
        docs.append(d)
        by_path[str(d.path)] = d
        by_sha.setdefault(d.sha, d)
    _assign_doc_ids(docs)
    seconds["hash"] += time.perf_counter() - t0

    staging = None
    try:
        kept: List[_Doc] = []
        changed = bool(removed) or (replace and previous is not None and
                                    {d["doc_id"] for d in prev_docs} != {d.doc_id for d in docs})
        bar = _Bar(len(docs), enabled=progress)
        finished, to_build = {}, []
        try:
            for doc in docs:
                try:
                    done = _obtain(doc, previous, cache, config, keys, embedder, versions, strict, summary,
                                   seconds, log, progress, defer=True)
                except IngestError as err:
                    _fail(summary, err, strict, log)
                    changed = True
                    bar.update()
                    continue
                if done == "build":
                    to_build.append(doc)
                    continue
                bar.update()
                if done:
                    finished[id(doc)] = doc
            # the documents that must be parsed: in a pool of processes (or here, for one worker or document)
            for doc, err in build_documents(to_build, cache, config, embedder=embedder, workers=workers,
                                            seconds=seconds, log=log, strict=strict, embed_in=embed_in):
                bar.update()
                if err is not None:
                    _fail(summary, err, strict, log)
                    changed = True
                    continue
                doc.source = "built"
                _report_doc(doc, summary, strict, log)
                finished[id(doc)] = doc
        finally:
            bar.close()
        cache.clean_staging()  # again: a killed run's workers may have died only after this run began
        for doc in docs:  # the index's order does not depend on which worker finished first
            if id(doc) in finished:
                kept.append(doc)
                changed = changed or doc.source != "index"

        if not kept:
            summary.seconds = dict(seconds)
            if previous is not None and removed and not docs:
                raise store.StoreError(f"{out_dir}: the index would hold no documents; nothing was changed "
                                       f"(delete the directory to drop the index)")
            return summary  # nothing could be indexed: the previous index (if any) stays as it was
        order_same = previous is not None and [d.doc_id for d in kept] == [d["doc_id"] for d in prev_docs]
        if not changed and order_same and not previous.damaged:
            _fill_summary(summary, kept, written=False, seconds=seconds)
            return summary

        # ---- assemble and publish
        t0 = time.perf_counter()
        staging = store.staging_dir(out_dir)
        manifest = _write_index(staging, kept, config, versions, embedder, emb_info, keys)
        store.write_manifest(staging, manifest)
        store.commit(staging, out_dir)
        staging = None
        seconds["write"] += time.perf_counter() - t0
        _fill_summary(summary, kept, written=True, seconds=seconds)
        return summary
    finally:
        if staging is not None:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)


def _fill_summary(summary: IndexSummary, kept: List[_Doc], *, written: bool, seconds) -> None:
    kinds = collections.Counter(e["kind"] if isinstance(e, dict) else e.kind for d in kept for e in d.elements)
    summary.documents = len(kept)
    summary.pages = sum(d.num_pages for d in kept)
    summary.elements_by_kind = dict(sorted(kinds.items()))
    summary.notes = sum(len(d.notes) for d in kept)
    summary.links = int(sum(np.asarray(d.edges).reshape(-1, 2).shape[0] for d in kept))
    summary.processed = sum(d.source == "built" for d in kept)
    summary.reused = len(kept) - summary.processed
    summary.from_cache = sum(d.source == "cache" for d in kept)
    summary.added = [d.doc_id for d in kept if d.status == "added"]
    summary.updated = [d.doc_id for d in kept if d.status == "updated"]
    summary.kept = [d.doc_id for d in kept if d.status in ("kept", "unchanged")]
    summary.written = written
    summary.seconds = dict(seconds)


def _match_removals(remove: Sequence[str], prev_docs: List[dict], out_dir: Path) -> List[dict]:
    out = []
    for name in remove:
        hits = [d for d in prev_docs if name in (d["doc_id"], Path(d["path"]).name, d["path"])]
        if not hits:
            known = ", ".join(d["doc_id"] for d in prev_docs) or "none"
            raise store.StoreError(f"{out_dir}: no document {name!r} in this index (it holds: {known})")
        out.extend(h for h in hits if h not in out)
    return out


def _obtain(doc: _Doc, previous, cache: store.DocCache, config, keys, embedder, versions, strict, summary,
            seconds, log, progress, defer: bool = False):
    """Fills ``doc`` from the previous index, the cache or its PDF (in that order). False: skipped.

    With ``defer``, a document that must be built from scratch is not built here: ``"build"`` is
    returned and the caller hands it to :func:`build_documents`."""
    # 1. the previous index, when its copy is intact and current (or at least its parse is)
    reuse_parse = False
    if previous is not None and doc.status in ("kept", "unchanged"):
        problem = previous.check(doc)
        old_keys = previous.entry(doc.doc_id).get("keys") or {}
        if problem is not None:
            doc.repaired = problem
            summary.repaired.append((doc.doc_id, problem))
            log(f"repair: {doc.doc_id}: {problem}; rebuilding it")
        elif not doc.is_input or old_keys.get("embed") == keys["embed"]:
            previous.fill(doc)
            doc.source = "index"
            if not (doc.is_input and _needs_redo(doc, config)):
                return True
        elif old_keys.get("parse") == keys["parse"]:
            previous.fill(doc)
            doc.notes, doc.embeddings, doc.edges, doc.enrichment = [], None, None, {}
            reuse_parse = True
    if doc.status == "kept" and not doc.keys.get("embed"):
        raise IngestError(doc.path, "damaged in the index and its settings are unknown; index it again")
    # 2. the document cache
    key = entry_key(doc.sha, doc.keys)
    try:
        entry = cache.read(key)
    except store.StoreError as err:
        summary.warnings.append(f"damaged cache entry rebuilt: {err}")
        log(f"warning: {err}; rebuilding that cache entry")
        entry = None
    if entry is not None:
        reuse_parse = False
        _fill_from_entry(doc, entry)
        doc.source = "cache"
        if not (doc.is_input and _needs_redo(doc, config)):
            _report_doc(doc, summary, strict, log)
            return True
    # 3. the PDF itself
    if not doc.path.is_file() or store.sha256_file(doc.path) != doc.sha:
        what = "is gone" if not doc.path.is_file() else "has changed since it was indexed"
        raise IngestError(doc.path, f"cannot rebuild {doc.doc_id}: its PDF {what}; it was dropped from the "
                                    f"index (index the file again to add it back)")
    if doc.status == "kept":
        doc.keys = keys  # rebuilt with this run's settings
        key = entry_key(doc.sha, keys)
    if defer and not reuse_parse and not doc.notes and not _ocr_redo(doc, config):
        return "build"
    _build_doc(doc, key, cache, config, embedder, seconds, log, progress, reuse_parse=reuse_parse)
    doc.source = "built"
    _report_doc(doc, summary, strict, log)
    return True


class _Bar:
    """One progress bar over all documents, advanced as each finishes (here or in a worker)."""

    def __init__(self, total: int, *, enabled: bool):
        self.bar = None
        if enabled and total:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="documents", unit="doc", leave=False, file=sys.stderr)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


EMBED_IN = ("parent", "worker")


def build_documents(docs: Sequence[_Doc], cache: store.DocCache, config, *, embedder, workers: int = 1,
                    seconds=None, log=None, strict: bool = False, embed_in: str = "parent"):
    """Parses, enriches and embeds ``docs``, committing each to ``cache`` as soon as it is done.

    With ``workers > 1`` and more than one document, the documents go to a pool of ``workers`` processes
    (started with ``spawn``: nothing initialised here, such as torch or JAX, is forked), longest first.
    ``embed_in="parent"`` (default): a worker parses and enriches, and this process embeds each document
    the moment it comes back and commits it, so the workers never import torch or load the model;
    ``"worker"``: each worker loads the embedding model and embeds and commits its own documents. RESULTS.md,
    "Scale: workers and processes", has the measurement behind the default. Workers start with
    :func:`cdsjax.io.memory.worker_environment` (2 MB pages for their large blocks), and this process, which
    then only embeds and writes, keeps its freed blocks until each document is committed
    (:mod:`cdsjax.io.memory`).

    Yields ``(doc, None)`` for each finished document (filled in place) and ``(doc, IngestError)`` for each
    that failed, in the order they finish. A worker that fails or dies is reported as an error naming its
    document; the other documents still finish (a dead worker's pool is replaced once).
    """
    seconds = collections.defaultdict(float) if seconds is None else seconds
    log = log or (lambda line: None)
    docs = list(docs)
    if embed_in not in EMBED_IN:
        raise ValueError(f"embed_in must be one of {EMBED_IN}, got {embed_in!r}")
    if workers <= 1 or len(docs) <= 1:
        for doc in docs:
            try:
                _build_doc(doc, entry_key(doc.sha, doc.keys), cache, config, embedder, seconds, log, False)
            except IngestError as err:
                yield doc, err
                continue
            yield doc, None
        return

    import copy
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    in_worker = embed_in == "worker"
    fresh = None
    if in_worker:
        fresh = copy.copy(embedder)
        fresh._model = None  # each worker loads the model itself
    docs = sorted(docs, key=_doc_size, reverse=True)  # longest first: no long document starts last
    loader = None
    if not in_worker:  # load the model here while the workers parse their first documents
        keep_freed_memory()  # this process only embeds and writes: its large blocks are reused, not faulted in
        import threading

        def preload() -> None:
            try:
                embedder.model  # noqa: B018
            except Exception:  # raised again, as each document's one-line error, where the model is used
                pass

        loader = threading.Thread(target=preload, daemon=True, name="cdsjax-embedder-load")
        loader.start()
    threads = max(1, resolve_workers(None) // workers)
    context = multiprocessing.get_context("spawn")
    cores = _cores()  # with a core per worker, each worker is pinned to its own
    slots = context.Value("i", 0)
    pin = cores if len(cores) >= workers else []
    todo, broke = list(docs), collections.Counter()
    try:
        while todo:
            pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=context,
                                       initializer=_worker_init,
                                       initargs=(config, fresh, str(cache.root), threads, os.getpid(), slots, pin))
            try:
                with _environment(worker_environment()):  # read by each worker's C library as it starts
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
                            log(line)
                        for k, v in stage_seconds.items():
                            seconds[k] += v
                        if err is None and staged is not None:  # prepared there; embedded and committed here
                            loader.join()
                            try:
                                _finish_doc(result, entry_key(result.sha, result.keys), cache, Path(staged[0]),
                                            staged[1], embedder, seconds, log)
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


@contextlib.contextmanager
def _environment(values: Dict[str, str]):
    """``os.environ`` with ``values`` set, for processes started meanwhile; restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_WORKER: dict = {}


def _worker_init(config, embedder, cache_root_dir: str, threads: int, parent: int, slots=None,
                 cores: Sequence[int] = ()) -> None:
    import threading

    if cores and slots is not None:
        with slots.get_lock():
            slot, slots.value = slots.value, slots.value + 1
        try:
            os.sched_setaffinity(0, {cores[slot % len(cores)]})
        except (AttributeError, OSError):
            pass

    def orphaned() -> None:  # the parent was killed (kill -9): stop rather than work for no one
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    try:  # Linux: the kernel kills this worker the moment its parent dies, before anyone resumes the run
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    threading.Thread(target=orphaned, daemon=True, name="cdsjax-parent-watch").start()
    # a fair share of the cores for torch's intra-op threads (read when torch is first imported)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    from cdsjax.io.parse import limit_layout_threads

    limit_layout_threads(threads)
    _WORKER.update(config=config, embedder=embedder, cache=store.DocCache(Path(cache_root_dir)))


def _worker_build(doc: _Doc, embed: bool = True):
    """One document in a worker: ``(doc, None, seconds, log lines, staged)`` or ``(None, IngestError, ...)``.

    With ``embed`` the document is embedded and committed here (``staged`` is None); without, it is only
    prepared and ``staged`` is ``(staging directory, redo)`` for the parent to finish.
    """
    seconds: Dict[str, float] = collections.defaultdict(float)
    lines: List[str] = []
    staged = None
    try:
        if embed:
            _build_doc(doc, entry_key(doc.sha, doc.keys), _WORKER["cache"], _WORKER["config"], _WORKER["embedder"],
                       seconds, lines.append, False)
        else:
            staging, redo = _prepare_doc(doc, _WORKER["cache"], _WORKER["config"], seconds)
            staged = (str(staging), redo)
    except Exception as err:  # any failure is this document's, reported in one line; the others go on
        return None, _as_ingest_error(doc, err), dict(seconds), lines, None
    return doc, None, dict(seconds), lines, staged


def _as_ingest_error(doc: _Doc, err: Exception) -> IngestError:
    """``err`` as this document's one-line :class:`IngestError` (kept as it is when it already is one)."""
    if isinstance(err, IngestError):
        return err
    return IngestError(doc.path, f"{type(err).__name__}: {' '.join(str(err).split())[:300]}")


def _cores() -> List[int]:
    """The cores this process may run on (empty where the platform cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return []


def _doc_size(doc: _Doc) -> tuple:
    """How long a document takes to build, roughly: ``(pages, bytes)`` (0 pages when it cannot be opened)."""
    try:
        size = Path(doc.path).stat().st_size
    except OSError:
        return (0, 0)
    try:
        import pymupdf

        with pymupdf.open(doc.path) as pdf:
            return (pdf.page_count, size)
    except Exception:  # a damaged file fails in its worker, with its own message
        return (0, size)


def _needs_redo(doc: _Doc, config) -> bool:
    """A named document whose stored copy should be improved: failed VLM notes to retry, or OCR now possible."""
    if str(config.enrich.mode) == "vlm" and doc.enrichment.get("lite-fallback", 0):
        return True
    from cdsjax.io.parse import ocr_available

    ocr = doc.ocr or {}
    return bool(ocr.get("no_text_pages")) and ocr.get("state") in ("unavailable", "off") \
        and _ocr_enabled(config) and ocr_available()


def _ocr_enabled(config) -> bool:
    from cdsjax.io.parse import ocr_enabled

    return ocr_enabled(config.ingest)


def _report_doc(doc: _Doc, summary: IndexSummary, strict: bool, log) -> None:
    """Enrichment failures and OCR state of one finished document: counted, and one line each."""
    for w in doc.warnings:
        summary.warnings.append(w)
        log(f"warning: {w}")
    for status, n in doc.enrichment.items():
        summary.enrichment[status] = summary.enrichment.get(status, 0) + n
    failed = doc.enrichment.get("lite-fallback", 0)
    if failed:
        reasons = doc.enrichment_reasons
        line = (f"{doc.path}: VLM enrichment failed for {failed} of {len(doc.notes)} notes"
                + (f" ({reasons})" if reasons else "") + "; they keep lite values and are retried on the next run")
        summary.enrichment_failures.append(line)
        if strict:
            raise IngestError(doc.path, f"VLM enrichment failed for {failed} of {len(doc.notes)} notes"
                              + (f" ({reasons})" if reasons else "") + " (--strict)")
    n = (doc.ocr or {}).get("no_text_pages", 0)
    if n and doc.source == "built":
        state = doc.ocr.get("state")
        line = f"{doc.path}: {n} of {doc.num_pages} pages have no text layer; OCR: {state}"
        if state == "unavailable":
            line += " (install tesseract-ocr to read them; they are indexed as page images)"
        summary.ocr.append(line)
        log(("note: " if state == "done" else "warning: ") + line)


def _build_doc(doc: _Doc, key: str, cache: store.DocCache, config, embedder, seconds, log, progress, *,
               reuse_parse: bool = False) -> None:
    """Parses (or takes the previous stages of), enriches and embeds one document; commits it to the cache."""
    staging, redo = _prepare_doc(doc, cache, config, seconds, reuse_parse=reuse_parse)
    _finish_doc(doc, key, cache, staging, redo, embedder, seconds, log)


def _prepare_doc(doc: _Doc, cache: store.DocCache, config, seconds, *, reuse_parse: bool = False):
    """Everything before embedding: parse (or the previous stages), enrich; crops go to a new staging
    directory of ``cache``. Returns ``(staging, redo)``; on failure the staging directory is removed."""
    import shutil

    from cdsjax.io.notes import Note

    staging = cache.staging()
    redo = bool(doc.notes) or _ocr_redo(doc, config)  # an entry for this key may exist and is being improved
    try:
        retry = [i for i, n in enumerate(doc.notes) if _get(n, "enrichment") == "lite-fallback"] \
            if doc.notes and str(config.enrich.mode) == "vlm" and not _ocr_redo(doc, config) else None
        if retry:  # only the failed notes go to the VLM again
            _copy_crops(doc, staging)
            t0 = time.perf_counter()
            notes = [n if isinstance(n, Note) else Note.from_dict(n) for n in doc.notes]
            elements = [e if isinstance(e, Element) else Element.from_dict(e) for e in doc.elements]
            from cdsjax.io.vlm import enrich_vlm_report

            notes, _, report = enrich_vlm_report(notes, elements, set(), config=config, image_root=staging,
                                                 only=retry)
            doc.notes = notes
            doc.enrichment_reasons = report.reason_text()
            seconds["notes"] += time.perf_counter() - t0
        elif reuse_parse:  # same parse settings as the previous index: only notes and embeddings are redone
            _copy_crops(doc, staging)
            t0 = time.perf_counter()
            doc.notes, doc.edges, doc.enrichment_reasons = _enrich(doc, config, staging)
            seconds["notes"] += time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            parsed = _parse(doc, config, staging / doc.crop_rel, doc.crop_rel)
            seconds["parse"] += time.perf_counter() - t0
            doc.num_pages = parsed.num_pages
            doc.elements = parsed.elements
            doc.ocr = dict(no_text_pages=len(parsed.no_text_pages), pages=list(parsed.no_text_pages),
                           state=parsed.ocr)
            doc.warnings = [w for w in parsed.warnings if "no text layer" not in w]
            if not doc.elements:
                raise IngestError(doc.path, "no text, figures or tables found")
            t0 = time.perf_counter()
            doc.notes, doc.edges, doc.enrichment_reasons = _enrich(doc, config, staging)
            seconds["notes"] += time.perf_counter() - t0
        doc.enrichment = dict(collections.Counter(_get(n, "enrichment") or "lite" for n in doc.notes))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, redo


def _finish_doc(doc: _Doc, key: str, cache: store.DocCache, staging: Path, redo: bool, embedder, seconds,
                log) -> None:
    """Embeds a prepared document and commits it (with the crops in ``staging``) to the cache."""
    import shutil

    from cdsjax.io.notes import embedding_text

    try:
        t0 = time.perf_counter()
        doc.embeddings = embedder.encode_documents([embedding_text(n) for n in doc.notes], show_progress=False)
        seconds["embed"] += time.perf_counter() - t0
        notes = [n if isinstance(n, dict) else n.to_dict() for n in doc.notes]
        elements = [e if isinstance(e, dict) else e.to_dict() for e in doc.elements]
        meta = dict(sha256=doc.sha, path=str(doc.path), doc_id=doc.doc_id, num_pages=doc.num_pages, keys=doc.keys,
                    ocr=doc.ocr, enrichment=doc.enrichment, enrichment_reasons=doc.enrichment_reasons,
                    embedder=embedder.info(),
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        try:
            final = cache.write(key, staging, meta=meta, elements=elements, notes=notes,
                                embeddings=doc.embeddings, edges=doc.edges, replace=redo)
            staging = None
            doc.crop_root = final
        except OSError as err:  # the cache is optional: the index is still written
            log(f"warning: cannot write the document cache {cache.root} ({err.strerror or err})")
            keep = staging.parent / f".{staging.name}-kept"
            staging.rename(keep)
            staging = None
            doc.crop_root = keep
        doc.notes, doc.elements = notes, elements
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        release_freed_memory()  # this document's blocks go back to the kernel before the next one


def _ocr_redo(doc: _Doc, config) -> bool:
    from cdsjax.io.parse import ocr_available

    ocr = doc.ocr or {}
    return bool(ocr.get("no_text_pages")) and ocr.get("state") in ("unavailable", "off") \
        and _ocr_enabled(config) and ocr_available()


def _copy_crops(doc: _Doc, staging: Path) -> None:
    if doc.crop_root is None:
        return
    src = Path(doc.crop_root) / doc.crop_rel
    if src.is_dir():
        for png in src.iterdir():
            store.link_or_copy(png, staging / doc.crop_rel / png.name)


def _get(obj, name):
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _fill_from_entry(doc: _Doc, entry: dict) -> None:
    meta = entry["meta"]
    doc.num_pages = int(meta.get("num_pages", 0))
    doc.ocr = meta.get("ocr") or {}
    doc.enrichment = meta.get("enrichment") or {}
    doc.enrichment_reasons = meta.get("enrichment_reasons") or ""
    doc.elements = entry["elements"]
    doc.notes = entry["notes"]
    doc.embeddings = entry["embeddings"]
    doc.edges = entry["edges"]
    doc.crop_root = entry["root"]
    _rename(doc)


def _rename(doc: _Doc) -> None:
    """Rewrites doc_id / note_id of stored rows when the document has another id in this index."""
    if doc.notes and _get(doc.notes[0], "doc_id") != doc.doc_id:
        doc.notes = [dict(n, doc_id=doc.doc_id, note_id=f"{doc.doc_id}#{n['reading_order']}") for n in doc.notes]
        doc.elements = [dict(e, doc_id=doc.doc_id) for e in doc.elements]


def _write_index(staging: Path, kept: List[_Doc], config, versions, embedder, emb_info, keys) -> dict:
    from cdsjax.core import validate_embeddings

    notes, elements, manifest_docs, emb_blocks, edge_blocks = [], [], [], [], []
    for d in kept:
        start = len(notes)
        d_notes = [n if isinstance(n, dict) else n.to_dict() for n in d.notes]
        d_elements = [e if isinstance(e, dict) else e.to_dict() for e in d.elements]
        d_edges = np.asarray(d.edges, np.int32).reshape(-1, 2)
        d_emb = np.ascontiguousarray(d.embeddings, dtype=np.float32)
        notes.extend(d_notes)
        elements.extend(d_elements)
        emb_blocks.append(d_emb)
        edge_blocks.append(d_edges + start)
        if d.crop_root is not None and (Path(d.crop_root) / d.crop_rel).is_dir():
            for png in (Path(d.crop_root) / d.crop_rel).iterdir():
                store.link_or_copy(png, staging / d.crop_rel / png.name)
        manifest_docs.append(dict(
            doc_id=d.doc_id, path=str(d.path), sha256=d.sha, num_pages=d.num_pages, num_elements=len(d_elements),
            num_notes=len(d_notes), note_start=start, keys=d.keys, crops=d.crop_rel, ocr=d.ocr,
            enrichment=d.enrichment,
            hashes=dict(notes=store.rows_digest(d_notes), elements=store.rows_digest(d_elements),
                        embeddings=_digest(d_emb), edges=_digest(d_edges),
                        crops=store.crop_hashes(staging / d.crop_rel)),
        ))
    embeddings = np.concatenate(emb_blocks, axis=0).astype(np.float32)
    edges = np.concatenate(edge_blocks, axis=0).astype(np.int32)
    validate_embeddings(embeddings, norm_atol=1e-3 if emb_info.get("normalize", True) else None)
    if len(notes) != embeddings.shape[0]:
        raise RuntimeError(f"internal error: {len(notes)} notes but {embeddings.shape[0]} embeddings")
    hashes = dict(
        notes=store.write_jsonl(staging / "notes.jsonl", notes),
        elements=store.write_jsonl(staging / "elements.jsonl", elements),
        arrays=store.arrays_digest(embeddings, edges),
    )
    store.save_arrays(staging / "arrays", embeddings, edges)
    hashes["array_files"] = store.crop_hashes(staging / "arrays")
    info = dict(emb_info)
    info["dim"] = int(embeddings.shape[1])
    hashes["embedder"] = store.embedder_digest(info)
    return dict(
        format_version=store.FORMAT_VERSION,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        versions=versions,
        config=config.to_dict(),
        embedder=info,
        keys=keys,
        documents=manifest_docs,
        counts=dict(notes=len(notes), links=int(edges.shape[0]), dim=int(embeddings.shape[1])),
        hashes=hashes,
    )


def _digest(a: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _fail(summary: IndexSummary, err: IngestError, strict: bool, log) -> None:
    summary.failures.append((err.path, err.reason))
    if strict:
        raise err
    log(f"error: {err.path}: {err.reason}")


def _assign_doc_ids(docs: List[_Doc]) -> None:
    """Documents already in the index keep their id; a new one gets its file name, or name~sha8 if taken."""
    taken = {d.doc_id for d in docs if d.doc_id}
    for d in docs:
        if d.doc_id:
            continue
        d.doc_id = d.path.name if d.path.name not in taken else f"{d.path.name}~{d.sha[:8]}"
        taken.add(d.doc_id)


def _parse(doc: _Doc, config, crop_dir: Path, crop_rel: str):
    parser = str(config.ingest.parser)
    if parser == "pymupdf":
        from cdsjax.io.parse import parse_pdf

        return parse_pdf(doc.path, doc.doc_id, config=config, crop_dir=crop_dir, crop_prefix=crop_rel)
    if parser == "mineru":
        from cdsjax.io.mineru import parse_with_mineru

        return parse_with_mineru(doc.path, doc.doc_id, config=config, crop_dir=crop_dir, crop_prefix=crop_rel)
    raise ValueError(f"config.ingest.parser must be 'pymupdf' or 'mineru', got {parser!r}")


def _enrich(doc: _Doc, config, staging: Path):
    """Notes and links of one document: ``(notes, [E, 2] edges, failure reasons text)``."""
    from cdsjax.io.notes import edges_to_array, enrich_lite, structural_links

    elements = [e if isinstance(e, Element) else Element.from_dict(e) for e in doc.elements]
    notes = enrich_lite(elements, config)
    edges = structural_links(elements, window=int(config.enrich.window), proximity=float(config.enrich.proximity))
    mode = str(config.enrich.mode)
    reasons = ""
    if mode == "vlm":
        from cdsjax.io.vlm import enrich_vlm_report

        notes, edges, report = enrich_vlm_report(notes, elements, edges, config=config, image_root=staging)
        reasons = report.reason_text()
    elif mode != "lite":
        raise ValueError(f"config.enrich.mode must be 'lite' or 'vlm', got {mode!r}")
    return notes, edges_to_array(edges), reasons


class _PreviousIndex:
    """The index already in ``out_dir``: its documents, each checked against its recorded hashes."""

    def __init__(self, root: Path, manifest: dict):
        self.root = root
        self.manifest = manifest
        self.damaged = False
        self._loaded = False

    @classmethod
    def open(cls, root: Path) -> Optional["_PreviousIndex"]:
        manifest = store.read_manifest(root)
        if manifest is None or not isinstance(manifest.get("documents"), list):
            return None
        return cls(root, manifest)

    def documents(self) -> List[dict]:
        return list(self.manifest["documents"])

    def entry(self, doc_id: str) -> dict:
        return next(e for e in self.manifest["documents"] if e["doc_id"] == doc_id)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        root = self.root
        self.line_digests = self.notes_rows = self.element_lines = None
        self.problems = {}
        try:
            self.note_lines = (root / "notes.jsonl").read_bytes().splitlines(keepends=True)
        except OSError as err:
            self.note_lines, self.problems["notes"] = None, f"{root / 'notes.jsonl'} is unreadable ({err.strerror})"
        try:
            self.element_lines = (root / "elements.jsonl").read_bytes().splitlines(keepends=True)
        except OSError as err:
            self.problems["elements"] = f"{root / 'elements.jsonl'} is unreadable ({err.strerror})"
        try:
            self.arrays = store.load_arrays_checked(root / "arrays", self.manifest.get("hashes", {}).get("array_files"))
            if store.arrays_digest(*self.arrays) != self.manifest.get("hashes", {}).get("arrays"):
                self.problems["arrays"] = f"{root / 'arrays'} does not match its recorded hash"
                self.arrays_ok = False
            else:
                self.arrays_ok = True
        except store.StoreError as err:
            self.arrays, self.arrays_ok = None, False
            self.problems["arrays"] = str(err)
        self.whole_ok = {
            "notes": self.note_lines is not None and store.sha256_bytes(b"".join(self.note_lines))
            == self.manifest.get("hashes", {}).get("notes"),
            "elements": self.element_lines is not None and store.sha256_bytes(b"".join(self.element_lines))
            == self.manifest.get("hashes", {}).get("elements"),
        }

    def check(self, doc: _Doc) -> Optional[str]:
        """None when the index's copy of ``doc`` is intact, else a line saying what is wrong."""
        self._load()
        entry = next(e for e in self.manifest["documents"] if e["doc_id"] == doc.doc_id)
        problem = self._check(entry)
        if problem is not None:
            self.damaged = True
        return problem

    def _check(self, entry: dict) -> Optional[str]:
        start, count = entry["note_start"], entry["num_notes"]
        h = entry.get("hashes")
        root = self.root
        for name, lines in (("notes", self.note_lines), ("elements", self.element_lines)):
            if lines is None:
                return self.problems[name]
            piece = lines[start : start + count]
            if h is None:  # an index written before per-document hashes: the whole file must match
                if not self.whole_ok[name]:
                    return f"{root / (name + '.jsonl')} does not match its recorded hash"
                continue
            if len(piece) != count or store.sha256_bytes(b"".join(piece)) != h[name]:
                return f"{root / (name + '.jsonl')}: this document's lines are damaged or missing"
        if self.arrays is None:
            return self.problems["arrays"]
        emb, edges = self.arrays
        if emb.shape[0] < start + count:
            return f"{root / 'arrays'}: too few embeddings"
        if h is None:
            if not self.arrays_ok:
                return self.problems["arrays"]
        else:
            sel = (edges[:, 0] >= start) & (edges[:, 0] < start + count)
            if _digest(np.ascontiguousarray(emb[start : start + count], np.float32)) != h["embeddings"] or \
                    _digest(np.ascontiguousarray(edges[sel] - start, np.int32)) != h["edges"]:
                return f"{root / 'arrays'}: this document's embeddings or links do not match their hashes"
            bad = store.check_crops(root / entry["crops"], h.get("crops", {}))
            if bad:
                return bad
        return None

    def fill(self, doc: _Doc) -> None:
        import json

        entry = next(e for e in self.manifest["documents"] if e["doc_id"] == doc.doc_id)
        start, count = entry["note_start"], entry["num_notes"]
        doc.num_pages = entry["num_pages"]
        doc.ocr = entry.get("ocr") or {}
        doc.enrichment = entry.get("enrichment") or {}
        doc.notes = [json.loads(line) for line in self.note_lines[start : start + count]]
        doc.elements = [json.loads(line) for line in self.element_lines[start : start + count]]
        emb, edges = self.arrays
        sel = (edges[:, 0] >= start) & (edges[:, 0] < start + count)
        doc.edges = edges[sel] - start
        doc.embeddings = emb[start : start + count]
        doc.crop_root = self.root
        _rename(doc)


# --------------------------------------------------------------------------- load


def load_index(directory, *, verify: bool = True) -> CorpusIndex:
    """Loads an index directory for retrieval.

    Args:
      directory: a directory written by :func:`build_index`.
      verify: check the notes file and arrays against the manifest's hashes.

    Raises:
      store.StoreError: missing or damaged index (one line naming the file, and how to repair it).
    """
    root = Path(directory)
    store.recover(root)
    manifest = store.read_manifest(root)
    if manifest is None:
        raise store.StoreError(store.not_an_index(root))
    fix = f"; run `cdsjax index --verify {root}` to repair it"
    try:
        if verify:
            store.check_embedder_digest(root, manifest)
        notes = store.read_jsonl_checked(root / "notes.jsonl", manifest["hashes"]["notes"] if verify else None)
        embeddings, edges = store.load_arrays_checked(root / "arrays", manifest["hashes"].get("array_files"))
        if verify and store.arrays_digest(embeddings, edges) != manifest["hashes"]["arrays"]:
            raise store.StoreError(f"{root / 'arrays'}: damaged (content does not match its recorded sha256)")
    except store.StoreError as err:
        raise store.StoreError(f"{err}{fix}") from None
    except (KeyError, TypeError) as err:
        raise store.StoreError(f"{root / store.MANIFEST}: damaged (no {err}){fix}") from None
    n = len(notes)
    if embeddings.shape[0] != n:
        raise store.StoreError(f"{root}: {n} notes but {embeddings.shape[0]} embeddings{fix}")
    links = np.zeros((n, n), dtype=np.bool_)
    if edges.size:
        if edges.min() < 0 or edges.max() >= n:
            raise store.StoreError(f"{root / 'arrays'}: damaged (link indices out of range){fix}")
        links[edges[:, 0], edges[:, 1]] = True
        links[edges[:, 1], edges[:, 0]] = True
    np.fill_diagonal(links, False)
    no_text = {d["doc_id"]: (set(d.get("ocr", {}).get("pages", [])), d.get("ocr", {}).get("state"))
               for d in manifest.get("documents", [])}
    for note in notes:
        pages, state = no_text.get(note.get("doc_id"), (set(), None))
        if note.get("page") in pages:  # the reader's evidence from this page is OCR text or only an image
            note["no_text_layer"] = True
            note["ocr"] = state
    store.resolve_crops(root, notes, manifest.get("documents", []), verify=verify)
    return CorpusIndex(embeddings=embeddings, links=links, notes=notes, manifest=manifest,
                       embedder=manifest["embedder"], root=root.absolute())


def list_index(directory) -> List[dict]:
    """The documents of an index: doc_id, path, sha256, pages, notes, enrichment, OCR state (no hash checks)."""
    root = Path(directory)
    manifest = store.read_manifest(root)
    if manifest is None:
        raise store.StoreError(store.not_an_index(root))
    return [dict(doc_id=d["doc_id"], path=d["path"], sha256=d["sha256"], pages=d["num_pages"],
                 notes=d["num_notes"], enrichment=d.get("enrichment") or {}, ocr=d.get("ocr") or {})
            for d in manifest["documents"]]


def verify_index(directory, *, config=None, log=None, wait: bool = True) -> IndexSummary:
    """Checks every document of an index against its hashes and rebuilds the damaged ones.

    Returns the summary of the repair run: ``repaired`` lists ``(doc_id, problem)``; ``failures`` the
    documents that could not be rebuilt (their PDF is gone and no cache entry is left).
    """
    root = Path(directory)
    if store.read_manifest(root) is None:
        raise store.StoreError(store.not_an_index(root))
    return build_index([], root, config=config, log=log, wait=wait, strict=False)


# --------------------------------------------------------------------------- single-PDF cache


def cache_root(config=None) -> Path:
    """Where single-PDF indexes live: ``config.index.cache_dir``, else $CDSJAX_CACHE, else ~/.cache/cdsjax."""
    configured = ""
    if config is not None and "index" in config and config.index.get("cache_dir"):
        configured = str(config.index.cache_dir)
    root = configured or os.environ.get("CDSJAX_CACHE") or str(Path.home() / ".cache" / "cdsjax")
    return Path(root).expanduser()


def _single_index_dir(pdf: Path, sha: str, cache_dir, config) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root(config)
    return root / f"{pdf.stem[:60]}-{sha[:16]}"


def _current_single_index(out: Path, keys: dict) -> bool:
    try:
        manifest = store.read_manifest(out)
    except Exception:  # unreadable: index_pdf reports or repairs it
        return False
    docs = (manifest or {}).get("documents") or []
    return len(docs) == 1 and (docs[0].get("keys") or {}).get("embed") == keys["embed"]


def prebuild_documents(pdfs: Sequence, *, config=None, cache_dir=None, workers: Optional[int] = None,
                       progress: bool = False, log: Optional[Callable[[str], None]] = None) -> int:
    """Builds the documents of ``pdfs`` that the document cache lacks, ``workers`` at a time.

    The same process pool as ``cdsjax index --workers`` (:func:`build_documents`); afterwards
    :func:`index_pdf` of each PDF finds its document in the cache. Used by the evaluation harness.
    ``cache_dir`` is the index cache directory as for :func:`index_pdf` (documents go to
    ``<cache_dir>/docs``). Bad PDFs are left for :func:`index_pdf` to report. Returns how many were built.
    """
    from cdsjax.io.embed import Embedder
    from cdsjax.io.parse import check_pdf_file

    config = default_config() if config is None else config
    log = log or (lambda line: None)
    cache = doc_cache(config) if cache_dir is None else store.DocCache(Path(cache_dir) / "docs")
    embedder = Embedder(config)
    keys = stage_keys(config, _library_versions(), embedder.info())
    todo, seen = [], set()
    for pdf in pdfs:
        pdf = Path(pdf)
        try:
            check_pdf_file(pdf)
        except (IngestError, OSError):
            continue
        sha = store.sha256_file(pdf)
        if sha in seen:
            continue
        seen.add(sha)
        if cache.path(entry_key(sha, keys)).exists():
            continue  # (a damaged entry is found and rebuilt by index_pdf)
        if _current_single_index(_single_index_dir(pdf, sha, cache_dir, config), keys):
            continue  # index_pdf will reuse its own index of this PDF
        todo.append(_Doc(path=pdf.absolute(), sha=sha, doc_id=pdf.name, keys=keys, is_input=True, status="added"))
    if not todo:
        return 0
    cache.clean_staging()
    bar = _Bar(len(todo), enabled=progress)
    built = 0
    try:
        for doc, err in build_documents(todo, cache, config, embedder=embedder, workers=resolve_workers(workers),
                                        log=log):
            bar.update()
            built += err is None  # a failure is reported again by index_pdf
    finally:
        bar.close()
    return built


def index_pdf(pdf, *, config=None, cache_dir=None, progress: bool = False,
              log: Optional[Callable[[str], None]] = None) -> CorpusIndex:
    """Indexes one PDF into the cache (once per content and settings) and loads it.

    Used by ``cdsjax ask PDF``. The index directory is ``<cache>/<stem>-<sha256[:16]>``; the documents go
    to the shared document cache (:func:`doc_cache`), or to ``<cache_dir>/docs`` when ``cache_dir`` is given
    (an evaluation keeps everything under its own cache).

    Repairs, damaged cache entries and pages without text layer are reported through ``log`` (default: one
    line each on stderr).

    Raises:
      IngestError: the PDF cannot be indexed.
    """
    from cdsjax.io.parse import check_pdf_file

    if log is None:
        def log(line: str) -> None:
            print(f"cdsjax: {line}", file=sys.stderr)

    config = default_config() if config is None else config
    pdf = Path(pdf)
    if not pdf.exists():
        raise IngestError(pdf, "no such file or directory")
    check_pdf_file(pdf)
    sha = store.sha256_file(pdf)
    out = _single_index_dir(pdf, sha, cache_dir, config)
    build_index([pdf], out, config=config, strict=True, progress=progress, log=log,
                cache_dir=None if cache_dir is None else Path(cache_dir) / "docs")
    return load_index(out)
