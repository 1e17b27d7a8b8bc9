"""The on-disk index: one directory, written atomically.

Layout of an index directory::

    manifest.json      format/library versions, config, per-document content hashes and stage keys,
                       sha256 of every other file (written last)
    notes.jsonl        one note per line, corpus order (documents in manifest order)
    elements.jsonl     one element per line, same order as the notes
    arrays/            orbax-checkpoint: ``embeddings`` float32 [n, d], ``link_edges`` int32 [E, 2]
    crops/<doc>/*.png  padded crops of visual elements

A build writes into a hidden sibling directory and swaps it in with two
renames, so an interrupted run leaves the previous index (or, between the two
renames, none: :func:`recover` puts the previous one back on the next run).

Indexes and cache entries hold private document text: directories cdsjax creates are 0700 and a committed
index or cache entry is 0700/0600 (:func:`make_private`), whatever the umask.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np

from cdsjax.io.private import make_private, private_dir
from cdsjax.io.storefiles import StoreError, open_inside, owner_pid, read_inside, sha256_json
from cdsjax.io.util import atomic_write, pid_alive

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def _checkpointer():
    """orbax's checkpointer for this process's own files: when several processes are joined by
    ``jax.distributed`` (a multi-process evaluation), each reads and writes its index files alone, with no
    cross-process barrier."""
    import orbax.checkpoint as ocp

    import jax

    if jax.process_count() <= 1:
        return ocp.StandardCheckpointer()
    me = jax.process_index()
    return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"cdsjax-p{me}"))


def save_arrays(directory: Path, embeddings: np.ndarray, link_edges: np.ndarray) -> None:
    """Saves the arrays with orbax-checkpoint (``directory`` must not exist)."""
    import orbax.checkpoint as ocp

    tree = {
        "embeddings": np.ascontiguousarray(embeddings, dtype=np.float32),
        # orbax cannot store a zero-length axis: keep one sentinel row, dropped on load
        "link_edges": np.concatenate([np.full((1, 2), -1, np.int32), np.asarray(link_edges, np.int32).reshape(-1, 2)]),
    }
    if tree["embeddings"].shape[0] == 0:
        raise StoreError("refusing to save an index with no notes")
    with _checkpointer() as ckpt:
        ckpt.save(directory.absolute(), tree)
        ckpt.wait_until_finished()


def load_arrays(directory: Path) -> Tuple[np.ndarray, np.ndarray]:
    import orbax.checkpoint as ocp

    with _checkpointer() as ckpt:
        tree = ckpt.restore(directory.absolute())
    emb = np.asarray(tree["embeddings"], dtype=np.float32)
    edges = np.asarray(tree["link_edges"], dtype=np.int32)[1:]
    return emb, edges


def arrays_digest(embeddings: np.ndarray, link_edges: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(embeddings, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(link_edges, dtype=np.int32).tobytes())
    return h.hexdigest()


def write_manifest(directory: Path, manifest: dict) -> None:
    atomic_write(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True, default=str))


def read_manifest(directory: Path) -> Optional[dict]:
    """The manifest of an index directory, or None if there is none (or it is unreadable)."""
    try:
        manifest = json.loads(read_inside(directory, MANIFEST))
    except (OSError, ValueError, StoreError, RecursionError):  # (deeply nested JSON: RecursionError)
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format_version") == FORMAT_VERSION else None


# --------------------------------------------------------------------------- atomic directory swap


def _siblings(out_dir: Path, tag: str) -> List[Path]:
    parent = out_dir.parent
    if not parent.is_dir():
        return []
    prefix = f".{out_dir.name}.{tag}-"
    return [p for p in parent.iterdir() if p.name.startswith(prefix)]


def _journal_path(journal: Optional[Path], out_dir: Path) -> Path:
    """Where :func:`commit` records the index it parks aside: a file named by the index's absolute path in
    ``journal`` (default ``<cdsjax cache>/swaps``, a directory only this user can write)."""
    if journal is None:
        from cdsjax.io.private import default_cache_dir, private_cache_dir

        journal = private_cache_dir(default_cache_dir()) / "swaps"
    name = hashlib.sha256(os.fsencode(str(Path(out_dir).absolute()))).hexdigest()[:32]
    return Path(journal) / f"{name}.json"


def _read_journal(path: Path) -> dict:
    try:
        record = json.loads(read_inside(path.parent, path.name))
    except (OSError, ValueError, StoreError):
        return {}
    return record if isinstance(record, dict) else {}


def _parked_by_us(old: Path, record: dict, out_dir: Path) -> bool:
    """Whether ``old`` is the very directory a commit of ``out_dir`` parked aside (name, device and inode as
    the journal recorded them), not a folder someone placed beside the index under such a name."""
    try:
        info = os.lstat(old)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and record.get("out") == str(Path(out_dir).absolute())
            and record.get("old") == old.name and record.get("dev") == info.st_dev and record.get("ino") == info.st_ino)


def recover(out_dir: Path, *, journal: Optional[Path] = None) -> None:
    """Cleans up after an interrupted build: restores a swapped-out index, removes stale staging dirs.

    Only a directory that :func:`commit` parked aside, as its journal entry names it (see
    :func:`_journal_path`), is put back or removed: a folder placed beside the index under a leftover's name
    (``.NAME.old-PID-x``) is neither adopted nor touched."""
    out_dir = Path(out_dir)
    olds = _siblings(out_dir, "old")
    if olds:
        path = _journal_path(journal, out_dir)
        record = _read_journal(path)
        for old in olds:
            if not _parked_by_us(old, record, out_dir):
                continue
            if pid_alive(owner_pid(old)) and owner_pid(old) != os.getpid():
                continue
            if not out_dir.exists() and read_manifest(old) is not None:
                os.replace(old, out_dir)
            else:
                shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(path)
    for tmp in _siblings(out_dir, "tmp"):
        if not pid_alive(owner_pid(tmp)) or owner_pid(tmp) == os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)


def index_name(root) -> str:
    """The name an index goes by in answers (an evidence item's ``index``) and in the server's ``/pdf`` and
    ``/crop`` requests: its directory's name."""
    return os.path.basename(str(root).rstrip(os.sep))


def not_an_index(directory: Path) -> str:
    """Why ``directory`` cannot be read as an index: no manifest, or a damaged one (named)."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if manifest.is_file() and (directory / "notes.jsonl").exists():
        return (f"{manifest}: damaged (unreadable, so the index cannot be checked or repaired); rebuild it with "
                f"`cdsjax index PDF... --out {directory} --replace`")
    return f"{directory}: not a cdsjax index (no readable {MANIFEST})"


def check_output_dir(out_dir: Path, *, replace: bool = False) -> None:
    """Raises :class:`StoreError` unless ``out_dir`` can receive an index.

    ``replace=True`` also accepts an index directory whose manifest is damaged (it is rebuilt whole)."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir():
            raise StoreError(f"{out_dir}: output path exists and is not a directory")
        if read_manifest(out_dir) is None and any(out_dir.iterdir()):
            if (out_dir / MANIFEST).is_file() and (out_dir / "notes.jsonl").exists():
                if not replace:
                    raise StoreError(not_an_index(out_dir))
            else:
                raise StoreError(f"{out_dir}: output directory is not empty and holds no cdsjax index")
    parent = out_dir.absolute().parent
    try:
        private_dir(parent)
    except OSError as err:
        raise StoreError(f"{out_dir}: cannot create output directory ({err.strerror or err})") from None
    if not parent.is_dir():
        raise StoreError(f"{out_dir}: parent {parent} is not a directory")
    probe = parent / f".{out_dir.name}.probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise StoreError(f"{out_dir}: output directory is not writable ({err.strerror or err})") from None


def staging_dir(out_dir: Path) -> Path:
    out_dir = Path(out_dir).absolute()
    path = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    private_dir(out_dir.parent)
    path.mkdir(mode=0o700)
    return path


def commit(staging: Path, out_dir: Path, *, journal: Optional[Path] = None) -> None:
    """Swaps a fully written staging directory in place of ``out_dir`` (made private first: 0700/0600).

    The previous index is parked aside as ``.NAME.old-PID-x`` between two renames; its name, device and inode
    are first written to a journal in the user's private cache (:func:`_journal_path`), so that
    :func:`recover` puts back only that directory after a crash between the renames."""
    out_dir = Path(out_dir).absolute()
    make_private(staging)
    old = record = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        info = os.lstat(out_dir)
        record = _journal_path(journal, out_dir)
        private_dir(record.parent)
        os.close(open_inside(record.parent.parent, record.parent.name, directory=True))  # a link there: refused
        atomic_write(record, json.dumps(dict(out=str(out_dir), old=old.name, dev=info.st_dev, ino=info.st_ino)),
                     private=True)
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(record)


# --------------------------------------------------------------------------- writer lock


class LockBusy(StoreError):
    """Another writer holds the index and the caller asked not to wait."""


@contextlib.contextmanager
def writer_lock(out_dir: Path, *, wait: bool = True, on_wait: Optional[Callable[[str], None]] = None):
    """Holds the writer lock of ``out_dir`` (an ``fcntl`` lock on the sibling file ``.<name>.lock``).

    The lock file sits next to the index, not inside it, because a commit swaps the index directory.
    The kernel drops the lock when its holder exits, however it exits (``kill -9`` included).

    Args:
      wait: block until the lock is free; False raises :class:`LockBusy` at once.
      on_wait: called once with a line naming the holder before blocking.
    """
    out_dir = Path(out_dir).absolute()
    path = out_dir.parent / f".{out_dir.name}.lock"
    announced = False
    while True:
        fd = _open_lock(out_dir, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            if not wait:
                os.close(fd)
                raise LockBusy(f"{out_dir}: another cdsjax index run{holder} is writing this index; "
                               f"try again when it has finished (or leave out --no-wait to wait)") from None
            if on_wait is not None and not announced:
                on_wait(f"{out_dir}: waiting for another cdsjax index run{holder} to finish")
                announced = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        # the holder before us removes the file when it is done: a lock on a removed file locks nothing
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)  # still holding the lock, so nobody else holds this file's lock now
        except OSError:
            pass
        os.close(fd)  # releases the lock


def _open_lock(out_dir: Path, path: Path) -> int:
    """The lock file, opened without following a symlink planted in its place (which would make the
    lock's truncation write through to the link's target), and required to be a regular file (mode 0600)."""
    try:
        private_dir(out_dir.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as err:
        why = "it is a symbolic link" if os.path.islink(path) else (err.strerror or str(err))
        raise StoreError(f"{out_dir}: cannot open the lock file {path} ({why}); remove it if no cdsjax "
                         "run is writing this index") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError(f"{out_dir}: the lock file {path} is not a regular file; remove it")
    return fd


def _lock_holder(fd: int) -> str:
    try:
        pid = int(os.pread(fd, 32, 0).decode().strip() or "0")
    except (OSError, ValueError):
        return ""
    return f" (pid {pid})" if pid > 0 else ""


# --------------------------------------------------------------------------- checked reads


def array_shapes(directory: Path) -> dict:
    """``{name: (shape, dtype name)}`` of the arrays of a checkpoint, from its metadata (no array is read)."""
    with _checkpointer() as ckpt:
        meta = ckpt.metadata(Path(directory).absolute())
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    return {name: (tuple(int(x) for x in m.shape), str(np.dtype(m.dtype))) for name, m in dict(tree).items()}


def embedder_digest(info: dict) -> str:
    """sha256 of a manifest's embedder fields (recorded under ``hashes.embedder``)."""
    return sha256_json(info)


def check_embedder_digest(root: Path, manifest: dict) -> None:
    """Raises :class:`StoreError` when the manifest's embedder fields do not match their recorded hash
    (indexes written before the hash was recorded have none and pass; the embedder itself is still checked
    against the models cdsjax accepts when it is loaded)."""
    recorded = (manifest.get("hashes") or {}).get("embedder")
    if recorded is not None and embedder_digest(manifest.get("embedder")) != recorded:
        raise StoreError(f"{Path(root) / MANIFEST}: damaged (its embedder fields do not match their recorded sha256)")

