"""Baseline selectors and the graph-diffusion prior against float64 NumPy references."""

import hashlib

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

from cdsjax.core import graph
from cdsjax.core.baselines import (dpp_quality, key_from_query_id, select_cosine, select_dpp, select_mmr, select_ppr,
                                   select_random)
from cdsjax.core.compat import cds_select
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core.graph import diffusion_prior


# Jitted once per shape: eager calls would re-trace the selection loops on every call.
cosine = jax.jit(select_cosine, static_argnames=("budget",))
mmr = jax.jit(select_mmr, static_argnames=("budget", "lam"))
dpp = jax.jit(select_dpp, static_argnames=("budget", "theta", "quality", "gain_tol"))
ppr = jax.jit(select_ppr, static_argnames=("budget", "damping", "temperature", "tol", "max_iter"))
ppr_vector = jax.jit(graph.ppr_vector, static_argnames=("damping", "tol", "max_iter"))
rand = jax.jit(select_random, static_argnames=("budget",))
EPS64 = 100 * np.finfo(np.float64).eps  # select_dpp's default gain tolerance in float64


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def instance(seed, n=24, d=6, m=None, link_p=0.12):
    rng = np.random.default_rng(seed)
    notes = unit_rows(rng.normal(size=(n, d)))
    query = unit_rows(rng.normal(size=(d,) if m is None else (m, d)))
    links = rng.random((n, n)) < link_p
    return notes, query, links


def picks(sel):
    """The valid picks of a Selection as a Python list."""
    ok = np.asarray(sel.selected_valid)
    assert ok[: int(ok.sum())].all(), "valid picks must form a prefix"
    return [int(i) for i in np.asarray(sel.indices)[ok]]


# ---------------------------------------------------------------- NumPy references


def ref_relevance(notes, query):
    return np.max(np.atleast_2d(query) @ notes.T, axis=0)


def ref_mmr(notes, query, budget, lam):
    rel = ref_relevance(notes, query)
    sim = notes @ notes.T
    chosen = []
    for _ in range(min(budget, len(rel))):
        best, best_score = None, -np.inf
        for i in range(len(rel)):
            if i in chosen:
                continue
            score = rel[i] if not chosen else lam * rel[i] - (1 - lam) * max(sim[i, j] for j in chosen)
            if score > best_score:  # strict: ties keep the lowest index
                best, best_score = i, score
        chosen.append(best)
    return chosen


def ref_kernel(notes, query, theta, quality):
    rel = ref_relevance(notes, query)
    q = np.exp(theta * rel) if quality == "exp" else np.maximum(rel, 0.0)
    return q[:, None] * (notes @ notes.T) * q[None, :]


def ref_dpp_chen(kernel, budget, gain_tol):
    """Chen et al.'s greedy with the full kernel matrix, written with explicit loops."""
    n = kernel.shape[0]
    diag = np.diag(kernel).copy()
    gains = diag.copy()
    factors = np.zeros((budget, n))
    chosen = []
    for t in range(budget):
        candidates = [i for i in range(n) if i not in chosen and gains[i] > gain_tol * diag[i] and gains[i] > 0]
        if not candidates:
            break
        j = max(candidates, key=lambda i: (gains[i], -i))
        d_j = np.sqrt(gains[j])
        for i in range(n):
            e = (kernel[j, i] - factors[:t, j] @ factors[:t, i]) / d_j
            factors[t, i] = e
            gains[i] -= e * e
        chosen.append(j)
    return chosen


def ref_dpp_logdet(kernel, budget, gain_tol):
    """Greedy on log det(L_R) by brute force: each step adds the note with the largest determinant."""
    n = kernel.shape[0]
    chosen = []
    det_r = 1.0
    for _ in range(budget):
        best, best_ratio = None, -np.inf
        for i in range(n):
            if i in chosen:
                continue
            sub = chosen + [i]
            ratio = np.linalg.det(kernel[np.ix_(sub, sub)]) / det_r
            if ratio > gain_tol * kernel[i, i] and ratio > 0 and ratio > best_ratio:
                best, best_ratio = i, ratio
        if best is None:
            break
        chosen.append(best)
        det_r *= best_ratio
    return chosen


def ref_transition(links):
    n = links.shape[0]
    adj = (links | links.T).astype(float)
    np.fill_diagonal(adj, 0.0)
    deg = adj.sum(axis=1)
    return np.where(deg[:, None] > 0, adj / np.maximum(deg, 1.0)[:, None], 1.0 / n)


def ref_ppr_solve(links, seed, damping):
    """PageRank as the solution of (I - gamma P^T) r = (1 - gamma) s."""
    p = ref_transition(links)
    n = links.shape[0]
    return np.linalg.solve(np.eye(n) - damping * p.T, (1 - damping) * seed)


def ref_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def pad(notes, query, links, extra, rng):
    """Trailing padding filled with garbage, which the selectors must ignore."""
    n, d = notes.shape
    notes_p = np.concatenate([notes, unit_rows(rng.normal(size=(extra, d)))])
    links_p = rng.random((n + extra, n + extra)) < 0.5
    links_p[:n, :n] = links
    valid = np.arange(n + extra) < n
    return notes_p, query, links_p, valid


SELECTORS = {
    "cosine": lambda z, q, v, l, k, b: cosine(z, q, v, budget=b),
    "mmr": lambda z, q, v, l, k, b: mmr(z, q, v, budget=b, lam=0.3),
    "dpp": lambda z, q, v, l, k, b: dpp(z, q, v, budget=b, theta=2.0),
    "ppr": lambda z, q, v, l, k, b: ppr(l, z, q, v, budget=b),
    "random": lambda z, q, v, l, k, b: rand(v, budget=b, key=k),
}


# ---------------------------------------------------------------- cosine / MMR


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("seed", range(4))
def test_cosine_is_top_b_relevance(seed):
    notes, query, _ = instance(seed, m=None if seed % 2 else 3)
    sel = cosine(notes, query, np.ones(len(notes), bool), budget=7)
    rel = ref_relevance(notes, query)
    expected = list(np.argsort(-rel, kind="stable")[:7])
    assert picks(sel) == expected
    np.testing.assert_allclose(sel.scores, rel[expected], rtol=0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("seed,lam", [(0, 0.3), (1, 0.5), (2, 0.7), (3, 0.9), (4, 0.0), (5, 1.0)])
def test_mmr_matches_reference_pick_for_pick(seed, lam):
    notes, query, _ = instance(seed, n=40, d=8, m=2 if seed == 1 else None)
    sel = mmr(notes, query, np.ones(40, bool), budget=12, lam=lam)
    assert picks(sel) == ref_mmr(notes, query, 12, lam)


def test_mmr_first_pick_is_most_relevant_and_duplicates_tie_low():
    notes, query, _ = instance(7, n=10, d=5)
    notes = np.concatenate([notes, notes[[3, 3]]])  # rows 10 and 11 copy row 3
    query = unit_rows(notes[3] + 0.05 * notes[0])
    sel = mmr(notes, query, np.ones(12, bool), budget=12, lam=0.6)
    order = picks(sel)
    assert order[0] == 3  # the copies tie with it and lose to the lowest index
    assert order == ref_mmr(notes, query, 12, 0.6)
    assert order.index(10) < order.index(11)  # identical scores: the lower index goes first


# ---------------------------------------------------------------- DPP


@pytest.mark.x64
@pytest.mark.parametrize("seed,quality,theta", [(0, "exp", 1.0), (1, "exp", 3.0), (2, "relu", 1.0), (3, "exp", 0.5)])
def test_dpp_matches_chen_reference_pick_for_pick(seed, quality, theta):
    notes, query, _ = instance(seed, n=40, d=16)
    sel = dpp(notes, query, np.ones(40, bool), budget=10, theta=theta, quality=quality)
    kernel = ref_kernel(notes, query, theta, quality)
    expected = ref_dpp_chen(kernel, 10, EPS64)
    assert picks(sel) == expected
    # Scores are the marginal gains: their running product is det(L_R).
    k = len(expected)
    np.testing.assert_allclose(
        np.prod(np.asarray(sel.scores)[:k]), np.linalg.det(kernel[np.ix_(expected, expected)]), rtol=1e-9
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed,d", [(0, 7), (1, 7), (2, 3), (3, 4)])
def test_dpp_matches_brute_force_logdet_greedy(seed, d):
    notes, query, _ = instance(seed, n=7, d=d)
    sel = dpp(notes, query, np.ones(7, bool), budget=6, theta=1.0)
    expected = ref_dpp_logdet(ref_kernel(notes, query, 1.0, "exp"), 6, EPS64)
    assert picks(sel) == expected
    assert len(expected) == min(6, d)  # the greedy stops once the picks span the embedding space


def test_dpp_stops_early_at_the_rank_and_never_repeats_duplicates():
    notes, query, _ = instance(11, n=6, d=8)
    notes = np.concatenate([notes, notes, notes[:2]])  # 14 rows spanning a 6-dim space
    sel = dpp(notes, query, np.ones(14, bool), budget=10)
    chosen = picks(sel)
    assert len(chosen) == 6
    assert sorted(i % 6 for i in chosen) == list(range(6))
    assert not np.asarray(sel.selected_valid)[6:].any()
    np.testing.assert_array_equal(np.asarray(sel.indices)[6:], 0)
    np.testing.assert_array_equal(np.asarray(sel.scores)[6:], 0.0)


def test_dpp_rejects_unknown_quality():
    notes, query, _ = instance(0, n=5)
    with pytest.raises(ValueError, match="quality"):
        dpp(notes, query, np.ones(5, bool), budget=2, quality="softplus")
    # float32 exp against float64: a few ulps (XLA's exp is not correctly rounded on every CPU)
    np.testing.assert_allclose(dpp_quality(jnp.array([-0.5, 0.5]), 2.0, "exp"), np.exp([-1.0, 1.0]),
                               rtol=4 * np.finfo(np.float32).eps)


# ---------------------------------------------------------------- PPR


@pytest.mark.x64
@pytest.mark.parametrize("seed", range(3))
def test_ppr_vector_matches_linear_solve_and_networkx(seed):
    notes, query, links = instance(seed, n=30)
    links[np.arange(5), np.arange(5) + 1] = True  # some one-way links: symmetrised
    links[:, 25:] = False
    links[25:, :] = False  # five dangling notes
    np.fill_diagonal(links, False)
    seed_vec = ref_softmax(ref_relevance(notes, query) / 0.1)
    r = np.asarray(ppr_vector(links, seed_vec, np.ones(30, bool), damping=0.85, tol=1e-13))
    np.testing.assert_allclose(r, ref_ppr_solve(links, seed_vec, 0.85), rtol=0, atol=1e-11)

    graph = nx.Graph()
    graph.add_nodes_from(range(30))
    graph.add_edges_from(zip(*np.nonzero(links | links.T)))
    uniform = {i: 1.0 / 30 for i in range(30)}
    ranks = nx.pagerank(
        graph, alpha=0.85, personalization=dict(enumerate(seed_vec)), dangling=uniform, tol=1e-14, max_iter=10_000
    )
    np.testing.assert_allclose(r, [ranks[i] for i in range(30)], rtol=0, atol=1e-10)


@pytest.mark.x64
def test_select_ppr_ranks_by_pagerank_and_ignores_self_loops():
    notes, query, links = instance(5, n=30, link_p=0.2)
    np.fill_diagonal(links, False)
    valid = np.ones(30, bool)
    sel = ppr(links, notes, query, valid, budget=8, damping=0.7, temperature=0.2)
    r = ref_ppr_solve(links, ref_softmax(ref_relevance(notes, query) / 0.2), 0.7)
    assert picks(sel) == list(np.argsort(-r, kind="stable")[:8])
    np.testing.assert_allclose(sel.scores, np.sort(r)[::-1][:8], rtol=0, atol=1e-9)
    looped = links.copy()
    np.fill_diagonal(looped, True)
    sel_looped = ppr(looped, notes, query, valid, budget=8, damping=0.7, temperature=0.2)
    assert picks(sel_looped) == picks(sel)


@pytest.mark.slow
@pytest.mark.x64
def test_ppr_on_empty_link_graph_ranks_like_cosine():
    notes, query, _ = instance(3, n=20)
    empty = np.zeros((20, 20), bool)
    sel = ppr(empty, notes, query, np.ones(20, bool), budget=6)
    assert picks(sel) == picks(cosine(notes, query, np.ones(20, bool), budget=6))
    s = ref_softmax(ref_relevance(notes, query) / 0.1)
    np.testing.assert_allclose(sel.scores, np.sort(0.15 * s + 0.85 / 20)[::-1][:6], rtol=0, atol=1e-12)


def test_ppr_rejects_bad_links_and_damping():
    notes, query, links = instance(0, n=6)
    with pytest.raises(ValueError, match="links"):
        ppr(links[:5, :5], notes, query, np.ones(6, bool), budget=2)
    with pytest.raises(ValueError, match="damping"):
        ppr(links, notes, query, np.ones(6, bool), budget=2, damping=1.0)
    with pytest.raises(ValueError, match="temperature"):
        ppr(links, notes, query, np.ones(6, bool), budget=2, temperature=0.0)


# ---------------------------------------------------------------- random


def test_random_key_is_md5_of_query_id_and_draws_are_reproducible():
    key = key_from_query_id("mmlb/0042")
    words = np.frombuffer(hashlib.md5(b"mmlb/0042").digest()[:8], ">u4")
    np.testing.assert_array_equal(jax.random.key_data(key), words)
    seeded = jax.random.key_data(key_from_query_id("mmlb/0042", seed=43))
    np.testing.assert_array_equal(seeded, np.frombuffer(hashlib.md5(b"43:mmlb/0042").digest()[:8], ">u4"))
    valid = np.arange(40) < 33
    a = rand(valid, budget=10, key=key)
    b = rand(valid, budget=10, key=key_from_query_id("mmlb/0042"))
    c = rand(valid, budget=10, key=key_from_query_id("mmlb/0043"))
    assert picks(a) == picks(b) != picks(c)
    assert len(set(picks(a))) == 10 and max(picks(a)) < 33


@pytest.mark.slow
def test_random_is_uniform_over_valid_notes():
    keys = jax.vmap(lambda i: jax.random.fold_in(key_from_query_id("uniformity"), i))(jnp.arange(4000))
    valid = np.arange(12) < 8
    sel = jax.jit(jax.vmap(lambda k: rand(valid, budget=3, key=k)))(keys)
    counts = np.bincount(np.asarray(sel.indices).ravel(), minlength=12)
    assert counts[8:].sum() == 0
    expected = 4000 * 3 / 8
    # Each note's count is Binomial(4000, 3/8): sd ~31; 6 sd is a wide margin.
    assert np.all(np.abs(counts[:8] - expected) < 6 * np.sqrt(4000 * 3 / 8 * 5 / 8))


# ---------------------------------------------------------------- shared properties


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("name", list(SELECTORS))
def test_padding_vmap_and_jit_invariance(name):
    """A vmapped, jitted, padded batch equals per-query unpadded calls."""
    fn = SELECTORS[name]
    budget, n_pad = 6, 32
    rng = np.random.default_rng(99)
    batch, singles = [], []
    for i, n in enumerate([32, 9, 4]):
        notes, query, links = instance(100 + i, n=n, d=6)
        key = key_from_query_id(f"q{i}")
        singles.append(fn(notes, query, np.ones(n, bool), links, key, budget))
        batch.append(pad(notes, query, links, n_pad - n, rng) + (key,))
    stack = [np.stack([b[j] for b in batch]) for j in range(4)]
    keys = jnp.stack([b[4] for b in batch])
    out = jax.jit(jax.vmap(lambda z, q, l, v, k: fn(z, q, v, l, k, budget)))(stack[0], stack[1], stack[2], stack[3], keys)
    for i, single in enumerate(singles):
        np.testing.assert_array_equal(out.selected_valid[i], single.selected_valid)
        np.testing.assert_array_equal(out.indices[i], single.indices)
        np.testing.assert_allclose(out.scores[i], single.scores, rtol=1e-10, atol=1e-12)
    # n < budget: the last problem has 4 notes, so at most 4 picks and a masked tail.
    assert not np.asarray(singles[2].selected_valid)[4:].any()


@pytest.mark.slow
def test_all_relevances_nonpositive():
    rng = np.random.default_rng(4)
    query = unit_rows(rng.normal(size=6))
    notes = unit_rows(rng.normal(size=(15, 6)))
    notes = unit_rows(notes - (notes @ query + 0.1)[:, None] * query)  # push every note to q.z < 0
    assert np.all(notes @ query < 0)
    valid = np.ones(15, bool)
    order = list(np.argsort(-(notes @ query), kind="stable")[:5])
    assert picks(cosine(notes, query, valid, budget=5)) == order
    assert picks(mmr(notes, query, valid, budget=5, lam=0.5)) == ref_mmr(notes, query, 5, 0.5)
    # relu quality is zero everywhere: no note has a positive gain, nothing is selected.
    relu = dpp(notes, query, valid, budget=5, quality="relu")
    assert not np.asarray(relu.selected_valid).any()
    kernel = ref_kernel(notes, query, 1.0, "exp")
    assert picks(dpp(notes, query, valid, budget=5)) == ref_dpp_chen(kernel, 5, EPS64)
    assert len(picks(ppr(np.zeros((15, 15), bool), notes, query, valid, budget=5))) == 5


def test_selectors_reject_bad_static_arguments():
    notes, query, links = instance(0, n=8)
    valid = np.ones(8, bool)
    with pytest.raises(ValueError, match="budget"):
        cosine(notes, query, valid, budget=0)
    with pytest.raises(ValueError, match="lam"):
        mmr(notes, query, valid, budget=2, lam=1.5)
    with pytest.raises(ValueError, match="query"):
        mmr(notes, query[:3], valid, budget=2)
    with pytest.raises(ValueError, match="valid"):
        dpp(notes, query, valid[:5], budget=2)
    with pytest.raises(ValueError, match="key"):
        rand(valid, budget=2, key=None)
    with pytest.raises(TypeError, match="query_id"):
        key_from_query_id(42)


# ---------------------------------------------------------------- graph-diffusion prior


@pytest.mark.x64
def test_diffusion_prior_is_pagerank_of_the_softmax_seed():
    notes, query, links = instance(8, n=18, m=2)
    notes_p, _, links_p, valid = pad(notes, query, links, 6, np.random.default_rng(0))
    affinity = build_affinity(notes_p, query, valid)
    x0 = np.asarray(diffusion_prior(affinity, links_p, 0.1))
    rel = np.maximum(ref_relevance(notes, query), 0.0)
    seed = ref_softmax(rel / 0.1)
    r = ref_ppr_solve(links, seed, 0.85)
    total = 2 + 18
    expected = np.concatenate([[1 / total, 1 / total], r * (1 - 2 / total), np.zeros(6)])
    # ppr_vector stops at a max-norm step below 1e-9, i.e. within ~gamma/(1-gamma) * 1e-9 of the fixed point.
    np.testing.assert_allclose(x0, expected, rtol=0, atol=1e-8)
    assert abs(x0.sum() - 1.0) < 1e-12

    kw = dict(budget=5, max_iter=300)
    via_init = cds_select(notes_p, query, valid, init="diffusion", links=links_p, **kw)
    via_x0 = cds_select(notes_p, query, valid, x0=x0, **kw)
    np.testing.assert_array_equal(via_init.indices, via_x0.indices)
    np.testing.assert_allclose(via_init.result.x, via_x0.result.x, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="links"):
        cds_select(notes_p, query, valid, init="diffusion", **kw)


@pytest.mark.slow
@pytest.mark.x64  # exactness is the point: jit may fuse float32 ops differently from eager (FMA), float64 keeps 1e-12
def test_jit_equals_eager():
    notes, query, links = instance(21, n=40, d=8)
    valid = np.arange(40) < 35
    key = key_from_query_id("eager")
    pairs = [
        (select_cosine(notes, query, valid, budget=12), cosine(notes, query, valid, budget=12)),
        (select_mmr(notes, query, valid, budget=12, lam=0.5), mmr(notes, query, valid, budget=12, lam=0.5)),
        (select_dpp(notes, query, valid, budget=12), dpp(notes, query, valid, budget=12)),
        (select_ppr(links, notes, query, valid, budget=12), ppr(links, notes, query, valid, budget=12)),
        (select_random(valid, budget=12, key=key), rand(valid, budget=12, key=key)),
    ]
    for eager, jitted in pairs:
        np.testing.assert_array_equal(eager.indices, jitted.indices)
        np.testing.assert_array_equal(eager.selected_valid, jitted.selected_valid)
        np.testing.assert_allclose(eager.scores, jitted.scores, rtol=1e-12, atol=1e-14)
