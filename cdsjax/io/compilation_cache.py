"""JAX's persistent compilation cache for the entry points: where it lives and JAX's own cap on its size; and
the traced selectors kept beside it.

:func:`enable_compilation_cache` is called by the commands (``ask``, ``serve``, ``demo``, ``eval``), never by the
library; it returns the :class:`CompileCache` the command hands to what it builds. :class:`ExportedJit` is
``jax.jit`` whose traced and lowered program (:mod:`jax.export`) is kept in that cache's directory, so that a
fresh process neither traces nor lowers a selector it has met before.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import heapq
import os
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import jax
from cdsjax.io.util import atomic_write

DEFAULT_JAX_CACHE_MAX_MB = 1024


def enable_compilation_cache(directory=None) -> Optional["CompileCache"]:
    """Turns on JAX's persistent compilation cache (in the cdsjax cache directory by default).

    A fresh ``cdsjax ask`` then loads the question encoder and selector executables from disk instead of
    compiling them. ``CDSJAX_JAX_CACHE=DIR`` names the directory for every command (``directory`` included);
    ``CDSJAX_JAX_CACHE=0`` leaves JAX's setting alone. The directory is private (0700);
    its size is capped by JAX itself (``jax_compilation_cache_max_size``, least recently used entries evicted
    when a new one is written) at ``CDSJAX_JAX_CACHE_MAX_MB`` megabytes (default 1024; -1: no cap; 0: JAX
    writes nothing), so a server whose clients ask for ever new budgets and options cannot fill the disk. The
    traced programs :class:`ExportedJit` keeps there are entries of that same cache, under the same cap.
    A directory owned by another user or writable by its group or others, or a link inside the cdsjax cache, is
    refused with one warning line (:func:`cdsjax.io.private.private_cache_dir`) and nothing is cached.
    Returns the :class:`CompileCache` of that directory (for the command to hand to the pipelines it builds),
    or None when disabled, refused or not writable.
    """
    setting = os.environ.get("CDSJAX_JAX_CACHE")
    if setting == "0":
        return None
    from cdsjax.io.storefiles import StoreError

    try:
        if setting:
            directory = setting
        elif directory is None:
            from cdsjax.io.index import cache_root

            directory = cache_root() / "jax-compilation"
        directory = Path(directory)
        from cdsjax.io.private import private_cache_dir

        private_cache_dir(directory)  # another user's, or group/world-writable: refused
        if directory.is_symlink() and not setting:  # a link planted inside the cdsjax cache
            raise StoreError(f"{directory}: refusing a symbolic link inside the cdsjax cache; remove it")
        max_bytes = cache_max_bytes(os.environ.get("CDSJAX_JAX_CACHE_MAX_MB"))
        _remove_uncounted_exports(directory)
        if max_bytes >= 0:
            _date_undated_entries(directory)
    except StoreError as err:
        import sys

        print(f"cdsjax: warning: {err}; compiling without the persistent cache", file=sys.stderr)
        return None
    except (OSError, ValueError):
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_compilation_cache_max_size", max_bytes)
    # the selectors and the encoder compile in 0.1-3 s each: cache them all
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return CompileCache(directory, max_bytes=max_bytes)


def cache_max_bytes(max_mb: Optional[str]) -> int:
    """``CDSJAX_JAX_CACHE_MAX_MB`` (megabytes, a number; empty or None: the default) as the byte count given
    to ``jax_compilation_cache_max_size``; any negative value is -1 (no cap). ValueError when not a number."""
    mb = float(max_mb) if max_mb not in (None, "") else DEFAULT_JAX_CACHE_MAX_MB
    if mb != mb:  # NaN
        raise ValueError(f"CDSJAX_JAX_CACHE_MAX_MB={max_mb!r} is not a size")
    return -1 if mb < 0 else int(mb * 2**20)


def _remove_uncounted_exports(directory: Path) -> None:
    """Removes traced programs written by earlier versions under a name JAX's size cap did not count."""
    for old in directory.glob("*" + _OLD_EXPORT_SUFFIX):
        old.unlink(missing_ok=True)


def _date_undated_entries(directory: Path) -> None:
    """Gives each executable that JAX wrote without a size cap (``<key>-cache`` with no ``<key>-atime`` beside
    it) the access time JAX's capped cache keeps (its modification time, in nanoseconds, 8 bytes little
    endian): JAX's eviction reads that file for every entry and, where one is missing, fails every later
    write."""
    import stat

    for entry in directory.glob("*-cache"):
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode):  # JAX writes no link: one planted here is removed, never followed
            entry.unlink()
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        atime = entry.with_name(entry.name[: -len("-cache")] + "-atime")
        if not os.path.lexists(atime):
            fd = os.open(atime, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(info.st_mtime_ns.to_bytes(8, "little"))


# A traced program is an entry of JAX's capped cache (``<key>-cache`` with its access time in ``<key>-atime``,
# JAX's own layout, jax/_src/lru_cache.py), so JAX's eviction counts and evicts it like its executables, and a
# program written here evicts the least recently used entries, JAX's included, to stay under the same cap.
EXPORT_SUFFIX = ".cdsjax-exported-cache"
_OLD_EXPORT_SUFFIX = ".cdsjax-exported"  # (earlier versions: outside the cap)
_LOCK_TIMEOUT_S = 10.0
_CHECKSUM_BYTES = 32  # an exported file: the sha256 of the serialized program, then the program
# the settings that change what a function traces to (beside the shapes and dtypes of its arguments)
_TRACE_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_dtype_promotion",
                   "jax_numpy_rank_promotion", "jax_default_prng_impl", "jax_threefry_partitionable")
# the types registered with jax.export's process-wide tree serialization, by this module (JAX refuses a second
# registration of a type)
_REGISTERED: set = set()
_REGISTER_LOCK = threading.Lock()


def core_tree_types() -> tuple:
    """The pytree types of cdsjax's core that a selector, its corpus bound or its note block takes or returns
    (problems, payoffs, parameters, results): what :class:`CompileCache` registers by default."""
    from cdsjax.core.games.learned import LearnedParams
    from cdsjax.core.games.payoff import DensePayoff, SharedPayoff
    from cdsjax.core.games.affinity import CDSParams
    from cdsjax.core.solvers.options import SolveOptions
    from cdsjax.core.types import Affinity, BlockProblem, CDSProblem, Selection, SolverResult

    return (CDSProblem, BlockProblem, Affinity, DensePayoff, SharedPayoff, CDSParams, LearnedParams, SolveOptions,
            SolverResult, Selection)


class CompileCache:
    """Where :class:`ExportedJit` keeps traced programs: a directory (JAX's persistent cache directory, as
    :func:`enable_compilation_cache` returns it) and the pytree types their arguments and results may hold.

    A command creates one and hands it to what it builds (``Pipeline(compile_cache=...)``); library code that
    is handed none runs plain ``jax.jit``. ``types`` (default :func:`core_tree_types`) are registered with
    :func:`jax.export.register_pytree_node_serialization` when the first program is written or read, their
    static fields written as Python literals; a tree holding any other type is not exported (plain jit).

    A program's file is an entry of JAX's persistent cache in that directory, under its size cap: ``max_bytes``
    (None: JAX's ``jax_compilation_cache_max_size`` when the program is written; -1: no cap; 0: nothing is
    written). Writing one evicts the least recently used entries (JAX's executables and these programs alike)
    until it fits, under JAX's own lock file; reading one marks it used.

    A program's file is keyed by the caller's name for the function, the arguments' signature, the trace
    settings and :meth:`stamp`: the cdsjax version, the JAX and jaxlib versions, and each cdsjax source file's
    path, size and modification time (stat only, no file read; computed once per object on first use, so a
    process that exports nothing pays nothing). An edited source file therefore gets fresh programs; a file
    touched without a change only costs one export.
    """

    def __init__(self, directory, types: Optional[Sequence[type]] = None, max_bytes: Optional[int] = None):
        self.directory = Path(directory)
        self.types = None if types is None else tuple(types)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self._stamp: Optional[str] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CompileCache({str(self.directory)!r})"

    def stamp(self) -> str:
        """The hash of the installed code that a traced program depends on (see the class)."""
        with self._lock:
            if self._stamp is None:
                import importlib.metadata

                import jaxlib

                try:
                    version = importlib.metadata.version("cdsjax")
                except importlib.metadata.PackageNotFoundError:
                    version = None
                digest = hashlib.sha256(repr((version, jax.__version__, jaxlib.__version__)).encode())
                package = Path(__file__).resolve().parents[1]
                for source in sorted(package.rglob("*.py")):
                    st = source.stat()
                    digest.update(repr((str(source.relative_to(package)), st.st_size, st.st_mtime_ns)).encode())
                self._stamp = digest.hexdigest()
            return self._stamp

    def path(self, name: str, signature: tuple) -> Path:
        """The file of the program of ``name`` for arguments of ``signature`` (:func:`_signature`)."""
        key = hashlib.sha256(repr((self.stamp(), name, signature)).encode()).hexdigest()[:48]
        return self.directory / f"{key}{EXPORT_SUFFIX}"

    def register_types(self) -> None:
        """Registers :attr:`types` (default :func:`core_tree_types`) with :mod:`jax.export` once per process."""
        types = core_tree_types() if self.types is None else self.types
        with _REGISTER_LOCK:
            for value in types:
                if value not in _REGISTERED:
                    jax.export.register_pytree_node_serialization(
                        value, serialized_name=f"{value.__module__}:{value.__qualname__}",
                        serialize_auxdata=_literal_bytes, deserialize_auxdata=_from_literal_bytes)
                    _REGISTERED.add(value)

    def read(self, path: Path):
        """The exported program in ``path``; OSError when absent or unreadable, ValueError when damaged (its
        checksum does not match) or holding a tree type that is not registered."""
        data = path.read_bytes()
        program = data[_CHECKSUM_BYTES:]
        if len(data) <= _CHECKSUM_BYTES or hashlib.sha256(program).digest() != data[:_CHECKSUM_BYTES]:
            raise ValueError(f"{path}: damaged")
        try:  # used now: the last to be evicted
            _atime_path(path).write_bytes(time.time_ns().to_bytes(8, "little"))
        except OSError:
            pass
        self.register_types()
        return jax.export.deserialize(bytearray(program))

    def limit(self) -> int:
        """The cap in bytes on the directory's cache entries (-1: none)."""
        if self.max_bytes is not None:
            return self.max_bytes
        return int(getattr(jax.config, "jax_compilation_cache_max_size", -1))

    def write(self, path: Path, program: bytes) -> None:
        """Writes a serialized program to ``path`` with its checksum, whole or not at all, evicting the least
        recently used entries of the directory's cache so that all of them stay under :meth:`limit`; nothing
        is written when the cap is 0 or smaller than the program. OSError when not written."""
        data = hashlib.sha256(program).digest() + program
        limit = self.limit()
        if limit == 0 or 0 < limit < len(data):
            return
        with _directory_lock(self.directory, limit >= 0):
            if limit > 0:
                _evict(self.directory, limit - len(data))
            # the access time first: JAX's eviction reads it for every entry it lists
            _atime_path(path).write_bytes(time.time_ns().to_bytes(8, "little"))
            try:
                atomic_write(path, data)
            except OSError:
                _atime_path(path).unlink(missing_ok=True)
                raise


def _atime_path(path: Path) -> Path:
    return path.with_name(path.name[: -len("-cache")] + "-atime")


@contextlib.contextmanager
def _directory_lock(directory: Path, locked: bool):
    """JAX's lock file of a capped cache directory (``.lockfile``, the ``flock`` JAX's ``filelock`` takes), held
    while entries are evicted and written, opened without following a link
    (:func:`cdsjax.io.private.private_lock`); OSError when it cannot be had in time or is not the user's own."""
    if not locked:
        yield
        return
    from cdsjax.io.private import private_lock

    with private_lock(directory / ".lockfile", timeout=_LOCK_TIMEOUT_S):
        yield


def _evict(directory: Path, target: int) -> None:
    """Removes the least recently used ``*-cache`` entries of ``directory`` (JAX's and the traced programs,
    each with its access-time file) until they hold at most ``target`` bytes, as JAX's own eviction does."""
    entries, total = [], 0
    for entry in directory.glob("*-cache"):
        try:
            size = entry.stat().st_size
        except OSError:
            continue
        atime = _atime_path(entry)
        try:
            stamp = int.from_bytes(atime.read_bytes(), "little")
        except OSError:
            stamp = 0
        total += size
        entries.append((stamp, entry.name, size))
    heapq.heapify(entries)
    while total > target and entries:
        _, name, size = heapq.heappop(entries)
        for victim in (directory / name, _atime_path(directory / name)):
            try:
                victim.unlink()
            except OSError:
                pass
        total -= size


class ExportedJit:
    """``jax.jit(fun)``, whose traced and lowered program is kept by a :class:`CompileCache`.

    A fresh ``cdsjax ask`` traces and lowers each selector it runs before JAX's persistent cache can find the
    compiled executable (its key is the lowered program). Here the first call for a signature (the arguments'
    tree, shapes and dtypes) exports the function (:func:`jax.export.export`) and writes the serialized program
    to the cache's directory (:meth:`CompileCache.path`, keyed by ``name``, what identifies ``fun``: the
    caller's selector key); a later process reads it and calls it (``jax.jit(exported.call)``, whose executable
    the persistent cache holds), without tracing ``fun``.

    With ``cache=None`` it is plain ``jax.jit``. A cache file that is missing or damaged is exported and written
    again; one that cannot be written is not (the next process exports again). A function whose program cannot
    be serialized (a tree type the cache does not register, a static field that is not a plain literal, a host
    callback) runs as plain ``jax.jit``: the answer is the same either way.
    """

    def __init__(self, fun: Callable, name: str, cache: Optional[CompileCache] = None):
        self.jitted = jax.jit(fun)
        self.name = str(name)
        self.cache = cache
        self._calls: Dict[tuple, Callable] = {}
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        signature = None if self.cache is None or kwargs else _signature(args)
        if signature is None:  # no cache, or a Python scalar among the leaves: jit's own rules
            return self.jitted(*args, **kwargs)
        return self._call(signature, args)(*args)

    def _call(self, signature: tuple, args) -> Callable:
        call = self._calls.get(signature)
        if call is None:
            with self._lock:
                call = self._calls.get(signature)
                if call is None:
                    call = self._calls[signature] = self._exported(signature, args)
        return call

    def precompile(self, *args) -> bool:
        """Compiles the program for ``args`` without running it and keeps the executable for the calls with
        their signature. Leaves may be ``jax.ShapeDtypeStruct`` (only shapes and dtypes are read), so a selector
        compiles while the arrays it will take (a corpus bound, a note block) are still being computed. Returns
        False where nothing was kept: without a cache (plain ``jax.jit``, which compiles on its first call) or
        for arguments whose signature cannot be read."""
        signature = None if self.cache is None else _signature(args)
        if signature is None:
            return False
        call = self._call(signature, args)
        if isinstance(call, jax.stages.Compiled):
            return True
        compiled = call.lower(*args).compile()  # (read from JAX's persistent cache when it holds it)
        with self._lock:
            self._calls[signature] = compiled
        return True

    def _exported(self, signature: tuple, args) -> Callable:
        path = self.cache.path(self.name, signature)
        try:
            return jax.jit(self.cache.read(path).call)
        except (OSError, ValueError):  # not written yet, damaged, or holding a type no longer registered
            pass
        self.cache.register_types()
        try:
            exported = jax.export.export(self.jitted)(*args)
            data = exported.serialize()
        except (ValueError, NotImplementedError):  # an unregistered tree type, a non-literal static field, a
            return self.jitted  # callback, a custom call without a stable ABI: jit as before (and its errors)
        try:
            self.cache.write(path, bytes(data))
        except OSError:  # (not written: the next process exports it again)
            pass
        return jax.jit(exported.call)


def _signature(args) -> Optional[tuple]:
    """What keys a program of ``args`` beside the function: the tree, each leaf's shape, dtype and weak type,
    and the trace settings (a process may trace under x64 and without, as jit keys them); None when a leaf is
    a Python scalar (jit's own rules then)."""
    leaves, tree = jax.tree.flatten(args)
    try:
        return (str(tree), tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)))
                                 for x in leaves), _trace_settings())
    except AttributeError:
        return None


def _trace_settings() -> tuple:
    return tuple((name, str(getattr(jax.config, name, None))) for name in _TRACE_SETTINGS)


def _literal_bytes(aux) -> bytes:
    text = repr(aux)
    try:
        same = ast.literal_eval(text) == aux
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        same = False
    if not same:
        raise ValueError(f"static fields {text[:200]} are not plain literals")
    return text.encode()


def _from_literal_bytes(data: bytes):
    return ast.literal_eval(bytes(data).decode())
