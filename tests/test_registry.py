"""The selector registry: names, options, and one calling convention for every selector."""

import jax
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id, select_cosine, select_dpp, select_mmr, select_ppr, select_random
from cdsjax.core.compat import cds_peel, cds_select, cds_support
from cdsjax.core.registry import SELECTORS
from cdsjax.core.types import MAX_STEPS
from tests.conftest import on_arrays
from cdsjax.core import registry


def problem(seed, n=20, d=6, m=None):
    rng = np.random.default_rng(seed)
    notes = rng.normal(size=(n, d))
    notes /= np.linalg.norm(notes, axis=1, keepdims=True)
    query = rng.normal(size=(d,) if m is None else (m, d))
    query /= np.linalg.norm(query, axis=-1, keepdims=True)
    links = rng.random((n, n)) < 0.15
    return notes, query, links


def same_selection(a, b):
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.selected_valid, b.selected_valid)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-10, atol=1e-12)


def test_registry_names():
    assert set(SELECTORS) == {"cosine", "random", "mmr", "dpp", "ppr", "subgraph", "cds", "cds_converged",
                                   "cds_inimdyn", "cds_support", "cds_learned", "cosine_pages", "mmr_pages",
                                   "dpp_pages", "cds_learned_pages"}


# (registry name, options, the same selection called on the core directly). Each option is one
# that changes the result on these problems, so an option that does not reach the core fails.
FORWARDING = [
    ("cosine", {}, lambda z, q, v, l, k: select_cosine(z, q, v, budget=5)),
    ("random", {}, lambda z, q, v, l, k: select_random(v, budget=5, key=k)),
    ("mmr", dict(lam=0.2), lambda z, q, v, l, k: select_mmr(z, q, v, budget=5, lam=0.2)),
    ("dpp", dict(theta=2.0, quality="relu"),
     lambda z, q, v, l, k: select_dpp(z, q, v, budget=5, theta=2.0, quality="relu")),
    ("ppr", dict(damping=0.5, temperature=0.2),
     lambda z, q, v, l, k: select_ppr(l, z, q, v, budget=5, damping=0.5, temperature=0.2)),
    ("cds", dict(beta=0.05, tau=0.1, init="diffusion", prior_temperature=0.2, max_iter=150),
     lambda z, q, v, l, k: cds_select(
         z, q, v, budget=5, params=core.CDSParams(beta=0.05, tau=0.1), links=l,
         options=core.SolveOptions(init="diffusion", prior_temperature=0.2, max_iter=150))),
    ("cds", dict(peel=True, coupling="similarity", fill=False),
     lambda z, q, v, l, k: cds_peel(z, q, v, budget=5, params=core.CDSParams(coupling="similarity"),
                                         fill=False)),
    ("cds_converged", dict(beta=0.02, threshold=1e-3),
     lambda z, q, v, l, k: cds_select(z, q, v, budget=5, params=core.CDSParams(beta=0.02), solver=core.ActiveSet(),
                                           threshold=1e-3)),
    ("cds_inimdyn", dict(beta=0.02),
     lambda z, q, v, l, k: cds_select(z, q, v, budget=5, params=core.CDSParams(beta=0.02), solver=core.InImDyn())),
    ("cds_support", dict(tau=0.1, num_steps=7, scale_range=(0.01, 100), threshold=0.03, fill=False),
     lambda z, q, v, l, k: cds_support(z, q, v, budget=5, params=core.CDSParams(tau=0.1), num_steps=7,
                                            scale_range=(0.01, 100.0), threshold=0.03, fill=False,
                                            solver=core.ActiveSet())),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,options,call", FORWARDING)
def test_options_reach_the_core_function(name, options, call):
    notes, query, links = problem(3, m=2)
    valid = np.ones(20, bool)
    key = key_from_query_id("q3")
    got = on_arrays(core.make_selector(name, budget=5, **options))(notes, query, valid, links, key)
    want = call(notes, query, valid, links, key)
    same_selection(got, want)
    default = on_arrays(core.make_selector(name, budget=5))(notes, query, valid, links, key)
    if options:  # the options change the selection, so they were not dropped on the way
        assert not (np.array_equal(default.indices, want.indices) and np.allclose(default.scores, want.scores))


@pytest.mark.slow  # tests/test_conformance.py checks jit, vmap and padding for every selector by default
@pytest.mark.x64
@pytest.mark.parametrize("name", ["cosine", "random", "mmr", "dpp", "ppr", "cds", "cds_support"])
def test_uniform_signature_jits_and_vmaps(name):
    """Every selector runs as jit(vmap(fn)) over padded problems and multi-row queries."""
    options = {"cds": {"max_iter": 100}, "cds_support": {"num_steps": 6}}.get(name, {})
    fn = on_arrays(core.make_selector(name, budget=4, **options))
    sizes = [16, 11, 3]
    batch = [problem(10 + i, n=16, m=2) for i in range(3)]
    notes = np.stack([b[0] for b in batch])
    queries = np.stack([b[1] for b in batch])
    links = np.stack([b[2] for b in batch])
    valid = np.stack([np.arange(16) < s for s in sizes])
    keys = jax.numpy.stack([key_from_query_id(f"id{i}") for i in range(3)])
    out = jax.jit(jax.vmap(fn))(notes, queries, valid, links, keys)
    assert out.indices.shape == (3, 4)
    for i, s in [(0, 16), (2, 3)]:
        single = fn(notes[i, :s], queries[i], valid[i, :s], links[i, :s, :s], keys[i])
        same_selection(jax.tree.map(lambda x: x[i], out.replace(result=None)), single.replace(result=None))
    assert not np.asarray(out.selected_valid)[2, 3:].any()  # 3 notes for a budget of 4


@pytest.mark.slow
def test_the_learned_selector_runs_the_solver_object_it_is_given():
    """A user passes their own solver object (its limits are the ones that run); a configuration's name is
    converted once (solver_from_name), and an alias is refused."""
    from cdsjax.core.games.learned import LearnedParams

    notes, query, links = problem(4)
    run = lambda **kw: on_arrays(core.make_selector("cds_learned", budget=3, params=LearnedParams.paper(), **kw))(
        notes, query, np.ones(20, bool), links, None)
    sel = run(solver=core.Replicator(tol=1e-12, max_iter=77))
    assert int(sel.result.num_iters) == 77
    assert int(sel.result.status) == MAX_STEPS
    assert int(run(solver="replicator").result.num_iters) == int(run(solver=core.Replicator()).result.num_iters)
    with pytest.raises(ValueError, match="solver"):
        core.make_selector("cds_learned", budget=3, params=LearnedParams.paper(), solver="converged")
    with pytest.raises(TypeError, match="solver"):
        core.make_selector("cds_learned", budget=3, params=LearnedParams.paper(), solver=3)


def test_a_selector_reports_the_solver_it_runs():
    """make_selector("cds_learned", solver="replicator") runs replicator dynamics, and what describes the run says
    so: the built selector's solver, the diagnostics (solver, mode, solver_run) and the evaluation's batch chunk.
    The default build serves with pdas (the active set on a dense payoff, which the diagnostics name)."""
    from cdsjax.core.games.learned import LearnedParams
    from cdsjax.eval.run import batch_chunk

    notes, query, links = problem(4)
    p = core.CDSProblem.create(notes, query, np.ones(20, bool), links=links)
    for solver in ("replicator", core.Replicator()):
        fn = core.make_selector("cds_learned", budget=3, params=LearnedParams.paper(), solver=solver)
        assert fn.solver == core.Replicator() and batch_chunk(fn) == "auto"
        d = core.diagnostics(fn(p))
        assert (d["solver"], d["mode"], d["solver_run"]) == ("replicator", "paper", "replicator")
    default = core.make_selector("cds_learned", budget=3, params=LearnedParams.paper())
    assert default.solver == core.SPECS["cds_learned"].solver == core.SERVING_SOLVER
    assert batch_chunk(default) == "each" and core.SPECS["cds_learned"].mode == "converged"
    d = core.diagnostics(default(p))
    assert (d["solver"], d["mode"]) == ("active_set", "converged")
    inimdyn = core.make_selector("cds_learned", budget=3, params=LearnedParams.paper(), solver=core.InImDyn())
    assert core.diagnostics(inimdyn(p))["solver"] == "inimdyn" and batch_chunk(inimdyn) is None


def test_unknown_names_options_and_missing_inputs_raise():
    with pytest.raises(ValueError, match="'bm25'"):
        core.make_selector("bm25", budget=3)
    with pytest.raises(ValueError, match=r"\['lambda'\].*'mmr'"):
        core.make_selector("mmr", budget=3, **{"lambda": 0.5})
    with pytest.raises(ValueError, match="theta"):
        core.make_selector("cosine", budget=3, theta=1.0)
    with pytest.raises(ValueError, match="budget"):
        core.make_selector("cosine", budget=0)
    with pytest.raises(ValueError, match="quality"):
        core.make_selector("dpp", budget=3, quality="sigmoid")
    with pytest.raises(ValueError, match="lam"):
        core.make_selector("mmr", budget=3, lam=2.0)
    with pytest.raises(ValueError, match="init"):
        core.make_selector("cds", budget=3, init="zeros")
    with pytest.raises(ValueError, match="coupling"):
        core.make_selector("cds", budget=3, coupling="cosine")
    with pytest.raises(ValueError, match="params"):
        core.make_selector("cds", budget=3, params=core.CDSParams(), beta=2.0)
    with pytest.raises(ValueError, match="peel"):
        core.make_selector("cds", budget=3, peel=True, init="softmax")
    with pytest.raises(ValueError, match="coupling"):
        core.make_selector("cds_support", budget=3, coupling="none")
    with pytest.raises(ValueError, match="beta"):
        core.make_selector("cds_support", budget=3, beta=0.5)
    notes, query, _ = problem(5)
    with pytest.raises(ValueError, match="links"):
        on_arrays(core.make_selector("ppr", budget=3))(notes, query, np.ones(20, bool))
    with pytest.raises(ValueError, match="key"):
        on_arrays(core.make_selector("random", budget=3))(notes, query, np.ones(20, bool))
    assert "lam" in registry.SPECS["mmr"].options


def test_a_selector_names_its_compiled_program():
    """``make_selector`` names the selection function ``select_<name>`` (what JAX calls the program it compiles),
    without setting an attribute on the builder's function."""
    notes, query, links = problem(6)
    for name in ("cosine", "cds_converged"):
        fn = core.make_selector(name, budget=3)
        select = fn.select if isinstance(fn, core.Selector) else fn
        assert select.__name__ == f"select_{name}"
        assert select.function.__name__ != f"select_{name}"  # the closure keeps its own name
        lowered = jax.jit(on_arrays(fn)).lower(notes, query, np.ones(20, bool), links, None)
        assert lowered is not None
        assert f"jit_select_{name}" in jax.jit(select).lower(core.CDSProblem.create(notes, query, links=links)
                                                             ).as_text()
