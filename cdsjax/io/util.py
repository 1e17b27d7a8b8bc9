"""Small helpers of the io layer that several of its parts (and the commands above it) share.

* :func:`usable_cores` — the cores this process may run on;
* :func:`free_port` — a free TCP port on 127.0.0.1;
* :func:`one_line` — a message or an exception on one bounded line, safe to print or send.
"""

from __future__ import annotations

import os
import socket
from typing import Any


def usable_cores() -> int:
    """The cores this process may run on (its affinity; the CPU count where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


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
