"""Structured subgraph readout against a literal NumPy/Python reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.baselines import select_cosine
from tests.conftest import on_arrays
from cdsjax.core.subgraph import select_subgraph_readout

readout = jax.jit(select_subgraph_readout, static_argnames=("budget",))


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def instance(seed, n=30, d=6, m=None, link_p=0.1):
    rng = np.random.default_rng(seed)
    notes = unit_rows(rng.normal(size=(n, d)))
    query = unit_rows(rng.normal(size=(d,) if m is None else (m, d)))
    links = rng.random((n, n)) < link_p
    return notes, query, links


def ref_readout(links, notes, query, budget):
    """The paper's loop with sets: V_out <- V_out + {v} + N(v) in cosine order, cut at budget."""
    rel = np.max(np.atleast_2d(query) @ notes.T, axis=0)
    n = len(rel)
    ranked = sorted(range(n), key=lambda i: (-rel[i], i))
    out = []
    for v in ranked:
        if len(out) >= budget:
            break
        if v not in out:
            out.append(v)
        neighbours = [j for j in range(n) if j != v and (links[v, j] or links[j, v]) and j not in out]
        out.extend(sorted(neighbours, key=lambda j: (-rel[j], j)))
    out = out[:budget]
    return out, rel[out]


def picks(sel):
    ok = np.asarray(sel.selected_valid)
    assert ok[: int(ok.sum())].all(), "valid picks must form a prefix"
    return [int(i) for i in np.asarray(sel.indices)[ok]]


@pytest.mark.slow
@pytest.mark.x64
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 5, 12])
def test_matches_reference(seed, budget):
    notes, query, links = instance(seed, m=None if seed % 2 else 3, link_p=0.04 + 0.03 * seed)
    want, want_scores = ref_readout(links, notes, query, budget)
    sel = readout(links, notes, query, np.ones(len(notes), bool), budget=budget)
    assert picks(sel) == want
    np.testing.assert_allclose(np.asarray(sel.scores)[: len(want)], want_scores, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_neighbours_join_right_after_their_seed():
    # Chain 0 - 3 - 4; note 0 is most relevant, so its neighbour 3 follows it even
    # though 1 and 2 are more relevant than 3; 4 is 3's neighbour, not 0's.
    rel = np.array([0.9, 0.8, 0.7, 0.1, 0.05])
    notes = np.stack([rel, np.sqrt(1 - rel ** 2), np.zeros(5)], axis=1)
    query = np.array([1.0, 0.0, 0.0])
    links = np.zeros((5, 5), bool)
    links[0, 3] = links[4, 3] = True  # direction does not matter
    sel = readout(links, notes, query, np.ones(5, bool), budget=4)
    assert picks(sel) == [0, 3, 1, 2]
    sel = readout(links, notes, query, np.ones(5, bool), budget=5)
    assert picks(sel) == [0, 3, 1, 2, 4]


@pytest.mark.slow
def test_without_links_it_is_cosine_top_b():
    notes, query, _ = instance(7)
    valid = np.ones(len(notes), bool)
    sel = readout(np.zeros((len(notes),) * 2, bool), notes, query, valid, budget=8)
    cos = select_cosine(notes, query, valid, budget=8)
    assert picks(sel) == picks(cos)


@pytest.mark.slow
def test_fully_linked_graph_fills_from_the_first_seed():
    notes, query, _ = instance(8, n=10)
    links = np.ones((10, 10), bool)
    sel = readout(links, notes, query, np.ones(10, bool), budget=10)
    rel = notes @ query
    assert picks(sel) == sorted(range(10), key=lambda i: -rel[i])


@pytest.mark.slow
def test_padding_is_never_selected_or_expanded():
    notes, query, links = instance(9, n=20, link_p=0.3)
    n_valid = 13
    valid = np.arange(20) < n_valid
    padded_notes = np.where(valid[:, None], notes, 0.0)
    padded_links = links.copy()
    padded_links[:, n_valid:] = True  # links into padding must be ignored
    sel = readout(padded_links, padded_notes, query, valid, budget=16)
    want, _ = ref_readout(links[:n_valid, :n_valid], notes[:n_valid], query, 16)
    assert picks(sel) == want and len(want) == n_valid  # fewer than budget: masked tail
    assert not np.asarray(sel.selected_valid)[n_valid:].any()
    assert np.all(np.asarray(sel.indices)[n_valid:] == 0) and np.all(np.asarray(sel.scores)[n_valid:] == 0)


@pytest.mark.slow
def test_vmap_over_padded_batch_equals_single_calls():
    problems = [instance(s, n=n, m=2 if s % 2 else None, link_p=0.15) for s, n in zip(range(10, 14), (9, 16, 12, 5))]
    n_max, budget = 16, 6
    notes_b, queries_b, links_b, valid_b = [], [], [], []
    for notes, query, links in problems:
        n = len(notes)
        notes_b.append(np.pad(notes, ((0, n_max - n), (0, 0))))
        queries_b.append(np.atleast_2d(query)[:1].repeat(2, 0) if query.ndim == 1 else query)
        links_b.append(np.pad(links, ((0, n_max - n), (0, n_max - n))))
        valid_b.append(np.arange(n_max) < n)
    fn = jax.jit(jax.vmap(lambda l, z, q, v: select_subgraph_readout(l, z, q, v, budget=budget)))
    batch = fn(*(np.stack(a) for a in (links_b, notes_b, queries_b, valid_b)))
    for i, (notes, query, links) in enumerate(problems):
        single = readout(links, notes, queries_b[i], np.ones(len(notes), bool), budget=budget)
        np.testing.assert_array_equal(np.asarray(batch.indices[i]), np.asarray(single.indices))
        np.testing.assert_array_equal(np.asarray(batch.selected_valid[i]), np.asarray(single.selected_valid))
        # float32 scores (cosines, |s| <= 1): padding changes the matmul's summation, so the two may differ in
        # the last bits; a few ulps of 1.0 is what float32 guarantees here (3.6e-7 relative was seen)
        np.testing.assert_allclose(np.asarray(batch.scores[i]), np.asarray(single.scores), rtol=0,
                                   atol=8 * np.finfo(np.float32).eps)


@pytest.mark.slow
def test_jit_equals_eager_and_float32():
    notes, query, links = instance(3, n=12, link_p=0.2)
    valid = np.ones(len(notes), bool)
    eager = select_subgraph_readout(links, notes, query, valid, budget=7)
    jitted = readout(links, notes, query, valid, budget=7)
    assert picks(eager) == picks(jitted)
    f32 = readout(links, notes.astype(np.float32), query.astype(np.float32), valid, budget=7)
    assert picks(f32) == picks(eager) and f32.scores.dtype == jnp.float32


@pytest.mark.slow
def test_registry_entry():
    notes, query, links = instance(4, link_p=0.2)
    valid = np.ones(len(notes), bool)
    fn = on_arrays(core.make_selector("subgraph", budget=6))
    sel = jax.jit(fn)(notes, query, valid, links, None)
    assert picks(sel) == ref_readout(links, notes, query, 6)[0]
    with pytest.raises(ValueError, match="links"):
        fn(notes, query, valid, None, None)


def test_bad_arguments():
    notes, query, links = instance(5, n=8)
    valid = np.ones(8, bool)
    with pytest.raises(ValueError, match="links must have shape"):
        select_subgraph_readout(links[:7, :7], notes, query, valid, budget=3)
    with pytest.raises(ValueError, match="budget"):
        select_subgraph_readout(links, notes, query, valid, budget=0)
    with pytest.raises(ValueError, match="valid"):
        select_subgraph_readout(links, notes, query, valid[:7], budget=3)
