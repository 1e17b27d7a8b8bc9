"""The primal-dual active set (cdsjax.core.solvers.pdas): on CDS payoffs it reaches the equilibrium the active set
reaches, in a few face solves, by LU or by CG; where it does not converge it says so, and the block path
falls back to the active set."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.games.affinity import CDSParams, build_affinity
from cdsjax.core.games.learned import LearnedParams, learned_affinity
from cdsjax.core.games.payoff import DensePayoff, SharedPayoff
from cdsjax.core.solvers.pdas import BLOCK_CAPACITIES, PrimalDualActiveSet, face_point, relevance_guess
from cdsjax.core.solvers.options import SERVING_SOLVER, ByPayoff, WithFallback
from cdsjax.core.solvers.loop import iterate
from cdsjax.core.types import CONVERGED
from tests.conftest import clustered_notes

SHIPPED = LearnedParams(beta=0.03, w_page=-1.0)
run = jax.jit(lambda solver, payoff: iterate(solver, payoff, None), static_argnums=0)


def game(n, size, seed, params=SHIPPED, d=32):
    """A clustered corpus's learned (or paper) game for one question, dense and as a shared block."""
    rng = np.random.default_rng(seed)
    z = clustered_notes(rng, n, size, d, 5).astype(np.float32)
    q = z[:3].sum(0) + rng.normal(size=d)
    q = (q / np.linalg.norm(q)).astype(np.float32)
    valid = np.arange(size) < n
    pages = np.where(valid, np.arange(size) // 4, -1).astype(np.int32)
    if isinstance(params, LearnedParams):
        dense = learned_affinity(z, q, valid, params, pages=pages)
    else:
        dense = build_affinity(z, q, valid, params)
    payoff = DensePayoff.from_affinity(dense)
    # the note block W: the payoff's, its penalty added back on the notes' diagonal
    block = payoff.matrix[1:, 1:] + jnp.diag(jnp.where(jnp.asarray(valid), payoff.alpha, 0.0))
    shared = SharedPayoff(coupling=block, rel=payoff.row(0)[1:], note_valid=jnp.asarray(valid),
                          alpha=payoff.alpha, corpus_shift=jnp.zeros((), jnp.float32))
    return payoff, shared


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
@pytest.mark.parametrize("params,n,size", [(SHIPPED, 150, 192), (SHIPPED, 60, 64), (CDSParams(), 40, 48)])
def test_it_reaches_the_active_sets_equilibrium_in_a_few_face_solves(params, n, size):
    for seed in range(3):
        payoff, shared = game(n, size, seed, params)
        ref = run(ActiveSet(), payoff)
        for p in (payoff, shared) if seed == 0 else (shared,):  # any payoff; the block's on every seed
            res = run(PrimalDualActiveSet(), p)
            assert int(res.status) == CONVERGED and float(res.kkt_residual) < 1e-5
            assert int(res.num_iters) <= 8
            np.testing.assert_allclose(np.asarray(res.x), np.asarray(ref.x), atol=2e-5)
            assert float(jnp.sum(res.x)) == pytest.approx(1.0, abs=1e-6) and float(jnp.min(res.x)) >= 0.0


@pytest.mark.slow
def test_conjugate_gradients_solve_the_face_the_lu_solves():
    payoff, shared = game(150, 192, seed=5)
    ref = run(ActiveSet(), payoff)
    support = shared.valid & (ref.x > 0)  # the equilibrium's face, from the uniform point on it
    x = jnp.where(support, 1.0, 0.0) / jnp.sum(support)
    lu, ok_lu = jax.jit(face_point, static_argnums=(3, 4))(shared, x, support, 64, 64)
    by_cg, ok_cg = jax.jit(face_point, static_argnums=(3, 4))(shared, x, support, 256, 0)  # past LU_ALWAYS
    assert bool(ok_lu) and bool(ok_cg)
    np.testing.assert_allclose(np.asarray(by_cg), np.asarray(lu), atol=1e-5)
    np.testing.assert_allclose(np.asarray(by_cg), np.asarray(ref.x), atol=2e-5)
    # the face's stationarity: equal payoffs on the support, one unit of mass
    mx = np.asarray(shared.matvec(by_cg))
    on = np.asarray(support)
    assert np.ptp(mx[on]) < 1e-4 and abs(float(jnp.sum(by_cg)) - 1.0) < 1e-6
    # the whole solve with CG faces only
    res = run(PrimalDualActiveSet(capacities=(256,), lu_max=0), shared)
    assert int(res.status) == CONVERGED
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(ref.x), atol=2e-5)


@pytest.mark.slow
def test_the_start_is_the_query_and_the_most_relevant_quarter():
    _, shared = game(100, 128, seed=2)
    x = np.asarray(relevance_guess(shared, 0.25))
    rel = np.asarray(shared.rel)[:100]
    on = np.flatnonzero(x[1:] > 0)
    assert x[0] > 0 and len(on) == 25 and np.all(x[129 - 28:] == 0)
    assert set(on) == set(np.argsort(-rel)[:25])
    assert np.isclose(x.sum(), 1.0)


@pytest.mark.slow
def test_a_run_that_cannot_finish_says_so_and_the_block_path_falls_back():
    payoff, shared = game(150, 192, seed=1)
    # every face needs more than 8 slots: the run stops at once, not converged
    res = run(PrimalDualActiveSet(capacities=(8,)), shared)
    assert int(res.status) != CONVERGED
    one = run(PrimalDualActiveSet(max_iter=1, fraction=0.05), shared)  # one face solve from a poor guess
    assert int(one.status) != CONVERGED
    ref = run(ActiveSet(), payoff)
    serving = WithFallback(PrimalDualActiveSet(capacities=(8,)), ActiveSet(vertex_first=True, gather=(64, 256)))
    out = jax.jit(lambda p: serving.solve(p))(shared)
    assert int(out.status) == CONVERGED
    np.testing.assert_allclose(np.asarray(out.x), np.asarray(ref.x), atol=2e-5)
    assert out.solver_run == "active_set"  # the fallback gave the point, and the result says so


def test_on_a_payoff_without_the_cds_structure_it_never_claims_a_false_equilibrium():
    rng = np.random.default_rng(0)
    for seed in range(6):
        a = rng.normal(size=(40, 40)).astype(np.float32)
        payoff = DensePayoff.of(jnp.asarray((a + a.T) / 2))
        res = run(PrimalDualActiveSet(), payoff)
        if int(res.status) == CONVERGED:
            assert float(res.kkt_residual) < 1e-5 and float(jnp.min(res.x)) >= 0.0


def test_faces_are_gathered_below_the_problems_size_then_whole():
    _, shared = game(150, 192, seed=0)  # 193 vertices
    assert PrimalDualActiveSet().face_sizes(shared) == (128, 193)
    assert PrimalDualActiveSet(capacities=(8, 64)).face_sizes(shared) == (8, 64)
    assert PrimalDualActiveSet(capacities=(64, 4096, 64)).face_sizes(shared) == (64, 193)


def test_bad_settings_are_refused():
    _, shared = game(30, 32, seed=0)
    with pytest.raises(ValueError, match="fraction"):
        run(PrimalDualActiveSet(fraction=0.0), shared)
    with pytest.raises(ValueError, match="capacities"):
        run(PrimalDualActiveSet(capacities=(0,)), shared)
    batched = shared.replace(rel=jnp.stack([shared.rel, shared.rel]))
    with pytest.raises(ValueError, match="one problem"):
        PrimalDualActiveSet().prepare(batched)


def test_the_serving_solver_is_an_explicit_fallback():
    """SERVING_SOLVER is one solver per payoff: on a corpus block the primal-dual rule with the active set (vertex
    steps first, Newton systems gathered) as its fallback, on a dense payoff the plain active set; the registry's
    selectors that serve on the corpus block hold it, and the limits reach every part."""
    from cdsjax.core import registry

    serving = SERVING_SOLVER
    assert isinstance(serving, ByPayoff) and isinstance(serving.block, WithFallback)
    assert serving.block.primary == PrimalDualActiveSet()
    assert serving.block.fallback == ActiveSet(gather=BLOCK_CAPACITIES, vertex_first=True)
    assert serving.dense == ActiveSet() and serving.name == "pdas"
    for name in ("cds_converged", "cds_learned", "cds_learned_pages"):
        assert registry.SPECS[name].solver == serving and registry.SPECS[name].solver_label == "pdas"
    limited = serving.with_limits(1e-4, 500)
    assert limited.dense == ActiveSet(tol=1e-4, max_iter=500)
    assert limited.block.fallback == serving.block.fallback.replace(tol=1e-4, max_iter=500)
    assert limited.block.primary == PrimalDualActiveSet(tol=1e-4)  # its cap counts face solves: kept
    assert serving.with_limits() == serving
    # on its payoff it reaches the equilibrium the dense active set reaches
    payoff, shared = game(150, 192, seed=2)
    out = jax.jit(lambda p: serving.solve(p))(shared)
    ref = jax.jit(lambda p: serving.solve(p))(payoff)  # a dense payoff: the active set runs
    assert int(out.status) == CONVERGED
    np.testing.assert_allclose(np.asarray(out.x), np.asarray(ref.x), atol=2e-5)
    assert out.solvers == ("pdas", "active_set") and out.solver_run == "pdas"  # the rule converged itself
    assert ref.solvers == ("active_set",) and ref.solver_run == "active_set"


def test_a_face_gathered_from_the_padded_matrix_is_the_payoffs_bit_for_bit():
    """PDAS gathers every face from the payoff's padded matrix, built once per solve (payoff.padded()): the same
    block, index and mask as the payoff's own submatrix, for any support (the query in or out, padding notes,
    every vertex) and capacity."""
    from cdsjax.core.solvers.active_set import compact_indices, gathered_face

    payoff, shared = game(150, 192, seed=1)
    rng = np.random.default_rng(0)
    size = shared.size
    supports = [shared.valid & jnp.asarray(rng.random(size) < p) for p in (0.1, 0.5, 0.9)]
    supports += [supports[1].at[0].set(False), jnp.ones((size,), bool), jnp.zeros((size,), bool)]
    for p in (shared, payoff):
        padded = p.padded()
        assert padded.shape == (size + 1, size + 1)
        for support in supports:
            for capacity in (64, 128, size):
                expect = jnp.nonzero(support, size=capacity, fill_value=size)[0]
                np.testing.assert_array_equal(np.asarray(compact_indices(support, capacity)), np.asarray(expect))
                if int(jnp.sum(support)) > capacity:
                    continue
                plain = jax.jit(gathered_face, static_argnums=2)(p, support, capacity)
                fast = jax.jit(gathered_face, static_argnums=2)(p, support, capacity, padded)
                for a, b in zip(plain, fast):
                    a, b = np.asarray(a), np.asarray(b)
                    assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_the_start_cut_from_a_top_k_is_the_sorts():
    """most_relevant's cut from a top-k bounded by the largest k it may be asked (the start, a face's better half)
    is the k-th edge of a sort of every edge, tied edges included."""
    from cdsjax.core.solvers.pdas import most_relevant

    _, shared = game(150, 192, seed=2)
    rel = np.asarray(shared.rel).copy()
    rel[10:20] = rel[10]  # ties at a cut
    shared = shared.replace(rel=jnp.asarray(rel))
    notes = shared.valid & (jnp.arange(shared.size) > 0)
    cut = jax.jit(most_relevant, static_argnums=3)
    for k in (1, 2, 13, 38, 75, 76, 150):
        for most in (k, k + 5, 100, 160):
            if most >= k:
                np.testing.assert_array_equal(np.asarray(cut(shared, notes, jnp.int32(k), most)),
                                              np.asarray(cut(shared, notes, jnp.int32(k), None)))
