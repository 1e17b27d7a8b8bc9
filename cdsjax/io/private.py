"""Private modes for what cdsjax writes: indexes and caches hold private document text.

Directories cdsjax creates are 0700 and a committed index or cache entry is 0700/0600, whatever the umask.
A lock or a log is opened in the user's own directory without following a link, refused when another user
owns it (:func:`open_private`, :func:`private_lock`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["PrivateFileError", "dir_refusal", "make_private", "open_private", "private_cache_dir", "private_dir",
           "private_lock"]


class PrivateFileError(OSError):
    """A file cdsjax would write (a lock, a log) that is not this user's own regular file, or a directory it is
    in that others may write; the message is one line naming the path."""


def private_dir(path: Path) -> Path:
    """Creates ``path`` and any missing parents with mode 0700 (existing directories are left alone)."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask
    return path


def default_cache_dir() -> Path:
    """The cdsjax cache the environment names: ``$CDSJAX_CACHE``, else ``~/.cache/cdsjax`` (neither created nor
    checked here: :func:`private_cache_dir` does that)."""
    return Path(os.environ.get("CDSJAX_CACHE") or Path.home() / ".cache" / "cdsjax").expanduser()


def private_cache_dir(path: Path) -> Path:
    """The cdsjax cache directory ``path``, created 0700 when missing, or refused in one line.

    A directory that another user owns, or that its group or others may write, is refused
    (:class:`~cdsjax.io.storefiles.StoreError`): whoever can write there could plant links or entries that
    cdsjax would read, run or write through. ``path`` itself may be a link the user made (to another disk,
    say); nothing inside it is followed (:func:`~cdsjax.io.storefiles.open_inside`)."""
    from cdsjax.io.storefiles import StoreError

    path = Path(path)
    try:
        private_dir(path)
        info = os.stat(path)
    except OSError as err:
        raise StoreError(f"{path}: cannot use the cdsjax cache directory ({err.strerror or err})") from None
    why = dir_refusal(info)
    if why is not None:
        raise StoreError(f"{path}: refusing the cdsjax cache directory: {why}; set CDSJAX_CACHE to a directory of "
                         "your own")
    return path


def dir_refusal(info: os.stat_result) -> Optional[str]:
    """Why a directory (its ``stat``) is not this user's own, in a few words; None when it is: a directory that
    this uid owns and that neither its group nor others may write (nobody else can plant or swap a name in
    it)."""
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    if info.st_mode & 0o022:
        return f"writable by its group or others (mode {stat.S_IMODE(info.st_mode):04o}); `chmod go-w` it"
    return None


def open_private(path: Path, *, truncate: bool = False, append: bool = False, own_dir: bool = True) -> int:
    """A descriptor of the regular file ``path``, this user's own, mode 0600, opened for reading and writing
    (created when missing) without following a link and without blocking on a FIFO; ``truncate`` empties it
    once it is known to be ours, ``append`` has every write go to its end (``O_APPEND``). Close-on-exec (a
    child gets it only as a redirected stream).

    Args:
      own_dir: its directory must be this user's own (:func:`dir_refusal`): where others may write, they could
        remove the file and put another in its place (a lock would then exclude nobody).

    Raises:
      PrivateFileError: ``path`` is a link, not a regular file, another user's, has more than one name (a hard
        link: a write would reach a file elsewhere), or (``own_dir``) its directory is not this user's own; or
        it cannot be opened (the reason given). One line.
    """
    path = Path(path)
    if own_dir:
        try:
            parent = os.stat(path.parent)
        except OSError as err:
            raise PrivateFileError(f"{path}: cannot open ({err.strerror or err})") from None
        why = dir_refusal(parent)
        if why is not None:
            raise PrivateFileError(f"{path}: refusing to write in {path.parent}: {why}")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if append else 0
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(path):
            raise PrivateFileError(f"{path}: refusing a symbolic link; remove it") from None
        raise PrivateFileError(f"{path}: cannot open ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PrivateFileError(f"{path}: refusing it: not a regular file; remove it")
        if info.st_uid != os.getuid():
            raise PrivateFileError(f"{path}: refusing it: owned by uid {info.st_uid}, not by you (uid "
                                   f"{os.getuid()}); remove it")
        if info.st_nlink != 1:
            raise PrivateFileError(f"{path}: refusing it: it has {info.st_nlink} names (a hard link); remove it")
        os.fchmod(fd, 0o600)
        if truncate:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except PrivateFileError:
        os.close(fd)
        raise
    except OSError as err:
        os.close(fd)
        raise PrivateFileError(f"{path}: cannot use ({err.strerror or err})") from None
    return fd


@contextlib.contextmanager
def private_lock(path: Path, *, timeout: Optional[float] = None, poll: float = 0.05) -> Iterator[int]:
    """Holds an exclusive ``flock`` on the file ``path`` (:func:`open_private`: this user's own, never through a
    link, never truncated) for the ``with`` block; yields its descriptor. The file stays (removing it while
    another process waits on it would let two hold "the" lock). ``flock`` is what the ``filelock`` package
    takes on Unix, so the two exclude each other on the same file.

    Args:
      timeout: seconds to wait for another holder; None: as long as it takes.

    Raises:
      PrivateFileError: see :func:`open_private`; a ``TimeoutError`` when ``timeout`` passed. One line.
    """
    import fcntl

    fd = open_private(path)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{path}: still locked by another process after {timeout:g} s") from None
                    time.sleep(poll)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def make_private(root: Path) -> None:
    """Sets every directory under ``root`` (itself included) to 0700 and every regular file to 0600.

    No link is followed: ``os.walk`` does not descend into one, and each file is re-moded through a
    descriptor opened with ``O_NOFOLLOW``. A file with more than one hard link is left as it is (its inode,
    and so its mode, is shared with a name elsewhere; cdsjax copies what it takes in, and links nothing)."""
    root = Path(root)
    os.chmod(root, 0o700)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            p = os.path.join(parent, name)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        for name in files:
            try:
                fd = os.open(os.path.join(parent, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link (ELOOP) or gone: not ours to re-mode
                continue
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
