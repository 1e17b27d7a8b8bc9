"""Child processes (cdsjax.io.child): the one start, parent watch, health wait and stop that the local reader,
the multi-process evaluation, the index's worker pool and the layout helper use."""

import http.server
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cdsjax.io import child
from cdsjax.io.util import free_port, pid_alive

PY = sys.executable


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        child.reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def _sleep_forever():
    time.sleep(600)


def test_spawn_writes_its_log_passes_its_environment_and_detaches(tmp_path):
    log = tmp_path / "child.log"
    p = child.spawn([PY, "-c", "import os, sys; print(os.environ['SECRET'], os.getsid(0) == os.getpid()); "
                     "print(sys.stdin.read() == '', file=sys.stderr)"],
                    env=dict(os.environ, SECRET="s3"), log=log, detach=True)
    assert p.wait(timeout=30) == 0
    assert log.read_text().split() == ["s3", "True", "True"]  # its own session; stdin is /dev/null
    with pytest.raises(ValueError, match="exclude"):
        child.spawn([PY, "-c", "pass"], detach=True, die_with_parent=True)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_spawn_pins_to_a_core():
    core = max(os.sched_getaffinity(0))
    out = subprocess.run([PY, "-c", f"import sys, subprocess; sys.path[:0] = {sys.path!r}; "
                          f"from cdsjax.io.child import spawn; "
                          f"p = spawn([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], "
                          f"core={core}); p.wait()"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"[{core}]", out.stderr[-2000:]


def test_wait_until_says_in_one_line_why_a_child_did_not_come_up(tmp_path):
    log = tmp_path / "server.log"
    p = child.spawn([PY, "-c", "import sys; print('no model'); sys.exit(3)"], log=log)
    with pytest.raises(child.ChildError) as err:
        child.wait_until(lambda: False, timeout=30, what="the test server", process=p, log=log)
    assert err.value.returncode == 3 and err.value.log == log
    assert str(err.value) == f"the test server exited with status 3 before it answered (log: {log})"
    p = child.spawn([PY, "-c", "import time; time.sleep(60)"], log=log)
    try:
        with pytest.raises(child.ChildError) as err:
            child.wait_until(lambda: False, timeout=0.3, what="the test server", process=p, log=log)
        assert err.value.returncode is None and p.poll() is None  # left running: the caller stops it
        assert str(err.value) == f"the test server did not answer within 0.3 s (log: {log})"
    finally:
        child.stop(p)
    calls = []
    assert child.wait_until(lambda: calls.append(1) or len(calls) == 3, timeout=10, what="x", interval=0.01) >= 0
    assert len(calls) == 3


def test_http_ok_is_a_health_probe():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert child.http_ok(url + "/health") and not child.http_ok(url + "/other")
    finally:
        server.shutdown()
        server.server_close()
    assert not child.http_ok(f"http://127.0.0.1:{free_port()}/health", timeout=1)


def test_stop_terminates_then_kills_and_takes_the_group_of_a_detached_child(tmp_path):
    stubborn = child.spawn([PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                            "print('ready', flush=True); time.sleep(60)"], log=tmp_path / "a.log")
    polite = child.spawn([PY, "-c", "import time; time.sleep(60)"])
    while "ready" not in (tmp_path / "a.log").read_text():
        time.sleep(0.02)
    t0 = time.monotonic()
    child.stop(stubborn, polite, timeout=0.5)
    assert stubborn.returncode == -signal.SIGKILL and polite.returncode == -signal.SIGTERM
    assert time.monotonic() - t0 < 5
    # a detached child's own children go with it (its process group)
    pids = tmp_path / "pids"
    leader = child.spawn([PY, "-c", f"import subprocess, sys, time; "
                          f"g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                          f"open({str(pids)!r}, 'w').write(str(g.pid)); time.sleep(60)"], detach=True)
    while not (pids.exists() and pids.read_text()):
        time.sleep(0.02)
    grandchild = int(pids.read_text())
    child.stop(leader)
    assert leader.returncode is not None and _gone(grandchild)
    child.stop(leader)  # already ended: nothing to do


def test_stop_takes_a_pid_and_a_multiprocessing_process():
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    child.stop(p.pid, timeout=5)  # a pid, as a record gives it: reaped here, as it is this process's child
    assert not pid_alive(p.pid)
    proc = multiprocessing.get_context("spawn").Process(target=_sleep_forever, daemon=True)
    proc.start()
    child.stop(proc, timeout=5)
    assert not proc.is_alive() and proc.exitcode == -signal.SIGTERM


def test_children_do_not_outlive_their_parent(tmp_path):
    """spawn(die_with_parent) and a child calling die_with_parent: both end when their parent is killed."""
    pids = tmp_path / "pids"
    code = (f"import os, sys, time; sys.path[:0] = {sys.path!r}; from cdsjax.io.child import spawn; "
            "a = spawn([sys.executable, '-c', 'import time; time.sleep(60)'], die_with_parent=True); "
            "b = spawn([sys.executable, '-c', 'import os, sys, time; sys.path[:0] = ' + repr(sys.path) + '; "
            "from cdsjax.io.child import watch_parent; watch_parent(' + str(os.getpid()) + ', interval=0.1); "
            "time.sleep(60)']); "
            f"open({str(pids)!r}, 'w').write(f'{{a.pid}} {{b.pid}}'); time.sleep(60)")
    parent = subprocess.Popen([PY, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        a, b = map(int, pids.read_text().split())
        assert pid_alive(a) and pid_alive(b)
        parent.kill()
        parent.wait()
        assert _gone(a, 10) and _gone(b, 20)
    finally:
        child.stop(parent)
    assert child.parent_alive(os.getppid()) and not child.parent_alive(os.getpid())


def test_spawn_writes_its_log_privately_and_never_through_a_link(tmp_path):
    own = tmp_path / "own.txt"
    own.write_text("the user's own file")
    log = tmp_path / "reader.log"
    log.symlink_to(own)  # planted where the log goes
    with pytest.raises(child.ChildError) as err:
        child.spawn([PY, "-c", "print('x')"], log=log)
    assert "symbolic link" in str(err.value) and "\n" not in str(err.value) and err.value.returncode is None
    assert own.read_text() == "the user's own file"
    log.unlink()
    log.write_text("an old, longer log " * 10)
    log.chmod(0o644)
    p = child.spawn([PY, "-c", "print('new')"], log=log)
    assert p.wait(timeout=30) == 0
    assert log.read_text() == "new\n" and (log.stat().st_mode & 0o777) == 0o600  # truncated, private
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # a folder the user shares: a log of theirs may go there, still never through a link
    assert child.spawn([PY, "-c", "print('shared')"], log=shared / "x.log").wait(timeout=30) == 0
    assert (shared / "x.log").read_text() == "shared\n"
    if os.getuid() == 0:  # a log another user owns (only root can make one here)
        os.chown(log, 12345, 12345)
        with pytest.raises(child.ChildError, match="owned by uid 12345"):
            child.spawn([PY, "-c", "pass"], log=log)
