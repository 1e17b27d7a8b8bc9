"""Private modes for what cdsjax writes: indexes and caches hold private document text.

Directories cdsjax creates are 0700 and a committed index or cache entry is 0700/0600, whatever the umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["make_private", "private_cache_dir", "private_dir"]


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
    fix = "; set CDSJAX_CACHE to a directory of your own"
    if not stat.S_ISDIR(info.st_mode):
        raise StoreError(f"{path}: refusing the cdsjax cache directory: not a directory{fix}")
    if info.st_uid != os.getuid():
        raise StoreError(f"{path}: refusing the cdsjax cache directory: owned by uid {info.st_uid}, not by you "
                         f"(uid {os.getuid()}){fix}")
    if info.st_mode & 0o022:
        raise StoreError(f"{path}: refusing the cdsjax cache directory: writable by its group or others (mode "
                         f"{stat.S_IMODE(info.st_mode):04o}); `chmod go-w` it{fix}")
    return path


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
