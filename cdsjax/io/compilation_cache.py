"""JAX's persistent compilation cache for the entry points: where it lives and JAX's own cap on its size; and
the traced selectors kept beside it.

:func:`enable_compilation_cache` is called by the commands (``ask``, ``serve``, ``demo``, ``eval``), never by the
library. :class:`ExportedJit` is ``jax.jit`` whose traced and lowered program (:mod:`jax.export`) is kept in
that directory, so that a fresh process neither traces nor lowers a selector it has met before.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import jax

DEFAULT_JAX_CACHE_MAX_MB = 1024
_JAX_CACHE: Dict[str, Any] = {}  # the directory enable_compilation_cache set


def enable_compilation_cache(directory=None) -> Optional[Path]:
    """Turns on JAX's persistent compilation cache (in the cdsjax cache directory by default).

    A fresh ``cdsjax ask`` then loads the question encoder and selector executables from disk instead of
    compiling them. Set ``CDSJAX_JAX_CACHE=0`` to leave JAX's setting alone. The directory is private (0700);
    its size is capped by JAX itself (``jax_compilation_cache_max_size``, least recently used entries evicted
    when a new one is written) at ``CDSJAX_JAX_CACHE_MAX_MB`` megabytes (default 1024; -1: no cap; 0: JAX
    writes nothing), so a server whose clients ask for ever new budgets and options cannot fill the disk.
    Returns the directory, or None when disabled or not writable.
    """
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
        max_bytes = cache_max_bytes(os.environ.get("CDSJAX_JAX_CACHE_MAX_MB"))
        if max_bytes >= 0:
            _date_undated_entries(directory)
    except (OSError, ValueError):
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_compilation_cache_max_size", max_bytes)
    # the selectors and the encoder compile in 0.1-3 s each: cache them all
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _JAX_CACHE.update(directory=directory)
    return directory


def cache_max_bytes(max_mb: Optional[str]) -> int:
    """``CDSJAX_JAX_CACHE_MAX_MB`` (megabytes, a number; empty or None: the default) as the byte count given
    to ``jax_compilation_cache_max_size``; any negative value is -1 (no cap). ValueError when not a number."""
    mb = float(max_mb) if max_mb not in (None, "") else DEFAULT_JAX_CACHE_MAX_MB
    if mb != mb:  # NaN
        raise ValueError(f"CDSJAX_JAX_CACHE_MAX_MB={max_mb!r} is not a size")
    return -1 if mb < 0 else int(mb * 2**20)


def _date_undated_entries(directory: Path) -> None:
    """Gives each executable that JAX wrote without a size cap (``<key>-cache`` with no ``<key>-atime`` beside
    it) the access time JAX's capped cache keeps (its modification time, in nanoseconds, 8 bytes little
    endian): JAX's eviction reads that file for every entry and, where one is missing, fails every later
    write."""
    for entry in directory.glob("*-cache"):
        atime = entry.with_name(entry.name[: -len("-cache")] + "-atime")
        if not atime.exists():
            atime.write_bytes(entry.stat().st_mtime_ns.to_bytes(8, "little"))


EXPORT_SUFFIX = ".cdsjax-exported"
_FINGERPRINT: Dict[str, str] = {}
_REGISTERED: set = set()
_REGISTER_LOCK = threading.Lock()
# the settings that change what a function traces to (beside the shapes and dtypes of its arguments)
_TRACE_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_dtype_promotion",
                   "jax_numpy_rank_promotion", "jax_default_prng_impl", "jax_threefry_partitionable")


class ExportedJit:
    """``jax.jit(fun)``, whose traced and lowered program is kept in the compilation cache directory.

    A fresh ``cdsjax ask`` traces and lowers each selector it runs before JAX's persistent cache can find the
    compiled executable (its key is the lowered program): 1-2 CPU s for a CDS selector with its corpus bound
    and note block, on every run. Here the first call for a signature (the arguments' tree, shapes and dtypes)
    exports the function (:func:`jax.export.export`) and writes the serialized program to
    ``<cache>/<key>.cdsjax-exported``; a later process reads it and calls it (``jax.jit(exported.call)``,
    whose executable the persistent cache holds), without tracing ``fun``. The key is a hash of ``name`` (what
    identifies ``fun``: the caller's selector key), the signature, the JAX version and settings that change a
    trace, and the source of the cdsjax package, so an edited selector is traced afresh.

    Without :func:`enable_compilation_cache` (library use) it is plain ``jax.jit``. A function that cannot be
    exported, a cache file that cannot be read (it is written again) or written, and a tree holding a type
    whose static fields are not plain literals run as plain ``jax.jit``: the answer is the same either way.
    """

    def __init__(self, fun: Callable, name: str):
        self.jitted = jax.jit(fun)
        self.name = str(name)
        self._calls: Dict[tuple, Callable] = {}
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        directory = _JAX_CACHE.get("directory")
        signature = None if directory is None or kwargs else _signature(args)
        if signature is None:  # no cache, or a Python scalar among the leaves: jit's own rules
            return self.jitted(*args, **kwargs)
        return self._call(Path(directory), signature, args)(*args)

    def _call(self, directory: Path, signature: tuple, args) -> Callable:
        call = self._calls.get(signature)
        if call is None:
            with self._lock:
                call = self._calls.get(signature)
                if call is None:
                    call = self._calls[signature] = self._exported(directory, signature, args)
        return call

    def precompile(self, *args) -> bool:
        """Compiles the program for ``args`` without running it and keeps the executable for the calls with
        their signature. Leaves may be ``jax.ShapeDtypeStruct`` (only shapes and dtypes are read), so a selector
        compiles while the arrays it will take (a corpus bound, a note block) are still being computed. Returns
        False where nothing was kept: without :func:`enable_compilation_cache` (plain ``jax.jit``, which compiles
        on its first call) or for arguments whose signature cannot be read."""
        directory = _JAX_CACHE.get("directory")
        signature = None if directory is None else _signature(args)
        if signature is None:
            return False
        call = self._call(Path(directory), signature, args)
        if isinstance(call, jax.stages.Compiled):
            return True
        compiled = call.lower(*args).compile()  # (read from JAX's persistent cache when it holds it)
        with self._lock:
            self._calls[signature] = compiled
        return True

    def _exported(self, directory: Path, signature: tuple, args) -> Callable:
        key = hashlib.sha256(repr((_fingerprint(), self.name, signature)).encode()).hexdigest()[:48]
        path = directory / f"{key}{EXPORT_SUFFIX}"
        _register_flax_types()
        try:
            exported = jax.export.deserialize(bytearray(path.read_bytes()))
            return jax.jit(exported.call)
        except Exception:  # not written yet, damaged, or from a version whose tree types are gone: exported now
            pass
        try:
            exported = jax.export.export(self.jitted)(*args)
            data = exported.serialize()
        except Exception:  # not exportable (or a static field that is not a plain literal): jit as before
            return self.jitted
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)  # whole or not at all
        except OSError:  # (not written: the next process exports it again)
            try:
                tmp.unlink()
            except OSError:
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


def _fingerprint() -> str:
    """A hash of the cdsjax package's source, the JAX versions and the settings that change a trace."""
    if "value" not in _FINGERPRINT:
        digest = hashlib.sha256()
        package = Path(__file__).resolve().parents[1]
        for source in sorted(package.rglob("*.py")):
            digest.update(str(source.relative_to(package)).encode())
            digest.update(source.read_bytes())
        import jaxlib

        digest.update(repr((jax.__version__, jaxlib.__version__)).encode())
        _FINGERPRINT["value"] = digest.hexdigest()
    return hashlib.sha256(repr((_FINGERPRINT["value"], _trace_settings())).encode()).hexdigest()


def _trace_settings() -> tuple:
    return tuple((name, str(getattr(jax.config, name, None))) for name in _TRACE_SETTINGS)


def _register_flax_types() -> None:
    """Registers the flax dataclasses of the loaded cdsjax modules with :mod:`jax.export`'s tree serialization,
    their static fields written as Python literals (a field that is not one makes serialization fail, and the
    function runs as plain jit)."""
    with _REGISTER_LOCK:
        for module_name, module in list(sys.modules.items()):
            if module is None or not (module_name == "cdsjax" or module_name.startswith("cdsjax.")):
                continue
            for value in list(vars(module).values()):
                if (isinstance(value, type) and getattr(value, "_flax_dataclass", False)
                        and value.__module__ == module_name and value not in _REGISTERED):
                    jax.export.register_pytree_node_serialization(
                        value, serialized_name=f"{value.__module__}:{value.__qualname__}",
                        serialize_auxdata=_literal_bytes, deserialize_auxdata=_from_literal_bytes)
                    _REGISTERED.add(value)


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
