"""What goes over the warm server's socket: one JSON object per line, each way.

A client sends one request (``{"op": "ask" | "status" | "stop", ...}``); the server answers with one object
(``status``, ``stop``) or, for ``ask``, a stream of events: ``status`` (a line for the person while indexes load),
``evidence`` (the ``ask --json`` object before reading), ``token`` (a piece of the answer), ``retry`` (the text so
far was no answer), and last ``done`` (the whole object) or ``error`` (``message``, one line, and the exit
``code``). A stream that ends without ``done`` or ``error`` is an error for the client, never an answer.
"""

from __future__ import annotations

import json
from typing import BinaryIO, Optional

MAX_LINE = 64 << 20  # bytes of one message: an answer with its evidence is ~10-100 KB


class WireError(RuntimeError):
    """A message that could not be read: too long, or not a JSON object."""


def send(stream: BinaryIO, message: dict) -> None:
    """Writes ``message`` as one line and flushes it."""
    stream.write(json.dumps(message, default=float).encode("utf-8") + b"\n")
    stream.flush()


def receive(stream: BinaryIO) -> Optional[dict]:
    """The next message, or None when the other end has closed the connection.

    Raises:
      WireError: a line over :data:`MAX_LINE` bytes, or one that is not a JSON object.
    """
    line = stream.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE:
        raise WireError(f"a message over {MAX_LINE >> 20} MiB")
    if not line.endswith(b"\n"):
        return None  # cut off mid-line: the other end went away
    try:
        message = json.loads(line)
    except ValueError:
        raise WireError("a message that is not JSON") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message
