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

The output is read as untrusted data: an ``img_path`` must be a relative path without ``..`` naming a regular
file inside the content list's folder, reached without following any symbolic link (each folder is opened
relative to the one above it with ``O_NOFOLLOW``), and at most :data:`MAX_IMAGE_BYTES`; a ``page_idx`` must be
an integer and a ``bbox`` four finite numbers. Anything else refuses the document in one line naming the block
(no outside file is ever read or copied into the index's crops).

MinerU needs model downloads, so it is never the default parser.
"""

from __future__ import annotations

import html
import math
import os
import re
import stat
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional

from cdsjax.io.elements import Element, IngestError
from cdsjax.io.parse.common import (LABEL_RE, ParsedDocument, attach_context, chunk_page, looks_like_chart,
                                    normal_label, open_pdf, resolve_parents, text_splitter, write_crop)
from cdsjax.io.parse.layout import Region, import_pymupdf
from cdsjax.io.util import one_line

MINERU_VERSION = "mineru-1"
TEXT_TYPES = {"text", "list", "equation", "code", "ref_text", "index", "abstract"}
VISUAL_TYPES = {"image": "figure", "table": "table", "chart": "chart"}
MAX_IMAGE_BYTES = 64 << 20  # one image MinerU wrote (its crops are a few hundred kB)


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
        raise IngestError(pdf, f"MinerU failed to run ({one_line(err)})") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or [""]
        raise IngestError(pdf, f"MinerU exited with code {proc.returncode} ({one_line(Exception(tail[0]))})")
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
        rel = content_list.relative_to(Path(cfg.mineru_output))
        if _linked(Path(cfg.mineru_output), rel.parts):
            raise IngestError(content_list, "refusing the MinerU output: its content list is reached through a "
                                            "symbolic link")
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
        raise IngestError(content_list, f"unreadable MinerU content list ({one_line(err)})") from None
    if not isinstance(blocks, list):
        raise IngestError(content_list, "MinerU content list is not a JSON list")
    doc = open_pdf(Path(pdf))
    try:
        sizes = [(float(p.rect.width), float(p.rect.height)) for p in doc]
        per_page: List[list] = [[] for _ in sizes]
        for order, b in enumerate(blocks):
            if not isinstance(b, dict):
                continue
            page = _page_index(b.get("page_idx", -1), content_list, order)
            if not 0 <= page < len(sizes):
                continue
            b["bbox"] = _checked_bbox(b.get("bbox"), content_list, order)
            if b.get("img_path") is not None:
                b["img_path"] = _checked_image_path(b["img_path"], content_list, order)
            per_page[page].append((order, b))
        crop_dir = Path(crop_dir)
        crop_dir.mkdir(parents=True, exist_ok=True)
        base = Path(content_list).parent
        splitter = text_splitter(cfg)  # one for the document's pages
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
                        el.label = normal_label(m)
                    if el_kind == "figure" and looks_like_chart(el):
                        el.kind = el.role = "chart"
                    el.image_path = b.get("img_path") or None  # resolved below
                    visuals.append((order, el))
                    stream.append((order, el))
                    if caption:
                        cap = Element(doc_id, pno, list(bbox), "text", caption, role="caption", label=el.label)
                        cap.parent = id(el)
                        captions.append((order, cap))
            chunks = chunk_page(doc_id, pno, body, cfg, splitter)
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
                    el.image_path = _crop(el, base, page, crop_dir, crop_prefix, cfg, content_list)
        attach_context(visual_pos, words, int(cfg.context_words))
        resolve_parents(elements)
        return ParsedDocument(elements=elements, num_pages=len(sizes), warnings=[])
    finally:
        doc.close()


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _page_index(value, content_list: Path, order: int) -> int:
    """A block's ``page_idx`` as an int; a one-line IngestError when it is not a whole number."""
    if _is_number(value) and float(value) == int(value) and abs(value) < 2**31:
        return int(value)
    raise IngestError(content_list, f"MinerU block {order}: page_idx {_echo(value)} is not a page number")


def _checked_bbox(value, content_list: Path, order: int):
    """A block's ``bbox``: None (the whole page) or four finite numbers; else a one-line IngestError."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 4 and all(_is_number(v) for v in value):
        return [float(v) for v in value]
    raise IngestError(content_list, f"MinerU block {order}: bbox {_echo(value)} is not four finite numbers")


def _checked_image_path(value, content_list: Path, order: int) -> str:
    """A block's ``img_path``: a relative path without ``..`` (else a one-line IngestError)."""
    text = value if isinstance(value, str) else ""
    parts = text.replace("\\", "/").split("/")
    if (not text or "\x00" in text or text.startswith(("/", "\\")) or os.path.isabs(text) or ".." in parts
            or (len(text) > 1 and text[1] == ":")):
        raise IngestError(content_list, f"refusing the MinerU output: block {order}'s img_path {_echo(value)} is "
                                        "not a path inside its folder")
    return "/".join(p for p in parts if p not in ("", "."))


def _echo(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _linked(base: Path, parts) -> bool:
    """Whether any of ``parts`` below ``base`` is a symbolic link."""
    here = Path(base)
    for part in parts:
        here = here / part
        if here.is_symlink():
            return True
    return False


def _read_inside(base: Path, rel: str, content_list: Path) -> Optional[bytes]:
    """The bytes of the regular file ``rel`` (checked by :func:`_checked_image_path`) under ``base``, every
    folder opened relative to the one above it without following a link; None when it is missing. A link,
    a non-file or a file over :data:`MAX_IMAGE_BYTES` refuses the document (one-line IngestError)."""
    parts = rel.split("/")
    nofollow = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fds = []
    try:
        try:
            fd = os.open(base, nofollow | getattr(os, "O_DIRECTORY", 0))
        except FileNotFoundError:
            return None
        fds.append(fd)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) != last) or not (
                    stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                raise IngestError(content_list, f"refusing the MinerU output: image {rel[:80]!r} is {kind}")
            fd = os.open(part, nofollow | (0 if last else getattr(os, "O_DIRECTORY", 0)), dir_fd=fd)
            fds.append(fd)
        st = os.fstat(fd)  # the file opened, not the name (which could have been swapped since)
        if not stat.S_ISREG(st.st_mode):
            raise IngestError(content_list, f"refusing the MinerU output: image {rel[:80]!r} is not a regular file")
        if st.st_size > MAX_IMAGE_BYTES:
            raise IngestError(content_list, f"refusing the MinerU output: image {rel[:80]!r} is larger than "
                                            f"{MAX_IMAGE_BYTES >> 20} MB")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_IMAGE_BYTES + 1)[:MAX_IMAGE_BYTES]
    except OSError as err:  # ELOOP: a link swapped in after the check
        raise IngestError(content_list, f"refusing the MinerU output: image {rel[:80]!r} cannot be opened as a "
                                        f"file inside its folder ({one_line(err)})") from None
    finally:
        for fd in fds:
            os.close(fd)


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


def _crop(el: Element, base: Path, page, crop_dir: Path, prefix: str, cfg, content_list: Path) -> Optional[str]:
    """MinerU's own image (converted to PNG) if present, else a crop rendered from the PDF."""
    pymupdf = import_pymupdf()  # heavy: it loads the layout models

    src = el.image_path
    data = _read_inside(base, src, content_list) if src else None
    if data is not None:
        try:
            pix = pymupdf.Pixmap(data)
            if pix.alpha:
                pix = pymupdf.Pixmap(pix, 0)
            if pix.n > 3:
                pix = pymupdf.Pixmap(pymupdf.csRGB, pix)
            name = f"p{el.page:04d}-e{el.reading_order:05d}.png"
            pix.save(str(crop_dir / name))
            return f"{prefix}{name}" if prefix else name
        except Exception:
            pass  # unreadable image: fall back to rendering the region
    return write_crop(page, el, crop_dir, prefix, cfg)
