"""What a pipeline searches: loaded indexes merged into one note set (:class:`Corpus`), refused with one line
(:class:`~cdsjax.pipeline.errors.PipelineError`) where they cannot be searched together, and the embedder check an
index passes before its model is loaded (:func:`checked_embedder`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence

import numpy as np

from cdsjax.io.embed import EmbedderError, check_embedder, embedder_key
from cdsjax.pipeline.errors import PipelineError


@dataclasses.dataclass
class Corpus:
    """What retrieval needs from one or more indexes, merged into one note set.

    Attributes:
      embeddings: ``[n, d]`` float32, L2-normalised.
      links: ``[n, n]`` bool note-link adjacency (block diagonal across indexes).
      notes: n note dicts (note_id, doc_id, page, bbox, kind, text, summary, caption, image_path, ...).
      embedder: the embedder info shared by every index (model, prefixes, normalisation).
      roots: the index directories.
      index_of: document id -> the name of the index that holds it (:func:`cdsjax.io.store.index_name`).
    """

    embeddings: np.ndarray
    links: np.ndarray
    notes: List[dict]
    embedder: dict
    roots: List[str]
    index_of: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._positions = {n.get("note_id"): i for i, n in enumerate(self.notes)}

    def __len__(self) -> int:
        return len(self.notes)

    def note_index(self, note_id) -> int:
        """Row of the note with this id in ``embeddings`` / ``notes``."""
        return self._positions[note_id]

    @classmethod
    def merge(cls, indexes: Sequence[Any]) -> "Corpus":
        """Merges loaded :class:`~cdsjax.io.index.CorpusIndex` objects (same embedder required)."""
        if not indexes:
            raise PipelineError("no index to search")
        info = embedder_key(indexes[0].embedder)
        for idx in indexes[1:]:
            if embedder_key(idx.embedder) != info:
                raise PipelineError(
                    f"indexes were embedded with different models ({indexes[0].embedder.get('model')} vs "
                    f"{idx.embedder.get('model')}); re-index them with one embedder"
                )
        check_ids_apart(indexes)
        n = sum(len(idx.notes) for idx in indexes)
        from cdsjax.io.index.schema import max_notes, too_many_notes
        from cdsjax.io.store import index_name

        if n > max_notes():  # a question's work holds [n, n] matrices of the whole corpus
            raise PipelineError(too_many_notes("the indexes together", n))
        links = np.zeros((n, n), bool)
        notes: List[dict] = []
        start = 0
        for idx in indexes:
            k = len(idx.notes)
            links[start : start + k, start : start + k] = idx.links
            notes.extend(idx.notes)
            start += k
        embeddings = np.concatenate([np.asarray(idx.embeddings, np.float32) for idx in indexes])
        return cls(embeddings=embeddings, links=links, notes=notes, embedder=dict(indexes[0].embedder),
                   roots=[str(idx.root) for idx in indexes],
                   index_of={str(n.get("doc_id")): index_name(idx.root) for idx in indexes for n in idx.notes})


def check_ids_apart(indexes: Sequence[Any]) -> None:
    """Raises :class:`PipelineError` (one line naming both indexes) when two loaded indexes share a document id
    or a note id, or one index repeats a note id.

    Notes, crops and PDFs are looked up by these ids (the reader's evidence, ``/crop?note=``,
    ``/pdf?document=``): a collision would let one index's text or image stand in for the other's, so it is
    refused rather than resolved. Two PDFs of the same name kept apart belong in one index, where the second
    gets the id ``name~<sha8>``."""
    docs: Dict[str, int] = {}
    notes: Dict[Any, int] = {}
    roots = [str(getattr(idx, "root", "?")) for idx in indexes]

    def refuse(first: int, i: int, what: str) -> None:
        both = f"{roots[first]!r} and {roots[i]!r} together" if first != i else repr(roots[i])
        raise PipelineError(f"refusing to load {both}: {what}")

    for i, idx in enumerate(indexes):
        ids = {str(n.get("doc_id")) for n in idx.notes}
        ids |= {str(d.get("doc_id")) for d in idx.manifest.get("documents", []) if isinstance(d, dict)}
        for doc in sorted(ids):
            first = docs.setdefault(doc, i)
            if first != i:
                refuse(first, i, f"both hold a document with the id {doc[:80]!r}; index those PDFs into one "
                                 "index (the second gets a distinct id), or load one of them")
        for note in idx.notes:
            note_id = note.get("note_id")
            if note_id in notes:
                refuse(notes[note_id], i, f"the note id {str(note_id)[:80]!r} appears twice "
                                          "(cdsjax gives every note of a corpus its own id)")
            notes[note_id] = i


def checked_embedder(info: dict, *, allowed: Sequence[str] = (), trust_remote_code: bool = False) -> dict:
    """An index's embedder info if cdsjax may load that model (:func:`cdsjax.io.embed.check_embedder`),
    with ``trust_remote_code`` set to the caller's choice; else a one-line :class:`PipelineError`."""
    try:
        return check_embedder(info, allowed=allowed, trust_remote_code=trust_remote_code)
    except EmbedderError as err:
        raise PipelineError(str(err)) from None
