"""Private modes for what cdsjax writes: indexes and caches hold private document text.

Directories cdsjax creates are 0700 and a committed index or cache entry is 0700/0600, whatever the umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["make_private", "private_dir"]


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


def make_private(root: Path) -> None:
    """Sets every directory under ``root`` (itself included) to 0700 and every regular file to 0600.

    Symlinks are not followed (``os.walk`` does not descend into them and ``lchmod``-like behaviour is had by
    skipping them)."""
    root = Path(root)
    os.chmod(root, 0o700)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            p = os.path.join(parent, name)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        for name in files:
            p = os.path.join(parent, name)
            if stat.S_ISREG(os.lstat(p).st_mode):
                os.chmod(p, 0o600)
