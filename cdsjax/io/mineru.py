"""MinerU (magic-pdf) as a second parser: read its output directory into elements, or run it.

MinerU writes, per PDF, ``<out>/<stem>/<method>/<stem>_content_list.json`` plus an
``images/`` folder. The content list is a flat list of blocks in reading order;
each has ``type`` ("text", "list", "equation", "image", "table", "chart", "code",
or a discarded kind such as "header"/"footer"/"page_number"/"page_footnote"),
``page_idx`` (0-based) and, in MinerU 2.x, ``bbox`` scaled to 0..1000 of the page
width/height. Images carry ``img_path`` (relative to the content list),
``img_caption`` / ``img_footnote`` lists; tables ``table_caption`` /
``table_footnote`` / ``table_body`` (HTML); charts ``chart_caption`` /
``chart_footnote``. Boxes are converted back to PDF points with the page sizes
of the PDF itself. Blocks without a ``bbox`` (older magic-pdf) get the whole page.

MinerU needs model downloads, so it is never the default parser.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional

from cdsjax.io.elements import Element, IngestError
from cdsjax.io.parse import (
    LABEL_RE,
    ParsedDocument,
    _attach_context,
    _chunk_page,
    _looks_like_chart,
    _normal_label,
    _one_line,
    Region,
    _resolve_parents,
    _write_crop,
    open_pdf,
)

MINERU_VERSION = "mineru-1"
TEXT_TYPES = {"text", "list", "equation", "code", "ref_text", "index", "abstract"}
VISUAL_TYPES = {"image": "figure", "table": "table", "chart": "chart"}


def find_content_list(output_dir: Path, stem: str) -> Optional[Path]:
    """The ``<stem>_content_list.json`` under a MinerU output directory (searched recursively)."""
    output_dir = Path(output_dir)
    exact = sorted(output_dir.rglob(f"{stem}_content_list.json"))
    if exact:
        return exact[0]
    return None


def run_mineru(pdf: Path, out_dir: Path, *, command: str = "mineru", backend: str = "pipeline",
               timeout: Optional[float] = None) -> Path:
    """Runs the MinerU CLI (``mineru -p PDF -o OUT -b BACKEND``) and returns the content list it wrote."""
    exe = shutil.which(command)
    if exe is None:
        raise IngestError(pdf, f"parser 'mineru' needs the `{command}` command (pip install mineru, plus its "
                               "models) or an existing output directory in config.ingest.mineru_output")
    argv = [exe, "-p", str(pdf), "-o", str(out_dir)]
    if backend:
        argv += ["-b", backend]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise IngestError(pdf, f"MinerU failed to run ({_one_line(err)})") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or [""]
        raise IngestError(pdf, f"MinerU exited with code {proc.returncode} ({_one_line(Exception(tail[0]))})")
    found = find_content_list(out_dir, pdf.stem)
    if found is None:
        raise IngestError(pdf, f"MinerU wrote no {pdf.stem}_content_list.json under {out_dir}")
    return found


def parse_with_mineru(path, doc_id: str, *, config, crop_dir: Path, crop_prefix: str = "") -> ParsedDocument:
    """Parses a PDF with MinerU: reads ``config.ingest.mineru_output`` if set, else runs MinerU."""
    path = Path(path)
    cfg = config.ingest
    if cfg.mineru_output:
        content_list = find_content_list(Path(cfg.mineru_output), path.stem)
        if content_list is None:
            raise IngestError(path, f"no {path.stem}_content_list.json under {cfg.mineru_output}")
        return read_content_list(content_list, path, doc_id, config=config, crop_dir=crop_dir,
                                 crop_prefix=crop_prefix)
    with tempfile.TemporaryDirectory(prefix="cdsjax-mineru-") as tmp:
        content_list = run_mineru(path, Path(tmp), command=str(cfg.mineru_command), backend=str(cfg.mineru_backend))
        return read_content_list(content_list, path, doc_id, config=config, crop_dir=crop_dir,
                                 crop_prefix=crop_prefix)


def read_content_list(content_list: Path, pdf: Path, doc_id: str, *, config, crop_dir: Path,
                      crop_prefix: str = "") -> ParsedDocument:
    """Turns a MinerU ``*_content_list.json`` (and its images) into elements.

    Args:
      content_list: the JSON file.
      pdf: the PDF it was made from (page sizes; crops are rendered from it when an image is missing).
      doc_id, config, crop_dir, crop_prefix: as in :func:`cdsjax.io.parse.parse_pdf`.
    """
    import json

    cfg = config.ingest
    try:
        blocks = json.loads(Path(content_list).read_text())
    except (OSError, ValueError) as err:
        raise IngestError(content_list, f"unreadable MinerU content list ({_one_line(err)})") from None
    if not isinstance(blocks, list):
        raise IngestError(content_list, "MinerU content list is not a JSON list")
    doc = open_pdf(Path(pdf))
    try:
        sizes = [(float(p.rect.width), float(p.rect.height)) for p in doc]
        per_page: List[list] = [[] for _ in sizes]
        for order, b in enumerate(blocks):
            if not isinstance(b, dict):
                continue
            page = int(b.get("page_idx", -1))
            if not 0 <= page < len(sizes):
                continue
            per_page[page].append((order, b))
        crop_dir = Path(crop_dir)
        crop_dir.mkdir(parents=True, exist_ok=True)
        base = Path(content_list).parent
        elements: List[Element] = []
        words: List[str] = []
        visual_pos = []
        for pno, items in enumerate(per_page):
            w, h = sizes[pno]
            body: List[Region] = []
            visuals = []
            captions = []
            stream = []
            for order, b in items:
                kind = str(b.get("type", ""))
                bbox = _points(b.get("bbox"), w, h)
                if kind in TEXT_TYPES:
                    text = _block_text(b)
                    if text:
                        r = Region("text", bbox, text, order)
                        body.append(r)
                        stream.append((order, text.split()))
                elif kind in VISUAL_TYPES:
                    el_kind = VISUAL_TYPES[kind]
                    if kind == "image" and str(b.get("sub_type", "")).lower() == "chart":
                        el_kind = "chart"
                    prefix = {"image": "img", "table": "table", "chart": "chart"}[kind]
                    caption = " ".join(_strings(b.get(f"{prefix}_caption") or b.get("image_caption")))
                    footnote = " ".join(_strings(b.get(f"{prefix}_footnote") or b.get("image_footnote")))
                    text = _html_text(b.get("table_body", "")) if kind == "table" else str(b.get("content") or "")
                    el = Element(doc_id, pno, bbox, el_kind, text.strip(), role=el_kind, caption=caption,
                                 footnote=footnote)
                    m = LABEL_RE.match(caption)
                    if m:
                        el.label = _normal_label(m)
                    if el_kind == "figure" and _looks_like_chart(el):
                        el.kind = el.role = "chart"
                    el.image_path = b.get("img_path") or None  # resolved below
                    visuals.append((order, el))
                    stream.append((order, el))
                    if caption:
                        cap = Element(doc_id, pno, list(bbox), "text", caption, role="caption", label=el.label)
                        cap.parent = id(el)
                        captions.append((order, cap))
            chunks = _chunk_page(doc_id, pno, body, cfg)
            ordered = [(o, 0, e) for o, e in visuals] + [(o, 1, e) for o, e in captions] + chunks
            ordered.sort(key=lambda t: (t[0], t[1]))
            for item in sorted(stream, key=lambda t: t[0]):
                if isinstance(item[1], Element):
                    visual_pos.append((item[1], len(words)))
                else:
                    words.extend(item[1])
            page = doc[pno]
            for _, _, el in ordered:
                el.reading_order = len(elements)
                elements.append(el)
                if el.kind != "text":
                    el.image_path = _crop(el, base, page, crop_dir, crop_prefix, cfg)
        _attach_context(visual_pos, words, int(cfg.context_words))
        _resolve_parents(elements)
        return ParsedDocument(elements=elements, num_pages=len(sizes), warnings=[])
    finally:
        doc.close()


def _points(bbox, w: float, h: float) -> List[float]:
    if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4):
        return [0.0, 0.0, w, h]
    x0, y0, x1, y1 = (float(v) for v in bbox)
    return [x0 * w / 1000.0, y0 * h / 1000.0, x1 * w / 1000.0, y1 * h / 1000.0]


def _strings(value) -> List[str]:
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    if isinstance(value, list):
        out = []
        for v in value:
            if isinstance(v, dict):  # content_list v2 spans: {"type": "text", "content": "..."}
                v = v.get("content", "")
            if isinstance(v, str) and v.strip():
                out.append(v.strip())
        return out
    return []


def _block_text(b: dict) -> str:
    if b.get("type") == "list" and isinstance(b.get("list_items"), list):
        return "\n".join(_strings(b["list_items"]))
    if b.get("type") == "code":
        return str(b.get("code_body") or b.get("text") or "").strip()
    return " ".join(str(b.get("text") or "").split())


def _html_text(body: str) -> str:
    """Table HTML -> plain rows with " | " between cells."""
    if not body:
        return ""
    text = re.sub(r"</t[dh]\s*>", " | ", body, flags=re.IGNORECASE)
    text = re.sub(r"</tr\s*>", "\n", text, flags=re.IGNORECASE)
    text = re.sub(r"<[^>]+>", "", text)
    rows = [" ".join(html.unescape(r).split()).rstrip(" |") for r in text.splitlines()]
    return "\n".join(r for r in rows if r)


def _crop(el: Element, base: Path, page, crop_dir: Path, prefix: str, cfg) -> Optional[str]:
    """MinerU's own image (converted to PNG) if present, else a crop rendered from the PDF."""
    from cdsjax.io.layout import import_pymupdf

    pymupdf = import_pymupdf()  # heavy: it loads the layout models

    src = el.image_path
    if src:
        path = (base / src) if not Path(src).is_absolute() else Path(src)
        if path.is_file():
            try:
                pix = pymupdf.Pixmap(str(path))
                if pix.alpha:
                    pix = pymupdf.Pixmap(pix, 0)
                if pix.n > 3:
                    pix = pymupdf.Pixmap(pymupdf.csRGB, pix)
                name = f"p{el.page:04d}-e{el.reading_order:05d}.png"
                pix.save(str(crop_dir / name))
                return f"{prefix}{name}" if prefix else name
            except Exception:
                pass  # unreadable image: fall back to rendering the region
    return _write_crop(page, el, crop_dir, prefix, cfg)
