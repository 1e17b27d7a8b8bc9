"""The local reader's server process: ``python -m cdsjax.io.reading.local.reader _serve ...`` (:func:`serve`), llama.cpp's
server (``xllamacpp``) on 127.0.0.1 at the given port, behind the API key it finds in its environment.

It runs until it is told to stop (SIGTERM, SIGINT, SIGHUP), its parent is gone (a server of the caller's own:
:func:`cdsjax.io.child.watch_parent`), or, a shared one, it has been idle for its keep-alive (:class:`Idle`,
reading its record, :mod:`cdsjax.io.reading.local.records`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from cdsjax.io.child import watch_parent
from cdsjax.io.reading.local.records import busy, read_record, touch

KEY_ENV = "_CDSJAX_LOCAL_READER_KEY"  # how the API key reaches the server (never its command line: `ps` shows that)


class Idle:
    """When a shared server should exit: its record (touched by every user) is ``keep_alive`` seconds old and
    no slot is busy; or, with no slot busy, its record names another server, or none after it had been its own
    (replaced or stopped: nobody finds it any more); or it never saw its record (the starter died) for
    ``grace`` seconds more than the keep-alive."""

    def __init__(self, record: Path, keep_alive: float, grace: float, port: int, key: str):
        self.record, self.keep_alive, self.grace, self.port, self.key = record, keep_alive, grace, port, key
        self.last_use = time.time()
        self.seen = False

    def own(self) -> "tuple[Optional[bool], float]":
        """(True, mtime) when the record names this server, (False, 0) when another, (None, 0) when none; the
        keep-alive is the record's (a later user may have set another)."""
        found = read_record(self.record)
        if found is None:
            return None, 0.0
        if found["pid"] != os.getpid():
            return False, 0.0
        with contextlib.suppress(TypeError, ValueError):
            self.keep_alive = max(0.0, float(found.get("keep_alive", self.keep_alive)))
        return True, found["mtime"]

    def due(self) -> bool:
        own, mtime = self.own()
        if own:
            self.seen, self.last_use = True, max(self.last_use, mtime)
        elif own is False or self.seen:
            return not busy(self.port, self.key)
        limit = self.keep_alive if self.seen else self.keep_alive + self.grace
        if time.time() - self.last_use < limit:
            return False
        if busy(self.port, self.key):
            self.last_use = time.time()
            touch(self.record)
            return False
        return True

    def leave(self) -> bool:
        """Under the starters' lock, looks once more and removes the record; False when a use came meanwhile."""
        import filelock

        lock = filelock.FileLock(str(self.record.with_suffix(".lock")), mode=0o600)
        try:
            lock.acquire(timeout=2)
        except filelock.Timeout:  # a starter is at work: it may be about to reuse this server
            return False
        try:
            own, mtime = self.own()
            if own and time.time() - mtime < self.keep_alive:
                self.last_use = mtime
                return False
            if own:
                self.record.unlink(missing_ok=True)
            return True
        finally:
            lock.release()

    def remove_own(self) -> None:
        if self.own()[0]:
            self.record.unlink(missing_ok=True)


def serve(argv: Sequence[str]) -> int:
    """Runs the server (the arguments: :func:`cdsjax.io.reading.local.launch.server_command`); does not return."""
    import argparse

    p = argparse.ArgumentParser(prog="cdsjax.io.reading.local.reader _serve")
    p.add_argument("--model", required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--parent", type=int, required=True, help="exit when this process is gone (0: never)")
    p.add_argument("--record", default=None, help="a shared server's record (keep-alive)")
    p.add_argument("--keep-alive", type=float, default=0.0)
    p.add_argument("--grace", type=float, default=180.0)
    args = p.parse_args(argv)
    key = os.environ.pop(KEY_ENV, "") or None
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.slots
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.ui = False  # no web UI: this server is the reader's API only
    if key:
        params.api_keys = [key]  # every endpoint but /health answers 401 without it
    server = xllamacpp.Server(params)  # noqa: F841  (serves until the process ends)
    print(f"cdsjax local reader: serving {args.alias} at http://127.0.0.1:{args.port}"
          + (f", shared, keep-alive {args.keep_alive:g} s" if args.record else ""), flush=True)
    idle = Idle(Path(args.record), args.keep_alive, args.grace, args.port, key or "") \
        if args.record and args.keep_alive > 0 else None
    if args.parent:
        watch_parent(args.parent, stopping.set)  # the parent is gone: do not outlive it
    while not stopping.wait(1.0):
        if idle is not None and idle.due() and idle.leave():
            print(f"cdsjax local reader: idle for {args.keep_alive:g} s, exiting", flush=True)
            break
    if idle is not None and stopping.is_set():
        idle.remove_own()
    os._exit(0)  # the server's threads end with the process
