"""How a selected note is shown: the evidence of ``cdsjax ask --json`` and the metadata the LangChain and
LlamaIndex adapters return are built here, from the same fields, so one note reads the same everywhere.

* :func:`note_fields` — document, page (0-based), bbox (PDF points, top-left origin, or None), kind, image
  path, summary and caption of an index note;
* :func:`evidence_item` — one ``evidence`` entry of an :class:`~cdsjax.pipeline.Answer` (rank, score, the
  fields, the shown text cut to :data:`SNIPPET_CHARS`);
* :func:`note_metadata` — the metadata of a returned document or node (the fields, ``note_id``, ``crop``, a
  caption's ``describes`` and, when known, score, rank, selector and diagnostics);
* :func:`note_text` — the text a note stands for (its caption for a figure, table or chart that has one).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

SNIPPET_CHARS = 1500


def note_fields(note: dict) -> Dict[str, Any]:
    """The fields every view of an index note shows (see the module docstring)."""
    bbox = note.get("bbox")
    return dict(document=note.get("doc_id"), page=int(note.get("page", 0)),
                bbox=[float(v) for v in bbox] if bbox is not None else None, kind=note.get("kind", "text"),
                image_path=note.get("image_path"), summary=note.get("summary") or "",
                caption=note.get("caption") or "")


def shown_text(note: dict) -> str:
    """The text ``ask`` shows for a note: its caption for a non-text note that has one, else its text."""
    if note.get("kind", "text") != "text" and note.get("caption"):
        return note["caption"]
    return note.get("text") or ""


def note_text(note: dict) -> str:
    """The text a note stands for in a framework (document text, node text): :func:`shown_text`, or its summary
    when it has no text."""
    return str(shown_text(note) or note.get("summary") or "")


def evidence_item(note: dict, *, rank: int, score: float, index: Optional[str] = None) -> Dict[str, Any]:
    """One evidence entry of ``cdsjax ask --json`` and of the server's answers (keys in the order the JSON shows
    them); ``index``: the name of the index that holds the note's document."""
    f = note_fields(note)
    return dict(rank=rank, score=float(score), document=f["document"], index=index, page=f["page"], bbox=f["bbox"],
                kind=f["kind"], text=shown_text(note)[:SNIPPET_CHARS], note_id=note.get("note_id"),
                image_path=f["image_path"], summary=f["summary"], caption=f["caption"])


def note_metadata(note: dict, *, score: Optional[float] = None, rank: Optional[int] = None,
                  selector: Optional[str] = None, diagnostics: Optional[dict] = None) -> Dict[str, Any]:
    """The metadata of one returned note (the fields of ``cdsjax ask --json`` evidence).

    Keys: note_id, the :func:`note_fields` (document, page, bbox, kind, image_path, summary, caption), crop (the
    PNG crop of a visual note, or None), describes on a caption note (the note_id of the figure, table or chart it
    describes: the default selector reads them together, given both), and when known score, rank (1-based),
    selector and diagnostics (the solver's, ``{}`` for baselines).
    """
    f = note_fields(note)
    out = dict(note_id=str(note.get("note_id")), document=f["document"], page=f["page"], bbox=f["bbox"],
               kind=f["kind"], image_path=f["image_path"], crop=f["image_path"], summary=f["summary"],
               caption=f["caption"])
    if note.get("describes"):
        out["describes"] = str(note["describes"])
    if score is not None:
        out["score"] = float(score)
    if rank is not None:
        out["rank"] = int(rank)
    if selector is not None:
        out["selector"] = selector
    if diagnostics is not None:
        out["diagnostics"] = dict(diagnostics)
    return out
