"""Where the warm server lives and who may reach it: a directory only this user may enter, the server's socket,
lock and log in it (one server per user and cdsjax cache), the peer's user on a connected socket, and the
keep-alive a command asks for.

The directory is ``$CDSJAX_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/cdsjax``, else ``cdsjax-UID`` in the temporary
directory (``$TMPDIR``). It is made 0700 when missing and used only when it is a real directory (not a link), this
user's, and closed to everyone else; otherwise :class:`PlaceError` says why in one line. Nothing but this user's processes can then bind or
reach a socket inside it, and the client also checks the user of the process at the other end of the socket
(``SO_PEERCRED``) before it sends anything. Standard library only: the client imports this before anything
heavy.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
import tempfile
from pathlib import Path
from typing import Optional

from cdsjax.defaults import DEFAULT_KEEP_ALIVE, KEEP_ALIVE_CEILING, KEEP_ALIVE_FLOOR

RUNTIME_ENV = "CDSJAX_RUNTIME_DIR"
KEEP_ALIVE_ENV = "CDSJAX_READER_KEEP_ALIVE"
IN_PROCESS_ENV = "CDSJAX_IN_PROCESS"  # "1": `cdsjax ask` loads and reads in its own process (scripts, tests, CI)
MAX_SOCKET_PATH = 100  # bytes; AF_UNIX paths end at 107


def cache_tag() -> str:
    """A short name of the cdsjax cache this process uses (``$CDSJAX_CACHE``, else ``~/.cache/cdsjax``): one warm
    server per user and cache, so a command never gets indexes or a model from another cache than its own."""
    from cdsjax.io.private import default_cache_dir

    return hashlib.sha256(os.path.abspath(default_cache_dir()).encode()).hexdigest()[:10]


def socket_name() -> str:
    """The warm server's socket in its directory (``warm-TAG.sock``, :func:`cache_tag`)."""
    return f"warm-{cache_tag()}.sock"


def lock_name() -> str:
    """The lock the warm server holds for its life: one server per user and cache."""
    return f"warm-{cache_tag()}.lock"


def log_name() -> str:
    """The warm server's log."""
    return f"warm-{cache_tag()}.log"


class PlaceError(RuntimeError):
    """The warm server's directory or socket cannot be used safely; the message is one line."""


def runtime_dir() -> Path:
    """The warm server's directory (see the module docstring); neither made nor checked here."""
    named = os.environ.get(RUNTIME_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if xdg:
        return Path(xdg) / "cdsjax"
    return Path(tempfile.gettempdir()) / f"cdsjax-{os.getuid()}"


def private_runtime_dir() -> Path:
    """:func:`runtime_dir`, made 0700 when missing, or :class:`PlaceError` when it is not this user's alone."""
    path = runtime_dir()
    fix = f"; set {RUNTIME_ENV} to a directory of your own"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise PlaceError(f"cannot make the warm server's directory {path} ({err.strerror or err}){fix}") from None
    try:
        info = os.lstat(path)
    except OSError as err:
        raise PlaceError(f"cannot use the warm server's directory {path} ({err.strerror or err}){fix}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PlaceError(f"refusing the warm server's directory {path}: not a directory of its own (a link or a "
                         f"file){fix}")
    if info.st_uid != os.getuid():
        raise PlaceError(f"refusing the warm server's directory {path}: owned by uid {info.st_uid}, not by you "
                         f"(uid {os.getuid()}){fix}")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise PlaceError(f"refusing the warm server's directory {path}: others may enter it (mode "
                         f"{stat.S_IMODE(info.st_mode):04o}; `chmod 700` it){fix}")
    if len(str(path / socket_name()).encode()) > MAX_SOCKET_PATH:
        raise PlaceError(f"the warm server's directory {path} is too deep for a socket (its path must stay under "
                         f"{MAX_SOCKET_PATH - len(socket_name())} bytes){fix}")
    return path


def peer_uid(sock: socket.socket) -> Optional[int]:
    """The user of the process at the other end of a connected Unix socket (``SO_PEERCRED``); None where the
    platform cannot say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    fmt = "3i"  # struct ucred: pid, uid, gid
    _pid, uid, _gid = struct.unpack(fmt, sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize(fmt)))
    return uid


def keep_alive_setting(value=None) -> float:
    """The keep-alive a command asks for, in seconds: ``value`` when given, else ``$CDSJAX_READER_KEEP_ALIVE``,
    else :data:`~cdsjax.defaults.DEFAULT_KEEP_ALIVE`. 0 keeps nothing (the command loads and reads in its own
    process); any other value lies between :data:`~cdsjax.defaults.KEEP_ALIVE_FLOOR` and
    :data:`~cdsjax.defaults.KEEP_ALIVE_CEILING`.

    Raises:
      ValueError: any other value (one line naming where it came from).
    """
    where = "--keep-alive"
    if value is None:
        value, where = os.environ.get(KEEP_ALIVE_ENV, "").strip() or None, KEEP_ALIVE_ENV
        if value is None:
            return DEFAULT_KEEP_ALIVE
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if seconds != 0 and not KEEP_ALIVE_FLOOR <= seconds <= KEEP_ALIVE_CEILING:
        raise ValueError(f"{where}: expected 0 (keep nothing warm) or {KEEP_ALIVE_FLOOR:g} to "
                         f"{KEEP_ALIVE_CEILING:g} seconds, got {value!r}")
    return seconds
