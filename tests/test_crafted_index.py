"""Crafted manifests, note rows and arrays (issue 63, item 8): an index made by hand in the test, with every hash
recorded as an attacker would record it, is refused in one line before anything it names is read or allocated
beyond what its manifest's counts allow; the notes per index are capped."""

import hashlib
import json
import os

import numpy as np
import pytest

from cdsjax.io import store, storefiles
from cdsjax.io.index import load_index, schema

DIM = 8


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_index(root, *, notes=None, n=4, arrays_n=None, manifest=None, raw_notes=None, crop=None):
    """A consistent index of ``n`` notes on one 2-page document (hashes recorded for whatever is written):
    ``notes(rows)``/``manifest(m)`` edit the rows/manifest in place, ``raw_notes`` replaces the notes file,
    ``arrays_n`` writes that many embeddings, ``crop`` = (name, size) adds a sparse crop file."""
    root.mkdir(parents=True)
    rows = [dict(note_id=f"d#{i}", doc_id="d.pdf", page=i % 2, bbox=[0, 0, 10, 10], kind="text", text=f"note {i}",
                 reading_order=i) for i in range(n)]
    if notes:
        notes(rows)
    data = raw_notes if raw_notes is not None else "".join(json.dumps(r) + "\n" for r in rows).encode()
    (root / "notes.jsonl").write_bytes(data)
    k = n if arrays_n is None else arrays_n
    emb = np.ones((k, DIM), np.float32) / np.sqrt(DIM)
    edges = np.zeros((0, 2), np.int32)
    store.save_arrays(root / "arrays", emb, edges)
    crops = {}
    if crop is not None:
        (root / "crops" / "d").mkdir(parents=True)
        with open(root / "crops" / "d" / crop[0], "wb") as f:
            f.truncate(crop[1])  # sparse: no disk used, but a read would go through every byte
        crops = {crop[0]: "0" * 64}
        rows[0]["image_path"] = f"crops/d/{crop[0]}"
    m = dict(format_version=store.FORMAT_VERSION, embedder={"model": "all-MiniLM-L6-v2", "normalize": True},
             documents=[dict(doc_id="d.pdf", path="d.pdf", sha256="0" * 64, num_pages=2, num_notes=n,
                             crops="crops/d", hashes=dict(crops=crops))],
             hashes=dict(notes=_sha(data), arrays=store.arrays_digest(emb, edges),
                         array_files=storefiles.crop_hashes(root / "arrays")))
    if crop is not None:  # the note naming the crop (after the notes' hash: rewritten with it)
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        (root / "notes.jsonl").write_bytes(data)
        m["hashes"]["notes"] = _sha(data)
    if manifest:
        manifest(m)
    (root / "manifest.json").write_text(m if isinstance(m, str) else json.dumps(m))
    return root


def _refused(root, *match):
    with pytest.raises(storefiles.StoreError) as err:
        load_index(root)
    text = str(err.value)
    assert "\n" not in text and all(word in text for word in match), text
    return text


def test_a_hand_made_index_loads(tmp_path):
    idx = load_index(make_index(tmp_path / "ok"))
    assert len(idx.notes) == 4 and idx.embeddings.shape == (4, DIM)


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update(documents={"d.pdf": {}}), ["documents is not a list"]),
    (lambda m: m.update(hashes=["x"]), ["hashes is not an object"]),
    (lambda m: m.update(embedder=[1]), ["embedder is not an object"]),
    (lambda m: m["documents"].append(["not", "an", "object"]), ["document 1 is not an object"]),
    (lambda m: m["documents"][0].update(num_pages=None), ["num_pages None"]),
    (lambda m: m["documents"][0].update(num_notes=1e30), ["num_notes 1e+30"]),
    (lambda m: m["documents"][0].update(num_notes="4"), ["num_notes '4'"]),
    (lambda m: m["documents"][0].update(ocr={"pages": [float("inf")]}), ["ocr.pages"]),
    (lambda m: m["documents"][0]["hashes"].update(crops=[1]), ["hashes.crops"]),
])
def test_wrong_types_in_the_manifest_are_one_line(tmp_path, edit, words):
    _refused(make_index(tmp_path / "i", manifest=edit), "manifest.json: damaged", *words)


def test_deeply_nested_json_is_one_line(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    root = make_index(tmp_path / "m", manifest=lambda m: m.update(extra="DEEP"))
    text = (root / "manifest.json").read_text().replace('"DEEP"', deep)
    (root / "manifest.json").write_text(text)
    _refused(root, "manifest.json: damaged (unreadable")
    line = json.dumps(dict(note_id="x", doc_id="d.pdf", page=0, text="t")).replace('"t"', deep) + "\n"
    _refused(make_index(tmp_path / "n", n=1, raw_notes=line.encode()), "notes.jsonl: damaged", "nested too deeply")


@pytest.mark.parametrize("field, value, words", [
    ("page", None, ["page None"]), ("page", float("inf"), ["page inf"]), ("page", 1e30, ["page 1e+30"]),
    ("page", 7, ["page 7 is not a page of its document"]), ("page", True, ["page True"]),
    ("bbox", ["a", 0, 1, 2], ["bbox"]), ("bbox", [0, 0, float("nan"), 1], ["bbox"]), ("bbox", {"x0": 0}, ["bbox"]),
    ("text", {"nested": "object"}, ["text is not a string"]), ("keywords", "k", ["keywords"]),
    ("doc_id", "other.pdf", ["doc_id is not a document"]), ("note_id", None, ["no note_id"]),
])
def test_wrong_types_in_a_note_row_are_one_line(tmp_path, field, value, words):
    _refused(make_index(tmp_path / "i", notes=lambda rows: rows[2].update({field: value})),
             "notes.jsonl: damaged (line 3", *words)


def test_array_shapes_are_checked_against_the_manifest_before_anything_is_restored(tmp_path, monkeypatch):
    def no_restore(*a, **k):
        raise AssertionError("arrays restored (allocated) before their recorded shapes were checked")

    monkeypatch.setattr(store, "load_arrays", no_restore)
    _refused(make_index(tmp_path / "more", arrays_n=64), "arrays: damaged", "embeddings recorded as float32 [64, 8]")
    # a manifest that agrees with the notes file but not with the arrays
    _refused(make_index(tmp_path / "fewer", arrays_n=3), "[3, 8]", "[4, d")


def test_files_larger_than_the_counts_allow_are_refused_before_they_are_read(tmp_path, monkeypatch):
    read = []
    real = storefiles.sha256_file
    monkeypatch.setattr(storefiles, "sha256_file", lambda p: read.append(p) or real(p))
    root = make_index(tmp_path / "crop", crop=("p0001.png", schema.MAX_CROP_BYTES + 1))
    _refused(root, "p0001.png: damaged", "more than", "an image crop")
    assert not [p for p in read if "p0001" in str(p)], "the sparse crop was never hashed"
    monkeypatch.setattr(schema, "MAX_NOTE_BYTES", 64)
    padded = "".join(json.dumps(dict(note_id=f"d#{i}", doc_id="d.pdf", page=0, text="x" * 200)) + "\n"
                     for i in range(4))
    _refused(make_index(tmp_path / "notes", raw_notes=padded.encode()), "notes.jsonl: damaged", "bytes, more than")
    monkeypatch.setattr(schema, "MAX_NOTE_BYTES", 1 << 20)
    monkeypatch.setattr(schema, "ARRAY_OVERHEAD_BYTES", 0)
    root = make_index(tmp_path / "arrays")
    (big,) = [p for p in (root / "arrays").rglob("*") if p.is_file() and p.stat().st_size > 100][:1]
    with open(big, "r+b") as f:
        f.truncate(1 << 30)  # a sparse GB, recorded by its hash below
    m = json.loads((root / "manifest.json").read_text())
    m["hashes"]["array_files"] = {k: ("0" * 64) for k in m["hashes"]["array_files"]}
    (root / "manifest.json").write_text(json.dumps(m))
    read.clear()
    _refused(root, "arrays: damaged", "more than 4 notes' arrays take")
    assert read == [], "no array file hashed"


def test_notes_per_index_are_capped_with_a_clear_message(tmp_path, monkeypatch):
    root = make_index(tmp_path / "i", n=6)
    monkeypatch.setenv("CDSJAX_MAX_NOTES", "5")
    text = _refused(root, "6 notes, more than the 5 an index may hold", "CDSJAX_MAX_NOTES")
    monkeypatch.setenv("CDSJAX_MAX_NOTES", "6")
    index = load_index(root)
    from cdsjax.pipeline import Corpus, PipelineError

    def other_document(rows):  # the same notes under another document id (loading one index twice is refused)
        for r in rows:
            r.update(note_id=r["note_id"].replace("d#", "e#"), doc_id="e.pdf")

    def other_manifest(m):
        m["documents"][0].update(doc_id="e.pdf", path="e.pdf")

    other = load_index(make_index(tmp_path / "j", n=6, notes=other_document, manifest=other_manifest))
    with pytest.raises(PipelineError, match="12 notes, more than the 6"):
        Corpus.merge([index, other])
    assert text.count(str(root)) == 1
