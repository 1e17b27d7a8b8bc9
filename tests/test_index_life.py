"""An index's life, as a user lives it: add, update, remove, list, lock, resume, repair, OCR, enrichment.

Each test reproduces one failure of issue 13 on real PDFs with real processes (concurrent writers and
``kill -9`` as subprocesses, a misbehaving OpenAI-compatible server on 127.0.0.1, bytes changed on disk)
and shows what the user now sees instead.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cdsjax.io.parse as parse_mod
import cdsjax.io.parse.pymupdf as pymupdf_parse
from cdsjax.cli import main
from cdsjax.io import doccache, store
from cdsjax.io.index import load_index
from cdsjax.io.parse import ocr_available
from tests import ingest_pdfs as gen

from tests.conftest import DATA as SHARED_DATA

DATA = SHARED_DATA / "pdfs"
A = DATA / "multicolumn.pdf"  # 3 pages, a table
B = DATA / "pdflatex-image.pdf"  # 1 page, a figure
ROOT = Path(__file__).resolve().parents[1]

needs_data = pytest.mark.needs_data  # without the benchmark data these skip (tests/conftest.py)
pytestmark = needs_data


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("doc-cache")


@pytest.fixture(autouse=True)
def _private_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(cache_dir))


@pytest.fixture(scope="module")
def two_docs(tmp_path_factory, cache_dir):
    """An index of A and B, built once (copy it before changing it)."""
    os.environ["CDSJAX_CACHE"] = str(cache_dir)
    out = tmp_path_factory.mktemp("built") / "index"
    assert main(["index", str(A), str(B), "--out", str(out), "--no-progress"]) == 0
    return out


def run_cli(*args, env_cache, timeout=240):
    env = dict(os.environ, CDSJAX_CACHE=str(env_cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "cdsjax.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def copy_index(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def no_traceback(*texts):
    for t in texts:
        assert "Traceback" not in t, t


# --------------------------------------------------------------------------- 1. an index is a set


def test_adding_a_document_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "index"
    assert main(["index", str(A), "--out", str(out), "--no-progress"]) == 0
    assert main(["index", str(B), "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "documents 2 (1 added, 1 kept)" in text
    assert load_index(out).doc_ids == ["multicolumn.pdf", "pdflatex-image.pdf"]

    assert main(["index", "--list", str(out)]) == 0
    listing = capsys.readouterr().out
    assert "2 documents" in listing and "multicolumn.pdf  3 pages" in listing and str(B) in listing

    assert main(["index", "--remove", "multicolumn.pdf", "--out", str(out), "--no-progress"]) == 0
    assert "1 removed" in capsys.readouterr().out
    assert load_index(out).doc_ids == ["pdflatex-image.pdf"]
    rc = main(["index", "--remove", "nope.pdf", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "no document 'nope.pdf'" in err and "pdflatex-image.pdf" in err

    assert main(["index", str(A), "--out", str(out), "--replace", "--no-progress"]) == 0
    assert load_index(out).doc_ids == ["multicolumn.pdf"]


def test_a_changed_pdf_is_updated_in_place(tmp_path, capsys):
    doc = gen.make_text_pdf(tmp_path / "report.pdf", pages=1, text="The first version talks about apples. ")
    out = tmp_path / "index"
    assert main(["index", str(doc), str(B), "--out", str(out), "--no-progress"]) == 0
    gen.make_text_pdf(doc, pages=1, text="The second version talks about oranges. ")
    capsys.readouterr()
    assert main(["index", str(doc), "--out", str(out), "--no-progress"]) == 0
    assert "(1 updated, 1 kept)" in capsys.readouterr().out
    corpus = load_index(out)
    assert corpus.doc_ids == ["report.pdf", "pdflatex-image.pdf"]
    text = " ".join(n["text"] for n in corpus.notes if n["doc_id"] == "report.pdf")
    assert "oranges" in text and "apples" not in text


@pytest.mark.slow
def test_two_concurrent_writers_keep_both_documents(two_docs, cache_dir, tmp_path):
    # Both documents are in the document cache (two_docs indexed them), so each process only imports, reads
    # its cached document and writes (a few seconds): the two writes meet at the index lock.
    out = tmp_path / "index"
    env = dict(os.environ, CDSJAX_CACHE=str(cache_dir), PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "index", str(pdf), "--out", str(out),
                               "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for pdf in (A, B)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, results):
        assert p.returncode == 0, e
        no_traceback(o, e)
    assert sorted(load_index(out).doc_ids) == ["multicolumn.pdf", "pdflatex-image.pdf"]
    assert not list(tmp_path.glob(".index.*")), "no lock file or staging directory left behind"


def test_a_second_writer_waits_for_the_first(two_docs, tmp_path, capsys):
    import threading

    out = copy_index(two_docs, tmp_path / "index")
    extra = gen.make_text_pdf(tmp_path / "extra.pdf", pages=1, text="A third document about pears. ")
    release = threading.Event()
    held = threading.Event()

    def first_writer():
        with store.writer_lock(out):  # the same lock a `cdsjax index` run holds while it writes
            held.set()
            release.wait(20)

    t = threading.Thread(target=first_writer)
    t.start()
    held.wait(10)
    result = {}
    second = threading.Thread(target=lambda: result.setdefault("rc", main(
        ["index", str(extra), "--out", str(out), "--no-progress"])))
    second.start()
    time.sleep(1.0)
    assert second.is_alive() and "rc" not in result, "the second writer waits"
    release.set()
    second.join(120)
    t.join()
    o, e = capsys.readouterr()
    assert result["rc"] == 0 and "waiting for another cdsjax index run" in e
    assert load_index(out).doc_ids == ["multicolumn.pdf", "pdflatex-image.pdf", "extra.pdf"]


def test_no_wait_exits_when_another_writer_holds_the_lock(tmp_path):
    out = tmp_path / "index"
    with store.writer_lock(out):
        r = run_cli("index", B, "--out", out, "--no-wait", "--no-progress", env_cache=tmp_path / "cache", timeout=120)
    assert r.returncode == 3
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and str(out) in lines[0] and f"pid {os.getpid()}" in lines[0]
    assert "another cdsjax index run" in lines[0] and not out.exists()


# --------------------------------------------------------------------------- 6. a shared cache; kill -9


def test_the_same_pdf_in_a_new_index_comes_from_the_cache(two_docs, tmp_path, capsys, monkeypatch):
    def no_parse(*a, **k):
        raise AssertionError("parsed again although the document cache holds it")

    monkeypatch.setattr(parse_mod, "parse_pdf", no_parse)
    capsys.readouterr()
    assert main(["index", str(A), "--out", str(tmp_path / "other"), "--no-progress"]) == 0
    assert "0 processed, 1 from the cache" in capsys.readouterr().out


def test_a_new_notes_version_redoes_notes_and_embeddings_from_the_cached_parse(two_docs, tmp_path, capsys,
                                                                               monkeypatch):
    import cdsjax.io.notes as notes_mod

    def no_parse(*a, **k):
        raise AssertionError("parsed again although the document cache holds its parse")

    monkeypatch.setattr(parse_mod, "parse_pdf", no_parse)
    monkeypatch.setattr(notes_mod, "NOTES_VERSION", notes_mod.NOTES_VERSION + "-test")
    capsys.readouterr()
    assert main(["index", str(A), "--out", str(tmp_path / "renoted"), "--no-progress"]) == 0
    assert "1 processed" in capsys.readouterr().out
    idx = load_index(tmp_path / "renoted")
    old = load_index(two_docs)
    assert [n["note_id"] for n in idx.notes] == [n["note_id"] for n in old.notes if n["doc_id"] == idx.notes[0]["doc_id"]]
    assert all("section" in n and "title" in n for n in idx.notes)


def test_kill_9_midway_resumes_with_the_finished_documents(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    big = gen.make_text_pdf(tmp_path / "long.pdf", pages=25, repeat=8)
    out = tmp_path / "index"
    env = dict(os.environ, CDSJAX_CACHE=str(cache), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "index", str(B), str(big), str(A), "--out",
                             str(out), "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    finished = []
    while time.time() < deadline and proc.poll() is None:
        finished = glob.glob(str(cache / "docs" / "*" / "*" / "entry.json"))
        if finished:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the test could kill it"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = glob.glob(str(cache / "docs" / "*" / "*" / "entry.json"))
    assert len(finished) >= 1 and not out.exists(), "killed before publishing: no index, some cached documents"

    # the same command again (in this process: the resume is the cache on disk, not the process)
    monkeypatch.setenv("CDSJAX_CACHE", str(cache))
    capsys.readouterr()
    assert main(["index", str(B), str(big), str(A), "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    reused = int(text.split(" from the cache")[0].rsplit(" ", 1)[-1])
    assert reused == len(finished) and "documents 3 (3 added)" in text
    assert not [p for p in (cache / "docs").iterdir() if p.name.startswith(".tmp-")], "killed staging cleaned up"


# --------------------------------------------------------------------------- 3. damage is found and repaired


def test_one_changed_byte_in_notes_is_repaired_by_index(two_docs, tmp_path, capsys):
    out = copy_index(two_docs, tmp_path / "index")
    data = bytearray((out / "notes.jsonl").read_bytes())
    i = data.index(b'"text": "') + 12
    data[i] = ord("#") if data[i] != ord("#") else ord("$")
    (out / "notes.jsonl").write_bytes(bytes(data))
    rc = main(["ask", str(out), "what is in the table?", "--json", "--no-read"])
    err = capsys.readouterr().err
    assert rc == 1 and f"{out / 'notes.jsonl'}: damaged" in err and "--verify" in err
    rc = main(["index", str(A), str(B), "--out", str(out), "--no-progress"])
    o, e = capsys.readouterr()
    no_traceback(o, e)
    assert rc == 0 and "(written)" in o and "repaired 1: multicolumn.pdf" in o and "notes.jsonl" in o
    assert len(load_index(out).notes) == len(load_index(two_docs).notes)


def test_truncated_arrays_and_deleted_elements_are_repaired_by_verify(two_docs, tmp_path, capsys):
    out = copy_index(two_docs, tmp_path / "index")
    files = [p for p in (out / "arrays").rglob("*") if p.is_file()]
    biggest = max(files, key=lambda p: p.stat().st_size)
    with open(biggest, "r+b") as f:
        f.truncate(biggest.stat().st_size // 2)
    (out / "elements.jsonl").unlink()
    capsys.readouterr()
    rc = main(["index", "--verify", str(out)])
    o, e = capsys.readouterr()
    no_traceback(o, e)
    assert rc == 0 and "2 damaged document(s)" in o and "-> repaired" in o and str(out) in o
    assert main(["index", "--verify", str(out)]) == 0
    assert "all intact" in capsys.readouterr().out
    assert len(load_index(out).elements()) == len(load_index(two_docs).notes)


def test_damage_that_cannot_be_repaired_is_named(tmp_path, capsys, monkeypatch):
    pdf = tmp_path / "gone.pdf"
    shutil.copy(B, pdf)
    out = tmp_path / "index"
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    assert main(["index", str(pdf), str(A), "--out", str(out), "--no-progress"]) == 0
    pdf.unlink()
    shutil.rmtree(tmp_path / "cache")
    data = (out / "notes.jsonl").read_bytes()
    (out / "notes.jsonl").write_bytes(data[:20] + b"#" + data[21:])  # in gone.pdf's first note
    capsys.readouterr()
    rc = main(["index", "--verify", str(out)])
    o, e = capsys.readouterr()
    no_traceback(o, e)
    assert rc == 1 and "its PDF is gone" in o and str(pdf) in o
    assert load_index(out).doc_ids == ["multicolumn.pdf"], "the intact document is kept"


def test_ask_pdf_rebuilds_a_damaged_cache_entry(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    pdf = tmp_path / "doc.pdf"
    shutil.copy(B, pdf)
    assert main(["ask", str(pdf), "what does the figure show?", "--json", "--no-read"]) == 0
    capsys.readouterr()
    notes = glob.glob(str(tmp_path / "cache" / "docs" / "*" / "*" / "notes.jsonl"))
    assert len(notes) == 1
    Path(notes[0]).write_bytes(Path(notes[0]).read_bytes()[:-25])  # truncated entry
    single = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("doc-")]
    shutil.rmtree(single[0])  # the single-PDF index too: the cache entry is all that is left
    rc = main(["ask", str(pdf), "what does the figure show?", "--json", "--no-read"])
    o, e = capsys.readouterr()
    no_traceback(o, e)
    assert rc == 0 and json.loads(o)["evidence"]
    assert notes[0] in e and "damaged" in e
    doccache.DocCache(tmp_path / "cache" / "docs").read(Path(notes[0]).parent.name)  # rebuilt: reads cleanly


# --------------------------------------------------------------------------- 2. enrichment failures say so


def _vlm_args(url):
    return ["--enrich", "vlm", "--vlm-url", url, "--vlm-model", "test-model", "--no-progress"]


def test_vlm_failures_are_counted_strict_fails_and_a_rerun_retries_only_them(tmp_path, capsys, monkeypatch):
    from tests.scripted_server import OpenAIServer

    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    state = {"mode": "500"}

    def respond(req):
        system = req["messages"][0]["content"]
        if state["mode"] == "500":
            return (500, {"error": {"message": "model crashed"}})
        if state["mode"] == "text":
            return "Sorry, I cannot help with that."
        if "[cdsjax:describe]" in system:
            return json.dumps({"summary": "described by the test VLM", "keywords": ["k"], "tags": ["t"]})
        if "[cdsjax:verify-links]" in system:
            return json.dumps({"related": []})
        return json.dumps({"update": False})

    out = tmp_path / "index"
    with OpenAIServer(respond) as srv:
        rc = main(["index", str(A), "--out", str(out), "--strict", *_vlm_args(srv.base_url)])
        o, e = capsys.readouterr()
        assert rc == 1 and "VLM enrichment failed for" in e and "HTTP 500" in e and "nothing was written" in e
        assert not out.exists()
        n_500 = len(srv.requests)

        state["mode"] = "text"
        rc = main(["index", str(A), "--out", str(out), *_vlm_args(srv.base_url)])
        o, e = capsys.readouterr()
        no_traceback(o, e)
        corpus = load_index(out)
        n = len(corpus.notes)
        assert rc == 0 and f"0 notes by the VLM, {n} lite-fallback" in o and "reply is not a JSON object" in o
        assert all(x["enrichment"] == "lite-fallback" for x in corpus.notes)
        assert corpus.manifest["documents"][0]["enrichment"] == {"lite-fallback": n}

        state["mode"] = "ok"
        before = len(srv.requests)
        rc = main(["index", str(A), "--out", str(out), *_vlm_args(srv.base_url)])
        o, e = capsys.readouterr()
        retried = srv.requests[before:]
    assert n_500 <= 8 * 4, "a broken server is given up on after a few failures, not asked for every note"
    assert rc == 0 and "(written)" in o and "lite-fallback" not in o
    assert len(retried) == n and all("[cdsjax:describe]" in r["messages"][0]["content"] for r in retried)
    corpus = load_index(out)
    assert all(x["enrichment"] == "vlm" and x["summary"] == "described by the test VLM" for x in corpus.notes)


# --------------------------------------------------------------------------- 5. scanned pages


def make_scanned_pdf(path: Path, text: str) -> Path:
    """A real scan: a page with text rendered to an image, placed on a page with no text layer."""
    import pymupdf

    src = pymupdf.open()
    page = src.new_page(width=612, height=792)
    page.insert_htmlbox(pymupdf.Rect(72, 72, 540, 400), f"<p style='font-size:18px'>{text}</p>")
    pix = page.get_pixmap(dpi=200)
    doc = pymupdf.open()
    for _ in range(2):
        doc.new_page(width=612, height=792).insert_image(pymupdf.Rect(0, 0, 612, 792), pixmap=pix)
    doc.save(str(path))
    return path


SCAN_TEXT = "Quarterly revenue of the Zanzibar division grew by forty percent after the harbour expansion."


@pytest.fixture
def tesseract():
    """Tesseract with its language data; a test that uses this fails under CI=true without it."""
    from tests.conftest import require_tool

    return require_tool("tesseract", usable=ocr_available)


def test_scanned_pages_are_read_with_ocr_and_reported_once(tesseract, tmp_path, capfd):
    pdf = make_scanned_pdf(tmp_path / "scan.pdf", SCAN_TEXT + " Tiny marks: . , ; : ' `")
    out = tmp_path / "index"
    assert main(["index", str(pdf), "--out", str(out), "--no-progress"]) == 0
    o, e = capfd.readouterr()  # the file descriptors: Tesseract's own C++ lines would show here
    lines = [x for x in e.splitlines() if x.strip()]
    assert lines == [f"cdsjax index: note: {pdf}: 2 of 2 pages have no text layer; OCR: done"]
    corpus = load_index(out)
    text = " ".join(n["text"] for n in corpus.notes if n["kind"] == "text")
    assert "Zanzibar" in text and "harbour" in text
    assert all(n.get("no_text_layer") and n.get("ocr") == "done" for n in corpus.notes)


def test_without_ocr_scanned_pages_are_page_images_with_one_warning(tmp_path, capsys):
    pdf = make_scanned_pdf(tmp_path / "scan.pdf", SCAN_TEXT)
    out = tmp_path / "index"
    assert main(["index", str(pdf), "--out", str(out), "--ocr", "off", "--no-progress"]) == 0
    o, e = capsys.readouterr()
    lines = [x for x in e.splitlines() if "no text layer" in x]
    assert lines == [f"cdsjax index: warning: {pdf}: 2 of 2 pages have no text layer; OCR: off"]
    corpus = load_index(out)
    assert {n["kind"] for n in corpus.notes} == {"figure"} and all(n["no_text_layer"] for n in corpus.notes)
    rc = main(["ask", str(out), "How did the Zanzibar revenue grow?", "--json", "--no-read", "--budget", "2"])
    o, e = capsys.readouterr()
    assert rc == 0 and json.loads(o)["evidence"]
    warn = [x for x in e.splitlines() if "pages without a text layer" in x]
    assert len(warn) == 1 and warn[0].startswith("cdsjax ask: warning: 2 of 2 evidence notes") and "OCR: off" in warn[0]


def test_a_damaged_manifest_is_named_and_replace_rebuilds(two_docs, tmp_path, capsys):
    out = copy_index(two_docs, tmp_path / "index")
    (out / "manifest.json").write_text((out / "manifest.json").read_text()[:100])
    for args in (["ask", str(out), "what is in the table?", "--no-read"], ["index", "--verify", str(out)],
                 ["index", str(A), "--out", str(out), "--no-progress"]):
        rc = main(args)
        o, e = capsys.readouterr()
        no_traceback(o, e)
        assert rc != 0 and f"{out / 'manifest.json'}: damaged" in e and "--replace" in e, args
    assert main(["index", str(A), str(B), "--out", str(out), "--replace", "--no-progress"]) == 0
    assert load_index(out).doc_ids == ["multicolumn.pdf", "pdflatex-image.pdf"]


def test_installing_tesseract_later_redoes_only_the_scanned_documents(tesseract, tmp_path, capsys, monkeypatch):
    pdf = make_scanned_pdf(tmp_path / "scan.pdf", SCAN_TEXT)
    out = tmp_path / "index"
    real = pymupdf_parse.ocr_available
    monkeypatch.setattr(pymupdf_parse, "ocr_available", lambda: False)  # as on a machine without tesseract
    assert main(["index", str(pdf), str(B), "--out", str(out), "--no-progress"]) == 0
    o, e = capsys.readouterr()
    assert "2 of 2 pages have no text layer; OCR: unavailable (install tesseract-ocr" in e
    assert "Zanzibar" not in " ".join(n["text"] for n in load_index(out).notes)
    monkeypatch.setattr(pymupdf_parse, "ocr_available", real)  # tesseract is installed now
    assert main(["index", str(pdf), str(B), "--out", str(out), "--no-progress"]) == 0
    o, e = capsys.readouterr()
    assert "1 processed" in o and "OCR: done" in e
    corpus = load_index(out)
    assert "Zanzibar" in " ".join(n["text"] for n in corpus.notes if n["doc_id"] == "scan.pdf")
    assert corpus.doc_ids == ["scan.pdf", "pdflatex-image.pdf"]
