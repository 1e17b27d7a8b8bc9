"""`cdsjax serve` as a real uvicorn process on 127.0.0.1, driven by real HTTP clients.

The reader is a real local OpenAI-compatible server (tests/scripted_server.py) whose answers can be held
back, so the overload test fills the server's queue deterministically.
"""

import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from cdsjax import cli
from tests.scripted_server import OpenAIServer, message_text
from tests.processes import stop_process
from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display
from cdsjax.io.util import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE = 3
HOLD = "HOLD-THIS-ANSWER"


def request(url, body=None, *, method=None, timeout=60, raw=None):
    """(status, parsed JSON body, headers) of one HTTP request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), r.headers  # case-insensitive
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, data_root):
    out = tmp_path_factory.mktemp("serve") / "index"
    assert cli.main(["index", str(data_root / "pdfs" / "multicolumn.pdf"), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def reader():
    release = threading.Event()

    def respond(req):
        if HOLD in message_text(req):
            release.wait(60)
        return "The document is a multi-column sample [1]."

    with OpenAIServer(respond, models=("reader-test",), stream_pause=0.05) as srv:  # streamed word by word
        srv.release = release
        yield srv


@pytest.fixture(scope="module")
def server(index_dir, reader, tmp_path_factory):
    """A `cdsjax serve` process (default host) with a bounded queue and the local reader."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_CACHE=str(tmp_path_factory.mktemp("serve-cache")))
    env.pop("CDSJAX_READER_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdsjax.cli", "serve", str(index_dir), "--port", str(port), "--queue", str(QUEUE),
         "--reader-url", reader.base_url, "--reader-model", "reader-test", "--retries", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = proc.stdout.readline()  # printed once uvicorn has started
        assert "listening on http://127.0.0.1:" in ready, (ready, proc.stderr.read() if proc.poll() is not None else "")
        status, body, _ = request(url + "/health")
        assert status == 200
        yield url, proc
    finally:
        stop_process(proc, timeout=20)


@pytest.mark.slow
def test_health_and_documents(server):
    url, _ = server
    status, health, _ = request(url + "/health")
    assert status == 200 and health["status"] == "ok"
    assert health["documents"] == 1 and health["notes"] >= 1
    assert health["default_selector"] == display(DEFAULT_SELECTOR)
    assert health["queue"] == {"in_flight": 0, "limit": QUEUE} and health["reader"] == "reader-test"
    status, docs, _ = request(url + "/documents")
    assert status == 200 and [d["document"] for d in docs["documents"]] == ["multicolumn.pdf"]
    assert docs["documents"][0]["notes"] == health["notes"] and docs["documents"][0]["pages"] >= 1


@pytest.mark.slow
def test_select_and_ask_return_the_ask_json_object(server, index_dir, capsys):
    url, _ = server
    q = "What is the sample document about?"
    status, sel, _ = request(url + "/select", {"question": q, "budget": 3})
    assert status == 200 and sel["answer"] is None and sel["reader"] is None
    assert sel["selector"] == display(DEFAULT_SELECTOR) and sel["diagnostics"]["mode"] == "converged"
    # the same object as a local `cdsjax ask --json` (timings aside)
    code = cli.main(["ask", str(index_dir), q, "--budget", "3", "--json"])
    local = json.loads(capsys.readouterr().out)
    assert code == 0
    # over HTTP a crop's path is relative to its index (no server path leaves the server); locally absolute
    for e in local["evidence"]:
        if e["image_path"]:
            e["image_path"] = os.path.relpath(e["image_path"], index_dir)
    assert set(sel) == set(local) and sel["evidence"] == local["evidence"]
    assert sel["diagnostics"].keys() == local["diagnostics"].keys()
    assert sel["abstained"] is local["abstained"] is False and sel["abstention"]["enabled"] is True
    status, kept, _ = request(url + "/select", {"question": q, "budget": 3, "abstain": False})  # ask --no-abstain
    assert status == 200 and kept["abstention"]["enabled"] is False and kept["evidence"] == sel["evidence"]
    status, ans, _ = request(url + "/ask", {"question": q, "selector": "cds-paper", "budget": 2})
    assert status == 200 and ans["answer"].startswith("The document is") and ans["reader"]["model"] == "reader-test"
    assert ans["selector"] == "cds-paper" and ans["diagnostics"]["mode"] == "paper" and len(ans["evidence"]) == 2


def test_ask_takes_the_evidence_budget_per_request(server, reader):
    """``evidence_tokens`` in the body sizes the evidence the reader is sent, request by request."""
    url, _ = server
    q = "What does the sample document say about its columns and layout?"
    sent = {}
    for tokens in (300, 700, 0):
        status, ans, _ = request(url + "/ask", {"question": q, "budget": 12, "evidence_tokens": tokens})
        assert status == 200 and ans["answer"].startswith("The document is"), ans
        sent[tokens] = (ans["reader"]["evidence_tokens"], len(message_text(reader.requests[-1])))
    assert 0 < sent[300][0] <= 300 < sent[700][0] <= 700 and sent[300][1] < sent[700][1]
    assert sent[0][0] >= sent[700][0]  # 0: every note whole
    status, sel, _ = request(url + "/select", {"question": q, "budget": 12, "evidence_tokens": 300})
    assert status == 200 and sel["answer"] is None  # accepted, as /ask's body; nothing is read


@pytest.mark.slow
def test_concurrent_clients_get_their_own_answers(server):
    url, _ = server
    questions = [f"{topic} in the sample document" for topic in
                 ("columns", "the table", "the title", "page layout", "the authors", "the first section")]
    jobs = [(q, sel) for q in questions for sel in ("cds-converged", "cosine")]
    expected = {}
    for q, sel in jobs:  # one at a time first
        status, body, _ = request(url + "/select", {"question": q, "selector": sel, "budget": 3})
        assert status == 200
        expected[(q, sel)] = [e["note_id"] for e in body["evidence"]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=QUEUE) as pool:
        futures = {pool.submit(request, url + "/select", {"question": q, "selector": sel, "budget": 3}): (q, sel)
                   for q, sel in jobs}
        for fut in concurrent.futures.as_completed(futures):
            status, body, _ = fut.result()
            q, sel = futures[fut]
            assert status == 200, body
            assert body["question"] == q and [e["note_id"] for e in body["evidence"]] == expected[(q, sel)]


@pytest.mark.parametrize("path, body, raw, status, word", [
    ("/ask", {"question": ""}, None, 422, "question"),
    ("/ask", {"question": "   "}, None, 400, "empty"),
    ("/ask", {"budget": 3}, None, 422, "question"),
    ("/ask", {"question": "q", "selector": "nope"}, None, 400, "unknown selector"),
    ("/select", {"question": "q", "budget": 0}, None, 422, "budget"),
    ("/select", {"question": "q", "budget": "ten"}, None, 422, "budget"),
    ("/select", {"question": "q", "options": {"lam": 0.5}}, None, 400, "lam"),
    ("/select", {"question": "q", "selector": "mmr", "options": {"lam": 7}}, None, 400, "lam"),
    ("/select", {"question": "q", "colour": "red"}, None, 422, "colour"),
    ("/ask", {"question": "q", "evidence_tokens": -1}, None, 422, "evidence_tokens"),
    ("/ask", {"question": "q", "evidence_tokens": "300"}, None, 422, "evidence_tokens"),
    ("/select", {"question": "q", "evidence_tokens": 10 ** 9}, None, 422, "evidence_tokens"),
    ("/select", None, b"{not json", 422, "JSON"),
    ("/nowhere", {"question": "q"}, None, 404, "Not Found"),
])
def test_bad_requests_get_4xx_with_a_message(server, path, body, raw, status, word):
    url, _ = server
    got, reply, _ = request(url + path, body, raw=raw)
    assert got == status and isinstance(reply["error"], str) and word in reply["error"]


@pytest.mark.slow
def test_full_queue_answers_503_and_recovers(server, reader):
    url, _ = server
    reader.release.clear()
    with concurrent.futures.ThreadPoolExecutor(max_workers=QUEUE) as pool:
        held = [pool.submit(request, url + "/ask", {"question": f"{HOLD} {i}", "budget": 2}) for i in range(QUEUE)]
        deadline = time.time() + 60
        while request(url + "/health")[1]["queue"]["in_flight"] < QUEUE:
            assert time.time() < deadline, "the held requests never filled the queue"
            time.sleep(0.05)
        status, body, headers = request(url + "/select", {"question": "one more"})
        assert status == 503 and "busy" in body["error"] and headers.get("Retry-After") == "1"
        status, health, _ = request(url + "/health")  # health is not queued
        assert status == 200 and health["queue"]["in_flight"] == QUEUE
        reader.release.set()
        results = [f.result() for f in held]
    assert [r[0] for r in results] == [200] * QUEUE and all(r[1]["answer"] for r in results)
    status, body, _ = request(url + "/select", {"question": "one more"})
    assert status == 200 and request(url + "/health")[1]["queue"]["in_flight"] == 0


def test_ask_server_cli(server, capsys):
    url, _ = server
    code = cli.main(["ask", "--server", url, "What is the sample document about?", "--json", "--no-read",
                     "--budget", "2", "--selector", "cosine"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["answer"] is None and result["selector"] == "cosine" and len(result["evidence"]) == 2
    assert result["timings"]["roundtrip"] > 0
    code = cli.main(["ask", "--server", url, "What is it about?", "--budget", "2"])
    out, err = capsys.readouterr()
    assert code == 0 and "The document is a multi-column sample" in out and "Evidence for" in out
    code = cli.main(["ask", "--server", url, "q?", "--selector", "mmr", "--lam", "0.5", "--budget", "2"])
    assert code == 0
    capsys.readouterr()
    code = cli.main(["ask", "--server", f"http://127.0.0.1:{free_port()}", "q?"])
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach" in err and len(err.strip().splitlines()) == 1


def test_ask_server_client_loads_neither_jax_nor_torch(server):
    url, _ = server
    code = (
        "import sys, io, contextlib\n"
        "from cdsjax import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = cli.main(['ask', '--server', {url!r}, 'what is it?', '--json', '--no-read'])\n"
        "print(rc, sorted(m for m in ('jax', 'torch', 'sentence_transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0 and proc.stdout.split() == ["0", "[]"], proc.stderr


def test_serve_bad_input_one_line(index_dir, capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        code = cli.main(["serve", str(index_dir), "--port", str(busy.getsockname()[1])])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert code == 1 and "cannot listen" in err and len(err.strip().splitlines()) == 1
    for argv, word in ((["serve", "/nonexistent/idx", "--port", "0"], "no such file"),
                       (["serve", str(index_dir), "--queue", "0"], "queue"),
                       (["serve", str(index_dir), "--selector", "bogus", "--port", "0"], "unknown selector")):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code != 0 and word in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_crop_endpoint_serves_only_index_crops(server, index_dir):
    url, _ = server
    status, sel, _ = request(url + "/select", {"question": "the table", "selector": "cosine", "budget": 6})
    visual = [e for e in sel["evidence"] if e["image_path"]]
    assert status == 200 and visual
    import urllib.parse

    with urllib.request.urlopen(f"{url}/crop?note={urllib.parse.quote(visual[0]['note_id'])}", timeout=30) as r:
        png = r.read()
        assert r.headers["Content-Type"] == "image/png" and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not os.path.isabs(visual[0]["image_path"])
    with open(index_dir / visual[0]["image_path"], "rb") as f:
        assert f.read() == png
    for bad in ("nope", "../../etc/passwd", visual[0]["image_path"]):
        status, body, _ = request(f"{url}/crop?note={urllib.parse.quote(bad)}")
        assert status == 404 and "no crop" in body["error"]


def test_web_page_in_headless_chromium(server, tmp_path):
    """The page asks on load (?q=...) two selectors side by side: notes both chose share a row, notes only one
    chose are marked, near-duplicates within each list are marked with the threshold shown, each note links to
    its PDF page, crops are shown, and the answer comes from the right selector's evidence."""
    import html
    import urllib.parse

    from tests.conftest import require_tool

    chromium = require_tool("chromium")  # fails under CI=true when missing, skips elsewhere
    url, _ = server
    q, budget, threshold = "What does the table in the sample document show?", 3, 0.5
    query = urllib.parse.urlencode({"q": q, "budget": budget, "a": "cosine", "b": "cds-converged",
                                    "threshold": threshold})
    from tests.chromium import page_html_when

    # the page streams its answer: wait, in real time, until it says the answer is done
    dom = page_html_when(chromium, f"{url}/?{query}", "document.body.dataset.answerDone === 'yes'",
                         tmp_path / "profile", timeout=120)
    assert "<table" in dom
    replies = {}
    for side, selector in (("left", "cosine"), ("right", "cds-converged")):
        status, replies[side], _ = request(url + "/select", {"question": q, "selector": selector, "budget": budget,
                                                            "near_duplicates": threshold})
        assert status == 200 and replies[side]["near_duplicates"]["threshold"] == threshold
    left_ids = [e["note_id"] for e in replies["left"]["evidence"]]
    right_ids = [e["note_id"] for e in replies["right"]["evidence"]]
    rows = re.findall(r'<tr class="pair (both|differ)">(.*?)</tr>', dom, re.S)
    shared = [i for i in left_ids if i in right_ids]
    assert [kind for kind, _ in rows] == ["both"] * len(shared) + ["differ"] * (budget - len(shared))
    cells = {"left": [], "right": []}
    for kind, row in rows:
        found = re.findall(r'<td class="note (left|right) (shared|only)" data-note="([^"]*)" data-rank="(\d+)">'
                           r'(.*?)</td>', row, re.S)
        for side, cls, note, rank, body in found:
            assert (cls == "shared") == (kind == "both")
            cells[side].append((html.unescape(note), int(rank), body))
    for side, ids in (("left", left_ids), ("right", right_ids)):
        assert sorted(n for n, _, _ in cells[side]) == sorted(ids)  # every chosen note shown once
        evidence = {e["note_id"]: e for e in replies[side]["evidence"]}
        dups = {}
        for i, j, c in replies[side]["near_duplicates"]["pairs"]:
            dups.setdefault(i, []).append(f"#{j} ({c:.2f})")
            dups.setdefault(j, []).append(f"#{i} ({c:.2f})")
        for note, rank, body in cells[side]:
            e = evidence[note]
            assert rank == e["rank"] and ("only " in body) == (note not in shared)
            index = f'&amp;index={urllib.parse.quote(e["index"])}' if e.get("index") else ""
            assert f'href="/pdf?document={urllib.parse.quote(e["document"])}{index}#page={e["page"] + 1}"' in body
            assert f"page {e['page'] + 1}" in body
            assert sorted(re.findall(r'class="tag dup">\u2248 (#\d+ \([\d.]+\))<', body)) == sorted(dups.get(rank, []))
            assert ('<img src="/crop?note=' in body) == bool(e["image_path"])
    assert any(replies[s]["near_duplicates"]["pairs"] for s in replies)  # the test exercises the marks
    assert 'cosine ≥ <span id="thr">0.50</span>' in dom
    assert "Answer (from cds-converged's evidence): The document is a multi-column sample" in dom
    # the answer streamed: the evidence was on the page before its first piece arrived, and it came in pieces
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert 'data-evidence-shown="yes"' in body and 'data-tokens-before-evidence="0"' in body
    assert 'data-answer-done="yes"' in body and int(re.search(r'data-tokens="(\d+)"', body).group(1)) > 1


def test_ask_streams_json_lines(server):
    """``POST /ask`` with ``"stream": true`` (what ``curl -N`` sees): the evidence first, then the answer in
    several pieces, then the whole object; without it, one JSON object as before."""
    url, _ = server
    req = urllib.request.Request(url + "/ask", data=json.dumps({"question": "What is the sample about?",
                                                                "selector": "cosine", "budget": 3,
                                                                "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    arrivals = []
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        for line in r:
            arrivals.append((time.perf_counter(), json.loads(line)))
    events = [e["event"] for _, e in arrivals]
    assert events[0] == "evidence" and events[-1] == "done" and events.count("token") > 1
    assert set(events[1:-1]) == {"token"}
    first, last = arrivals[0][1]["result"], arrivals[-1][1]["result"]
    assert first["answer"] is None and len(first["evidence"]) == 3
    assert last["answer"] == "".join(e["text"] for _, e in arrivals if e["event"] == "token").strip()
    # the same notes; once read, each says what the reader got of it; the timings are one clock
    assert [{k: v for k, v in e.items() if k != "read"} for e in last["evidence"]] == first["evidence"]
    assert all(e["read"] in ("whole", "part", "left out") for e in last["evidence"])
    assert 0 < last["timings"]["first_token"] <= last["timings"]["total"]
    assert arrivals[-1][0] - arrivals[1][0] > 0.1  # the pieces came over time, not in one write
    status, whole, _ = request(url + "/ask", {"question": "What is the sample about?", "selector": "cosine",
                                              "budget": 3})
    assert status == 200 and whole["answer"] == last["answer"]


def test_pdf_endpoint_serves_only_index_documents(server, data_root):
    import urllib.parse

    url, _ = server
    with urllib.request.urlopen(f"{url}/pdf?document=multicolumn.pdf", timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/pdf"
        assert r.read() == (data_root / "pdfs" / "multicolumn.pdf").read_bytes()
    for bad in ("other.pdf", "../multicolumn.pdf", str(data_root / "pdfs" / "multicolumn.pdf")):
        status, body, _ = request(f"{url}/pdf?document={urllib.parse.quote(bad)}")
        assert status == 404 and "not in the loaded indexes" in body["error"], bad
    status, body, _ = request(url + "/select", {"question": "q", "near_duplicates": 2})
    assert status == 422
