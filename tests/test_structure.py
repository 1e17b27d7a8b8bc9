"""Structured read-out, the page game and the sparse regime (cdsjax/core/structure.py): equal to the rules they
generalise, jit / vmap / padding invariant, implicit derivatives of the page game against finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core import structure as S
from cdsjax.core.baselines import select_cosine, select_cosine_pages, select_mmr


def problem(seed=0, n=20, d=8, pages_per=3, docs=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = z[0] + z[1] + 0.5 * rng.normal(size=d)
    q /= np.linalg.norm(q)
    pages = rng.integers(0, max(1, n // pages_per), size=n).astype(np.int32)
    doc_ids = rng.integers(0, docs, size=n).astype(np.int32)
    return {"notes": z.astype(dtype), "query": q.astype(dtype), "valid": np.ones(n, bool), "pages": pages,
            "doc_ids": doc_ids}


def pad(p, extra):
    out = dict(p)
    d = p["notes"].shape[1]
    out["notes"] = np.concatenate([p["notes"], np.zeros((extra, d), p["notes"].dtype)])
    out["valid"] = np.concatenate([p["valid"], np.zeros(extra, bool)])
    out["pages"] = np.concatenate([p["pages"], np.zeros(extra, np.int32)])
    out["doc_ids"] = np.concatenate([p["doc_ids"], np.zeros(extra, np.int32)])
    return out


def cosine_builder(budget):
    return lambda notes, query, valid: select_cosine(notes, query, valid, budget=budget)


@pytest.mark.slow
@pytest.mark.parametrize("seed,docs", [(0, 1), (1, 3), (2, 2)])
def test_cosine_with_one_note_per_page_is_cosine_pages(seed, docs):
    p = problem(seed, n=24, docs=docs)
    for budget in (3, 10, 30):
        got = S.select_structured(cosine_builder, p["notes"], p["query"], p["valid"], p["pages"], budget=budget,
                                  k=1, doc_ids=p["doc_ids"])
        want = select_cosine_pages(p["notes"], p["query"], p["valid"], p["pages"], budget=budget,
                                   doc_ids=p["doc_ids"])
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.selected_valid, want.selected_valid)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3])
def test_at_most_k_per_page_per_round_in_ranking_order(k):
    p = problem(3, n=30, pages_per=4)
    rank = np.random.default_rng(0).permutation(30).astype(np.int32)
    idx, ok = S.structured_readout(rank, p["valid"], p["pages"], budget=30, k=k)
    idx = np.asarray(idx)[np.asarray(ok)]
    assert sorted(idx.tolist()) == list(range(30))  # every note once
    seen = {}
    rounds = []
    for i in idx:
        pg = int(p["pages"][i])
        rounds.append(seen.get(pg, 0) // k)
        seen[pg] = seen.get(pg, 0) + 1
    assert rounds == sorted(rounds)  # a page gives its (r+1)-th batch of k only after every page gave its r-th
    for r in set(rounds):  # within a round, the ranking's order
        members = [i for i, rr in zip(idx, rounds) if rr == r]
        assert [rank[i] for i in members] == sorted(rank[i] for i in members)
    # within a page, the ranking's order too; no fill: only the first k of each page
    idx2, ok2 = S.structured_readout(rank, p["valid"], p["pages"], budget=30, k=k, fill=False)
    picked = np.asarray(idx2)[np.asarray(ok2)]
    pages = [int(p["pages"][i]) for i in picked]
    assert max(pages.count(pg) for pg in set(pages)) <= k


def _learned_builder(budget):
    from cdsjax.core.types import CDSProblem
    from cdsjax.learn.params_io import default_params

    fn = core.make_selector("cds_learned", budget=budget, params=default_params())
    return lambda notes, query, valid, pages, doc_ids: fn(CDSProblem.create(notes, query, valid, pages=pages,
                                                                            doc_ids=doc_ids))


def _mmr_builder(budget):
    return lambda notes, query, valid: select_mmr(notes, query, valid, budget=budget, lam=0.7)


def _selectors():
    def structured_learned(p, budget):
        def build(b):
            return lambda z, q, v: _learned_builder(b)(z, q, v, p["pages"], p["doc_ids"])

        return S.select_structured(build, p["notes"], p["query"], p["valid"], p["pages"], budget=budget, k=1,
                                   doc_ids=p["doc_ids"])

    def structured_mmr(p, budget):
        return S.select_structured(_mmr_builder, p["notes"], p["query"], p["valid"], p["pages"], budget=budget, k=2,
                                   doc_ids=p["doc_ids"], depth=4 * budget)

    def page_game(p, budget):
        return S.select_page_game(p["notes"], p["query"], p["valid"], p["pages"], S.PageGameParams(beta=0.3),
                                  budget=budget, k=1, doc_ids=p["doc_ids"])

    def sparse_page_game(p, budget):
        return S.select_page_game(p["notes"], p["query"], p["valid"], p["pages"],
                                  S.PageGameParams(beta=0.3, alpha_factor=0.5), budget=budget, k=2,
                                  doc_ids=p["doc_ids"])

    return {"structured_learned": structured_learned, "structured_mmr": structured_mmr, "page_game": page_game,
            "sparse_page_game": sparse_page_game}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_selectors()))
def test_padding_jit_and_vmap_invariance(name):
    fn = _selectors()[name]
    budget = 6
    problems = [problem(s, n=18, docs=2) for s in (4, 5)]
    eager = [fn(p, budget) for p in problems]
    for p, e in zip(problems, eager):
        ok = np.asarray(e.selected_valid)
        assert ok.all()
        assert len(set(np.asarray(e.indices).tolist())) == budget
        padded = pad(p, 7)
        got = jax.jit(lambda a: fn(a, budget))({k: jnp.asarray(v) for k, v in padded.items()})
        np.testing.assert_array_equal(np.asarray(got.indices), np.asarray(e.indices))
        np.testing.assert_array_equal(np.asarray(got.selected_valid), ok)
    stacked = {k: jnp.stack([jnp.asarray(pad(p, 2)[k]) for p in problems]) for k in problems[0]}
    batch = jax.jit(jax.vmap(lambda a: fn(a, budget)))(stacked)
    for i, e in enumerate(eager):
        np.testing.assert_array_equal(np.asarray(batch.indices[i]), np.asarray(e.indices))


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
    aff = core.build_affinity(jnp.asarray(p["notes"]), jnp.asarray(p["query"]), jnp.asarray(p["valid"]))
    assert float(S.sparse_affinity(aff, 0.25).alpha) == pytest.approx(0.25 * float(aff.alpha), rel=1e-6)


def test_peeling_keeps_the_query_in_a_sparse_support():
    # the case where the bound's fallback was read: beta = 1 at alpha = 0, the query leaves the first support
    p = problem(8, n=30, pages_per=1)
    own = np.arange(30, dtype=np.int32)
    params = S.PageGameParams(beta=1.0, alpha_factor=0.0)
    aff, rep, _, _ = S.page_affinity(p["notes"], p["query"], p["valid"], own, params)
    opts = core.SolveOptions(solver=core.ActiveSet()).check()
    first = core.solve(aff, S.anchored_start(aff), solver=core.ActiveSet())
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


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 2])
def test_experiment_readout_is_the_core_readout(k):
    """experiments/structured_cv.py reads rankings in NumPy; it must pick what the core read-out picks."""
    import importlib
    import sys

    sys.argv = sys.argv[:1]
    ex = importlib.import_module("experiments.structured_cv")
    rng = np.random.default_rng(k)
    for _ in range(5):
        n = int(rng.integers(5, 25))
        rank = rng.permutation(n).astype(np.int32)
        units = rng.integers(0, 6, size=n).astype(np.int32)
        got = ex.readout(rank, units, 7, k)
        if k == 0:
            want = [int(i) for i in np.argsort(rank)[:7]]
        else:
            idx, ok = S.structured_readout(rank, np.ones(n, bool), units, budget=7, k=k)
            want = [int(i) for i in np.asarray(idx)[np.asarray(ok)]]
        assert got == want
