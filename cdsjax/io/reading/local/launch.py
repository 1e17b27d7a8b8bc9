"""Starting the local reader's server process: its command line, the memory it needs, the start and the wait until
it answers, and a failed start said in one line.

:func:`launch` starts ``python -m cdsjax.io.reading.local.reader _serve ...`` (:mod:`cdsjax.io.reading.local.serve`) with
:func:`cdsjax.io.child.spawn` in a session of its own, its output in a log, its API key in its environment, and
waits (:func:`cdsjax.io.child.wait_until`) until it answers ``/health``. A server that exits first is diagnosed
from its log's last lines (:func:`start_error`: the port, the model file, memory); one that does not answer in
time is stopped.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from cdsjax.io.child import ChildError, http_ok, spawn, stop, wait_until
from cdsjax.io.reading.local.model import LocalReaderError
from cdsjax.io.reading.local.records import SERVE_MODULE, port_is_mine
from cdsjax.io.reading.local.serve import KEY_ENV
from cdsjax.io.util import free_port

PORT_TRIES = 3  # another process may take the free port between finding and binding it


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """What a server runs: the model file, the name it answers to, CPU threads, context per slot, slots."""

    model_file: Path
    alias: str
    threads: int
    ctx_per_slot: int
    slots: int


@dataclasses.dataclass(frozen=True)
class Started:
    """A server that answers: its process, port, log and the seconds from start to its first answer."""

    process: subprocess.Popen
    port: int
    log: Path
    seconds: float


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


def check_memory(spec: ServerSpec) -> None:
    """Raises a one-line :class:`LocalReaderError` (``kind="memory"``) when the server would not fit in the memory
    available now."""
    ctx = spec.ctx_per_slot * spec.slots
    need, have = memory_needed(Path(spec.model_file).stat().st_size, ctx), available_memory()
    if have is not None and need > have:
        raise LocalReaderError(
            f"not enough memory for the local reader: about {need / 2**30:.1f} GiB needed for "
            f"{Path(spec.model_file).name} with {ctx} context tokens, {have / 2**30:.1f} GiB available "
            f"(lower ctx_per_slot or slots)", kind="memory")


def server_command(spec: ServerSpec, *, port: int, parent: int, record: Optional[Path] = None,
                   keep_alive: float = 0.0, grace: float = 180.0) -> List[str]:
    """The server's command line (no secret on it: ``ps`` shows it to every user); ``parent``: the process whose
    end ends the server (0: none); ``record``: a shared server's record, kept up ``keep_alive`` seconds after its
    last use (``grace``: more seconds to wait for a record that never comes)."""
    cmd = [sys.executable, "-m", SERVE_MODULE, "_serve", "--model", str(spec.model_file), "--alias", spec.alias,
           "--port", str(port), "--threads", str(spec.threads), "--ctx", str(spec.ctx_per_slot * spec.slots),
           "--slots", str(spec.slots), "--parent", str(parent)]
    if record is not None:
        cmd += ["--record", str(record), "--keep-alive", repr(float(keep_alive)), "--grace", repr(float(grace))]
    return cmd


def launch(spec: ServerSpec, *, key: str, log_dir: Path, timeout: float, parent: int,
           record: Optional[Path] = None, keep_alive: float = 0.0) -> Started:
    """Starts the server at a free port of 127.0.0.1 and waits up to ``timeout`` seconds until it answers.

    Args:
      spec: what it runs.
      key: the API key it requires (passed in its environment).
      log_dir: where its log goes (``reader-PORT.log``).
      timeout: seconds to wait for its first answer.
      parent: the process whose end ends it (0: none: a shared server outlives its starter).
      record: a shared server's record (see :func:`server_command`).
      keep_alive: a shared server's keep-alive in seconds.

    Raises:
      LocalReaderError: one line; ``kind`` ``port``, ``model``, ``memory`` or ``start``. A server that did not
        come up is stopped; its log is kept.
    """
    last: Optional[LocalReaderError] = None
    for _ in range(PORT_TRIES):
        try:
            return _launch_at(free_port(), spec, key=key, log_dir=log_dir, timeout=timeout, parent=parent,
                              record=record, keep_alive=keep_alive)
        except LocalReaderError as err:
            last = err
            if err.kind != "port":
                raise
    raise last  # type: ignore[misc]


def _launch_at(port: int, spec: ServerSpec, *, key: str, log_dir: Path, timeout: float, parent: int,
               record: Optional[Path], keep_alive: float) -> Started:
    log = log_dir / f"reader-{port}.log"
    cmd = server_command(spec, port=port, parent=parent, record=record, keep_alive=keep_alive, grace=timeout)
    start = time.perf_counter()
    process = spawn(cmd, env=dict(os.environ, **{KEY_ENV: key}), log=log, detach=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(url + "/health"), timeout=timeout, what="the local reader", process=process,
                   log=log)
        if port_is_mine(port) is False:  # another user's server took the port first: it answered, not ours
            raise LocalReaderError(f"port {port} was taken by another user's process", kind="port")
    except ChildError as err:
        if err.returncode is not None:
            raise start_error(err.returncode, log, spec.model_file) from None
        stop(process)
        raise LocalReaderError(str(err), kind="start") from None
    except BaseException:
        stop(process)
        raise
    return Started(process=process, port=port, log=log, seconds=time.perf_counter() - start)


def start_error(code: int, log: Path, model_file: Path) -> LocalReaderError:
    """Why a server that exited with ``code`` at start did, in one line, from its log's last lines."""
    tail = log_tail(log)
    text = " ".join(tail).lower()
    if "bind" in text or "address already in use" in text or "couldn't bind" in text:
        return LocalReaderError(f"the local reader could not listen on its port: {tail[-1] if tail else ''}",
                                kind="port")
    if "failed to load model" in text or "gguf_init" in text or "error loading model" in text:
        return LocalReaderError(f"llama.cpp could not load {model_file} (log: {log})", kind="model")
    if "alloc" in text or "out of memory" in text or code in (-9, 137):
        return LocalReaderError(f"the local reader ran out of memory loading {Path(model_file).name} "
                                f"(log: {log})", kind="memory")
    last = tail[-1] if tail else f"exit code {code}"
    return LocalReaderError(f"the local reader exited at start ({last}; log: {log})", kind="start")


def log_tail(path: Optional[Path], lines: int = 8) -> List[str]:
    """The last ``lines`` non-empty lines of a server's log, without llama.cpp's time and level prefix."""
    if path is None:
        return []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = [re.sub(r"^[\d.]+ [A-Z] ", "", line).strip() for line in text.splitlines() if line.strip()]
    return out[-lines:]
