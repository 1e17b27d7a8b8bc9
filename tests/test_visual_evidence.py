"""What the reader is told of a visual note (issue 69): a table as its caption and rows, a chart with the text
OCR read from its image, and short PDFs whose only line the layout model calls a page header."""

import io

import pytest

import cdsjax.io.parse.pymupdf as pymupdf_parse
from cdsjax.cli import main
from cdsjax.io.index import load_index
from cdsjax.io.parse import ocr_available
from cdsjax.io.reading.prompt import OCR_LABEL, EvidenceItem, build_messages

ROWS = [f"| Model {i} | {80 + i}.{i} | {1000 + 17 * i} |" for i in range(40)]
TABLE_MD = "\n".join(["| Model | Accuracy | Params |", "|---|---|---|"] + ROWS)
FLAT = " ".join(TABLE_MD.replace("|", " ").split())  # what the lite summary of the table holds


def user_text(messages) -> str:
    return "\n".join(p["text"] for p in messages[1]["content"] if p["type"] == "text")


def table_note(**kw) -> EvidenceItem:
    return EvidenceItem(note_id="t#3", doc_id="report.pdf", page=2, kind="table", text=TABLE_MD,
                        summary="Table 2: Accuracy of the models. " + FLAT, caption="Table 2: Accuracy of the models.",
                        **kw)


@pytest.mark.parametrize("image", [False, True])
def test_a_table_goes_as_caption_and_rows_not_its_flattened_summary(image, tmp_path):
    png = None
    if image:
        from PIL import Image

        png = tmp_path / "t.png"
        Image.new("RGB", (8, 6)).save(png)
    text = user_text(build_messages("Which model is most accurate?", [table_note(image_path=png and str(png))],
                                    max_text_chars=None))
    assert text.count("Table 2: Accuracy of the models.") == 1
    assert "Summary:" not in text and FLAT[40:120] not in text
    assert "Caption: Table 2: Accuracy of the models.\nRows:\n| Model | Accuracy | Params |\n|---|---|---|\n" in text
    assert all(row in text for row in ROWS) and "more row" not in text


def test_table_rows_are_cut_whole_at_the_end_with_the_header_kept():
    text = user_text(build_messages("Which model is most accurate?", [table_note()], max_text_chars=600))
    block = text.split("Rows:\n", 1)[1].split("\n\nQuestion:", 1)[0]
    lines = block.splitlines()
    assert lines[:2] == ["| Model | Accuracy | Params |", "|---|---|---|"]
    kept = lines[2:-1]
    assert kept == ROWS[:len(kept)] and len(kept) >= 10  # whole rows from the top, none cut inside a cell
    assert lines[-1] == f"… {len(ROWS) - len(kept)} more rows"
    body = text.split("[1] table | document: report.pdf | page 3\n", 1)[1].split("\n\nQuestion:", 1)[0]
    assert len(body) <= 600 + len("Caption: \nRows:\n")  # the caption and rows share the note's budget


def chart_pdf(path, values):
    """A one-page PDF holding a bar chart as a PNG image (its printed numbers are pixels, not text) under a
    heading and above a caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pymupdf

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=150)
    bars = ax.bar(["North", "South", "East"], values, color="#4878a8")
    for bar, v in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, v + 80, str(v), ha="center", fontsize=12)
    ax.set_ylim(0, 7000)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((72, 80), "Regional sales report", fontsize=14)
    page.insert_image(pymupdf.Rect(100, 120, 500, 376), stream=buf.getvalue())
    page.insert_text((100, 400), "Figure 1: Units sold per region in 2023.", fontsize=10)
    doc.save(str(path))
    return path


VALUES = [4127, 2938, 6154]


@pytest.fixture
def tesseract():
    from tests.conftest import require_tool

    return require_tool("tesseract", usable=ocr_available)


def visual_notes(out):
    return [n for n in load_index(out).notes if n["kind"] in ("figure", "chart")]


def test_a_chart_image_carries_the_numbers_ocr_read_and_the_reader_is_shown_them(tesseract, tmp_path,
                                                                                    monkeypatch, capsys):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    pdf = chart_pdf(tmp_path / "chart.pdf", VALUES)
    out = tmp_path / "index"
    assert main(["index", str(pdf), "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    [note] = visual_notes(out)
    assert note["text"] == "" and all(str(v) in note["ocr_text"] for v in VALUES), note
    assert "North" in note["ocr_text"] and note["caption"] == "Figure 1: Units sold per region in 2023."
    from cdsjax.pipeline import Pipeline

    pipe = Pipeline.from_paths([str(out)])  # the reader's evidence as `ask` builds it
    question = "How many units were sold in the East?"
    items = pipe.evidence_items(pipe.retrieve(question, budget=3).evidence)
    [item] = [i for i in items if i.is_visual]
    assert item.ocr_text == note["ocr_text"]
    text = user_text(build_messages(question, items, images=False))
    shown = text.split(f"{OCR_LABEL}: ", 1)[1]
    assert all(str(v) in shown for v in VALUES)
    assert text.index("Caption: Figure 1") < text.index(OCR_LABEL)


def test_without_tesseract_a_chart_indexes_with_one_warning_and_is_read_once_it_is_installed(
        tesseract, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    pdfs = [str(chart_pdf(tmp_path / f"chart{i}.pdf", [v + i for v in VALUES])) for i in range(2)]
    out = tmp_path / "index"
    real = pymupdf_parse.ocr_available
    monkeypatch.setattr(pymupdf_parse, "ocr_available", lambda: False)  # as on a machine without tesseract
    assert main(["index", *pdfs, "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    o, e = capsys.readouterr()
    warned = [line for line in e.splitlines() if "Tesseract" in line]
    assert len(warned) == 1 and "tesseract-ocr" in warned[0], e  # one line for the run, not one per document
    assert [n["ocr_text"] for n in visual_notes(out)] == ["", ""]
    monkeypatch.setattr(pymupdf_parse, "ocr_available", real)  # tesseract is installed now
    assert main(["index", *pdfs, "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    o, e = capsys.readouterr()
    assert "2 processed" in o and "Tesseract" not in e
    assert all(str(VALUES[0]) in n["ocr_text"] or str(VALUES[0] + 1) in n["ocr_text"] for n in visual_notes(out))


def test_a_one_sentence_pdf_indexes_into_one_note(tmp_path, monkeypatch, capsys):
    import pymupdf

    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    sentence = "The harbour of Zanzibar opened in 1897 after two years of work."
    doc = pymupdf.open()
    doc.new_page(width=612, height=792).insert_text((72, 72), sentence, fontsize=11)  # where headers sit
    doc.save(str(tmp_path / "one.pdf"))
    out = tmp_path / "index"
    assert main(["index", str(tmp_path / "one.pdf"), "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    notes = load_index(out).notes
    assert [(n["kind"], n["text"]) for n in notes] == [("text", sentence)]


def test_a_header_and_page_number_that_repeat_across_pages_are_left_out(tmp_path, monkeypatch):
    import pymupdf

    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    body = ("The northern plant produced more units this quarter than in any quarter before, because the second "
            "line started in March and ran without stops. ") * 6
    doc = pymupdf.open()
    for i in range(3):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), "ACME Corporation Quarterly Review", fontsize=8)
        page.insert_textbox(pymupdf.Rect(72, 100, 540, 500), f"Section {i + 1}. " + body, fontsize=11)
        page.insert_text((300, 770), f"{i + 1}", fontsize=8)
    doc.save(str(tmp_path / "report.pdf"))
    out = tmp_path / "index"
    assert main(["index", str(tmp_path / "report.pdf"), "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    notes = load_index(out).notes
    assert [n["text"].split(".")[0] for n in notes] == ["Section 1", "Section 2", "Section 3"]
    assert not any("ACME" in n["text"] for n in notes)
