"""Core CDS: affinity, spectral penalty, replicator dynamics, selection, batching."""

import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.batching import auto_chunk, bucket_size, make_buckets, padded_batch
from cdsjax.core.compat import cds_peel, cds_select
from cdsjax.core.games.affinity import build_affinity, spectral_penalty
from cdsjax.core.ranking import top_b
from cdsjax.core.solvers.loop import support_count
from cdsjax.core.solvers.replicator import kkt_residual, softmax_prior, solve_replicator
from cdsjax.core.validation import validate_embeddings


# --------------------------------------------------------------------------- references
def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def clustered(rng, n, d=16, clusters=5, spread=0.25):
    centers = unit_rows(rng.normal(size=(clusters, d)))
    labels = rng.integers(0, clusters, size=n)
    return unit_rows(centers[labels] + spread * rng.normal(size=(n, d)))


def np_payoff(notes, query, beta=1.0, eps=1e-3):
    """Independent float64 NumPy build of M = A - alpha I_free for one query, tau = 0."""
    n = notes.shape[0]
    a = np.zeros((n + 1, n + 1))
    g = notes @ notes.T
    w = beta * (1.0 - g)
    np.fill_diagonal(w, 0.0)
    a[1:, 1:] = w
    r = np.maximum(notes @ query, 0.0)
    a[0, 1:] = r
    a[1:, 0] = r
    alpha = np.linalg.eigvalsh(w)[-1] + eps
    m = a.copy()
    m[1:, 1:] -= alpha * np.eye(n)
    return m, alpha


def np_replicator(m, tol=1e-7, max_iter=10_000):
    x = np.full(m.shape[0], 1.0 / m.shape[0])
    c = max(0.0, -m.min()) + 1e-3
    it = 0
    step = np.inf
    while step >= tol and it < max_iter:
        mx = m @ x
        new = x * (mx + c) / (x @ mx + c)
        step = np.abs(new - x).sum()
        x = new
        it += 1
    return x, it


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    notes = clustered(rng, 40)
    query = unit_rows(notes[3] + 0.3 * rng.normal(size=16))
    return notes, query


# --------------------------------------------------------------------------- replicator
@pytest.mark.slow
@pytest.mark.x64
def test_replicator_matches_numpy_step_for_step_to_cap():
    rng = np.random.default_rng(1)
    notes = clustered(rng, 100, clusters=5, spread=0.25)
    query = unit_rows(notes[0] + 0.2 * rng.normal(size=16))
    m, alpha = np_payoff(notes, query)
    x_ref, it_ref = np_replicator(m)
    aff = build_affinity(notes, query, np.ones(100, bool))
    np.testing.assert_allclose(aff.alpha, alpha, rtol=1e-12)
    np.testing.assert_allclose(aff.payoff(), m, atol=1e-12)
    res = solve_replicator(aff)
    assert it_ref == 10_000, "instance chosen to run to the cap"
    assert int(res.num_iters) == it_ref
    assert int(res.status) != core.CONVERGED
    np.testing.assert_allclose(res.x, x_ref, atol=1e-9, rtol=0)


@pytest.mark.slow
@pytest.mark.x64
def test_replicator_matches_numpy_when_converging():
    m = np.array([[0.0, 0.9, 0.2, 0.1], [0.9, -1.0, 0.5, 0.3], [0.2, 0.5, -1.0, 0.8], [0.1, 0.3, 0.8, -1.0]])
    aff = core.Affinity(
        matrix=jnp.asarray(m + np.diag([0, 1.0, 1.0, 1.0])),
        constraint=jnp.array([True, False, False, False]),
        valid=jnp.ones(4, bool),
        alpha=jnp.asarray(1.0),
    )
    x_ref, it_ref = np_replicator(m)
    res = solve_replicator(aff)
    assert it_ref < 10_000
    assert int(res.num_iters) == it_ref
    assert int(res.status) == core.CONVERGED
    np.testing.assert_allclose(res.x, x_ref, atol=1e-12)


@pytest.mark.slow
@pytest.mark.x64  # the same iterates at 1e-15: float64 (an unrolled loop may fuse float32 ops differently)
def test_unroll_does_not_change_iterates(problem):
    notes, query = problem
    aff = build_affinity(notes, query, np.ones(len(notes), bool))
    ref = solve_replicator(aff, max_iter=37, unroll=1)
    for unroll in (3, 8):
        got = solve_replicator(aff, max_iter=37, unroll=unroll)
        assert int(got.num_iters) == 37
        np.testing.assert_allclose(got.x, ref.x, atol=1e-15)


@pytest.mark.slow
@pytest.mark.x64
def test_chunked_batch_equals_vmap(problem):
    notes, query = problem
    z = np.stack([notes, notes[::-1]])
    q = np.stack([query, notes[0]])
    v = np.ones((2, len(notes)), bool)
    a = core.batched(cds_select, chunk=None, budget=4, max_iter=300)(z, q, v)
    for chunk in (1, "auto", "each"):
        b = core.batched(cds_select, chunk=chunk, budget=4, max_iter=300)(z, q, v)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_allclose(a.result.x, b.result.x, atol=1e-13)
        np.testing.assert_array_equal(a.result.num_iters, b.result.num_iters)


def test_auto_chunk_fits_the_cache_on_cpu_and_vmaps_elsewhere():
    # [65, 65] float32 is 16.9 KB: 31 fit in 512 KiB, the power of two below is 16
    assert auto_chunk(64, 64, 4, platform="cpu") == 16
    assert auto_chunk(64, 128, 4, platform="cpu") == 4
    assert auto_chunk(64, 256, 4, platform="cpu") == 1
    assert auto_chunk(16, 1024, 4, platform="cpu") == 1
    assert auto_chunk(8, 64, 4, platform="cpu") is None  # the whole batch fits: one vmap
    assert auto_chunk(64, 256, 4, platform="gpu") is None
    assert auto_chunk(64, 256, 4, platform="cpu", cache_bytes=1) == 1


def test_padded_batch_is_a_power_of_two_unless_padding_costs_more_than_a_compile():
    # at n = 1024 a padded slot costs a quarter of a compilation: 48 problems stay 48, not 64
    assert padded_batch(48, 1024) == 48 and padded_batch(47, 1024) == 48
    assert padded_batch(38, 512) == 48 and padded_batch(64, 512) == 64  # multiples of 16 at n = 512
    assert padded_batch(46, 256) == 64 and padded_batch(20, 256) == 32  # small n: powers of two
    assert padded_batch(3, 16) == 4 and padded_batch(1, 4096) == 1
    assert padded_batch(48, 1024, multiple=5) == 50  # then a multiple of the devices
    assert all(padded_batch(k, n) <= 1 << (k - 1).bit_length()
               for k in range(1, 70) for n in (16, 256, 512, 1024, 2048))
    with pytest.raises(ValueError):
        padded_batch(0, 64)


def test_selector_specs_name_chunk_solver_and_spellings():
    from cdsjax.core import registry
    from cdsjax.eval.run import batch_chunk
    from cdsjax.learn import default_params
    from cdsjax.pipeline import catalog

    def chunk(name):  # the evaluation cuts a batch by the solver the built selector runs
        return batch_chunk(core.make_selector(name, budget=3, **({"params": default_params()}
                                                                   if registry.SPECS[name].learned else {})))

    assert chunk("cds") == "auto"  # replicator dynamics: cache-sized chunks
    for name in ("cds_converged", "cds_learned", "cds_learned_pages"):  # the serving solver: one question at a time
        assert chunk(name) == "each"
    for name in ("cds_inimdyn", "cds_support", "cosine", "mmr", "ppr"):
        assert chunk(name) is None
    assert catalog.selector_spec("cds-paper") is registry.SPECS["cds"]
    assert catalog.selector_spec("cds-converged").solver_label == "pdas"
    assert catalog.selector_spec("cds-converged").solver == core.SERVING_SOLVER == core.solver_from_name("pdas")
    assert catalog.selector_spec("cds-support").solver_label == "active_set"
    assert catalog.selector_spec("cds-converged").mode == "converged"
    assert registry.SPECS["cds"].mode == "paper" and registry.SPECS["mmr"].mode is None
    assert catalog.display("cds_converged") == catalog.display("cds-converged") == "cds-converged"
    assert catalog.display("cds") == "cds-paper" and catalog.display("cosine") == "cosine"
    assert set(registry.SELECTORS) == set(registry.SPECS) == set(catalog.SHOWN)
    assert "lam" in registry.SPECS["mmr"].options and "beta" in registry.SPECS["cds"].options
    spec = catalog.selector_spec("cds-paper")
    assert catalog.selector_spec(spec) is spec  # a name resolved once is passed down as its spec, not looked up
    with pytest.raises(ValueError, match="unknown selector 'cds_fast'; choose one of: .*cds-paper"):
        catalog.selector_spec("cds_fast")
    with pytest.raises(ValueError, match="selector must be one of"):  # the core reads registry names only
        core.make_selector("cds-paper", budget=3)


@pytest.mark.parametrize("chunk", [0, -2, "fast", 1.5, True])
def test_batched_rejects_bad_chunk(chunk):
    with pytest.raises(ValueError, match="chunk"):
        core.batched(cds_select, chunk=chunk, budget=4)


@pytest.mark.x64
def test_kkt_residual_zero_on_hand_solved_three_vertex_case():
    a, w, eps = 0.6, 0.4, 1e-3
    alpha = w + eps
    m = np.array([[0, a, a], [a, -alpha, w], [a, w, -alpha]])
    y = a / (4 * a + eps)
    x_star = np.array([1 - 2 * y, y, y])
    assert abs(kkt_residual(jnp.asarray(m), jnp.asarray(x_star), jnp.ones(3, bool))) < 1e-15
    off = np.array([0.5, 0.3, 0.2])
    assert kkt_residual(jnp.asarray(m), jnp.asarray(off), jnp.ones(3, bool)) > 1e-3
    # the same point from the solver, built from embeddings with that geometry:
    aff = core.Affinity(matrix=jnp.asarray(m + np.diag([0, alpha, alpha])), constraint=jnp.array([True, False, False]),
                        valid=jnp.ones(3, bool), alpha=jnp.asarray(alpha))
    res = solve_replicator(aff, tol=1e-15, max_iter=200_000)
    np.testing.assert_allclose(res.x, x_star, atol=1e-9)
    assert float(res.kkt_residual) < 1e-9


@pytest.mark.slow
def test_query_vertex_in_support(problem):
    notes, query = problem
    sel = cds_select(notes, query, np.ones(len(notes), bool), budget=5)
    assert float(sel.result.x[0]) > 1e-6
    assert int(sel.support_size) >= 1


@pytest.mark.slow
@pytest.mark.x64
def test_diagnostics_are_consistent(problem):
    notes, query = problem
    aff = build_affinity(notes, query, np.ones(len(notes), bool))
    res = solve_replicator(aff, max_iter=50)
    m = np.asarray(aff.payoff())
    x = np.asarray(res.x)
    np.testing.assert_allclose(res.objective, x @ m @ x, rtol=1e-12)
    assert int(res.num_iters) == 50 and int(res.status) != core.CONVERGED
    np.testing.assert_allclose(x.sum(), 1.0, atol=1e-12)
    r = m @ x - x @ m @ x
    np.testing.assert_allclose(res.kkt_residual, np.max(np.abs(np.minimum(x, -r))), rtol=1e-12)
    assert int(support_count(res.x, np.ones(x.shape, bool))) == int((x > 1e-6).sum())


# --------------------------------------------------------------------------- affinity & penalty
@pytest.mark.x64
def test_alpha_bounds_lambda_max_of_free_block(problem):
    notes, query = problem
    n = len(notes)
    pinned = np.zeros(n, bool)
    pinned[[2, 7]] = True
    for pins in (None, pinned):
        aff = build_affinity(notes, query, np.ones(n, bool), pinned=pins)
        a = np.asarray(aff.matrix)
        free = np.asarray(aff.free)
        lam = np.linalg.eigvalsh(a[np.ix_(free, free)])[-1]
        assert float(aff.alpha) >= lam
        np.testing.assert_allclose(aff.alpha, lam + 1e-3, rtol=1e-12)
    full = build_affinity(notes, query, np.ones(n, bool), core.CDSParams(alpha_from="full"))
    np.testing.assert_allclose(full.alpha, np.linalg.eigvalsh(np.asarray(full.matrix))[-1] + 1e-3, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.x64
def test_spectral_penalty_correct_for_negative_spectrum_under_padding():
    rng = np.random.default_rng(2)
    b = rng.normal(size=(5, 5))
    block = -(b @ b.T) - 2 * np.eye(5)  # all eigenvalues < -2
    big = np.zeros((8, 8))
    big[:5, :5] = block
    mask = np.arange(8) < 5
    got = spectral_penalty(jnp.asarray(big), jnp.asarray(mask), 1e-3)
    np.testing.assert_allclose(got, np.linalg.eigvalsh(block)[-1] + 1e-3, rtol=1e-12)
    assert float(got) < -1.0  # a zero-padded eigvalsh would have returned ~0


@pytest.mark.x64
def test_couplings_and_beta(problem):
    notes, query = problem
    n = len(notes)
    v = np.ones(n, bool)
    g = notes @ notes.T
    off = ~np.eye(n, dtype=bool)
    for coupling, expect in (("dissimilarity", 2.0 * (1 - g)), ("similarity", 2.0 * np.maximum(g, 0)), ("none", 0 * g)):
        aff = build_affinity(notes, query, v, core.CDSParams(beta=2.0, coupling=coupling))
        w = np.asarray(aff.matrix)[1:, 1:]
        np.testing.assert_allclose(w[off], expect[off], atol=1e-12)
        assert np.all(np.diag(w) == 0)


@pytest.mark.x64
def test_hard_tau_keeps_strongest_edge_and_soft_tau_gates(problem):
    notes, query = problem
    n = len(notes)
    v = np.ones(n, bool)
    sims = notes @ query
    aff = build_affinity(notes, query, v, core.CDSParams(tau=0.5))
    r = np.asarray(aff.matrix)[0, 1:]
    np.testing.assert_allclose(r, np.where(sims >= 0.5, np.maximum(sims, 0), 0), atol=1e-12)
    aff = build_affinity(notes, query, v, core.CDSParams(tau=0.999))
    r = np.asarray(aff.matrix)[0, 1:]
    assert np.count_nonzero(r) == 1 and np.argmax(r) == np.argmax(sims)
    soft = build_affinity(notes, query, v, core.CDSParams(tau=0.3, tau_mode="soft", tau_temperature=0.05))
    expect = np.maximum(sims, 0) / (1 + np.exp(-(sims - 0.3) / 0.05))
    np.testing.assert_allclose(np.asarray(soft.matrix)[0, 1:], expect, rtol=1e-10)


@pytest.mark.slow
def test_keep_strongest_ignores_padding():
    notes = unit_rows(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.05]]))
    query = unit_rows(np.array([0.6, 0.8]))
    valid = np.array([True, True, False])
    aff = build_affinity(notes, query, valid, core.CDSParams(tau=0.99))
    r = np.asarray(aff.matrix)[0, 1:]
    assert r[2] == 0 and r[1] > 0 and r[0] == 0


# --------------------------------------------------------------------------- padding / vmap / jit
@pytest.mark.slow
@pytest.mark.x64
def test_padding_invariance(problem):
    notes, query = problem
    n = len(notes)
    sel = cds_select(notes, query, np.ones(n, bool), budget=8)
    padded = np.concatenate([notes, unit_rows(np.random.default_rng(3).normal(size=(24, 16)))])
    valid = np.arange(n + 24) < n
    sel_p = cds_select(padded, query, valid, budget=8)
    np.testing.assert_array_equal(sel.indices, sel_p.indices)
    np.testing.assert_allclose(sel.scores, sel_p.scores, atol=1e-12)
    np.testing.assert_allclose(sel.result.x, sel_p.result.x[: n + 1], atol=1e-12)
    assert np.all(np.asarray(sel_p.result.x[n + 1 :]) == 0)
    assert int(sel.result.num_iters) == int(sel_p.result.num_iters)
    np.testing.assert_allclose(sel.result.kkt_residual, sel_p.result.kkt_residual, atol=1e-12)


@pytest.mark.x64
def test_vmap_batch_equals_per_query_calls():
    rng = np.random.default_rng(4)
    sizes = [12, 30, 7]
    notes_list = [clustered(rng, s) for s in sizes]
    queries = [unit_rows(z[0] + 0.3 * rng.normal(size=16)) for z in notes_list]
    fn = functools.partial(cds_select, budget=6, max_iter=400)
    batch = core.batch_apply(fn, notes_list, queries, buckets=(16, 32))
    for z, q, got in zip(notes_list, queries, batch):
        ref = jax.jit(fn)(z, q, np.ones(len(z), bool))
        np.testing.assert_array_equal(got.selected_valid, ref.selected_valid)
        np.testing.assert_array_equal(got.indices[got.selected_valid], ref.indices[ref.selected_valid])
        np.testing.assert_allclose(got.result.x[: len(z) + 1], ref.result.x, atol=1e-12)
        assert int(got.result.num_iters) == int(ref.result.num_iters)


@pytest.mark.slow
@pytest.mark.x64
def test_jit_equals_eager(problem):
    notes, query = problem
    v = np.ones(len(notes), bool)
    eager = cds_select(notes, query, v, budget=5, max_iter=500)
    jitted = jax.jit(functools.partial(cds_select, budget=5, max_iter=500))(notes, query, v)
    np.testing.assert_array_equal(eager.indices, jitted.indices)
    np.testing.assert_allclose(eager.result.x, jitted.result.x, atol=1e-13)


def test_bucket_helper_bounds_shapes():
    assert bucket_size(1) == 16 and bucket_size(17) == 32 and bucket_size(5000) == 8192
    rng = np.random.default_rng(5)
    notes = [clustered(rng, s) for s in (3, 20, 20, 40, 70)]
    queries = [z[0] for z in notes]
    buckets = make_buckets(notes, queries)
    assert [b.size for b in buckets] == [16, 32, 64, 128]
    assert sorted(np.concatenate([b.positions for b in buckets]).tolist()) == list(range(5))
    assert all(b.notes.shape[0] in (1, 2, 4) for b in buckets)


# --------------------------------------------------------------------------- selection
def test_selection_threshold_and_fewer_than_budget():
    notes = unit_rows(np.array([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0]]))
    query = unit_rows(np.array([1.0, 0.05]))
    sel = cds_select(notes, query, np.ones(3, bool), budget=10)
    ok = np.asarray(sel.selected_valid)
    assert sel.indices.shape == (10,) and ok.sum() <= 3
    assert np.all(np.asarray(sel.indices)[~ok] == 0) and np.all(np.asarray(sel.scores)[~ok] == 0)
    x = np.asarray(sel.result.x)[1:]
    assert set(np.asarray(sel.indices)[ok].tolist()) == set(np.flatnonzero(x > 1e-6).tolist())
    assert np.all(np.diff(np.asarray(sel.scores)[ok]) <= 0)


def test_top_b_ties_go_to_lowest_index():
    idx, ok, _ = top_b(jnp.array([0.5, 0.7, 0.7, 0.1]), jnp.array([True, True, True, False]), 4)
    np.testing.assert_array_equal(idx[:3], [1, 2, 0])
    np.testing.assert_array_equal(ok, [True, True, True, False])


def _read_by_top_b_then_fill(result, valid, slack, cosine, isolated, threshold):
    """read_out's picks of every note as the top-B of the weights, then the fill rule (the reference of its one
    sort)."""
    from cdsjax.core.ranking import _fill

    n = valid.shape[0]
    x = result.x[1:]
    support = valid & (x > threshold) & ~isolated
    idx, ok, scores = top_b(x, support, n)
    filled, idx, slack_pick, num_filled, reason = _fill(idx, ok, support, valid, slack, cosine, isolated, n)
    return idx, ok | filled, jnp.where(filled, slack_pick, scores), jnp.sum(support), num_filled, reason


@pytest.mark.parametrize("seed", range(4))
def test_reading_every_note_in_one_sort_is_the_top_b_then_the_fill_rule(seed):
    """read_out with a budget of every note sorts once: the support by weight, then the fill order; picks, scores
    and counts are those of top_b and the fill rule, with tied weights, slacks and cosines, non-finite slacks and
    cosines, padding and an isolated query."""
    from cdsjax.core.ranking import read_out
    from cdsjax.core.types import SolverResult

    rng = np.random.default_rng(seed)
    n = 32
    valid = jnp.asarray(rng.random(n) < 0.8)
    x = rng.choice([0.0, 0.0, 1e-7, 0.1, 0.2, 0.2, 0.3], size=n + 1).astype(np.float32)
    x = jnp.asarray(x / x.sum())
    slack = rng.choice([-0.5, -0.1, -0.1, 0.0, np.inf, np.nan], size=n).astype(np.float32)
    cosine = rng.choice([0.1, 0.3, 0.3, -np.inf, np.nan], size=n).astype(np.float32)
    result = SolverResult(x=x, num_iters=jnp.int32(1), step=jnp.float32(0), objective=jnp.float32(0),
                          kkt_residual=jnp.float32(0), alpha=jnp.float32(1), status=jnp.int32(0),
                          ran=jnp.int32(0), solvers=("pdas",))
    for isolated in (False, True):
        for cos in (jnp.asarray(cosine), None):
            iso = jnp.asarray(isolated)
            sel = jax.jit(lambda r, s, c, i: read_out(r, valid, budget=n, slack=s, cosine=c, isolated=i))(
                result, jnp.asarray(slack), cos, iso)
            idx, ok, scores, size, num_filled, reason = _read_by_top_b_then_fill(
                result, valid, jnp.asarray(slack), cos, iso, 1e-6)
            np.testing.assert_array_equal(np.asarray(sel.indices), np.asarray(idx))
            np.testing.assert_array_equal(np.asarray(sel.selected_valid), np.asarray(ok))
            np.testing.assert_array_equal(np.asarray(sel.scores), np.asarray(scores))
            assert int(sel.support_size) == int(size) and int(sel.num_filled) == int(num_filled)
            assert int(sel.fill_reason) == int(reason)


@pytest.mark.slow
@pytest.mark.x64
def test_near_duplicates_repel_each_other():
    # One finding stated once vs three times; two distinct, still relevant notes.
    rng = np.random.default_rng(6)
    d = 32
    base = unit_rows(rng.normal(size=(3, d)))
    dups = unit_rows(base[0] + 0.02 * rng.normal(size=(3, d)))
    others = unit_rows(rng.normal(size=(6, d)))
    query = unit_rows(base[0] + 0.7 * base[1] + 0.6 * base[2])
    once = np.concatenate([dups[:1], base[1:], others])
    thrice = np.concatenate([dups, base[1:], others])
    assert set(np.argsort(-(thrice @ query))[:3]) == {0, 1, 2}  # cosine spends its top-3 on the copies

    def weights(notes, beta):
        sel = cds_select(notes, query, np.ones(len(notes), bool), budget=3,
                              params=core.CDSParams(beta=beta), max_iter=200_000, tol=1e-12)
        assert float(sel.result.kkt_residual) < 1e-8
        return np.asarray(sel.result.x)[1:], set(np.asarray(sel.indices).tolist())

    x_once, _ = weights(once, 1.0)
    x_thrice, _ = weights(thrice, 1.0)
    # Each copy gets less weight than the lone statement did: copies repel.
    assert np.all(x_thrice[:3] < 0.8 * x_once[0])
    # With a stronger diversification (beta = 5, within the paper's sweep) the copies
    # no longer fill the top-3.
    _, picked = weights(thrice, 5.0)
    assert len(picked & {0, 1, 2}) <= 1


@pytest.mark.x64
def test_softmax_prior(problem):
    notes, query = problem
    n = len(notes)
    aff = build_affinity(notes, query, np.ones(n, bool))
    x0 = np.asarray(softmax_prior(aff, 0.1))
    np.testing.assert_allclose(x0.sum(), 1.0, atol=1e-12)
    np.testing.assert_allclose(x0[0], 1 / (n + 1), rtol=1e-12)
    r = np.asarray(aff.matrix)[0, 1:]
    expect = np.exp(r / 0.1) / np.exp(r / 0.1).sum() * (1 - 1 / (n + 1))
    np.testing.assert_allclose(x0[1:], expect, rtol=1e-10)
    sel = cds_select(notes, query, np.ones(n, bool), budget=10, init="softmax", max_iter=100)
    assert bool(jnp.isfinite(sel.result.objective))


@pytest.mark.slow
def test_peeling_covers_every_query():
    rng = np.random.default_rng(7)
    d = 24
    a, b = unit_rows(rng.normal(size=(2, d)))
    notes = np.concatenate([unit_rows(a + 0.2 * rng.normal(size=(6, d))), unit_rows(b + 0.2 * rng.normal(size=(6, d)))])
    queries = np.stack([a, b])
    v = np.ones(12, bool)
    sel = cds_peel(notes, queries, v, budget=12, max_iter=20_000)
    picked = np.asarray(sel.indices)[np.asarray(sel.selected_valid)]
    assert (picked < 6).any() and (picked >= 6).any()
    single = cds_select(notes, queries, v, budget=12, max_iter=20_000)
    assert float(single.result.x[0]) > 0 or float(single.result.x[1]) > 0
    jitted = jax.jit(functools.partial(cds_peel, budget=12, max_iter=20_000))(notes, queries, v)
    np.testing.assert_array_equal(jitted.indices, sel.indices)


@pytest.mark.slow
def test_pinned_notes_are_constraint_vertices(problem):
    notes, query = problem
    n = len(notes)
    pinned = np.zeros(n, bool)
    pinned[5] = True
    aff = build_affinity(notes, query, np.ones(n, bool), pinned=pinned)
    assert bool(aff.constraint[0]) and bool(aff.constraint[6]) and int(aff.constraint.sum()) == 2
    m = np.asarray(aff.payoff())
    assert m[6, 6] == 0 and m[7, 7] == -float(aff.alpha)


# --------------------------------------------------------------------------- input checks
@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(notes=np.ones((4,)), query=np.ones(4), valid=np.ones(4, bool)), "notes"),
        (dict(notes=np.ones((4, 3)), query=np.ones((2, 2, 3)), valid=np.ones(4, bool)), "query"),
        (dict(notes=np.ones((4, 3)), query=np.ones(5), valid=np.ones(4, bool)), "query"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(5, bool)), "valid"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(4, bool), budget=0), "budget"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(4, bool), budget=2.5), "budget"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(4, bool), init="random"), "init"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(4, bool),
              params=core.CDSParams(coupling="cosine")), "coupling"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(4, bool),
              params=core.CDSParams(alpha_from="max")), "alpha_from"),
        (dict(notes=np.ones((4, 3)), query=np.ones(3), valid=np.ones(4, bool),
              params=core.CDSParams(tau_mode="medium")), "tau_mode"),
    ],
)
def test_bad_static_inputs_raise_value_error_naming_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        cds_select(**{"budget": 3, **kwargs})


def test_validate_embeddings_rejects_nan_and_bad_shapes():
    z = unit_rows(np.random.default_rng(8).normal(size=(5, 4)))
    validate_embeddings(z, z[0])
    bad = z.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="notes.*NaN"):
        validate_embeddings(bad, z[0])
    # padded rows are not checked
    validate_embeddings(bad, z[0], valid=np.array([1, 1, 0, 0, 0], bool))
    with pytest.raises(ValueError, match="query.*NaN"):
        validate_embeddings(z, np.full(4, np.inf))
    with pytest.raises(ValueError, match="query"):
        validate_embeddings(z, z[0, :3])
    with pytest.raises(ValueError, match="normalised"):
        validate_embeddings(2 * z)
    with pytest.raises(ValueError, match="empty"):
        validate_embeddings(np.zeros((0, 4)))


def test_core_import_is_pure():
    code = (
        "import sys, cdsjax.core\n"
        "bad = [m for m in ('torch', 'sentence_transformers', 'vllm', 'openai', 'pymupdf', 'fitz', 'cdsjax.io')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
