"""The warm server's client, for ``cdsjax ask`` and ``cdsjax reader``: find this user's server, or start one,
and talk to it. Standard library only (and :mod:`cdsjax.io.child` to start it), so a command that asks the warm
server starts at once: no JAX, torch or openai is imported here.

Nothing is sent before the other end is known to be this user's: the socket lies in this user's private
directory (:func:`cdsjax.commands.warm.place.private_runtime_dir`, checked on every connection) and the
process holding it must run as this user (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

from cdsjax.commands.warm.place import PlaceError, log_name, peer_uid, private_runtime_dir, socket_name
from cdsjax.commands.warm.wire import WireError, receive, send

SERVER_MODULE = "cdsjax.commands.warm"  # the server's command line: python -m SERVER_MODULE (ps shows it)
START_TIMEOUT = 120.0  # seconds for a new server to answer (it imports JAX: ~3-10 s on 2 busy cores)


class WarmError(RuntimeError):
    """The warm server could not be reached, started or understood; one line, with the exit ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def connect(directory: Path, timeout: Optional[float] = None) -> Optional[socket.socket]:
    """A connection to the server in ``directory``, or None when none listens there.

    Raises:
      PlaceError: the process at the other end runs as another user (nothing is sent to it).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    try:
        sock.connect(str(directory / socket_name()))
    except (FileNotFoundError, ConnectionRefusedError, socket.timeout):
        sock.close()
        return None
    except OSError as err:
        sock.close()
        raise PlaceError(f"cannot reach the warm server at {directory / socket_name()} ({err.strerror or err})") from None
    uid = peer_uid(sock)
    if uid is not None and uid != os.getuid():
        sock.close()
        raise PlaceError(f"the warm server's socket {directory / socket_name()} is held by uid {uid}, not by you: "
                         f"refusing it")
    sock.settimeout(timeout)
    return sock


def start_server(directory: Path, keep_alive: float):
    """Starts a warm server (its own session: it outlives this command for its keep-alive) logging to
    ``directory/warm.log``; its process."""
    from cdsjax.io.child import spawn

    return spawn([sys.executable, "-m", SERVER_MODULE, "--keep-alive", repr(float(keep_alive))],
                 log=directory / log_name(), detach=True)


def reach(keep_alive: float, *, start: bool = True, timeout: Optional[float] = None) -> Optional[socket.socket]:
    """A connection to this user's warm server, started when none runs (``start``); None when none runs and
    ``start`` is False.

    Raises:
      PlaceError: the directory or the socket cannot be used safely (one line).
      WarmError: a server that was started did not answer (one line naming its log).
    """
    directory = private_runtime_dir()
    sock = connect(directory, timeout)
    if sock is not None or not start:
        return sock
    from cdsjax.io.child import ChildError

    try:
        process = start_server(directory, keep_alive)
    except ChildError as err:  # its log is a link or another user's file
        raise WarmError(f"cannot start the warm cdsjax server: {err}") from None
    except OSError as err:
        raise WarmError(f"cannot start the warm cdsjax server ({err.strerror or err}; log: "
                        f"{directory / log_name()})") from None
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        sock = connect(directory, timeout)
        if sock is not None:
            return sock
        code = process.poll()
        if code not in (None, 0):  # 0: another command's server won the race; it answers in a moment
            raise WarmError(f"the warm cdsjax server exited at start ({last_line(directory / log_name())}; log: "
                            f"{directory / log_name()})")
        time.sleep(0.05)
    raise WarmError(f"the warm cdsjax server did not answer within {START_TIMEOUT:g} s (log: {directory / log_name()})")


def last_line(log: Path) -> str:
    """The last non-empty line of a log (without a traceback's frames), or a note that there is none."""
    with contextlib.suppress(OSError):
        fd = os.open(log, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1][:300]
    return "no log"


def call(request: dict, *, keep_alive: float = 0.0, start: bool = False) -> Optional[dict]:
    """One request with one reply (``status``, ``stop``); None when no server runs and ``start`` is False."""
    sock = reach(keep_alive, start=start, timeout=30.0)
    if sock is None:
        return None
    with sock, sock.makefile("rwb") as stream:
        try:
            send(stream, request)
            reply = receive(stream)
        except (OSError, WireError) as err:
            raise WarmError(f"the warm cdsjax server did not answer ({err})") from None
    if reply is None:
        raise WarmError("the warm cdsjax server closed the connection without a reply")
    return reply


def events(request: dict, *, keep_alive: float) -> Iterator[dict]:
    """Sends an ``ask`` request and yields the server's events until ``done`` or ``error`` (see
    :mod:`cdsjax.commands.warm.wire`); a stream that ends before either is a :class:`WarmError`. Leaving early
    (Ctrl-C) closes the connection, and the server stops reading."""
    sock = reach(keep_alive, start=True)
    with sock, sock.makefile("rwb") as stream:
        try:
            send(stream, request)
            while True:
                event = receive(stream)
                if event is None:
                    break
                yield event
                if event.get("event") in ("done", "error"):
                    return
        except (OSError, WireError) as err:
            raise WarmError(f"the warm cdsjax server broke off the answer ({err}; log: "
                            f"{private_runtime_dir() / log_name()})") from None
    raise WarmError(f"the warm cdsjax server ended the answer before its end (log: {private_runtime_dir() / log_name()})")
