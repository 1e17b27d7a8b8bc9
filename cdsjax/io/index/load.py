"""Reading an index: :func:`load_index` (hash-checked), :func:`list_index`, :func:`verify_index` (check and repair)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List

import numpy as np

from cdsjax.io import store
from cdsjax.io.index.build import build_index
from cdsjax.io.index.context import IndexSummary


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


def load_index(directory, *, verify: bool = True) -> CorpusIndex:
    """Loads an index directory for retrieval.

    Args:
      directory: a directory written by :func:`~cdsjax.io.index.build_index`.
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
        if note.get("image_path"):
            note["image_path"] = str((root / note["image_path"]).absolute())
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
