"""Selectors whose traced program is kept beside the compilation cache (cdsjax.io.compilation_cache.ExportedJit):
a fresh pipeline reads it instead of tracing, with the picks and scores of plain jit; a damaged file is written
again; a changed trace setting or source is another file; without a cache it is plain jit."""

import os

import jax
import numpy as np
import pytest

from cdsjax.io import compilation_cache
from cdsjax.pipeline import Corpus, Pipeline
from tests.test_corpus_block import corpus


def _pipeline(n=40, seed=5, cache=None):
    z, qs, _, pages = corpus(n, n, seed=seed)
    notes = [{"note_id": f"n{i}", "doc_id": "d", "page": int(pages[i]), "kind": "text", "text": "", "bbox": None}
             for i in range(n)]
    return Pipeline(Corpus(embeddings=z, links=np.zeros((n, n), bool), notes=notes,
                           embedder={"model": "all-MiniLM-L6-v2"}, roots=[]), embedder=object(), compiled={},
                    compile_cache=cache), qs


def _picks(sel):
    return np.asarray(sel.indices), np.asarray(sel.scores), np.asarray(sel.selected_valid)


@pytest.mark.slow
@pytest.mark.parametrize("selector", ["cds-learned-pages", "cds-converged"])
def test_a_fresh_pipeline_reads_the_exported_selector_and_picks_the_same(selector, tmp_path, monkeypatch):
    plain_pipe, qs = _pipeline()
    plain = [_picks(plain_pipe.select(q, selector=selector, budget=5)) for q in qs[:3]]

    first, _ = _pipeline(cache=compilation_cache.CompileCache(tmp_path))
    exported = [_picks(first.select(q, selector=selector, budget=5)) for q in qs[:3]]
    files = sorted(tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))
    assert len(files) == 3  # the selector, its corpus bound and its note block

    def no_export(*a, **k):
        raise AssertionError("traced again")

    monkeypatch.setattr(compilation_cache.jax.export, "export", no_export)
    second, _ = _pipeline(cache=compilation_cache.CompileCache(tmp_path))  # (a fresh process's object)
    again = [_picks(second.select(q, selector=selector, budget=5)) for q in qs[:3]]
    fn = second.selector_fn(selector, 5)
    assert fn.select.jitted._cache_size() == 0 and fn.corpus_bound.jitted._cache_size() == 0  # neither ran plain jit
    for a, b, c in zip(plain, exported, again):
        for x, y, z in zip(a, b, c):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, z)


@pytest.mark.slow
@pytest.mark.parametrize("damage", [lambda data: b"not a program", lambda data: data[:-7],
                                    lambda data: data[:40] + bytes([data[40] ^ 1]) + data[41:]])
def test_a_damaged_file_is_exported_again(damage, tmp_path):
    cache = compilation_cache.CompileCache(tmp_path)
    pipe, qs = _pipeline(seed=6, cache=cache)
    want = _picks(pipe.select(qs[0], selector="cds-converged", budget=4))
    files = sorted(tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))
    good = {f: f.read_bytes() for f in files}
    for f in files:
        f.write_bytes(damage(good[f]))
        with pytest.raises(ValueError):
            cache.read(f)
    pipe, _ = _pipeline(seed=6, cache=compilation_cache.CompileCache(tmp_path))
    for x, y in zip(want, _picks(pipe.select(qs[0], selector="cds-converged", budget=4))):
        np.testing.assert_array_equal(x, y)
    for f in files:  # written again, whole
        assert f.read_bytes() != damage(good[f])
        cache.read(f)


def test_settings_versions_and_sources_key_the_file(tmp_path, monkeypatch):
    cache = compilation_cache.CompileCache(tmp_path)
    x = np.ones(3, np.float32)

    def path():
        return cache.path("f", compilation_cache._signature((x,)))

    before = path()
    assert path() == before
    assert compilation_cache.CompileCache(tmp_path).path("g", compilation_cache._signature((x,))) != before
    with jax.default_matmul_precision("highest"):
        assert path() != before  # what changes a trace changes the file's key
    with jax.enable_x64(True):
        assert path() != before
    assert path() == before
    # a cdsjax source file edited (its size or modification time changed): another key in the next process
    source = sorted((compilation_cache.Path(compilation_cache.__file__).parents[1]).rglob("*.py"))[0]
    real_stat = compilation_cache.Path.stat

    def edited(self, *a, **k):
        st = real_stat(self, *a, **k)
        if self == source:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid,
                                   st.st_size + 1, st.st_atime, st.st_mtime, st.st_ctime))
        return st

    monkeypatch.setattr(compilation_cache.Path, "stat", edited)
    assert compilation_cache.CompileCache(tmp_path).path("f", compilation_cache._signature((x,))) != before
    assert path() == before  # (memoised per object: computed once)


def test_a_tree_of_an_unregistered_type_runs_as_plain_jit(tmp_path):
    from flax import struct

    @struct.dataclass
    class Unlisted:
        a: jax.Array

    cache = compilation_cache.CompileCache(tmp_path)
    doubled = compilation_cache.ExportedJit(lambda t: t.a * 2, "test:unlisted", cache)
    np.testing.assert_array_equal(doubled(Unlisted(np.ones(2, np.float32))), [2.0, 2.0])
    assert not list(tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))
    assert doubled.jitted._cache_size() == 1


def test_static_fields_must_be_literals_to_be_written():
    assert compilation_cache._from_literal_bytes(compilation_cache._literal_bytes((1e-7, None, "x", (2, 3)))) \
        == (1e-7, None, "x", (2, 3))
    with pytest.raises(ValueError):
        compilation_cache._literal_bytes((object(),))


@pytest.mark.slow
def test_a_process_tracing_under_x64_and_without_gets_each_program(tmp_path, monkeypatch):
    """The same int32 argument traces to a float32 program without x64 and a float64 one with it, as jit keys
    them: each call gets its own."""
    scaled = compilation_cache.ExportedJit(lambda x: x * 1.5, "test:scaled", compilation_cache.CompileCache(tmp_path))
    x = np.arange(3, dtype=np.int32)
    assert scaled(x).dtype == np.float32
    with jax.enable_x64(True):
        assert scaled(x).dtype == np.float64
    assert scaled(x).dtype == np.float32
    assert len(list(tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))) == 2


def test_precompile_keeps_an_executable_that_later_calls_run_without_compiling(tmp_path, monkeypatch):
    """``cdsjax.pipeline.warmup.precompile`` (what ``ask NEW.pdf`` runs while the notes are embedded): the selector
    compiles against the shapes of its corpus bound and note block while a second thread computes them; the question
    then runs that executable, compiling nothing, and picks what plain jit picks. Without a cache directory nothing
    is compiled ahead."""
    from cdsjax.pipeline.warmup import precompile

    plain_pipe, qs = _pipeline(n=48, seed=8)
    want = _picks(plain_pipe.select(qs[1], selector="cds-learned-pages", budget=5, qid="q"))
    assert not precompile(plain_pipe, qs[0], selector="cds-learned-pages", budget=5)

    pipe, _ = _pipeline(n=48, seed=8, cache=compilation_cache.CompileCache(tmp_path))
    assert precompile(pipe, qs[0], selector="cds-learned-pages", budget=5)
    fn = pipe.selector_fn("cds-learned-pages", 5)
    assert any(isinstance(c, jax.stages.Compiled) for c in fn.select._calls.values())
    assert len(pipe.corpus_arrays) == 1  # the bound and block were computed meanwhile and are kept

    compiles = []

    def listen(name, secs, **kw):
        if name.endswith("backend_compile_duration"):
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        got = _picks(pipe.select(qs[1], selector="cds-learned-pages", budget=5, qid="q"))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []
    for x, y in zip(want, got):
        np.testing.assert_array_equal(x, y)
