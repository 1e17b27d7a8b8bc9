"""PDFs generated for the ingestion tests (with PyMuPDF), including deliberately broken ones."""

from __future__ import annotations

from pathlib import Path

PARAGRAPH = (
    "Retrieval systems select evidence from long documents before a reader answers. "
    "A selector that spends its budget on near duplicates misses complementary evidence. "
    "Constrained dominant sets trade relevance against redundancy on an affinity graph. "
)

# Where make_synthetic_pdf puts things (PDF points, origin top-left).
FIGURE_RECT = (150.0, 320.0, 450.0, 470.0)
TABLE_CAPTION = "Table 1: Page recall of each selector on the development set."
FIGURE_CAPTION = "Figure 1: Accuracy of the reader as the evidence budget grows."


def _bar_chart_pixmap():
    import pymupdf

    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 300, 150), 0)
    pix.clear_with(220)
    for x in range(40, 260, 40):
        pix.set_rect(pymupdf.IRect(x, 150 - x // 2, x + 25, 150), (30, 60, 200))
    return pix


def make_synthetic_pdf(path: Path, *, body_repeats: int = 4) -> Path:
    """Two pages: title, paragraph citing Figure 1, a raster figure with caption; a captioned table and text."""
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_htmlbox(pymupdf.Rect(72, 60, 540, 100), "<h1>Evidence Selection Study</h1>")
    body = " ".join([PARAGRAPH] * body_repeats) + " As Figure 1 shows, accuracy grows with the budget."
    page.insert_htmlbox(pymupdf.Rect(72, 110, 540, 300), f"<p style='font-size:11px'>{body}</p>")
    page.insert_image(pymupdf.Rect(*FIGURE_RECT), pixmap=_bar_chart_pixmap())
    page.insert_htmlbox(pymupdf.Rect(72, 478, 540, 500), f"<p style='font-size:10px'>{FIGURE_CAPTION}</p>")
    page2 = doc.new_page(width=612, height=792)
    rows = "".join(f"<tr><td>model {i}</td><td>{60 + i}.5</td><td>{70 + i}.1</td></tr>" for i in range(6))
    page2.insert_htmlbox(pymupdf.Rect(72, 60, 540, 80), f"<p style='font-size:10px'>{TABLE_CAPTION}</p>")
    page2.insert_htmlbox(
        pymupdf.Rect(120, 90, 490, 260),
        "<table border='1' style='border-collapse:collapse;font-size:11px'>"
        f"<tr><th>selector</th><th>recall</th><th>precision</th></tr>{rows}</table>",
    )
    page2.insert_htmlbox(pymupdf.Rect(72, 300, 540, 500), f"<p style='font-size:11px'>Table 1 lists the results. {PARAGRAPH * 3}</p>")
    doc.save(str(path))
    doc.close()
    return path


def make_text_pdf(path: Path, pages: int = 1, text: str = PARAGRAPH, repeat: int = 6) -> Path:
    import pymupdf

    doc = pymupdf.open()
    for i in range(pages):
        page = doc.new_page(width=612, height=792)
        page.insert_htmlbox(pymupdf.Rect(72, 72, 540, 700), f"<p>Page {i + 1}. {text * repeat}</p>")
    doc.save(str(path))
    doc.close()
    return path


def make_image_only_pdf(path: Path) -> Path:
    """Page 0 has text; page 1 is a scanned-looking page (an image, no text layer); page 2 is blank."""
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_htmlbox(pymupdf.Rect(72, 72, 540, 300), f"<p>{PARAGRAPH * 3}</p>")
    page = doc.new_page(width=612, height=792)
    page.insert_image(pymupdf.Rect(0, 0, 612, 792), pixmap=_bar_chart_pixmap())
    doc.new_page(width=612, height=792)
    doc.save(str(path))
    doc.close()
    return path


def make_encrypted_pdf(path: Path) -> Path:
    import pymupdf

    src = pymupdf.open()
    page = src.new_page()
    page.insert_text((72, 72), "secret text")
    src.save(str(path), encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="user-pw", owner_pw="owner-pw")
    src.close()
    return path


def make_zero_page_pdf(path: Path) -> Path:
    """A syntactically valid PDF whose page tree is empty (PyMuPDF refuses to save one, so it is written by hand)."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [] /Count 0 >>",
    ]
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def make_truncated_pdf(path: Path, source: Path) -> Path:
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def make_corrupt_pdf(path: Path) -> Path:
    """A PDF header and trailer marker around garbage: MuPDF cannot find any page tree."""
    path.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8 + b"\n%%EOF\n")
    return path


def make_not_pdf(path: Path) -> Path:
    path.write_text("this is a plain text file with a .pdf name\n")
    return path
