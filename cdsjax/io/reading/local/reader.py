"""A reader that runs on this machine: llama.cpp's OpenAI-compatible server (the ``xllamacpp`` wheel) on a Unix
socket, for a GGUF model, so that cdsjax answers questions without a GPU or a remote server.

    with LocalReader() as local:                 # the default preset, assembled once into the cdsjax cache
        reader = Reader(local.reader_config())   # an ordinary OpenAI-compatible client of it
        reader.answer("What does Table 1 show?", evidence).text

The server is a process of its own (``python -m cdsjax.io.reading.local.reader _serve ...``,
:mod:`cdsjax.io.reading.local.serve`) listening on a Unix socket in a directory only this user may enter (a fresh
private temporary directory, or the one the caller names), behind a random API key; :class:`LocalReader` starts
it and waits until it answers ``/health`` (:mod:`cdsjax.io.reading.local.launch`) and keeps its log
(``<cache>/logs/``). It has one owner, the process that started it: stopped when the owner leaves the block, on
an error and on SIGTERM, and by itself within a second once the owner is gone. Keeping a reader warm between
commands is the warm cdsjax server's job (:mod:`cdsjax.commands.warm`), which owns its readers the same way. A
server that cannot start is one :class:`LocalReaderError` line: no runtime installed, a file that is not a GGUF
model, not enough memory, or the log's last words.

The model (:func:`cdsjax.io.reading.local.model.resolve_model`) is a preset assembled from registry packages into
the cdsjax cache, a ``.gguf`` path, or a model-hub file (:mod:`cdsjax.io.reading.local.model`).

Settings (:class:`LocalReaderConfig`): threads, context per slot and parallel slots (requests in flight at once;
the server's whole context is ``slots × ctx_per_slot``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import itertools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional, Sequence

from cdsjax.io.child import stop as stop_process
from cdsjax.io.reading.local.held import HELD
from cdsjax.io.reading.local.launch import ServerSpec, answers, check_memory, launch
from cdsjax.io.reading.local.model import PRESETS, LocalReaderError, cache_dir, model_path, resolve_model
from cdsjax.io.util import usable_cores

RUNTIME = "xllamacpp"
RUNTIME_HINT = "pip install 'cdsjax[reader]' (the xllamacpp wheel: llama.cpp's server, CPU build)"


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
    """

    model: str = "default"
    threads: int = 0
    ctx_per_slot: int = 8192
    slots: int = 1
    startup_timeout: float = 180.0
    log_dir: Optional[str] = None

    def __post_init__(self):
        checks = {"threads": self.threads >= 0, "ctx_per_slot": 512 <= self.ctx_per_slot <= 1 << 20,
                  "slots": 1 <= self.slots <= 64, "startup_timeout": self.startup_timeout > 0,
                  "model": isinstance(self.model, str) and bool(self.model.strip())}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"LocalReaderConfig.{name} is out of range: {getattr(self, name)!r}")


_SOCKETS = itertools.count()  # a socket name per server this process starts


class LocalReader:
    """llama.cpp's server for one GGUF model, as a context manager (see the module docstring): started on entering,
    stopped on leaving (:meth:`close`, or :meth:`stop`).

    Args:
      config: the settings (keyword ``overrides`` replace its fields).
      progress: a progress bar while a preset's model file is assembled.
      socket_dir: the directory its socket goes in, which must be this user's alone (the warm server's); None: a
        private temporary directory made for it and removed when it stops.

    Attributes (once started):
      base_url: ``http://localhost/v1`` (the path; requests go to ``socket``).
      socket: the Unix socket it listens on.
      api_key: the key the server requires (``reader_config()`` passes it).
      model_name: the name the server answers to (the preset's name or the file's stem).
      model_file: the GGUF file.
      log_path: the server's log.
      startup_s: seconds from start to the first answer.
      process: the server's process (this process's child).
    """

    def __init__(self, config: Optional[LocalReaderConfig] = None, *, progress: bool = True,
                 socket_dir: Optional[Path] = None, **overrides):
        config = config if config is not None else LocalReaderConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.progress = progress
        self.socket_dir = Path(socket_dir) if socket_dir is not None else None
        self.process: Optional[subprocess.Popen] = None
        self.base_url: Optional[str] = None
        self.socket: Optional[Path] = None
        self.api_key: Optional[str] = None
        self.model_file: Optional[Path] = None
        self.model_name: Optional[str] = None
        self.log_path: Optional[Path] = None
        self.startup_s: Optional[float] = None
        self._temporary: Optional[Path] = None  # the private directory made for the socket, removed at stop
        self._lock = threading.RLock()  # stop() runs inside start() when the server does not come up

    @property
    def threads(self) -> int:
        return self.config.threads or usable_cores()

    def alive(self) -> bool:
        """Whether the server this process started is still running (its owner knows its child's life: a request
        never goes to a server that is gone)."""
        return self.process is not None and self.process.poll() is None

    def answers(self) -> bool:
        """Whether the server is running and answers ``/health`` on its socket now (a killed server may take
        seconds to be reaped, its socket already closed)."""
        return self.alive() and answers(self.socket)

    def reader_config(self, **fields):
        """A :class:`cdsjax.io.reading.llm.config.ReaderConfig` for this server (keyword fields override)."""
        from cdsjax.io.reading.llm.config import ReaderConfig

        if self.base_url is None:
            raise LocalReaderError("the local reader is not started", kind="start")
        values = dict(base_url=self.base_url, model=self.model_name, api_key=self.api_key,
                      concurrency=self.config.slots, socket=str(self.socket))
        values.update(fields)
        return ReaderConfig(**values)

    def describe(self) -> dict:
        """What runs, for logs, ``--json`` output and result tables."""
        preset = PRESETS.get(self.model_name or "")
        return {"runtime": f"llama.cpp server ({RUNTIME} {_runtime_version()})", "model": self.model_name,
                "quantisation": "Q4_K_M" if preset is not None else None, "threads": self.threads,
                "slots": self.config.slots, "ctx_per_slot": self.config.ctx_per_slot,
                "licence": preset.licence if preset is not None else None}

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
            check_memory(self._spec())
            log_dir = self._log_dir()
            if self.socket_dir is None:
                self._temporary = Path(tempfile.mkdtemp(prefix="cdsjax-reader-"))  # 0700, a name no one chose
            directory = self.socket_dir or self._temporary
            name = f"reader-{os.getpid()}-{next(_SOCKETS)}"
            socket = directory / f"{name}.sock"
            self.api_key = secrets.token_urlsafe(32)
            HELD.running.add(self)
            try:
                started = launch(self._spec(), key=self.api_key, socket=socket, log=log_dir / f"{name}.log",
                                 timeout=self.config.startup_timeout, parent=os.getpid())
            except BaseException:
                self.stop()
                raise
            self.process, self.log_path, self.socket = started.process, started.log, started.socket
            self.base_url = "http://localhost/v1"
            self.startup_s = started.seconds
            return self

    def _log_dir(self) -> Path:
        from cdsjax.io.private import private_dir

        log_dir = Path(self.config.log_dir).expanduser() if self.config.log_dir else cache_dir() / "logs"
        try:
            return private_dir(log_dir)
        except OSError as err:
            raise LocalReaderError(f"cannot make the local reader's log directory {log_dir} "
                                   f"({err.strerror or err})", kind="start") from None

    def _spec(self) -> ServerSpec:
        cfg = self.config
        return ServerSpec(model_file=self.model_file, alias=self.model_name, threads=self.threads,
                          ctx_per_slot=cfg.ctx_per_slot, slots=cfg.slots)

    def close(self) -> None:
        """What leaving the block does: stops the server; safe to call twice."""
        self.stop()

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 10 s) and removes its temporary directory; safe to call
        twice."""
        with self._lock:
            process, self.process = self.process, None
            temporary, self._temporary = self._temporary, None
            self.base_url = None
            HELD.running.discard(self)
        if process is not None:
            stop_process(process, timeout=10)
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)

    def __enter__(self) -> "LocalReader":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def start_local_reader(model: str, *, threads: int = LocalReaderConfig.threads,
                       ctx_per_slot: int = LocalReaderConfig.ctx_per_slot, slots: int = LocalReaderConfig.slots,
                       progress: bool = False, socket_dir: Optional[Path] = None) -> LocalReader:
    """The one start of the local reader, for the commands, the evaluation and the warm server alike: a server
    started now and waited for, this process's own. The caller closes it (``close()``, or leaving ``with``); its
    API key is ``.api_key``, passed on as an argument.

    Args:
      model, threads, ctx_per_slot, slots: see :class:`LocalReaderConfig` (whose defaults these are).
      progress: a progress bar while a preset's model file is assembled.
      socket_dir: see :class:`LocalReader`.

    Raises:
      ValueError: a setting out of range (one line naming it).
      LocalReaderError: the server could not start (one line).
    """
    config = LocalReaderConfig(model=model, threads=threads, ctx_per_slot=ctx_per_slot, slots=slots)
    local = LocalReader(config, progress=progress, socket_dir=socket_dir)
    try:
        return local.start()
    except BaseException:
        local.close()
        raise


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
