"""Side effects at the edge: PDF parsing, notes, embedding, the index store, model clients.

Kept light on purpose: importing :mod:`cdsjax.io` loads no torch, pymupdf,
sentence-transformers or openai. Import the submodules you need:

- :mod:`cdsjax.io.parse` — PDF -> elements, a package: the PyMuPDF parser with pymupdf4llm's layout analysis
  (``parse.pymupdf``, ``parse.layout``, ``parse.layout_split``), MinerU / magic-pdf output directories
  (``parse.mineru``) and what both share (``parse.common``);
- :mod:`cdsjax.io.elements` — the elements parsers return, and their box geometry;
- :mod:`cdsjax.io.notes` — elements -> notes (lite enrichment and structural links);
- :mod:`cdsjax.io.reading` — the reader wing: the reader, its prompt and replies, evidence fitting, the judge,
  VLM enrichment, the one OpenAI-compatible chat client (``reading.llm``) and llama.cpp on this machine
  (``reading.local``);
- :mod:`cdsjax.io.embed` — :class:`~cdsjax.io.embed.Embedder` (sentence-transformers);
- :mod:`cdsjax.io.index` — ``build_index`` (add/update/remove documents of an index) / ``load_index`` /
  ``verify_index`` / ``list_index`` / ``index_pdf`` (a package: keys, build, stages, workers, repair, load,
  single-PDF cache, around one ``BuildContext``);
- :mod:`cdsjax.io.store` — the on-disk index, the writer lock and the shared document cache.
- :mod:`cdsjax.io.memory` — how the ingestion processes use the C allocator (fewer page faults);
- :mod:`cdsjax.io.child` — child processes: start, not outliving the parent, wait until ready, stop;
- :mod:`cdsjax.io.util` — the cores this process may use, a free port, a message on one line.
"""

from cdsjax.io.elements import IngestError

__all__ = ["IngestError"]
