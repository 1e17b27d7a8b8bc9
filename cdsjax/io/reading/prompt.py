"""The reader's request: the evidence as the reader sees it (:class:`EvidenceItem`), the one order of every
request (:func:`reading_order`), and the chat messages of a question over its evidence (:func:`build_messages`):
text notes as text, a table as its caption and rows, a figure or chart as its caption, summary and the text read
from its image, with its crop as a base64 ``image_url`` part where images go. Sends nothing
(:mod:`cdsjax.io.reading.reader` sends)."""

from __future__ import annotations

import base64
import dataclasses
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

TEXT_KINDS = ("text",)
VISUAL_KINDS = ("figure", "table", "chart")
KINDS = TEXT_KINDS + VISUAL_KINDS


@dataclasses.dataclass(frozen=True)
class EvidenceItem:
    """One selected note as the reader sees it (the pipeline fills these from the index).

    Attributes:
      note_id: the note's id in the index.
      doc_id: the document it comes from.
      page: 0-based page number (shown to the model 1-based, as people number pages).
      kind: "text", "figure", "table" or "chart".
      text: the note's text (a chunk, or a visual element's surrounding text).
      summary: the note's summary.
      caption: a visual element's caption.
      bbox: (x0, y0, x1, y1) in PDF points, origin top-left, or None.
      image_path: a PNG/JPEG crop of a visual element, or None (then only its text is sent).
      score: the selector's score, or None.
      rank: 1-based position in the selection, or None.
      ocr_text: a figure's, chart's or page image's text read from its image by OCR at index time ("" when none),
        shown as "Text read from the image".
      max_chars: the most characters of its text the prompt holds, when it was cut to fit the reader's token
        budget (:func:`fit_items`); None: ``max_text_chars`` alone.
    """

    note_id: str
    doc_id: str
    page: int
    kind: str = "text"
    text: str = ""
    summary: str = ""
    caption: str = ""
    bbox: Optional[tuple] = None
    image_path: Optional[str] = None
    score: Optional[float] = None
    rank: Optional[int] = None
    max_chars: Optional[int] = None
    ocr_text: str = ""

    @property
    def is_visual(self) -> bool:
        return self.kind in VISUAL_KINDS

    @classmethod
    def from_any(cls, item: Union["EvidenceItem", Mapping[str, Any]], where: str = "evidence") -> "EvidenceItem":
        """Accepts an EvidenceItem, or a dict / dataclass (an ingestion ``Element``, say) with the same keys;
        extra keys are ignored."""
        if dataclasses.is_dataclass(item) and not isinstance(item, (type, cls)):
            item = dataclasses.asdict(item)
        if isinstance(item, cls):
            out = item
        elif isinstance(item, Mapping):
            missing = [k for k in ("note_id", "doc_id", "page") if k not in item]
            if missing:
                raise ValueError(f"{where}: missing key(s) {', '.join(missing)}")
            names = {f.name for f in dataclasses.fields(cls)}
            values = {k: v for k, v in item.items() if k in names}
            for key in ("text", "summary", "caption", "ocr_text"):
                if values.get(key) is None:
                    values[key] = ""
            values["note_id"] = str(values["note_id"])
            values["doc_id"] = str(values["doc_id"])
            if values.get("image_path") is not None:
                values["image_path"] = str(values["image_path"])
            if values.get("bbox") is not None:
                values["bbox"] = tuple(float(v) for v in values["bbox"])
            out = cls(**values)
        else:
            raise TypeError(f"{where}: expected an EvidenceItem or a dict, got {type(item).__name__}")
        if out.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {out.kind!r}")
        if not isinstance(out.page, int) or isinstance(out.page, bool) or out.page < 0:
            raise ValueError(f"{where}: page must be a 0-based int, got {out.page!r}")
        return out


def as_evidence(evidence: Iterable[Union[EvidenceItem, Mapping[str, Any]]]) -> list:
    """Converts a sequence of EvidenceItems or dicts to a list of EvidenceItems, naming a bad entry."""
    if isinstance(evidence, (str, bytes, Mapping)):
        raise TypeError("evidence must be a sequence of EvidenceItems or dicts")
    return [EvidenceItem.from_any(e, where=f"evidence[{i}]") for i, e in enumerate(evidence)]


SYSTEM_PROMPT = """\
You answer questions about documents. The user gives you numbered pieces of evidence taken from the \
documents (text passages, and figures, tables and charts as images or as their captions and text), \
followed by a question.

- Base the answer on the evidence alone: no outside knowledge, no guessing.
- Answer with the content itself first: the value, name, list or short phrase the question asks for, \
written out. Never answer with evidence numbers alone: "The baselines are [2] and [3]." is not an answer; \
"The baselines are BERT and ELMo [2][3]." is.
- Then cite the evidence you used by its number in square brackets, right after the statement it \
supports, for example [2] or [1][4].
- Keep numbers, units, names and figure or table identifiers (such as "Figure 3" or "Table 2") exactly as \
the evidence writes them; read values off images carefully.
- If the evidence does not answer the question, reply with exactly: Not answerable
- Be brief: the answer first, then at most two sentences of justification."""
QUESTION_LINE = ("Answer in at most two sentences: the content itself first (a value, a name, a list or a short "
                 "phrase), then cite the evidence you used as [n].")
# After the question when it asks for an amount (:func:`asks_for_number`): a small reader otherwise tends to
# describe what the evidence shows and leave the figure out.
NUMBER_LINE = ("The question asks for a number: write that number, with its unit as the evidence gives it, in your "
               "first sentence.")
# "how much / many / long ...", "by how much", "what percentage / share / number / amount / rate ...", "which year":
# the question words that ask for an amount, a count or a date (a rule on the question's words alone)
_ASKS_NUMBER = re.compile(
    r"\b(how\s+(much|many|long|large|big|far|old|often|high|low|fast|tall|heavy)|by\s+what\s+(factor|margin|amount)|"
    r"what\s+(is\s+the\s+|was\s+the\s+|are\s+the\s+|were\s+the\s+)?(percent(age)?|share|proportion|fraction|"
    r"number|amount|rate|ratio|value|score|accuracy|size|count|total|sum|average|mean|median|price|cost|year|"
    r"increase|decrease|reduction|gain|improvement|difference)|(which|what)\s+year|in\s+what\s+year)\b",
    re.IGNORECASE)
# The second request after a reply that was no answer (markers only, echoed headers, a loop)
STRICT_LINE = ("Your reply must start with the answer itself, written out in words or numbers (a value, a name, a "
               "short phrase or \"Not answerable\"). Do not copy the evidence, its numbers or its headers; do not "
               "repeat yourself; write at most two sentences, then the [n] of the evidence you used.")


def asks_for_number(question: str) -> bool:
    """Whether ``question`` asks for an amount, a count or a year (``how much``, ``how many``, ``what percentage``,
    ``by how much``, ``which year``, ...): then the request adds :data:`NUMBER_LINE`."""
    return _ASKS_NUMBER.search(question or "") is not None


def reading_order(items: Sequence[EvidenceItem]) -> list:
    """The order of the evidence in every request: by document (its id), then page, then the note's place in its
    document (its id's numbers in natural order: ``doc#12`` after ``doc#9``; a PDF note's id ends in its reading
    order). Whatever order a selector ranked them in, the same notes make the same request; the rank decides
    only what fits the token budget (:meth:`Reader.fit`) and what goes first when a request is too long."""

    def key(item: EvidenceItem) -> tuple:
        pieces = re.split(r"(\d+)", item.note_id)  # text at even places, digits at odd ones
        return item.doc_id, item.page, tuple(int(p) if i % 2 else p for i, p in enumerate(pieces))

    return sorted(items, key=key)


def build_messages(
    question: str,
    evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
    *,
    max_text_chars: Optional[int] = 1500,
    missing_images: Optional[list] = None,
    images: bool = True,
    strict: bool = False,
) -> list:
    """Builds the chat messages for one question (reads image files, sends nothing).

    Args:
      question: the user's question.
      evidence: the selected notes, in the order the reader should see them; they are numbered [1], [2], ...
      max_text_chars: longest text kept per note (None keeps everything); a visual note's fields share this
        budget. A table goes as its caption and its rows (header kept, rows cut whole at the end with "… N more
        rows"); a figure or chart as its caption, summary and the text read from its image.
      missing_images: None raises on an evidence image that does not exist; a list makes such a note go as
        text (caption, summary and its text) and receives one warning line per missing image.
      images: False sends every visual note as text (caption, summary and its text), for a server that
        takes no images; no image file is read.
      strict: ask again after a reply that was no answer: :data:`STRICT_LINE` after the question.

    Returns:
      ``[system message, user message]``; the user message's content is a list of ``text`` and
      ``image_url`` parts (images as base64 data URLs).

    Raises:
      ValueError / TypeError: a bad question or evidence entry, naming it.
      FileNotFoundError: an evidence image that does not exist.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    items = as_evidence(evidence)
    parts: list = []
    lines = [f"Evidence ({len(items)} item{'s' if len(items) != 1 else ''}):" if items else
             "Evidence: none was found for this question."]
    for i, item in enumerate(items, start=1):
        header = f"[{i}] {item.kind} | document: {item.doc_id} | page {item.page + 1}"
        if not images and item.image_path is not None:
            item = dataclasses.replace(item, image_path=None)
        if item.is_visual and item.image_path is not None and missing_images is not None \
                and not Path(item.image_path).is_file():
            missing_images.append(f"evidence [{i}]: image file not found: {item.image_path}; sent as text instead")
            item = dataclasses.replace(item, image_path=None)
        if item.is_visual:
            body = note_text(item, max_text_chars)
            lines.append(header + ("\n" + body if body else ""))
            if item.image_path is not None:
                parts.append({"type": "text", "text": "\n\n".join(lines)})
                parts.append({"type": "image_url", "image_url": {"url": _data_url(item.image_path, i)}})
                lines = []
        else:
            lines.append(header + "\n" + note_text(item, max_text_chars))
    asks = [QUESTION_LINE] + ([NUMBER_LINE] if asks_for_number(question) else []) + ([STRICT_LINE] if strict else [])
    lines.append(f"Question: {question.strip()}\n\n" + "\n".join(asks))
    parts.append({"type": "text", "text": "\n\n".join(lines)})
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]


OCR_LABEL = "Text read from the image"
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")  # markdown's |---|---| line


def _visual_text(item: EvidenceItem, max_chars: Optional[int]) -> str:
    """A visual note's text: a table's caption and rows (not its summary, the same cells flattened); a figure's
    or chart's caption, summary (when it is more than the caption), its own text when no image goes with it,
    and :data:`OCR_LABEL`. The fields share ``max_chars``, in that order."""
    caption = item.caption.strip()
    if item.kind == "table" and item.text.strip():
        head = _cut(caption, max_chars) if caption else ""
        budget = None if max_chars is None else max(0, max_chars - len(head))
        rows = _table_rows(item.text, budget)
        return "\n".join(([f"Caption: {head}"] if head else []) + [f"Rows:\n{rows}"])
    fields = [("Caption", caption), ("Summary", item.summary.strip())]
    if fields[1][1] == fields[0][1]:
        fields = fields[:1]  # the lite summary of a figure is often its caption
    if item.image_path is None or not any(v for _, v in fields):
        fields.append(("Text", item.text.strip()))
    fields.append((OCR_LABEL, item.ocr_text.strip()))
    out = []
    budget = max_chars
    for name, value in fields:
        if not value:
            continue
        if budget is not None and budget <= 0:
            break
        cut = _cut(value, budget)
        out.append(f"{name}: {cut}")
        if budget is not None:
            budget -= len(cut)
    return "\n".join(out)


def _table_rows(text: str, max_chars: Optional[int]) -> str:
    """A table's rows within ``max_chars``: its header (the lines down to markdown's rule, else the first line)
    always, then whole rows from the top while they fit, and "… N more rows" for those left out."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    rule = next((i for i, line in enumerate(lines[:4]) if _TABLE_RULE.match(line)), None)
    n_head = 1 if rule is None else rule + 1
    head, rows = lines[:n_head], lines[n_head:]
    length = sum(len(line) + 1 for line in lines)
    if max_chars is None or length <= max_chars:
        return "\n".join(lines)
    room = max_chars - sum(len(line) + 1 for line in head) - len(f"… {len(rows)} more rows")
    kept = 0
    for row in rows:
        if len(row) + 1 > room:
            break
        room -= len(row) + 1
        kept += 1
    left = len(rows) - kept
    return "\n".join(head + rows[:kept] + [f"… {left} more row{'s' if left != 1 else ''}"])


def _cut(text: str, max_chars: Optional[int]) -> str:
    text = text.strip()
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[: max_chars - 1].rstrip() + "…"


_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                (b"GIF8", "image/gif"), (b"RIFF", "image/webp"))


def _data_url(path: str, number: int) -> str:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"evidence [{number}]: image file not found: {path}")
    data = file.read_bytes()
    mime = next((m for magic, m in _IMAGE_MAGIC if data.startswith(magic)), None)
    if mime is None:
        raise ValueError(f"evidence [{number}]: not a PNG/JPEG/GIF/WebP image: {path}")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def note_text(item: EvidenceItem, max_text_chars: Optional[int]) -> str:
    """A note's text as the reader's prompt holds it: at most ``max_text_chars`` characters, or the note's own
    ``max_chars`` where it was cut to fit the token budget."""
    if item.max_chars is not None:
        max_text_chars = item.max_chars if max_text_chars is None else min(max_text_chars, item.max_chars)
    return _visual_text(item, max_text_chars) if item.is_visual else _cut(item.text or item.summary, max_text_chars)
