"""The local readers this process holds (:class:`cdsjax.io.reading.local.reader.LocalReader`), in one object,
:data:`HELD`: what is stopped when the process ends (:func:`stop_all`; the exit handler is registered by the first
start, never at import, and :func:`stop_on_sigterm` does it on SIGTERM). Each server also exits by itself within
a second once this process is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading


class HeldReaders:
    """The local servers this process holds, in one object per process (:data:`HELD`).

    Attributes:
      running: the readers started here and not yet closed; they are stopped when the interpreter exits, or
        SIGTERM arrives inside :func:`stop_on_sigterm`.
      exit_registered: whether the exit handler is registered (by the first start, never at import).
    """

    def __init__(self):
        self.running: set = set()  # of cdsjax.io.reading.local.reader.LocalReader
        self.exit_registered = False

    def register_exit(self) -> None:
        if not self.exit_registered:
            self.exit_registered = True
            atexit.register(stop_all)


HELD = HeldReaders()


def stop_all() -> None:
    """Stops the servers this process holds."""
    for reader in list(HELD.running):
        reader.close()


@contextlib.contextmanager
def stop_on_sigterm():
    """While inside, SIGTERM stops this process's local servers (:func:`stop_all`), and then exits as SIGTERM
    would (main thread only)."""
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
