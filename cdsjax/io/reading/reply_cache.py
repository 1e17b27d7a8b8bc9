"""A cache of model replies on disk, keyed by a hash of everything that changes a reply.

One append-only JSONL file (``replies.jsonl``): each finished reply is one line ``{"key", "value"}``, written
and flushed as soon as it arrives (under a lock, so the reader's worker threads may share one cache). A run
that is killed loses only the replies still in flight; a torn last line is skipped on reading. A rerun, a
resumed run or another selector that sends the same request finds the reply here and sends nothing.

    cache = ReplyCache(out_dir / "replies")
    key = reply_key(kind="reader", model="m", prompt="v1", question="...", evidence=[...], settings={...})
    cache.get(key)          # None, or the stored dict
    cache.put(key, {...})
    value, cached = cache.get_or_fetch(key, lambda: {...})   # one request per key, even from many threads
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import threading
from typing import Any, Callable, Dict, Optional, Tuple

CACHE_FILE = "replies.jsonl"


def content_hash(text: Any) -> str:
    """Short SHA-256 of a string (or of the JSON of any value)."""
    data = text if isinstance(text, str) else json.dumps(text, sort_keys=True, default=str)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:20]


def file_hash(path: Optional[str]) -> Optional[str]:
    """Short SHA-256 of a file's bytes; None for no path, ``"missing"`` for a path that is not a file."""
    if not path:
        return None
    p = pathlib.Path(path)
    if not p.is_file():
        return "missing"
    return hashlib.sha256(p.read_bytes()).hexdigest()[:20]


def reply_key(**fields: Any) -> str:
    """The SHA-256 of the fields' canonical JSON: two requests share a key exactly when every field agrees."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode("utf-8")).hexdigest()


class ReplyCache:
    """Replies by key, loaded from ``<directory>/replies.jsonl`` and appended to it as they come."""

    def __init__(self, directory: pathlib.Path):
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / CACHE_FILE
        self._lock = threading.Lock()
        self._data: Dict[str, dict] = {}
        self._pending: Dict[str, threading.Event] = {}  # keys whose reply is being fetched now
        from cdsjax.io.private import open_private

        # never through a planted link nor into another user's file (a PrivateFileError, one line)
        fd = open_private(self.path, append=True, own_dir=False)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read()
            if raw and not raw.endswith(b"\n"):  # a write cut short: drop the torn line before appending
                raw = raw[: raw.rfind(b"\n") + 1]
                os.ftruncate(fd, len(raw))
        except BaseException:
            os.close(fd)
            raise
        for line in raw.decode("utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            self._data[entry["key"]] = entry["value"]
        self._file = os.fdopen(fd, "a", encoding="utf-8")

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def get(self, key: str) -> Optional[dict]:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: dict) -> None:
        """Stores ``value`` under ``key`` and writes it to disk at once (one flushed line)."""
        line = json.dumps({"key": key, "value": value}, default=str) + "\n"
        with self._lock:
            self._data[key] = value
            self._file.write(line)
            self._file.flush()

    def get_or_fetch(self, key: str, fetch: Callable[[], dict]) -> Tuple[dict, bool]:
        """``(value, True)`` for a stored key, else ``(fetch(), False)`` with the value stored. One fetch per key
        at a time: a caller that finds the key being fetched by another thread waits for it and takes the stored
        value (or, when that fetch failed, fetches itself). ``fetch``'s exceptions propagate."""
        while True:
            with self._lock:
                if key in self._data:
                    return self._data[key], True
                event = self._pending.get(key)
                owner = event is None
                if owner:
                    event = self._pending[key] = threading.Event()
            if not owner:
                event.wait()
                continue
            try:
                value = fetch()
                self.put(key, value)
                return value, False
            finally:
                with self._lock:
                    self._pending.pop(key, None)
                event.set()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> "ReplyCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
