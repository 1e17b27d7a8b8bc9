"""The local reader that stays warm (cdsjax.io.reading.local.reader, keep-alive > 0): its record in the cdsjax cache
(cdsjax.io.reading.local.records: private modes, this user's only), reuse by a later process, a dead or foreign record
replaced, the idle timeout, the API key, and `cdsjax reader status | stop`.

Every test uses a cdsjax cache of its own (the model file is found in the default cache, where `make` assembles
it) and stops whatever server it started (the `warm_cache` fixture)."""

import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from cdsjax import cli
from cdsjax.io.reading.local import reader as L
from cdsjax.io.reading.local import records as R
from cdsjax.io.child import reap
from cdsjax.io.util import pid_alive
from cdsjax.io.util import free_port
from tests.conftest import ROOT, run_command

SMALL = dict(threads=1, ctx_per_slot=512, startup_timeout=120)


@pytest.fixture
def warm_cache(tmp_path, monkeypatch):
    """A cdsjax cache of this test's own; at teardown every reader of it is stopped, and none may be left."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CDSJAX_CACHE", str(cache))
    monkeypatch.delenv("CDSJAX_READER_KEEP_ALIVE", raising=False)
    yield cache
    R.stop_readers()
    assert not R.own_servers(R.readers_dir()), "a reader of the test's cache is still running"


def _status() -> list:
    return json.loads(_cli("reader", "status", "--json"))


def _cli(*argv) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return out.getvalue()


def _http(url: str, key=None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------------------------------------------------------
# Without a server


def test_keep_alive_setting_flag_then_environment_then_default(monkeypatch):
    monkeypatch.delenv(L.KEEP_ALIVE_ENV, raising=False)
    assert L.keep_alive_setting() == L.DEFAULT_KEEP_ALIVE == 300.0
    monkeypatch.setenv(L.KEEP_ALIVE_ENV, "12.5")
    assert L.keep_alive_setting() == 12.5 and L.keep_alive_setting(0) == 0.0
    for bad, where in (("-1", L.KEEP_ALIVE_ENV), ("soon", L.KEEP_ALIVE_ENV)):
        monkeypatch.setenv(L.KEEP_ALIVE_ENV, bad)
        with pytest.raises(ValueError, match=where):
            L.keep_alive_setting()
    with pytest.raises(ValueError, match="--keep-alive"):
        L.keep_alive_setting("nan")
    with pytest.raises(ValueError, match="keep_alive"):
        L.LocalReaderConfig(keep_alive=-3)


def test_records_are_private_and_only_this_users_own_are_read(tmp_path):
    path = tmp_path / "r.json"
    record = dict(version=1, pid=os.getpid(), uid=os.getuid(), port=1234, api_key="k")
    R.write_record(path, record)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and R.read_record(path)["api_key"] == "k"
    os.chmod(path, 0o640)  # readable by the group: the key may have leaked, never used
    assert R.read_record(path) is None
    os.chmod(path, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert R.read_record(link) is None
    R.write_record(path, dict(record, uid=os.getuid() + 1))  # says it is another user's
    assert R.read_record(path) is None
    path.write_text("{not json")
    assert R.read_record(path) is None
    R.write_record(path, dict(record, port="1234"))
    assert R.read_record(path) is None
    if os.getuid() == 0:  # a file another user owns, in a directory of ours
        R.write_record(path, record)
        os.chown(path, 4242, -1)
        assert R.read_record(path) is None


def test_a_dead_or_foreign_record_is_not_used(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    base = dict(version=1, uid=os.getuid(), port=free_port(), api_key="k")
    assert not R.server_answers(dict(base, pid=dead.pid))  # no such process
    assert not R.server_answers(dict(base, pid=os.getpid()))  # alive, but not a reader server
    assert not R.server_answers(dict(base, pid=1))  # init: not this module's server


def test_a_cache_others_may_read_gets_a_reader_of_its_own(warm_cache, monkeypatch):
    started = []

    def fake_start(self, log_dir, *, parent, record=None):
        started.append((parent, record))
        self.base_url, self.api_key = "http://127.0.0.1:9/v1", "k"

    model = warm_cache.parent / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(L, "runtime_installed", lambda: True)
    monkeypatch.setattr(L.LocalReader, "_start_process", fake_start)
    R.readers_dir().mkdir(parents=True)
    os.chmod(warm_cache, 0o700)
    os.chmod(R.readers_dir(), 0o755)
    reader = L.LocalReader(model=str(model), keep_alive=60).start()
    assert started == [(os.getpid(), None)] and not reader.shared  # the caller's own: it watches its parent
    assert reader.keep_alive == 0 and "may be read by others" in reader.describe()["not_shared"]
    reader.process = None
    reader.close()


def test_no_exit_handler_is_installed_at_import():
    code = ("import atexit, sys; import cdsjax.io.reading.local.model; n = atexit._ncallbacks(); "
            "import cdsjax.io.reading.local.reader as L; from cdsjax.io.reading.local.held import HELD; "
            "sys.exit(0 if not HELD.exit_registered and atexit._ncallbacks() == n else 1)")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert done.returncode == 0


# ---------------------------------------------------------------------------------------------------------------
# With the real server (the default model, one thread, small context: it loads in ~3-5 s)


@pytest.mark.local_reader
def test_a_second_process_reuses_the_warm_reader_behind_its_key(local_model, warm_cache):
    # a record left by a server that has died is replaced
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    key = R.server_key(local_model, threads=1, ctx_per_slot=512, slots=1)
    R.readers_dir().mkdir(parents=True, mode=0o700)
    R.write_record(R.readers_dir() / f"{key}.json", dict(version=1, pid=dead.pid, uid=os.getuid(),
                                                        port=free_port(), api_key="k"))
    with L.LocalReader(keep_alive=60, progress=False, **SMALL) as first:
        assert first.shared and not first.reused and first.describe()["reused"] is False
        assert first.record_path.name == f"{key}.json" and first.record["pid"] != dead.pid
        pid, root = first.record["pid"], first.base_url[: -len("/v1")]
        directory = R.readers_dir()
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(first.record_path.stat().st_mode) == 0o600
        assert _http(root + "/v1/models") == 401 and _http(root + "/v1/models", "wrong") == 401
        assert _http(root + "/v1/models", first.api_key) == 200
        assert first.reader_config().api_key == first.api_key
        # the key is on no command line (`ps` shows those to every user)
        assert first.api_key not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert pid_alive(pid)  # released, not stopped
    # another process asks for the same server: it is reused, no second one starts; its keep-alive applies
    code = ("import json, os, cdsjax.io.reading.local.reader as L; "
            "r = L.LocalReader(keep_alive=90, progress=False, threads=1, ctx_per_slot=512).start(); "
            "print(json.dumps(dict(r.describe(), pid=r.record['pid']))); r.close()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads(done.stdout.strip().splitlines()[-1])
    assert again["reused"] is True and again["pid"] == pid
    assert list(R.own_servers(directory)) == [pid]
    listed = _status()
    assert [(s["pid"], s["alive"], s["keep_alive"]) for s in listed] == [(pid, True, 90.0)]
    assert "port" in _cli("reader", "status")
    assert "stopped" in _cli("reader", "stop")
    assert _wait_gone(pid, 15) and not list(directory.glob("*.json")) and _status() == []


@pytest.mark.local_reader
def test_a_record_that_does_not_match_is_replaced_and_an_idle_reader_exits(local_model, warm_cache):
    with L.LocalReader(keep_alive=2, progress=False, **SMALL) as first:
        path, old = first.record_path, dict(first.record)
    assert pid_alive(old["pid"])
    # the record no longer matches its server (a wrong key): the next start replaces it
    R.write_record(path, dict(old, api_key="not-the-key"))
    with L.LocalReader(keep_alive=2, progress=False, **SMALL) as second:
        assert not second.reused and second.record["pid"] != old["pid"]
        new = second.record["pid"]
        assert _wait_gone(old["pid"], 15)  # nobody finds the old one any more: it leaves
        time.sleep(3)  # held: kept up past its keep-alive
        assert pid_alive(new) and R.read_record(path)["pid"] == new
    assert _wait_gone(new, 2 + 10) and not path.exists()  # idle for its keep-alive: gone, its record too


@pytest.mark.slow
@pytest.mark.local_reader
def test_a_second_ask_reuses_the_warm_reader(demo_run, with_local_reader, tmp_path, monkeypatch):
    """Done when (issue 68): a second `ask` within the keep-alive reuses the warm reader, the JSON says so, and
    no second server process is started."""
    monkeypatch.setenv("CDSJAX_READER_KEEP_ALIVE", "120")
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))  # run_command's cache, for the clean-up
    index = demo_run[0] / "index"
    argv = ("ask", str(index), "What did the battery system cost?", "--budget", "1", "--json",
            "--reader-threads", "1", "--reader-ctx", "2048")
    try:
        code, out, err = run_command(tmp_path, *argv, timeout=600)
        assert code == 0, err[-2000:]
        first = json.loads(out)["reader"]["local"]
        pids = list(R.own_servers(R.readers_dir()))
        code, out, err = run_command(tmp_path, *argv, timeout=600)
        assert code == 0, err[-2000:]
        second = json.loads(out)["reader"]["local"]
        assert first["reused"] is False and second["reused"] is True and second["keep_alive_s"] == 120
        assert len(pids) == 1 and list(R.own_servers(R.readers_dir())) == pids
    finally:
        R.stop_readers()
    assert not R.own_servers(R.readers_dir())
