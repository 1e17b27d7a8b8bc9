"""Issue 63 (items 1, 2, 3, 7, 9): an index, a second index, a planted folder, the cache directory and file
names are data, never a way to the user's files. Every input is crafted here, in tmp_path."""

import json
import os
import shutil
import stat

import pytest

from cdsjax import cli
from cdsjax.io import doccache
from cdsjax.io import storefiles
from cdsjax.io.index import build_index, cache_root, load_index, verify_index
from tests import ingest_pdfs as gen


@pytest.fixture(scope="module")
def pdfs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pdfs")
    return gen.make_synthetic_pdf(d / "synthetic.pdf"), gen.make_text_pdf(d / "plain.pdf", pages=1)


@pytest.fixture(scope="module")
def built(pdfs, config, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "index"
    build_index(list(pdfs), out, config=config)
    return out


def outside_dir(tmp_path):
    """A folder standing for ~/.ssh: one key file, mode 0644, and what must stay as it is."""
    secret = tmp_path / "dot-ssh"
    secret.mkdir()
    key = secret / "id_rsa"
    key.write_bytes(b"-----BEGIN KEY----- not yours")
    os.chmod(key, 0o644)
    return secret


def state_of(folder):
    """Every file under ``folder`` with its bytes, mode, inode and link count (what nobody may change)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        info = os.lstat(p)
        out[str(p.relative_to(folder))] = (p.read_bytes() if p.is_file() else None, stat.S_IMODE(info.st_mode),
                                           info.st_ino, info.st_nlink)
    return out


def one_line(text: str) -> bool:
    return len(str(text).strip().splitlines()) == 1 and "Traceback" not in str(text)


def crop_folder(index, doc_id="synthetic.pdf"):
    manifest = json.loads((index / "manifest.json").read_text())
    entry = next(d for d in manifest["documents"] if d["doc_id"] == doc_id)
    assert entry["hashes"]["crops"], "the synthetic PDF has crops"
    return manifest, entry


# ------------------------------------------------------------------ 1. no link inside an index is followed


def test_linked_crop_folder_is_damage_and_rebuilt_without_touching_its_target(built, config, tmp_path):
    secret = outside_dir(tmp_path)
    before = state_of(secret)
    work = tmp_path / "index"
    shutil.copytree(built, work)
    manifest, entry = crop_folder(work)
    shutil.rmtree(work / entry["crops"])
    os.symlink(secret, work / entry["crops"].rstrip("/"))  # crops/<sha16> -> ~/.ssh
    entry["hashes"]["crops"] = {}  # as an attacker would: nothing recorded to check the folder against
    (work / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(storefiles.StoreError) as refused:  # its notes' crops are not the ones the manifest lists
        load_index(work)
    assert one_line(refused.value)

    summary = verify_index(work, config=config)
    problems = dict(summary.repaired)
    assert "symbolic link" in problems["synthetic.pdf"] and one_line(problems["synthetic.pdf"])
    assert summary.written and not summary.failures
    folder = work / entry["crops"]
    assert not folder.is_symlink() and folder.is_dir()
    assert all(p.is_file() and not p.is_symlink() and os.stat(p).st_nlink == 1 for p in folder.iterdir())
    assert "id_rsa" not in {p.name for p in folder.iterdir()}
    assert state_of(secret) == before, "nothing outside the index is linked, re-moded or written"
    assert len(load_index(work).notes) > 0


def test_index_files_replaced_by_links_are_refused_in_one_line(built, tmp_path):
    secret = outside_dir(tmp_path)
    before = state_of(secret)
    work = tmp_path / "index"
    shutil.copytree(built, work)
    (work / "notes.jsonl").unlink()
    os.symlink(secret / "id_rsa", work / "notes.jsonl")
    with pytest.raises(storefiles.StoreError, match="symbolic link") as refused:
        load_index(work)
    assert one_line(refused.value)
    shutil.rmtree(work / "arrays" )
    os.symlink(secret, work / "arrays")
    with pytest.raises(storefiles.StoreError):
        load_index(work)
    assert state_of(secret) == before


def test_crops_are_copied_from_the_cache_not_hard_linked(built, config):
    _, entry = crop_folder(built)
    for p in (built / entry["crops"]).iterdir():
        assert os.stat(p).st_nlink == 1 and stat.S_IMODE(os.stat(p).st_mode) == 0o600


# ------------------------------------------------------------------ 2. document ids kept apart across indexes


def test_colliding_document_ids_are_refused_naming_both_indexes(built, tmp_path):
    from cdsjax.pipeline import Pipeline, PipelineError

    first, second = tmp_path / "ours", tmp_path / "theirs"
    shutil.copytree(built, first)
    shutil.copytree(built, second)  # a second index holding documents of the same ids (same notes too)
    with pytest.raises(PipelineError) as refused:
        Pipeline.from_paths([str(first), str(second)])
    message = str(refused.value)
    assert one_line(message) and str(first) in message and str(second) in message and "the id 'plain.pdf'" in message


def test_a_note_id_repeated_inside_one_index_is_refused(built, tmp_path):
    from cdsjax.pipeline import Corpus, PipelineError

    corpus = load_index(built)
    corpus.notes[1]["note_id"] = corpus.notes[0]["note_id"]
    with pytest.raises(PipelineError, match="appears twice") as refused:
        Corpus.merge([corpus])
    assert one_line(refused.value)


def test_pdf_and_crop_are_named_with_their_index(built):
    from cdsjax.commands import policy
    from cdsjax.commands.server import document_rows

    pdfs = policy.PdfFiles([str(built)])
    assert pdfs.index_of == {"synthetic.pdf": "index", "plain.pdf": "index"}
    rows = document_rows(load_index(built).notes, pdfs.index_of)
    assert {r["document"]: r["index"] for r in rows} == {"synthetic.pdf": "index", "plain.pdf": "index"}


# ------------------------------------------------------------------ 3. recovery adopts only what it parked


def test_planted_leftover_folder_is_never_adopted(built, pdfs, config, tmp_path):
    planted = tmp_path / ".index.old-999999999-deadbeef"  # named like a dead writer's leftover
    shutil.copytree(built, planted)
    before = state_of(planted)
    with pytest.raises(storefiles.StoreError, match="not a cdsjax index"):
        load_index(tmp_path / "index")
    summary = build_index([pdfs[1]], tmp_path / "index", config=config)
    assert summary.written and summary.added == ["plain.pdf"]
    assert load_index(tmp_path / "index").doc_ids == ["plain.pdf"], "the planted documents were not taken over"
    assert state_of(planted) == before, "the planted folder is left as it was"


# ------------------------------------------------------------------ 7. the cache directory


def test_cache_directory_created_private_and_foreign_ones_refused(tmp_path, monkeypatch, pdfs, capsys):
    fresh = tmp_path / "new" / "cache"
    monkeypatch.setenv("CDSJAX_CACHE", str(fresh))
    assert cache_root() == fresh and stat.S_IMODE(os.stat(fresh).st_mode) == 0o700

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("CDSJAX_CACHE", str(shared))
    with pytest.raises(storefiles.StoreError, match="writable by its group or others") as refused:
        cache_root()
    assert one_line(refused.value)
    out = tmp_path / "idx"
    capsys.readouterr()
    assert cli.main(["index", str(pdfs[1]), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "refusing the cdsjax cache directory" in err
    assert list(shared.iterdir()) == [] and not out.exists(), "nothing written to the refused cache"

    if os.getuid() == 0:  # another user's directory (only root can make one here)
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 4242, 4242)
        monkeypatch.setenv("CDSJAX_CACHE", str(foreign))
        with pytest.raises(storefiles.StoreError, match="owned by uid 4242") as refused:
            cache_root()
        assert one_line(refused.value)


def unpatched_enable_compilation_cache():
    """The command's own ``enable_compilation_cache`` (the suite's conftest replaces it with a no-op), from a
    fresh copy of its module; it is called here only where it refuses, before JAX's settings are touched."""
    import importlib.util

    from cdsjax.io import compilation_cache

    spec = importlib.util.spec_from_file_location("compilation_cache_copy", compilation_cache.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.enable_compilation_cache


def test_links_inside_the_cache_are_not_followed(tmp_path, monkeypatch, capsys):
    enable_compilation_cache = unpatched_enable_compilation_cache()
    secret = outside_dir(tmp_path)
    before = state_of(secret)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CDSJAX_CACHE", str(cache))
    monkeypatch.delenv("CDSJAX_JAX_CACHE", raising=False)
    cache_root().joinpath("docs", "ab").mkdir(parents=True)
    key = "ab" + "0" * 62
    os.symlink(secret, cache / "docs" / "ab" / key)  # a planted entry
    docs = doccache.DocCache(cache / "docs")
    with pytest.raises(storefiles.StoreError, match="symbolic link") as refused:
        docs.read(key)
    assert one_line(refused.value)
    os.symlink(secret, cache / "jax-compilation")  # a swapped-in compilation cache
    capsys.readouterr()
    assert enable_compilation_cache() is None
    err = capsys.readouterr().err
    assert one_line(err) and "symbolic link" in err
    os.symlink(secret, cache / "docs" / "cd")  # a planted shard folder: an entry written there would land outside
    staging = docs.staging()
    with pytest.raises(storefiles.StoreError, match="symbolic link"):
        docs.write("cd" + "1" * 62, staging, meta={}, elements=[], notes=[], embeddings=[[1.0]], edges=[])
    assert state_of(secret) == before


# ------------------------------------------------------------------ 9. odd names, missing files, page limit


def test_odd_names_missing_files_and_the_page_limit(pdfs, config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CDSJAX_CACHE", config.index.cache_dir)
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9\x1b[31mred.pdf")  # not UTF-8, with an escape
    shutil.copy(pdfs[1], odd)
    missing = tmp_path / "gone.pdf"
    out = tmp_path / "idx"
    capsys.readouterr()
    code = cli.main(["index", odd, str(missing), str(pdfs[0]), "--out", str(out), "--no-progress"])
    printed = capsys.readouterr()
    assert code == 1, "a file was missing"
    assert one_line(printed.err) and "gone.pdf" in printed.err
    assert "\x1b" not in printed.out + printed.err
    assert len(load_index(out).doc_ids) == 2, "the odd name and the other PDF are indexed"

    assert cli.main(["index", "--list", str(out)]) == 0
    listed = capsys.readouterr().out
    assert "\x1b" not in listed and "\\x1b[31m" in listed and "caf\ufffd" in listed

    long_pdf = gen.make_text_pdf(tmp_path / "three.pdf", pages=3)  # not in the cache: it would be parsed
    assert cli.main(["index", str(long_pdf), "--out", str(tmp_path / "small"), "--max-pages", "2",
                     "--no-progress"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("three.pdf: PDF has 3 pages, more than the limit of 2 (--max-pages)")
    assert err[1:] == ["cdsjax index: error: no document could be indexed; nothing was written"]


def test_ask_prints_names_and_text_escaped(capsys):
    from cdsjax.commands.ask import emit

    evidence = [dict(rank=1, score=0.5, document="evil\x1b]0;owned\x07.pdf", page=0, kind="text",
                     text="[bold]markup[/bold] \x1b[2J wiped")]
    result = dict(question="q\x1b[1A?", evidence=evidence, answer=None, error=None, warnings=["w\x1b[31m"],
                  reader=None, diagnostics={}, timings={}, selector="cosine", budget=1)
    emit(result, as_json=False)
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\x07" not in printed.out
    assert "[bold]markup" in printed.out
