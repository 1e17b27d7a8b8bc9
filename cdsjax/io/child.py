"""Child processes: starting one, keeping it from outliving its parent, waiting until it answers, stopping it.

Four parts of cdsjax run processes of their own, and each does these jobs through here:

* the local reader (:mod:`cdsjax.io.reading.local.launch`): llama.cpp's server, started with :func:`spawn` into a
  session of its own (a shared one outlives this process for its keep-alive; one of the caller's own watches its
  parent, :func:`watch_parent`), waited for with :func:`wait_until` / :func:`http_ok`, stopped with :func:`stop`
  (by pid, from its record, when another process started it);
* the multi-process evaluation (:func:`cdsjax.eval.distributed.launch_local`): one process per shard, started
  with :func:`spawn` (``die_with_parent``, a core each), stopped together with :func:`stop`;
* the index's worker pool (:mod:`cdsjax.io.index.workers`): each worker calls :func:`die_with_parent` as it
  starts;
* the layout helper (:mod:`cdsjax.io.parse.layout_split`): it calls :func:`kill_with_parent` as it starts and is
  stopped with :func:`stop`.

Nothing here is done at import: no handler is installed, no thread started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

from cdsjax.io.util import http_get, pid_alive

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

PR_SET_PDEATHSIG = 1  # linux/prctl.h

# What stop() takes: a subprocess.Popen, a multiprocessing.Process, or the pid of a process of this user
Child = Union[subprocess.Popen, "BaseProcess", int]


class ChildError(RuntimeError):
    """A child that did not come up, in one line naming its log: it exited first (``returncode``), it did not
    answer in time, or its log could not be opened safely (``returncode`` None)."""

    def __init__(self, message: str, *, returncode: Optional[int] = None, log: Optional[Path] = None):
        super().__init__(message)
        self.returncode = returncode
        self.log = log


# ---------------------------------------------------------------------------------------------------------------
# Starting


def spawn(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, log: Optional[Path] = None,
          detach: bool = False, die_with_parent: bool = False, core: Optional[int] = None) -> subprocess.Popen:
    """Starts ``argv`` as a child process.

    Args:
      argv: the command line. A secret goes in ``env``, never here (``ps`` shows command lines to every user).
      env: its whole environment; None: this process's.
      log: a file for its standard output and error (truncated, mode 0600, opened without following a link:
        :func:`cdsjax.io.private.open_private`), its input from ``/dev/null``; None: it shares this process's
        streams.
      detach: it runs in a session of its own, so the terminal's Ctrl-C and hang-up do not reach it and it may
        outlive this process; :func:`stop` signals its process group.
      die_with_parent: Linux's kernel kills it (SIGKILL) when the thread calling this ends (``PR_SET_PDEATHSIG``,
        kept across ``exec``; nothing on other platforms). Call it from a thread that lives as long as the child
        should (the main thread). Not with ``detach``.
      core: the CPU core it is pinned to; None: this process's affinity.

    Returns:
      The child, as :class:`subprocess.Popen`.

    Raises:
      ChildError: ``log`` is a link, another user's file, in a directory others may write, or cannot be opened
        (one line; ``returncode`` None).
    """
    if detach and die_with_parent:
        raise ValueError("a detached child outlives its parent: detach and die_with_parent exclude each other")
    prctl = _prctl() if die_with_parent else None

    def prepare() -> None:  # in the child, between fork and exec
        if core is not None:
            os.sched_setaffinity(0, {core})
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))

    kwargs = dict(env=dict(env) if env is not None else None, start_new_session=detach,
                  preexec_fn=prepare if core is not None or prctl is not None else None)
    if log is None:
        return subprocess.Popen(list(argv), **kwargs)
    from cdsjax.io.private import PrivateFileError, open_private

    try:
        # never through a planted link, never another user's file; the folder may be one the user shares
        out = open_private(log, truncate=True, own_dir=False)
    except PrivateFileError as err:
        raise ChildError(f"cannot write the log of {Path(argv[0]).name}: {err}", log=Path(log)) from None
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    finally:
        os.close(out)


def pin(core: int) -> bool:
    """Pins this process to CPU ``core``; False where the platform cannot."""
    try:
        os.sched_setaffinity(0, {core})
        return True
    except (AttributeError, OSError):
        return False


# ---------------------------------------------------------------------------------------------------------------
# Not outliving the parent (called in the child)


def _prctl() -> Optional[Callable]:
    """The C library's ``prctl`` (Linux), looked up before any fork; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def kill_with_parent() -> bool:
    """Has Linux's kernel kill this process (SIGKILL) the moment its parent ends, before anyone resumes its work
    (``PR_SET_PDEATHSIG``; the parent is the thread that started this process). False where that is not
    available."""
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)) == 0


def parent_alive(parent: int) -> bool:
    """Whether ``parent`` is still this process's parent (once it ends, the process is handed to another)."""
    return os.getppid() == parent


def watch_parent(parent: int, on_gone: Optional[Callable[[], None]] = None,
                 interval: float = 1.0) -> threading.Thread:
    """Looks every ``interval`` seconds, in a daemon thread, whether ``parent`` is still this process's parent;
    once it is gone, calls ``on_gone`` (None: the process exits at once with status 1)."""

    def watch() -> None:
        while parent_alive(parent):
            time.sleep(interval)
        if on_gone is None:
            os._exit(1)
        on_gone()

    thread = threading.Thread(target=watch, daemon=True, name="cdsjax-parent-watch")
    thread.start()
    return thread


def die_with_parent(parent: int) -> bool:
    """Ends this process when ``parent`` ends, rather than letting it work for no one: :func:`kill_with_parent`,
    and :func:`watch_parent` (other platforms, or a kernel signal that was missed). False when the parent is
    already gone (the caller returns at once)."""
    kill_with_parent()
    if not parent_alive(parent):
        return False
    watch_parent(parent)
    return True


# ---------------------------------------------------------------------------------------------------------------
# Waiting until it answers


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200."""
    return http_get(url, timeout=timeout, limit=0)[0] == 200


def wait_until(ready: Callable[[], bool], *, timeout: float, what: str, process: Optional[subprocess.Popen] = None,
               log: Optional[Path] = None, interval: float = 0.2) -> float:
    """Calls ``ready()`` every ``interval`` seconds until it returns True; the seconds that took.

    Raises:
      ChildError: ``process`` exited first (``returncode``: its exit status), or ``timeout`` seconds passed
        (``returncode`` None); one line, ``what`` its subject, naming ``log``. The process is left as it is (the
        caller stops it).
    """
    start = time.perf_counter()
    where = f" (log: {log})" if log is not None else ""
    while True:
        code = process.poll() if process is not None else None
        if code is not None:
            raise ChildError(f"{what} exited with status {code} before it answered{where}", returncode=code, log=log)
        if ready():
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            raise ChildError(f"{what} did not answer within {timeout:g} s{where}", log=log)
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------------------------
# Stopping


def reap(pid: int) -> None:
    """Collects ``pid``'s exit status when it is this process's child that has ended (no zombie is left)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _pid(child: Child) -> int:
    return child if isinstance(child, int) else child.pid


def _running(child: Child) -> bool:
    if isinstance(child, int):
        reap(child)
        return pid_alive(child)
    if isinstance(child, subprocess.Popen):
        return child.poll() is None
    return child.is_alive()  # a multiprocessing.Process


def _leads_own_group(pid: int) -> bool:
    """Whether ``pid`` leads a process group other than this process's (a child started with ``detach``)."""
    try:
        return os.getpgid(pid) == pid != os.getpgid(0)
    except OSError:
        return False


def _signal(child: Child, sig: int) -> None:
    if not _running(child):
        return
    pid = _pid(child)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if _leads_own_group(pid):
            os.killpg(pid, sig)  # whatever it started goes with it
        else:
            os.kill(pid, sig)


def _wait(child: Child, deadline: Optional[float]) -> bool:
    """Waits for ``child`` to end until ``deadline`` (``time.monotonic()``; None: as long as it takes); whether it
    ended."""
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    if isinstance(child, subprocess.Popen):
        try:
            child.wait(timeout=left)
            return True
        except subprocess.TimeoutExpired:
            return False
    if not isinstance(child, int):  # a multiprocessing.Process
        child.join(timeout=left)
        return not child.is_alive()
    while _running(child):
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop(*children: Child, timeout: float = 10.0) -> None:
    """Stops ``children``: SIGTERM to each that still runs, up to ``timeout`` seconds (in all) for them to end,
    then SIGKILL to those left, waiting for them to end.

    A child is a :class:`subprocess.Popen`, a :class:`multiprocessing.Process`, or the pid of a process of this
    user (one that another process started, found through a record: the caller checks it is the right one; it is
    reaped if it is this process's child). One that leads a process group of its own (:func:`spawn` with
    ``detach``) is signalled as a group. Safe for children that have already ended."""
    for child in children:
        _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        if not _wait(child, deadline):
            _signal(child, signal.SIGKILL)
            _wait(child, None if not isinstance(child, int) else time.monotonic() + timeout)
