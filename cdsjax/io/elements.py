"""Elements (what a parser finds on a page) and the box geometry shared by parsers and notes.

Boxes are ``[x0, y0, x1, y1]`` in PDF points with the origin at the top-left of
the page (PyMuPDF's convention); pages are 0-based.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

KINDS = ("text", "figure", "table", "chart")
VISUAL_KINDS = ("figure", "table", "chart")


class IngestError(Exception):
    """A document that cannot be indexed, reported as one line naming the file and the reason."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason

    def __reduce__(self):  # so it crosses a process boundary (parallel ingestion)
        return (type(self), (self.path, self.reason))


class Record:
    """Dict round trip of a dataclass record (elements and notes are stored as JSON)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """The record from a dict; keys that are not fields (from a newer or older version) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclasses.dataclass
class Element(Record):
    """One unit of evidence found in a document.

    Attributes:
      doc_id: document id (the PDF's file name unless it collides in the corpus).
      page: 0-based page index.
      bbox: ``[x0, y0, x1, y1]`` in PDF points, origin top-left.
      kind: "text" | "figure" | "table" | "chart".
      role: finer label: "body" (text chunk), "caption", "footnote" (a visual's Note/Source line),
        "page-image" (a page without text layer), or the visual kind.
      text: the element's own text (chunk text; for visuals: the text inside the box / table cells).
      reading_order: position in the document's reading order (0-based, unique within a document).
      caption, footnote: for visual elements, the caption and footnote text ("" if none).
      context: for visual elements, up to ``context_words`` words of body text before and after.
      image_path: PNG crop, relative to the index directory (visual elements only).
      boxes: the blocks a text chunk was cut from (each a bbox on ``page``).
      label: "Figure 3" / "Table 2" parsed from the caption, "" if none.
      parent: for a caption/footnote, the reading_order of the visual element it describes (-1 otherwise).
      ocr_text: for a figure, chart or page image, the text Tesseract read in its crop ("" when none was read:
        no Tesseract, OCR off, or the box's text layer already holds its words, see :mod:`cdsjax.io.parse.pymupdf`).
    """

    doc_id: str
    page: int
    bbox: List[float]
    kind: str
    text: str
    reading_order: int = -1
    role: str = "body"
    caption: str = ""
    footnote: str = ""
    context: str = ""
    image_path: Optional[str] = None
    boxes: List[List[float]] = dataclasses.field(default_factory=list)
    label: str = ""
    parent: int = -1
    ocr_text: str = ""


def union(boxes: Sequence[Sequence[float]]) -> List[float]:
    """The smallest box containing all ``boxes`` (at least one)."""
    return [
        float(min(b[0] for b in boxes)),
        float(min(b[1] for b in boxes)),
        float(max(b[2] for b in boxes)),
        float(max(b[3] for b in boxes)),
    ]


def area(b: Sequence[float]) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def intersection(a: Sequence[float], b: Sequence[float]) -> float:
    return area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    inter = intersection(a, b)
    denom = area(a) + area(b) - inter
    return inter / denom if denom > 0 else 0.0


def inside_fraction(a: Sequence[float], b: Sequence[float]) -> float:
    """The share of box ``a``'s area that lies inside box ``b``."""
    aa = area(a)
    return intersection(a, b) / aa if aa > 0 else 0.0


def gap(a: Sequence[float], b: Sequence[float]) -> float:
    """Distance in points between two boxes (0 when they touch or overlap)."""
    dx = max(0.0, max(a[0], b[0]) - min(a[2], b[2]))
    dy = max(0.0, max(a[1], b[1]) - min(a[3], b[3]))
    return (dx * dx + dy * dy) ** 0.5


def horizontal_overlap(a: Sequence[float], b: Sequence[float]) -> float:
    """Overlap of the x-extents, as a share of the narrower box."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    narrow = min(a[2] - a[0], b[2] - b[0])
    return inter / narrow if narrow > 0 else 0.0
