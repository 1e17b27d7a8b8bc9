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

One module per job, around one :class:`~cdsjax.io.index.context.BuildContext`:

- :mod:`~cdsjax.io.index.context` — the build context, the per-document record, :class:`IndexSummary`;
- :mod:`~cdsjax.io.index.keys` — stage keys, document-cache keys and where the caches live;
- :mod:`~cdsjax.io.index.build` — :func:`build_index`: the locked build, the document set, publication;
- :mod:`~cdsjax.io.index.stages` — one document's parse, enrichment, embedding and cache commit;
- :mod:`~cdsjax.io.index.workers` — the process pool that builds documents in parallel;
- :mod:`~cdsjax.io.index.repair` — the previous index, checked against its hashes, reused or repaired;
- :mod:`~cdsjax.io.index.load` — :func:`load_index`, :func:`list_index`, :func:`verify_index`;
- :mod:`~cdsjax.io.index.single` — the single-PDF cache (:func:`index_pdf`, :func:`prebuild_documents`).
"""

from cdsjax.io.index.build import build_index, expand_paths
from cdsjax.io.index.context import BuildContext, IndexSummary, default_config
from cdsjax.io.index.keys import cache_root, doc_cache, entry_key, stage_keys
from cdsjax.io.index.load import CorpusIndex, list_index, load_index, verify_index
from cdsjax.io.index.single import index_pdf, prebuild_documents
from cdsjax.io.index.workers import EMBED_IN, build_documents, resolve_workers

__all__ = [
    "BuildContext", "CorpusIndex", "EMBED_IN", "IndexSummary", "build_documents", "build_index", "cache_root",
    "default_config", "doc_cache", "entry_key", "expand_paths", "index_pdf", "list_index", "load_index",
    "prebuild_documents", "resolve_workers", "stage_keys", "verify_index",
]
