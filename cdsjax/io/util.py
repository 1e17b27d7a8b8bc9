"""Small helpers of the io layer that several of its parts (and the commands above it) share.

* :func:`usable_cores` / :func:`usable_core_ids` — the cores this process may run on (how many, which);
* :func:`free_port` — a free TCP port on 127.0.0.1;
* :func:`one_line` — a message or an exception on one bounded line, safe to print or send.
"""

from __future__ import annotations

import os
import socket
from typing import Any, List


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
