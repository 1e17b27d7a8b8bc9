"""The stages of one document: parse (or take the previous stages), enrich, embed, commit to the cache.

:func:`prepare_doc` runs everything before embedding (in a worker process, or here); :func:`finish_doc`
embeds and commits; :func:`build_doc` is both. :func:`report_doc` counts what a finished document reports.
"""

from __future__ import annotations

import collections
import shutil
import time
from pathlib import Path

from cdsjax.io import storefiles
from cdsjax.io.elements import Element, IngestError
from cdsjax.io.index.context import BuildContext, Doc, field_of
from cdsjax.io.index.keys import entry_key
from cdsjax.io.memory import release_freed_memory


def build_doc(doc: Doc, ctx: BuildContext, *, reuse_parse: bool = False) -> None:
    """Parses (or takes the previous stages of), enriches and embeds one document; commits it to the cache."""
    staging, redo = prepare_doc(doc, ctx, reuse_parse=reuse_parse)
    finish_doc(doc, ctx, staging, redo)


def prepare_doc(doc: Doc, ctx: BuildContext, *, reuse_parse: bool = False):
    """Everything before embedding: parse (or the previous stages), enrich; crops go to a new staging
    directory of ``ctx.cache``. Returns ``(staging, redo)``; on failure the staging directory is removed."""
    from cdsjax.io.notes import Note

    config, seconds = ctx.config, ctx.seconds
    staging = ctx.cache.staging()
    redo = bool(doc.notes) or ocr_redo(doc, config)  # an entry for this key may exist and is being improved
    try:
        retry = [i for i, n in enumerate(doc.notes) if field_of(n, "enrichment") == "lite-fallback"] \
            if doc.notes and str(config.enrich.mode) == "vlm" and not ocr_redo(doc, config) else None
        if retry:  # only the failed notes go to the VLM again
            copy_crops(doc, staging)
            t0 = time.perf_counter()
            notes = [n if isinstance(n, Note) else Note.from_dict(n) for n in doc.notes]
            elements = [e if isinstance(e, Element) else Element.from_dict(e) for e in doc.elements]
            from cdsjax.io.reading.vlm import enrich_vlm_report

            notes, _, report = enrich_vlm_report(notes, elements, set(), config=config, image_root=staging,
                                                 only=retry)
            doc.notes = notes
            doc.enrichment_reasons = report.reason_text()
            seconds["notes"] += time.perf_counter() - t0
        elif reuse_parse:  # same parse settings as the previous index: only notes and embeddings are redone
            copy_crops(doc, staging)
            t0 = time.perf_counter()
            doc.notes, doc.edges, doc.enrichment_reasons = enrich_doc(doc, config, staging)
            seconds["notes"] += time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            parsed = parse_doc(doc, config, staging / doc.crop_rel, doc.crop_rel, page_split=ctx.page_split)
            seconds["parse"] += time.perf_counter() - t0
            doc.num_pages = parsed.num_pages
            doc.elements = parsed.elements
            doc.ocr = dict(no_text_pages=len(parsed.no_text_pages), pages=list(parsed.no_text_pages),
                           state=parsed.ocr, unread_visuals=parsed.unread_visuals)
            doc.warnings = [w for w in parsed.warnings if "no text layer" not in w]
            if not doc.elements:
                raise IngestError(doc.path, "no text, figures or tables found")
            t0 = time.perf_counter()
            doc.notes, doc.edges, doc.enrichment_reasons = enrich_doc(doc, config, staging)
            seconds["notes"] += time.perf_counter() - t0
        doc.enrichment = dict(collections.Counter(field_of(n, "enrichment") or "lite" for n in doc.notes))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, redo


def finish_doc(doc: Doc, ctx: BuildContext, staging: Path, redo: bool) -> None:
    """Embeds a prepared document and commits it (with the crops in ``staging``) to the cache."""
    from cdsjax.io.notes import embedding_text
    from cdsjax.io.relevance import settings_of

    cache, embedder = ctx.cache, ctx.embedder
    try:
        t0 = time.perf_counter()
        context = settings_of(ctx.config)["context"]
        doc.embeddings = embedder.encode_documents([embedding_text(n, context) for n in doc.notes],
                                                   show_progress=False)
        ctx.seconds["embed"] += time.perf_counter() - t0
        notes = [n if isinstance(n, dict) else n.to_dict() for n in doc.notes]
        elements = [e if isinstance(e, dict) else e.to_dict() for e in doc.elements]
        meta = dict(sha256=doc.sha, path=str(doc.path), doc_id=doc.doc_id, num_pages=doc.num_pages, keys=doc.keys,
                    ocr=doc.ocr, enrichment=doc.enrichment, enrichment_reasons=doc.enrichment_reasons,
                    embedder=embedder.info(),
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        try:
            final = cache.write(entry_key(doc.sha, doc.keys), staging, meta=meta, elements=elements, notes=notes,
                                embeddings=doc.embeddings, edges=doc.edges, replace=redo)
            staging = None
            doc.crop_root = final
        except OSError as err:  # the cache is optional: the index is still written
            ctx.log(f"warning: cannot write the document cache {cache.root} ({err.strerror or err})")
            keep = staging.parent / f".{staging.name}-kept"
            staging.rename(keep)
            staging = None
            doc.crop_root = keep
        doc.notes, doc.elements = notes, elements
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        release_freed_memory()  # this document's blocks go back to the kernel before the next one


def needs_redo(doc: Doc, config) -> bool:
    """A named document whose stored copy should be improved: failed VLM notes to retry, or OCR now possible."""
    if str(config.enrich.mode) == "vlm" and doc.enrichment.get("lite-fallback", 0):
        return True
    return ocr_redo(doc, config)


def ocr_redo(doc: Doc, config) -> bool:
    """The document has pages without text, or figures and charts, that were not OCR'd, and OCR is now enabled
    and installed."""
    from cdsjax.io.parse.pymupdf import ocr_available, ocr_enabled  # read here, where a test can replace it

    ocr = doc.ocr or {}
    unread = (bool(ocr.get("no_text_pages")) and ocr.get("state") in ("unavailable", "off")) \
        or bool(ocr.get("unread_visuals"))
    return unread and ocr_enabled(config.ingest) and ocr_available()


def report_doc(doc: Doc, ctx: BuildContext) -> None:
    """Enrichment failures and OCR state of one finished document: counted, and one line each (figures and
    charts left unread for want of Tesseract: one line per run)."""
    from cdsjax.io.parse.pymupdf import ocr_enabled

    summary, log = ctx.summary, ctx.log
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
        if ctx.strict:
            raise IngestError(doc.path, f"VLM enrichment failed for {failed} of {len(doc.notes)} notes"
                              + (f" ({reasons})" if reasons else "") + " (--strict)")
    unread = (doc.ocr or {}).get("unread_visuals", 0)
    if unread and doc.source == "built" and ocr_enabled(ctx.config.ingest):  # "off": the user's choice, no warning
        if not summary.unread_visuals:  # one line per run, however many documents
            log("warning: Tesseract is not installed: the text inside figures and charts is not read (install "
                "tesseract-ocr, e.g. `make tools`; indexing the PDFs again then reads it)")
        summary.unread_visuals += unread
    n = (doc.ocr or {}).get("no_text_pages", 0)
    if n and doc.source == "built":
        state = doc.ocr.get("state")
        line = f"{doc.path}: {n} of {doc.num_pages} pages have no text layer; OCR: {state}"
        if state == "unavailable":
            line += " (install tesseract-ocr to read them; they are indexed as page images)"
        summary.ocr.append(line)
        log(("note: " if state == "done" else "warning: ") + line)


def copy_crops(doc: Doc, staging: Path) -> None:
    """Copies the document's stored crops into ``staging``, where its notes are redone (no link followed or
    made: :func:`storefiles.copy_inside`)."""
    if doc.crop_root is not None:
        storefiles.copy_inside(doc.crop_root, doc.crop_rel, staging)


def parse_doc(doc: Doc, config, crop_dir: Path, crop_rel: str, *, page_split: bool = True):
    """The document's elements, by the configured parser (``pymupdf`` or ``mineru``; ``page_split``: see
    :func:`~cdsjax.io.parse.pymupdf.parse_pdf`)."""
    parser = str(config.ingest.parser)
    if parser == "pymupdf":
        from cdsjax.io.parse import parse_pdf

        return parse_pdf(doc.path, doc.doc_id, config=config, crop_dir=crop_dir, crop_prefix=crop_rel,
                         page_split=page_split)
    if parser == "mineru":
        from cdsjax.io.parse.mineru import parse_with_mineru

        return parse_with_mineru(doc.path, doc.doc_id, config=config, crop_dir=crop_dir, crop_prefix=crop_rel)
    raise ValueError(f"config.ingest.parser must be 'pymupdf' or 'mineru', got {parser!r}")


def enrich_doc(doc: Doc, config, staging: Path):
    """Notes and links of one document: ``(notes, [E, 2] edges, failure reasons text)``."""
    from cdsjax.io.notes import edges_to_array, enrich_lite, structural_links

    elements = [e if isinstance(e, Element) else Element.from_dict(e) for e in doc.elements]
    notes = enrich_lite(elements, config)
    edges = structural_links(elements, window=int(config.enrich.window), proximity=float(config.enrich.proximity))
    mode = str(config.enrich.mode)
    reasons = ""
    if mode == "vlm":
        from cdsjax.io.reading.vlm import enrich_vlm_report

        notes, edges, report = enrich_vlm_report(notes, elements, edges, config=config, image_root=staging)
        reasons = report.reason_text()
    elif mode != "lite":
        raise ValueError(f"config.enrich.mode must be 'lite' or 'vlm', got {mode!r}")
    return notes, edges_to_array(edges), reasons
