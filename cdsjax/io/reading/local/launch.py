"""Starting the local reader's server process: its command line, the memory it needs, the start and the wait until
it answers, and a failed start said in one line.

:func:`launch` starts ``python -m cdsjax.io.reading.local.reader _serve ...`` (:mod:`cdsjax.io.reading.local.serve`) with
:func:`cdsjax.io.child.spawn` in a session of its own, its output in a log, its API key in its environment, and
waits (:func:`cdsjax.io.child.wait_until`) until it answers ``/health`` on its Unix socket. The socket lies in a
directory only this user may enter, so nothing but this user's processes can listen there or connect to it: a
request never goes to a port another user could take once the server is gone. A server that exits first is
diagnosed from its log's last lines (:func:`start_error`: the socket, the model file, memory); one that does not
answer in time is stopped.
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

from cdsjax.io.child import ChildError, spawn, stop, wait_until
from cdsjax.io.reading.local.model import LocalReaderError
from cdsjax.io.reading.local.serve import KEY_ENV, SERVE_MODULE
from cdsjax.io.util import http_get


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
    """A server that answers: its process, Unix socket, log and the seconds from start to its first answer."""

    process: subprocess.Popen
    socket: Path
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


def server_command(spec: ServerSpec, *, socket: Path, parent: int) -> List[str]:
    """The server's command line (no secret on it: ``ps`` shows it to every user); ``socket``: the Unix socket it
    listens on; ``parent``: the process whose end ends it."""
    return [sys.executable, "-m", SERVE_MODULE, "_serve", "--model", str(spec.model_file), "--alias", spec.alias,
            "--socket", str(socket), "--threads", str(spec.threads), "--ctx", str(spec.ctx_per_slot * spec.slots),
            "--slots", str(spec.slots), "--parent", str(parent)]


def answers(socket: Path) -> bool:
    """Whether the server on ``socket`` answers ``GET /health`` with 200."""
    return http_get("http://localhost/health", timeout=2.0, limit=0, socket_path=str(socket))[0] == 200


def launch(spec: ServerSpec, *, key: str, socket: Path, log: Path, timeout: float, parent: int) -> Started:
    """Starts the server on the Unix socket ``socket`` and waits up to ``timeout`` seconds until it answers.

    Args:
      spec: what it runs.
      key: the API key it requires (passed in its environment).
      socket: where it listens: a path (``*.sock``, under 100 bytes) in a directory only this user may enter.
      log: its log (created 0600, never through a link).
      timeout: seconds to wait for its first answer.
      parent: the process whose end ends it.

    Raises:
      LocalReaderError: one line; ``kind`` ``socket``, ``model``, ``memory`` or ``start``. A server that did not
        come up is stopped; its log is kept.
    """
    if len(str(socket).encode()) > 100 or not str(socket).endswith(".sock"):
        raise LocalReaderError(f"{socket}: a reader socket's path must end in .sock and be under 100 bytes",
                               kind="socket")
    Path(socket).unlink(missing_ok=True)  # one left by a server that was killed: its directory is this user's
    cmd = server_command(spec, socket=socket, parent=parent)
    start = time.perf_counter()
    try:
        process = spawn(cmd, env=dict(os.environ, **{KEY_ENV: key}), log=log, detach=True)
    except ChildError as err:  # its log is a link, another user's file, or cannot be written
        raise LocalReaderError(str(err), kind="start") from None
    except OSError as err:
        raise LocalReaderError(f"cannot start the local reader ({err.strerror or err})", kind="start") from None
    try:
        wait_until(lambda: answers(socket), timeout=timeout, what="the local reader", process=process, log=log)
    except ChildError as err:
        if err.returncode is not None:
            raise start_error(err.returncode, log, spec.model_file) from None
        stop(process)
        raise LocalReaderError(str(err), kind="start") from None
    except BaseException:
        stop(process)
        raise
    return Started(process=process, socket=Path(socket), log=log, seconds=time.perf_counter() - start)


def start_error(code: int, log: Path, model_file: Path) -> LocalReaderError:
    """Why a server that exited with ``code`` at start did, in one line, from its log's last lines."""
    tail = log_tail(log)
    text = " ".join(tail).lower()
    if "bind" in text or "address already in use" in text or "couldn't bind" in text:
        return LocalReaderError(f"the local reader could not listen on its socket: {tail[-1] if tail else ''}",
                                kind="socket")
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
