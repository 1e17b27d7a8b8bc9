"""The content-addressed cache of finished documents (:class:`DocCache`), shared by every index and ``ask PDF``.

Its files are written and checked with the helpers of :mod:`cdsjax.io.storefiles`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import List, Optional

import numpy as np

from cdsjax.io.private import make_private, private_dir
from cdsjax.io.util import pid_alive
from cdsjax.io.storefiles import (StoreError, owner_pid, check_crops, crop_hashes, load_npy_checked,
                                  open_inside, read_inside, read_jsonl_checked, save_npy, write_jsonl)


class DocCache:
    """Content-addressed cache of finished documents, shared by every index and by ``ask PDF``.

    One directory per entry, ``<root>/<key[:2]>/<key>/``, where the key hashes the PDF's bytes and every
    setting that changes the result (parser, enrichment, embedder; see ``cdsjax.io.index.stage_keys``)::

        entry.json      what the entry holds, with the sha256 of every other file (written last)
        elements.jsonl  notes.jsonl  embeddings.npy  edges.npy  crops/<sha16>/*.png

    (crops sit where an index keeps them, so note ``image_path``s resolve against the entry directory too).

    An entry is written to a hidden staging directory and renamed into place, so a killed writer leaves
    either a whole entry or none. Reads check every hash; a damaged entry reads as a :class:`StoreError`
    naming the file, and the caller rebuilds it. No link inside the cache is followed, on reads or writes
    (:func:`~cdsjax.io.storefiles.open_inside`): an entry, a folder or a file that is a link is damage.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self._parsed: Optional[dict] = None  # (pdf sha256, parse key) -> entry keys, read once on first need

    def parsed(self, sha: str, parse_key: str) -> Optional[dict]:
        """An intact entry of the same PDF (``sha``) parsed with the same settings (``parse_key``), whatever its
        notes and embedder: what a new notes or embedding version redoes from, without parsing again. None when
        the cache holds none. The entries' ``entry.json`` are read once per :class:`DocCache`; a damaged or
        linked one is passed over."""
        if self._parsed is None:
            self._parsed = {}
            for meta_path in sorted(self.root.glob("??/*/entry.json")):
                if meta_path.is_symlink() or meta_path.parent.is_symlink():
                    continue
                try:
                    meta = json.loads(meta_path.read_text())
                    found = (str(meta["sha256"]), str(meta["keys"]["parse"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                self._parsed.setdefault(found, []).append(meta_path.parent.name)
        for key in self._parsed.get((sha, parse_key), []):
            try:
                entry = self.read(key)
            except StoreError:
                continue
            if entry is not None:
                return entry
        return None

    def _real_dir(self, rel: str) -> None:
        """Raises :class:`StoreError` unless ``root/rel`` is a directory reached without a link."""
        os.close(open_inside(self.root.parent, f"{self.root.name}/{rel}", directory=True))

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def exists(self, key: str) -> bool:
        return (self.path(key) / "entry.json").exists() or self.path(key).exists()

    def read(self, key: str) -> Optional[dict]:
        """The entry for ``key`` (dict with meta, elements, notes, embeddings, edges, crops), or None if absent.

        Raises:
          StoreError: the entry exists but is damaged (the message names the file).
        """
        d = self.path(key)
        if not os.path.lexists(d):
            return None
        meta_path = d / "entry.json"
        try:
            self._real_dir(f"{key[:2]}/{key}")
            meta = json.loads(read_inside(d, "entry.json"))
        except OSError as err:
            raise StoreError(f"{meta_path}: cannot read ({err.strerror or err})") from None
        except ValueError as err:
            raise StoreError(f"{meta_path}: damaged (not valid JSON: {err})") from None
        if not isinstance(meta, dict) or meta.get("key") != key or not isinstance(meta.get("hashes"), dict):
            raise StoreError(f"{meta_path}: damaged (not a cache entry for key {key[:16]})")
        h = meta["hashes"]
        out = dict(meta=meta)
        out["elements"] = read_jsonl_checked(d / "elements.jsonl", h.get("elements"))
        out["notes"] = read_jsonl_checked(d / "notes.jsonl", h.get("notes"))
        out["embeddings"] = load_npy_checked(d / "embeddings.npy", h.get("embeddings"))
        out["edges"] = load_npy_checked(d / "edges.npy", h.get("edges")).reshape(-1, 2)
        bad = check_crops(d, "crops", h.get("crops") or {})
        if bad:
            raise StoreError(bad)
        if len(out["notes"]) != out["embeddings"].shape[0] or len(out["notes"]) != len(out["elements"]):
            raise StoreError(f"{d}: damaged ({len(out['notes'])} notes, {len(out['elements'])} elements, "
                             f"{out['embeddings'].shape[0]} embeddings)")
        out["root"] = d
        return out

    def staging(self) -> Path:
        private_dir(self.root)
        self._real_dir(".")
        path = self.root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir(mode=0o700)
        (path / "crops").mkdir(mode=0o700)
        return path

    def write(self, key: str, staging: Path, *, meta: dict, elements: List[dict], notes: List[dict],
              embeddings: np.ndarray, edges: np.ndarray, replace: bool = False) -> Path:
        """Completes the staged entry (crops already in ``staging/crops``) and renames it into place.

        An intact entry already in place (another process finished the same document first) is kept and
        ours dropped, so a reader of that entry never sees it vanish; ``replace=True`` (an improved entry:
        retried enrichment, OCR) or a damaged one is swapped out.
        """
        staging = Path(staging)
        hashes = dict(
            elements=write_jsonl(staging / "elements.jsonl", elements),
            notes=write_jsonl(staging / "notes.jsonl", notes),
            embeddings=save_npy(staging / "embeddings.npy", np.asarray(embeddings, np.float32)),
            edges=save_npy(staging / "edges.npy", np.asarray(edges, np.int32).reshape(-1, 2)),
            crops=crop_hashes(staging / "crops"),
        )
        meta = dict(meta, key=key, hashes=hashes)
        with open(staging / "entry.json", "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        make_private(staging)
        final = self.path(key)
        private_dir(final.parent)
        self._real_dir(key[:2])  # a planted link there would take the entry elsewhere
        if final.exists() and not replace:
            try:
                self.read(key)
            except StoreError:
                pass
            else:
                shutil.rmtree(staging, ignore_errors=True)
                return final
        if os.path.lexists(final):  # a damaged or outdated entry (or a link planted in its place): aside first
            trash = self.root / f".old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                os.replace(final, trash)
            except OSError:
                trash = None
            if trash is not None and os.path.islink(trash):
                os.unlink(trash)
            elif trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(staging, final)
        except OSError:  # another process committed the same entry meanwhile: theirs is as good as ours
            shutil.rmtree(staging, ignore_errors=True)
        return final

    def discard(self, key: str) -> None:
        shutil.rmtree(self.path(key), ignore_errors=True)

    def clean_staging(self) -> None:
        """Removes staging directories of writers that are gone (a killed run's half-written entry)."""
        if not self.root.is_dir() or self.root.is_symlink():
            return
        for p in self.root.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                pid = owner_pid(p)
                if pid == os.getpid() or not pid_alive(pid):
                    shutil.rmtree(p, ignore_errors=True)
