"""PDF -> elements with PyMuPDF and its layout analysis (pymupdf4llm).

pymupdf4llm labels each page region (text, list-item, section-header, title,
caption, footnote, picture, table, page-header/footer, formula) and puts the
regions in reading order. From that we build:

- text chunks: the body regions of a page joined in reading order and split
  with LangChain's ``RecursiveCharacterTextSplitter`` (``chunk_size`` /
  ``chunk_overlap`` characters). Chunks do not cross pages, so each has one page
  and a box (the union of the regions it was cut from, kept in ``boxes``);
- captions: their own text elements (``role="caption"``), tied to the figure or
  table they describe (``parent``);
- visual elements (figure, table, chart): a padded PNG crop, the caption, the
  footnote below, the text inside the box, and ``context_words`` words of body
  text on each side in reading order.

Page headers and footers are left out. A page with no text layer (a scanned
page) and no detected picture becomes one full-page figure, so it stays
retrievable as an image; when Tesseract is installed (and
``config.ingest.use_ocr`` is not "off") the page is also read with OCR through
PyMuPDF (``Page.get_textpage_ocr``) and its text becomes ordinary text chunks.
One warning per document says how many pages had no text layer and whether OCR
read them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from cdsjax.io.elements import Element, IngestError, gap, horizontal_overlap, union
from cdsjax.io.layout import (OCR_DPI, OCR_LANGUAGE, SPINNING, TextLayer, Region,  # noqa: F401  (re-exported)
                              import_pymupdf, limit_layout_threads, read_text_layer)
from cdsjax.io.layout_split import layout_pages

PARSER_VERSION = "pymupdf-1"

SKIPPED_CLASSES = {"page-header", "page-footer"}
LABEL_RE = re.compile(
    r"^\s*(figure|fig\.?|table|tab\.?|chart|exhibit|graph)\s*(\d+[a-z]?|[ivx]+)\b", re.IGNORECASE
)
# a text region that starts like this is a caption ("Figure 2: ...", "Table 3. ..."), not a sentence
# that merely begins with a reference ("Table 1 lists ...")
CAPTION_START_RE = re.compile(
    r"^\s*(figure|fig\.?|table|tab\.?|chart|exhibit|graph)\s*(\d+[a-z]?|[ivx]+)\s*[:.|\u2013\u2014-]",
    re.IGNORECASE,
)
FOOTNOTE_RE = re.compile(r"^\s*(notes?|sources?)\s*[:.]|^\s*\*", re.IGNORECASE)
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


@functools.lru_cache(maxsize=1)
def ocr_available() -> bool:
    """True when Tesseract and its language data can be used by PyMuPDF."""
    if shutil.which("tesseract") is None:
        return False
    pymupdf = import_pymupdf()

    try:
        return bool(pymupdf.get_tessdata())
    except Exception:  # no tessdata directory found
        return False


def ocr_enabled(cfg) -> bool:
    """``config.ingest.use_ocr``: "auto" (default: OCR when Tesseract is installed) or "off"."""
    return str(cfg.get("use_ocr", "auto")).strip().lower() not in ("off", "false", "0", "no", "none")


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


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:200]


# --------------------------------------------------------------------------- parsing


def parse_pdf(path, doc_id: str, *, config, crop_dir: Path, crop_prefix: str = "") -> ParsedDocument:
    """Parses one PDF into elements.

    Args:
      path: the PDF.
      doc_id: id stored on every element.
      config: the full config (``config.ingest`` is read).
      crop_dir: directory that receives the PNG crops (created if needed).
      crop_prefix: path prefix recorded in ``Element.image_path`` (relative to the index directory).

    Raises:
      IngestError: the file is not a usable PDF, or parsing failed.
    """
    import_pymupdf()  # MuPDF loaded before pymupdf4llm, the layout models with limited sessions

    path = Path(path)
    cfg = config.ingest
    doc = open_pdf(path, int(cfg.get("max_pages", DEFAULT_MAX_PAGES)))
    warnings: List[str] = []
    no_text_pages: List[int] = []
    ocr_failed = 0
    use_ocr = ocr_enabled(cfg) and ocr_available()
    try:
        elements: List[Element] = []
        words: List[str] = []  # body words of the whole document, in reading order
        visual_pos: List[Tuple[Element, int]] = []
        crop_dir = Path(crop_dir)
        crop_dir.mkdir(parents=True, exist_ok=True)
        walked = 0  # pages turned into elements so far (in page order)

        def walk(start: int, page_regions: List[List[Region]]) -> None:
            """Turns pages ``start, start + 1, ...`` into elements and crops, in page order."""
            nonlocal walked, ocr_failed
            for pno, regions in enumerate(page_regions, start):
                assert pno == walked
                page = doc[pno]
                page_rect = [float(v) for v in page.rect]
                # the helper probed (and read with OCR) the pages it analysed; this process does the rest
                layer = layers.pop(pno, None) or read_text_layer(page, start=len(regions), use_ocr=use_ocr)
                has_text = layer.has_text
                if not has_text:
                    no_text_pages.append(pno)
                    regions = regions + layer.ocr
                    ocr_failed += layer.ocr_failed
                page_elements, stream, no_text = _page_elements(doc_id, pno, regions, page_rect, cfg,
                                                                has_text=has_text)
                # reading-order walk: body words advance the context cursor, visuals record where they sit
                for item in stream:
                    if isinstance(item, Element):
                        visual_pos.append((item, len(words)))
                    else:
                        words.extend(item)
                for el in page_elements:
                    el.reading_order = len(elements)
                    elements.append(el)
                    if el.kind != "text":
                        el.image_path = write_crop(page, el, crop_dir, crop_prefix, cfg)
                walked += 1

        # the pages this process analysed are walked while the layout helper (if any) still works
        layers: Dict[int, TextLayer] = {}
        pages = layout_pages(doc, path, on_pages=walk, use_ocr=use_ocr, text_layers=layers)
        walk(walked, pages[walked:])
        attach_context(visual_pos, words, int(cfg.context_words))
        resolve_parents(elements)
        ocr = "not needed"
        if no_text_pages:
            ocr = ("failed" if ocr_failed == len(no_text_pages) else "done") if use_ocr else (
                "unavailable" if ocr_enabled(cfg) else "off")
            line = f"{path}: {len(no_text_pages)} of {len(pages)} pages have no text layer; OCR: {ocr}"
            if ocr_failed and ocr != "failed":
                line += f" (failed on {ocr_failed} pages)"
            if ocr == "unavailable":
                line += " (install tesseract-ocr to read them; they are indexed as page images)"
            warnings.append(line)
        return ParsedDocument(elements=elements, num_pages=len(pages), warnings=warnings,
                              no_text_pages=no_text_pages, ocr=ocr)
    except IngestError:
        raise
    except Exception as err:
        raise IngestError(path, f"parsing failed ({type(err).__name__}: {one_line(err)})") from None
    finally:
        doc.close()


def _page_elements(doc_id, pno, regions: List[Region], page_rect, cfg, *, has_text: bool):
    """Turns one page's regions into elements (not yet numbered)."""
    min_area = float(cfg.min_visual_area)
    visuals: List[Tuple[int, Element]] = []
    captions: List[Tuple[int, Region]] = []
    body: List[Region] = []
    footnotes: List[Region] = []
    for r in regions:
        if r.cls in SKIPPED_CLASSES:
            continue
        if r.cls == "picture":
            if _area(r.bbox) < min_area:
                continue
            kind = "figure"  # may become "chart" below, once its caption is known
            visuals.append((r.order, Element(doc_id, pno, r.bbox, kind, r.text, role=kind)))
        elif r.cls == "table":
            text = r.table_md or r.text
            visuals.append((r.order, Element(doc_id, pno, r.bbox, "table", text, role="table")))
        elif r.cls == "caption" or (r.cls == "text" and CAPTION_START_RE.match(r.text) and len(r.text) < 800):
            captions.append((r.order, r))
        else:
            if r.cls == "footnote" or FOOTNOTE_RE.match(r.text):
                footnotes.append(r)
            if r.text:
                body.append(r)

    # captions -> the nearest visual above/below with overlapping x-extent
    caption_elements: List[Tuple[int, Element]] = []
    for order, cap in captions:
        label_match = LABEL_RE.match(cap.text)
        label = normal_label(label_match) if label_match else ""
        target = _nearest_visual(cap.bbox, [v for _, v in visuals], prefer_table=label.startswith("Table"))
        if target is None and label.startswith("Table"):
            # the layout model often reads a rule-less table as a text block: promote the tabular
            # block right below (or above) a "Table N" caption that found no table
            region = _tabular_neighbour(cap.bbox, body)
            if region is not None:
                body.remove(region)
                target = Element(doc_id, pno, region.bbox, "table", region.text, role="table")
                visuals.append((region.order, target))
        # "Note: ..." / "Source: ..." lines under a chart are its footnote, not its caption
        is_note = not label and bool(FOOTNOTE_RE.match(cap.text))
        el = Element(doc_id, pno, cap.bbox, "text", cap.text, role="footnote" if is_note else "caption",
                     label=label)
        if target is not None:
            if is_note:
                target.footnote = (target.footnote + " " + cap.text).strip()
            else:
                target.caption = (target.caption + " " + cap.text).strip()
            if label and not target.label:
                target.label = label
            el.parent = id(target)  # resolved to a reading_order once elements are numbered
        caption_elements.append((order, el))

    for _, v in visuals:
        below = [f for f in footnotes if 0 <= f.bbox[1] - v.bbox[3] <= 60 and horizontal_overlap(f.bbox, v.bbox) > 0.3]
        if below:
            v.footnote = " ".join([v.footnote] * bool(v.footnote) + [f.text for f in below])
        if not v.caption:
            # reports title their charts with a short line right above instead of a "Figure N" caption
            title = _title_above(v.bbox, body)
            if title:
                v.caption = title
        if v.kind == "figure" and looks_like_chart(v):
            v.kind = v.role = "chart"

    no_text = not has_text
    if no_text and not visuals:
        full = Element(doc_id, pno, list(page_rect), "figure", "", role="page-image")
        visuals.append((-1, full))

    chunks = chunk_page(doc_id, pno, body, cfg)
    items = [(o, 0, e) for o, e in visuals] + [(o, 1, e) for o, e in caption_elements] + chunks
    items.sort(key=lambda t: (t[0], t[1]))
    stream = sorted([(o, 0, v) for o, v in visuals] + [(r.order, 1, r.text.split()) for r in body],
                    key=lambda t: (t[0], t[1]))
    return [e for _, _, e in items], [x for _, _, x in stream], no_text


def chunk_page(doc_id, pno, body: List[Region], cfg) -> List[Tuple[int, int, Element]]:
    """Splits a page's body text into chunks; each chunk keeps the boxes it came from."""
    if not body:
        return []
    splitter = _splitter(int(cfg.chunk_size), int(cfg.chunk_overlap))
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


_SPLITTERS: Dict[Tuple[int, int], object] = {}


def _splitter(size: int, overlap: int):
    key = (size, overlap)
    if key not in _SPLITTERS:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        _SPLITTERS[key] = RecursiveCharacterTextSplitter(
            chunk_size=size, chunk_overlap=overlap, add_start_index=True
        )
    return _SPLITTERS[key]


def _nearest_visual(cap_bbox, visuals: List[Element], *, prefer_table: bool) -> Optional[Element]:
    best, best_score = None, float("inf")
    for v in visuals:
        if horizontal_overlap(cap_bbox, v.bbox) < 0.2 and gap(cap_bbox, v.bbox) > 12:
            continue
        d = gap(cap_bbox, v.bbox)
        if d > 80:
            continue
        score = d - (10.0 if prefer_table == (v.kind == "table") else 0.0)
        if score < best_score:
            best, best_score = v, score
    return best


def _title_above(bbox, body: List[Region]) -> Optional[str]:
    """A chart title (and subtitle) stacked right above ``bbox``: up to two short lines, top first."""
    lines: List[str] = []
    edge = bbox
    for _ in range(2):
        best, best_gap = None, 24.0
        for r in body:
            if r.cls not in ("text", "section-header", "title", "list-item") or len(r.text) > 200:
                continue
            d = edge[1] - r.bbox[3]
            if 0 <= d <= best_gap and horizontal_overlap(r.bbox, bbox) >= 0.5:
                best, best_gap = r, d
        if best is None:
            break
        lines.insert(0, best.text)
        edge = best.bbox
    return " ".join(lines) or None


def _tabular_neighbour(cap_bbox, body: List[Region]) -> Optional[Region]:
    best, best_gap = None, 40.0
    for r in body:
        if r.cls not in ("text", "list-item") or horizontal_overlap(cap_bbox, r.bbox) < 0.3:
            continue
        d = gap(cap_bbox, r.bbox)
        tokens = r.text.split()
        numeric = sum(1 for t in tokens if NUMBER_RE.match(t))
        if d <= best_gap and len(tokens) >= 4 and numeric >= 0.2 * len(tokens):
            best, best_gap = r, d
    return best


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


def _area(b) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


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
