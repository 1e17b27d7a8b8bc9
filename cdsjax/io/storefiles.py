"""The files of an index and of a document-cache entry: hashes, JSON lines, ``.npy`` arrays, crops, checked reads.

The helpers both :mod:`cdsjax.io.store` (the index directory) and :mod:`cdsjax.io.doccache` (the document
cache) write and check their files with; ``store`` re-exports them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, List, Optional

import numpy as np


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed writer nobody has reaped yet (a zombie) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _owner_pid(path: Path) -> int:
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
        data = path.read_bytes()
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
    with open(path, "rb") as f:
        return [hashlib.sha256(line).hexdigest() for line in f]


def save_npy(path: Path, array: np.ndarray) -> str:
    """Writes one array with ``np.save``; returns the file's sha256."""
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
    return sha256_file(path)


def load_npy_checked(path: Path, expected_sha: str) -> np.ndarray:
    path = Path(path)
    try:
        if sha256_file(path) != expected_sha:
            raise StoreError(f"{path}: damaged (content does not match its recorded sha256)")
        return np.load(path, allow_pickle=False)
    except OSError as err:
        raise StoreError(f"{path}: cannot read ({err.strerror or err})") from None
    except ValueError as err:
        raise StoreError(f"{path}: damaged ({' '.join(str(err).split())[:160]})") from None


def crop_hashes(crops_dir: Path) -> dict:
    """``{relative path: sha256}`` of every file under ``crops_dir``."""
    crops_dir = Path(crops_dir)
    if not crops_dir.is_dir():
        return {}
    return {str(p.relative_to(crops_dir)): sha256_file(p) for p in sorted(crops_dir.rglob("*")) if p.is_file()}


def check_crops(crops_dir: Path, expected: dict) -> Optional[str]:
    """None if every crop is present with its hash, else a line naming the first bad file."""
    for name, sha in expected.items():
        crop = Path(crops_dir) / name
        if not crop.is_file():
            return f"{crop}: missing (image crop)"
        if sha256_file(crop) != sha:
            return f"{crop}: damaged (content does not match its recorded sha256)"
    return None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
