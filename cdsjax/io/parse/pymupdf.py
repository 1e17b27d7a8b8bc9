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

A region the layout model calls a page header or footer is left out only where
it repeats: where a page up to :data:`REPEAT_WINDOW` pages away holds the same
text (digits aside, so page numbers match) at the same height. Elsewhere it is
body text, so a one-line PDF keeps its line.

A page with no text layer (a scanned page) and no detected picture becomes one
full-page figure, so it stays retrievable as an image; when Tesseract is
installed (and ``config.ingest.use_ocr`` is not "off") the page is also read with
OCR through PyMuPDF (``Page.get_textpage_ocr``) and its text becomes ordinary
text chunks. One warning per document says how many pages had no text layer and
whether OCR read them.

Text in images: a figure or chart whose box holds fewer than :data:`OCR_MIN_WORDS`
words of text layer (a raster image: a chart's printed numbers are pixels) is read
with OCR too (:func:`~cdsjax.io.parse.layout.ocr_clip`), into its ``ocr_text``; a
full-page figure gets the text OCR read on its page. Without Tesseract the field
stays empty and :attr:`ParsedDocument.unread_visuals` counts the visuals left
unread (an index run warns once, and reads them when Tesseract is installed).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from cdsjax.io.elements import Element, IngestError, gap, horizontal_overlap
from cdsjax.memo import PROCESS
from cdsjax.io.parse.common import (DEFAULT_MAX_PAGES, LABEL_RE, NUMBER_RE, ParsedDocument, attach_context,
                                    chunk_page, looks_like_chart, normal_label, open_pdf, resolve_parents,
                                    text_splitter, write_crop)
from cdsjax.io.parse.layout import Region, TextLayer, import_pymupdf, ocr_clip, read_text_layer
from cdsjax.io.parse.layout_split import layout_pages
from cdsjax.io.util import one_line

# 2: page headers and footers kept unless they repeat; OCR text of figures and charts (Element.ocr_text)
PARSER_VERSION = "pymupdf-2"

MARGIN_CLASSES = {"page-header", "page-footer"}  # left out where they repeat across pages (module docstring)
REPEAT_WINDOW = 2  # pages on each side searched for a repeat (2: headers that alternate on odd and even pages)
REPEAT_BAND = 6.0  # points above and below a header's box where a repeat may sit on another page
OCR_MIN_WORDS = 10  # a figure or chart with fewer text-layer words in its box is read with OCR
OCR_KINDS = ("figure", "chart")
# a text region that starts like this is a caption ("Figure 2: ...", "Table 3. ..."), not a sentence
# that merely begins with a reference ("Table 1 lists ...")
CAPTION_START_RE = re.compile(
    r"^\s*(figure|fig\.?|table|tab\.?|chart|exhibit|graph)\s*(\d+[a-z]?|[ivx]+)\s*[:.|\u2013\u2014-]",
    re.IGNORECASE,
)
FOOTNOTE_RE = re.compile(r"^\s*(notes?|sources?)\s*[:.]|^\s*\*", re.IGNORECASE)


def ocr_available() -> bool:
    """True when Tesseract and its language data can be used by PyMuPDF (probed once per process:
    :data:`cdsjax.memo.PROCESS`)."""
    return PROCESS.machine.get("tesseract", _probe_tesseract)


def _probe_tesseract() -> bool:
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


# --------------------------------------------------------------------------- parsing


def parse_pdf(path, doc_id: str, *, config, crop_dir: Path, crop_prefix: str = "",
              page_split: bool = True) -> ParsedDocument:
    """Parses one PDF into elements.

    Args:
      path: the PDF.
      doc_id: id stored on every element.
      config: the full config (``config.ingest`` is read).
      crop_dir: directory that receives the PNG crops (created if needed).
      crop_prefix: path prefix recorded in ``Element.image_path`` (relative to the index directory).
      page_split: a long document's layout analysed by this process and the layout helper at once
        (:func:`~cdsjax.io.parse.layout_split.layout_pages`); False: by this process alone. The same elements.

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
    unread_visuals = 0
    try:
        elements: List[Element] = []
        words: List[str] = []  # body words of the whole document, in reading order
        visual_pos: List[Tuple[Element, int]] = []
        crop_dir = Path(crop_dir)
        splitter = text_splitter(cfg)  # one for the document's pages
        crop_dir.mkdir(parents=True, exist_ok=True)
        walked = 0  # pages turned into elements so far (in page order)

        def walk(start: int, page_regions: List[List[Region]]) -> None:
            """Turns pages ``start, start + 1, ...`` into elements and crops, in page order."""
            nonlocal walked, ocr_failed, unread_visuals
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
                page_elements, stream, no_text = _page_elements(
                    doc_id, pno, regions, page_rect, cfg, has_text=has_text, splitter=splitter,
                    repeats=lambda r, pno=pno: _repeats(doc, pno, r))
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
                    if el.role == "page-image":
                        el.ocr_text = "\n".join(r.text for r in layer.ocr)
                    elif el.kind in OCR_KINDS and el.image_path is not None \
                            and len(el.text.split()) < OCR_MIN_WORDS:
                        if not use_ocr:
                            unread_visuals += 1
                        else:
                            try:
                                el.ocr_text = ocr_clip(page, _crop_rect(page, el, cfg))
                            except Exception:  # Tesseract failed on this crop: it keeps its image and caption
                                pass
                walked += 1

        # the pages this process analysed are walked while the layout helper (if any) still works
        layers: Dict[int, TextLayer] = {}
        pages = layout_pages(doc, path, on_pages=walk, use_ocr=use_ocr, text_layers=layers, split=page_split)
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
                              no_text_pages=no_text_pages, ocr=ocr, unread_visuals=unread_visuals)
    except IngestError:
        raise
    except Exception as err:
        raise IngestError(path, f"parsing failed ({type(err).__name__}: {one_line(err)})") from None
    finally:
        doc.close()


def _page_elements(doc_id, pno, regions: List[Region], page_rect, cfg, *, has_text: bool, splitter=None,
                   repeats: Optional[Callable[[Region], bool]] = None):
    """Turns one page's regions into elements (not yet numbered). ``repeats(region)``: whether a page header or
    footer repeats on other pages (then it is left out); None: every one does."""
    min_area = float(cfg.min_visual_area)
    visuals: List[Tuple[int, Element]] = []
    captions: List[Tuple[int, Region]] = []
    body: List[Region] = []
    footnotes: List[Region] = []
    for r in regions:
        if r.cls in MARGIN_CLASSES and (repeats is None or repeats(r)):
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

    chunks = chunk_page(doc_id, pno, body, cfg, splitter)
    items = [(o, 0, e) for o, e in visuals] + [(o, 1, e) for o, e in caption_elements] + chunks
    items.sort(key=lambda t: (t[0], t[1]))
    stream = sorted([(o, 0, v) for o, v in visuals] + [(r.order, 1, r.text.split()) for r in body],
                    key=lambda t: (t[0], t[1]))
    return [e for _, _, e in items], [x for _, _, x in stream], no_text


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


def _normal_line(text: str) -> str:
    """Text compared across pages: lower case, digit runs as ``#`` (page numbers), whitespace collapsed."""
    return " ".join(re.sub(r"\d+", "#", text.lower()).split())


def _repeats(doc, pno: int, region: Region) -> bool:
    """True when a page up to :data:`REPEAT_WINDOW` pages from ``pno`` holds ``region``'s text, digits aside, in
    the same horizontal band (``region``'s height, :data:`REPEAT_BAND` points either side)."""
    pymupdf = import_pymupdf()
    key = _normal_line(region.text)
    if not key:
        return True
    y0, y1 = region.bbox[1] - REPEAT_BAND, region.bbox[3] + REPEAT_BAND
    for q in range(max(0, pno - REPEAT_WINDOW), min(doc.page_count, pno + REPEAT_WINDOW + 1)):
        if q == pno:
            continue
        other = doc[q]
        band = pymupdf.Rect(other.rect.x0, y0, other.rect.x1, y1) & other.rect
        if not band.is_empty and key in _normal_line(other.get_text("text", clip=band)):
            return True
    return False


def _crop_rect(page, el: Element, cfg):
    """The padded box of ``el``'s crop (:func:`~cdsjax.io.parse.common.write_crop`), inside the page."""
    pymupdf = import_pymupdf()
    pad = float(cfg.crop_padding)
    return pymupdf.Rect(el.bbox[0] - pad, el.bbox[1] - pad, el.bbox[2] + pad, el.bbox[3] + pad) & page.rect


def _area(b) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


