"""Cache keys and places: which stages of a cached document are current, and where documents are cached."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from cdsjax.io import doccache
from cdsjax.io import storefiles


def library_versions() -> dict:
    """Versions of the libraries whose output an index holds (recorded in the manifest; some key stages)."""
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
    parse_key = storefiles.sha256_json(
        dict(parser=parser, parser_version=PARSER_VERSION, pymupdf=versions.get("pymupdf"),
             pymupdf4llm=versions.get("pymupdf4llm"), splitter=versions.get("langchain-text-splitters"),
             ingest={k: v for k, v in ingest.items() if k not in ("mineru_command", "max_pages")})
    )
    enrich = config.enrich.to_dict()
    enrich.pop("vlm_api_key", None)
    enrich.pop("concurrency", None)
    if enrich.get("mode") != "vlm":
        enrich = {k: v for k, v in enrich.items() if not k.startswith("vlm") and k not in (
            "evolution_rounds", "verify_links", "max_text_chars", "max_tokens", "timeout", "max_retries")}
    notes_key = storefiles.sha256_json(dict(parse=parse_key, notes_version=NOTES_VERSION, yake=versions.get("yake"),
                                       enrich=enrich))
    emb = {k: v for k, v in embedder_info.items() if k != "dim"}
    from cdsjax.io.relevance import settings_of

    # the embedded text's form: notes with their place (cdsjax.io.placement, its version) or without
    from cdsjax.io.placement import PLACEMENT_VERSION

    placed = {"context": PLACEMENT_VERSION if settings_of(config)["context"] else False}
    embed_key = storefiles.sha256_json(dict(notes=notes_key, embedder=emb, **placed))
    return dict(parse=parse_key, notes=notes_key, embed=embed_key)


def entry_key(sha: str, keys: dict) -> str:
    """The document-cache key: the PDF's sha256 and the last stage key (which chains all the others)."""
    return storefiles.sha256_json(dict(pdf=sha, embed=keys["embed"]))


def array_digest(a: np.ndarray) -> str:
    """sha256 of an array's bytes (C order): the per-document hash of its embeddings and links."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def cache_root(config=None) -> Path:
    """The cdsjax cache directory: ``config.index.cache_dir``, else $CDSJAX_CACHE, else ~/.cache/cdsjax.

    Created 0700 when missing; one owned by another user or writable by its group or others is refused
    (:func:`cdsjax.io.private.private_cache_dir`, a one-line :class:`storefiles.StoreError`)."""
    from cdsjax.io.private import default_cache_dir, private_cache_dir

    if config is not None and "index" in config and config.index.get("cache_dir"):
        return private_cache_dir(Path(str(config.index.cache_dir)).expanduser())
    return private_cache_dir(default_cache_dir())


def doc_cache(config) -> doccache.DocCache:
    """The document cache shared by every index and by ``ask PDF``: ``<cache_root>/docs``."""
    return doccache.DocCache(cache_root(config) / "docs")
