"""`cdsjax data fetch` (pooch) against a local HTTP server (127.0.0.1) serving small fixture sources: the
laid-out tree is read by the benchmark loaders run_eval uses; a file already there and checked is not requested
again; a broken-off download or a wrong checksum is one line, leaves nothing at the destination, and the file is
fetched again on the next run; an archive is unpacked by pooch. The real sources' recorded figures are checked
against the shared data (when it is there)."""

import os
import dataclasses
import hashlib
import io
import json
import pathlib
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cdsjax.cli import main
from cdsjax.commands import data as fetch
from cdsjax.io.datasets import load_benchmark, recorded, sources
from cdsjax.io.datasets.sources import Derived, Download, Source
from tests import ingest_pdfs as gen


class Server:
    """Serves ``files`` (path -> bytes) with Range support; ``truncate[path] = n`` sends the full
    Content-Length but only n bytes, then closes; ``corrupt`` holds paths served with a flipped byte."""

    def __init__(self):
        self.files, self.truncate, self.corrupt, self.requests = {}, {}, set(), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.requests.append((self.path, self.headers.get("Range")))
                body = outer.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                if self.path in outer.corrupt:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                start, status = 0, 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start, status = int(rng[6:-1]), 206
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                part = body[start:]
                self.send_response(status)
                self.send_header("Content-Length", str(len(part)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.end_headers()
                cut = outer.truncate.pop(self.path, None)
                self.wfile.write(part if cut is None else part[:cut])
                if cut is not None:
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def upstream_sha(upstream, path) -> str:
    return _sha(upstream[path])


def _qasper_paper(title):
    par = f"The {title} method improves recall on long documents."
    return {"title": title, "abstract": "An abstract.", "full_text": [{"section_name": "Intro", "paragraphs": [par]}],
            "figures_and_tables": [{"file": "1-Table1-1.png", "caption": "Table 1: Results."}],
            "qas": [{"question": f"What does {title} improve?", "question_id": title,
                     "answers": [{"answer": {"unanswerable": False, "extractive_spans": ["recall"], "yes_no": None,
                                             "free_form_answer": "", "evidence": [par, "FLOAT SELECTED: Table 1: "
                                                                                       "Results."]}}]}]}


def _hotpot(qid):
    return {"_id": qid, "type": "bridge", "level": "easy", "question": f"Question {qid}?", "answer": "yes",
            "supporting_facts": [["Alpha", 0]],
            "context": [["Alpha", ["Alpha is a letter. ", "It comes first."]], ["Beta", ["Beta follows."]]]}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    """Upstream files as a host would serve them, and Sources over them (laid out by the real build helpers).
    Each upstream file holds one entry more than the development subset, which the layout must leave out."""
    tmp = tmp_path_factory.mktemp("upstream")
    pdfs = {name: gen.make_text_pdf(tmp / name, pages=n).read_bytes() for name, n in (("a.pdf", 2), ("b.pdf", 1))}
    samples = [{"doc_id": "a.pdf", "doc_type": "Report", "question": "What is on page two?", "answer": "text",
                "evidence_pages": "[2]", "evidence_sources": "['Pure-text']", "answer_format": "Str"},
               {"doc_id": "kept-aside.pdf", "question": "Left out?", "evidence_pages": "[]"},
               {"doc_id": "b.pdf", "doc_type": "Report", "question": "Who signed it?", "answer": "Not answerable",
                "evidence_pages": "[]", "evidence_sources": "[]", "answer_format": "None"}]
    mmdocir = [{"doc_name": "a.pdf", "questions": [{"Q": "What is on page two?", "A": "text", "page_id": [1],
                                                    "layout_mapping": [{"page": 1, "page_size": [612, 792],
                                                                        "bbox": [72, 72, 300, 200]}]}]},
               {"doc_name": "kept-aside.pdf", "questions": []}]
    papers = {"p1": _qasper_paper("Alpha"), "p2": _qasper_paper("Beta"), "p3": _qasper_paper("Gamma")}
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        raw = json.dumps(papers).encode()
        info = tarfile.TarInfo("qasper-test/qasper-test-v0.3.json")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    hotpot = [_hotpot("h1"), _hotpot("h2"), _hotpot("h3")]
    upstream = {"/mmlb/a.pdf": pdfs["a.pdf"], "/mmlb/b.pdf": pdfs["b.pdf"],
                "/mmlb/samples.json": json.dumps(samples, indent=4).encode(),
                "/mmdocir/ann.jsonl": "".join(json.dumps(d) + "\n" for d in mmdocir).encode(),
                "/qasper/test.tgz": tgz.getvalue(), "/hotpot/hotpotqa.json": json.dumps(hotpot).encode()}
    # what the layout must write (the "recorded" figures of these fixture sources)
    laid = {"mmlongbench/samples.json": json.dumps([samples[0], samples[2]], indent=1, ensure_ascii=False).encode(),
            "mmlongbench/mmdocir_annotations.jsonl": (json.dumps(mmdocir[0]) + "\n").encode(),
            "qasper/qasper-test-v0.3.json": json.dumps({"p2": papers["p2"], "p1": papers["p1"]}).encode(),
            "hotpotqa/hotpotqa_100.json": json.dumps([hotpot[2], hotpot[0]], indent=1, ensure_ascii=False).encode()}

    def make(url):
        def dl(path, dest, **kw):
            return Download(url + path, dest, **kw)

        def up(path):  # recorded size and sha256 of an upstream file
            return dict(size=len(upstream[path]), sha256=_sha(upstream[path]))

        def derived(dest, inputs, build):
            return Derived(dest, inputs, build, size=len(laid[dest]), sha256=_sha(laid[dest]))

        docs = ("a.pdf", "b.pdf")
        blob = hashlib.sha1(b"blob %d\0" % len(upstream["/hotpot/hotpotqa.json"]) + upstream["/hotpot/hotpotqa.json"])
        return {
            "mmlongbench": Source("mmlongbench", "t", "l", "h", files=tuple(
                dl(f"/mmlb/{n}", f"mmlongbench/documents/{n}", **up(f"/mmlb/{n}")) for n in docs),
                derived=(derived("mmlongbench/samples.json",
                                 (dl("/mmlb/samples.json", ".downloads/mmlb/samples.json", **up("/mmlb/samples.json")),),
                                 sources._json_list_subset("doc_id", docs, indent=1, ensure_ascii=False)),)),
            "mmdocir": Source("mmdocir", "t", "l", "h", derived=(derived(
                "mmlongbench/mmdocir_annotations.jsonl",
                (dl("/mmdocir/ann.jsonl", ".downloads/mmdocir/ann.jsonl", **up("/mmdocir/ann.jsonl")),),
                sources._jsonl_subset("doc_name", docs)),)),
            "qasper": Source("qasper", "t", "l", "h", derived=(derived(
                "qasper/qasper-test-v0.3.json",
                (dl("/qasper/test.tgz", ".downloads/qasper/test.tgz", member="qasper-test-v0.3.json",
                    **up("/qasper/test.tgz")),),
                sources._json_by_id(("p2", "p1"))),)),
            "hotpotqa": Source("hotpotqa", "t", "l", "h", derived=(derived(
                "hotpotqa/hotpotqa_100.json",
                (dl("/hotpot/hotpotqa.json", ".downloads/hotpot/hotpotqa.json", git_blob=blob.hexdigest()),),
                sources._json_by_id(("h3", "h1"), key="_id", indent=1, ensure_ascii=False)),)),
        }
    return upstream, laid, make


def _fetch(root, srcs, lines=None):
    return fetch.fetch_sources(root, srcs, progress=False, log=(lines if lines is not None else []).append)


def test_fetch_lays_out_a_tree_the_loaders_read_and_a_rerun_fetches_nothing(fixture, tmp_path):
    upstream, laid, make = fixture
    root = tmp_path / "data"
    with Server() as srv:
        srv.files.update(upstream)
        srcs = make(srv.url)
        assert _fetch(root, srcs.values()) == []
        for rel, body in laid.items():
            assert (root / rel).read_bytes() == body
        assert (root / "mmlongbench/documents/b.pdf").read_bytes() == upstream["/mmlb/b.pdf"]
        assert not (root / ".downloads").exists(), "no leftovers (downloads, unpacked archives)"
        assert sorted(p.name for p in (root / "mmlongbench/documents").iterdir()) == ["a.pdf", "b.pdf"]
        # the benchmark loaders evaluate (run_eval) calls read it
        mmlb = load_benchmark("mmlongbench", root)
        assert [q.doc_ids[0] for q in mmlb.queries] == ["a.pdf", "b.pdf"] and mmlb.queries[0].gold_boxes
        assert [q.qid for q in load_benchmark("hotpotqa", root).queries] == ["h3", "h1"]
        qasper = load_benchmark("qasper", root)
        assert len(qasper.queries) == 2 and all(q.gold_note_ids for q in qasper.queries)
        before = len(srv.requests)
        lines = []
        assert _fetch(root, srcs.values(), lines) == [] and len(srv.requests) == before
        assert all("already there and checked" in line for line in lines)


def _leftovers(folder: pathlib.Path, *expected: str):
    """Names in ``folder`` beyond ``expected`` (a temporary file of pooch's, say)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in expected) if folder.is_dir() else []


def test_broken_off_download_is_one_line_leaves_nothing_and_is_fetched_next_run(fixture, tmp_path):
    upstream, laid, make = fixture
    root = tmp_path / "data"
    with Server() as srv:
        srv.files.update(upstream)
        srv.truncate["/mmlb/a.pdf"] = 1000
        srcs = [make(srv.url)["mmlongbench"]]
        failures = _fetch(root, srcs)
        assert len(failures) == 1 and "mmlongbench/documents/a.pdf" in failures[0] and "\n" not in failures[0]
        assert "cannot download" in failures[0] and "the next run fetches it again" in failures[0]
        docs = root / "mmlongbench/documents"
        assert not (docs / "a.pdf").exists(), "nothing half-written in place"
        assert _leftovers(docs, "b.pdf") == [], "no temporary file left"
        assert (root / "mmlongbench/samples.json").is_file(), "the other files went on"
        before = len(srv.requests)
        lines = []
        assert _fetch(root, srcs, lines) == []
        assert srv.requests[before:] == [("/mmlb/a.pdf", None)], "only the missing file, fetched whole"
        assert lines == ["mmlongbench: 3 files ready (1 fetched)"]
        assert (docs / "a.pdf").read_bytes() == upstream["/mmlb/a.pdf"]


def test_a_file_already_there_with_its_hash_is_not_downloaded_and_a_wrong_one_is(fixture, tmp_path):
    upstream, laid, make = fixture
    root = tmp_path / "data"
    docs = root / "mmlongbench/documents"
    docs.mkdir(parents=True)
    (docs / "a.pdf").write_bytes(upstream["/mmlb/a.pdf"])  # e.g. from an earlier run or copied by hand
    (docs / "b.pdf").write_bytes(b"%PDF-1.4 not the recorded file")
    with Server() as srv:
        srv.files.update(upstream)
        assert _fetch(root, [make(srv.url)["mmlongbench"]]) == []
        assert "/mmlb/a.pdf" not in [path for path, _ in srv.requests] and ("/mmlb/b.pdf", None) in srv.requests
        assert (docs / "b.pdf").read_bytes() == upstream["/mmlb/b.pdf"]


def test_wrong_checksum_is_one_line_and_fetched_again(fixture, tmp_path):
    upstream, laid, make = fixture
    root = tmp_path / "data"
    with Server() as srv:
        srv.files.update(upstream)
        srv.corrupt.update({"/mmlb/b.pdf", "/hotpot/hotpotqa.json"})
        srcs = [make(srv.url)[n] for n in ("mmlongbench", "hotpotqa")]
        failures = _fetch(root, srcs)
        assert len(failures) == 2 and all("\n" not in f for f in failures)
        assert "mmlongbench/documents/b.pdf: not the recorded file: SHA256 hash" in failures[0]
        assert upstream_sha(upstream, "/mmlb/b.pdf") in failures[0] and "fetches it again" in failures[0]
        assert "hotpotqa_100.json: not the recorded file (git blob" in failures[1]
        assert "fetches it again" in failures[1]
        assert not (root / "mmlongbench/documents/b.pdf").exists()
        assert _leftovers(root / "mmlongbench/documents", "a.pdf") == [], "no temporary file left"
        assert not (root / "hotpotqa").exists()
        srv.corrupt.clear()
        assert _fetch(root, srcs) == []
        assert (root / "mmlongbench/documents/b.pdf").read_bytes() == upstream["/mmlb/b.pdf"]
        assert (root / "hotpotqa/hotpotqa_100.json").read_bytes() == laid["hotpotqa/hotpotqa_100.json"]
        # a laid-out file changed on disk is not "already there": it is made again
        (root / "hotpotqa/hotpotqa_100.json").write_text("[]")
        assert _fetch(root, srcs) == [] and (root / "hotpotqa/hotpotqa_100.json").read_bytes() == \
            laid["hotpotqa/hotpotqa_100.json"]


def _unrecorded(source):
    """``source`` with nothing recorded for its downloads (as the real QASPER archive)."""
    return dataclasses.replace(source, derived=tuple(dataclasses.replace(x, inputs=tuple(
        dataclasses.replace(d, size=None, sha256=None, git_blob=None) for d in x.inputs)) for x in source.derived))


def test_upstream_that_does_not_give_the_recorded_file_is_not_written(fixture, tmp_path):
    upstream, laid, make = fixture
    root = tmp_path / "data"
    with Server() as srv:
        srv.files.update(upstream)
        srv.files["/mmdocir/ann.jsonl"] = b'{"doc_name": "a.pdf", "questions": []}\n'
        srv.files["/qasper/test.tgz"] = b"not an archive"
        srcs = [_unrecorded(make(srv.url)[n]) for n in ("mmdocir", "qasper")]
        # nothing recorded for the downloads: refused before any request, unless the caller allows it
        failures = _fetch(root, srcs)
        assert len(failures) == 2 and all("no sha256 is recorded" in f and "--allow-unrecorded" in f for f in failures)
        assert srv.requests == [] and not root.exists() or not any(root.rglob("*.json*"))
        failures = fetch.fetch_sources(root, srcs, progress=False, log=[].append, allow_unrecorded=True)
        assert len(failures) == 2 and "not the recorded file" in failures[0] and "cannot lay it out" in failures[1]
        assert "not an archive" in failures[1] and all("\n" not in f for f in failures)
        assert not (root / "mmlongbench").exists() and not (root / "qasper").exists()
        srv.files.update(upstream)  # the host serves the right files again: the next run fetches them again
        assert fetch.fetch_sources(root, srcs, progress=False, log=[].append, allow_unrecorded=True) == []
        assert (root / "qasper/qasper-test-v0.3.json").read_bytes() == laid["qasper/qasper-test-v0.3.json"]


# ---- hostile archives (issue 63): only the one member the layout needs is read, in memory, and only when it is a
# regular file at a plain relative path; bombs are refused from their headers.

MEMBER = "qasper-test-v0.3.json"


def _tar(path, entries, mode="w:gz"):
    """A tar archive of ``entries``: (name, bytes) for a file, (name, ("sym"|"lnk", target)) for a link."""
    with tarfile.open(path, mode) as tar:
        for name, body in entries:
            info = tarfile.TarInfo(name)
            if isinstance(body, tuple):
                info.type = tarfile.SYMTYPE if body[0] == "sym" else tarfile.LNKTYPE
                info.linkname = body[1]
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return path


def _snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*"))


@pytest.mark.parametrize("entries, why", [
    ([(os.sep + os.path.join("tmp", "x", MEMBER), b"{}")], "an absolute path"),
    ([("data/../../" + MEMBER, b"{}")], "'..'"),
    ([(MEMBER, ("sym", "/etc/passwd"))], "a link"),
    ([("a.json", b"{}"), ("dir/" + MEMBER, ("lnk", "a.json"))], "a link"),
    ([("x/" + MEMBER, b"{}"), ("y/" + MEMBER, b"{}")], "more than once"),
    ([("other.json", b"{}")], "is not in the archive"),
])
def test_a_hostile_tar_member_is_refused_in_one_line_and_nothing_is_written(tmp_path, entries, why):
    box = tmp_path / "box"
    box.mkdir()
    archive = _tar(box / "a.tgz", entries)
    before = _snapshot(tmp_path)
    with pytest.raises(fetch.ArchiveError) as err:
        fetch.read_member(archive, MEMBER)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert _snapshot(tmp_path) == before, "nothing unpacked anywhere"


def test_a_plain_tar_member_is_read_in_any_folder_and_any_compression(tmp_path):
    for mode, suffix in (("w:gz", "tgz"), ("w:bz2", "tar.bz2"), ("w:xz", "tar.xz"), ("w", "tar")):
        archive = _tar(tmp_path / f"a.{suffix}", [("README", b"r"), ("qasper/" + MEMBER, b'{"p": 1}')], mode)
        assert fetch.read_member(archive, MEMBER) == b'{"p": 1}'


def _zip(path, entries):
    """A zip of ``entries``: (name, bytes, unix mode or None)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, body, mode in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info, body)
    return path


@pytest.mark.parametrize("entries, why", [
    ([("/abs/" + MEMBER, b"{}", None)], "an absolute path"),
    (["../" + MEMBER, b"{}", None] and [("../" + MEMBER, b"{}", None)], "'..'"),
    ([(MEMBER, b"/etc/passwd", 0o120777)], "a link"),
])
def test_a_hostile_zip_member_is_refused_in_one_line(tmp_path, entries, why):
    archive = _zip(tmp_path / "a.zip", entries)
    with pytest.raises(fetch.ArchiveError) as err:
        fetch.read_member(archive, MEMBER)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert fetch.read_member(_zip(tmp_path / "ok.zip", [("d/" + MEMBER, b"{}", 0o100644)]), MEMBER) == b"{}"


class _CountingReads:
    """Counts the bytes read from a .tgz (the compressed stream) by tarfile while ``read_member`` runs."""

    def __init__(self, monkeypatch):
        self.read = 0
        real_open = tarfile.TarFile.gzopen.__func__
        outer = self

        class Counted(io.FileIO):
            def read(self, n=-1):
                data = super().read(n)
                outer.read += len(data)
                return data

        def gzopen(cls, name, mode="r", fileobj=None, **kw):
            return real_open(cls, name, mode, fileobj=Counted(name, "rb"), **kw)
        monkeypatch.setattr(tarfile.TarFile, "gzopen", classmethod(gzopen))
        monkeypatch.setitem(tarfile.TarFile.OPEN_METH, "gz", "gzopen")


def test_bombs_are_refused_from_their_headers_before_they_are_expanded(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "MAX_MEMBER_BYTES", 4 << 20)
    monkeypatch.setattr(fetch, "RATIO_FLOOR_BYTES", 1 << 20)
    zeros = bytes(32 << 20)  # 32 MB of zeros: ~32 kB compressed, a ratio of ~1000
    # the member itself, or a member before it that the stream must pass through
    for entries in ([(MEMBER, zeros)], [("padding.bin", zeros), (MEMBER, b"{}")]):
        archive = _tar(tmp_path / "bomb.tgz", entries)
        with monkeypatch.context() as m:
            counted = _CountingReads(m)
            with pytest.raises(fetch.ArchiveError) as err:
                fetch.read_member(archive, MEMBER)
        assert "expands to more than" in str(err.value) and "\n" not in str(err.value)
        assert 0 < counted.read < archive.stat().st_size // 2, "refused from the header, before decompressing"
        archive.unlink()
    bomb = _zip(tmp_path / "bomb.zip", [(MEMBER, zeros, 0o100644)])
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(fetch.ArchiveError, match="expands to more than"):
        fetch.read_member(bomb, MEMBER)
    # a small archive that compresses well (headers, padding) is not a bomb
    small = _tar(tmp_path / "small.tgz", [(MEMBER, bytes(100_000))])
    assert small.stat().st_size * fetch.MAX_RATIO < 100_000 and fetch.read_member(small, MEMBER) == bytes(100_000)


def test_a_fetched_hostile_archive_leaves_nothing_outside_and_a_download_past_its_size_is_cut(fixture, tmp_path,
                                                                                                monkeypatch):
    upstream, laid, make = fixture
    root = tmp_path / "data"
    evil = _tar(tmp_path / "evil.tgz", [("../../escaped.txt", b"x"), (os.sep + os.path.join("tmp", "abs.txt"), b"x"),
                                        ("q/" + MEMBER, ("sym", "/etc/passwd"))]).read_bytes()
    before = sorted(p.name for p in tmp_path.iterdir())
    with Server() as srv:
        srv.files.update(upstream)
        srv.files["/qasper/test.tgz"] = evil
        srcs = [_unrecorded(make(srv.url)["qasper"])]
        failures = fetch.fetch_sources(root, srcs, progress=False, log=[].append, allow_unrecorded=True)
        assert len(failures) == 1 and "refusing the archive" in failures[0] and "a link" in failures[0]
        assert "\n" not in failures[0]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["data"])
        assert not (root / "qasper").exists() and not any(root.rglob("*.txt")) and not any(root.rglob("*.json"))
        # a download with nothing recorded is read no further than the limit; one with a recorded size no
        # further than that size
        monkeypatch.setattr(fetch, "MAX_DOWNLOAD_BYTES", 1000)
        srv.files["/qasper/test.tgz"] = bytes(5000)
        failures = fetch.fetch_sources(root, srcs, progress=False, log=[].append, allow_unrecorded=True)
        assert len(failures) == 1 and "sent more than 1000 bytes" in failures[0]
        assert not any(p.is_file() for p in root.rglob("*")), "nothing kept"


def test_cli_fetch_only_and_errors(fixture, tmp_path, monkeypatch, capsys):
    upstream, laid, make = fixture
    with Server() as srv:
        srv.files.update(upstream)
        monkeypatch.setattr(sources, "SOURCES", make(srv.url))
        root = tmp_path / "data"
        assert main(["data", "fetch", "--to", str(root), "--only", "hotpotqa,qasper", "--no-progress"]) == 0
        assert sorted(p.name for p in root.iterdir()) == ["hotpotqa", "qasper"]
        err = capsys.readouterr().err
        assert "hotpotqa: 1 files ready" in err and f"CDSJAX_DATA={root}" in err
        assert main(["data", "fetch", "--to", str(root), "--only", "nope"]) == 2
        assert "no source named nope" in capsys.readouterr().err
        srv.files.pop("/hotpot/hotpotqa.json")
        (root / "hotpotqa/hotpotqa_100.json").unlink()
        assert main(["data", "fetch", "--to", str(root), "--only", "hotpotqa", "--no-progress"]) == 1
        err = capsys.readouterr().err.splitlines()
        assert any("HTTP 404" in line for line in err) and "1 files failed" in err[-1]
    monkeypatch.setenv("CDSJAX_DATA", str(tmp_path / "elsewhere"))
    assert fetch.default_root() == tmp_path / "elsewhere"
    (tmp_path / "file").write_text("")
    assert main(["data", "fetch", "--to", str(tmp_path / "file")]) == 2 and "not a directory" in capsys.readouterr().err
    assert main(["data"]) == 2 and "cdsjax data fetch" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["data", "list"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 5 and "CC BY-NC 4.0" in listing[0] and "78.4 MB" in listing[0]


def test_the_real_sources_are_pinned_https_and_name_their_licence():
    assert set(sources.SOURCES) == {"mmlongbench", "mmdocir", "qasper", "hotpotqa", "pdfs"}
    for s in sources.SOURCES.values():
        assert s.licence and s.homepage.startswith("https://")
        downloads = list(s.files) + [i for d in s.derived for i in d.inputs]
        for d in downloads:
            assert d.url.startswith("https://")
            assert "raw.githubusercontent.com" not in d.url or "/main/" not in d.url, "pinned to a commit"
        for x in s.derived:
            assert x.sha256 and x.size, "every laid-out file is checked"
    assert len(sources.SOURCES["mmlongbench"].files) == len(recorded.MMLONGBENCH_PDFS) == 41
    assert len(recorded.QASPER_PAPERS) == 209 and len(recorded.HOTPOTQA_IDS) == 100


@pytest.mark.needs_data
def test_the_real_layout_reproduces_the_shared_data(data_root, tmp_path):
    """Each recorded figure is the shared data's; each real build, given an upstream file that holds the shared
    data's entries, writes the shared file byte for byte (so the layout's form and order are right)."""
    for s in sources.SOURCES.values():
        for d in s.files:
            body = (data_root / d.dest).read_bytes()
            assert (len(body), _sha(body)) == (d.size, d.sha256), d.dest
    shared = {rel: (data_root / rel).read_bytes() for rel in recorded.LAID_OUT}
    for rel, body in shared.items():
        assert recorded.LAID_OUT[rel] == (len(body), _sha(body)), rel
    as_upstream = {"mmlongbench/samples.json": shared["mmlongbench/samples.json"],
                   "mmlongbench/mmdocir_annotations.jsonl": shared["mmlongbench/mmdocir_annotations.jsonl"],
                   "qasper/qasper-test-v0.3.json": shared["qasper/qasper-test-v0.3.json"],  # the archive's member
                   "hotpotqa/hotpotqa_100.json": shared["hotpotqa/hotpotqa_100.json"]}
    for s in sources.SOURCES.values():
        for x in s.derived:
            assert x.build({"upstream": as_upstream[x.dest]}) == shared[x.dest], x.dest
