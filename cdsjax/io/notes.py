"""Elements -> notes: summary, keywords, tags and links ("lite" enrichment, offline).

A note is what the retriever scores and the reader sees: one per element.
Lite enrichment uses no model: the summary is the element's own text (its
caption, or its leading sentences), keywords come from YAKE, and links come
from document structure:

- reading order: each note is linked to its ``window`` neighbours on each side;
- caption <-> figure/table: a caption note and the visual it describes;
- references: a note whose text says "Figure N" / "Table N" is linked to the
  visual element (and its caption) carrying that label;
- proximity: notes on the same page whose boxes are at most ``proximity`` points apart.

Links never cross documents. The embedded text is the note's place (document title and section heading,
:mod:`cdsjax.io.placement`), then ``summary + " keywords: " + ", ".join(keywords)`` (see :func:`embedding_text`).

:func:`described_notes` finds, among an index's notes, the figure, table or chart each caption note describes
(what :func:`cdsjax.io.index.load_index` records as a caption note's ``describes``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from cdsjax.defaults import DEFAULT_NOTE_CONTEXT
from cdsjax.io.elements import Element, Record, gap
from cdsjax.io.keywords import extract_keywords

NOTES_VERSION = "notes-2"  # notes-2: each note carries its document title and section (cdsjax.io.placement)

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
REFERENCE_RE = re.compile(r"\b(figure|fig\.|table|tab\.|chart|exhibit)\s*(\d+[a-z]?)\b", re.IGNORECASE)
_LABEL_NAMES = {"figure": "Figure", "fig.": "Figure", "table": "Table", "tab.": "Table", "chart": "Chart",
                "exhibit": "Exhibit"}


@dataclasses.dataclass
class Note(Record):
    """One retrievable unit. ``bbox`` is in PDF points (origin top-left), ``page`` 0-based."""

    note_id: str
    doc_id: str
    page: int
    bbox: List[float]
    kind: str  # "text" | "figure" | "table" | "chart"
    text: str
    summary: str = ""
    keywords: List[str] = dataclasses.field(default_factory=list)
    tags: List[str] = dataclasses.field(default_factory=list)
    caption: str = ""
    footnote: str = ""
    image_path: Optional[str] = None
    reading_order: int = -1
    role: str = "body"
    label: str = ""
    # how the summary/keywords/tags were written: "lite" (no model), "vlm" (the VLM described it), or
    # "lite-fallback" (the VLM was asked and failed: lite values kept, retried on the next run)
    enrichment: str = "lite"
    ocr_text: str = ""  # a figure's, chart's or page image's text read by OCR (Element.ocr_text); not embedded
    title: str = ""  # the document's title, as read from its first page (cdsjax.io.placement); "" when none
    section: str = ""  # the section heading above the note in reading order; "" before the first


def embedding_text(note, context: bool = DEFAULT_NOTE_CONTEXT) -> str:
    """The text that is embedded for a note: its place (document title, section: :mod:`cdsjax.io.placement`;
    with ``context``, the index's ``config.relevance.context``, off by default), its summary, then its keywords."""
    from cdsjax.io.placement import placed_text

    get = note.get if isinstance(note, dict) else lambda k, d=None: getattr(note, k, d)
    keywords = get("keywords") or []
    summary = get("summary") or get("text") or ""
    text = f"{summary} keywords: {', '.join(keywords)}" if keywords else summary
    return placed_text(text, get("title"), get("section")) if context else text


# Element fields a note carries unchanged (the bbox is copied as a new list).
_COPIED_FIELDS = ("doc_id", "page", "kind", "text", "caption", "footnote", "image_path", "reading_order", "role",
                  "label", "ocr_text")


def notes_from_elements(elements: Sequence[Element]) -> List[Note]:
    """One note per element, with everything structural copied over (no enrichment yet)."""
    return [Note(note_id=f"{el.doc_id}#{el.reading_order}", bbox=list(el.bbox),
                 **{name: getattr(el, name) for name in _COPIED_FIELDS}) for el in elements]


# --------------------------------------------------------------------------- lite enrichment


def lite_summary(el: Element, max_chars: int) -> str:
    """A summary from the element's own text: the caption for visuals, else leading sentences."""
    if el.kind == "text":
        return leading_sentences(el.text, max_chars)
    parts = []
    if el.caption:
        parts.append(el.caption)
    elif el.label:
        parts.append(el.label)
    if el.footnote:
        parts.append(el.footnote)
    inner = " ".join(el.text.replace("|", " ").split())
    if inner:
        parts.append(inner)
    if not parts and el.context:
        # no caption and no text: the sentences right around the element say what it shows
        before, _, after = el.context.partition("[...]")
        parts.append(" ".join([_last_sentences(before, max_chars // 2), leading_sentences(after, max_chars // 2)]))
    if not parts:
        parts.append(f"{el.kind} on page {el.page + 1}")
    return leading_sentences(" ".join(parts), max_chars)


def leading_sentences(text: str, max_chars: int) -> str:
    """Whole sentences from the start of ``text`` up to ``max_chars`` (at least one, cut if longer)."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    out = ""
    for sentence in SENTENCE_END.split(text):
        if out and len(out) + 1 + len(sentence) > max_chars:
            break
        out = f"{out} {sentence}" if out else sentence
    return out[:max_chars].rstrip()


def _last_sentences(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    out = ""
    for sentence in reversed(SENTENCE_END.split(text)):
        if out and len(out) + 1 + len(sentence) > max_chars:
            break
        out = f"{sentence} {out}" if out else sentence
    return out[-max_chars:].lstrip()


KEYWORDS_SPLIT_MIN = 24  # notes from which the layout helper (if one runs) computes keywords too


def enrich_lite(elements: Sequence[Element], config) -> List[Note]:
    """Lite notes: summary, keywords and tags from each element's own text (no model)."""
    cfg = config.enrich
    notes = notes_from_elements(elements)
    sources = []
    for note, el in zip(notes, elements):
        note.summary = lite_summary(el, int(cfg.summary_chars))
        sources.append(note.summary if el.kind != "text" else el.text)
        note.tags = [el.kind] + ([el.role] if el.role not in (el.kind, "body") else []) + (
            [el.label] if el.label else []
        )
    top, language = int(cfg.num_keywords), cfg.keyword_language

    def keywords(text: str) -> List[str]:
        return extract_keywords(text, top=top, language=language)

    found = None
    if len(sources) >= KEYWORDS_SPLIT_MIN:  # YAKE is most of this function's time: shared with the layout helper
        from cdsjax.io.parse.layout_split import keywords_in_helper

        found = keywords_in_helper(sources, top, language, keywords)
    for note, words in zip(notes, found if found is not None else map(keywords, sources)):
        note.keywords = words
    from cdsjax.io.placement import place

    title, sections = place(elements)
    for note, section in zip(notes, sections):
        note.title, note.section = title, section
    return notes


# --------------------------------------------------------------------------- structural links


def structural_links(elements: Sequence[Element], *, window: int = 1, proximity: float = 24.0) -> Set[Tuple[int, int]]:
    """Candidate links between the elements of ONE document, as index pairs ``(i, j)`` with ``i < j``.

    Args:
      elements: one document's elements, indexed by position.
      window: reading-order neighbours linked on each side.
      proximity: same-page boxes at most this many points apart are linked.
    """
    edges: Set[Tuple[int, int]] = set()

    def add(i: int, j: int) -> None:
        if i != j:
            edges.add((min(i, j), max(i, j)))

    order = sorted(range(len(elements)), key=lambda i: elements[i].reading_order)
    for pos, i in enumerate(order):
        for step in range(1, window + 1):
            if pos + step < len(order):
                add(i, order[pos + step])

    by_order = {el.reading_order: i for i, el in enumerate(elements)}
    for i, el in enumerate(elements):
        if el.role in ("caption", "footnote") and el.parent in by_order:
            add(i, by_order[el.parent])

    labelled: Dict[str, List[int]] = {}
    for i, el in enumerate(elements):
        if el.label:
            labelled.setdefault(el.label.lower(), []).append(i)
    if labelled:
        for i, el in enumerate(elements):
            for m in REFERENCE_RE.finditer(el.text):
                name = _LABEL_NAMES.get(m.group(1).lower(), m.group(1).title())
                for j in labelled.get(f"{name} {m.group(2)}".lower(), []):
                    add(i, j)

    by_page: Dict[int, List[int]] = {}
    for i, el in enumerate(elements):
        by_page.setdefault(el.page, []).append(i)
    for idx in by_page.values():
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                i, j = idx[a], idx[b]
                if gap(elements[i].bbox, elements[j].bbox) <= proximity:
                    add(i, j)
    return edges


def edges_to_array(edges: Iterable[Tuple[int, int]]):
    """Sorted ``[E, 2]`` int32 array of undirected edges (``i < j``)."""
    import numpy as np

    arr = np.array(sorted(edges), dtype=np.int32).reshape(-1, 2)
    return arr


# --------------------------------------------------------------------------- what a caption describes

# the role of a note that describes a visual -> the visual's field that holds its text
DESCRIBING_ROLES = {"caption": "caption", "footnote": "footnote"}
VISUAL_KINDS = ("figure", "table", "chart")


def described_notes(notes: Sequence[dict]) -> List[int]:
    """For each note dict, the position of the figure, table or chart it describes, -1 for none.

    A note with ``role`` ``"caption"`` (or ``"footnote"``: a Note/Source line) describes the visual note of its
    document and page whose ``caption`` (``footnote``) holds its text, whitespace aside -- parsing copies a
    caption's text into the visual it ties it to (:mod:`cdsjax.io.parse`, :mod:`cdsjax.io.parse.mineru`) -- the nearest
    in reading order if several do. Other notes describe nothing.
    """
    out = [-1] * len(notes)
    visuals: Dict[tuple, List[int]] = {}
    for j, note in enumerate(notes):
        if note.get("kind") in VISUAL_KINDS:
            visuals.setdefault((str(note.get("doc_id")), note.get("page")), []).append(j)
    if not visuals:
        return out
    for i, note in enumerate(notes):
        field = DESCRIBING_ROLES.get(note.get("role"))
        text = " ".join(str(note.get("text") or "").split())
        if field is None or not text:
            continue
        hits = [j for j in visuals.get((str(note.get("doc_id")), note.get("page")), ())
                if text in " ".join(str(notes[j].get(field) or "").split())]
        if hits:
            here = _order(note, i)
            out[i] = min(hits, key=lambda j: (abs(_order(notes[j], j) - here), j))
    return out


def _order(note: dict, position: int) -> int:
    order = note.get("reading_order")
    return order if isinstance(order, int) and order >= 0 else position
