"""Issue 26, case by case, against real processes: a real `cdsjax serve` on 127.0.0.1 and crafted indexes.

One small index (multicolumn.pdf: text notes and a table crop) is built once; each crafted index is a copy
with the attack written in and its recorded hashes brought back in line, as an attacker would.
"""

import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from cdsjax import cli
from cdsjax.io.util import free_port
from tests.processes import stop_process
from tests.test_serve import ROOT, request

TIMEOUT = 1.5  # --request-timeout of the main server: a compilation of a new CDS selector takes longer


def run_cli(*argv, env=None, timeout=180):
    """`cdsjax ARGV` as its own process: (returncode, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "cdsjax.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def in_process(capsys, *argv):
    """`cdsjax ARGV` in this process (for commands that refuse before serving): (exit code, stderr)."""
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def server_env(tmp_path_factory, **extra):
    env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_CACHE=str(tmp_path_factory.mktemp("cache") / "fresh"), **extra)
    for name in ("CDSJAX_READER_URL", "CDSJAX_TOKEN"):
        env.pop(name, None)
    if "CDSJAX_JAX_CACHE" not in extra:  # the compilation cache in the server's cache directory (checked private)
        env.pop("CDSJAX_JAX_CACHE", None)
    return env


class Server:
    """A `cdsjax serve` process on a free loopback port (stopped by :meth:`stop`)."""

    def __init__(self, index, *flags, env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "serve", str(index), "--port",
                                      str(self.port), *map(str, flags)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ready = self.proc.stdout.readline()
        if "listening on" not in ready:
            self.stop()
            raise AssertionError((ready, self.proc.stderr.read()))

    def stop(self):
        stop_process(self.proc, timeout=20)


def health(url, **kw):
    status, body, _ = request(url + "/health", **kw)
    assert status == 200
    return body


def wait_idle(url, limit=120):
    """Until no selection job (abandoned ones included) is running."""
    deadline = time.time() + limit
    while health(url)["compute"]["running"]:
        assert time.time() < deadline, "abandoned computations never finished"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def built(tmp_path_factory, data_root):
    out = tmp_path_factory.mktemp("security") / "new" / "index"
    assert cli.main(["index", str(data_root / "pdfs" / "multicolumn.pdf"), "--out", str(out)]) == 0
    return out


def craft(src, dst, *, manifest=None, notes=None):
    """A copy of the index ``src`` with ``manifest(dict)`` / ``notes(list)`` edits, its hashes recomputed."""
    from cdsjax.io import store, storefiles

    shutil.copytree(src, dst, symlinks=True)
    m = json.loads((dst / "manifest.json").read_text())
    if notes is not None:
        rows = storefiles.read_jsonl(dst / "notes.jsonl")
        notes(rows)
        m["hashes"]["notes"] = storefiles.write_jsonl(dst / "notes.jsonl", rows)
    if manifest is not None:
        manifest(m)
        m["hashes"]["embedder"] = store.embedder_digest(m["embedder"])
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


PDF_CASES = ("swap", "append", "gone", "restored")  # one source PDF per /pdf case, so no case sees another's
HUGE_PDF = 3 << 30  # a sparse file: hashing it whole takes seconds, reading its size none


@pytest.fixture(scope="module")
def main_server(built, tmp_path_factory):
    """The main server on a copy of the index (tests tamper with its crops), a short deadline, queue 3.

    Its manifest also lists ``PDF_CASES`` documents (copies of the source PDF that tests swap, extend, delete
    and restore), ``legacy.pdf`` (an entry with no ``resolved`` path, as indexes written before it was
    recorded), ``link.pdf`` (indexed by ``cdsjax index`` through the symlink ``link.pdf -> real.pdf``; its
    entry is the one that run wrote) and ``huge.pdf``, a 3 GiB sparse file that starts like a PDF (its
    recorded hash is that of the source PDF: only a server that hashes it would find out)."""
    pdfs = tmp_path_factory.mktemp("pdfs")
    source = json.loads((built / "manifest.json").read_text())["documents"][0]
    for name in (*PDF_CASES, "legacy", "real"):
        shutil.copyfile(source["path"], pdfs / f"{name}.pdf")
    with open(pdfs / "huge.pdf", "wb") as f:
        f.write(b"%PDF-1.4\n")
        f.truncate(HUGE_PDF)
    (pdfs / "link.pdf").symlink_to(pdfs / "real.pdf")
    linked = tmp_path_factory.mktemp("linked") / "index"  # same bytes as `built`: its document cache answers
    assert cli.main(["index", str(pdfs / "link.pdf"), "--out", str(linked)]) == 0
    (through_link,) = json.loads((linked / "manifest.json").read_text())["documents"]

    def add_documents(m):
        for name in (*PDF_CASES, "huge"):
            path = str(pdfs / f"{name}.pdf")
            m["documents"].append(dict(source, doc_id=f"{name}.pdf", path=path, resolved=path))
        legacy = dict(source, doc_id="legacy.pdf", path=str(pdfs / "legacy.pdf"))
        legacy.pop("resolved")
        m["documents"].extend([legacy, dict(through_link, doc_id="link.pdf")])

    index = craft(built, tmp_path_factory.mktemp("served") / "index", manifest=add_documents)
    env = server_env(tmp_path_factory)
    srv = Server(index, "--queue", 3, "--request-timeout", TIMEOUT, "--max-compiled", 3, "--budget", 6,
                 "--selector", "cosine", env=env)
    srv.index, srv.cache, srv.pdfs = index, env["CDSJAX_CACHE"], pdfs
    yield srv
    srv.stop()


# ------------------------------------------------------------------ 1. nothing executable from an index


def evil_model(tmp_path):
    """A sentence-transformers model directory whose module writes a marker file when imported."""
    model = tmp_path / "evil-model"
    model.mkdir()
    marker = tmp_path / "code-ran"
    (model / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "evil_mod.Evil"}]))
    (model / "evil_mod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Evil:\n    pass\n")
    (model / "config.json").write_text("{}")
    return model, marker


def code_index(built, tmp_path):
    model, marker = evil_model(tmp_path)

    def point_at_model(m):
        m["embedder"].update(model=str(model), trust_remote_code=True)

    return craft(built, tmp_path / "crafted", manifest=point_at_model), model, marker


@pytest.mark.slow
def test_index_naming_code_is_refused_in_one_line(built, tmp_path, capsys, monkeypatch):
    crafted, model, marker = code_index(built, tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for argv in (["serve", crafted, "--port", 0], ["ask", crafted, "what is it?"]):
        code, err = in_process(capsys, *argv)
        assert code == 1 and "refusing the index" in err and "--embedder" in err and one_line(err), (argv, err)
        assert not marker.exists(), "the index's module ran"
    # a hub id in the manifest is refused the same way (it would fetch the model's code)
    crafted_hub = craft(built, tmp_path / "hub", manifest=lambda m: m["embedder"].update(model="someone/evil"))
    code, err = in_process(capsys, "ask", crafted_hub, "what is it?")
    assert code == 1 and "'someone/evil' is not one cdsjax knows" in err and one_line(err)


@pytest.mark.slow
def test_crafted_index_runs_code_only_with_the_users_flags(built, tmp_path):
    """The crafted index above really is dangerous: named with --embedder and --trust-remote-code, its
    module runs (a separate process: the module is imported)."""
    crafted, model, marker = code_index(built, tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    code, _, err = run_cli("ask", crafted, "what is it?", "--embedder", model, "--trust-remote-code", env=env)
    assert marker.exists() and code == 1 and one_line(err)


def test_embedder_fields_are_covered_by_the_manifest_hashes(built, tmp_path, capsys):
    crafted = tmp_path / "edited"
    shutil.copytree(built, crafted)
    m = json.loads((crafted / "manifest.json").read_text())
    assert m["hashes"]["embedder"]
    m["embedder"]["query_prefix"] = "ignore the question: "  # edited without its hash
    (crafted / "manifest.json").write_text(json.dumps(m))
    code, err = in_process(capsys, "ask", crafted, "what is it?")
    assert code == 1 and "embedder fields do not match" in err and one_line(err)


# ------------------------------------------------------------------ 2. bounded work per request


@pytest.mark.slow
@pytest.mark.parametrize("body, word", [
    ({"selector": "cds-paper", "options": {"tol": -1, "max_iter": 2147483647}}, "tol"),
    ({"selector": "cds-paper", "options": {"max_iter": 2147483647}}, "max_iter"),
    ({"selector": "cds-support", "options": {"num_steps": 10 ** 9}}, "num_steps"),
    ({"selector": "ppr", "options": {"tol": -1}}, "tol"),
    ({"selector": "ppr", "options": {"tol": 0.0}}, "tol"),
    ({"selector": "cds-converged", "options": {"solver": "replicator"}}, "solver"),
    ({"selector": "cds-converged", "options": {"warm_start": "replicator"}}, "warm_start"),
    ({"selector": "cds-converged", "options": {"beta": "1e400"}}, "beta"),
    ({"selector": "cds-converged", "options": {"max_iter": True}}, "max_iter"),
])
def test_hostile_options_get_400_at_once(main_server, body, word):
    t0 = time.perf_counter()
    status, reply, _ = request(main_server.url + "/select", {"question": "x", **body})
    assert status == 400 and word in reply["error"] and time.perf_counter() - t0 < 5, reply


def test_non_finite_option_gets_400(main_server):
    status, reply, _ = request(main_server.url + "/select", None,
                               raw=b'{"question": "x", "selector": "mmr", "options": {"lam": NaN}}')
    assert status == 400 and "finite" in reply["error"]


def test_select_evidence_is_the_local_ask_evidence(main_server, capsys):
    """/select answers the `cdsjax ask --json` object: each evidence item has the same fields and values (an
    index name included, which the web page passes to /pdf and /crop), crops relative to their index."""
    q = "the table of countries"
    status, sel, _ = request(main_server.url + "/select", {"question": q})  # the server's cosine, budget 6
    capsys.readouterr()
    code = cli.main(["ask", str(main_server.index), q, "--selector", "cosine", "--budget", "6", "--json",
                     "--no-read"])
    local = json.loads(capsys.readouterr().out)
    assert status == 200 and code == 0 and len(sel["evidence"]) == 6
    for e in local["evidence"]:
        if e["image_path"]:
            e["image_path"] = os.path.relpath(e["image_path"], main_server.index)
    assert sel["evidence"] == local["evidence"] and {e["index"] for e in sel["evidence"]} == {"index"}
    assert set(sel) == set(local)


def test_deadline_gives_504_frees_the_slot_and_health_stays_fast(main_server):
    url = main_server.url
    wait_idle(url)
    # a new option value compiles a new selector, which takes longer than TIMEOUT
    slow = {"question": "x", "selector": "cds-support", "options": {"tau": 0.04321, "num_steps": 40}}
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=request(url + "/select", slow)))
    t0 = time.perf_counter()
    thread.start()
    time.sleep(0.3)
    t1 = time.perf_counter()
    during = health(url, timeout=5)
    assert time.perf_counter() - t1 < 1.0 and during["compute"]["running"] == 1
    thread.join()
    status, reply, _ = result["r"]
    assert status == 504 and "deadline" in reply["error"] and time.perf_counter() - t0 < TIMEOUT + 3
    after = health(url)
    assert after["queue"]["in_flight"] == 0 and after["refused"].get("timeout", 0) >= 1
    status, reply, _ = request(url + "/select", {"question": "what is the table about?"})  # served meanwhile
    assert status == 200 and reply["evidence"]
    wait_idle(url)
    assert health(url)["compute"]["abandoned"] == 0


def test_a_disconnecting_client_frees_its_slot(main_server):
    url = main_server.url
    wait_idle(url)
    body = json.dumps({"question": "x", "selector": "cds-support", "options": {"tau": 0.05432}}).encode()
    sock = socket.create_connection(("127.0.0.1", main_server.port))
    sock.sendall(b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.time() + 10
    while health(url)["queue"]["in_flight"] != 1:
        assert time.time() < deadline
        time.sleep(0.02)
    sock.close()
    t0 = time.time()
    while health(url)["queue"]["in_flight"] != 0:
        assert time.time() - t0 < TIMEOUT - 0.3, "the slot was held until the deadline"
        time.sleep(0.02)
    assert health(url)["refused"].get("disconnected", 0) >= 1
    wait_idle(url)


def test_sigterm_stops_the_server_with_work_in_flight(built, tmp_path_factory):
    srv = Server(built, "--selector", "cosine", env=server_env(tmp_path_factory))
    try:
        slow = {"question": "x", "selector": "cds-paper", "options": {"beta": 0.77, "max_iter": 20000, "tol": 1e-12}}
        def ask():
            try:
                request(srv.url + "/select", slow, timeout=60)
            except Exception:  # noqa: BLE001 - the server goes away mid-request, as it should
                pass

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        deadline = time.time() + 10
        while health(srv.url)["compute"]["running"] == 0:
            assert time.time() < deadline
            time.sleep(0.05)
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=15)
        # uvicorn re-raises the signal once it has shut down: the exit status says SIGTERM
        assert time.time() - t0 < 6 and srv.proc.returncode in (0, -signal.SIGTERM)
        err = srv.proc.stderr.read()
        assert "Traceback" not in err, err
    finally:
        srv.stop()


# ------------------------------------------------------------------ 3. bounded memory


@pytest.mark.slow
def test_compiled_selectors_are_capped(main_server):
    url = main_server.url
    for budget in (1, 2, 3, 5, 7):
        wait_idle(url)
        status, _, _ = request(url + "/select", {"question": "x", "selector": "cosine", "budget": budget})
        assert status in (200, 504)
    wait_idle(url)
    compute = health(url)["compute"]
    assert compute["compiled_limit"] == 3 and compute["compiled"] <= 3


def test_compilation_cache_and_cache_root_are_private(main_server):
    cache = main_server.cache
    for path in (cache, os.path.join(cache, "jax-compilation")):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path


# ------------------------------------------------------------------ 4. request bodies


def test_large_body_gets_413_before_it_is_read(main_server):
    url = main_server.url
    # a 150 MB question announced by Content-Length: answered 413 before the body is sent, let alone read
    t0 = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", main_server.port))
    sock.sendall(b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 157286400\r\n\r\n{\"question\": \"xxxx")
    sock.settimeout(10)
    reply = b""
    while b"}" not in reply and (chunk := sock.recv(4096)):
        reply += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413") and b"limit" in reply and time.perf_counter() - t0 < 5
    assert health(url)["queue"]["in_flight"] == 0
    # a chunked upload without Content-Length is cut off at the limit too
    sock = socket.create_connection(("127.0.0.1", main_server.port))
    sock.sendall(b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                 b"Content-Type: application/json\r\n\r\n")
    chunk = b"x" * 32768
    try:
        for _ in range(8):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except OSError:
        pass  # the server answered and closed
    sock.settimeout(10)
    assert sock.recv(200).startswith(b"HTTP/1.1 413")
    sock.close()


def test_trickled_uploads_get_408_and_never_keep_questions_out(main_server):
    """Issue 35, 2: uploads that send a byte now and then neither hold the question slots (--queue 3) nor
    their own for longer than --body-timeout (5 s by default): each gets 408 and the server forgets it."""
    url = main_server.url
    wait_idle(url)
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(trickle_until_answered(main_server.port, 12)))
               for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.time() + 4
    while health(url)["uploads"]["in_progress"] < 3:  # all three uploading (on 7227bc3: all three slots held)
        assert time.time() < deadline
        time.sleep(0.05)
    status, reply, _ = request(url + "/select", {"question": "one more"})
    assert status == 200 and reply["evidence"]
    for t in threads:
        t.join()
    assert [status for status, _ in outcomes] == [408] * 3, outcomes
    assert all(seconds < 5 + 5 for _, seconds in outcomes), outcomes
    after = health(url)
    assert after["uploads"]["in_progress"] == 0 and after["queue"]["in_flight"] == 0
    assert after["refused"]["slow_upload"] >= 3


def test_a_new_upload_takes_the_slot_of_the_oldest_slow_one(main_server):
    """However many slow uploads hold the upload slots (64 by default), a question still gets in."""
    url = main_server.url
    wait_idle(url)
    t0 = time.time()
    held = [trickle(main_server.port) for _ in range(64)]
    while health(url)["uploads"]["in_progress"] < 64:
        assert time.time() < t0 + 3
        time.sleep(0.05)
    time.sleep(max(0.0, t0 + 1.2 - time.time()))  # the oldest is older than guard.SLOW_UPLOAD_S, not yet 5 s
    status, reply, _ = request(url + "/select", {"question": "one more"})
    assert status == 200 and reply["evidence"]
    assert reply_status(held[0], 5) == 408
    assert health(url)["refused"]["upload_cut"] >= 1
    for sock in held:
        sock.close()


# ------------------------------------------------------------------ 5. crops


def crop(url, note):
    return request(f"{url}/crop?note={urllib.parse.quote(note)}")


def test_crop_paths_outside_the_index_are_refused_at_load(built, tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("private")

    def escape(target):
        def edit(rows):
            visual = [r for r in rows if r.get("image_path")]
            assert visual
            visual[0]["image_path"] = target
        return edit

    for name, target in (("dots", "../../../../etc/passwd"), ("absolute", str(secret))):
        crafted = craft(built, tmp_path / name, notes=escape(target))
        code, err = in_process(capsys, "serve", crafted, "--port", 0)
        assert code == 1 and "refusing the index" in err and one_line(err), err
    # a crop replaced by a symlink to a file outside the index
    linked = craft(built, tmp_path / "linked")
    png = sorted((linked / "crops").rglob("*.png"))[0]
    png.unlink()
    png.symlink_to(secret)
    code, err = in_process(capsys, "ask", linked, "what is the table?")
    assert code == 1 and "refusing the index" in err and one_line(err)


def test_crop_endpoint_rechecks_path_and_hash(main_server):
    url, index = main_server.url, main_server.index
    status, sel, _ = request(url + "/select", {"question": "the table of countries"})
    visual = [e for e in sel["evidence"] if e["image_path"]]
    assert status == 200 and visual and not any(os.path.isabs(e["image_path"] or "x") for e in sel["evidence"])
    note, rel = visual[0]["note_id"], visual[0]["image_path"]
    png = index / rel
    good = png.read_bytes()
    with urllib.request.urlopen(f"{url}/crop?note={urllib.parse.quote(note)}", timeout=30) as r:
        assert r.read() == good
    try:
        png.unlink()
        png.symlink_to("/etc/passwd")  # swapped after loading
        status, reply, _ = crop(url, note)
        assert status == 404 and str(index) not in reply["error"] and "passwd" not in reply["error"]
        png.unlink()
        png.write_text("not an image\n")  # a non-image file: 404 without a path, never a 500
        status, reply, _ = crop(url, note)
        assert status == 404 and str(index) not in reply["error"]
    finally:
        if png.is_symlink() or png.exists():
            png.unlink()
        png.write_bytes(good)
    with urllib.request.urlopen(f"{url}/crop?note={urllib.parse.quote(note)}", timeout=30) as r:
        assert r.read() == good


# ------------------------------------------------------------------ 6. DNS rebinding and tokens


def raw_get(port, path, host):
    """(status, body) of a GET with an arbitrary Host header."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_foreign_host_header_is_refused(main_server):
    for path in ("/documents", "/health", "/", "/crop?note=x"):
        status, body = raw_get(main_server.port, path, "rebind.attacker.example:8765")
        assert status == 400 and b"Host" in body, path
    for host in (f"127.0.0.1:{main_server.port}", f"localhost:{main_server.port}", "localhost"):
        assert raw_get(main_server.port, "/documents", host)[0] == 200


def stderr_until(proc, words, seconds=10.0) -> str:
    """What ``proc`` writes to stderr until a line holds ``words`` or ``seconds`` pass (it keeps running)."""
    text, deadline = "", time.monotonic() + seconds
    fd = proc.stderr.fileno()
    while words not in text and time.monotonic() < deadline:
        if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            piece = os.read(fd, 65536).decode(errors="replace")
            if not piece:
                break
            text += piece
    return text


def test_a_server_without_a_token_says_every_local_user_can_read_it(main_server):
    err = stderr_until(main_server.proc, "set CDSJAX_TOKEN")
    line = next((line for line in err.splitlines() if "every local user" in line), "")
    assert line.startswith("cdsjax serve: warning: no token") and "/select, /documents" in line, err
    assert "set CDSJAX_TOKEN to require one" in line


def test_token_is_required_when_set(built, tmp_path_factory):
    srv = Server(built, "--token", "s3cret-token", "--selector", "cosine", env=server_env(tmp_path_factory))
    try:
        assert "every local user" not in stderr_until(srv.proc, "every local user", seconds=1.0)
        url = srv.url
        assert request(url + "/documents")[0] == 401
        assert request(url + "/select", {"question": "x"})[0] == 401
        req = urllib.request.Request(url + "/documents", headers={"Authorization": "Bearer wrong"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401
        req = urllib.request.Request(url + "/documents", headers={"Authorization": "Bearer s3cret-token"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        # the page: /?token=T sets a same-site cookie that the page's own requests then carry
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(b"GET /?token=s3cret-token HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = sock.recv(4096).decode()
        sock.close()
        assert reply.startswith("HTTP/1.1 303") and "cdsjax_token=s3cret-token" in reply and "HttpOnly" in reply
        req = urllib.request.Request(url + "/documents", headers={"Cookie": "cdsjax_token=s3cret-token"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_TOKEN="s3cret-token")
        code, out, _ = run_cli("ask", "--server", url, "what is it?", "--json", "--no-read", env=env)
        assert code == 0 and json.loads(out)["evidence"]
        code, _, err = run_cli("ask", "--server", url, "what is it?", "--no-read")
        assert code == 1 and "401" in err
    finally:
        srv.stop()


def test_binding_beyond_loopback_needs_a_token_and_a_host_name(built, capsys, monkeypatch):
    monkeypatch.delenv("CDSJAX_TOKEN", raising=False)
    for argv, word in ((["--host", "0.0.0.0"], "--token"),
                       (["--host", "0.0.0.0", "--token", "t"], "--allowed-host"),
                       (["--host", "0.0.0.0", "--no-auth"], "--allowed-host")):
        code, err = in_process(capsys, "serve", built, "--port", 0, *argv)
        assert code == 2 and word in err and one_line(err), (argv, err)


# ------------------------------------------------------------------ 7. lock file, modes, paths


def test_lock_file_symlink_is_not_followed(built, tmp_path, data_root, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "idx"
    (tmp_path / ".idx.lock").symlink_to(victim)
    code, err = in_process(capsys, "index", data_root / "pdfs" / "multicolumn.pdf", "--out", out)
    assert code != 0 and "lock file" in err and one_line(err), err
    assert victim.read_text() == "keep me"


def test_new_index_is_private(built):
    for path in (built, built.parent):  # the index, and the directory `index --out` created for it
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    for parent, dirs, files in os.walk(built):
        for name in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(parent, name)).st_mode) == 0o700
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(parent, name)).st_mode) == 0o600, name


def test_no_server_paths_in_answers_or_errors(main_server):
    url, index = main_server.url, str(main_server.index)
    status, docs, _ = request(url + "/documents")
    assert status == 200 and docs["indexes"] == ["index"]
    status, sel, _ = request(url + "/select", {"question": "the table"})
    text = json.dumps(sel) + json.dumps(docs)
    assert index not in text and os.path.expanduser("~") + "/" not in text
    for path in ("/docs", "/openapi.json", "/redoc"):  # no third-party scripts served from this origin
        assert request(url + path)[0] == 404
    for path, body in (("/select", {"question": "x", "selector": "nope"}), ("/crop?note=../../x", None)):
        status, reply, _ = request(url + path, body)
        assert 400 <= status < 500 and index not in reply["error"]


def test_pdf_route_serves_only_the_recorded_pdf(built, tmp_path, tmp_path_factory):
    """/pdf?document=ID serves a file outside the index (the source PDF): a crafted manifest must not make
    it serve anything else, with its hash left out or recomputed for the file it names."""
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()

    def point_at_secret(m):
        m["documents"][0]["path"] = m["documents"][0]["resolved"] = str(secret)
        m["documents"][0]["sha256"] = digest
        m["documents"].append(dict(m["documents"][0], doc_id="nohash.pdf", sha256=None))

    crafted = craft(built, tmp_path / "crafted", manifest=point_at_secret)
    srv = Server(crafted, "--selector", "cosine", env=server_env(tmp_path_factory))
    try:
        for doc in ("multicolumn.pdf", "nohash.pdf"):
            status, reply, _ = request(f"{srv.url}/pdf?document={doc}")
            assert status == 404 and str(secret) not in reply["error"], reply
    finally:
        srv.stop()


def test_check_embedder_accepts_only_known_or_named_models():
    from cdsjax.io.embed import EmbedderError, check_embedder

    minilm = dict(model="all-MiniLM-L6-v2", query_prefix="", document_prefix="", normalize=True,
                  trust_remote_code=True)
    assert check_embedder(minilm)["trust_remote_code"] is False, "the index's flag is never taken"
    nomic = dict(minilm, model="nomic-ai/nomic-embed-text-v1.5")
    with pytest.raises(EmbedderError, match="--trust-remote-code"):
        check_embedder(nomic)
    assert check_embedder(nomic, trust_remote_code=True)["trust_remote_code"] is True
    for model in ("/opt/models/some-model", "someone/evil", "", None):
        with pytest.raises(EmbedderError, match="refusing the index"):
            check_embedder(dict(minilm, model=model))
    assert check_embedder(dict(minilm, model="/opt/models/some-model"), allowed=["/opt/models/some-model"])["model"]
    with pytest.raises(EmbedderError, match="query_prefix"):
        check_embedder(dict(minilm, query_prefix=["not", "a", "string"]))


def test_nomic_index_needs_the_users_flag(built, tmp_path, capsys):
    crafted = craft(built, tmp_path / "nomic", manifest=lambda m: m["embedder"].update(
        model="nomic-ai/nomic-embed-text-v1.5", trust_remote_code=True))
    code, err = in_process(capsys, "ask", crafted, "what is it?")
    assert code == 1 and "--trust-remote-code" in err and one_line(err)


def test_lock_file_is_private_while_held(tmp_path):
    from cdsjax.io import store

    with store.writer_lock(tmp_path / "fresh" / "idx"):
        lock = tmp_path / "fresh" / ".idx.lock"
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o700  # created by cdsjax: private
    assert not lock.exists()


# ------------------------------------------------------------------ 8. second pass (issue 35), one case per finding


def trickle(port, length=1000):
    """A socket that has sent a question's headers and the first bytes of a ``length``-byte body."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /select HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n{\"question\": " % length)
    return sock


def reply_status(sock, timeout) -> int:
    """The status of the reply on ``sock`` (0 if none came within ``timeout`` seconds)."""
    sock.settimeout(timeout)
    head = b""
    try:
        while b"\r\n" not in head and (chunk := sock.recv(1024)):
            head += chunk
    except OSError:
        pass
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def trickle_until_answered(port, limit):
    """(status, seconds) of an upload that sends one byte every 0.5 s until it is answered or ``limit`` s."""
    sock = trickle(port)
    t0 = time.time()
    try:
        while time.time() - t0 < limit:
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                return reply_status(sock, 5), time.time() - t0
            try:
                sock.sendall(b" ")
            except OSError:
                return reply_status(sock, 5), time.time() - t0
        return 0, time.time() - t0
    finally:
        sock.close()


def get_pdf(url, document):
    """(status, body bytes) of ``GET /pdf?document=...``."""
    try:
        with urllib.request.urlopen(f"{url}/pdf?document={urllib.parse.quote(document)}", timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def one_line_error(body: bytes) -> str:
    error = json.loads(body)["error"]
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    return error


def test_pdf_swapped_for_a_link_is_not_served(main_server):
    url, path = main_server.url, main_server.pdfs / "swap.pdf"
    good = path.read_bytes()
    assert get_pdf(url, "swap.pdf") == (200, good)
    secret = main_server.pdfs / "secret.txt"
    secret.write_text("private key material")
    path.unlink()
    path.symlink_to(secret)  # after a request that succeeded
    status, body = get_pdf(url, "swap.pdf")
    assert status == 404 and b"private" not in body and str(main_server.pdfs) not in one_line_error(body)
    copy = main_server.pdfs / "copy.pdf"
    copy.write_bytes(good)
    path.unlink()
    path.symlink_to(copy)  # a link is refused even to the very same bytes: only the recorded file is served
    assert get_pdf(url, "swap.pdf")[0] == 404


def test_pdf_indexed_through_a_link_is_served_from_the_file_it_resolved_to(main_server):
    """Issue 53 item 5: the index records the real file behind ``link.pdf`` (and its hash); /pdf opens that
    file without following links, so the document is served, and refused once that file is changed or
    swapped for a link (even to the very same bytes)."""
    url, pdfs = main_server.url, main_server.pdfs
    entry = next(d for d in json.loads((main_server.index / "manifest.json").read_text())["documents"]
                 if d["doc_id"] == "link.pdf")
    real = pdfs / "real.pdf"
    assert entry["path"] == str(pdfs / "link.pdf") and entry["resolved"] == os.path.realpath(real)
    good = real.read_bytes()
    assert get_pdf(url, "link.pdf") == (200, good)
    real.write_bytes(good[:-10] + b"0123456789")  # the resolved file's content changed
    assert get_pdf(url, "link.pdf")[0] == 404
    real.write_bytes(good)
    assert get_pdf(url, "link.pdf") == (200, good)
    other = pdfs / "other.pdf"
    other.write_bytes(good)
    real.unlink()
    real.symlink_to(other)  # the resolved file swapped for a link to another file with the same bytes
    status, body = get_pdf(url, "link.pdf")
    assert status == 404 and b"%PDF" not in body and str(pdfs) not in one_line_error(body)


def test_pdf_of_an_index_without_resolved_paths_is_served_while_not_a_link(main_server):
    """An entry written before the resolved path was recorded: its ``path`` is opened without following a
    link, as before (served while a regular file with the recorded hash, refused once it is a link)."""
    url, path = main_server.url, main_server.pdfs / "legacy.pdf"
    good = path.read_bytes()
    assert get_pdf(url, "legacy.pdf") == (200, good)
    copy = main_server.pdfs / "legacy-copy.pdf"
    copy.write_bytes(good)
    path.unlink()
    path.symlink_to(copy)
    assert get_pdf(url, "legacy.pdf")[0] == 404


def test_pdf_with_bytes_appended_is_not_served(main_server):
    url, path = main_server.url, main_server.pdfs / "append.pdf"
    good = path.read_bytes()
    assert get_pdf(url, "append.pdf") == (200, good)
    with open(path, "ab") as f:
        f.write(b"\n<script>alert(1)</script>\n")
    status, body = get_pdf(url, "append.pdf")
    assert status == 404 and b"script" not in body
    path.write_bytes(good)
    assert get_pdf(url, "append.pdf") == (200, good)


def test_pdf_deleted_after_serving_gives_404_not_500(main_server):
    url, path = main_server.url, main_server.pdfs / "gone.pdf"
    assert get_pdf(url, "gone.pdf")[0] == 200
    path.unlink()
    status, body = get_pdf(url, "gone.pdf")
    assert status == 404 and "missing" in one_line_error(body)


def test_pdf_changed_then_restored_is_served_again(main_server):
    """Nothing is cached across requests: a refusal holds only while the file is wrong."""
    url, path = main_server.url, main_server.pdfs / "restored.pdf"
    good = path.read_bytes()
    path.write_bytes(good[:-10] + b"0123456789")  # same size, other bytes
    assert get_pdf(url, "restored.pdf")[0] == 404
    path.write_bytes(good)
    assert get_pdf(url, "restored.pdf") == (200, good)


def test_pdf_hashing_never_holds_up_health(main_server):
    """A 3 GiB file behind /pdf: refused (over --max-pdf-mb) without being hashed on the event loop."""
    url = main_server.url
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=get_pdf(url, "huge.pdf")))
    thread.start()
    slowest, t_end = 0.0, time.time() + 1.5
    while time.time() < t_end or thread.is_alive():
        t0 = time.perf_counter()
        health(url, timeout=30)
        slowest = max(slowest, time.perf_counter() - t0)
        assert time.time() < t_end + 30
        time.sleep(0.05)
    thread.join()
    assert slowest < 1.0, f"/health took {slowest:.2f} s while a PDF was checked"
    assert result["r"][0] == 404 and "MB" in one_line_error(result["r"][1])


def test_pdf_unknown_document_is_echoed_short(main_server):
    status, body = get_pdf(main_server.url, "x" * 12_000)
    assert status == 404 and len(one_line_error(body)) < 400


def post_raw(url, data: bytes):
    """(status, error line or None) of a POST with the raw body ``data``."""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            return r.status, None
    except urllib.error.HTTPError as err:
        return err.code, one_line_error(err.read())


GIANT = b"9" * 401


@pytest.mark.parametrize("data", [
    b'{"question": "x", "selector": "cds-converged", "options": {"beta": %s}}' % GIANT,
    b'{"question": "x", "selector": "cds-converged", "options": {"beta": -%s}}' % GIANT,
    b'{"question": "x", "selector": "cds-converged", "options": {"beta": 1e999}}',
    b'{"question": "x", "selector": "cds-converged", "options": {"beta": 1e308}}',  # finite, but not in float32
    b'{"question": "x", "selector": "cds-paper", "options": {"max_iter": %s}}' % GIANT,
    b'{"question": "x", "selector": "cds-paper", "options": {"tol": 1e-999}}',
    b'{"question": "x", "budget": %s}' % GIANT,
    b'{"question": "x", "near_duplicates": %s}' % GIANT,
    b'{"question": "x", "budget": %s}' % (b"9" * 5000),  # over Python's int-from-text limit
    b'{"question": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",  # nesting deeper than the JSON parser recurses
    b'{"question": "\\ud800"}',  # a lone surrogate
    b'{"question": "x", "selector": "\\udfff"}',
    b'{"question": "x", "selector": "mmr", "options": {"\\ud800": 1}}',
    b'{"question": "\xff\xfe"}',  # not UTF-8
])
def test_request_values_give_a_4xx_never_a_500(main_server, data):
    status, error = post_raw(main_server.url + "/select", data)
    assert 400 <= status < 500 and error, (status, error)


@pytest.mark.parametrize("body", [
    {"question": "x", "budget": "5"}, {"question": "x", "budget": True}, {"question": "x", "budget": 5.0},
    {"question": "x", "near_duplicates": "0.9"}, {"question": "x", "near_duplicates": True},
    {"question": 5}, {"question": "x", "selector": 5},
    {"question": "x", "selector": "cds-paper", "options": {"max_iter": "100"}},
    {"question": "x", "selector": "cds-paper", "options": {"max_iter": 100.0}},
    {"question": "x", "selector": "cds-converged", "options": {"beta": "0.5"}},
    {"question": "x", "selector": "cds-converged", "options": {"beta": False}},
])
def test_budget_and_options_are_strictly_typed(main_server, body):
    status, error = post_raw(main_server.url + "/select", json.dumps(body).encode())
    assert status in (400, 422) and error, (body, status, error)


def test_host_header_is_parsed_whole(main_server):
    port = main_server.port
    for host in ("localhost:evil", "[::1]evil.example", f"127.0.0.1:{port}/evil", "localhost:99999",
                 "localhost:", f"localhost:{port}:1", "127.0.0.1 evil.example", "[::1"):
        status, body = raw_get(port, "/documents", host)
        assert status == 400, (host, status, body)
    for host in (f"localhost:{port}", f"[::1]:{port}", "127.0.0.1", "LocalHost"):
        assert raw_get(port, "/documents", host)[0] == 200, host


NON_ASCII_TOKEN = "pässwörd-☃-tökén"


@pytest.mark.slow
def test_non_ascii_token_is_compared_as_bytes(built, tmp_path_factory):
    token = NON_ASCII_TOKEN.encode()
    env = dict(server_env(tmp_path_factory), CDSJAX_TOKEN=NON_ASCII_TOKEN)  # the environment: not seen in `ps`
    srv = Server(built, "--selector", "cosine", env=env)
    try:
        def documents(headers):
            req = urllib.request.Request(srv.url + "/documents", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status
            except urllib.error.HTTPError as err:
                return err.code

        assert documents({"Authorization": b"Bearer " + token}) == 200
        assert documents({"Authorization": b"Bearer " + token[:-1]}) == 401
        assert documents({"Authorization": b"Bearer \xff\xfe"}) == 401
        # the page with a wrong token is just the page; a raw non-ASCII byte in the URL is refused by HTTP parsing
        for query, expected in ((urllib.parse.quote(token), ("303",)), ("%FF%FE", ("200",)), ("\u00e9", ("200", "400"))):
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.sendall(b"GET /?token=" + query.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Connection: close\r\n\r\n")
            reply = sock.recv(4096).decode("latin-1")
            sock.close()
            assert reply.split()[1] in expected, (query, reply[:300])
            if expected == ("303",):
                cookie = reply.split("set-cookie: ", 1)[1].split(";", 1)[0]
                assert cookie.isascii() and documents({"Cookie": cookie}) == 200
        env = dict(os.environ, PYTHONPATH=ROOT, CDSJAX_TOKEN=NON_ASCII_TOKEN)
        code, out, err = run_cli("ask", "--server", srv.url, "what is it?", "--json", "--no-read", env=env)
        assert code == 0 and json.loads(out)["evidence"], err
    finally:
        srv.stop()


def test_token_flag_says_prefer_the_environment(capsys):
    from pathlib import Path

    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "in `ps`" in text and "CDSJAX_TOKEN" in text
    security = (Path(ROOT) / "README.md").read_text().split("## Security", 1)[1].split("\n## ")[0]
    examples = "".join(re.findall(r"```[a-z]*\n(.*?)```", security, flags=re.S))
    assert "in `ps`" in security and "CDSJAX_TOKEN" in examples and "--token" not in examples


def test_answers_never_carry_inf_or_nan():
    """A diagnostic that overflowed (an option at the edge of float32) is sent as null, not as a 500."""
    from cdsjax.commands.policy import finite

    out = finite({"diagnostics": {"beta": float("inf"), "objective": float("nan"), "ok": 1.5},
                  "evidence": [{"score": float("-inf"), "rank": 1}]})
    assert out == {"diagnostics": {"beta": None, "objective": None, "ok": 1.5}, "evidence": [{"score": None, "rank": 1}]}
    assert json.dumps(out, allow_nan=False)
