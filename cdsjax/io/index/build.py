"""The locked build: the new document set, each document obtained (previous index, cache or PDF), published.

:func:`build_index` takes the writer lock of the output directory and runs one build around a
:class:`~cdsjax.io.index.context.BuildContext`; the documents that must be parsed go to
:func:`~cdsjax.io.index.workers.build_documents`; the new index is written to a staging directory and
committed atomically.
"""

from __future__ import annotations

import collections
import os
import shutil
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Union

import numpy as np

from cdsjax.io import doccache, store
from cdsjax.io import storefiles
from cdsjax.io.elements import IngestError
from cdsjax.io.embed import embedder_key
from cdsjax.io.index.context import BuildContext, Doc, IndexSummary, ProgressBar, default_config, quiet
from cdsjax.io.index.keys import array_digest, cache_root, doc_cache, entry_key, library_versions, stage_keys
from cdsjax.io.index.repair import PreviousIndex
from cdsjax.io.index.stages import build_doc, needs_redo, ocr_redo, report_doc
from cdsjax.io.index.workers import build_documents, resolve_workers


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
    ray: Optional[str] = None,
    on_prepared: Optional[Callable] = None,
    page_split: bool = True,
) -> IndexSummary:
    """Adds, updates or removes documents of the index in ``out_dir`` (one corpus: the notes of all documents).

    An index is a set of documents. PDFs named in ``paths`` are added, or re-done when their content (or the
    settings) changed; documents already in the index and not named stay as they are (``replace=True``
    starts from an empty set). Every finished document is first committed to the shared document cache
    (:func:`~cdsjax.io.index.keys.doc_cache`), so a killed run resumes with the documents it had finished,
    and the same PDF indexed elsewhere is not parsed again. Damaged documents of the previous index (hash
    mismatch, missing or truncated files) are rebuilt from the cache or their PDF and listed in
    ``summary.repaired``. The new index is published atomically, under a writer lock
    (:func:`store.writer_lock`).

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
      cache_dir: the document cache directory (default :func:`~cdsjax.io.index.keys.doc_cache` of ``config``).
      workers: documents parsed, enriched and embedded at once, each in its own process
        (:func:`~cdsjax.io.index.workers.build_documents`); None means one per core. Each finished document
        is committed to the cache as soon as it is done; the index is the same for any number of workers.
      embed_in: with several workers, where the notes are embedded: ``"parent"`` (this process, as each
        document comes back) or ``"worker"`` (see :func:`~cdsjax.io.index.workers.build_documents`).
      ray: build the documents on Ray instead (:mod:`cdsjax.io.index.on_ray`): a cluster's address
        (``"auto"``, ``"ray://head:10001"``), or ``""`` for a local Ray on the cores this process may use.
        The index is the same as without Ray; ``workers`` and ``embed_in`` are not used.
      on_prepared: called with each document (a :class:`~cdsjax.io.index.context.Doc`) parsed and enriched in
        this process, while its notes are embedded on another thread (see
        :class:`~cdsjax.io.index.context.BuildContext`).
      page_split: a long document's layout analysed by this process and a helper process at once (default);
        False: by this process alone (e.g. to profile one process). The index is the same either way.

    Returns:
      an :class:`IndexSummary`.

    Raises:
      IngestError: in strict mode, for the first bad document (nothing is written).
      storefiles.StoreError: the output directory cannot be written, is locked (``wait=False``), or names no
        such document to remove.
    """
    config = default_config() if config is None else config
    strict = bool(config.index.strict) if strict is None else bool(strict)
    out_dir = Path(out_dir)
    store.check_output_dir(out_dir, replace=replace)
    with store.writer_lock(out_dir, wait=wait, on_wait=log or quiet):
        ctx = BuildContext(config=config, cache=doc_cache(config) if cache_dir is None else doccache.DocCache(Path(cache_dir)),
                           log=log or quiet, strict=strict, progress=progress, workers=resolve_workers(workers),
                           embed_in=embed_in, ray=ray, summary=IndexSummary(out_dir=str(out_dir)),
                           on_prepared=on_prepared, page_split=page_split)
        return _build_locked(paths, out_dir, ctx, replace=replace, remove=list(remove))


def _build_locked(paths, out_dir: Path, ctx: BuildContext, *, replace: bool, remove: List[str]) -> IndexSummary:
    """One build run, under the writer lock: the document set, each document obtained, the index published."""
    summary, seconds = ctx.summary, ctx.seconds
    journal = cache_root(ctx.config) / "swaps"  # where commit records the index it parks aside
    store.recover(out_dir, journal=journal)
    store.check_output_dir(out_dir, replace=replace)
    ctx.cache.clean_staging()
    ctx.versions = library_versions()

    t0 = time.perf_counter()
    previous = PreviousIndex.open(out_dir)
    prev_docs = [] if previous is None else previous.documents()
    inputs = _read_inputs(paths, ctx)
    _choose_embedder(ctx, inputs, previous)
    removed = _match_removals(remove, prev_docs, out_dir)
    summary.removed = [d["doc_id"] for d in removed]
    docs = _document_set(inputs, prev_docs, removed, previous, out_dir, ctx, replace=replace)
    seconds["hash"] += time.perf_counter() - t0

    staging = None
    try:
        changed = bool(removed) or (replace and previous is not None and
                                    {d["doc_id"] for d in prev_docs} != {d.doc_id for d in docs})
        kept, failed = _obtain_all(docs, previous, ctx)
        changed = changed or failed or any(doc.source != "index" for doc in kept)

        if not kept:
            summary.seconds = dict(seconds)
            if previous is not None and removed and not docs:
                raise storefiles.StoreError(f"{out_dir}: the index would hold no documents; nothing was changed "
                                       f"(delete the directory to drop the index)")
            return summary  # nothing could be indexed: the previous index (if any) stays as it was
        order_same = previous is not None and [d.doc_id for d in kept] == [d["doc_id"] for d in prev_docs]
        if not changed and order_same and not previous.damaged:
            _fill_summary(summary, kept, written=False, seconds=seconds)
            return summary

        # ---- assemble and publish
        t0 = time.perf_counter()
        staging = store.staging_dir(out_dir)
        manifest = _write_index(staging, kept, ctx)
        store.write_manifest(staging, manifest)
        store.commit(staging, out_dir, journal=journal)
        staging = None
        seconds["write"] += time.perf_counter() - t0
        _fill_summary(summary, kept, written=True, seconds=seconds)
        return summary
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _read_inputs(paths, ctx: BuildContext) -> List[Doc]:
    """The PDFs named on this run, checked and hashed (a bad one is reported and left out)."""
    from cdsjax.io.parse import check_pdf_file

    inputs: List[Doc] = []
    for path in expand_paths(paths):
        try:
            if not path.exists():
                raise IngestError(path, "no such file or directory")
            check_pdf_file(path)
            resolved = os.path.realpath(path)  # what /pdf opens later, without following any link
            inputs.append(Doc(path=path, sha=storefiles.sha256_file(Path(resolved)), resolved=resolved, is_input=True))
        except OSError as err:  # gone or unreadable since it was found: one line, and the others are indexed
            _fail(ctx, IngestError(path, f"cannot read file ({err.strerror or err})"))
        except IngestError as err:
            _fail(ctx, err)
    return inputs


def _choose_embedder(ctx: BuildContext, inputs: List[Doc], previous: Optional[PreviousIndex]) -> None:
    """This run's embedder and stage keys: its own, unless the run only removes or repairs (the index's own)."""
    from cdsjax.io.embed import Embedder

    if not inputs and previous is not None:
        ctx.embedder = Embedder.from_info(previous.manifest["embedder"], device=str(ctx.config.embedder.device))
    else:
        ctx.embedder = Embedder(ctx.config)
    ctx.keys = stage_keys(ctx.config, ctx.versions, ctx.embedder.info())


def _document_set(inputs: List[Doc], prev_docs: List[dict], removed: List[dict], previous, out_dir: Path,
                  ctx: BuildContext, *, replace: bool) -> List[Doc]:
    """The new document set: previous documents (unless replaced/removed), updated in place, then new ones."""
    removed_ids = {d["doc_id"] for d in removed}
    docs: List[Doc] = []
    by_path, by_sha = {}, {}
    if not replace:
        for entry in prev_docs:
            if entry["doc_id"] in removed_ids:
                continue
            d = Doc(path=Path(entry["path"]), sha=entry["sha256"], doc_id=entry["doc_id"],
                    resolved=entry.get("resolved") or "", keys=entry.get("keys") or {}, status="kept")
            docs.append(d)
            by_path[str(d.path)] = d
            by_sha.setdefault(d.sha, d)
    if inputs and any(d.status == "kept" for d in docs):
        old, new = embedder_key(previous.manifest["embedder"]), embedder_key(ctx.embedder.info())
        if old != new:
            raise storefiles.StoreError(
                f"{out_dir}: the index was embedded with {old[0]} and this run embeds with {new[0]}; "
                f"use the same --embedder, or --replace to rebuild the whole index")
    for d in inputs:
        d.keys = ctx.keys
        same = by_path.get(str(d.path.absolute())) or by_sha.get(d.sha)
        if same is not None and same.is_input:
            continue  # named twice
        if same is not None:
            same.is_input = True
            same.keys = ctx.keys
            same.status = "unchanged" if same.sha == d.sha else "updated"
            same.path, same.sha, same.resolved = d.path.absolute(), d.sha, d.resolved
            continue
        d.path = d.path.absolute()
        d.status = "added"
        docs.append(d)
        by_path[str(d.path)] = d
        by_sha.setdefault(d.sha, d)
    _assign_doc_ids(docs)
    return docs


def _obtain_all(docs: List[Doc], previous: Optional[PreviousIndex], ctx: BuildContext):
    """Every document filled (previous index, cache, or built in the worker pool).

    Returns ``(kept, failed)``: the finished documents in the index's order (which does not depend on which
    worker finished first), and whether any document failed.
    """
    bar = ProgressBar(len(docs), enabled=ctx.progress)
    finished, to_build, failed = {}, [], False
    try:
        for doc in docs:
            try:
                done = obtain(doc, previous, ctx, defer=True)
            except IngestError as err:
                _fail(ctx, err)
                failed = True
                bar.update()
                continue
            if done == "build":
                to_build.append(doc)
                continue
            bar.update()
            if done:
                finished[id(doc)] = doc
        # the documents that must be parsed: in a pool of processes (or here, for one worker or document)
        for doc, err in build_documents(to_build, ctx):
            bar.update()
            if err is not None:
                _fail(ctx, err)
                failed = True
                continue
            doc.source = "built"
            report_doc(doc, ctx)
            finished[id(doc)] = doc
    finally:
        bar.close()
    ctx.cache.clean_staging()  # again: a killed run's workers may have died only after this run began
    return [doc for doc in docs if id(doc) in finished], failed


def obtain(doc: Doc, previous: Optional[PreviousIndex], ctx: BuildContext, *,
           defer: bool = False) -> Union[bool, str]:
    """Fills ``doc`` from the previous index, the cache or its PDF (in that order). False: skipped.

    With ``defer``, a document that must be built from scratch is not built here: ``"build"`` is
    returned and the caller hands it to :func:`~cdsjax.io.index.workers.build_documents`."""
    config, keys, summary, log = ctx.config, ctx.keys, ctx.summary, ctx.log
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
            if not (doc.is_input and needs_redo(doc, config)):
                return True
        elif old_keys.get("parse") == keys["parse"]:
            previous.fill(doc)
            doc.notes, doc.embeddings, doc.edges, doc.enrichment = [], None, None, {}
            reuse_parse = True
    if doc.status == "kept" and not doc.keys.get("embed"):
        raise IngestError(doc.path, "damaged in the index and its settings are unknown; index it again")
    # 2. the document cache
    try:
        entry = ctx.cache.read(entry_key(doc.sha, doc.keys))
    except storefiles.StoreError as err:
        summary.warnings.append(f"damaged cache entry rebuilt: {err}")
        log(f"warning: {err}; rebuilding that cache entry")
        entry = None
    if entry is not None:
        reuse_parse = False
        doc.fill_from_entry(entry)
        doc.source = "cache"
        if not (doc.is_input and needs_redo(doc, config)):
            report_doc(doc, ctx)
            return True
    # 3. an entry of the same PDF parsed alike (another notes or embedding version): its parse is kept
    if entry is None and not reuse_parse and not doc.notes:
        try:
            donor = ctx.cache.parsed(doc.sha, keys["parse"])
        except OSError:
            donor = None
        if donor is not None:
            doc.fill_from_entry(donor)
            doc.notes, doc.embeddings, doc.edges, doc.enrichment = [], None, None, {}
            reuse_parse = True
    # 4. the PDF itself
    if not doc.path.is_file() or storefiles.sha256_file(doc.path) != doc.sha:
        what = "is gone" if not doc.path.is_file() else "has changed since it was indexed"
        raise IngestError(doc.path, f"cannot rebuild {doc.doc_id}: its PDF {what}; it was dropped from the "
                                    f"index (index the file again to add it back)")
    if doc.status == "kept":
        doc.keys = keys  # rebuilt with this run's settings
    if defer and not reuse_parse and not doc.notes and not ocr_redo(doc, config):
        return "build"
    build_doc(doc, ctx, reuse_parse=reuse_parse)
    doc.source = "built"
    report_doc(doc, ctx)
    return True


def _fill_summary(summary: IndexSummary, kept: List[Doc], *, written: bool, seconds) -> None:
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
            raise storefiles.StoreError(f"{out_dir}: no document {name!r} in this index (it holds: {known})")
        out.extend(h for h in hits if h not in out)
    return out


def _write_index(staging: Path, kept: List[Doc], ctx: BuildContext) -> dict:
    """Writes the notes, elements, arrays and crops of ``kept`` to ``staging``; returns the manifest."""
    from cdsjax.core.validation import validate_embeddings

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
        if d.crop_root is not None:  # copied, never linked, and no link followed (storefiles.copy_inside)
            storefiles.copy_inside(d.crop_root, d.crop_rel, staging)
        manifest_docs.append(dict(
            doc_id=d.doc_id, path=str(d.path), resolved=d.resolved, sha256=d.sha, num_pages=d.num_pages,
            num_elements=len(d_elements), num_notes=len(d_notes), note_start=start, keys=d.keys, crops=d.crop_rel,
            ocr=d.ocr, enrichment=d.enrichment,
            hashes=dict(notes=storefiles.rows_digest(d_notes), elements=storefiles.rows_digest(d_elements),
                        embeddings=array_digest(d_emb), edges=array_digest(d_edges),
                        crops=storefiles.crop_hashes(staging / d.crop_rel)),
        ))
    embeddings = np.concatenate(emb_blocks, axis=0).astype(np.float32)
    edges = np.concatenate(edge_blocks, axis=0).astype(np.int32)
    emb_info = ctx.embedder.info()
    validate_embeddings(embeddings, norm_atol=1e-3 if emb_info.get("normalize", True) else None)
    if len(notes) != embeddings.shape[0]:
        raise RuntimeError(f"internal error: {len(notes)} notes but {embeddings.shape[0]} embeddings")
    hashes = dict(
        notes=storefiles.write_jsonl(staging / "notes.jsonl", notes),
        elements=storefiles.write_jsonl(staging / "elements.jsonl", elements),
        arrays=store.arrays_digest(embeddings, edges),
    )
    store.save_arrays(staging / "arrays", embeddings, edges)
    hashes["array_files"] = storefiles.crop_hashes(staging / "arrays")
    info = dict(emb_info)
    info["dim"] = int(embeddings.shape[1])
    hashes["embedder"] = store.embedder_digest(info)
    return dict(
        format_version=store.FORMAT_VERSION,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        versions=ctx.versions,
        config=ctx.config.to_dict(),
        embedder=info,
        keys=ctx.keys,
        documents=manifest_docs,
        counts=dict(notes=len(notes), links=int(edges.shape[0]), dim=int(embeddings.shape[1])),
        hashes=hashes,
    )


def _fail(ctx: BuildContext, err: IngestError) -> None:
    ctx.summary.failures.append((err.path, err.reason))
    if ctx.strict:
        raise err
    ctx.log(f"error: {err.path}: {err.reason}")


def _assign_doc_ids(docs: List[Doc]) -> None:
    """Documents already in the index keep their id; a new one gets its file name, or name~sha8 if taken."""
    taken = {d.doc_id for d in docs if d.doc_id}
    for d in docs:
        if d.doc_id:
            continue
        # a name that is not UTF-8 (its bytes decoded as surrogates) becomes text: U+FFFD for each bad byte
        name = d.path.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        d.doc_id = name if name not in taken else f"{name}~{d.sha[:8]}"
        taken.add(d.doc_id)
