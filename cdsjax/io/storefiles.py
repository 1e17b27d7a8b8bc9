"""The files of an index and of a document-cache entry: hashes, JSON lines, ``.npy`` arrays, crops, checked reads.

The helpers both :mod:`cdsjax.io.store` (the index directory) and :mod:`cdsjax.io.doccache` (the document
cache) write and check their files with; ``store`` re-exports them.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np

from cdsjax.io.util import one_line


class StoreError(Exception):
    """The index directory cannot be read or written (one-line message naming the path)."""


# --------------------------------------------------------------------------- no link inside a directory

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _components(rel) -> List[str]:
    """The components of a relative path below a directory; StoreError for one that is absolute or climbs."""
    text = str(rel)
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith("/") or ".." in parts or "\x00" in text:
        raise StoreError(f"{text[:200]!r}: refusing a path that leaves its directory")
    return parts


def open_inside(root, rel, *, directory: bool = False) -> int:
    """A file descriptor of ``root/rel`` reached without following any symbolic link below ``root``.

    ``root`` is opened as named (the caller's own path may be a link); every component of ``rel`` is then
    opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a link anywhere inside (a crop folder
    made a link to ``~/.ssh``, a planted file) is refused, not followed. The target must be a directory
    (``directory=True``) or a regular file (opened non-blocking, so a FIFO cannot hang the reader).

    Raises:
      FileNotFoundError: a component is missing.
      StoreError: a component is a link, or the target is not a directory / regular file (one line).
    """
    parts = _components(rel)
    where = Path(root).joinpath(*parts) if parts else Path(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            kind = os.O_DIRECTORY if (directory or not last) else os.O_NONBLOCK
            try:
                child = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC | kind, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise StoreError(f"{where}: damaged ({Path(*parts[: i + 1])} is a symbolic link or not a "
                                     "directory; cdsjax follows no link inside an index or cache)") from None
                raise
            os.close(fd)
            fd = child
        mode = os.fstat(fd).st_mode
        if directory and not stat.S_ISDIR(mode):
            raise StoreError(f"{where}: damaged (not a directory)")
        if not directory and not stat.S_ISREG(mode):
            raise StoreError(f"{where}: damaged (not a regular file)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_inside(root, rel) -> bytes:
    """The bytes of the regular file ``root/rel``, reached without following a link (:func:`open_inside`)."""
    fd = open_inside(root, rel)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def files_inside(root, rel=".") -> Dict[str, int]:
    """``{path relative to root/rel: size in bytes}`` of every regular file under ``root/rel``,
    walked without following a link: a link or any other non-file found inside raises :class:`StoreError`."""
    out: Dict[str, int] = {}

    def walk(fd: int, prefix: str) -> None:
        with os.scandir(fd) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                name = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC, dir_fd=fd)
                    try:
                        walk(child, name + "/")
                    finally:
                        os.close(child)
                elif entry.is_file(follow_symlinks=False):
                    out[name] = entry.stat(follow_symlinks=False).st_size
                else:
                    raise StoreError(f"{Path(root) / str(rel) / name}: damaged (a symbolic link or not a regular "
                                     "file; cdsjax follows no link inside an index or cache)")

    fd = open_inside(root, rel, directory=True)
    try:
        walk(fd, "")
    finally:
        os.close(fd)
    return out


def copy_inside(src_root, rel, dst_root) -> None:
    """Copies the regular files under ``src_root/rel`` to ``dst_root/rel`` (created 0700), byte by byte.

    Nothing is hard-linked (a hard link shares its inode, and so its mode, with whatever it points at) and
    no link is followed on either side. A missing ``src_root/rel`` copies nothing."""
    try:
        names = files_inside(src_root, rel)
    except FileNotFoundError:
        return
    for name in names:
        data = read_inside(src_root, f"{rel}/{name}")
        target = Path(dst_root).joinpath(*_components(rel), *_components(name))
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


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
    path = Path(path)
    return [json.loads(line) for line in read_inside(path.parent, path.name).splitlines() if line.strip()]


def owner_pid(path: Path) -> int:
    try:
        return int(path.name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return -1


def rows_digest(rows: Iterable[dict]) -> str:
    """sha256 of rows as :func:`write_jsonl` writes them (so slices of a file can be checked)."""
    h = hashlib.sha256()
    for row in rows:
        h.update((json.dumps(row, ensure_ascii=False) + "\n").encode())
    return h.hexdigest()


def read_jsonl_checked(path: Path, expected_sha: Optional[str] = None) -> List[dict]:
    """Reads a JSONL file, raising :class:`StoreError` naming the file on a hash mismatch or bad line."""
    path = Path(path)
    try:
        data = read_inside(path.parent, path.name)
    except OSError as err:
        raise StoreError(f"{path}: cannot read ({err.strerror or err})") from None
    if expected_sha is not None and hashlib.sha256(data).hexdigest() != expected_sha:
        raise StoreError(f"{path}: damaged (content does not match its recorded sha256)")
    rows = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise StoreError(f"{path}: damaged (line {number} is not valid JSON: {err.msg})") from None
        except RecursionError:
            raise StoreError(f"{path}: damaged (line {number} is nested too deeply)") from None
        if not isinstance(row, dict):
            raise StoreError(f"{path}: damaged (line {number} is not a JSON object)")
        rows.append(row)
    return rows


def jsonl_line_digests(path: Path) -> List[str]:
    """sha256 of each line of a JSONL file (newline included), to check per-document slices."""
    path = Path(path)
    return [hashlib.sha256(line).hexdigest() for line in read_inside(path.parent, path.name).splitlines(True)]


def save_npy(path: Path, array: np.ndarray) -> str:
    """Writes one array with ``np.save``; returns the file's sha256."""
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
    return sha256_file(path)


def load_npy_checked(path: Path, expected_sha: str) -> np.ndarray:
    path = Path(path)
    try:
        data = read_inside(path.parent, path.name)
        if hashlib.sha256(data).hexdigest() != expected_sha:
            raise StoreError(f"{path}: damaged (content does not match its recorded sha256)")
        return np.load(io.BytesIO(data), allow_pickle=False)
    except OSError as err:
        raise StoreError(f"{path}: cannot read ({err.strerror or err})") from None
    except ValueError as err:
        raise StoreError(f"{path}: damaged ({one_line(err, 160)})") from None


def crop_hashes(crops_dir: Path) -> dict:
    """``{relative path: sha256}`` of every file under ``crops_dir`` (walked without following a link: one
    inside raises :class:`StoreError`)."""
    crops_dir = Path(crops_dir)
    try:
        names = files_inside(crops_dir)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {name: sha256_bytes(read_inside(crops_dir, name)) for name in names}


def check_crops(root: Path, under: str, expected: dict) -> Optional[str]:
    """None if ``root/under`` is a real directory holding only regular files and every file in ``expected``
    (``{path relative to root/under: sha256}``) is there with its hash; else a line naming the first bad
    file. No link below ``root`` is followed: a crop folder that is a link is damage."""
    try:
        files_inside(root, under)
    except FileNotFoundError:
        pass
    except StoreError as err:
        return str(err)
    for name, sha in (expected or {}).items():
        crop = Path(root) / under / str(name)
        try:
            data = read_inside(root, f"{under}/{name}")
        except FileNotFoundError:
            return f"{crop}: missing (image crop)"
        except StoreError as err:
            return str(err)
        except OSError as err:
            return f"{crop}: unreadable ({err.strerror or err})"
        if sha256_bytes(data) != sha:
            return f"{crop}: damaged (content does not match its recorded sha256)"
    return None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
