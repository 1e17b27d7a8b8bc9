"""The warm server (``python -m cdsjax.commands.warm``): one process per user holding what ``cdsjax ask`` would
otherwise load again in every command.

* **Indexes**: a pipeline per set of paths (and relevance, embedders, parameters), at most
  :data:`~cdsjax.defaults.WARM_MAX_INDEXES`, the least recently used dropped first. A set is loaded again when a
  file or index directory of it has changed since (its size, times and inode), so a stale index is never served.
  The question encoder and the compiled selectors are shared by every pipeline of the process.
* **Readers**: a local llama.cpp server per model and settings, this process's child on a Unix socket in the
  warm directory (:class:`~cdsjax.io.reading.local.reader.LocalReader`): its owner knows its life, and one that
  has died is started again before anything is sent. Each has an idle timer.
* **Lifetime**: every request holds the server (and its reader) for at least its keep-alive after the request
  ends; a later request only ever lengthens that. With no request in flight and every hold passed, a reader is
  stopped; once nothing is held, the server stops its readers, removes its socket and exits. ``stop`` (``cdsjax
  reader stop``) ends it at once; SIGTERM too.

Requests come one per connection (:mod:`cdsjax.commands.warm.wire`), from this user only (the socket's directory
is the user's alone, and each connection's peer user is checked). Selection runs one at a time (JAX uses the
cores); reading runs on the connection's thread, so one person's reading does not hold up another's evidence.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import fcntl
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from cdsjax.commands import CLIError
from cdsjax.commands.warm.place import (PlaceError, keep_alive_setting, lock_name, log_name, peer_uid, socket_name,
                                        private_runtime_dir)
from cdsjax.commands.warm.wire import WireError, receive, send
from cdsjax.defaults import DEFAULT_KEEP_ALIVE, LOCAL_MAX_TOKENS, WARM_MAX_INDEXES


class Cancelled(Exception):
    """The client of an answer left: its reading is abandoned (the reader's request is closed)."""


def rss_mb(pid: int) -> Optional[float]:
    """Resident memory of ``pid`` in MiB (``/proc``), or None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def fingerprint(paths) -> tuple:
    """What says a set of paths is unchanged: each file's size, mtime and inode; for an index directory, those of
    its entries (an update rewrites its manifest)."""
    out = []
    for p in paths:
        with contextlib.suppress(OSError):
            info = os.stat(p)
            out.append((p, info.st_size, info.st_mtime_ns, info.st_ino))
            if os.path.isdir(p):
                for entry in sorted(os.scandir(p), key=lambda e: e.name):
                    with contextlib.suppress(OSError):
                        e = entry.stat(follow_symlinks=False)
                        out.append((entry.name, e.st_size, e.st_mtime_ns, e.st_ino))
    return tuple(out)


@dataclasses.dataclass
class HeldReader:
    """A local reader the server owns, with its readers (clients) by settings, its hold and its use."""

    local: object  # cdsjax.io.reading.local.reader.LocalReader
    clients: dict = dataclasses.field(default_factory=dict)
    until: float = 0.0
    in_flight: int = 0
    last_used: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass
class HeldIndexes:
    pipe: object  # cdsjax.pipeline.Pipeline
    paths: tuple
    last_used: float = dataclasses.field(default_factory=time.time)


class WarmServer:
    """What the warm process holds (module docstring)."""

    def __init__(self, directory: Path, keep_alive: float, *, max_indexes: int = WARM_MAX_INDEXES):
        from cdsjax.io.compilation_cache import enable_compilation_cache

        self.directory = directory
        self.max_indexes = max_indexes
        self.lock = threading.RLock()  # the state below
        self.compute = threading.Lock()  # loading and selecting: one at a time
        self.starting = threading.Lock()  # starting a reader
        self.indexes: "collections.OrderedDict[tuple, HeldIndexes]" = collections.OrderedDict()
        self.readers: "dict[tuple, HeldReader]" = {}
        self.in_flight = 0
        self.started = time.time()
        self.last_used = time.time()
        self.until = time.time() + keep_alive
        self.stopping = threading.Event()
        self.compile_cache = enable_compilation_cache()

    # ------------------------------------------------------------------ holds

    def hold(self, keep_alive: float, reader: Optional[HeldReader] = None) -> None:
        """Holds the server (and ``reader``) ``keep_alive`` seconds from now, never less than already promised."""
        now = time.time()
        with self.lock:
            self.until = max(self.until, now + keep_alive)
            self.last_used = now
            if reader is not None:
                reader.until = max(reader.until, now + keep_alive)
                reader.last_used = now

    def tick(self) -> bool:
        """Stops the readers whose hold has passed with nothing in flight; True when the whole server is due to
        exit."""
        now = time.time()
        idle = []
        with self.lock:
            for key, held in list(self.readers.items()):
                if held.in_flight == 0 and (now > held.until or not held.local.alive()):  # (a dead one's pid reaped)
                    idle.append(self.readers.pop(key))
            due = self.in_flight == 0 and now > self.until
        for held in idle:
            log(f"reader {held.local.model_name}: idle, stopped")
            held.local.stop()
        return due

    def stop_readers(self) -> list:
        with self.lock:
            held, self.readers = list(self.readers.values()), {}
        for h in held:
            h.local.stop()
        return held

    # ------------------------------------------------------------------ what it holds

    def status(self) -> dict:
        now = time.time()
        with self.lock:
            return dict(
                pid=os.getpid(), uptime_s=round(now - self.started, 1), idle_s=round(now - self.last_used, 1),
                keep_alive_left_s=round(max(0.0, self.until - now), 1), in_flight=self.in_flight,
                memory_mb=rss_mb(os.getpid()), log=str(self.directory / log_name()),
                indexes=[dict(paths=list(h.paths), notes=len(h.pipe.corpus), idle_s=round(now - h.last_used, 1))
                         for h in reversed(self.indexes.values())],
                readers=[dict(model=h.local.model_name, pid=h.local.process.pid if h.local.process else None,
                              threads=h.local.threads, slots=h.local.config.slots,
                              ctx_per_slot=h.local.config.ctx_per_slot, in_flight=h.in_flight,
                              idle_s=round(now - h.last_used, 1), keep_alive_left_s=round(max(0.0, h.until - now), 1),
                              memory_mb=rss_mb(h.local.process.pid) if h.local.process else None)
                         for h in self.readers.values()])

    def pipeline(self, request: dict, tell: Callable[[str], None]) -> "tuple[object, float]":
        """The pipeline of the request's paths and settings, loaded (or indexed) when not held; ``(pipe, seconds
        it took to load, 0 when held)``. Runs under the compute lock."""
        from cdsjax.pipeline import Pipeline

        paths = tuple(request["paths"])
        params = request.get("params")
        key = (paths, request.get("relevance"), tuple(request.get("embedders") or ()),
               bool(request.get("trust_remote_code")), params, fingerprint(paths + ((params,) if params and
                                                                                     os.path.exists(params) else ())))
        with self.lock:
            held = self.indexes.get(key)
            if held is not None:
                self.indexes.move_to_end(key)
                held.last_used = time.time()
                return held.pipe, 0.0
        from cdsjax.commands.ask import check_params
        from cdsjax.io.index.single import prestart_layout

        t0 = time.perf_counter()
        new = [p for p in paths if os.path.isfile(p)]
        tell(f"indexing {len(new)} PDF(s) and loading {len(paths)} path(s) in the warm server" if new else
             f"loading {len(paths)} index(es) in the warm server")
        prestart_layout(list(paths))
        warm = dict(question=request["question"], selector=request["selector"], budget=request["budget"],
                    options=request.get("options") or {})
        pipe = Pipeline.from_paths(list(paths), reader=None, progress=False,
                                   embedders=request.get("embedders") or (),
                                   trust_remote_code=bool(request.get("trust_remote_code")),
                                   params=check_params(request["selector"], params), warm=warm,
                                   compile_cache=self.compile_cache, relevance=request.get("relevance"))
        with self.lock:
            for old in [k for k in self.indexes if k[0] == paths]:  # the same paths, changed since: replaced
                del self.indexes[old]
            self.indexes[key] = HeldIndexes(pipe=pipe, paths=paths)
            while len(self.indexes) > self.max_indexes:
                self.indexes.popitem(last=False)
        return pipe, time.perf_counter() - t0

    def reader(self, request: dict):
        """The request's reader: ``(Reader or None, HeldReader or None, reused)``. A local one is this process's
        child, started when none runs for its model and settings (or when the one that ran has died)."""
        spec = request.get("reader")
        if not spec:
            return None, None, False
        from cdsjax.io.reading.llm.config import ReaderConfig
        from cdsjax.io.reading.reader import Reader

        common = dict(timeout=float(spec["timeout"]), max_retries=int(spec["retries"]), images=spec["images"])
        if spec.get("url"):
            return Reader(ReaderConfig(base_url=spec["url"], model=spec.get("model"), api_key=spec.get("api_key"),
                                       **common)), None, False
        from cdsjax.io.reading.local.reader import start_local_reader

        key = (spec["local"], int(spec["threads"]), int(spec["ctx_per_slot"]), int(spec["slots"]))
        with self.starting:
            with self.lock:
                held = self.readers.get(key)
                if held is not None and not held.local.answers():  # it died, or is dying: never send to it
                    log(f"reader {held.local.model_name}: found dead, started again")
                    self.readers.pop(key)
                    held.local.stop()
                    held = None
                reused = held is not None
            if held is None:
                local = start_local_reader(key[0], threads=key[1], ctx_per_slot=key[2], slots=key[3],
                                           socket_dir=self.directory)
                log(f"reader {local.model_name}: started in {local.startup_s:.1f}s (log: {local.log_path})")
                held = HeldReader(local=local)
                with self.lock:
                    self.readers[key] = held
            with self.lock:
                held.in_flight += 1
        settings = tuple(sorted(common.items()))
        client = held.clients.get(settings)
        if client is None:
            client = held.clients[settings] = Reader(held.local.reader_config(max_tokens=LOCAL_MAX_TOKENS, **common),
                                                     local=held.local.describe())
        return client, held, reused

    # ------------------------------------------------------------------ one question

    def ask(self, request: dict, emit: Callable[[dict], None]) -> None:
        """Answers one ``ask`` request, its events sent through ``emit`` (see :mod:`cdsjax.commands.warm.wire`)."""
        from cdsjax.commands.ask import check_options
        from cdsjax.io.embed import EmbedderError
        from cdsjax.io.reading.local.model import LocalReaderError
        from cdsjax.io.reading.options import ReadOptions
        from cdsjax.pipeline import PipelineError
        from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display

        started = time.perf_counter()
        request["selector"] = request.get("selector") or display(DEFAULT_SELECTOR)
        options = request.get("options") or {}
        held, keep_alive = None, 0.0
        with self.lock:
            self.in_flight += 1
        try:
            keep_alive = keep_alive_setting(request.get("keep_alive", DEFAULT_KEEP_ALIVE))
            check_options(request["selector"], options)
            reader, held, reused = self.reader(request)
            unreachable = reader.probe() if reader is not None and held is None else None
            tell = lambda text: emit({"event": "status", "text": text})  # noqa: E731
            with self.compute:
                pipe, load_s = self.pipeline(request, tell)
                answer = pipe.retrieve(request["question"], selector=request["selector"], budget=int(request["budget"]),
                                       options=options, abstain=bool(request.get("abstain", True)))
                answer.timings["load"] = load_s
                if reader is not None:
                    pipe = pipe.with_reader(reader)
                reading = reader is not None and unreachable is None
                read = ReadOptions(evidence_tokens=request.get("evidence_tokens"))
                if reading:
                    pipe.plan_read(answer, read)
            emit({"event": "evidence", "result": answer.to_dict(), "reading": reading})
            if reading:
                def token(piece: str) -> None:
                    try:
                        emit({"event": "token", "text": piece})
                    except OSError:
                        raise Cancelled() from None

                pipe.read(answer, read, on_token=token, on_retry=lambda reason: emit({"event": "retry",
                                                                                     "reason": reason}),
                          started=started)
            if unreachable is not None:
                from cdsjax.io.reading.reader import error_dict

                answer.error = error_dict(unreachable)
            result = answer.to_dict()
            if held is not None and (result.get("reader") or {}).get("local") is not None:
                result["reader"]["local"] = dict(result["reader"]["local"], reused=reused, keep_alive_s=keep_alive)
            emit({"event": "done", "result": result})
        except Cancelled:
            log("a client left before its answer was read: reading stopped")
        except CLIError as err:
            emit({"event": "error", "message": str(err), "code": err.code})
        except (PipelineError, EmbedderError) as err:
            emit({"event": "error", "message": str(err), "code": 1})
        except LocalReaderError as err:
            emit({"event": "error", "message": f"local reader: {err}", "code": 1})
        except ValueError as err:
            emit({"event": "error", "message": str(err), "code": 2})
        finally:
            with self.lock:
                self.in_flight -= 1
                if held is not None:
                    held.in_flight -= 1
            self.hold(keep_alive, held)

    # ------------------------------------------------------------------ connections

    def handle(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            uid = peer_uid(conn)
            if uid is not None and uid != os.getuid():
                log(f"refused a connection from uid {uid}")
                return
            lock = threading.Lock()

            def emit(message: dict) -> None:
                with lock:
                    send(stream, message)

            try:
                request = receive(stream)
                if request is None:
                    return
                op = request.get("op")
                if op == "status":
                    emit(dict(self.status(), ok=True))
                elif op == "stop":
                    info = self.status()
                    self.stop_readers()
                    emit(dict(info, ok=True, stopped=True))
                    self.stopping.set()
                elif op == "ask":
                    self.ask(request, emit)
                else:
                    emit({"event": "error", "message": f"unknown request {op!r}", "code": 2})
            except (OSError, WireError):
                pass  # the client went away, or sent what is not a request
            except Exception as err:  # noqa: BLE001  (one request's failure must not end the server)
                log("".join(traceback.format_exception(err)))
                with contextlib.suppress(OSError):
                    emit({"event": "error", "code": 1,
                          "message": f"the warm server failed on this request ({type(err).__name__}: "
                                     f"{' '.join(str(err).split())[:200]}; log: {self.directory / log_name()})"})

    def serve(self, listener: socket.socket) -> None:
        listener.settimeout(1.0)
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                if self.tick():
                    log(f"idle past every keep-alive (up {time.time() - self.started:.0f}s), exiting")
                    break
                continue
            except OSError:
                break
            conn.settimeout(None)
            threading.Thread(target=self.handle, args=(conn,), daemon=True, name="cdsjax-warm-request").start()


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} cdsjax warm server: {text}", file=sys.stderr, flush=True)


def take_lock(directory: Path):
    """The server's lock, held for its life (one server per user), or None when another server holds it."""
    from cdsjax.io.private import open_private

    fd = open_private(directory / lock_name())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m cdsjax.commands.warm")
    p.add_argument("--keep-alive", default=str(DEFAULT_KEEP_ALIVE))
    args = p.parse_args(argv)
    try:
        keep_alive = keep_alive_setting(args.keep_alive)
        directory = private_runtime_dir()
        held = take_lock(directory)
    except (PlaceError, ValueError, OSError) as err:
        log(f"error: {err}")
        return 1
    if held is None:
        log("another warm server runs for this user; leaving it be")
        return 0
    path = directory / socket_name()
    path.unlink(missing_ok=True)  # one left by a server that was killed (the lock says none runs now)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(64)
    server = WarmServer(directory, keep_alive)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: server.stopping.set())
    log(f"listening on {path} (pid {os.getpid()}, keep-alive {keep_alive:g}s)")
    try:
        server.serve(listener)
    finally:
        listener.close()
        path.unlink(missing_ok=True)  # the lock says this server is the only one: the socket is its own
        stopped = server.stop_readers()
        log(f"stopped ({len(stopped)} reader(s))")
    return 0  # the request threads are daemons: an abandoned one ends with the process
