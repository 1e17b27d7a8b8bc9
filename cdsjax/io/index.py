"""Build, cache and load a corpus index: PDFs -> elements -> notes -> embeddings -> one directory.

    from cdsjax.io.index import build_index, load_index, default_config
    summary = build_index(["a.pdf", "b.pdf"], "runs/index", config=default_config())
    corpus = load_index("runs/index")
    corpus.embeddings   # [n, d] float32, rows L2-normalised
    corpus.links        # [n, n] bool, symmetric, no self-links
    corpus.notes        # list of dicts (note_id, doc_id, page, bbox, kind, text, summary, ...)

Every document is keyed by the sha256 of its bytes plus stage keys (parser,
enrichment and embedder versions and settings). Re-building into the same
directory reuses every stage whose key is unchanged, so unchanged PDFs are not
re-processed; if nothing changed at all the directory is left untouched.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from cdsjax.io import store
from cdsjax.io.elements import Element, IngestError

_ROOT = Path(__file__).resolve().parents[2]


def default_config():
    """``configs/default.py``'s ``get_config()`` (loaded by path, so it works from any directory)."""
    path = _ROOT / "configs" / "default.py"
    if "configs.default" in sys.modules:
        return sys.modules["configs.default"].get_config()
    spec = importlib.util.spec_from_file_location("cdsjax_default_config", path)
    if spec is None or not path.exists():
        raise FileNotFoundError(f"default config not found at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


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
    reused: int = 0  # documents taken unchanged from the previous index
    processed: int = 0  # documents parsed/enriched/embedded in this run
    written: bool = False  # False when nothing changed and the index was left as it was
    failures: List[tuple] = dataclasses.field(default_factory=list)  # (path, reason)
    warnings: List[str] = dataclasses.field(default_factory=list)

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
    num_pages: int = 0
    elements: List[Element] = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)  # Note objects or dicts
    embeddings: Optional[np.ndarray] = None
    edges: Optional[np.ndarray] = None  # [E, 2] local indices
    crop_src: Optional[Path] = None  # crops to carry over from the previous index
    reused: str = ""  # "", "parse", "notes", "all"


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
) -> IndexSummary:
    """Indexes PDFs into ``out_dir`` (one corpus: the notes of all documents).

    Args:
      paths: PDF files and/or directories (searched recursively for ``*.pdf``).
      out_dir: the index directory; replaced atomically, cached stages reused.
      config: the full config (``configs/default.py``); None for the defaults.
      strict: stop at the first bad document (default ``config.index.strict``).
      progress: show progress bars on stderr.
      log: called with one line per skipped document or warning (default: nothing).

    Returns:
      an :class:`IndexSummary`; ``failures`` lists ``(path, reason)`` for documents that were skipped.

    Raises:
      IngestError: in strict mode, for the first bad document (nothing is written).
      store.StoreError: the output directory cannot be written.
    """
    from cdsjax.io.embed import Embedder
    from cdsjax.core import validate_embeddings

    config = default_config() if config is None else config
    strict = bool(config.index.strict) if strict is None else bool(strict)
    log = log or (lambda line: None)
    out_dir = Path(out_dir)
    summary = IndexSummary(out_dir=str(out_dir))
    seconds = collections.defaultdict(float)

    store.check_output_dir(out_dir)
    store.recover(out_dir)
    versions = _library_versions()
    embedder = Embedder(config)
    emb_info = embedder.info()
    keys = stage_keys(config, versions, emb_info)

    # ---- hash inputs, match against the previous index
    t0 = time.perf_counter()
    docs: List[_Doc] = []
    for path in expand_paths(paths):
        try:
            if not path.exists():
                raise IngestError(path, "no such file or directory")
            from cdsjax.io.parse import check_pdf_file

            check_pdf_file(path)
            docs.append(_Doc(path=path, sha=store.sha256_file(path)))
        except IngestError as err:
            _fail(summary, err, strict, log)
    _assign_doc_ids(docs)
    previous = _PreviousIndex.open(out_dir)
    seconds["hash"] += time.perf_counter() - t0

    staging = None
    try:
        staging = store.staging_dir(out_dir)
        # ---- parse
        t0 = time.perf_counter()
        kept: List[_Doc] = []
        for doc in _progress(docs, desc="parse", total=len(docs), enabled=progress):
            crop_rel = f"crops/{doc.sha[:16]}/"
            reuse = previous.lookup(doc, keys) if previous else ""
            if reuse:
                previous.fill(doc, reuse)
                doc.reused = reuse
                kept.append(doc)
                continue
            try:
                parsed = _parse(doc, config, staging / crop_rel, crop_rel)
            except IngestError as err:
                _fail(summary, err, strict, log)
                continue
            doc.num_pages = parsed.num_pages
            doc.elements = parsed.elements
            for w in parsed.warnings:
                summary.warnings.append(w)
                log(f"warning: {w}")
            if not doc.elements:
                _fail(summary, IngestError(doc.path, "no text, figures or tables found"), strict, log)
                continue
            kept.append(doc)
        seconds["parse"] += time.perf_counter() - t0

        # ---- notes
        t0 = time.perf_counter()
        for doc in _progress([d for d in kept if d.reused in ("", "parse")], desc="notes",
                             total=sum(d.reused in ("", "parse") for d in kept), enabled=progress):
            doc.notes, doc.edges = _enrich(doc, config, staging)
        seconds["notes"] += time.perf_counter() - t0

        # ---- embed (one batch over all documents that need it)
        t0 = time.perf_counter()
        todo = [d for d in kept if d.reused != "all"]
        if todo:
            from cdsjax.io.notes import embedding_text

            texts = [embedding_text(n) for d in todo for n in d.notes]
            vecs = embedder.encode_documents(texts, show_progress=progress)
            start = 0
            for d in todo:
                d.embeddings = vecs[start : start + len(d.notes)]
                start += len(d.notes)
        emb_info = embedder.info() if todo else (previous.manifest["embedder"] if previous else emb_info)
        seconds["embed"] += time.perf_counter() - t0

        if not kept:
            summary.seconds = dict(seconds)
            return summary

        # ---- assemble and write
        t0 = time.perf_counter()
        notes, elements, manifest_docs, emb_blocks, edge_blocks = [], [], [], [], []
        for d in kept:
            start = len(notes)
            notes.extend(n if isinstance(n, dict) else n.to_dict() for n in d.notes)
            elements.extend(e if isinstance(e, dict) else e.to_dict() for e in d.elements)
            emb_blocks.append(d.embeddings)
            edge_blocks.append(np.asarray(d.edges, np.int32).reshape(-1, 2) + start)
            manifest_docs.append(dict(doc_id=d.doc_id, path=str(d.path.absolute()), sha256=d.sha,
                                      num_pages=d.num_pages, num_elements=len(d.elements), num_notes=len(d.notes),
                                      note_start=start, keys=keys, crops=f"crops/{d.sha[:16]}/"))
            if d.crop_src is not None and d.crop_src.is_dir():
                for png in d.crop_src.iterdir():
                    store.link_or_copy(png, staging / "crops" / d.sha[:16] / png.name)
        embeddings = np.concatenate(emb_blocks, axis=0).astype(np.float32)
        edges = np.concatenate(edge_blocks, axis=0).astype(np.int32)
        validate_embeddings(embeddings, norm_atol=1e-3 if emb_info.get("normalize", True) else None)
        if len(notes) != embeddings.shape[0]:
            raise RuntimeError(f"internal error: {len(notes)} notes but {embeddings.shape[0]} embeddings")

        unchanged = (
            previous is not None
            and all(d.reused == "all" for d in kept)
            and [m["sha256"] for m in manifest_docs] == [m["sha256"] for m in previous.manifest["documents"]]
            and [m["doc_id"] for m in manifest_docs] == [m["doc_id"] for m in previous.manifest["documents"]]
        )
        if not unchanged:
            hashes = dict(
                notes=store.write_jsonl(staging / "notes.jsonl", notes),
                elements=store.write_jsonl(staging / "elements.jsonl", elements),
                arrays=store.arrays_digest(embeddings, edges),
            )
            store.save_arrays(staging / "arrays", embeddings, edges)
            manifest = dict(
                format_version=store.FORMAT_VERSION,
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                versions=versions,
                config=config.to_dict(),
                embedder=emb_info,
                keys=keys,
                documents=manifest_docs,
                counts=dict(notes=len(notes), links=int(edges.shape[0]), dim=int(embeddings.shape[1])),
                hashes=hashes,
            )
            store.write_manifest(staging, manifest)
            store.commit(staging, out_dir)
            staging = None
            summary.written = True
        seconds["write"] += time.perf_counter() - t0
    finally:
        if staging is not None:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)

    kinds = collections.Counter(e["kind"] if isinstance(e, dict) else e.kind for d in kept for e in d.elements)
    summary.documents = len(kept)
    summary.pages = sum(d.num_pages for d in kept)
    summary.elements_by_kind = dict(sorted(kinds.items()))
    summary.notes = len(notes)
    summary.links = int(edges.shape[0])
    summary.reused = sum(d.reused == "all" for d in kept)
    summary.processed = len(kept) - summary.reused
    summary.seconds = dict(seconds)
    return summary


def _fail(summary: IndexSummary, err: IngestError, strict: bool, log) -> None:
    summary.failures.append((err.path, err.reason))
    if strict:
        raise err
    log(f"error: {err.path}: {err.reason}")


def _assign_doc_ids(docs: List[_Doc]) -> None:
    """The file name, unless two different files share it (then name~sha8)."""
    names = collections.Counter(d.path.name for d in docs)
    for d in docs:
        d.doc_id = d.path.name if names[d.path.name] == 1 else f"{d.path.name}~{d.sha[:8]}"


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
    from cdsjax.io.notes import edges_to_array, enrich_lite, structural_links

    elements = [e if isinstance(e, Element) else Element.from_dict(e) for e in doc.elements]
    notes = enrich_lite(elements, config)
    edges = structural_links(elements, window=int(config.enrich.window), proximity=float(config.enrich.proximity))
    mode = str(config.enrich.mode)
    if mode == "vlm":
        from cdsjax.io.vlm import enrich_vlm

        notes, edges = enrich_vlm(notes, elements, edges, config=config, image_root=staging)
    elif mode != "lite":
        raise ValueError(f"config.enrich.mode must be 'lite' or 'vlm', got {mode!r}")
    return notes, edges_to_array(edges)


class _PreviousIndex:
    """The index already in ``out_dir``, read for stage reuse."""

    def __init__(self, root: Path, manifest: dict):
        self.root = root
        self.manifest = manifest
        self._notes = None
        self._elements = None
        self._arrays = None
        self.by_sha = {d["sha256"]: d for d in manifest["documents"]}

    @classmethod
    def open(cls, root: Path) -> Optional["_PreviousIndex"]:
        manifest = store.read_manifest(root)
        if manifest is None:
            return None
        return cls(root, manifest)

    def lookup(self, doc: _Doc, keys: dict) -> str:
        entry = self.by_sha.get(doc.sha)
        if entry is None:
            return ""
        old = entry.get("keys", {})
        if old.get("embed") == keys["embed"]:
            return "all"
        if old.get("notes") == keys["notes"]:
            return "notes"
        if old.get("parse") == keys["parse"]:
            return "parse"
        return ""

    def _load(self):
        if self._notes is None:
            self._notes = store.read_jsonl(self.root / "notes.jsonl")
            self._elements = store.read_jsonl(self.root / "elements.jsonl")
            self._arrays = store.load_arrays(self.root / "arrays")

    def fill(self, doc: _Doc, level: str) -> None:
        self._load()
        entry = self.by_sha[doc.sha]
        start, count = entry["note_start"], entry["num_notes"]
        doc.num_pages = entry["num_pages"]
        old_id = entry["doc_id"]
        elements = self._elements[start : start + count]
        doc.crop_src = self.root / entry["crops"]
        if old_id != doc.doc_id:
            elements = [dict(e, doc_id=doc.doc_id) for e in elements]
        doc.elements = elements
        if level in ("notes", "all"):
            notes = self._notes[start : start + count]
            doc.notes = [dict(n, doc_id=doc.doc_id, note_id=f"{doc.doc_id}#{n['reading_order']}") for n in notes] \
                if old_id != doc.doc_id else notes
            emb, edges = self._arrays
            sel = (edges[:, 0] >= start) & (edges[:, 0] < start + count)
            doc.edges = edges[sel] - start
        if level == "all":
            doc.embeddings = self._arrays[0][start : start + count]


# --------------------------------------------------------------------------- load


def load_index(directory, *, verify: bool = True) -> CorpusIndex:
    """Loads an index directory for retrieval.

    Args:
      directory: a directory written by :func:`build_index`.
      verify: check the notes file and arrays against the manifest's hashes.

    Raises:
      store.StoreError: missing or inconsistent index (one line naming the directory).
    """
    root = Path(directory)
    store.recover(root)
    manifest = store.read_manifest(root)
    if manifest is None:
        raise store.StoreError(f"{root}: not a cdsjax index (no readable manifest.json)")
    try:
        notes = store.read_jsonl(root / "notes.jsonl")
        embeddings, edges = store.load_arrays(root / "arrays")
    except Exception as err:
        raise store.StoreError(f"{root}: index is damaged ({type(err).__name__}: {err})") from None
    if verify:
        if store.sha256_file(root / "notes.jsonl") != manifest["hashes"]["notes"]:
            raise store.StoreError(f"{root}: notes.jsonl does not match the manifest hash")
        if store.arrays_digest(embeddings, edges) != manifest["hashes"]["arrays"]:
            raise store.StoreError(f"{root}: arrays do not match the manifest hash")
    n = len(notes)
    if embeddings.shape[0] != n:
        raise store.StoreError(f"{root}: {n} notes but {embeddings.shape[0]} embeddings")
    links = np.zeros((n, n), dtype=np.bool_)
    if edges.size:
        links[edges[:, 0], edges[:, 1]] = True
        links[edges[:, 1], edges[:, 0]] = True
    np.fill_diagonal(links, False)
    for note in notes:
        if note.get("image_path"):
            note["image_path"] = str((root / note["image_path"]).absolute())
    return CorpusIndex(embeddings=embeddings, links=links, notes=notes, manifest=manifest,
                       embedder=manifest["embedder"], root=root.absolute())


# --------------------------------------------------------------------------- single-PDF cache


def cache_root(config=None) -> Path:
    """Where single-PDF indexes live: ``config.index.cache_dir``, else $CDSJAX_CACHE, else ~/.cache/cdsjax."""
    configured = ""
    if config is not None and "index" in config and config.index.get("cache_dir"):
        configured = str(config.index.cache_dir)
    root = configured or os.environ.get("CDSJAX_CACHE") or str(Path.home() / ".cache" / "cdsjax")
    return Path(root).expanduser()


def index_pdf(pdf, *, config=None, cache_dir=None, progress: bool = False) -> CorpusIndex:
    """Indexes one PDF into the cache (once per content and settings) and loads it.

    Used by ``cdsjax ask PDF``. The cache directory is ``<cache>/<stem>-<sha256[:16]>``.

    Raises:
      IngestError: the PDF cannot be indexed.
    """
    from cdsjax.io.parse import check_pdf_file

    config = default_config() if config is None else config
    pdf = Path(pdf)
    if not pdf.exists():
        raise IngestError(pdf, "no such file or directory")
    check_pdf_file(pdf)
    sha = store.sha256_file(pdf)
    root = Path(cache_dir) if cache_dir is not None else cache_root(config)
    out = root / f"{pdf.stem[:60]}-{sha[:16]}"
    build_index([pdf], out, config=config, strict=True, progress=progress)
    return load_index(out)
