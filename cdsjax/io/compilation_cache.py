"""JAX's persistent compilation cache for the entry points: where it lives, and its size kept under a cap.

:func:`enable_compilation_cache` is called by the commands (``ask``, ``serve``, ``demo``, ``eval``), never by the
library; :func:`prune_compilation_cache` keeps the directory under its cap (``cdsjax serve`` calls it after each
compilation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import jax

DEFAULT_JAX_CACHE_MAX_MB = 1024
_JAX_CACHE: Dict[str, Any] = {}  # the directory and byte cap enable_compilation_cache set, for pruning


def enable_compilation_cache(directory=None) -> Optional[Path]:
    """Turns on JAX's persistent compilation cache (in the cdsjax cache directory by default).

    A fresh ``cdsjax ask`` then loads the question encoder and selector executables from disk instead of
    compiling them (seconds on a loaded CPU). Set ``CDSJAX_JAX_CACHE=0`` to leave JAX's setting alone.
    The directory is private (0700) and kept under ``CDSJAX_JAX_CACHE_MAX_MB`` megabytes (default 1024;
    -1: no cap) by :func:`prune_compilation_cache`, run here and by ``cdsjax serve`` after each compilation,
    so a server whose clients ask for ever new budgets and options cannot fill the disk. (JAX's own
    ``jax_compilation_cache_max_size`` is not used: its eviction fails on entries written without it, as by
    earlier cdsjax versions, and warns on every later write.) Returns the directory, or None when disabled or
    not writable.
    """
    import os

    setting = os.environ.get("CDSJAX_JAX_CACHE")
    if setting == "0":
        return None
    if directory is None:
        if setting:
            directory = setting
        else:
            from cdsjax.io.index import cache_root

            directory = cache_root() / "jax-compilation"
    directory = Path(directory)
    try:
        from cdsjax.io.private import private_dir

        private_dir(directory)
        max_mb = float(os.environ.get("CDSJAX_JAX_CACHE_MAX_MB") or DEFAULT_JAX_CACHE_MAX_MB)
    except (OSError, ValueError):
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # the selectors and the encoder compile in 0.1-3 s each: cache them all
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _JAX_CACHE.update(directory=directory, max_bytes=int(max_mb * 2**20) if max_mb >= 0 else None)
    prune_compilation_cache()
    return directory


def prune_compilation_cache(directory=None, max_bytes: Optional[int] = None) -> int:
    """Deletes the oldest files (by modification time) of a compilation cache directory until the rest fit
    in ``max_bytes``; returns the bytes freed. Defaults: what :func:`enable_compilation_cache` set (no-op
    when it was not called or set no cap). A file another process is reading may go: JAX then compiles."""
    import os

    directory = directory if directory is not None else _JAX_CACHE.get("directory")
    max_bytes = max_bytes if max_bytes is not None else _JAX_CACHE.get("max_bytes")
    if directory is None or max_bytes is None:
        return 0
    files = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    files.append((st.st_mtime, st.st_size, entry.path))
    except OSError:
        return 0
    total = sum(size for _, size, _ in files)
    freed = 0
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        freed += size
    return freed
