"""Converged-mode solvers: InImDyn and the active-set Newton method (float64).

References are written here in NumPy: the KKT residual, a line search by dense
grid, and the stationary point of the support's face from its linear KKT system.
"""

import functools
import os

# LAPACK (eigvalsh, the active-set solves) runs on scipy's OpenBLAS, whose spinning
# threads slow small solves by ~100x on oversubscribed cores; effective when this
# module is the first to load it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.compat import cds_select
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core.solvers.options import SOLVER_NAMES
from cdsjax.core.solvers.replicator import solve_replicator
from cdsjax.core.solvers.active_set import solve_active_set
from cdsjax.core.solvers.inimdyn import default_tol, solve_inimdyn, vertex_step
from cdsjax.core.types import Affinity

CONVERGED = {"inimdyn": solve_inimdyn, "active_set": solve_active_set}
# Jitted once per module so tests sharing a shape share a compilation.
JIT = {name: jax.jit(fn) for name, fn in CONVERGED.items()}
PAPER = jax.jit(solve_replicator)


def clustered(n, *, d=32, k=6, noise=0.3, seed=0):
    """Clustered unit embeddings and one query near a cluster centre."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d))
    z = centres[rng.integers(k, size=n)] + noise * rng.normal(size=(n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = centres[0] + 0.5 * rng.normal(size=d)
    return z, q / np.linalg.norm(q)


def cds_affinity(n, seed=0, **params):
    z, q = clustered(n, seed=seed)
    return build_affinity(jnp.asarray(z), jnp.asarray(q), jnp.ones(n, bool), core.CDSParams(**params))


def random_affinity(n, seed):
    """An indefinite symmetric payoff of both signs (no constraint vertex)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n))
    a = (a + a.T) / 2
    np.fill_diagonal(a, rng.normal(size=n))
    return Affinity(
        matrix=jnp.asarray(a),
        constraint=jnp.zeros(n, bool),
        valid=jnp.ones(n, bool),
        alpha=jnp.asarray(0.0),
        num_queries=1,
    )


@functools.lru_cache(maxsize=None)
def paper_objective(n, seed, coupling):
    """Paper mode's objective on ``cds_affinity(n, seed, coupling=coupling)`` (cached across solvers)."""
    return float(PAPER(cds_affinity(n, seed, coupling=coupling)).objective)


def np_kkt(m, x):
    mx = m @ x
    r = mx - x @ mx
    return np.max(np.abs(np.minimum(x, -r)))


def np_face_solution(m, support):
    """Stationary point of x'Mx on the face of ``support`` (bordered linear system)."""
    idx = np.flatnonzero(support)
    k = len(idx)
    system = np.zeros((k + 1, k + 1))
    system[:k, :k] = m[np.ix_(idx, idx)]
    system[:k, k] = -1.0
    system[k, :k] = 1.0
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    x = np.zeros(m.shape[0])
    x[idx] = np.linalg.solve(system, rhs)[:k]
    return x


def check_certified(aff, res, tol=1e-10):
    """KKT point to ``tol`` by an independent NumPy computation; x is the face's exact solution."""
    m = np.asarray(aff.payoff())
    x = np.asarray(res.x)
    assert int(res.status) == core.CONVERGED
    assert np_kkt(m, x) <= tol
    np.testing.assert_allclose(float(res.kkt_residual), np_kkt(m, x), atol=1e-13)
    np.testing.assert_allclose(float(res.objective), x @ m @ x, rtol=1e-12, atol=1e-14)
    support = x > 1e-9
    err = np.abs(x - np_face_solution(m, support)).max()
    if err > 1e-8:
        # A flat face: the distance to its solution is at most sqrt(k) * residual / curvature.
        idx = np.flatnonzero(support)
        basis, _ = np.linalg.qr(np.eye(len(idx))[:, :-1] - np.eye(len(idx))[:, -1:])
        curvature = np.abs(np.linalg.eigvalsh(basis.T @ m[np.ix_(idx, idx)] @ basis)).min()
        assert err <= np.sqrt(len(idx)) * tol / curvature
    np.testing.assert_allclose(x.sum(), 1.0, atol=1e-12)
    assert np.all(x >= 0)


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("solver", sorted(CONVERGED))
def test_cds_instances_reach_kkt_and_beat_paper_mode(solver):
    # n = 120 (one compilation), both couplings, several seeds; n = 1000 once.
    cases = [(120, 0, "dissimilarity"), (120, 1, "dissimilarity"), (120, 2, "similarity"), (120, 3, "similarity"),
             (1000, 4, "dissimilarity")]
    for n, seed, coupling in cases:
        aff = cds_affinity(n, seed, coupling=coupling)
        res = JIT[solver](aff)
        check_certified(aff, res)
        assert float(res.objective) >= paper_objective(n, seed, coupling) - 1e-12
        assert float(res.x[0]) > 1e-6  # the constraint vertex is in the support


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("solver", sorted(CONVERGED))
def test_any_sign_payoff(solver):
    # Sizes match the CDS cases above (121 and 1001 vertices) to reuse their compilations.
    for n, seed in [(121, 5), (121, 6), (1001, 7)]:
        aff = random_affinity(n, seed)
        res = JIT[solver](aff)
        check_certified(aff, res)
        # A local maximum: the face's payoff is negative definite on its tangent space.
        m = np.asarray(aff.payoff())
        idx = np.flatnonzero(np.asarray(res.x) > 1e-9)
        if len(idx) > 1:
            basis = np.eye(len(idx))[:, :-1] - np.eye(len(idx))[:, -1:]  # directions summing to 0
            q, _ = np.linalg.qr(basis)
            assert np.linalg.eigvalsh(q.T @ m[np.ix_(idx, idx)] @ q).max() < 1e-9


@pytest.mark.x64
@pytest.mark.parametrize("solver", sorted(CONVERGED))
def test_warm_start_from_paper_mode_never_loses_objective(solver):
    # From paper mode's point both solvers only ascend, whatever the payoff.
    for aff in (random_affinity(121, 8), cds_affinity(120, 9, coupling="similarity")):
        paper = PAPER(aff)
        res = JIT[solver](aff, paper.x)
        assert int(res.status) == core.CONVERGED and float(res.kkt_residual) <= 1e-10
        assert float(res.objective) >= float(paper.objective) - 1e-12


@pytest.mark.slow
@pytest.mark.x64
def test_agrees_with_replicator_run_to_convergence():
    long_paper = jax.jit(functools.partial(solve_replicator, tol=1e-15, max_iter=400_000))
    for seed in (10, 11, 12, 13):
        aff = cds_affinity(14, seed, coupling="similarity", beta=0.5)
        long_run = long_paper(aff)
        assert float(long_run.kkt_residual) < 1e-9, "reference replicator run did not converge"
        for fn in JIT.values():
            res = fn(aff)
            np.testing.assert_allclose(np.asarray(res.x), np.asarray(long_run.x), atol=1e-6)
            np.testing.assert_allclose(float(res.objective), float(long_run.objective), atol=1e-9)


@pytest.mark.slow
@pytest.mark.x64
def test_vertex_step_is_the_exact_line_search():
    rng = np.random.default_rng(13)
    for trial in range(20):
        n = 7
        a = rng.normal(size=(n, n))
        m = (a + a.T) / 2
        x = rng.dirichlet(np.ones(n))
        if trial % 3 == 0:
            x[rng.integers(n)] = 0.0
            x /= x.sum()
        i = int(rng.integers(n))
        mx = m @ x
        x_new, mx_new, f_new = vertex_step(jnp.asarray(m), jnp.asarray(x), jnp.asarray(mx), jnp.asarray(x @ mx), i)
        x_new = np.asarray(x_new)
        lo = -x[i] / (1 - x[i])
        grid = np.linspace(lo, 1.0, 20001)
        e = np.eye(n)[i]
        best = max((x + s * (e - x)) @ m @ (x + s * (e - x)) for s in grid)
        assert x_new @ m @ x_new >= best - 1e-9
        assert np.all(x_new >= 0) and abs(x_new.sum() - 1) < 1e-12
        np.testing.assert_allclose(np.asarray(mx_new), m @ x_new, atol=1e-12)
        np.testing.assert_allclose(float(f_new), x_new @ m @ x_new, atol=1e-12)


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("solver", sorted(CONVERGED))
def test_padding_and_vmap_invariance(solver):
    # Unpadded problems have 120 notes (the shape compiled above); the batch pads them to 127.
    n, pad, d = 120, 7, 32
    problems = [clustered(n, seed=s) for s in (14, 15, 16)]
    singles = [JIT[solver](build_affinity(jnp.asarray(z), jnp.asarray(q), jnp.ones(n, bool))) for z, q in problems]
    notes = jnp.asarray(np.stack([np.concatenate([z, np.zeros((pad, d))]) for z, _ in problems]))
    queries = jnp.asarray(np.stack([q for _, q in problems]))
    valid = jnp.asarray(np.arange(n + pad) < n)[None].repeat(3, axis=0)
    fn = CONVERGED[solver]
    batch = jax.jit(jax.vmap(lambda z, q, v: fn(build_affinity(z, q, v))))(notes, queries, valid)
    for k, single in enumerate(singles):
        x = np.asarray(batch.x[k])
        np.testing.assert_allclose(x[: n + 1], np.asarray(single.x), atol=1e-12)
        assert np.all(x[n + 1 :] == 0.0)
        assert int(batch.status[k]) == core.CONVERGED
        np.testing.assert_allclose(float(batch.kkt_residual[k]), float(single.kkt_residual), atol=1e-13)
        assert int((x > 1e-6).sum()) == int((np.asarray(single.x) > 1e-6).sum())


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("solver", sorted(CONVERGED))
def test_cds_select_dispatch_and_warm_start(solver):
    z, q = clustered(120, seed=17)
    notes, query, valid = jnp.asarray(z), jnp.asarray(q), jnp.ones(120, bool)
    select = jax.jit(functools.partial(cds_select, budget=5,
                                       solver=core.WarmStart(core.Replicator(), core.solver_from_name(solver))))
    warm = select(notes, query, valid)
    assert int(warm.result.status) == core.CONVERGED and float(warm.result.kkt_residual) <= 1e-10
    paper = PAPER(build_affinity(notes, query, valid))
    assert float(warm.result.objective) >= float(paper.objective) - 1e-12
    # The selection is the top of the solver's own point.
    x_notes = np.asarray(warm.result.x[1:])
    np.testing.assert_array_equal(np.asarray(warm.indices), np.argsort(-x_notes, kind="stable")[:5])
    # the warm start is a solver of its own: its result is the polishing solver's, from paper mode's point
    assert warm.result.solvers == (core.solver_from_name(solver).name,)
    np.testing.assert_allclose(np.asarray(warm.result.x),
                               np.asarray(JIT[solver](build_affinity(notes, query, valid), paper.x).x), atol=1e-12)
    with pytest.raises(TypeError, match="warm_start"):  # no longer an option beside the solver
        cds_select(notes, query, valid, budget=3, solver=core.solver_from_name(solver), warm_start=core.Replicator())


@pytest.mark.slow
def test_float32_reaches_its_default_tolerance():
    z, q = clustered(120, seed=18)
    aff = build_affinity(jnp.asarray(z, jnp.float32), jnp.asarray(q, jnp.float32), jnp.ones(120, bool))
    assert default_tol(jnp.float32) == 1e-5 and default_tol(jnp.float64) == 1e-10
    for fn in JIT.values():
        res = fn(aff)
        assert res.x.dtype == jnp.float32
        assert int(res.status) == core.CONVERGED and float(res.kkt_residual) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("solver", sorted(CONVERGED))
def test_max_iter_cap_and_bad_arguments(solver):
    aff = cds_affinity(14, 19)
    res = jax.jit(functools.partial(CONVERGED[solver], max_iter=0))(aff)
    assert int(res.num_iters) == 0 and int(res.status) != core.CONVERGED
    # float32 (the suite's default) against float64's 1/15: the barycentre to 2 float32 ulps
    np.testing.assert_allclose(np.asarray(res.x), np.full(15, 1 / 15), rtol=2 * np.finfo(np.float32).eps, atol=0)
    with pytest.raises(ValueError, match="max_iter"):
        CONVERGED[solver](aff, max_iter=-1)
    with pytest.raises(ValueError, match="x0"):
        CONVERGED[solver](aff, jnp.ones(3))


@pytest.mark.x64
@pytest.mark.slow
@pytest.mark.parametrize("solver", sorted(CONVERGED))
@pytest.mark.parametrize("seed", range(6))
def test_sweep_sizes_and_couplings(solver, seed):
    for n in (64, 256, 700):
        for coupling in ("dissimilarity", "similarity", "none"):
            aff = cds_affinity(n, 100 + seed, coupling=coupling, tau=0.1)
            res = JIT[solver](aff)
            check_certified(aff, res)
            assert float(res.x[0]) > 1e-6


def test_names_at_the_edge_become_solver_objects():
    assert core.solver_from_name("inimdyn") == core.InImDyn()
    assert core.solver_from_name("active_set") == core.ActiveSet()  # the converged mode's solver
    assert core.solver_from_name("replicator") == core.Replicator(tol=1e-7, max_iter=10_000)  # paper mode
    for name in SOLVER_NAMES:  # an object's name is the name that gives it
        assert core.solver_from_name(name).name == name
    with pytest.raises(ValueError, match="solver"):
        core.solver_from_name("converged")  # no aliases
    assert core.ActiveSet().with_limits(1e-9, None) == core.ActiveSet(tol=1e-9)
    assert core.Replicator().with_limits() == core.Replicator()
