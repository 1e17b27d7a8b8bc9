"""The per-page read-out (cdsjax/core/readouts.py): equal to the rule it generalises (cosine-pages), at most k
notes per page per round in the ranking's order, jit / vmap / padding invariant, and the same picks as the
NumPy twin in experiments/structured_cv.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax.core import registry
from cdsjax.core import readouts as R
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
        got = R.select_structured(cosine_builder, p["notes"], p["query"], p["valid"], p["pages"], budget=budget,
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
    idx, ok = R.structured_readout(rank, p["valid"], p["pages"], budget=30, k=k)
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
    idx2, ok2 = R.structured_readout(rank, p["valid"], p["pages"], budget=30, k=k, fill=False)
    picked = np.asarray(idx2)[np.asarray(ok2)]
    pages = [int(p["pages"][i]) for i in picked]
    assert max(pages.count(pg) for pg in set(pages)) <= k


def _learned_builder(budget):
    from cdsjax.core.types import CDSProblem
    from cdsjax.learn.params_io import default_params

    fn = registry.make_selector("cds_learned", budget=budget, params=default_params())
    return lambda notes, query, valid, pages, doc_ids: fn(CDSProblem.create(notes, query, valid, pages=pages,
                                                                            doc_ids=doc_ids))


def _mmr_builder(budget):
    return lambda notes, query, valid: select_mmr(notes, query, valid, budget=budget, lam=0.7)


def _selectors():
    def structured_learned(p, budget):
        def build(b):
            return lambda z, q, v: _learned_builder(b)(z, q, v, p["pages"], p["doc_ids"])

        return R.select_structured(build, p["notes"], p["query"], p["valid"], p["pages"], budget=budget, k=1,
                                   doc_ids=p["doc_ids"])

    def structured_mmr(p, budget):
        return R.select_structured(_mmr_builder, p["notes"], p["query"], p["valid"], p["pages"], budget=budget, k=2,
                                   doc_ids=p["doc_ids"], depth=4 * budget)

    return {"structured_learned": structured_learned, "structured_mmr": structured_mmr}


def assert_padding_jit_and_vmap_invariant(fn, budget: int = 6):
    """``fn(problem dict, budget)`` picks ``budget`` distinct notes, the same eagerly, jitted on a padded problem and
    vmapped over a padded batch."""
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


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_selectors()))
def test_padding_jit_and_vmap_invariance(name):
    assert_padding_jit_and_vmap_invariant(_selectors()[name])


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
            idx, ok = R.structured_readout(rank, np.ones(n, bool), units, budget=7, k=k)
            want = [int(i) for i in np.asarray(idx)[np.asarray(ok)]]
        assert got == want


def test_unit_tier_counts_what_comparing_every_pair_counts():
    # the read-out's tier by one sort equals the count over every pair of the same unit, ties and padding included
    from cdsjax.core.baselines import same_unit
    from cdsjax.core.readouts import unit_tier

    rng = np.random.default_rng(5)
    for trial in range(40):
        n = (1, 2, 17, 59)[(trial // 2) % 4]  # four shapes (each eager op compiles once per shape), ties or not
        rank = jnp.asarray(rng.integers(0, n if trial % 2 else 3 * n, n))  # ties on even trials
        pages = jnp.asarray(rng.integers(-1, 6, n))
        valid = jnp.asarray(rng.random(n) < 0.8)
        docs = None if trial % 3 == 0 else jnp.asarray(rng.integers(0, 3, n))
        pairwise = jnp.sum(same_unit(pages, valid, docs) & (rank[None, :] < rank[:, None]), axis=1)
        np.testing.assert_array_equal(np.asarray(unit_tier(rank, valid, pages, docs)), np.asarray(pairwise))


def _sorted_positions(indices, selected_valid, valid, tie):
    """rank_positions by its sort alone (the reference of its shortcut)."""
    n = valid.shape[0]
    big = indices.shape[0] + n
    slot = jnp.full((n,), big, jnp.int32).at[indices].min(
        jnp.where(selected_valid, jnp.arange(indices.shape[0]), big).astype(jnp.int32))
    order = jnp.lexsort((jnp.arange(n), -jnp.where(valid, tie, -jnp.inf), slot, ~valid))
    return jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))


def _sorted_readout(rank, valid, pages, budget, k, doc_ids, fill):
    """structured_readout by its sort alone (the reference of its first-round shortcut)."""
    n = valid.shape[0]
    group = R.unit_tier(rank, valid, pages, doc_ids) // k
    eligible = valid if fill else valid & (group == 0)
    group = jnp.where(eligible, group, n + 1)
    from cdsjax.core.baselines import cut_to_budget

    return cut_to_budget(jnp.lexsort((jnp.arange(n), rank, group)), eligible, budget)


_positions = jax.jit(R.rank_positions)
_readout = jax.jit(R.structured_readout, static_argnames=("budget", "k", "fill"))


@pytest.mark.parametrize("seed", range(8))
def test_the_sort_free_shortcuts_give_what_the_sorts_give(seed):
    """rank_positions skips its sort for a ranking of every valid note, structured_readout for a first round that
    fills the budget: positions and picks are those of the sorts, ties, padding, repeated picks and short
    rankings included."""
    rng = np.random.default_rng(seed)
    n = 24 if seed < 6 else 160  # (past 64 notes the first round is read off the first 64 ranks)
    valid = jnp.asarray(rng.random(n) < (0.6 if seed % 3 else 1.0))
    tie = jnp.asarray(rng.integers(0, 4, n).astype(np.float32))  # many equal ties
    real = np.flatnonzero(np.asarray(valid))
    for case in range(4):
        if case == 0:  # every valid note, then padding slots
            picks = rng.permutation(real)
            indices = np.concatenate([picks, np.zeros(n - len(picks), int)])
            ok = np.arange(n) < len(picks)
        elif case == 1:  # a short ranking
            picks = rng.permutation(real)[: max(0, len(real) - 2)]
            indices = np.concatenate([picks, np.zeros(n - len(picks), int)])
            ok = np.arange(n) < len(picks)
        elif case == 2:  # a pick of a padding note and a repeated pick
            indices = rng.integers(0, n, n)
            ok = rng.random(n) < 0.8
        else:  # every valid note with a gap in the slots
            picks = rng.permutation(real)[: n - 1]
            indices = np.concatenate([[0], picks, np.zeros(n - len(picks) - 1, int)])
            ok = np.concatenate([[False], np.ones(len(picks), bool), np.zeros(n - len(picks) - 1, bool)])
        indices, ok = jnp.asarray(indices, jnp.int32), jnp.asarray(ok)
        got = _positions(indices, ok, valid, tie)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(_sorted_positions(indices, ok, valid, tie)))
    pages = jnp.asarray(rng.integers(0, [2, 4, 8, 24, 3, 6, 12, 40][seed], n).astype(np.int32))
    doc_ids = jnp.asarray(rng.integers(0, 2, n).astype(np.int32))
    for rank in (jnp.asarray(rng.permutation(n).astype(np.int32)), jnp.asarray(rng.integers(0, 6, n).astype(np.int32)),
                 jnp.where(valid, jnp.arange(n, dtype=jnp.int32), jnp.iinfo(jnp.int32).max),
                 jnp.asarray(rng.integers(-2**30, 2**30, n).astype(np.int32)),  # past float32's exact ints
                 jnp.asarray((rng.permutation(n) + 2**24 - 6).astype(np.int32))):
        for budget in (1, 3, n, n + 2):
            for k in (1, 2):
                for fill in (True, False):
                    got = _readout(rank, valid, pages, budget=budget, k=k, doc_ids=doc_ids, fill=fill)
                    ref = _sorted_readout(rank, valid, pages, budget, k, doc_ids, fill)
                    for a, b in zip(got, ref):
                        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
