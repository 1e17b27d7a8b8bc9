"""What the equilibrium selects: the fill rule for short supports, notes-only support
diagnostics, and the support-targeted CDS (``cds_support``)."""

import functools

import jax
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.baselines import select_cosine
from cdsjax.core.compat import cds_peel, cds_select, cds_select_shared, cds_support
from cdsjax.core.games.affinity import build_affinity, scale_note_block
from cdsjax.core.types import FILL_NO_QUERY_EDGE, FILL_REASONS, FILL_SHORT_SUPPORT
from tests.conftest import on_arrays
from cdsjax.eval.problems import text_problems
from cdsjax.eval.report import summary_rows
from cdsjax.eval.run import run_selector
from cdsjax.core.diagnostics import diagnostics


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def clustered(rng, n, d=16, clusters=6, spread=0.5):
    centers = unit_rows(rng.normal(size=(clusters, d)))
    return unit_rows(centers[rng.integers(0, clusters, size=n)] + spread * rng.normal(size=(n, d)))


def away_from_query(rng, n, d=16):
    """Notes whose cosine with the query -e_0 is negative for every note."""
    z = rng.normal(size=(n, d))
    z[:, 0] = np.abs(z[:, 0]) + 0.05
    q = np.zeros(d)
    q[0] = -1.0
    return unit_rows(z), q


def picks(sel):
    return np.asarray(sel.indices)[np.asarray(sel.selected_valid)].tolist()


# Every CDS mode: (label, fn(notes, query, valid, budget) -> Selection).
MODES = {
    "paper": lambda z, q, v, b: on_arrays(core.make_selector("cds", budget=b))(z, q, v),
    "converged": lambda z, q, v, b: on_arrays(core.make_selector("cds_converged", budget=b))(z, q, v),
    "inimdyn": lambda z, q, v, b: on_arrays(core.make_selector("cds_inimdyn", budget=b))(z, q, v),
    "peel": lambda z, q, v, b: on_arrays(core.make_selector("cds", budget=b, peel=True))(z, q, v),
    "support": lambda z, q, v, b: on_arrays(core.make_selector("cds_support", budget=b, num_steps=8))(z, q, v),
    "shared-paper": lambda z, q, v, b: jax.tree.map(lambda a: a[0], cds_select_shared(z, q[None], v, budget=b)),
    "shared-converged": lambda z, q, v, b: jax.tree.map(
        lambda a: a[0], cds_select_shared(z, q[None], v, budget=b, solver=core.ActiveSet())),
}


# --------------------------------------------------------------------------- no positive query edge
@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_nonpositive_cosines_get_budget_notes_in_every_mode(mode):
    rng = np.random.default_rng(0)
    notes, query = away_from_query(rng, 20)
    assert (notes @ query).max() < 0
    # trailing padding: the picks must be real notes
    padded = np.concatenate([notes, unit_rows(rng.normal(size=(12, 16)))])
    valid = np.arange(32) < 20
    sel = MODES[mode](padded, query, valid, 6)
    got = picks(sel)
    assert len(got) == 6 and len(set(got)) == 6 and max(got) < 20
    # the query is isolated: the exact equilibrium is the query alone, so every pick is
    # filled, by cosine (rule 4 of cdsjax.core.ranking)
    assert got == np.argsort(-(notes @ query), kind="stable")[:6].tolist()
    assert int(sel.support_size) == 0
    assert int(sel.num_filled) == 6
    assert int(sel.fill_reason) == FILL_NO_QUERY_EDGE
    assert FILL_REASONS[int(sel.fill_reason)] == "no_query_edge"


@pytest.mark.slow
def test_without_fill_the_isolated_query_selects_nothing():
    notes, query = away_from_query(np.random.default_rng(1), 10)
    sel = cds_select(notes, query, np.ones(10, bool), budget=4, solver=core.ActiveSet(), fill=False)
    assert picks(sel) == [] and int(sel.support_size) == 0 and int(sel.num_filled) == 0


# --------------------------------------------------------------------------- short supports
def np_slack(payoff, x):
    mx = payoff @ x
    return mx - x @ mx


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("solver,kwargs", [(core.ActiveSet(), {}), (core.Replicator(), dict(tol=1e-13, max_iter=200_000))],
                         ids=["active_set", "replicator"])
def test_short_support_is_filled_by_kkt_slack(solver, kwargs):
    """Support first by weight, then the rest by (Mx)_i - x'Mx (independent NumPy check)."""
    rng = np.random.default_rng(2)
    notes = clustered(rng, 30)
    query = unit_rows(notes[0] + 0.3 * rng.normal(size=16))
    valid = np.ones(30, bool)
    params = core.CDSParams(beta=0.002)  # a weak note block: a small support
    budget = 8
    sel = cds_select(notes, query, valid, budget=budget, params=params, solver=solver, **kwargs)
    x = np.asarray(sel.result.x)
    support = np.flatnonzero(x[1:] > 1e-6)
    k = len(support)
    assert 0 < k < budget, k
    assert int(sel.support_size) == k and int(sel.num_filled) == budget - k
    assert int(sel.fill_reason) == FILL_SHORT_SUPPORT
    got = picks(sel)
    assert got[:k] == support[np.argsort(-x[1:][support], kind="stable")].tolist()
    aff = build_affinity(notes, query, valid, params)
    slack = np_slack(np.asarray(aff.payoff(), np.float64), x)[1:]
    rest = np.setdiff1d(np.arange(30), support)
    want = rest[np.argsort(-slack[rest], kind="stable")][: budget - k]
    assert got[k:] == want.tolist()
    assert np.all(slack[rest] <= 1e-6)  # an equilibrium: nothing outside the support gains by entering
    np.testing.assert_allclose(np.asarray(sel.scores)[k:], slack[want], atol=1e-10)
    # fill=False keeps the paper's reading: only the support
    bare = cds_select(notes, query, valid, budget=budget, params=params, solver=solver, fill=False, **kwargs)
    assert picks(bare) == got[:k] and int(bare.num_filled) == 0


@pytest.mark.slow
def test_fill_rule_is_the_same_in_paper_and_converged_mode():
    rng = np.random.default_rng(3)
    notes = clustered(rng, 24)
    query = unit_rows(notes[3] + 0.3 * rng.normal(size=16))
    params = core.CDSParams(beta=0.003)
    v = np.ones(24, bool)
    paper = cds_select(notes, query, v, budget=9, params=params, tol=1e-14, max_iter=400_000)
    conv = cds_select(notes, query, v, budget=9, params=params, solver=core.ActiveSet())
    assert 0 < int(conv.support_size) < 9 and int(paper.support_size) == int(conv.support_size)
    assert picks(paper) == picks(conv)


@pytest.mark.slow
def test_peel_fills_after_every_round():
    rng = np.random.default_rng(4)
    d = 16
    a, b = unit_rows(rng.normal(size=(2, d)))
    notes = np.concatenate([unit_rows(a + 0.3 * rng.normal(size=(8, d))), unit_rows(b + 0.3 * rng.normal(size=(8, d)))])
    queries = np.stack([a, b])
    sel = cds_peel(notes, queries, np.ones(16, bool), budget=12, solver=core.ActiveSet(),
                        params=core.CDSParams(beta=0.003))
    got = picks(sel)
    k = int(sel.support_size)
    assert len(got) == 12 and len(set(got)) == 12 and 0 < k < 12
    assert int(sel.num_filled) == 12 - k and int(sel.fill_reason) == FILL_SHORT_SUPPORT
    assert np.all(np.asarray(sel.scores)[:k] > 1e-6)


@pytest.mark.slow
def test_fewer_valid_notes_than_budget_never_returns_padding():
    rng = np.random.default_rng(5)
    notes, query = away_from_query(rng, 8)
    valid = np.arange(8) < 3
    for mode in ("paper", "converged", "support"):
        sel = MODES[mode](notes, query, valid, 5)
        assert sorted(picks(sel)) == [0, 1, 2]
        assert not np.asarray(sel.selected_valid)[3:].any()


# --------------------------------------------------------------------------- cds_support
@functools.lru_cache(maxsize=None)
def support_fn(budget):
    return jax.jit(functools.partial(cds_support, budget=budget, num_steps=16))


@pytest.mark.slow
def test_cds_support_hits_the_budget_on_synthetic_problems():
    rng = np.random.default_rng(6)
    inside = 0
    trials = 0
    for n, budget in [(40, 2), (60, 5), (90, 10), (120, 5)]:
        for _ in range(2):
            notes = clustered(rng, n)
            query = unit_rows(notes[rng.integers(n)] + 0.4 * rng.normal(size=16))
            sel = support_fn(budget)(notes, query, np.ones(n, bool))
            size = int(sel.support_size)
            # the reported support is the equilibrium's at the chosen beta
            assert size == int((np.asarray(sel.result.x)[1:] > 1e-6).sum())
            assert int(sel.result.status) == core.CONVERGED
            assert 0 < float(sel.beta) < 1.0
            trials += 1
            inside += budget / 2 <= size <= 2 * budget
            assert len(picks(sel)) == budget
    assert inside == trials


@pytest.mark.slow
def test_cds_support_grows_its_support_with_beta_times_n():
    """The bisection's premise: at fixed beta * n the support size is stable, and it grows with beta."""
    rng = np.random.default_rng(7)
    notes = clustered(rng, 80)
    query = unit_rows(notes[0] + 0.3 * rng.normal(size=16))
    v = np.ones(80, bool)
    size_at = jax.jit(lambda beta: cds_select(notes, query, v, budget=5, solver=core.ActiveSet(),
                                                   params=core.CDSParams(beta=beta)).support_size)
    sizes = [int(size_at(g / 80)) for g in (0.01, 0.1, 1.0, 10.0, 100.0)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] and sizes[-1] == 80, sizes


@pytest.mark.slow  # tests/test_conformance.py checks cds_support under jit, vmap and padding by default
@pytest.mark.x64
def test_cds_support_identical_under_jit_vmap_and_padding():
    rng = np.random.default_rng(8)
    sizes = [30, 17]
    fn = on_arrays(core.make_selector("cds_support", budget=4, num_steps=12))
    probs = []
    for n in sizes:
        z = clustered(rng, n)
        q = unit_rows(z[rng.integers(n)] + 0.3 * rng.normal(size=16))
        probs.append((z, q))
    jitted = [jax.jit(fn)(z, q, np.ones(len(z), bool)) for z, q in probs]
    pad = 40
    notes = np.stack([np.concatenate([z, unit_rows(rng.normal(size=(pad - len(z), 16)))]) for z, _ in probs])
    queries = np.stack([q for _, q in probs])
    valid = np.stack([np.arange(pad) < len(z) for z, _ in probs])
    batch = jax.jit(jax.vmap(fn))(notes, queries, valid)
    for i, e in enumerate(jitted):
        b = jax.tree.map(lambda a: a[i], batch)
        assert picks(b) == picks(e) and len(picks(e)) == 4
        assert int(b.support_size) == int(e.support_size)
        assert int(b.num_filled) == int(e.num_filled)
        np.testing.assert_allclose(float(b.beta), float(e.beta), rtol=1e-9)
        np.testing.assert_allclose(np.asarray(b.scores), np.asarray(e.scores), atol=1e-9)
    # eager (op-by-op outside jit) agrees as well
    e = fn(*probs[1], np.ones(17, bool))
    assert picks(e) == picks(jitted[1]) and int(e.support_size) == int(jitted[1].support_size)


def test_cds_support_rejects_bad_options():
    z, q = away_from_query(np.random.default_rng(9), 6)
    with pytest.raises(ValueError, match="coupling"):
        cds_support(z, q, np.ones(6, bool), budget=3, params=core.CDSParams(coupling="none"))
    with pytest.raises(ValueError, match="scale_range"):
        cds_support(z, q, np.ones(6, bool), budget=3, scale_range=(1.0, 0.5))
    with pytest.raises(ValueError, match="num_steps"):
        cds_support(z, q, np.ones(6, bool), budget=3, num_steps=0)


@pytest.mark.slow
@pytest.mark.x64
def test_scale_note_block_equals_a_rebuild():
    rng = np.random.default_rng(10)
    z = clustered(rng, 12)
    q = unit_rows(z[0] + 0.2 * rng.normal(size=16))
    v = np.arange(12) < 10
    base = build_affinity(z, q, v, core.CDSParams(beta=1.0))
    scaled = scale_note_block(base, 0.37, 1e-3)
    rebuilt = build_affinity(z, q, v, core.CDSParams(beta=0.37))
    np.testing.assert_allclose(np.asarray(scaled.matrix), np.asarray(rebuilt.matrix), atol=1e-12)
    np.testing.assert_allclose(float(scaled.alpha), float(rebuilt.alpha), rtol=1e-9)


# --------------------------------------------------------------------------- records
@pytest.mark.slow
def test_records_carry_notes_only_support_size():
    rng = np.random.default_rng(11)
    notes = clustered(rng, 20)
    query = unit_rows(notes[0] + 0.3 * rng.normal(size=16))
    sel = cds_select(notes, query, np.ones(20, bool), budget=5, solver=core.ActiveSet())
    d = diagnostics(jax.device_get(sel), num_notes=20)
    assert d["support_size"] == int((np.asarray(sel.result.x)[1:] > 1e-6).sum())
    assert d["support_size"] == int(sel.support_size)  # one support_size: the selection's notes
    assert d["whole_support"] == (d["support_size"] == 20)
    assert d["num_filled"] == 0 and d["fill_reason"] == "none" and d["beta"] == 1.0
    notes2, q2 = away_from_query(rng, 20)
    d2 = diagnostics(jax.device_get(cds_select(notes2, q2, np.ones(20, bool), budget=5)), num_notes=20)
    assert d2["support_size"] == 0 and d2["num_filled"] == 5 and d2["fill_reason"] == "no_query_edge"
    assert diagnostics(select_cosine(notes, query, np.ones(20, bool), budget=5)) == {}
    rows = summary_rows([{"benchmark": "b", "selector": "s", "budget": 5, "metrics": {},
                            "diagnostics": d}, {"benchmark": "b", "selector": "s", "budget": 5,
                                                "metrics": {}, "diagnostics": d2}], (), num_resamples=10)
    means = {r["metric"]: r["mean"] for r in rows}
    assert means["support_size@5"] == pytest.approx((d["support_size"] + 0) / 2)
    assert means["num_filled@5"] == pytest.approx(2.5)
    assert "whole_support@5" in means


# --------------------------------------------------------------------------- dev data
@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
@pytest.mark.parametrize("benchmark,budget,max_queries", [
    ("hotpotqa", 2, 12), ("qasper", 5, 10)])
def test_cds_support_size_on_dev_questions(data_root, tmp_path, benchmark, budget, max_queries):
    """On real questions with at least 2B notes, the support lies in [B/2, 2B] for >= 90%."""
    from cdsjax.io.datasets import load_benchmark
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config

    config = default_config()
    config.embedder.show_progress = False
    bench = load_benchmark(benchmark, data_root, max_queries)
    problems = text_problems(bench, Embedder(config), cache_dir=tmp_path, link_window=0)
    problems = [p for p in problems if p.notes.shape[0] >= 2 * budget]
    assert len(problems) >= 5
    fn = core.make_selector("cds_support", budget=budget)
    sels = run_selector(fn, problems, buckets=(16, 64, 128, 256, 512), max_batch=16)
    sizes = np.asarray([int(s.support_size) for s in sels])
    inside = (sizes >= budget / 2) & (sizes <= 2 * budget)
    assert inside.mean() >= 0.9, sizes
    for p, s in zip(problems, sels):
        assert int(np.asarray(s.selected_valid).sum()) == budget
        assert diagnostics(s, num_notes=p.notes.shape[0])["support_size"] == int(s.support_size)
