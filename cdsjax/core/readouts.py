r"""The per-page read-out: any selector's ranking of the notes read page by page, at most ``k`` notes of a page per
round. The registry (:mod:`cdsjax.core.registry`) builds its ``*_pages`` selectors with :func:`per_page`; each builder
returns ``fn(problem: CDSProblem, key=None) -> Selection``. All pure JAX, ``jit`` / ``vmap``-able, padding inert.

* **The structured read-out** (:func:`structured_readout`, :func:`select_structured`): the best ``k`` notes of every
  page in the ranking's order first, then the next ``k`` of every page, and so on. Applied to cosine with ``k = 1``
  it is ``cosine-pages``; applied to an equilibrium it is "the rule applied to the game's ranking". The ranking of a
  selector is its own order of picks when it is asked for every note (:func:`ranking_of`: the equilibrium's support
  by weight, then its fill rule; MMR's and k-DPP's greedy order, to a depth).
* **Captions** (:func:`fold_described`, ``describes`` ``[n]`` int: the index of the note a note describes, -1 for
  none): a note that describes another -- the caption (or Note/Source line) of a figure, table or chart -- is read
  as part of what it describes: the visual takes the best rank of itself and its caption notes and stands for them,
  one slot, so a read-out never picks a caption and leaves its table behind. The visual's own note carries its
  caption's text.

Units: ``pages`` ``[n]`` int (a page, or any grouping a caller chooses), with ``doc_ids`` ``[n]`` int telling units
of several documents apart. (The page game, whose vertices are pages, is an experiment: ``experiments/page_game.py``.)
"""

from __future__ import annotations

from typing import Callable, Optional

import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.baselines import cut_to_budget
from cdsjax.core.types import FILL_NONE, FILL_SHORT_SUPPORT, CDSProblem, Selection, Selector
from cdsjax.core.validation import as_query_matrix, check_budget, check_int_range, check_notes_valid, query_similarity

# MMR / k-DPP rank this many times the budget by their own greedy order (the rest by cosine): a page read-out of
# B notes needs the ranking only until B pages have shown up, and a greedy pass over every note of a 5-document
# pool would cost n steps of O(n) each.
GREEDY_DEPTH_FACTOR = 8
# ranks below this in magnitude are exact as float32, whose top-B (lax.top_k) is a partial pass, not a sort
EXACT_RANK = 2 ** 24


def structured_readout(rank: Array, valid: Array, pages: Array, *, budget: int, k: int = 1,
                       doc_ids: Optional[Array] = None, fill: bool = True) -> tuple[Array, Array]:
    """Picks ``budget`` notes reading a ranking page by page (module docstring).

    Args:
      rank: ``[n]`` int, each note's position in the ranking (lower first; distinct on valid notes).
      valid: ``[n]`` bool, True on real notes.
      pages: ``[n]`` int unit of each note.
      budget: static number of picks.
      k: notes a page gives per round (static, >= 1).
      doc_ids: optional ``[n]`` int document of each note (units are then ``(document, page)``).
      fill: after the first round, keep going (the next ``k`` of every page); False stops after ``k`` per page.

    Returns:
      ``(indices [budget] int32, selected_valid [budget] bool)``.
    """
    budget = check_budget(budget)
    if int(k) < 1:
        raise ValueError(f"k (notes per page) must be >= 1, got {k!r}")
    valid = jnp.asarray(valid, bool)
    n = valid.shape[0]
    rank = jnp.asarray(rank)
    pages = jnp.asarray(pages)
    doc_ids = None if doc_ids is None else jnp.asarray(doc_ids)
    for name, codes in (("pages", pages), ("doc_ids", doc_ids)):
        if codes is not None and codes.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {codes.shape}")

    def every_group():
        group = unit_tier(rank, valid, pages, doc_ids) // int(k)
        eligible = valid if fill else valid & (group == 0)
        group = jnp.where(eligible, group, n + 1)
        order = jnp.lexsort((jnp.arange(n), rank, group))  # last key first: group, then rank, then index
        return cut_to_budget(order, eligible, budget)

    if budget > n or not jnp.issubdtype(rank.dtype, jnp.integer):
        return every_group()
    # The first round's notes (fewer than k notes of their unit rank before them), by rank then index, open that
    # order. Where the first `top` notes of the ranking hold `budget` of them (the usual case: more pages than
    # picks), they are read off those notes alone: a top-k of the ranks (exact as float32 below 2**24) and the
    # units of `top` notes compared, instead of sorting every note by unit and by group.
    top = min(n, max(64, 16 * budget))
    listed_ok = valid & (rank < EXACT_RANK)
    keys, listed = lax.top_k(jnp.where(listed_ok, -rank.astype(jnp.float32), -jnp.inf), top)
    real = keys > -jnp.inf
    r = rank[listed]
    same_unit = pages[listed][:, None] == pages[listed][None, :]
    if doc_ids is not None:
        same_unit = same_unit & (doc_ids[listed][:, None] == doc_ids[listed][None, :])
    before = jnp.sum(same_unit & real[None, :] & (r[None, :] < r[:, None]), axis=1)
    first = real & (before < int(k))
    shortcut = (jnp.sum(first) >= budget) & ~jnp.any(valid & (rank <= -EXACT_RANK))

    def first_round():
        slot = jnp.cumsum(first) - 1
        idx = jnp.zeros((budget,), jnp.int32).at[jnp.where(first, slot, budget)].set(listed.astype(jnp.int32),
                                                                                  mode="drop")
        return idx, jnp.ones((budget,), bool)

    return lax.cond(shortcut, first_round, every_group)


def unit_tier(rank: Array, valid: Array, pages: Array, doc_ids: Optional[Array] = None) -> Array:
    """``[n]`` int32: for each valid note, how many valid notes of its unit (page, or ``(document, page)``) rank
    before it (a smaller ``rank``); 0 on padding. One sort of the notes by unit and rank, O(n log n) where comparing
    every pair (:func:`cdsjax.core.baselines.same_unit`) is O(n²): the same counts, ties included."""
    n = valid.shape[0]
    pages = jnp.asarray(pages)
    if pages.shape != (n,):
        raise ValueError(f"pages must have shape ({n},), got {pages.shape}")
    docs = jnp.zeros((n,), jnp.int32) if doc_ids is None else jnp.asarray(doc_ids)
    if docs.shape != (n,):
        raise ValueError(f"doc_ids must have shape ({n},), got {docs.shape}")
    order = jnp.lexsort((rank, pages, docs, ~valid))  # the last key first: valid notes, then by unit, then rank
    d, p, r, v = docs[order], pages[order], rank[order], valid[order]
    pos = jnp.arange(n)
    new_unit = jnp.concatenate([jnp.ones((1,), bool), (d[1:] != d[:-1]) | (p[1:] != p[:-1]) | (v[1:] != v[:-1])])
    new_rank = new_unit | jnp.concatenate([jnp.ones((1,), bool), r[1:] != r[:-1]])
    unit_start = lax.cummax(jnp.where(new_unit, pos, 0))
    rank_start = lax.cummax(jnp.where(new_rank, pos, 0))  # a tie counts the notes before the tied ones only
    tier = jnp.where(v, rank_start - unit_start, 0).astype(jnp.int32)
    return jnp.zeros((n,), jnp.int32).at[order].set(tier)


def fold_described(rank: Array, valid: Array, describes: Array) -> tuple[Array, Array]:
    """``(rank [n] int32, readable [n] bool)``: a ranking with every note that describes another read as part of it.

    Note ``i`` describes note ``j`` when ``describes[i] == j`` (a caption or footnote of a figure, table or chart;
    -1: none). Where ``i`` and ``j`` are valid, ``j != i`` and ``j`` describes nothing itself, ``i`` is *folded*
    into ``j``: ``j`` takes the best (lowest) rank of itself and the notes folded into it, and the folded notes
    leave the read-out (``readable`` False), so the pair fills one slot, the visual's. Other notes keep their rank
    and valid notes stay readable; entries of padding (``valid`` False) and out-of-range indices are ignored.
    Ranks stay distinct on readable notes when they were distinct on valid ones (each readable note takes the
    minimum of its own, disjoint, set). Pure, ``jit`` / ``vmap``-able.
    """
    valid = jnp.asarray(valid, bool)
    n = valid.shape[0]
    rank = jnp.asarray(rank).astype(jnp.int32)
    describes = jnp.asarray(describes).astype(jnp.int32)
    if describes.shape != (n,) or rank.shape != (n,):
        raise ValueError(f"rank and describes must have shape ({n},), got {rank.shape} and {describes.shape}")
    pos = jnp.arange(n, dtype=jnp.int32)
    points = valid & (describes >= 0) & (describes < n) & (describes != pos)
    target = jnp.where(points, describes, pos)
    folded = points & valid[target] & ~points[target]
    owner = jnp.where(folded, target, pos)
    big = jnp.iinfo(jnp.int32).max
    best = jnp.full((n,), big, jnp.int32).at[owner].min(jnp.where(valid, rank, big))
    return jnp.where(valid & ~folded, best, rank), valid & ~folded


def rank_positions(indices: Array, selected_valid: Array, valid: Array, tie: Array) -> Array:
    """``[n]`` int32 positions of a ranking given by a selection's picks: picked notes by their slot, the others
    after them by ``tie`` (larger first, e.g. the cosine), then by index; padding last."""
    n = valid.shape[0]
    slots = jnp.arange(indices.shape[0])
    big = indices.shape[0] + n
    slot = jnp.full((n,), big, jnp.int32).at[indices].min(jnp.where(selected_valid, slots, big).astype(jnp.int32))

    def by_sort():
        keys = (jnp.arange(n), -jnp.where(valid, tie, -jnp.inf), slot, ~valid)
        order = jnp.lexsort(keys)
        return jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))

    # a ranking of every valid note (an equilibrium's support, then its fill rule) picks each one in the first
    # slots: their positions are their slots, padding's the next ones by index, without a sort
    count = jnp.sum(valid).astype(jnp.int32)
    whole = jnp.all(jnp.where(valid, slot < count, slot == big))
    return lax.cond(whole, lambda: jnp.where(valid, slot, count + jnp.cumsum(~valid, dtype=jnp.int32) - 1),
                    by_sort)


def best_cosine(notes: Array, query: Array, valid: Array, query_scores: Optional[Array] = None) -> Array:
    """``[n]`` each note's best cosine over the query rows (or best ``query_scores``, the problem's relevance in
    its place), -inf at padding (the read-out's scores and ties)."""
    queries = as_query_matrix(query, notes)
    rel = jnp.max(query_similarity(notes, queries, query_scores), axis=0)
    return jnp.where(valid, rel, -jnp.inf)


def ranking_of(build: Callable[[int], Callable[..., Selection]], notes: Array, query: Array, valid: Array,
               depth: Optional[int] = None, *, query_scores: Optional[Array] = None,
               **kwargs) -> tuple[Array, Selection]:
    """``(rank [n], selection)``: the ranking of a selector, built by ``build(budget)``, asked for ``depth`` notes
    (None: every note; statically capped at ``n``) and called with ``notes, query, valid`` and ``kwargs``."""
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    n = notes.shape[0]
    depth = n if depth is None else max(1, min(int(depth), n))
    sel = build(depth)(notes, query, valid, **kwargs)
    return rank_positions(sel.indices, sel.selected_valid, valid, best_cosine(notes, query, valid, query_scores)), sel


def select_structured(build: Callable[[int], Callable[..., Selection]], notes: Array, query: Array, valid: Array,
                      pages: Array, *, budget: int, k: int = 1, doc_ids: Optional[Array] = None,
                      depth: Optional[int] = None, fill: bool = True, describes: Optional[Array] = None,
                      query_scores: Optional[Array] = None, **kwargs) -> Selection:
    """The structured read-out of a selector (module docstring): its ranking (:func:`ranking_of`), read at most
    ``k`` notes per page per round. With ``describes`` (``[n]`` int, :func:`fold_described`), a caption is read as
    part of the visual it describes: the visual at the better of the two ranks, in one slot. Scores are the notes'
    cosine; ``result``, ``support_size`` and ``beta`` are the ranking selection's (a CDS equilibrium's diagnostics
    survive the read-out)."""
    budget = check_budget(budget)
    rank, sel = ranking_of(build, notes, query, valid, depth, query_scores=query_scores, **kwargs)
    readable = jnp.asarray(valid, bool)
    if describes is not None:
        rank, readable = fold_described(rank, readable, describes)
    idx, ok = structured_readout(rank, readable, pages, budget=budget, k=k, doc_ids=doc_ids, fill=fill)
    cos = best_cosine(jnp.asarray(notes), query, jnp.asarray(valid, bool), query_scores)
    sel = sel.replace(indices=idx, selected_valid=ok, scores=jnp.where(ok, cos[idx], 0.0))
    if sel.support_size is None:
        return sel
    # an equilibrium's ranking lists its support first: picks ranked past it came from the fill rule
    filled = jnp.sum(ok & (rank[idx] >= sel.support_size)).astype(jnp.int32)
    return sel.replace(num_filled=filled,
                       fill_reason=jnp.where(filled > 0, FILL_SHORT_SUPPORT, FILL_NONE).astype(jnp.int32))


# notes_per_page: the k of the read-out (at most k notes of a page per round)
PAGE_OPTIONS = ("notes_per_page",)
MAX_NOTES_PER_PAGE = 1_000_000


def _needs_pages(problem: CDSProblem, name: str):
    if problem.pages is None:
        raise ValueError(f"selector {name!r} needs pages ([n] int page, or paragraph group, of each note)")
    return problem.pages


def per_page(name: str, base: Callable[..., Callable], *, greedy: bool = False,
             captions: bool = False) -> Callable[..., Callable]:
    """The builder of ``base`` read page by page: ``base``'s ranking of the notes (every note; a greedy baseline
    to :data:`GREEDY_DEPTH_FACTOR` times the budget, then cosine), at most
    ``notes_per_page`` notes of a page per round (:func:`select_structured`). The units are
    the problem's ``pages`` with its ``doc_ids``. ``captions``: a caption is read with the visual it describes
    (the problem's ``describes``, :func:`fold_described`; a problem without it has no
    captions to fold)."""

    def build(budget: int, *, notes_per_page: int = 1, **options) -> Callable:
        check_int_range("notes_per_page", notes_per_page, MAX_NOTES_PER_PAGE)
        probe = base(budget, **options)  # checks the base's options once, at build time
        depth = GREEDY_DEPTH_FACTOR * budget if greedy else None

        def fn(problem: CDSProblem, key=None) -> Selection:
            pages = _needs_pages(problem, name)

            def ranked(b):
                inner = base(b, **options)
                return lambda notes, query, valid: inner(problem, key)

            return select_structured(ranked, problem.notes, problem.queries, problem.valid, pages, budget=budget,
                                     k=notes_per_page, doc_ids=problem.doc_ids, depth=depth,
                                     describes=problem.describes if captions else None,
                                     query_scores=problem.query_scores)

        # the base game's corpus-level bound and note block (budget-free): a warm corpus reads its questions
        # without an eigendecomposition each, as the base selector does (the ranking reads problem.note_block)
        if isinstance(probe, Selector):
            return Selector(fn, corpus_bound=probe.corpus_bound, corpus_block=probe.corpus_block,
                            solver=probe.solver)
        return fn

    return build
