"""What a client's options can make a process compile and keep (issue 63, item 6): values of the game's array
options (beta, tau) share one compiled selector; every other option's values are entries of the capped
SelectorCache (``--max-compiled``), and a dropped entry's programs (its corpus bound and note block included)
are freed; the traced programs written beside JAX's compilation cache live under its size cap."""

import gc
import weakref

import jax
import numpy as np

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id
from cdsjax.core import registry
from cdsjax.io import compilation_cache
from cdsjax.pipeline.cache import SelectorCache
from tests.test_exported_jit import _picks, _pipeline


def test_a_flood_of_tau_and_beta_values_compiles_one_selector_and_picks_as_a_fixed_value_does():
    pipe, qs = _pipeline(n=16)
    pipe.compiled = SelectorCache(3)
    for i, tau in enumerate(np.linspace(0.0, 0.4, 40)):  # the 40 values
        pipe.select(qs[0], selector="cds-paper", budget=5, options={"tau": float(tau), "beta": 1.0 + i / 40})
    assert len(pipe.compiled) == 1
    entry = next(iter(pipe.compiled.values()))
    assert entry.select.jitted._cache_size() == 1 and entry.corpus_bound.jitted._cache_size() == 1
    assert pipe.is_compiled("cds-paper", 5, {"tau": 0.77, "beta": 2.0}), "a new value does not compile"
    problem = pipe.candidates.problem(qs[1], core.SPECS["cds"])
    for tau, beta in ((0.3, 2.5),):
        got = _picks(pipe.select(qs[1], selector="cds-paper", budget=5, options={"tau": tau, "beta": beta}))
        fixed = jax.jit(registry.make_selector("cds", budget=5, tau=tau, beta=beta))
        want = _picks(fixed(problem, key_from_query_id("")))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[2], want[2])
    assert len(pipe.compiled) == 1


def test_other_option_values_are_counted_and_a_dropped_selector_frees_its_programs():
    pipe, qs = _pipeline(n=16)
    pipe.compiled = SelectorCache(1)
    dropped = []
    for threshold in (1e-6, 2e-6):
        pipe.select(qs[0], selector="cds-paper", budget=4, options={"threshold": threshold})
        entry = pipe.compiled[pipe.selector_key("cds-paper", 4, {"threshold": threshold})]
        assert entry.corpus_block is None  # paper mode solves its dense payoff: it has no note block to build
        dropped.append((weakref.ref(entry.select), weakref.ref(entry.corpus_bound)))
        del entry
    assert len(pipe.compiled) == 1
    gc.collect()
    alive = [[r() is not None for r in refs] for refs in dropped]
    assert alive == [[False] * 2, [True] * 2], "nothing of a dropped selector is kept (its bound included)"


def _fake_jax_entry(directory, name, size, atime):
    (directory / f"{name}-cache").write_bytes(b"x" * size)
    (directory / f"{name}-atime").write_bytes(int(atime).to_bytes(8, "little"))


def test_exported_programs_live_under_the_jax_cache_cap(tmp_path):
    probe = compilation_cache.CompileCache(tmp_path / "probe", max_bytes=-1)
    (tmp_path / "probe").mkdir()
    compilation_cache.ExportedJit(lambda x: x * 2.0, "test:probe", probe)(np.ones(3, np.float32))
    (one,) = (tmp_path / "probe").glob("*" + compilation_cache.EXPORT_SUFFIX)
    size = one.stat().st_size
    cap = int(3.5 * size)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    _fake_jax_entry(cache_dir, "jit_old", size, atime=1)  # JAX's own executable, least recently used
    cache = compilation_cache.CompileCache(cache_dir, max_bytes=cap)
    fn = compilation_cache.ExportedJit(lambda x: x * 2.0, "test:flood", cache)
    for n in range(1, 9):  # a flood of new shapes: a program each
        fn(np.ones(n, np.float32))
        entries = list(cache_dir.glob("*-cache"))
        assert sum(e.stat().st_size for e in entries) <= cap
        assert all(e.with_name(e.name[: -len("-cache")] + "-atime").exists() for e in entries)
    assert not (cache_dir / "jit_old-cache").exists(), "evicted like the programs, least recently used first"
    assert len(list(cache_dir.glob("*" + compilation_cache.EXPORT_SUFFIX))) == 3
    # a cap of 0 writes nothing (as JAX); the files of earlier versions, outside the cap, are removed
    empty = tmp_path / "zero"
    empty.mkdir()
    compilation_cache.ExportedJit(lambda x: x + 1.0, "test:zero", compilation_cache.CompileCache(empty, max_bytes=0))(
        np.ones(2, np.float32))
    assert list(empty.iterdir()) == []
    (cache_dir / "abc.cdsjax-exported").write_bytes(b"old")
    compilation_cache._remove_uncounted_exports(cache_dir)
    assert not (cache_dir / "abc.cdsjax-exported").exists()
