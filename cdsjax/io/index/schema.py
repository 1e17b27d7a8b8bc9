"""What an index's manifest and notes may hold, checked before anything is read or allocated from them.

An index is untrusted input (a colleague's folder, a downloaded release): its manifest and note rows are
checked against the types and ranges below (:func:`check_manifest`, :func:`check_notes`), its files' sizes
against what the manifest's counts allow before they are read (:func:`check_file_size`), and its arrays'
recorded shapes against those counts before they are restored (:func:`check_array_shapes`; :func:`load_arrays_checked`
runs these checks, then restores the arrays). Each failure is a one-line :class:`~cdsjax.io.storefiles.StoreError`
naming the file and the field.

An index holds at most :func:`max_notes` notes (``CDSJAX_MAX_NOTES``, default :data:`DEFAULT_MAX_NOTES`): a
question's selection builds ``[n, n]`` matrices of the whole corpus (the note links, the payoff and its
note block: about 4 n² bytes each), so the cap bounds a question's memory to a few hundred MB; a larger
collection is served as several indexes of its documents, each under the cap.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from cdsjax.io import store
from cdsjax.io.storefiles import StoreError, check_crops
from cdsjax.io.util import one_line

DEFAULT_MAX_NOTES = 10_000
MAX_PAGES = 100_000  # a document's pages (a note's page index is below its document's count)
MAX_DIM = 8_192  # an embedding's width
MAX_COORD = 1e7  # a bbox coordinate, in points
MAX_NOTE_BYTES = 1 << 20  # one line of notes.jsonl (a note's text, summary and caption)
MAX_CROP_BYTES = 64 << 20  # one image crop (a padded PNG of a figure or table, a few hundred kB)
ARRAY_OVERHEAD_BYTES = 1 << 20  # an array checkpoint's files beyond the raw bytes of its arrays
_STRING_FIELDS = ("note_id", "doc_id", "kind", "text", "summary", "caption", "footnote", "role", "label",
                  "enrichment", "title", "section")


def max_notes() -> int:
    """The most notes an index (and the corpus of a question) may hold: ``CDSJAX_MAX_NOTES`` or the default."""
    value = os.environ.get("CDSJAX_MAX_NOTES", "")
    try:
        return int(value) if value.strip() else DEFAULT_MAX_NOTES
    except ValueError:
        return DEFAULT_MAX_NOTES


def too_many_notes(where, n: int) -> str:
    """The one line refusing ``n`` notes."""
    return (f"{where}: {n} notes, more than the {max_notes()} an index may hold (a question's memory grows with "
            f"the square of the note count); split the documents over several indexes, or raise "
            f"CDSJAX_MAX_NOTES on a machine with the memory for it")


def _whole(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _finite(value, bound: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and abs(value) <= bound)


def check_manifest(path: Path, manifest) -> int:
    """Checks a manifest's fields that loading reads; returns its note count (the documents' ``num_notes``).

    Raises:
      StoreError: one line naming the field (``path: damaged (...)``), or the note count over :func:`max_notes`.
    """
    def bad(what: str) -> StoreError:
        return StoreError(f"{path}: damaged ({what})")

    if not isinstance(manifest, dict):
        raise bad("not a JSON object")
    hashes = manifest.get("hashes")
    if not isinstance(hashes, dict) or not isinstance(hashes.get("notes"), str) \
            or not isinstance(hashes.get("arrays"), str):
        raise bad("hashes is not an object with the notes' and arrays' sha256")
    files = hashes.get("array_files")
    if files is not None and not (isinstance(files, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise bad("hashes.array_files is not an object of file names and sha256")
    if not isinstance(manifest.get("embedder"), dict):
        raise bad("embedder is not an object")
    documents = manifest.get("documents")
    if not isinstance(documents, list):
        raise bad("documents is not a list")
    total = 0
    for i, d in enumerate(documents):
        if not isinstance(d, dict):
            raise bad(f"document {i} is not an object")
        if not isinstance(d.get("doc_id"), str) or not d["doc_id"]:
            raise bad(f"document {i}: doc_id is not a name")
        for field in ("num_pages", "num_notes"):
            if not _whole(d.get(field), 0, MAX_PAGES if field == "num_pages" else 1 << 40):
                raise bad(f"document {i}: {field} {_echo(d.get(field))} is not a count")
        for field in ("hashes", "ocr", "enrichment"):
            if d.get(field) is not None and not isinstance(d[field], dict):
                raise bad(f"document {i}: {field} is not an object")
        crops = (d.get("hashes") or {}).get("crops")
        if crops is not None and not (isinstance(crops, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in crops.items())):
            raise bad(f"document {i}: hashes.crops is not an object of file names and sha256")
        pages = (d.get("ocr") or {}).get("pages")
        if pages is not None and not (isinstance(pages, list) and all(_whole(p, 0, MAX_PAGES) for p in pages)):
            raise bad(f"document {i}: ocr.pages is not a list of page numbers")
        total += d["num_notes"]
    if total > max_notes():
        raise StoreError(too_many_notes(path.parent, total))
    return total


def check_notes(path: Path, notes: List[dict], pages: dict) -> None:
    """Checks each note row's fields that retrieval reads (``pages``: each document's page count).

    Raises:
      StoreError: one line naming the line of ``path`` and the field.
    """
    for number, note in enumerate(notes, start=1):
        def bad(what: str) -> StoreError:
            return StoreError(f"{path}: damaged (line {number}: {what})")

        for field in _STRING_FIELDS:
            if note.get(field) is not None and not isinstance(note[field], str):
                raise bad(f"{field} is not a string")
        if not note.get("note_id"):
            raise bad("no note_id")
        if note.get("doc_id") not in pages:
            raise bad("doc_id is not a document of the manifest")
        if not _whole(note.get("page"), 0, max(pages[note["doc_id"]] - 1, 0)):
            raise bad(f"page {_echo(note.get('page'))} is not a page of its document")
        bbox = note.get("bbox")
        if bbox is not None and not (isinstance(bbox, list) and len(bbox) == 4
                                     and all(_finite(v, MAX_COORD) for v in bbox)):
            raise bad(f"bbox {_echo(bbox)} is not four finite coordinates")
        if note.get("reading_order") is not None and not _whole(note["reading_order"], -1, 1 << 40):
            raise bad("reading_order is not a whole number")
        if note.get("image_path") is not None and not isinstance(note["image_path"], str):
            raise bad("image_path is not a string")
        for field in ("keywords", "tags"):
            value = note.get(field)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise bad(f"{field} is not a list of strings")


def check_file_size(path: Path, limit: int, what: str) -> None:
    """Refuses (one line) a file larger than ``limit`` bytes before it is read (a sparse file of many GB
    recorded by its hash would otherwise be read whole at every load); a missing file passes (the caller
    reports it)."""
    try:
        size = os.lstat(path).st_size
    except OSError:
        return
    if size > limit:
        raise StoreError(f"{path}: damaged ({size} bytes, more than the {limit} {what} may hold)")


def check_array_files(directory: Path, files: Optional[dict], n: int, dim_limit: int = MAX_DIM) -> None:
    """Refuses array files whose sizes add up to more than ``n`` notes' embeddings and links can take."""
    if not files:
        return
    limit = 2 * (n * dim_limit * 4 + (n * n + 1) * 8) + ARRAY_OVERHEAD_BYTES
    total = 0
    for name in files:
        try:
            total += os.lstat(Path(directory) / name).st_size
        except OSError:
            continue
    if total > limit:
        raise StoreError(f"{directory}: damaged (its files hold {total} bytes, more than {n} notes' arrays take)")


def check_array_shapes(directory: Path, shapes: dict, n: int) -> None:
    """Refuses a checkpoint whose recorded shapes (``{name: (shape, dtype)}``, read from its metadata) are not
    ``embeddings`` float32 ``[n, d]`` and ``link_edges`` int32 ``[E + 1, 2]`` with ``E <= n (n - 1) / 2``."""
    emb, edges = shapes.get("embeddings"), shapes.get("link_edges")
    if emb is None or edges is None:
        raise StoreError(f"{directory}: damaged (no embeddings or link edges recorded)")
    (emb_shape, emb_dtype), (edge_shape, edge_dtype) = emb, edges
    if len(emb_shape) != 2 or emb_shape[0] != n or not 1 <= emb_shape[1] <= MAX_DIM or emb_dtype != "float32":
        raise StoreError(f"{directory}: damaged (embeddings recorded as {emb_dtype} {list(emb_shape)}, "
                         f"float32 [{n}, d <= {MAX_DIM}] expected)")
    if len(edge_shape) != 2 or edge_shape[1] != 2 or not 1 <= edge_shape[0] <= n * (n - 1) // 2 + 1 \
            or edge_dtype != "int32":
        raise StoreError(f"{directory}: damaged (link edges recorded as {edge_dtype} {list(edge_shape)}, "
                         f"at most {n * (n - 1) // 2 + 1} int32 pairs expected)")


def load_arrays_checked(directory: Path, files: Optional[dict] = None,
                        notes: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`cdsjax.io.store.load_arrays` after the checks above, any failure (missing or truncated files) a
    :class:`StoreError`.

    Args:
      files: ``{relative path: sha256}`` of the checkpoint's files (:func:`~cdsjax.io.storefiles.crop_hashes` of
        the directory, recorded at write time); when given, every file is checked before orbax reads any of them.
      notes: the note count the manifest records; when given, the files' sizes (before they are hashed) and
        the arrays' recorded shapes (before anything is allocated) must fit it.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise StoreError(f"{directory}: missing (the index's arrays are gone)")
    if notes is not None:  # sizes before anything is hashed or read
        check_array_files(directory, files, notes)
    # orbax opens the files by name: first, no link anywhere in the arrays folder (and, when recorded, hashes)
    bad = check_crops(directory.parent, directory.name, files or {})
    if bad:
        raise StoreError(bad.replace("(image crop)", "(array file)"))
    try:
        if notes is not None:
            check_array_shapes(directory, store.array_shapes(directory), notes)
        return store.load_arrays(directory)
    except StoreError:
        raise
    except Exception as err:  # orbax/tensorstore raise many types for truncated or missing files
        raise StoreError(f"{directory}: damaged ({type(err).__name__}: {one_line(err, 160)})") from None


def _echo(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
