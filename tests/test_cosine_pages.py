"""cosine_pages: cosine top-B with at most one note per page first (select_cosine_pages)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax.core.baselines import select_cosine, select_cosine_pages


def _problem(seed, n=23, d=8, num_pages=6):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, d)).astype(np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = rng.normal(size=d).astype(np.float32)
    q /= np.linalg.norm(q)
    pages = rng.integers(0, num_pages, size=n).astype(np.int32)
    return z, q, pages


def _reference(z, q, pages, budget, docs=None, fill=True):
    """Greedy in plain Python: best note of each unit in cosine order, then the next tier."""
    rel = z @ q
    units = list(zip(docs if docs is not None else [0] * len(pages), pages))
    order = sorted(range(len(rel)), key=lambda i: (-rel[i], i))
    tiers, seen = {}, {}
    for i in order:
        tiers[i] = seen.get(units[i], 0)
        seen[units[i]] = tiers[i] + 1
    picks = sorted(order, key=lambda i: (tiers[i], -rel[i], i))
    if not fill:
        picks = [i for i in picks if tiers[i] == 0]
    return picks[:budget]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fill", [True, False])
def test_matches_greedy_reference(seed, fill):
    z, q, pages = _problem(seed)
    sel = select_cosine_pages(z, q, np.ones(len(z), bool), pages, budget=10, fill=fill)
    got = [int(i) for i, ok in zip(sel.indices, sel.selected_valid) if ok]
    assert got == _reference(z, q, pages, 10, fill=fill)
    if not fill:
        assert len(got) == min(10, len(set(pages.tolist())))


@pytest.mark.slow
def test_first_picks_are_distinct_pages_and_differ_from_cosine():
    z, q, pages = _problem(7, n=30, num_pages=5)
    valid = np.ones(30, bool)
    sel = select_cosine_pages(z, q, valid, pages, budget=5)
    assert len({int(pages[i]) for i in sel.indices}) == 5
    cos = select_cosine(z, q, valid, budget=5)
    assert int(sel.indices[0]) == int(cos.indices[0])  # the best note overall comes first


@pytest.mark.slow
def test_doc_ids_make_units_document_pages():
    z, q, pages = _problem(3, n=20, num_pages=2)
    docs = np.arange(20) % 4
    sel = select_cosine_pages(z, q, np.ones(20, bool), pages, budget=8, doc_ids=docs)
    got = [int(i) for i in sel.indices]
    assert got == _reference(z, q, pages, 8, docs=docs)
    assert len({(int(docs[i]), int(pages[i])) for i in got}) == 8


@pytest.mark.slow
def test_padding_jit_and_vmap_invariance():
    z, q, pages = _problem(11, n=17)
    base = select_cosine_pages(z, q, np.ones(17, bool), pages, budget=6)
    zp = np.concatenate([z, np.tile(z[:1], (15, 1))])
    pp = np.concatenate([pages, np.zeros(15, np.int32)])
    vp = np.arange(32) < 17
    fn = jax.jit(lambda a, b, c, d: select_cosine_pages(a, b, c, d, budget=6))
    padded = fn(zp, q, vp, pp)
    np.testing.assert_array_equal(np.asarray(padded.indices), np.asarray(base.indices))
    np.testing.assert_array_equal(np.asarray(padded.scores), np.asarray(base.scores))
    batch = jax.vmap(fn)(jnp.stack([zp, zp]), jnp.stack([q, -q]), jnp.stack([vp, vp]), jnp.stack([pp, pp]))
    np.testing.assert_array_equal(np.asarray(batch.indices[0]), np.asarray(base.indices))
    alone = select_cosine_pages(z, -q, np.ones(17, bool), pages, budget=6)
    np.testing.assert_array_equal(np.asarray(batch.indices[1]), np.asarray(alone.indices))


@pytest.mark.slow
def test_budget_above_note_count_is_masked():
    z, q, pages = _problem(5, n=4, num_pages=2)
    sel = select_cosine_pages(z, q, np.ones(4, bool), pages, budget=7)
    assert sel.indices.shape == (7,)
    assert int(np.sum(sel.selected_valid)) == 4
    sel = select_cosine_pages(z, q, np.ones(4, bool), pages, budget=7, fill=False)
    assert int(np.sum(sel.selected_valid)) == len(set(pages.tolist()))


def test_bad_pages_shape_is_one_clear_error():
    z, q, pages = _problem(0, n=5)
    with pytest.raises(ValueError, match="pages must have shape"):
        select_cosine_pages(z, q, np.ones(5, bool), pages[:3], budget=2)
