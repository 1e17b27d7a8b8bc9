"""The shared local readers' records in the cdsjax cache, and the processes they name.

A local reader with a keep-alive (:mod:`cdsjax.io.reading.local.reader`) is shared by this user's processes through a
record, ``<cache>/readers/KEY.json`` (:func:`server_key`: a hash of the model file and the settings), holding the
server's pid, port, API key and settings. The directory is 0700 and the record 0600, both the user's own, else
they are not used (:func:`private_readers_dir`, :func:`read_record`). A record is believed only when its process
is alive, is this user's ``_serve`` process at that port, and answers with the key and refuses without it
(:func:`server_answers`). :func:`list_readers` and :func:`stop_readers` are ``cdsjax reader status | stop``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Optional

from cdsjax.io.child import stop
from cdsjax.io.util import atomic_write, http_get, pid_alive
from cdsjax.io.reading.local.model import cache_dir

SERVE_MODULE = "cdsjax.io.reading.local.reader"  # a server's command line: python -m SERVE_MODULE _serve ... (ps shows it)


RECORD_VERSION = 1


def readers_dir() -> Path:
    """Where the shared servers' records are: ``<cache>/readers``."""
    return cache_dir() / "readers"


def private_readers_dir() -> "tuple[Optional[Path], Optional[str]]":
    """``(directory, None)`` when the records' directory is private to this user (created 0700 if missing),
    else ``(None, why)``: a directory another user owns or may read is never used for keys."""
    from cdsjax.io.private import private_cache_dir, private_dir

    try:
        private_cache_dir(cache_dir())
        directory = private_dir(readers_dir())
        info = os.lstat(directory)
    except Exception as err:  # StoreError, OSError: one line either way
        return None, str(err)
    if not stat.S_ISDIR(info.st_mode):
        return None, f"{directory} is not a directory"
    if info.st_uid != os.getuid():
        return None, f"{directory} is owned by uid {info.st_uid}, not by you"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return None, f"{directory} may be read by others (mode {stat.S_IMODE(info.st_mode):04o}; `chmod 700` it)"
    return directory, None


def server_key(model_file: Path, *, threads: int, ctx_per_slot: int, slots: int) -> str:
    """The name of a shared server's record: a hash of the model file (path, size, mtime) and the settings."""
    info = Path(model_file).stat()
    text = json.dumps([str(Path(model_file).resolve()), info.st_size, info.st_mtime_ns, threads, ctx_per_slot,
                       slots])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def read_record(path: Path) -> Optional[dict]:
    """The record at ``path`` when it is this user's own regular file, private (0600 or less) and well formed;
    else None (absent, another user's, readable by others, a link, damaged)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            record = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    fields = {"pid": int, "port": int, "api_key": str, "uid": int}
    if not isinstance(record, dict) or any(not isinstance(record.get(k), t) for k, t in fields.items()):
        return None
    if record["uid"] != os.getuid():
        return None
    record["mtime"] = info.st_mtime
    return record


def write_record(path: Path, record: dict) -> None:
    """Writes ``record`` to ``path`` whole (a 0600 temporary file renamed into place)."""
    atomic_write(path, json.dumps(record), private=True)


def touch(path: Path) -> None:
    """Marks a use of the shared server whose record is ``path`` (its mtime); nothing when it is gone."""
    with contextlib.suppress(OSError):
        os.utime(path, follow_symlinks=False)


def is_server(pid: int, port: Optional[int] = None) -> Optional[bool]:
    """Whether ``pid`` runs a local reader's ``_serve`` (at ``port`` when given): True / False, or None where
    ``/proc`` cannot say."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None if not Path("/proc/self/cmdline").exists() else False
    if SERVE_MODULE.encode() not in args or b"_serve" not in args:
        return False
    if port is not None:
        try:
            return args[args.index(b"--port") + 1] == str(port).encode()
        except (ValueError, IndexError):
            return False
    return True


def port_is_mine(port: int) -> Optional[bool]:
    """Whether the socket listening on 127.0.0.1:``port`` belongs to this user (``/proc/net/tcp``), or None
    where that cannot be read."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    want = f"0100007F:{port:04X}"
    for line in lines:
        bits = line.split()
        if len(bits) > 7 and bits[1] == want and bits[3] == "0A":  # 0A: LISTEN
            return int(bits[7]) == os.getuid()
    return False


def _get(url: str, key: Optional[str], timeout: float = 10.0) -> "tuple[int, bytes]":
    return http_get(url, headers={"Authorization": f"Bearer {key}"} if key else None, timeout=timeout, limit=1 << 16)


def server_answers(record: dict) -> bool:
    """Whether the record's server is alive and this user's, and answers with its key (and refuses without)."""
    pid, port, key = record["pid"], record["port"], record["api_key"]
    if not pid_alive(pid) or is_server(pid, port) is False or port_is_mine(port) is False:
        return False
    url = f"http://127.0.0.1:{port}/slots"
    return _get(url, key)[0] == 200 and _get(url, None)[0] == 401


def busy(port: int, key: str) -> bool:
    """Whether a slot of the server at ``port`` is decoding a request."""
    code, body = _get(f"http://127.0.0.1:{port}/slots", key, timeout=5.0)
    try:
        return code == 200 and any(bool(slot.get("is_processing")) for slot in json.loads(body))
    except (ValueError, AttributeError, TypeError):
        return False


def own_servers(directory: Path) -> dict:
    """This user's ``_serve`` processes whose record lies in ``directory``: {pid: record path} (Linux)."""
    found = {}
    prefix = str(directory) + os.sep
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            args = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if SERVE_MODULE in args and "_serve" in args and "--record" in args:
            at = args.index("--record") + 1
            if at < len(args) and args[at].startswith(prefix):
                found[int(entry.name)] = Path(args[at])
    return found


def list_readers() -> list:
    """This user's shared local servers (their records in the cdsjax cache), as dicts: model, port, pid,
    alive, idle_s (seconds since the last use), keep_alive, started, log, record; plus any of this user's
    servers of that cache whose record is gone (``"record": null``)."""
    directory = readers_dir()
    out, now = [], time.time()
    seen = set()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        record = read_record(path)
        if record is None:
            continue
        seen.add(record["pid"])
        alive = pid_alive(record["pid"]) and is_server(record["pid"], record["port"]) is not False
        out.append(dict(model=record.get("model"), port=record["port"], pid=record["pid"], alive=alive,
                        idle_s=round(max(0.0, now - record["mtime"]), 1), keep_alive=record.get("keep_alive"),
                        started=record.get("started"), threads=record.get("threads"), slots=record.get("slots"),
                        ctx_per_slot=record.get("ctx_per_slot"), log=record.get("log"), record=str(path)))
    if directory.is_dir():
        for pid, path in sorted(own_servers(directory).items()):
            if pid not in seen:
                out.append(dict(model=None, port=None, pid=pid, alive=True, idle_s=None, keep_alive=None,
                                started=None, log=None, record=None))
    return out


def stop_server(record: dict, timeout: float = 10.0) -> bool:
    """Stops the record's server when it is this user's ``_serve`` process (SIGTERM, then SIGKILL after
    ``timeout`` s); True when one was stopped."""
    pid = record["pid"]
    if not pid_alive(pid) or is_server(pid, record.get("port")) is False:
        return False
    stop(pid, timeout=timeout)
    return True


def stop_readers() -> list:
    """Stops this user's shared local servers of the cdsjax cache and removes their records (``cdsjax reader
    stop``); the ones stopped, as :func:`list_readers` gives them."""
    directory = readers_dir()
    if not directory.is_dir():
        return []
    stopped = []
    for info in list_readers():
        if info["record"] is not None:
            path = Path(info["record"])
            record = read_record(path)
            if record is not None and stop_server(record):
                stopped.append(info)
            if record is not None and (read_record(path) or {}).get("pid") == record["pid"]:
                path.unlink(missing_ok=True)
        elif stop_server({"pid": info["pid"]}):
            stopped.append(info)
    return stopped


