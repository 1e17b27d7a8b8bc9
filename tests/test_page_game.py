"""The page game and the sparse regime (experiments/page_game.py, an experiment, not served): the page game with one
note per page is the note game, jit / vmap / padding invariant, the sparse regime keeps the query (by the bound or
by peeling), implicit derivatives of the page game against finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core.solvers.options import solve
from experiments import page_game as S
from tests.test_readouts import assert_padding_jit_and_vmap_invariant, problem


def _selectors():
    def page_game(p, budget):
        return S.select_page_game(p["notes"], p["query"], p["valid"], p["pages"], S.PageGameParams(beta=0.3),
                                  budget=budget, k=1, doc_ids=p["doc_ids"])

    def sparse_page_game(p, budget):
        return S.select_page_game(p["notes"], p["query"], p["valid"], p["pages"],
                                  S.PageGameParams(beta=0.3, alpha_factor=0.5), budget=budget, k=2,
                                  doc_ids=p["doc_ids"])

    return {"page_game": page_game, "sparse_page_game": sparse_page_game}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_selectors()))
def test_padding_jit_and_vmap_invariance(name):
    assert_padding_jit_and_vmap_invariant(_selectors()[name])


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_page_game_with_one_note_per_page_is_the_note_game():
    """Every note its own page: page vectors are the notes, page relevance their cosine, so the page game is the
    paper's converged game at the same beta and reads the same ranking."""
    p = problem(6, n=16)
    own = np.arange(16, dtype=np.int32)
    for beta in (0.1, 1.0):
        got = S.select_page_game(p["notes"], p["query"], p["valid"], own, S.PageGameParams(beta=beta), budget=16)
        want = core.make_selector("cds_converged", budget=16, beta=beta)(
            core.CDSProblem.create(p["notes"], p["query"], p["valid"]))
        np.testing.assert_array_equal(np.asarray(got.indices), np.asarray(want.indices))


@pytest.mark.slow
def test_page_vectors_and_relevance():
    p = problem(7, n=12, pages_per=3)
    aff, rep, owner, page_cos = S.page_affinity(p["notes"], p["query"], p["valid"], p["pages"], S.PageGameParams())
    rep, owner = np.asarray(rep), np.asarray(owner)
    cos = p["notes"] @ p["query"]
    for pg in np.unique(p["pages"]):
        members = np.flatnonzero(p["pages"] == pg)
        r = members[0]
        assert rep[r] and not rep[members[1:]].any() and (owner[members] == r).all()
        assert float(aff.matrix[0, 1 + r]) == pytest.approx(max(cos[members].max(), 0.0), abs=1e-6)
        assert float(page_cos[r]) == pytest.approx(cos[members].max(), abs=1e-6)
    assert not np.asarray(aff.valid)[1:][~rep].any()


def test_sparse_regime_shrinks_the_support_or_falls_back_to_the_bound():
    p = problem(8, n=30, pages_per=1)
    own = np.arange(30, dtype=np.int32)

    def run(beta, f):
        rank, ranked, kept = S.page_game_ranking(p["notes"], p["query"], p["valid"], own,
                                                 S.PageGameParams(beta=beta, alpha_factor=f))
        return np.asarray(rank), int(ranked.support_size), bool(kept), bool(S.query_in_support(ranked.result))

    # small beta: below the bound the equilibrium keeps the query and is a smaller cluster
    dense = run(0.1, 1.0)
    sparse = run(0.1, 0.3)
    assert dense[2] and dense[3] and sparse[2] and sparse[3]
    assert sparse[1] < dense[1]
    # beta = 1 at alpha = 0: the dissimilarity block wins and the query leaves: the bound's game is read
    lost = run(1.0, 0.0)
    assert not lost[2] and lost[3]
    np.testing.assert_array_equal(lost[0], run(1.0, 1.0)[0])
    aff = build_affinity(jnp.asarray(p["notes"]), jnp.asarray(p["query"]), jnp.asarray(p["valid"]))
    assert float(S.sparse_affinity(aff, 0.25).alpha) == pytest.approx(0.25 * float(aff.alpha), rel=1e-6)


def test_peeling_keeps_the_query_in_a_sparse_support():
    # the case where the bound's fallback was read: beta = 1 at alpha = 0, the query leaves the first support
    p = problem(8, n=30, pages_per=1)
    own = np.arange(30, dtype=np.int32)
    params = S.PageGameParams(beta=1.0, alpha_factor=0.0)
    aff, rep, _, _ = S.page_affinity(p["notes"], p["query"], p["valid"], own, params)
    opts = core.SolveOptions(solver=core.ActiveSet()).check()
    first = solve(aff, S.anchored_start(aff), solver=core.ActiveSet())
    assert not bool(S.query_in_support(first))
    result, kept, rounds = S.solve_peeling_to_query(aff, opts)
    x = np.asarray(result.x)
    assert bool(kept) and int(rounds) > 1 and x[0] > 1e-6
    # the peeled supports are out of the final one, and the final point is an equilibrium of what was left
    assert not (x[1:][np.asarray(first.x)[1:] > 1e-6] > 1e-6).any()
    rank, ranked, kept2 = S.page_game_ranking(p["notes"], p["query"], p["valid"], own, params, keep="peel")
    assert bool(kept2) and bool(S.query_in_support(ranked.result))
    assert sorted(np.asarray(rank).tolist()) == list(range(30))
    with pytest.raises(ValueError, match="keep"):
        S.page_game_ranking(p["notes"], p["query"], p["valid"], own, params, keep="pinned")
    # jit / vmap / padding of the peeling selector: tests/test_conformance.py (cds_learned_sparse, an experiment
    # game in experiments/page_and_sparse_games.py, peels)


@pytest.mark.x64
def test_page_game_implicit_gradient_matches_finite_differences():
    p = problem(9, n=14, pages_per=2, docs=2, dtype=np.float64)
    v = np.random.default_rng(2).normal(size=14)

    @jax.jit
    def loss(params):
        scores, result, _ = S.page_scores(p["notes"], p["query"], p["valid"], p["pages"], params,
                                          doc_ids=p["doc_ids"], tol=1e-13, max_iter=200_000)
        return jnp.sum(result.x[1:] * v)

    params = S.PageGameParams(beta=jnp.float64(0.4), alpha_factor=jnp.float64(1.1), w_doc=jnp.float64(0.05))
    grad = jax.grad(loss)(params)
    h = 1e-6
    for name in ("beta", "alpha_factor", "w_doc"):
        plus = loss(params.replace(**{name: getattr(params, name) + h}))
        minus = loss(params.replace(**{name: getattr(params, name) - h}))
        fd = float(plus - minus) / (2 * h)
        g = float(getattr(grad, name))
        assert abs(g - fd) <= 1e-5 + 1e-4 * abs(fd), (name, g, fd)
    assert max(abs(float(getattr(grad, k))) for k in ("beta", "alpha_factor", "w_doc")) > 1e-3


