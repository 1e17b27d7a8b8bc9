"""What one index build run carries around: the run's settings and state, each document, the summary."""

from __future__ import annotations

import collections
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, DefaultDict, Dict, List, Optional

import numpy as np

from cdsjax.config import get_config
from cdsjax.io import doccache

if TYPE_CHECKING:  # the embedder module imports torch lazily; the type is for readers only
    from cdsjax.io.embed import Embedder


def default_config():
    """The default configuration (:func:`cdsjax.config.get_config`; ``configs/default.py`` re-exports it)."""
    return get_config()


def quiet(line: str) -> None:
    """A log that drops every line (the default of every ``log`` argument)."""


@dataclasses.dataclass
class IndexSummary:
    """What :func:`~cdsjax.io.index.build_index` did."""

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
    unread_visuals: int = 0  # figures and charts whose image text was not read (Tesseract missing)

    @property
    def ok(self) -> bool:
        return not self.failures and self.documents > 0


@dataclasses.dataclass
class BuildContext:
    """Everything the stages of one build run share, passed as one object instead of a dozen arguments.

    The settings (``config`` .. ``embed_in``) are fixed when the run starts; ``embedder``, ``keys`` and
    ``versions`` once the run knows which embedder it uses (its own, or the previous index's when it only
    removes or repairs); ``summary`` and ``seconds`` fill in as documents finish. A worker process builds its
    own context around the config, cache and embedder it was started with.

    Attributes:
      config: the full config (``configs/default.py``).
      cache: the shared document cache every finished document is committed to.
      log: called with one line per skipped document, repair or warning.
      strict: stop at the first bad document or enrichment failure.
      progress: show progress bars on stderr.
      workers: documents built at once, each in its own process (>= 1).
      embed_in: with several workers, where notes are embedded: ``"parent"`` or ``"worker"``.
      ray: None builds here (or in ``workers`` processes); a string builds on Ray
        (:mod:`cdsjax.io.index.on_ray`): a cluster's address, or "" for a local Ray.
      embedder: the :class:`~cdsjax.io.embed.Embedder` of this run.
      keys: this run's stage keys (:func:`~cdsjax.io.index.keys.stage_keys`).
      versions: library versions recorded in the manifest.
      summary: what the run did so far.
      seconds: time per stage (hash, parse, notes, embed, write).
      on_prepared: called with each document once it is parsed and enriched, on the thread that parses, while
        its notes are embedded on another (``cdsjax ask NEW.pdf`` compiles its selector there meanwhile);
        documents built in worker processes or on Ray do not call it.
      page_split: a long document's layout analysed by this process and the layout helper at once (default);
        False: by this process alone (:func:`~cdsjax.io.parse.pymupdf.parse_pdf`).
    """

    config: Any
    cache: doccache.DocCache
    log: Callable[[str], None] = quiet
    strict: bool = False
    progress: bool = False
    workers: int = 1
    embed_in: str = "parent"
    ray: Optional[str] = None
    embedder: Optional["Embedder"] = None
    keys: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    summary: IndexSummary = dataclasses.field(default_factory=lambda: IndexSummary(out_dir=""))
    seconds: DefaultDict[str, float] = dataclasses.field(default_factory=lambda: collections.defaultdict(float))
    on_prepared: Optional[Callable[["Doc"], None]] = None
    page_split: bool = True


@dataclasses.dataclass
class Doc:
    """One document of a build run: where it comes from, its stage keys, and (once filled) its rows."""

    path: Path
    sha: str
    doc_id: str = ""
    resolved: str = ""  # the file ``path`` named when it was hashed (every symlink resolved); "" when unknown
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

    def fill_from_entry(self, entry: dict) -> None:
        """Takes the rows of a document-cache entry (:meth:`doccache.DocCache.read`)."""
        meta = entry["meta"]
        self.num_pages = int(meta.get("num_pages", 0))
        self.ocr = meta.get("ocr") or {}
        self.enrichment = meta.get("enrichment") or {}
        self.enrichment_reasons = meta.get("enrichment_reasons") or ""
        self.elements = entry["elements"]
        self.notes = entry["notes"]
        self.embeddings = entry["embeddings"]
        self.edges = entry["edges"]
        self.crop_root = entry["root"]
        self.rename_rows()

    def rename_rows(self) -> None:
        """Rewrites doc_id / note_id of stored rows when the document has another id in this index."""
        if self.notes and field_of(self.notes[0], "doc_id") != self.doc_id:
            self.notes = [dict(n, doc_id=self.doc_id, note_id=f"{self.doc_id}#{n['reading_order']}")
                          for n in self.notes]
            self.elements = [dict(e, doc_id=self.doc_id) for e in self.elements]


def field_of(obj, name: str):
    """``obj[name]`` of a stored row, or ``obj.name`` of a Note/Element object (None when absent)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


class ProgressBar:
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
