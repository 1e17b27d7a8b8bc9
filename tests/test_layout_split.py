"""The ways cdsjax.io.layout runs PyMuPDF's layout model give the elements and crops of the plain run: a
document split over a helper process (a rotated page among the helper's; the helper's half of the keywords),
and pages batched through the image network."""

import hashlib
import json

import pymupdf

from cdsjax.config import get_config
from cdsjax.io import layout
from cdsjax.io.notes import extract_keywords
from cdsjax.io.parse import parse_pdf
from tests import ingest_pdfs as gen


def _parse(pdf, crops):
    parsed = parse_pdf(pdf, "d", config=get_config(), crop_dir=crops)
    images = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(crops.glob("*.png"))}
    return [json.dumps(e.to_dict(), sort_keys=True) for e in parsed.elements], images


def test_split_and_batched_runs_equal_the_plain_run(tmp_path, monkeypatch):
    part = gen.make_synthetic_pdf(tmp_path / "part.pdf")
    doc = pymupdf.open()
    for _ in range(2):
        doc.insert_pdf(pymupdf.open(part))
    doc[3].set_rotation(90)  # a rotated page in the helper's half
    doc.save(tmp_path / "four.pdf")
    pdf = tmp_path / "four.pdf"

    layout.set_page_split(False)
    plain = _parse(pdf, tmp_path / "plain")
    assert plain[0] and plain[1]  # elements and crops to compare

    layout.prepare_models()
    monkeypatch.setattr(layout, "SPLIT_MIN_PAGES", 2)
    monkeypatch.setitem(layout._STATE, "threads", 2)  # as on a machine with two free cores
    # the pages are claimed as each process gets to them; this process leaves the last two to the helper, so
    # that the helper's path runs whatever the timing
    monkeypatch.setitem(layout._STATE, "reserve", 2)
    layout.set_page_split(True)
    try:
        layout.prestart_helper(pdf)  # as `ask` does for a new PDF: the helper the split then uses
        started = layout._STATE.get("helper")
        assert isinstance(started, layout._Helper)
        split = _parse(pdf, tmp_path / "split")
        helper = layout._STATE.get("helper")
        assert helper is started, "the document was not split by the helper started ahead"
        assert helper.claims.array[1] <= 2  # the helper analysed pages 2 and 3 at least
        # the helper also computes half of a document's keywords: the same as computed here
        texts = [json.loads(e)["text"] for e in split[0]] * 3 + ["", "12 34"]

        def here(t):
            return extract_keywords(t, top=5)

        assert layout.keywords_in_helper(texts, 5, "en", here) == [here(t) for t in texts]
        assert layout._STATE.get("helper") is helper and not helper.busy  # it answered (no fallback)
    finally:
        layout.stop_helper()
        layout.set_page_split(True)
    assert split == plain

    layout.set_page_split(False)
    layout.set_page_batching(True)
    try:
        batched = _parse(pdf, tmp_path / "batched")
        stats = layout.batch_stats()
    finally:
        layout.set_page_batching(False)
        layout.set_page_split(True)
    assert stats["calls"] >= 1 and stats["batched"] >= 2  # pages found their outputs computed in a batch
    assert batched == plain
