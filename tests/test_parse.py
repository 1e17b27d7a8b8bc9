"""PDF -> elements: PyMuPDF/pymupdf4llm parser, MinerU adapter, bad inputs."""

import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from cdsjax.io.elements import IngestError, inside_fraction, iou
from cdsjax.io.index import default_config
from cdsjax.io.parse.mineru import parse_with_mineru, read_content_list
from cdsjax.io.parse import open_pdf, parse_pdf
from tests import ingest_pdfs as gen


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    pdf = gen.make_synthetic_pdf(d / "synthetic.pdf")
    parsed = parse_pdf(pdf, "synthetic.pdf", config=default_config(), crop_dir=d / "crops", crop_prefix="crops/")
    return d, pdf, parsed


def test_elements_have_pages_boxes_and_reading_order(synthetic):
    d, pdf, parsed = synthetic
    els = parsed.elements
    assert parsed.num_pages == 2
    assert [e.reading_order for e in els] == list(range(len(els)))
    assert sorted({e.page for e in els}) == [0, 1]
    pages = [e.page for e in els]
    assert pages == sorted(pages), "reading order runs page by page"
    for e in els:
        assert e.doc_id == "synthetic.pdf"
        x0, y0, x1, y1 = e.bbox
        assert 0 <= x0 < x1 <= 612 and 0 <= y0 < y1 <= 792, e.bbox


def test_figure_box_crop_and_caption(synthetic):
    d, pdf, parsed = synthetic
    figures = [e for e in parsed.elements if e.kind in ("figure", "chart")]
    assert len(figures) == 1
    fig = figures[0]
    # the image was placed at FIGURE_RECT in points, origin top-left
    assert iou(fig.bbox, gen.FIGURE_RECT) > 0.95
    assert fig.caption.startswith("Figure 1")
    assert fig.label == "Figure 1"
    png = d / fig.image_path
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import pymupdf

    pix = pymupdf.Pixmap(str(png))
    pad = default_config().ingest.crop_padding
    scale = default_config().ingest.crop_dpi / 72.0
    assert abs(pix.width - (300 + 2 * pad) * scale) <= 3
    assert abs(pix.height - (150 + 2 * pad) * scale) <= 3
    captions = [e for e in parsed.elements if e.role == "caption" and e.label == "Figure 1"]
    assert len(captions) == 1 and captions[0].parent == fig.reading_order
    assert captions[0].kind == "text"
    # the surrounding text is the body text around the figure
    assert "Retrieval systems select evidence" in fig.context


def test_table_caption_and_cells(synthetic):
    d, pdf, parsed = synthetic
    tables = [e for e in parsed.elements if e.kind == "table"]
    assert len(tables) == 1
    table = tables[0]
    assert table.page == 1
    assert table.caption == gen.TABLE_CAPTION
    assert "60.5" in table.text and "selector" in table.text
    assert table.image_path and (d / table.image_path).exists()
    body = [e for e in parsed.elements if e.role == "body" and e.page == 1]
    assert body and all("60.5" not in e.text for e in body), "table cells are not repeated as body text"
    assert not any(e.role == "caption" and e.text.startswith("Table 1 lists") for e in parsed.elements), \
        "a sentence starting with 'Table 1' is body text, not a caption"


def test_text_chunks_respect_size_and_overlap(tmp_path):
    cfg = default_config()
    cfg.ingest.chunk_size = 400
    cfg.ingest.chunk_overlap = 80
    text = " ".join(f"Sentence {i} reports that measure {i * 7} rose." for i in range(40))
    pdf = gen.make_text_pdf(tmp_path / "t.pdf", pages=1, text=text, repeat=1)
    parsed = parse_pdf(pdf, "t.pdf", config=cfg, crop_dir=tmp_path / "c")
    chunks = [e for e in parsed.elements if e.role == "body"]
    assert len(chunks) >= 3
    assert all(len(c.text) <= 400 for c in chunks)
    for a, b in zip(chunks, chunks[1:]):
        # the next chunk starts with the tail of the previous one: an overlap of at most chunk_overlap chars
        shared = [k for k in range(10, len(b.text)) if a.text.endswith(b.text[:k])]
        assert shared and max(shared) <= 80
    for c in chunks:
        assert c.boxes and all(inside_fraction(b, c.bbox) > 0.999 for b in c.boxes)


def test_context_is_bounded_by_context_words(tmp_path):
    cfg = default_config()
    cfg.ingest.context_words = 5
    pdf = gen.make_synthetic_pdf(tmp_path / "s.pdf")
    parsed = parse_pdf(pdf, "s.pdf", config=cfg, crop_dir=tmp_path / "c")
    fig = next(e for e in parsed.elements if e.kind in ("figure", "chart"))
    before, _, after = fig.context.partition("[...]")
    assert 0 < len(before.split()) <= 5 and len(after.split()) <= 5


def test_real_pdf_with_figure(data_root, tmp_path):
    pdf = data_root / "pdfs" / "pdflatex-image.pdf"
    parsed = parse_pdf(pdf, pdf.name, config=default_config(), crop_dir=tmp_path)
    kinds = [e.kind for e in parsed.elements]
    assert "text" in kinds and any(k in ("figure", "chart") for k in kinds)
    fig = next(e for e in parsed.elements if e.kind in ("figure", "chart"))
    assert (tmp_path / fig.image_path).stat().st_size > 1000


@pytest.mark.slow
def test_page_without_text_layer_becomes_page_image(tmp_path):
    pdf = gen.make_image_only_pdf(tmp_path / "scan.pdf")
    cfg = default_config()
    cfg.ingest.use_ocr = "off"
    parsed = parse_pdf(pdf, "scan.pdf", config=cfg, crop_dir=tmp_path / "c")
    assert parsed.warnings == [f"{pdf}: 2 of 3 pages have no text layer; OCR: off"], "one line per document"
    assert parsed.no_text_pages == [1, 2] and parsed.ocr == "off"
    on1 = [e for e in parsed.elements if e.page == 1]
    assert on1 and all(e.kind != "text" for e in on1)
    on2 = [e for e in parsed.elements if e.page == 2]
    assert len(on2) == 1 and on2[0].role == "page-image" and on2[0].bbox == [0.0, 0.0, 612.0, 792.0]


@pytest.mark.parametrize(
    "maker, reason",
    [
        (gen.make_not_pdf, "not a PDF"),
        (gen.make_encrypted_pdf, "encrypted"),
        (gen.make_zero_page_pdf, "zero pages"),
        (gen.make_corrupt_pdf, "corrupt PDF"),
    ],
)
def test_bad_pdfs_raise_one_line_errors(tmp_path, maker, reason):
    pdf = maker(tmp_path / "bad.pdf")
    with pytest.raises(IngestError) as info:
        parse_pdf(pdf, "bad.pdf", config=default_config(), crop_dir=tmp_path / "c")
    msg = str(info.value)
    assert str(pdf) in msg and reason in msg and "\n" not in msg


def test_truncated_and_missing(tmp_path, synthetic):
    _, pdf, _ = synthetic
    trunc = gen.make_truncated_pdf(tmp_path / "trunc.pdf", pdf)
    with pytest.raises(IngestError, match="truncated"):
        open_pdf(trunc)
    with pytest.raises(IngestError, match="no such file"):
        open_pdf(tmp_path / "missing.pdf")


# --------------------------------------------------------------------------- MinerU


def _write_mineru_output(root: Path, pdf: Path) -> Path:
    """A MinerU 2.x output directory for ``pdf`` in the documented layout (bbox scaled to 0..1000)."""
    import pymupdf

    out = root / pdf.stem / "auto"
    (out / "images").mkdir(parents=True)
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 60, 30), 0)
    pix.clear_with(128)
    pix.save(str(out / "images" / "fig1.jpg"))
    w, h = 612.0, 792.0
    norm = lambda b: [int(b[0] * 1000 / w), int(b[1] * 1000 / h), int(b[2] * 1000 / w), int(b[3] * 1000 / h)]  # noqa: E731
    blocks = [
        {"type": "text", "text": "Evidence Selection Study", "text_level": 1, "bbox": norm([72, 60, 540, 100]),
         "page_idx": 0},
        {"type": "text", "text": gen.PARAGRAPH + " As Figure 1 shows, accuracy grows.", "bbox": norm([72, 110, 540, 300]),
         "page_idx": 0},
        {"type": "image", "img_path": "images/fig1.jpg", "image_caption": [gen.FIGURE_CAPTION],
         "image_footnote": ["Source: synthetic data."], "bbox": norm(gen.FIGURE_RECT), "page_idx": 0},
        {"type": "header", "text": "running head", "bbox": norm([72, 20, 300, 30]), "page_idx": 0},
        {"type": "table", "img_path": "images/missing.jpg", "table_caption": [gen.TABLE_CAPTION],
         "table_footnote": [], "table_body": "<table><tr><td>selector</td><td>recall</td></tr>"
         "<tr><td>cds</td><td>0.61</td></tr></table>", "bbox": norm([120, 90, 490, 260]), "page_idx": 1},
        {"type": "list", "sub_type": "text", "list_items": ["first point", "second point"],
         "bbox": norm([72, 300, 540, 340]), "page_idx": 1},
    ]
    path = out / f"{pdf.stem}_content_list.json"
    path.write_text(json.dumps(blocks))
    return path


def test_mineru_output_directory(tmp_path, synthetic):
    _, pdf, _ = synthetic
    _write_mineru_output(tmp_path / "mineru", pdf)
    cfg = default_config()
    cfg.ingest.parser = "mineru"
    cfg.ingest.mineru_output = str(tmp_path / "mineru")
    parsed = parse_with_mineru(pdf, "synthetic.pdf", config=cfg, crop_dir=tmp_path / "crops", crop_prefix="crops/")
    els = parsed.elements
    assert [e.reading_order for e in els] == list(range(len(els)))
    fig = next(e for e in els if e.kind in ("figure", "chart"))
    assert fig.page == 0 and fig.caption == gen.FIGURE_CAPTION and fig.footnote == "Source: synthetic data."
    assert fig.label == "Figure 1"
    assert iou(fig.bbox, gen.FIGURE_RECT) > 0.98  # 0..1000 scale converted back to points
    assert (tmp_path / fig.image_path).read_bytes()[:4] == b"\x89PNG"
    table = next(e for e in els if e.kind == "table")
    assert table.page == 1 and "cds | 0.61" in table.text
    assert (tmp_path / table.image_path).exists(), "missing MinerU image falls back to a rendered crop"
    caps = [e for e in els if e.role == "caption"]
    assert {c.parent for c in caps} == {fig.reading_order, table.reading_order}
    texts = " ".join(e.text for e in els if e.role == "body")
    assert "running head" not in texts and "second point" in texts
    assert "Retrieval systems" in fig.context


def _hostile_mineru(tmp_path, synthetic, **image_block):
    """A MinerU folder for the synthetic PDF whose image block is changed by ``image_block``; a secret image
    outside it (what a hostile img_path aims at). Returns (config, folder, secret's bytes)."""
    _, pdf, _ = synthetic
    listing = _write_mineru_output(tmp_path / "mineru", pdf)
    secret = tmp_path / "outside" / "secret.jpg"
    secret.parent.mkdir()
    secret.write_bytes((listing.parent / "images" / "fig1.jpg").read_bytes())
    blocks = json.loads(listing.read_text())
    image = next(b for b in blocks if b["type"] == "image")
    for key, value in image_block.items():
        value = str(secret) if value == "SECRET" else value
        image.update({key: value})
    listing.write_text(json.dumps(blocks))
    cfg = default_config()
    cfg.ingest.parser = "mineru"
    cfg.ingest.mineru_output = str(tmp_path / "mineru")
    return cfg, listing.parent, secret


def _crops_and_error(tmp_path, synthetic, cfg):
    _, pdf, _ = synthetic
    crops = tmp_path / "crops"
    with pytest.raises(IngestError) as err:
        parse_with_mineru(pdf, "synthetic.pdf", config=cfg, crop_dir=crops, crop_prefix="crops/")
    return crops, str(err.value)


@pytest.mark.parametrize("img_path", ["SECRET", "../../../outside/secret.jpg", "images/../../../outside/secret.jpg",
                                      "C:/x.jpg", 17])
def test_mineru_img_path_outside_its_folder_is_refused_in_one_line(tmp_path, synthetic, img_path):
    cfg, folder, secret = _hostile_mineru(tmp_path, synthetic, img_path=img_path)
    crops, message = _crops_and_error(tmp_path, synthetic, cfg)
    assert "img_path" in message and "not a path inside its folder" in message and "\n" not in message
    assert not crops.exists() or not any(crops.iterdir()), "nothing copied into the crops"


@pytest.mark.parametrize("link", ["file", "folder"])
def test_mineru_image_reached_through_a_link_is_refused(tmp_path, synthetic, link):
    cfg, folder, secret = _hostile_mineru(tmp_path, synthetic)
    if link == "file":
        (folder / "images" / "fig1.jpg").unlink()
        (folder / "images" / "fig1.jpg").symlink_to(secret)
    else:
        (folder / "images" / "fig1.jpg").unlink()
        (folder / "images").rmdir()
        (folder / "images").symlink_to(secret.parent)
        secret.rename(secret.with_name("fig1.jpg"))
    crops, message = _crops_and_error(tmp_path, synthetic, cfg)
    assert "symbolic link" in message and "\n" not in message
    assert not crops.exists() or not any(crops.iterdir())
    # the content list itself reached through a link is refused too
    listing = next(folder.glob("*_content_list.json"))
    moved = tmp_path / "outside" / listing.name
    listing.rename(moved)
    listing.symlink_to(moved)
    _, message = _crops_and_error(tmp_path, synthetic, cfg)
    assert "content list is reached through a symbolic link" in message


@pytest.mark.parametrize("block", [dict(page_idx="zero"), dict(page_idx=[0]), dict(page_idx=0.5),
                                   dict(page_idx=float("nan")), dict(bbox=["a", 0, 1, 2]), dict(bbox=[0, 0, 1e400, 1]),
                                   dict(bbox={"x": 1}), dict(bbox=[1, 2, 3])])
def test_mineru_bad_numbers_are_one_line(tmp_path, synthetic, block):
    cfg, _, _ = _hostile_mineru(tmp_path, synthetic, **block)
    _, message = _crops_and_error(tmp_path, synthetic, cfg)
    key = next(iter(block))
    assert f"MinerU block 2: {key}" in message and "\n" not in message


def test_mineru_is_run_when_installed(tmp_path, synthetic):
    """A stand-in `mineru` executable writing the documented layout is invoked with -p/-o/-b."""
    _, pdf, _ = synthetic
    script = tmp_path / "fake-mineru"
    log = tmp_path / "argv.json"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from tests.test_parse import _write_mineru_output
        argv = sys.argv[1:]
        Path({str(log)!r}).write_text(json.dumps(argv))
        _write_mineru_output(Path(argv[argv.index("-o") + 1]), Path(argv[argv.index("-p") + 1]))
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    cfg = default_config()
    cfg.ingest.parser = "mineru"
    cfg.ingest.mineru_command = str(script)
    parsed = parse_with_mineru(pdf, "s.pdf", config=cfg, crop_dir=tmp_path / "crops")
    argv = json.loads(log.read_text())
    assert argv[argv.index("-p") + 1] == str(pdf) and argv[argv.index("-b") + 1] == "pipeline"
    assert any(e.kind == "table" for e in parsed.elements)


def test_mineru_missing_gives_clear_error(tmp_path, synthetic):
    _, pdf, _ = synthetic
    cfg = default_config()
    cfg.ingest.mineru_command = "definitely-not-mineru-xyz"
    with pytest.raises(IngestError, match="needs the `definitely-not-mineru-xyz` command"):
        parse_with_mineru(pdf, "s.pdf", config=cfg, crop_dir=tmp_path)
    with pytest.raises(IngestError, match="unreadable MinerU content list"):
        bad = tmp_path / "x_content_list.json"
        bad.write_text("{not json")
        read_content_list(bad, pdf, "s.pdf", config=cfg, crop_dir=tmp_path)


def test_chart_title_above_and_source_note_below():
    """Report-style charts: a title and subtitle stacked above, Note/Source lines below (no "Figure N")."""
    from cdsjax.io.parse.layout import Region
    from cdsjax.io.parse.pymupdf import _page_elements

    regions = [
        Region("text", [67, 95, 294, 400], "Body text of the report. " * 20, 0),
        Region("section-header", [315, 108, 525, 134], "Most subgroups more optimistic", 1),
        Region("list-item", [315, 142, 513, 162], "% who expect their finances to improve", 2),
        Region("picture", [317, 173, 543, 400], "61 81 81 86 76 84 77 Ages 18-29", 3),
        Region("caption", [315, 417, 545, 440], "Note: Change calculated before rounding.", 4),
        Region("caption", [315, 445, 545, 460], "Source: National Survey, 2015.", 5),
    ]
    els, stream, no_text = _page_elements("d", 0, regions, [0, 0, 612, 792], default_config().ingest, has_text=True)
    chart = next(e for e in els if e.kind != "text")
    assert chart.kind == "chart"  # numeric labels inside the picture
    assert chart.caption == "Most subgroups more optimistic % who expect their finances to improve"
    assert chart.footnote == "Note: Change calculated before rounding. Source: National Survey, 2015."
    notes = [e for e in els if e.role == "footnote"]
    assert len(notes) == 2 and not any(e.role == "caption" for e in els)
    assert all(e.parent == id(chart) for e in notes)  # turned into reading-order indices by parse_pdf
    assert not no_text and stream[-1] is chart
