"""The warm server (cdsjax.commands.warm): `cdsjax ask` as the client of one process per user that holds the indexes
and the reader; its directory and socket reachable by this user only; keep-alive bounds and holds that are never
shortened; a stream that ends early is an error; `cdsjax reader status|stop`."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cdsjax.commands.warm import client, place
from cdsjax.commands.warm.wire import receive, send
from tests.conftest import ROOT, run_command

ROOT_USER = hasattr(os, "getuid") and os.getuid() == 0
NOBODY = 65534


@pytest.fixture
def demo_index(demo_run):
    return demo_run[0] / "index"


@pytest.fixture
def warm(monkeypatch, tmp_path):
    """A warm directory of the test's own (short: a socket's path stays under 100 bytes), the keep-alive on, the
    cache the test's commands use (:func:`run_command`: ``tmp_path/cache``); the server the test started is stopped
    after it."""
    top = Path(tempfile.mkdtemp(prefix="cw-", dir="/tmp"))
    directory = top / "run"
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(place.RUNTIME_ENV, str(directory))
    monkeypatch.setenv(place.KEEP_ALIVE_ENV, "60")
    monkeypatch.delenv(place.IN_PROCESS_ENV, raising=False)
    yield directory
    state = None
    if directory.exists():
        try:
            state = client.call({"op": "stop"})
        except (client.WarmError, place.PlaceError):
            pass
    if state is not None and "pid" in state:
        _wait_gone(state["pid"])
    shutil.rmtree(top, ignore_errors=True)


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie of a process we started counts as gone
            if f.read().split(")")[-1].split()[0] == "Z":
                return True
        time.sleep(0.2)
    return False


def _ask(root, *argv):
    code, out, err = run_command(root, "ask", *argv, "--json")
    return code, (json.loads(out) if code == 0 and out.strip() else None), err


def test_keep_alive_is_zero_or_between_the_floor_and_the_ceiling(monkeypatch, tmp_path):
    monkeypatch.delenv(place.KEEP_ALIVE_ENV, raising=False)
    assert place.keep_alive_setting() == 300.0
    monkeypatch.setenv(place.KEEP_ALIVE_ENV, "12.5")
    assert place.keep_alive_setting() == 12.5 and place.keep_alive_setting(0) == 0.0
    assert place.keep_alive_setting("86400") == 86400.0 and place.keep_alive_setting(5) == 5.0
    for bad in ("0.1", "4.9", "1e9", "inf", "nan", "soon", "-1"):
        with pytest.raises(ValueError, match="--keep-alive: expected 0") as err:
            place.keep_alive_setting(bad)
        assert "\n" not in str(err.value)
    monkeypatch.setenv(place.KEEP_ALIVE_ENV, "-1")
    with pytest.raises(ValueError, match=place.KEEP_ALIVE_ENV):
        place.keep_alive_setting()
    code, out, err = run_command(tmp_path, "ask", str(tmp_path), "q?", "--keep-alive", "0.1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "0 (keep nothing warm) or 5" in err, err


def test_one_warm_server_per_cache(tmp_path, monkeypatch):
    names = set()
    for cache in ("a", "b", "a"):
        monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / cache))
        names.add((place.socket_name(), place.lock_name(), place.log_name()))
    assert len(names) == 2  # a command never reaches a server that reads another cache


def test_the_directory_must_be_this_users_alone(tmp_path, monkeypatch):
    top = Path(tempfile.mkdtemp(prefix="cw-", dir="/tmp"))
    try:
        made = top / "new"
        monkeypatch.setenv(place.RUNTIME_ENV, str(made))
        assert place.private_runtime_dir() == made and (made.stat().st_mode & 0o777) == 0o700
        open_dir = top / "open"
        open_dir.mkdir()
        os.chmod(open_dir, 0o755)
        link = top / "link"
        link.symlink_to(made)
        deep = top / ("d" * 120)
        cases = [(open_dir, "others may enter it"), (link, "a link"), (deep, "too deep")]
        if ROOT_USER:
            foreign = top / "foreign"
            foreign.mkdir(mode=0o700)
            os.chown(foreign, NOBODY, NOBODY)
            cases.append((foreign, f"owned by uid {NOBODY}"))
        for path, words in cases:
            monkeypatch.setenv(place.RUNTIME_ENV, str(path))
            with pytest.raises(place.PlaceError) as err:
                place.private_runtime_dir()
            assert words in str(err.value) and "\n" not in str(err.value) and place.RUNTIME_ENV in str(err.value)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(not ROOT_USER, reason="needs root to listen as another user")
def test_a_socket_held_by_another_user_is_sent_nothing(tmp_path):
    """Another user's process listening on the socket (as after a server's end, were the directory not private):
    the client sees its peer's uid and sends nothing — no question, no evidence, no key."""
    top = Path(tempfile.mkdtemp(prefix="cw-", dir="/tmp"))
    try:
        path = top / place.socket_name()
        script = ("import os, socket, sys\n"
                  "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                  f"s.bind({str(path)!r})\n"
                  f"os.setuid({NOBODY})\n"
                  "s.listen(1)\n"
                  "print('ready', flush=True)\n"
                  "c, _ = s.accept()\n"
                  "c.settimeout(5)\n"
                  "data = b''\n"
                  "try:\n"
                  "    while chunk := c.recv(4096):\n"
                  "        data += chunk\n"
                  "except OSError:\n"
                  "    pass\n"
                  "print(len(data), flush=True)\n")
        spy = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert spy.stdout.readline().strip() == "ready"
        with pytest.raises(place.PlaceError, match=f"held by uid {NOBODY}"):
            client.connect(top)
        assert spy.stdout.readline().strip() == "0"  # it received no byte
        spy.wait(timeout=10)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_second_ask_is_answered_by_the_same_warm_server(demo_index, warm, tmp_path):
    code, first, err = _ask(tmp_path, str(demo_index), "What does the table report?", "--no-read")
    assert code == 0, err
    state = client.call({"op": "status"})
    assert state is not None and state["in_flight"] == 0 and state["indexes"][0]["paths"] == [str(demo_index)]
    assert (warm.stat().st_mode & 0o777) == 0o700 and ((warm / place.socket_name()).stat().st_mode & 0o077) == 0
    assert ((warm / place.log_name()).stat().st_mode & 0o777) == 0o600
    code, second, err = _ask(tmp_path, str(demo_index), "What does the table report?", "--no-read")
    assert code == 0, err
    assert second["timings"]["load"] == 0.0 < first["timings"]["load"]  # held: nothing loaded again
    assert client.call({"op": "status"})["pid"] == state["pid"]
    code, alone, err = _ask(tmp_path, str(demo_index), "What does the table report?", "--no-read", "--in-process")
    assert code == 0, err
    ids = lambda r: [e["note_id"] for e in r["evidence"]]  # noqa: E731
    assert ids(first) == ids(second) == ids(alone)  # the same selection as in a process of its own
    # errors come back as one line
    code, _, err = _ask(tmp_path, str(demo_index), "q?", "--selector", "no-such-selector", "--no-read")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no-such-selector" in err, err
    code, _, err = _ask(tmp_path, str(tmp_path / "missing.pdf"), "q?", "--no-read")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "no such file" in err, err
    code, out, err = run_command(tmp_path, "reader", "status")
    assert code == 0 and f"pid {state['pid']}" in out and f"indexes: {demo_index}" in out, err
    code, out, err = run_command(tmp_path, "reader", "stop")
    assert code == 0 and "stopped" in out and str(state["pid"]) in out, err
    assert _wait_gone(state["pid"]) and not (warm / place.socket_name()).exists()
    code, out, err = run_command(tmp_path, "reader", "status", "--json")
    assert code == 0 and json.loads(out) is None


def test_a_later_keep_alive_never_shortens_a_hold_and_an_idle_server_exits(demo_index, warm, tmp_path):
    code, _, err = _ask(tmp_path, str(demo_index), "q?", "--no-read", "--keep-alive", "120")
    assert code == 0, err
    code, _, err = _ask(tmp_path, str(demo_index), "q?", "--no-read", "--keep-alive", "5")
    assert code == 0, err
    state = client.call({"op": "status"})
    assert state["keep_alive_left_s"] > 100  # the second command did not cut the first one's hold
    client.call({"op": "stop"})
    assert _wait_gone(state["pid"])
    code, _, err = _ask(tmp_path, str(demo_index), "q?", "--no-read", "--keep-alive", "5")
    assert code == 0, err
    pid = client.call({"op": "status"})["pid"]
    assert _wait_gone(pid, timeout=40)  # idle past its 5 s: it exits by itself, and removes its socket
    assert not (warm / place.socket_name()).exists()
    assert "idle past every keep-alive" in (warm / place.log_name()).read_text()


def test_two_first_asks_at_once_share_one_server(demo_index, warm, tmp_path):
    env = dict(os.environ, CDSJAX_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "cdsjax.cli", "ask", str(demo_index), "q?", "--no-read", "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    loads = sorted(json.loads(o[0])["timings"]["load"] for o in outs)
    assert loads[0] == 0.0 < loads[1]  # one server loaded the index once; the other ask found it held
    servers = subprocess.run(["pgrep", "-f", "cdsjax[.]commands[.]warm"], capture_output=True, text=True)
    assert client.call({"op": "status"})["pid"] in {int(p) for p in servers.stdout.split()}


def _fake_server(directory: Path, events):
    """A server that answers any request with ``events`` and then closes: a stream cut short."""
    directory.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(directory / place.socket_name()))
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with conn, conn.makefile("rwb") as stream:
                    receive(stream)
                    for event in events:
                        send(stream, event)
            except OSError:  # the client left first
                pass

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_an_answer_cut_before_its_end_is_an_error_not_an_answer(warm, tmp_path):
    listener = _fake_server(warm, [{"event": "evidence", "reading": True,
                                    "result": {"question": "q?", "answer": None, "evidence": [], "selector": "x",
                                               "budget": 1, "diagnostics": {}, "timings": {}, "warnings": []}},
                                   {"event": "token", "text": "The answer is"}])
    try:
        with pytest.raises(client.WarmError, match="ended the answer before its end"):
            list(client.events({"op": "ask"}, keep_alive=60))
        code, out, err = run_command(tmp_path, "ask", str(tmp_path), "q?", "--json")
        assert code == 1 and "ended the answer before its end" in err and len(err.strip().splitlines()) == 1, err
        assert not out.strip()  # nothing shown as the answer
    finally:
        listener.close()
        (warm / place.socket_name()).unlink()


def test_the_client_loads_neither_jax_nor_torch(demo_index, warm):
    code = ("import sys, io, contextlib\n"
            "from cdsjax import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = cli.main(['ask', {str(demo_index)!r}, 'what is it?', '--json', '--no-read'])\n"
            "print(rc, sorted(m for m in ('jax', 'torch', 'sentence_transformers', 'openai') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and proc.stdout.split() == ["0", "[]"], proc.stderr


@pytest.mark.slow
@pytest.mark.local_reader
def test_the_warm_reader_is_reused_and_one_that_died_is_never_sent_to(demo_index, with_local_reader, warm, tmp_path):
    code, first, err = _ask(tmp_path, str(demo_index), "What is the main finding?")
    assert code == 0 and first["answer"], err
    code, second, err = _ask(tmp_path, str(demo_index), "What is the main finding?")
    assert code == 0 and second["answer"] and second["reader"]["local"]["reused"] is True, err
    assert first["reader"]["local"]["reused"] is False
    state = client.call({"op": "status"})
    (reader,) = state["readers"]
    cmdline = Path(f"/proc/{reader['pid']}/cmdline").read_bytes().split(b"\0")
    assert b"--socket" in cmdline and b"--port" not in cmdline  # no TCP port: nothing another user could bind
    assert cmdline[cmdline.index(b"--socket") + 1].decode().startswith(str(warm) + "/")
    os.kill(reader["pid"], 9)  # the OOM killer, say; its socket closes at once, its exit is reaped later
    code, third, err = _ask(tmp_path, str(demo_index), "What is the main finding?")
    assert code == 0 and third["answer"] and third["reader"]["local"]["reused"] is False, \
        err + (warm / place.log_name()).read_text()
    assert client.call({"op": "status"})["readers"][0]["pid"] != reader["pid"]


def _exchange(server, request) -> list:
    """One request to ``server`` (in this process) over a socket pair: the events it answers with."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker = threading.Thread(target=server.handle, args=(theirs,))
    worker.start()
    events = []
    with mine, mine.makefile("rwb") as stream:
        if isinstance(request, bytes):
            stream.write(request)
            stream.flush()
        else:
            send(stream, request)
        while (event := receive(stream)) is not None:
            events.append(event)
    worker.join(120)
    return events


def test_what_the_warm_server_holds_and_for_how_long(demo_index, tmp_path):
    """In this process: a set of indexes loaded once and held, loaded again once its files change, the least recently
    used dropped; holds only lengthened; errors as one line with their exit code; idle once every hold passed."""
    from cdsjax.commands.warm.server import WarmServer

    index = tmp_path / "index"
    shutil.copytree(demo_index, index)
    server = WarmServer(tmp_path, keep_alive=30, max_indexes=1)
    request = dict(op="ask", paths=[str(index)], question="What does the table report?", selector=None, budget=3,
                   options={}, relevance=None, embedders=[], trust_remote_code=False, abstain=True, reader=None,
                   evidence_tokens=None, keep_alive=60, params=None)
    first = _exchange(server, request)
    assert [e["event"] for e in first] == ["status", "evidence", "done"], first
    assert "loading 1 index" in first[0]["text"] and first[-1]["result"]["timings"]["load"] > 0
    second = _exchange(server, request)
    assert [e["event"] for e in second] == ["evidence", "done"] and second[-1]["result"]["timings"]["load"] == 0
    assert [e["note_id"] for e in first[-1]["result"]["evidence"]] == [e["note_id"] for e in second[-1]["result"]["evidence"]]
    (state,) = _exchange(server, {"op": "status"})
    assert state["in_flight"] == 0 and [i["paths"] for i in state["indexes"]] == [[str(index)]]
    assert 50 < state["keep_alive_left_s"] <= 60
    server.hold(5)  # a shorter keep-alive later: the hold stays
    assert server.until - time.time() > 50
    later = time.time() + 5
    os.utime(index / "manifest.json", (later, later))  # the index changed on disk: loaded again, never served stale
    assert [e["event"] for e in _exchange(server, request)][0] == "status"
    dense = _exchange(server, dict(request, relevance="dense"))  # another set: the older one is dropped (at most 1)
    assert dense[-1]["event"] == "done" and dense[-1]["result"]["relevance"]["mode"] == "dense"
    (state,) = _exchange(server, {"op": "status"})
    assert len(state["indexes"]) == 1
    for bad, code, words in ((dict(request, selector="no-such-selector"), 2, "no-such-selector"),
                             (dict(request, paths=[str(tmp_path / "missing.pdf")]), 1, "no such file"),
                             (dict(request, keep_alive=0.5), 2, "expected 0"),
                             ({"op": "dance"}, 2, "unknown request")):
        event = _exchange(server, bad)[-1]  # after a status line, where an index was to be loaded
        assert event["event"] == "error" and event["code"] == code and words in event["message"], event
        assert "\n" not in event["message"]
    assert _exchange(server, b"not json\n") == []  # not a request: the connection is closed
    assert not server.tick()  # held
    server.until = time.time() - 1
    assert server.tick()  # nothing in flight, every hold passed: due to exit
    (reply,) = _exchange(server, {"op": "stop"})
    assert reply["stopped"] and server.stopping.is_set()
