"""Evaluation records: one JSON line per (benchmark, selector, budget, question), read back for
resuming and merging (shared by the runner and the multi-process merge)."""

from __future__ import annotations

import json
import pathlib
from typing import Any, List, Mapping, Tuple


def read_records(path: pathlib.Path) -> List[dict]:
    """Reads a JSONL records file, skipping a torn last line (an interrupted write)."""
    if not path.is_file():
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not valid JSON") from None
    return records


def drop_torn_tail(path: pathlib.Path) -> None:
    """Cuts an unterminated last line (a write interrupted mid-record) so appends start
    on a fresh line."""
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        f.seek(0, 2)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def record_key(r: Mapping[str, Any]) -> Tuple[str, str, int, str]:
    return (r["benchmark"], r["selector"], int(r["budget"]), r["qid"])
