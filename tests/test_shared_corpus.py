"""Shared-corpus batches: one W and alpha per corpus, W @ Y replicator steps (float64).

The reference is the per-question path (`cds_select` on each question) and,
for the corpus constants, NumPy computations written here.
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
from cdsjax.core.compat import cds_select, cds_select_shared
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core.solvers.loop import support_count
from cdsjax.core.strategies.shared import corpus_affinity, solve_replicator_shared
from cdsjax.core.games.payoff import replicator_shift
from cdsjax.core.strategies.shared import question_affinity, question_relevance

# Float64 references at tolerances float32 cannot reach, throughout.
pytestmark = pytest.mark.x64
N, PAD, D, B = 40, 8, 16, 6


def corpus(seed=0, *, n=N, pad=PAD, b=B):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(5, D))
    z = centres[rng.integers(5, size=n)] + 0.4 * rng.normal(size=(n, D))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = centres[rng.integers(5, size=b)] + 0.6 * rng.normal(size=(b, D))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    notes = np.concatenate([z, np.zeros((pad, D))])
    valid = np.arange(n + pad) < n
    return jnp.asarray(z), jnp.asarray(notes), jnp.asarray(valid), jnp.asarray(q)


PARAMS = [
    core.CDSParams(),
    core.CDSParams(beta=0.7, coupling="similarity", tau=0.2),
    core.CDSParams(beta=1.3, tau=0.3, tau_mode="soft"),
]


def per_question(z, q, params, **kw):
    sel = jax.jit(functools.partial(cds_select, budget=8, params=params, **kw))
    return [sel(z, q[k], jnp.ones(z.shape[0], bool)) for k in range(q.shape[0])]


@pytest.mark.slow
@pytest.mark.parametrize("p", range(len(PARAMS)))
def test_corpus_constants_match_per_question_affinity(p):
    params = PARAMS[p]
    z, notes, valid, q = corpus(p)
    shared = corpus_affinity(notes, valid, params)
    # NumPy reference for W and alpha.
    gram = np.asarray(z) @ np.asarray(z).T
    beta = float(params.beta)
    w = beta * (1 - gram) if params.coupling == "dissimilarity" else beta * np.maximum(gram, 0)
    np.fill_diagonal(w, 0.0)
    np.testing.assert_allclose(np.asarray(shared.coupling)[:N, :N], w, atol=1e-12)
    assert np.all(np.asarray(shared.coupling)[N:] == 0) and np.all(np.asarray(shared.coupling)[:, N:] == 0)
    np.testing.assert_allclose(float(shared.alpha), np.linalg.eigvalsh(w)[-1] + params.eps, rtol=1e-12)
    for k in range(B):
        aff = build_affinity(z, q[k], jnp.ones(N, bool), params)
        np.testing.assert_allclose(float(shared.alpha), float(aff.alpha), rtol=1e-12)
        np.testing.assert_allclose(float(shared.shift), float(replicator_shift(aff.payoff(), aff.valid)), rtol=1e-12)
        rel = question_relevance(shared, q)[k]
        np.testing.assert_allclose(np.asarray(question_affinity(shared, rel).matrix)[: N + 1, : N + 1],
                                   np.asarray(aff.matrix), atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("p", range(len(PARAMS)))
def test_shared_paper_mode_equals_per_question_path(p):
    params = PARAMS[p]
    z, notes, valid, q = corpus(10 + p)
    batch = jax.jit(functools.partial(cds_select_shared, budget=8, params=params))(notes, q, valid)
    singles = per_question(z, q, params)
    stopped_early = 0
    for k, single in enumerate(singles):
        res, ref = jax.tree_util.tree_map(lambda a: a[k], batch.result), single.result
        np.testing.assert_allclose(np.asarray(res.x[: N + 1]), np.asarray(ref.x), atol=1e-12)
        assert np.all(np.asarray(res.x[N + 1 :]) == 0)
        assert int(res.num_iters) == int(ref.num_iters)
        assert int(res.status) == int(ref.status)
        stopped_early += int(ref.num_iters) < 10_000
        for field in ("objective", "kkt_residual", "step", "alpha"):
            np.testing.assert_allclose(float(getattr(res, field)), float(getattr(ref, field)), atol=1e-12)
        assert int(support_count(res.x, res.x >= 0)) == int(support_count(ref.x, ref.x >= 0))
        np.testing.assert_array_equal(np.asarray(batch.indices[k]), np.asarray(single.indices))
        np.testing.assert_array_equal(np.asarray(batch.selected_valid[k]), np.asarray(single.selected_valid))
        np.testing.assert_allclose(np.asarray(batch.scores[k]), np.asarray(single.scores), atol=1e-12)
    # The batch mixes questions that stop at different steps with capped ones.
    assert 0 < stopped_early


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_rows_freeze_independently_and_respect_limits():
    z, notes, valid, q = corpus(20)
    shared = corpus_affinity(notes, valid)
    rel = question_relevance(shared, q)
    res = solve_replicator_shared(shared, rel, tol=1e-7, max_iter=300)
    assert int(jnp.max(res.num_iters)) == 300
    # A row's result does not depend on which other questions share the batch.
    alone = solve_replicator_shared(shared, rel[2:3], tol=1e-7, max_iter=300)
    np.testing.assert_allclose(np.asarray(alone.x[0]), np.asarray(res.x[2]), atol=1e-14)
    assert int(alone.num_iters[0]) == int(res.num_iters[2])
    # max_iter = 0 returns the initial point; x0 is masked and renormalised.
    x0 = np.random.default_rng(0).random((B, N + PAD + 1))
    start = solve_replicator_shared(shared, rel, x0=jnp.asarray(x0), max_iter=0)
    expect = np.where(np.asarray(jnp.concatenate([jnp.ones(1, bool), valid])), x0, 0.0)
    np.testing.assert_allclose(np.asarray(start.x), expect / expect.sum(1, keepdims=True), atol=1e-15)
    assert np.all(np.asarray(start.num_iters) == 0) and not np.any(np.asarray(start.status) == core.CONVERGED)


@pytest.mark.slow
@pytest.mark.parametrize("solver", [core.InImDyn(), core.ActiveSet()], ids=lambda s: s.name)
def test_converged_solvers_on_shared_corpus(solver):
    z, notes, valid, q = corpus(30)
    batch = jax.jit(functools.partial(cds_select_shared, budget=8, solver=solver))(notes, q, valid)
    singles = per_question(z, q, core.CDSParams(), solver=solver)
    for k, single in enumerate(singles):
        assert int(batch.result.status[k]) == core.CONVERGED and float(batch.result.kkt_residual[k]) <= 1e-10
        np.testing.assert_allclose(np.asarray(batch.result.x[k, : N + 1]), np.asarray(single.result.x), atol=1e-9)
        np.testing.assert_array_equal(np.asarray(batch.indices[k]), np.asarray(single.indices))


def test_bad_inputs_raise():
    z, notes, valid, q = corpus(40)
    with pytest.raises(ValueError, match="alpha_from"):
        corpus_affinity(notes, valid, core.CDSParams(alpha_from="full"))
    with pytest.raises(ValueError, match="queries"):
        cds_select_shared(notes, q[0], valid, budget=3)
    with pytest.raises(TypeError, match="solver"):
        cds_select_shared(notes, q, valid, budget=3, solver="nope")
    shared = corpus_affinity(notes, valid)
    with pytest.raises(ValueError, match="rel"):
        solve_replicator_shared(shared, jnp.ones((2, 5)))
    with pytest.raises(ValueError, match="x0"):
        solve_replicator_shared(shared, question_relevance(shared, q), x0=jnp.ones((B, 3)))
