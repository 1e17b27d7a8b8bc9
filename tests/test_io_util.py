"""The io layer's small helpers, each written once (cdsjax.io.util): pid_alive, http_get, atomic_write."""

import http.server
import os
import stat
import subprocess
import sys
import threading

import pytest

from cdsjax.io.util import atomic_write, free_port, http_get, pid_alive


def test_pid_alive_counts_a_zombie_as_gone_and_another_users_process_as_alive():
    assert pid_alive(os.getpid()) and not pid_alive(2 ** 22 + 12345)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while True:  # ended, not reaped: a zombie
        try:
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
    assert not pid_alive(child.pid)
    child.wait()
    if os.getuid() != 0:  # pid 1 is root's: kill(1, 0) is refused, and it lives
        assert pid_alive(1)


def test_http_get_answers_status_and_body_and_never_raises():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/ok" and self.headers.get("Authorization") == "Bearer k":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"x" * 100)
            else:
                self.send_error(403)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert http_get(root + "/ok", headers={"Authorization": "Bearer k"}) == (200, b"x" * 100)
        assert http_get(root + "/ok", headers={"Authorization": "Bearer k"}, limit=10) == (200, b"x" * 10)
        assert http_get(root + "/ok") == (403, b"")
    finally:
        server.shutdown()
    assert http_get(f"http://127.0.0.1:{free_port()}/", timeout=2) == (0, b"")
    assert http_get("not a url") == (0, b"")


def test_atomic_write_replaces_whole_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "f.json"
    atomic_write(target, "one")
    atomic_write(target, b"two", private=True)
    assert target.read_bytes() == b"two" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    with pytest.raises(OSError):
        atomic_write(tmp_path / "missing" / "f", "x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    atomic_write(link, "y")  # the link itself is replaced, nothing is written through it
    assert not link.is_symlink() and not (tmp_path / "elsewhere").exists()


def test_private_lock_excludes_filelock_and_refuses_links_foreign_files_and_open_directories(tmp_path):
    import filelock

    from cdsjax.io.private import PrivateFileError, private_lock

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    planted = tmp_path / "planted.lock"
    planted.symlink_to(victim)
    with pytest.raises(PrivateFileError) as err:
        with private_lock(planted):
            pass
    assert "symbolic link" in str(err.value) and "\n" not in str(err.value)
    assert victim.read_text() == "the user's own file"  # not truncated through the link
    twice = tmp_path / "twice.lock"
    os.link(victim, twice)  # a second name of a file elsewhere
    with pytest.raises(PrivateFileError, match="hard link"):
        with private_lock(twice):
            pass
    lock = tmp_path / "a.lock"
    lock.write_text("left by an earlier holder")
    lock.chmod(0o644)
    with private_lock(lock):
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600 and lock.read_text() == "left by an earlier holder"
        with pytest.raises(filelock.Timeout):  # the same flock the filelock package takes
            filelock.FileLock(str(lock), timeout=0.2).acquire()
        with pytest.raises(TimeoutError, match="still locked"):
            with private_lock(lock, timeout=0.2):
                pass
    with private_lock(lock, timeout=1):  # released when the block ended
        pass
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PrivateFileError, match="writable by its group or others"):
        with private_lock(shared / "x.lock"):
            pass
    assert not (shared / "x.lock").exists()
    if os.getuid() == 0:  # a file another user owns (only root can make one here)
        foreign = tmp_path / "foreign.lock"
        foreign.write_text("")
        os.chown(foreign, 12345, 12345)
        with pytest.raises(PrivateFileError, match="owned by uid 12345"):
            with private_lock(foreign):
                pass
