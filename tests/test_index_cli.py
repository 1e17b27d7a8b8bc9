"""`cdsjax index`: summary, bad inputs (one line each, others still indexed), --strict, exit codes."""

import pytest

from cdsjax.cli import main
from cdsjax.io.index import load_index
from cdsjax.io.parse import ocr_available
from tests import ingest_pdfs as gen


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """The shared document cache of these tests lives in a temporary directory, not ~/.cache."""
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path_factory.getbasetemp() / "cdsjax-cache"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    good = gen.make_synthetic_pdf(d / "good.pdf")
    bad = {
        "not a PDF": gen.make_not_pdf(d / "notes.pdf"),
        "truncated": gen.make_truncated_pdf(d / "truncated.pdf", good),
        "corrupt PDF": gen.make_corrupt_pdf(d / "corrupt.pdf"),
        "encrypted": gen.make_encrypted_pdf(d / "locked.pdf"),
        "zero pages": gen.make_zero_page_pdf(d / "empty.pdf"),
        "no such file": d / "missing.pdf",
    }
    scan = gen.make_image_only_pdf(d / "scan.pdf")
    return d, good, scan, bad


def _lines(text):
    return [line for line in text.splitlines() if line.strip()]


def test_index_good_and_bad(inputs, tmp_path, capsys):
    d, good, scan, bad = inputs
    out = tmp_path / "index"
    rc = main(["index", str(good), *map(str, bad.values()), str(scan), "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 1, "a skipped file makes the exit code non-zero"
    err = _lines(captured.err)
    assert "Traceback" not in captured.err
    for reason, path in bad.items():
        hits = [line for line in err if str(path) in line]
        assert len(hits) == 1 and reason in hits[0] and hits[0].startswith("cdsjax index: error:"), (reason, err)
    warn = [line for line in err if "no text layer" in line]
    ocr = "done" if ocr_available() else "unavailable"  # tests/test_index_life.py needs tesseract under CI=true
    assert len(warn) == 1 and f"2 of 3 pages have no text layer; OCR: {ocr}" in warn[0] and str(scan) in warn[0]
    assert len(err) == len(bad) + 1
    out_text = captured.out
    assert "documents 2 (2 added); 2 processed, 0 from the cache; failed 6" in out_text
    assert "pages 5" in out_text and "table 1" in out_text and "notes" in out_text
    for stage in ("parse", "notes", "embed", "write"):
        assert f"{stage} " in out_text
    corpus = load_index(out)
    assert corpus.doc_ids == ["good.pdf", "scan.pdf"]
    assert {n["page"] for n in corpus.notes if n["doc_id"] == "scan.pdf"} == {0, 1, 2}

    # unchanged re-run: nothing re-processed, exit code 0 without the bad files
    rc = main(["index", str(good), str(scan), "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0 and "(unchanged)" in captured.out and "; 0 processed, 0 from the cache" in captured.out


def test_strict_stops_and_writes_nothing(inputs, tmp_path, capsys):
    d, good, scan, bad = inputs
    out = tmp_path / "index"
    rc = main(["index", str(good), str(bad["encrypted"]), str(scan), "--out", str(out), "--strict", "--no-progress"])
    err = _lines(capsys.readouterr().err)
    assert rc == 1
    assert len(err) == 1 and str(bad["encrypted"]) in err[0] and "encrypted" in err[0] and "nothing was written" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_nothing_indexable(inputs, tmp_path, capsys):
    d, good, scan, bad = inputs
    out = tmp_path / "index"
    rc = main(["index", str(bad["not a PDF"]), str(bad["zero pages"]), "--out", str(out), "--no-progress"])
    err = _lines(capsys.readouterr().err)
    assert rc == 1 and not out.exists()
    assert err[-1] == "cdsjax index: error: no document could be indexed; nothing was written"


def test_unwritable_output(inputs, tmp_path, capsys):
    d, good, scan, bad = inputs
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    rc = main(["index", str(good), "--out", str(blocker / "index"), "--no-progress"])
    err = _lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and str(blocker / "index") in err[0]
    assert "Traceback" not in err[0]
    rc = main(["index", str(good), "--out", str(blocker), "--no-progress"])
    err = _lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and "not a directory" in err[0]


def test_directory_input(inputs, tmp_path, capsys):
    d, good, scan, bad = inputs
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.pdf").write_bytes(good.read_bytes())
    (folder / "readme.txt").write_text("not indexed")
    rc = main(["index", str(folder), "--out", str(tmp_path / "index"), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert load_index(tmp_path / "index").doc_ids == ["a.pdf"]


@pytest.mark.slow
def test_vlm_enrichment_through_the_cli(inputs, tmp_path, capsys):
    import json

    from tests.scripted_server import OpenAIServer, message_images

    d, good, scan, bad = inputs

    def respond(req):
        system = req["messages"][0]["content"]
        if "[cdsjax:describe]" in system:
            return json.dumps({"summary": "described by the test VLM", "keywords": ["k1"], "tags": ["t"]})
        if "[cdsjax:verify-links]" in system:
            return json.dumps({"related": []})
        return json.dumps({"update": False})

    out = tmp_path / "index"
    with OpenAIServer(respond) as srv:
        rc = main(["index", str(good), "--out", str(out), "--enrich", "vlm", "--vlm-url", srv.base_url,
                   "--vlm-model", "test-model", "--no-progress"])
        requests = list(srv.requests)
    assert rc == 0, capsys.readouterr().err
    corpus = load_index(out)
    assert all(n["summary"] == "described by the test VLM" and n["keywords"] == ["k1"] for n in corpus.notes)
    visual = sum(n["kind"] != "text" for n in corpus.notes)
    assert sum(len(message_images(r)) for r in requests) == visual >= 2  # crops are sent as images
    # every candidate link was rejected except caption <-> visual, which is structural
    edges = corpus.link_edges
    roles = [n["role"] for n in corpus.notes]
    assert len(edges) >= 2 and all({roles[i], roles[j]} & {"caption", "footnote"} for i, j in edges)
    assert corpus.manifest["config"]["enrich"]["mode"] == "vlm"

    rc = main(["index", str(good), "--out", str(tmp_path / "other"), "--enrich", "vlm", "--vlm-url",
               "http://127.0.0.1:9/v1", "--no-progress"])
    err = _lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and "cannot reach the VLM at http://127.0.0.1:9/v1" in err[0]
    assert not (tmp_path / "other").exists()
