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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

import numpy as np

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class StoreError(Exception):
    """The index directory cannot be read or written (one-line message naming the path)."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def write_jsonl(path: Path, rows: Iterable[dict]) -> str:
    """Writes rows as JSON lines; returns the file's sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for row in rows:
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode()
            h.update(line)
            f.write(line)
    return h.hexdigest()


def read_jsonl(path: Path) -> List[dict]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f if line.strip()]


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
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory.absolute(), tree)
        ckpt.wait_until_finished()


def load_arrays(directory: Path) -> Tuple[np.ndarray, np.ndarray]:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:
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
    tmp = directory / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)


def read_manifest(directory: Path) -> Optional[dict]:
    """The manifest of an index directory, or None if there is none (or it is unreadable)."""
    path = Path(directory) / MANIFEST
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format_version") == FORMAT_VERSION else None


# --------------------------------------------------------------------------- atomic directory swap


def _siblings(out_dir: Path, tag: str) -> List[Path]:
    parent = out_dir.parent
    if not parent.is_dir():
        return []
    prefix = f".{out_dir.name}.{tag}-"
    return [p for p in parent.iterdir() if p.name.startswith(prefix)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(path: Path) -> int:
    try:
        return int(path.name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return -1


def recover(out_dir: Path) -> None:
    """Cleans up after an interrupted build: restores a swapped-out index, removes stale staging dirs."""
    out_dir = Path(out_dir)
    for old in _siblings(out_dir, "old"):
        if _pid_alive(_owner_pid(old)) and _owner_pid(old) != os.getpid():
            continue
        if not out_dir.exists() and (old / MANIFEST).exists():
            os.replace(old, out_dir)
        else:
            shutil.rmtree(old, ignore_errors=True)
    for tmp in _siblings(out_dir, "tmp"):
        if not _pid_alive(_owner_pid(tmp)) or _owner_pid(tmp) == os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)


def check_output_dir(out_dir: Path) -> None:
    """Raises :class:`StoreError` unless ``out_dir`` can receive an index."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir():
            raise StoreError(f"{out_dir}: output path exists and is not a directory")
        if read_manifest(out_dir) is None and any(out_dir.iterdir()):
            raise StoreError(f"{out_dir}: output directory is not empty and holds no cdsjax index")
    parent = out_dir.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
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
    path.mkdir(parents=True)
    return path


def commit(staging: Path, out_dir: Path) -> None:
    """Swaps a fully written staging directory in place of ``out_dir``."""
    out_dir = Path(out_dir).absolute()
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
