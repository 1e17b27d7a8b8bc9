"""The single-PDF cache behind ``cdsjax ask PDF`` and the evaluation harness: one small index per PDF."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from cdsjax.io import doccache, store
from cdsjax.io import storefiles
from cdsjax.io.elements import IngestError
from cdsjax.io.index.build import build_index
from cdsjax.io.index.context import BuildContext, Doc, ProgressBar, default_config, quiet
from cdsjax.io.index.keys import cache_root, doc_cache, entry_key, library_versions, stage_keys
from cdsjax.io.index.load import CorpusIndex, load_index
from cdsjax.io.index.workers import build_documents, resolve_workers


def _single_index_dir(pdf: Path, sha: str, cache_dir, config) -> Path:
    """``<cache>/<stem>-<sha16>``; a link planted there is refused (:class:`storefiles.StoreError`), not followed."""
    root = Path(cache_dir) if cache_dir is not None else cache_root(config)
    out = root / f"{pdf.stem[:60]}-{sha[:16]}"
    if os.path.islink(out):
        raise storefiles.StoreError(f"{out}: refusing a symbolic link inside the cdsjax cache; remove it")
    return out


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

    The same process pool as ``cdsjax index --workers`` (:func:`~cdsjax.io.index.workers.build_documents`);
    afterwards :func:`index_pdf` of each PDF finds its document in the cache. Used by the evaluation harness.
    ``cache_dir`` is the index cache directory as for :func:`index_pdf` (documents go to
    ``<cache_dir>/docs``). Bad PDFs are left for :func:`index_pdf` to report. Returns how many were built.
    """
    from cdsjax.io.embed import Embedder
    from cdsjax.io.parse import check_pdf_file

    config = default_config() if config is None else config
    cache = doc_cache(config) if cache_dir is None else doccache.DocCache(Path(cache_dir) / "docs")
    embedder = Embedder(config)
    keys = stage_keys(config, library_versions(), embedder.info())
    todo, seen = [], set()
    for pdf in pdfs:
        pdf = Path(pdf)
        try:
            check_pdf_file(pdf)
        except (IngestError, OSError):
            continue
        sha = storefiles.sha256_file(pdf)
        if sha in seen:
            continue
        seen.add(sha)
        if cache.path(entry_key(sha, keys)).exists():
            continue  # (a damaged entry is found and rebuilt by index_pdf)
        if _current_single_index(_single_index_dir(pdf, sha, cache_dir, config), keys):
            continue  # index_pdf will reuse its own index of this PDF
        todo.append(Doc(path=pdf.absolute(), sha=sha, doc_id=pdf.name, keys=keys, is_input=True, status="added"))
    if not todo:
        return 0
    cache.clean_staging()
    ctx = BuildContext(config=config, cache=cache, log=log or quiet, workers=resolve_workers(workers),
                       embedder=embedder, keys=keys)
    bar = ProgressBar(len(todo), enabled=progress)
    built = 0
    try:
        for doc, err in build_documents(todo, ctx):
            bar.update()
            built += err is None  # a failure is reported again by index_pdf
    finally:
        bar.close()
    return built


def index_pdf(pdf, *, config=None, cache_dir=None, progress: bool = False,
              log: Optional[Callable[[str], None]] = None,
              on_prepared: Optional[Callable] = None) -> CorpusIndex:
    """Indexes one PDF into the cache (once per content and settings) and loads it.

    Used by ``cdsjax ask PDF``. The index directory is ``<cache>/<stem>-<sha256[:16]>``; the documents go
    to the shared document cache (:func:`~cdsjax.io.index.keys.doc_cache`), or to ``<cache_dir>/docs`` when
    ``cache_dir`` is given (an evaluation keeps everything under its own cache).

    Repairs, damaged cache entries and pages without text layer are reported through ``log`` (default: one
    line each on stderr). ``on_prepared(doc)`` is called once the PDF is parsed and enriched, while its notes
    are embedded (:func:`~cdsjax.io.index.build_index`).

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
    sha = storefiles.sha256_file(pdf)
    out = _single_index_dir(pdf, sha, cache_dir, config)
    if not (out / store.MANIFEST).is_file() and str(config.ingest.parser) == "pymupdf":
        from cdsjax.io.parse.layout_split import prestart_helper

        prestart_helper(pdf)  # a new PDF: the layout helper loads while this process gets ready
    build_index([pdf], out, config=config, strict=True, progress=progress, log=log,
                cache_dir=None if cache_dir is None else Path(cache_dir) / "docs", on_prepared=on_prepared)
    return load_index(out)


def prestart_layout(pdfs: Sequence, *, config=None, cache_dir=None) -> None:
    """Starts the layout helper (:func:`cdsjax.io.parse.layout_split.prestart_helper`) for the first of ``pdfs`` that
    :func:`index_pdf` will parse, before anything else is imported here: ``cdsjax ask NEW.pdf`` calls this
    first, so that the helper's imports and model load overlap this process's (JAX, the pipeline, PyMuPDF).
    The helper counts the pages itself and ends at once when the document is too short to split."""
    config = default_config() if config is None else config
    if str(config.ingest.parser) != "pymupdf":
        return
    for pdf in pdfs:
        pdf = Path(pdf)
        try:
            if pdf.is_dir() or not pdf.is_file():
                continue
            out = _single_index_dir(pdf, storefiles.sha256_file(pdf), cache_dir, config)
        except (OSError, storefiles.StoreError):  # a refused cache: the indexing itself says so, in one line
            return
        if not (out / store.MANIFEST).is_file():
            from cdsjax.io.parse.layout_split import prestart_helper

            prestart_helper(pdf, count_pages=False)
            return
