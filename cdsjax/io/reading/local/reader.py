"""A reader that runs on this machine: llama.cpp's OpenAI-compatible server (the ``xllamacpp`` wheel) on
loopback, for a GGUF model, so that cdsjax answers questions without a GPU or a remote server.

    with LocalReader() as local:                 # the default preset, assembled once into the cdsjax cache
        reader = Reader(local.reader_config())   # an ordinary OpenAI-compatible client of it
        reader.answer("What does Table 1 show?", evidence).text

The server is a process of its own (``python -m cdsjax.io.reading.local.reader _serve ...``, :mod:`cdsjax.io.reading.local.serve`)
bound to 127.0.0.1 at a free port, behind a random API key; :class:`LocalReader` starts it and waits until it
answers ``/health`` (:mod:`cdsjax.io.reading.local.launch`) and keeps its log (``<cache>/logs/``). A server that cannot
start is one :class:`LocalReaderError` line: no runtime installed, a file that is not a GGUF model, no free port,
not enough memory, or the log's last words.

Keep-alive (``LocalReaderConfig.keep_alive``, seconds; the commands' ``--keep-alive``,
``$CDSJAX_READER_KEEP_ALIVE``, default :data:`DEFAULT_KEEP_ALIVE`):

* ``0``: the server is the caller's own: stopped on leaving the block, on an error and on SIGTERM/SIGINT of
  the parent (it also exits by itself within a second once its parent is gone).
* ``> 0``: the server is shared by this user's processes. It is found through a record in the cdsjax cache,
  ``<cache>/readers/KEY.json`` (:mod:`cdsjax.io.reading.local.records`; KEY: a hash of the model file and the threads,
  context and slots; the directory 0700, the record 0600, both the user's own, else unused) holding its pid,
  port, API key and settings. A process that asks for the same server reuses it when the record's process is
  alive, is this user's ``_serve`` process, listens on the port, and answers an authenticated request
  (``GET /slots`` with the key, while a request without it gets 401); otherwise the record is dead and is
  replaced. One process at a time looks and starts (a lock file beside the record). While a process holds the
  server it touches the record every few seconds (:func:`cdsjax.io.reading.local.held.mark_used` marks a use too); the
  server exits once the record is ``keep_alive`` seconds old and no slot is busy, removing its record.
  ``cdsjax reader stop`` (:func:`cdsjax.io.reading.local.records.stop_readers`) stops it at once; ``cdsjax reader
  status`` (:func:`cdsjax.io.reading.local.records.list_readers`) lists them.

The model (:func:`cdsjax.io.reading.local.model.resolve_model`) is a preset assembled from registry packages into
the cdsjax cache, a ``.gguf`` path, or a model-hub file (:mod:`cdsjax.io.reading.local.model`).

Settings (:class:`LocalReaderConfig`): threads, context per slot, parallel slots and keep-alive. ``cdsjax serve`` and the
evaluation use the slots (requests in flight at once); the server's whole context is ``slots × ctx_per_slot``.

The servers this process holds are in one object, :data:`cdsjax.io.reading.local.held.HELD`: the first start registers
an exit handler that stops or releases them (nothing is registered at import);
:func:`cdsjax.io.reading.local.held.stop_on_sigterm` does the same on SIGTERM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from cdsjax.io.child import stop as stop_process
from cdsjax.io.reading.local.held import HELD
from cdsjax.io.reading.local.launch import ServerSpec, check_memory, launch
from cdsjax.io.reading.local.model import PRESETS, LocalReaderError, cache_dir, model_path, resolve_model
from cdsjax.io.reading.local.records import (RECORD_VERSION, private_readers_dir, read_record, server_answers, server_key,
                                     stop_server, touch, write_record)
from cdsjax.io.util import usable_cores

RUNTIME = "xllamacpp"
RUNTIME_HINT = "pip install 'cdsjax[reader]' (the xllamacpp wheel: llama.cpp's server, CPU build)"

DEFAULT_KEEP_ALIVE = 300.0  # seconds a shared local reader stays up after its last use
KEEP_ALIVE_ENV = "CDSJAX_READER_KEEP_ALIVE"


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
        """A :class:`cdsjax.io.reading.llm.config.ReaderConfig` for this server (keyword fields override)."""
        from cdsjax.io.reading.llm.config import ReaderConfig

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
            HELD.register_exit()
            directory = None
            if self.config.keep_alive > 0:
                directory, self.shared_note = private_readers_dir()
                if directory is None:
                    print(f"cdsjax: warning: the local reader is not shared ({self.shared_note}); it stops with "
                          f"this process", file=sys.stderr)
            self.shared = directory is not None
            if directory is not None:
                self._start_shared(directory)
            else:
                check_memory(self._spec())
                self._start_process(self._log_dir(), parent=os.getpid())
            HELD.running.add(self)
            return self

    def _log_dir(self) -> Path:
        log_dir = Path(self.config.log_dir).expanduser() if self.config.log_dir else cache_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return log_dir

    def _spec(self) -> ServerSpec:
        cfg = self.config
        return ServerSpec(model_file=self.model_file, alias=self.model_name, threads=self.threads,
                          ctx_per_slot=cfg.ctx_per_slot, slots=cfg.slots)

    def _start_process(self, log_dir: Path, *, parent: int, record: Optional[Path] = None) -> None:
        """Starts a server and waits until it answers (:func:`cdsjax.io.reading.local.launch.launch`); ``parent``: the
        process whose end ends it (0: none), ``record``: a shared server's record."""
        if self.api_key is None:
            self.api_key = secrets.token_urlsafe(32)
        started = launch(self._spec(), key=self.api_key, log_dir=log_dir, timeout=self.config.startup_timeout,
                         parent=parent, record=record, keep_alive=self.config.keep_alive)
        self.process, self.log_path, self._port = started.process, started.log, started.port
        self.base_url = f"http://127.0.0.1:{started.port}/v1"
        self.startup_s = started.seconds

    def _start_shared(self, directory: Path) -> None:
        """Reuses this user's running server for the same model and settings, or starts one and records it."""
        import filelock

        cfg = self.config
        key = server_key(self.model_file, threads=self.threads, ctx_per_slot=cfg.ctx_per_slot, slots=cfg.slots)
        path = directory / f"{key}.json"
        lock = filelock.FileLock(str(directory / f"{key}.lock"), timeout=cfg.startup_timeout + 60, mode=0o600)
        with _holding(lock):
            HELD.reap()
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
                check_memory(self._spec())
                self.api_key = secrets.token_urlsafe(32)
                self._start_process(self._log_dir(), parent=0, record=path)
                process, self.process = self.process, None  # not this process's to stop: it outlives it
                HELD.detached.append(process)
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
            HELD.running.discard(self)
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
            HELD.running.discard(self)
        if process is not None:
            stop_process(process, timeout=10)

    def __enter__(self) -> "LocalReader":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def start_local_reader(model: str, *, threads: int = LocalReaderConfig.threads,
                       ctx_per_slot: int = LocalReaderConfig.ctx_per_slot, slots: int = LocalReaderConfig.slots,
                       keep_alive: Optional[float] = None, progress: bool = False) -> LocalReader:
    """The one start of the local reader, for the commands (``ask``, ``serve``, ``demo``) and the evaluation alike:
    this user's running server for the same model and settings, else one started now and waited for. The caller
    closes it (``close()``, or leaving ``with``); its API key is ``.api_key``, passed on as an argument.

    Args:
      model, threads, ctx_per_slot, slots: see :class:`LocalReaderConfig` (whose defaults these are).
      keep_alive: seconds it stays up after its last use; None: :func:`keep_alive_setting`'s default.
      progress: a progress bar while a preset's model file is assembled.

    Raises:
      ValueError: a setting out of range (one line naming it).
      LocalReaderError: the server could not start (one line).
    """
    config = LocalReaderConfig(model=model, threads=threads, ctx_per_slot=ctx_per_slot, slots=slots,
                               keep_alive=keep_alive_setting(keep_alive))
    local = LocalReader(config, progress=progress)
    try:
        return local.start()
    except BaseException:
        local.close()
        raise


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


def _runtime_version() -> str:
    try:
        return importlib.metadata.version(RUNTIME)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _main(argv: Sequence[str]) -> int:
    """``python -m cdsjax.io.reading.local.reader fetch [MODEL]``: assemble (or check) a model file and print its path
    (:func:`cdsjax.io.reading.local.model.main`); ``_serve ...`` is the server child (:func:`cdsjax.io.reading.local.serve.serve`)."""
    if argv and argv[0] == "_serve":
        from cdsjax.io.reading.local.serve import serve

        return serve(argv[1:])
    if argv and argv[0] == "fetch":
        from cdsjax.io.reading.local.model import main

        return main(argv[1:])
    print("usage: python -m cdsjax.io.reading.local.reader fetch [MODEL]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
