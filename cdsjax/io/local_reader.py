"""A reader that runs on this machine: llama.cpp's OpenAI-compatible server (the ``xllamacpp`` wheel) on
loopback, for a GGUF model, so that cdsjax answers questions without a GPU or a remote server.

    with LocalReader() as local:                 # the default preset, assembled once into the cdsjax cache
        reader = Reader(local.reader_config())   # an ordinary OpenAI-compatible client of it
        reader.answer("What does Table 1 show?", evidence).text

The server is a child process (``python -m cdsjax.io.local_reader _serve ...``) bound to 127.0.0.1 at a free
port; :class:`LocalReader` waits until it answers ``/health``, keeps its log (``<cache>/logs/``), and stops it
on exit, on an error and on SIGTERM/SIGINT of the parent (the child also exits by itself within a second once
its parent is gone). A server that cannot start is one :class:`LocalReaderError` line: no runtime installed,
a file that is not a GGUF model, no free port, not enough memory, or the log's last words.

The model (:func:`cdsjax.io.local_model.resolve_model`) is a preset assembled from registry packages into
the cdsjax cache, a ``.gguf`` path, or a model-hub file (:mod:`cdsjax.io.local_model`).

Settings (:class:`LocalReaderConfig`): threads, context per slot and parallel slots. ``cdsjax serve`` and the
evaluation use the slots (requests in flight at once); the server's whole context is ``slots × ctx_per_slot``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import signal
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

    Attributes (once started):
      base_url: ``http://127.0.0.1:PORT/v1``.
      model_name: the name the server answers to (the preset's name or the file's stem).
      model_file: the GGUF file.
      log_path: the server's log.
      startup_s: seconds from start to the first answer.
    """

    def __init__(self, config: Optional[LocalReaderConfig] = None, *, progress: bool = True, **overrides):
        config = config if config is not None else LocalReaderConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.progress = progress
        self.process: Optional[subprocess.Popen] = None
        self.base_url: Optional[str] = None
        self.model_file: Optional[Path] = None
        self.model_name: Optional[str] = None
        self.log_path: Optional[Path] = None
        self.startup_s: Optional[float] = None
        self._lock = threading.RLock()  # stop() runs inside start() when the server does not come up

    @property
    def threads(self) -> int:
        return self.config.threads or usable_cores()

    def reader_config(self, **fields):
        """A :class:`cdsjax.io.llm.ReaderConfig` for this server (keyword fields override)."""
        from cdsjax.io.llm import ReaderConfig

        if self.base_url is None:
            raise LocalReaderError("the local reader is not started", kind="start")
        values = dict(base_url=self.base_url, model=self.model_name, api_key="EMPTY",
                      concurrency=self.config.slots)
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
            if self.process is not None:
                return self
            if not runtime_installed():
                raise LocalReaderError(f"no local reader runtime: {RUNTIME_HINT}", kind="runtime")
            self.model_file = resolve_model(self.config.model, progress=self.progress)
            preset = next((p for p in PRESETS.values() if self.model_file == model_path(p)), None)
            self.model_name = preset.name if preset is not None else self.model_file.stem
            ctx = self.config.ctx_per_slot * self.config.slots
            need, have = memory_needed(self.model_file.stat().st_size, ctx), available_memory()
            if have is not None and need > have:
                raise LocalReaderError(
                    f"not enough memory for the local reader: about {need / 2**30:.1f} GiB needed for "
                    f"{self.model_file.name} with {ctx} context tokens, {have / 2**30:.1f} GiB available "
                    f"(lower ctx_per_slot or slots)", kind="memory")
            log_dir = Path(self.config.log_dir).expanduser() if self.config.log_dir else cache_dir() / "logs"
            log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            last: Optional[LocalReaderError] = None
            for _ in range(3):  # another process may take the free port between finding and binding it
                try:
                    self._launch(free_port(), log_dir)
                    break
                except LocalReaderError as err:
                    last = err
                    if err.kind != "port":
                        raise
            else:
                raise last  # type: ignore[misc]
            _RUNNING.add(self)
            return self

    def _launch(self, port: int, log_dir: Path) -> None:
        cfg = self.config
        self.log_path = log_dir / f"reader-{port}.log"
        cmd = [sys.executable, "-m", "cdsjax.io.local_reader", "_serve", "--model", str(self.model_file),
               "--alias", self.model_name, "--port", str(port), "--threads", str(self.threads),
               "--ctx", str(cfg.ctx_per_slot * cfg.slots), "--slots", str(cfg.slots), "--parent", str(os.getpid())]
        start = time.perf_counter()
        with open(self.log_path, "wb") as log:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
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

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
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
        self.stop()


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


# Servers still running when the interpreter exits, or when SIGTERM arrives, are stopped.
_RUNNING: "set[LocalReader]" = set()


def stop_all() -> None:
    for reader in list(_RUNNING):
        reader.stop()


atexit.register(stop_all)


@contextlib.contextmanager
def stop_on_sigterm():
    """While inside, SIGTERM stops the local servers and then exits as SIGTERM would (main thread only)."""
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
# The child process: ``python -m cdsjax.io.local_reader _serve ...`` runs the server until it is told to stop


def _serve(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="cdsjax.io.local_reader _serve")
    p.add_argument("--model", required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    args = p.parse_args(argv)
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
    server = xllamacpp.Server(params)  # noqa: F841  (serves until the process ends)
    print(f"cdsjax local reader: serving {args.alias} at http://127.0.0.1:{args.port}", flush=True)
    while not stopping.wait(1.0):
        if os.getppid() != args.parent:  # the parent is gone: do not outlive it
            break
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
