"""The ways cdsjax.io.parse.layout runs PyMuPDF's layout model give the elements and crops of the plain run: a
document split over a helper process (a rotated page and a scanned page, read with OCR, among the helper's; the
helper's half of the keywords), and pages batched through the image network; how the
two processes claim pages."""

import hashlib
import json
import time

import pymupdf

from cdsjax.config import get_config
from cdsjax.io.parse import layout, layout_split
from cdsjax.io.parse import pymupdf as parse_module
from cdsjax.io.keywords import extract_keywords
from cdsjax.io.parse import ocr_available, parse_pdf
from tests import ingest_pdfs as gen


def _parse(pdf, crops, page_split=True):
    parsed = parse_pdf(pdf, "d", config=get_config(), crop_dir=crops, page_split=page_split)
    images = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(crops.glob("*.png"))}
    return [json.dumps(e.to_dict(), sort_keys=True) for e in parsed.elements], images


def test_split_and_batched_runs_equal_the_plain_run(tmp_path, monkeypatch):
    part = gen.make_synthetic_pdf(tmp_path / "part.pdf")
    doc = pymupdf.open()
    for _ in range(2):
        doc.insert_pdf(pymupdf.open(part))
    doc[3].set_rotation(90)  # a rotated page in the helper's half
    # a scanned page, last (the helper's): page 0 as an image, no text layer
    scan = doc.new_page(width=doc[0].rect.width, height=doc[0].rect.height)
    scan.insert_image(scan.rect, pixmap=doc[0].get_pixmap(dpi=150))
    doc.save(tmp_path / "five.pdf")
    pdf = tmp_path / "five.pdf"

    probed = []  # pages whose text layer this process read (the helper reads its own)
    read = parse_module.read_text_layer
    monkeypatch.setattr(parse_module, "read_text_layer",
                        lambda page, **k: probed.append(page.number) or read(page, **k))
    plain = _parse(pdf, tmp_path / "plain", page_split=False)
    assert plain[0] and plain[1]  # elements and crops to compare
    assert probed == [0, 1, 2, 3, 4]
    on_scan = [json.loads(e) for e in plain[0] if json.loads(e)["page"] == 4]
    if ocr_available():  # OCR read the scanned page's text
        assert any(e["kind"] == "text" and "evidence" in e["text"].lower() for e in on_scan), on_scan
    probed.clear()

    layout.prepare_models()
    layout_split.stop_helper()  # a helper an earlier test of this process left running
    monkeypatch.setattr(layout_split, "SPLIT_MIN_PAGES", 2)
    monkeypatch.setattr(layout.PROCESS, "limits", layout.SessionLimits(2))  # as on a machine with two free cores
    # the pages are claimed as each process gets to them; this process leaves the last two to the helper, so
    # that the helper's path runs whatever the timing
    monkeypatch.setattr(layout_split.HELPER, "reserve", 2)
    try:
        # a helper started by the split itself: it claims pages once this process's request comes
        split_on_request = _parse(pdf, tmp_path / "on_request")
        assert isinstance(layout_split.HELPER.current, layout_split._Helper)
        assert 3 not in probed and 4 not in probed  # the helper read its pages' text layer, the scan's OCR too
        layout_split.stop_helper()
        probed.clear()

        layout_split.prestart_helper(pdf)  # as `ask` does for a new PDF: the helper the split then uses
        started = layout_split.HELPER.current
        assert isinstance(started, layout_split._Helper)
        # it analyses pages from the back before this process asks: wait until it has (as `ask` importing JAX)
        deadline = time.monotonic() + 120
        while started.claims.array[3] != 5 or started.claims.array[1] > 3:
            assert started.proc.is_alive() and time.monotonic() < deadline, "no pages claimed ahead"
            time.sleep(0.05)
        split = _parse(pdf, tmp_path / "split")
        helper = layout_split.HELPER.current
        assert helper is started, "the document was not split by the helper started ahead"
        assert helper.claims.array[1] <= 3 and helper.claims.array[3] == -1  # the request took them over
        assert 3 not in probed and 4 not in probed  # the scanned page's OCR was read at the request
        # the helper also computes a document's keywords with this process: the same as computed here
        texts = [json.loads(e)["text"] for e in split[0]] * 3 + ["", "12 34"]
        done_here = []

        def here(t):
            done_here.append(t)
            return extract_keywords(t, top=5)

        def slow(t):  # this process is slow: the helper claims most texts from the back
            time.sleep(0.2)
            return here(t)

        assert layout_split.keywords_in_helper(texts, 5, "en", slow) == [extract_keywords(t, top=5) for t in texts]
        assert layout_split.HELPER.current is helper and not helper.busy  # it answered (no fallback)
        assert 1 <= len(done_here) < len(texts) // 2, len(done_here)  # the helper took the larger share
    finally:
        layout_split.stop_helper()
    assert split == plain and split_on_request == plain

    from pymupdf.layout.onnx.ImageFeatureExtractorV1 import ImageFeatureExtractorV1
    from pymupdf4llm.helpers import document_layout

    def methods():
        return ImageFeatureExtractorV1.predict, document_layout.get_layout_locked

    def image_session():  # PyMuPDF's layout model's image network, as it runs
        return pymupdf._get_layout.__closure__[0].cell_contents._model.feature_extractor._session

    own = methods(), image_session()  # page batching off: PyMuPDF's own methods and session
    with layout.page_batching():
        batched = _parse(pdf, tmp_path / "batched", page_split=False)
        stats = layout.batch_stats()
        wrapped = methods(), image_session()
    assert stats["calls"] >= 1 and stats["batched"] >= 2  # pages found their outputs computed in a batch
    assert batched == plain
    assert isinstance(wrapped[1], layout.PageBatcher) and wrapped[0] != own[0]
    assert (methods(), image_session()) == own  # batching off: PyMuPDF's own methods and session back


def test_pages_are_claimed_from_both_ends_once():
    """This process claims pages from the front, the helper from the back, each page once; when this process
    runs out it closes the claims, so a helper still loading takes none and is not waited for."""
    import multiprocessing

    claims = layout_split._Claims(multiprocessing.get_context("spawn"))
    claims.reset(7)
    assert claims.take_front(2) == range(0, 2) and claims.take_back(2) == range(5, 7)
    assert claims.take_front(2, limit=3) == range(2, 3)  # never past the pages left to the helper
    assert claims.take_front(2, limit=3) is None and claims.helper_took(7)  # pages 3-4 wait for the helper
    assert claims.take_back(2) == range(3, 5) and claims.take_front(2) is None and claims.take_back(2) is None
    claims.reset(4)
    while claims.take_front(2) is not None:
        pass
    assert claims.take_back(2) is None and not claims.helper_took(4)
