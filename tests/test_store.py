"""Index store: build/load contract, content-hash caching, atomic writes, the single-PDF cache."""

import hashlib
import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

import cdsjax.io.parse as parse_mod
from cdsjax.io import store, storefiles
from cdsjax.io.index import build_index, default_config, index_pdf, load_index
from tests import ingest_pdfs as gen

NOTE_KEYS = {"note_id", "doc_id", "page", "bbox", "kind", "text", "summary", "keywords", "caption", "image_path",
             "reading_order"}


@pytest.fixture(scope="module")
def pdfs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pdfs")
    return gen.make_synthetic_pdf(d / "synthetic.pdf"), gen.make_text_pdf(d / "plain.pdf", pages=2)


@pytest.fixture(scope="module")
def built(pdfs, config, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "index"
    summary = build_index(list(pdfs), out, config=config)
    return out, summary


class _NoParse:
    """Fails the test if a PDF gets parsed."""

    def __init__(self, monkeypatch, allowed=0):
        self.calls = []
        self.allowed = allowed
        real = parse_mod.parse_pdf

        def spy(path, *a, **k):
            self.calls.append(str(path))
            assert len(self.calls) <= self.allowed, f"unexpected re-parse of {path}"
            return real(path, *a, **k)

        monkeypatch.setattr(parse_mod, "parse_pdf", spy)


def test_build_summary(built):
    out, s = built
    assert s.ok and s.written and s.documents == 2 and s.processed == 2 and s.reused == 0
    assert s.pages == 4
    assert s.elements_by_kind.get("table") == 1 and s.elements_by_kind.get("text", 0) >= 4
    assert sum(s.elements_by_kind.values()) == s.notes
    assert set(s.seconds) >= {"hash", "parse", "notes", "embed", "write"}


def test_load_contract(built, pdfs, config):
    out, s = built
    corpus = load_index(out)
    n = len(corpus.notes)
    assert n == s.notes
    assert corpus.embeddings.dtype == np.float32 and corpus.embeddings.shape == (n, 384)
    np.testing.assert_allclose(np.linalg.norm(corpus.embeddings.astype(np.float64), axis=1), 1.0, atol=1e-5)
    links = corpus.links
    assert links.dtype == np.bool_ and links.shape == (n, n)
    assert (links == links.T).all() and not links.diagonal().any()
    assert int(links.sum()) == 2 * s.links
    docs = np.array([note["doc_id"] for note in corpus.notes])
    assert not (links & (docs[:, None] != docs[None, :])).any(), "no links across documents"
    assert corpus.doc_ids == ["synthetic.pdf", "plain.pdf"]
    for note in corpus.notes:
        assert NOTE_KEYS <= set(note)
        assert note["kind"] in ("text", "figure", "table", "chart")
        assert len(note["bbox"]) == 4 and note["page"] >= 0
        if note["kind"] == "text":
            assert note["image_path"] is None
        else:
            assert os.path.isabs(note["image_path"]) and open(note["image_path"], "rb").read(4) == b"\x89PNG"
    # the embeddings are the notes' embedding texts, encoded with the recorded embedder
    from cdsjax.io.notes import embedding_text

    emb = corpus.make_embedder()
    again = emb.encode_documents([embedding_text(x) for x in corpus.notes], show_progress=False)
    np.testing.assert_allclose(again.astype(np.float64), corpus.embeddings.astype(np.float64), atol=1e-5)
    assert corpus.embedder["model"] == config.embedder.model and corpus.embedder["query_prefix"] == ""
    # manifest: content hashes of the PDFs (checked with hashlib), versions, config
    m = corpus.manifest
    for entry, pdf in zip(m["documents"], pdfs):
        assert entry["sha256"] == hashlib.sha256(pdf.read_bytes()).hexdigest()
    assert m["versions"]["pymupdf"] and m["config"]["ingest"]["chunk_size"] == 3000
    assert m["hashes"]["notes"] == hashlib.sha256((out / "notes.jsonl").read_bytes()).hexdigest()
    assert (out / "arrays").is_dir() and len(corpus.elements()) == n


def test_unchanged_rebuild_is_free(built, pdfs, config, monkeypatch):
    out, _ = built
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    _NoParse(monkeypatch, allowed=0)
    s = build_index(list(pdfs), out, config=config)
    assert s.reused == 2 and s.processed == 0 and not s.written
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_new_document_reuses_the_others(built, pdfs, config, monkeypatch, tmp_path):
    out, _ = built
    work = tmp_path / "index"
    shutil.copytree(out, work)
    old = load_index(work)
    extra = gen.make_text_pdf(tmp_path / "extra.pdf", pages=1, text="A different document about tables. ")
    spy = _NoParse(monkeypatch, allowed=1)
    s = build_index([*pdfs, extra], work, config=config)
    assert spy.calls == [str(extra)]
    assert s.reused == 2 and s.processed == 1 and s.written and s.documents == 3
    new = load_index(work)
    k = len(old.notes)
    np.testing.assert_array_equal(new.embeddings[:k], old.embeddings)
    np.testing.assert_array_equal(new.links[:k, :k], old.links)
    assert [x["note_id"] for x in new.notes[:k]] == [x["note_id"] for x in old.notes]
    assert all(os.path.exists(x["image_path"]) for x in new.notes if x["image_path"])


def test_changed_enrichment_keeps_the_parse(built, pdfs, config, monkeypatch, tmp_path):
    out, _ = built
    work = tmp_path / "index"
    shutil.copytree(out, work)
    cfg = default_config()
    cfg.embedder.show_progress = False
    cfg.index.cache_dir = config.index.cache_dir
    cfg.enrich.window = 3
    _NoParse(monkeypatch, allowed=0)
    s = build_index(list(pdfs), work, config=cfg)
    assert s.written and s.processed == 2
    assert s.links > load_index(out).link_edges.shape[0]


def test_interrupted_write_leaves_previous_index(built, pdfs, config, monkeypatch, tmp_path):
    out, _ = built
    work = tmp_path / "index"
    shutil.copytree(out, work)
    old = load_index(work)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "save_arrays", boom)
    with pytest.raises(KeyboardInterrupt):
        build_index([pdfs[1]], work, config=config, replace=True)  # a different corpus: would rewrite the index
    new = load_index(work)
    assert [x["note_id"] for x in new.notes] == [x["note_id"] for x in old.notes]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"], "no staging directory left behind"


def test_first_build_interrupted_leaves_nothing(pdfs, config, monkeypatch, tmp_path):
    monkeypatch.setattr(store, "write_manifest", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk full")))
    with pytest.raises(RuntimeError):
        build_index([pdfs[1]], tmp_path / "index", config=config)
    assert list(tmp_path.iterdir()) == []


def test_crash_between_renames_is_recovered(built, pdfs, config, monkeypatch, tmp_path):
    out, _ = built
    work = tmp_path / "index"
    shutil.copytree(out, work)
    before = [x["note_id"] for x in load_index(work).notes]
    real_replace = os.replace

    def crash_on_publish(src, dst):  # dies after "index -> .index.old-PID-x", before "staging -> index"
        if ".index.tmp-" in str(src) and str(dst) == str(work.absolute()):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(store.os, "replace", crash_on_publish)
    with pytest.raises(KeyboardInterrupt):
        build_index([pdfs[1]], work, config=config, replace=True)
    monkeypatch.setattr(store.os, "replace", real_replace)
    assert not work.exists() and any(p.name.startswith(".index.old-") for p in tmp_path.iterdir())
    (tmp_path / ".index.tmp-999999999-cafe").mkdir()  # a dead writer's staging directory
    monkeypatch.setenv("CDSJAX_CACHE", config.index.cache_dir)  # where the commit's journal is
    corpus = load_index(work)
    assert [x["note_id"] for x in corpus.notes] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def test_load_errors(built, tmp_path):
    out, _ = built
    with pytest.raises(storefiles.StoreError, match="not a cdsjax index"):
        load_index(tmp_path)
    work = tmp_path / "index"
    shutil.copytree(out, work)
    with open(work / "notes.jsonl", "a") as f:
        f.write(json.dumps({"note_id": "tampered"}) + "\n")
    with pytest.raises(storefiles.StoreError, match=r"notes.jsonl: damaged .*cdsjax index --verify"):
        load_index(work)


def test_refuses_to_replace_a_foreign_directory(pdfs, config, tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(storefiles.StoreError, match="not empty and holds no cdsjax index"):
        build_index([pdfs[1]], tmp_path, config=config)
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_single_pdf_cache(pdfs, config, monkeypatch, tmp_path):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    config = ml_collections.ConfigDict(config.to_dict())
    config.index.cache_dir = ""
    spy = _NoParse(monkeypatch, allowed=1)
    first = index_pdf(pdfs[1], config=config)
    assert first.root.parent == (tmp_path / "cache").absolute()
    assert first.root.name.startswith("plain-")
    second = index_pdf(pdfs[1], config=config)
    assert len(spy.calls) == 1
    assert second.root == first.root and [n["note_id"] for n in second.notes] == [n["note_id"] for n in first.notes]


def test_io_package_import_is_light():
    import subprocess
    import sys

    code = ("import sys, cdsjax.io, cdsjax.io.index, cdsjax.commands.index; "
            "heavy = [m for m in ('torch', 'sentence_transformers', 'pymupdf', 'openai', 'yake') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
