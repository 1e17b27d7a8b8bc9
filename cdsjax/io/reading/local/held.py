"""The local readers this process holds (:class:`cdsjax.io.reading.local.reader.LocalReader`), in one object,
:data:`HELD`: what is stopped or released when the process ends (:func:`stop_all`; the exit handler is registered
by the first start, never at import, and :func:`stop_on_sigterm` does it on SIGTERM), and the uses of a shared
server that count for its keep-alive (:func:`mark_used`).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import threading
from typing import Optional


class HeldReaders:
    """The local servers this process holds, in one object per process (:data:`HELD`).

    Attributes:
      running: the readers started here and not yet closed; when the interpreter exits, or SIGTERM arrives inside
        :func:`stop_on_sigterm`, those of this process's own are stopped and the shared ones released.
      detached: shared servers this process started (its children, though they outlive it): reaped once they exit.
      exit_registered: whether the exit handler is registered (by the first start, never at import).
    """

    def __init__(self):
        self.running: set = set()  # of cdsjax.io.reading.local.reader.LocalReader
        self.detached: "list[subprocess.Popen]" = []
        self.exit_registered = False

    def register_exit(self) -> None:
        if not self.exit_registered:
            self.exit_registered = True
            atexit.register(stop_all)

    def reap(self) -> None:
        """Forgets (and reaps) the detached servers that have exited."""
        self.detached[:] = [p for p in self.detached if p.poll() is None]


HELD = HeldReaders()


def stop_all() -> None:
    """Stops the servers of this process's own and releases the shared ones it holds."""
    for reader in list(HELD.running):
        reader.close()


def mark_used(base_url: Optional[str]) -> None:
    """Marks a use of the shared local server at ``base_url`` held by this process (its keep-alive counts from
    the last use); does nothing for any other URL. Cheap (one ``utime``), safe from any thread."""
    if not base_url:
        return
    for reader in list(HELD.running):
        if reader.base_url == base_url:
            reader.mark_used()


@contextlib.contextmanager
def stop_on_sigterm():
    """While inside, SIGTERM stops this process's own local servers, releases the shared ones it holds
    (:func:`stop_all`), and then exits as SIGTERM would (main thread only)."""
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
