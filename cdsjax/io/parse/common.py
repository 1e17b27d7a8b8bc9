"""What the PyMuPDF and MinerU parsers share: the parsed document, opening and checking a PDF, body text cut
into chunks, caption labels, charts told from figures, crops, the words around a visual and caption parents."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import List, Optional, Tuple

from cdsjax.io.elements import Element, IngestError, union
from cdsjax.io.parse.layout import Region, import_pymupdf
from cdsjax.io.util import one_line

LABEL_RE = re.compile(
    r"^\s*(figure|fig\.?|table|tab\.?|chart|exhibit|graph)\s*(\d+[a-z]?|[ivx]+)\b", re.IGNORECASE
)
CHART_WORDS = re.compile(
    r"\b(chart|graph|plot|histogram|bar|bars|curve|trend|axis|distribution|percent|share of)\b", re.IGNORECASE
)
NUMBER_RE = re.compile(r"^[-+$€£(]?\d[\d,.]*%?\)?$")


@dataclasses.dataclass
class ParsedDocument:
    """What a parser returns for one PDF."""

    elements: List[Element]
    num_pages: int
    warnings: List[str]
    no_text_pages: List[int] = dataclasses.field(default_factory=list)  # 0-based pages without a text layer
    ocr: str = "not needed"  # "not needed" | "done" | "failed" | "unavailable" | "off"
    unread_visuals: int = 0  # figures and charts whose image text OCR did not read (no Tesseract, or OCR off)


# --------------------------------------------------------------------------- checks


def check_pdf_file(path: Path) -> None:
    """Raises :class:`IngestError` unless ``path`` is a readable, complete-looking PDF file."""
    if not path.exists():
        raise IngestError(path, "no such file")
    if not path.is_file():
        raise IngestError(path, "not a regular file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(1024)
            f.seek(max(0, size - 2048))
            tail = f.read()
    except OSError as err:
        raise IngestError(path, f"cannot read file ({err.strerror or err})") from None
    if size == 0:
        raise IngestError(path, "empty file")
    if b"%PDF-" not in head:
        raise IngestError(path, "not a PDF (no %PDF- header)")
    if b"%%EOF" not in tail:
        raise IngestError(path, "truncated or corrupt PDF (no %%EOF marker at the end)")


def _open_by_name_or_bytes(pymupdf, path: Path):
    """``pymupdf.open`` of ``path``; a name that is not valid UTF-8 (MuPDF cannot open it by name) is opened
    from the file's bytes instead."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        with open(path, "rb") as f:
            return pymupdf.open(stream=f.read(), filetype="pdf")
    return pymupdf.open(str(path), filetype="pdf")


DEFAULT_MAX_PAGES = 2000  # config.ingest.max_pages


def open_pdf(path: Path, max_pages: int = DEFAULT_MAX_PAGES):
    """Opens a PDF with PyMuPDF; raises :class:`IngestError` for corrupt, encrypted or empty files, and for
    one of more than ``max_pages`` pages (``config.ingest.max_pages``, ``--max-pages``)."""
    pymupdf = import_pymupdf()

    check_pdf_file(path)
    shown = pymupdf.TOOLS.mupdf_display_errors()
    pymupdf.TOOLS.mupdf_display_errors(False)  # MuPDF's own stderr lines would break "one line per file"
    try:
        doc = _open_by_name_or_bytes(pymupdf, path)
    except Exception as err:  # MuPDF raises several types for broken files
        raise IngestError(path, f"corrupt PDF ({one_line(err)})") from None
    finally:
        pymupdf.TOOLS.mupdf_display_errors(shown)
    if doc.needs_pass or doc.is_encrypted:
        doc.close()
        raise IngestError(path, "encrypted PDF (a password is required)")
    try:
        num_pages = doc.page_count
    except Exception as err:
        doc.close()
        raise IngestError(path, f"corrupt PDF ({one_line(err)})") from None
    if num_pages == 0:
        doc.close()
        raise IngestError(path, "PDF has zero pages")
    if max_pages and num_pages > max_pages:
        doc.close()
        raise IngestError(path, f"PDF has {num_pages} pages, more than the limit of {max_pages} (--max-pages)")
    return doc


# --------------------------------------------------------------------------- chunks, labels, crops


def text_splitter(cfg):
    """LangChain's ``RecursiveCharacterTextSplitter`` of ``config.ingest``'s ``chunk_size`` and ``chunk_overlap``
    characters: a parser makes one per document and hands it to :func:`chunk_page` for each page."""
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    return RecursiveCharacterTextSplitter(chunk_size=int(cfg.chunk_size), chunk_overlap=int(cfg.chunk_overlap),
                                          add_start_index=True)


def chunk_page(doc_id, pno, body: List[Region], cfg, splitter=None) -> List[Tuple[int, int, Element]]:
    """Splits a page's body text into chunks with ``splitter`` (None: :func:`text_splitter` of ``cfg``); each
    chunk keeps the boxes it came from."""
    if not body:
        return []
    splitter = text_splitter(cfg) if splitter is None else splitter
    sep = "\n\n"
    spans = []  # (start, end, region)
    pieces = []
    pos = 0
    for r in body:
        spans.append((pos, pos + len(r.text), r))
        pieces.append(r.text)
        pos += len(r.text) + len(sep)
    page_text = sep.join(pieces)
    out = []
    for doc in splitter.create_documents([page_text]):
        text = doc.page_content
        start = int(doc.metadata.get("start_index", -1))
        if start < 0:
            start = max(0, page_text.find(text))
        end = start + len(text)
        covered = [r for s, e, r in spans if s < end and e > start]
        if not covered or not text.strip():
            continue
        boxes = [list(r.bbox) for r in covered]
        el = Element(doc_id, pno, union(boxes), "text", text, role="body", boxes=boxes)
        out.append((covered[0].order, 2, el))
    return out


def normal_label(m: re.Match) -> str:
    word = m.group(1).lower().rstrip(".")
    name = {"fig": "Figure", "figure": "Figure", "tab": "Table", "table": "Table", "chart": "Chart",
            "exhibit": "Exhibit", "graph": "Graph"}[word]
    return f"{name} {m.group(2)}"


def looks_like_chart(v: Element) -> bool:
    """A heuristic: a picture is a chart if its caption says so or it carries many numeric labels."""
    if v.caption and CHART_WORDS.search(v.caption):
        return True
    tokens = v.text.split()
    numbers = sum(1 for t in tokens if NUMBER_RE.match(t))
    return numbers >= 4 and numbers >= 0.25 * max(1, len(tokens))

def write_crop(page, el: Element, crop_dir: Path, prefix: str, cfg) -> Optional[str]:
    pymupdf = import_pymupdf()

    pad = float(cfg.crop_padding)
    rect = pymupdf.Rect(el.bbox[0] - pad, el.bbox[1] - pad, el.bbox[2] + pad, el.bbox[3] + pad) & page.rect
    if rect.is_empty or rect.width < 2 or rect.height < 2:
        return None
    pix = page.get_pixmap(clip=rect, dpi=int(cfg.crop_dpi), alpha=False)
    name = f"p{el.page:04d}-e{el.reading_order:05d}.png"
    pix.save(str(crop_dir / name))
    return f"{prefix}{name}" if prefix else name


def attach_context(visual_pos, words: List[str], n: int) -> None:
    """Sets each visual's ``context``: the ``n`` document words before and after its position."""
    for el, pos in visual_pos:
        before = " ".join(words[max(0, pos - n) : pos])
        after = " ".join(words[pos : pos + n])
        el.context = (before + " [...] " + after).strip() if (before or after) else ""


def resolve_parents(elements: List[Element]) -> None:
    """Turns the temporary ``id()`` parent references of captions/footnotes into reading-order indices."""
    by_id = {id(e): e.reading_order for e in elements}
    for e in elements:
        if e.parent != -1:
            e.parent = by_id.get(e.parent, -1)
