"""Reading an index: :func:`load_index` (hash-checked), :func:`list_index`, :func:`verify_index` (check and repair)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
import os
from typing import List, Tuple

import numpy as np

from cdsjax.io import store, storefiles
from cdsjax.io.index import schema
from cdsjax.io.index.build import build_index
from cdsjax.io.index.context import IndexSummary
from cdsjax.io.notes import described_notes


@dataclasses.dataclass
class CorpusIndex:
    """An index loaded for retrieval.

    Attributes:
      embeddings: ``[n, d]`` float32, rows L2-normalised (one per note).
      links: ``[n, n]`` bool, symmetric note-link adjacency (no self-links, no cross-document links).
      notes: n dicts: note_id, doc_id, page (0-based), bbox [x0, y0, x1, y1] (points, top-left origin),
        kind ("text" | "figure" | "table" | "chart"), role, text, summary, keywords, tags, caption,
        footnote, image_path (absolute path of the PNG crop inside the index, or None; ``image_sha256`` its
        recorded hash), reading_order, label; a caption (or Note/Source line) of a figure, table or chart also
        ``describes``: that visual's note_id (:func:`cdsjax.io.notes.described_notes`).
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
        return storefiles.read_jsonl(self.root / "elements.jsonl")

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
      storefiles.StoreError: missing or damaged index (one line naming the file, and how to repair it).
    """
    root = Path(directory)
    store.recover(root)
    manifest = store.read_manifest(root)
    if manifest is None:
        raise storefiles.StoreError(store.not_an_index(root))
    fix = f"; run `cdsjax index --verify {root}` to repair it"
    # the manifest's fields, counts and the files' sizes checked before anything is read or allocated from them
    count = schema.check_manifest(root / store.MANIFEST, manifest)
    pages = {d["doc_id"]: d["num_pages"] for d in manifest["documents"]}
    try:
        if verify:
            store.check_embedder_digest(root, manifest)
        schema.check_file_size(root / "notes.jsonl", (count + 1) * schema.MAX_NOTE_BYTES, f"{count} notes")
        notes = storefiles.read_jsonl_checked(root / "notes.jsonl", manifest["hashes"]["notes"] if verify else None)
        if len(notes) > schema.max_notes():
            raise storefiles.StoreError(schema.too_many_notes(root, len(notes)))
        schema.check_notes(root / "notes.jsonl", notes, pages)
        embeddings, edges = schema.load_arrays_checked(root / "arrays", manifest["hashes"].get("array_files"),
                                                      notes=len(notes))
        if verify and store.arrays_digest(embeddings, edges) != manifest["hashes"]["arrays"]:
            raise storefiles.StoreError(f"{root / 'arrays'}: damaged (content does not match its recorded sha256)")
    except storefiles.StoreError as err:
        raise storefiles.StoreError(f"{err}{fix}") from None
    except (KeyError, TypeError) as err:
        raise storefiles.StoreError(f"{root / store.MANIFEST}: damaged (no {err}){fix}") from None
    n = len(notes)
    if embeddings.shape[0] != n:
        raise storefiles.StoreError(f"{root}: {n} notes but {embeddings.shape[0]} embeddings{fix}")
    links = np.zeros((n, n), dtype=np.bool_)
    if edges.size:
        if edges.min() < 0 or edges.max() >= n:
            raise storefiles.StoreError(f"{root / 'arrays'}: damaged (link indices out of range){fix}")
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
    # a caption names the visual it describes (the default's read-out reads them together)
    for note, j in zip(notes, described_notes(notes)):
        if j >= 0:
            note["describes"] = notes[j]["note_id"]
    # every crop path resolved inside the index and checked against its recorded hash (refused otherwise)
    resolve_crops(root, notes, manifest.get("documents", []), verify=verify)
    return CorpusIndex(embeddings=embeddings, links=links, notes=notes, manifest=manifest,
                       embedder=manifest["embedder"], root=root.absolute())


def list_index(directory) -> List[dict]:
    """The documents of an index: doc_id, path, sha256, pages, notes, enrichment, OCR state (no hash checks)."""
    root = Path(directory)
    manifest = store.read_manifest(root)
    if manifest is None:
        raise storefiles.StoreError(store.not_an_index(root))
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
        raise storefiles.StoreError(store.not_an_index(root))
    return build_index([], root, config=config, log=log, wait=wait, strict=False)


def _expected_crops(documents: List[dict]) -> Tuple[dict, set]:
    """``({path relative to the index: sha256}, doc_ids with no recorded crop hashes)`` from a manifest."""
    expected, unhashed = {}, set()
    for d in documents or []:
        hashes = d.get("hashes") if isinstance(d, dict) else None
        if not isinstance(hashes, dict) or not isinstance(hashes.get("crops"), dict):
            unhashed.add(d.get("doc_id") if isinstance(d, dict) else None)
            continue
        prefix = str(d.get("crops") or "")
        for name, sha in hashes["crops"].items():
            expected[os.path.normpath(os.path.join(prefix, str(name)))] = sha
    return expected, unhashed


def resolve_crops(root: Path, notes: List[dict], documents: List[dict], *, verify: bool = True) -> None:
    """Resolves every note's ``image_path`` inside the index ``root`` (in place), checking it on the way.

    A note's path must be relative, stay inside ``root`` once every symlink is resolved, and name a crop
    the manifest lists; a crop that is present must be a regular file (not a link) with its recorded sha256
    (``verify``). A missing crop is tolerated (the reader sends that note as text). Each note gets the
    absolute ``image_path`` and ``image_sha256`` (what ``cdsjax serve`` checks again before serving it).

    Raises:
      storefiles.StoreError: a path that leaves the index or is not one of its crops (a crafted index), or a crop that
        does not match its hash (a damaged one).
    """
    root = Path(root).absolute()
    real_root = os.path.realpath(root)
    expected, unhashed = _expected_crops(documents)
    for note in notes:
        path = note.get("image_path")
        if not path:
            continue
        rel = os.path.normpath(str(path)) if isinstance(path, str) else ""
        if not rel or os.path.isabs(rel) or rel == ".." or rel.startswith(".." + os.sep) or "\x00" in rel:
            raise storefiles.StoreError(f"{root}: refusing the index: note {str(note.get('note_id'))[:80]!r} points outside "
                             "the index for its image")
        full = os.path.join(real_root, rel)
        real = os.path.realpath(full)
        if os.path.commonpath([real, real_root]) != real_root:
            raise storefiles.StoreError(f"{root}: refusing the index: the image of note {str(note.get('note_id'))[:80]!r} "
                             "resolves outside the index")
        sha = expected.get(rel)
        if sha is None and note.get("doc_id") not in unhashed:
            raise storefiles.StoreError(f"{root}: refusing the index: the image of note {str(note.get('note_id'))[:80]!r} "
                             "is not a crop its manifest lists")
        if os.path.lexists(full):
            if os.path.islink(full) or real != full or not os.path.isfile(full):
                raise storefiles.StoreError(f"{root / rel}: damaged (an image crop replaced by a link or a non-file)")
            schema.check_file_size(Path(full), schema.MAX_CROP_BYTES, "an image crop")  # before it is hashed
            if sha is None or verify:  # (no recorded hash: an index written before per-document crop hashes)
                try:
                    digest = storefiles.sha256_bytes(storefiles.read_inside(root, rel))
                except OSError as err:
                    raise storefiles.StoreError(f"{root / rel}: unreadable ({err.strerror or err})") from None
                if sha is not None and digest != sha:
                    raise storefiles.StoreError(f"{root / rel}: damaged (content does not match its recorded sha256)")
                sha = digest
        note["image_path"] = str(root / rel)
        note["image_sha256"] = sha
