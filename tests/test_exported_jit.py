"""Selectors whose traced program is kept beside the compilation cache (cdsjax.io.compilation_cache.ExportedJit):
a fresh pipeline reads it instead of tracing, with the picks and scores of plain jit; a damaged file is written
again; a changed trace setting or source is another file."""

import jax
import numpy as np
import pytest

from cdsjax.io import compilation_cache
from cdsjax.pipeline import Corpus, Pipeline
from tests.test_corpus_block import corpus


def _pipeline(n=40, seed=5):
    z, qs, _, pages = corpus(n, n, seed=seed)
    notes = [{"note_id": f"n{i}", "doc_id": "d", "page": int(pages[i]), "kind": "text", "text": "", "bbox": None}
             for i in range(n)]
    return Pipeline(Corpus(embeddings=z, links=np.zeros((n, n), bool), notes=notes,
                           embedder={"model": "all-MiniLM-L6-v2"}, roots=[]), embedder=object(), compiled={}), qs


def _picks(sel):
    return np.asarray(sel.indices), np.asarray(sel.scores), np.asarray(sel.selected_valid)


@pytest.mark.parametrize("selector", ["cds-learned-pages", "cds-converged"])
def test_a_fresh_pipeline_reads_the_exported_selector_and_picks_the_same(selector, tmp_path, monkeypatch):
    monkeypatch.setitem(compilation_cache._JAX_CACHE, "directory", None)
    plain_pipe, qs = _pipeline()
    plain = [_picks(plain_pipe.select(q, selector=selector, budget=5)) for q in qs[:3]]

    monkeypatch.setitem(compilation_cache._JAX_CACHE, "directory", tmp_path)
    first, _ = _pipeline()
    exported = [_picks(first.select(q, selector=selector, budget=5)) for q in qs[:3]]
    files = sorted(tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))
    assert len(files) == 3  # the selector, its corpus bound and its note block

    def no_export(*a, **k):
        raise AssertionError("traced again")

    monkeypatch.setattr(compilation_cache.jax.export, "export", no_export)
    second, _ = _pipeline()
    again = [_picks(second.select(q, selector=selector, budget=5)) for q in qs[:3]]
    fn = second.selector_fn(selector, 5)
    assert fn.jitted._cache_size() == 0 and fn.corpus_bound.jitted._cache_size() == 0  # neither ran plain jit
    for a, b, c in zip(plain, exported, again):
        for x, y, z in zip(a, b, c):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, z)


def test_a_damaged_file_is_exported_again_and_settings_key_the_file(tmp_path, monkeypatch):
    monkeypatch.setitem(compilation_cache._JAX_CACHE, "directory", tmp_path)
    pipe, qs = _pipeline(seed=6)
    want = _picks(pipe.select(qs[0], selector="cds-converged", budget=4))
    for f in tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX):
        f.write_bytes(b"not a program")
    pipe, _ = _pipeline(seed=6)
    for x, y in zip(want, _picks(pipe.select(qs[0], selector="cds-converged", budget=4))):
        np.testing.assert_array_equal(x, y)
    assert all(f.read_bytes() != b"not a program" for f in tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))
    before = compilation_cache._fingerprint()
    with jax.default_matmul_precision("highest"):
        assert compilation_cache._fingerprint() != before  # what changes a trace changes the file's key
    with jax.enable_x64(True):
        assert compilation_cache._fingerprint() != before
    assert compilation_cache._fingerprint() == before
    monkeypatch.setitem(compilation_cache._FINGERPRINT, "value", "edited source")
    assert compilation_cache._fingerprint() != before


def test_static_fields_must_be_literals_to_be_written():
    assert compilation_cache._from_literal_bytes(compilation_cache._literal_bytes((1e-7, None, "x", (2, 3)))) \
        == (1e-7, None, "x", (2, 3))
    with pytest.raises(ValueError):
        compilation_cache._literal_bytes((object(),))


def test_a_process_tracing_under_x64_and_without_gets_each_program(tmp_path, monkeypatch):
    """The same int32 argument traces to a float32 program without x64 and a float64 one with it, as jit keys
    them: each call gets its own."""
    monkeypatch.setitem(compilation_cache._JAX_CACHE, "directory", tmp_path)
    scaled = compilation_cache.ExportedJit(lambda x: x * 1.5, "test:scaled")
    x = np.arange(3, dtype=np.int32)
    assert scaled(x).dtype == np.float32
    with jax.enable_x64(True):
        assert scaled(x).dtype == np.float64
    assert scaled(x).dtype == np.float32
    assert len(list(tmp_path.glob("*" + compilation_cache.EXPORT_SUFFIX))) == 2


def test_precompile_keeps_an_executable_that_later_calls_run_without_compiling(tmp_path, monkeypatch):
    """``cdsjax.warmup.precompile`` (what ``ask NEW.pdf`` runs while the notes are embedded): the selector compiles
    against the shapes of its corpus bound and note block while a second thread computes them; the question then
    runs that executable, compiling nothing, and picks what plain jit picks. Without a cache directory nothing is
    compiled ahead."""
    from cdsjax.warmup import precompile

    monkeypatch.setitem(compilation_cache._JAX_CACHE, "directory", None)
    plain_pipe, qs = _pipeline(n=48, seed=8)
    want = _picks(plain_pipe.select(qs[1], selector="cds-learned-pages", budget=5, qid="q"))
    assert not precompile(plain_pipe, qs[0], selector="cds-learned-pages", budget=5)

    monkeypatch.setitem(compilation_cache._JAX_CACHE, "directory", tmp_path)
    pipe, _ = _pipeline(n=48, seed=8)
    assert precompile(pipe, qs[0], selector="cds-learned-pages", budget=5)
    fn = pipe.selector_fn("cds-learned-pages", 5)
    assert any(isinstance(c, jax.stages.Compiled) for c in fn._calls.values())
    assert len(pipe._bounds) == 1  # the bound and block were computed meanwhile and are kept

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
