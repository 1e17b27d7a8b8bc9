"""The index already in the output directory: its documents, checked against their hashes, reused or repaired."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Optional

import numpy as np

from cdsjax.io import store, storefiles
from cdsjax.io.index import schema
from cdsjax.io.index.context import Doc
from cdsjax.io.index.keys import array_digest

_SHA256 = re.compile(r"[0-9a-f]{64}")


class PreviousIndex:
    """The index already in ``out_dir``: its documents, each checked against its recorded hashes."""

    def __init__(self, root: Path, manifest: dict):
        self.root = root
        self.manifest = manifest
        self.damaged = False
        self._loaded = False

    @classmethod
    def open(cls, root: Path) -> Optional["PreviousIndex"]:
        """The index in ``root``, or None when there is none (or its manifest lists no documents)."""
        manifest = store.read_manifest(root)
        if manifest is None or not isinstance(manifest.get("documents"), list):
            return None
        return cls(root, manifest)

    def documents(self) -> List[dict]:
        return list(self.manifest["documents"])

    def entry(self, doc_id: str) -> dict:
        return next(e for e in self.manifest["documents"] if e["doc_id"] == doc_id)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        root = self.root
        self.line_digests = self.notes_rows = self.element_lines = None
        self.problems = {}
        try:  # read through the index's own descriptor: a file replaced by a link is damage, not followed
            self.note_lines = storefiles.read_inside(root, "notes.jsonl").splitlines(keepends=True)
        except OSError as err:
            self.note_lines, self.problems["notes"] = None, f"{root / 'notes.jsonl'} is unreadable ({err.strerror})"
        except storefiles.StoreError as err:
            self.note_lines, self.problems["notes"] = None, str(err)
        try:
            self.element_lines = storefiles.read_inside(root, "elements.jsonl").splitlines(keepends=True)
        except OSError as err:
            self.problems["elements"] = f"{root / 'elements.jsonl'} is unreadable ({err.strerror})"
        except storefiles.StoreError as err:
            self.problems["elements"] = str(err)
        try:
            self.arrays = schema.load_arrays_checked(root / "arrays", self.manifest.get("hashes", {}).get("array_files"))
            if store.arrays_digest(*self.arrays) != self.manifest.get("hashes", {}).get("arrays"):
                self.problems["arrays"] = f"{root / 'arrays'} does not match its recorded hash"
                self.arrays_ok = False
            else:
                self.arrays_ok = True
        except storefiles.StoreError as err:
            self.arrays, self.arrays_ok = None, False
            self.problems["arrays"] = str(err)
        self.whole_ok = {
            "notes": self.note_lines is not None and storefiles.sha256_bytes(b"".join(self.note_lines))
            == self.manifest.get("hashes", {}).get("notes"),
            "elements": self.element_lines is not None and storefiles.sha256_bytes(b"".join(self.element_lines))
            == self.manifest.get("hashes", {}).get("elements"),
        }

    def check(self, doc: Doc) -> Optional[str]:
        """None when the index's copy of ``doc`` is intact, else a line saying what is wrong."""
        self._load()
        problem = self._check(self.entry(doc.doc_id))
        if problem is not None:
            self.damaged = True
        return problem

    def _check(self, entry: dict) -> Optional[str]:
        start, count = entry["note_start"], entry["num_notes"]
        h = entry.get("hashes")
        root = self.root
        # the crop folder is named by the content hash: anything else (a path that climbs out) is a crafted entry
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha) or entry.get("crops") != f"crops/{sha[:16]}/":
            return f"{root / store.MANIFEST}: this document's sha256 or crop folder is not one cdsjax writes"
        # a crop folder that is a link (to ~/.ssh, say), or holds one, is damage: rebuilt, never followed
        bad = storefiles.check_crops(root, entry["crops"], (h or {}).get("crops") or {})
        if bad:
            return bad
        for name, lines in (("notes", self.note_lines), ("elements", self.element_lines)):
            if lines is None:
                return self.problems[name]
            piece = lines[start : start + count]
            if h is None:  # an index written before per-document hashes: the whole file must match
                if not self.whole_ok[name]:
                    return f"{root / (name + '.jsonl')} does not match its recorded hash"
                continue
            if len(piece) != count or storefiles.sha256_bytes(b"".join(piece)) != h[name]:
                return f"{root / (name + '.jsonl')}: this document's lines are damaged or missing"
        if self.arrays is None:
            return self.problems["arrays"]
        emb, edges = self.arrays
        if emb.shape[0] < start + count:
            return f"{root / 'arrays'}: too few embeddings"
        if h is None:
            if not self.arrays_ok:
                return self.problems["arrays"]
        else:
            sel = (edges[:, 0] >= start) & (edges[:, 0] < start + count)
            if array_digest(np.ascontiguousarray(emb[start : start + count], np.float32)) != h["embeddings"] or \
                    array_digest(np.ascontiguousarray(edges[sel] - start, np.int32)) != h["edges"]:
                return f"{root / 'arrays'}: this document's embeddings or links do not match their hashes"
        return None

    def fill(self, doc: Doc) -> None:
        """Takes ``doc``'s rows, embeddings and links from this index (after :meth:`check` passed)."""
        entry = self.entry(doc.doc_id)
        start, count = entry["note_start"], entry["num_notes"]
        doc.num_pages = entry["num_pages"]
        doc.ocr = entry.get("ocr") or {}
        doc.enrichment = entry.get("enrichment") or {}
        doc.notes = [json.loads(line) for line in self.note_lines[start : start + count]]
        doc.elements = [json.loads(line) for line in self.element_lines[start : start + count]]
        emb, edges = self.arrays
        sel = (edges[:, 0] >= start) & (edges[:, 0] < start + count)
        doc.edges = edges[sel] - start
        doc.embeddings = emb[start : start + count]
        doc.crop_root = self.root
        doc.rename_rows()
