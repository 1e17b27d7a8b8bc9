r"""Evidence read with the document's structure: at most ``k`` notes per page, and a game over pages.

Three ways a selection can see pages (all pure JAX, ``jit`` / ``vmap``-able, padding inert):

* **The structured read-out** (:func:`structured_readout`, :func:`select_structured`): any selector's ranking of
  the notes, read page by page — the best ``k`` notes of every page in that ranking's order first, then the next
  ``k`` of every page, and so on. Applied to cosine with ``k = 1`` it is ``cosine-pages``; applied to an
  equilibrium it is "the rule applied to the game's ranking". The ranking of a selector is its own order of picks
  when it is asked for every note (:func:`ranking_of`: the equilibrium's support by weight, then its fill rule;
  MMR's and k-DPP's greedy order, to a depth).
* **The page game** (:func:`page_affinity`, :func:`select_page_game`): the vertices are pages. A page's vector is
  the normalised sum of its notes' embeddings, its query edge is its best note's (clipped) cosine, the page--page
  edge is :math:`\beta(1 - v_p^\top v_{p'})` (plus ``w_doc`` for two pages of one document, in pools). The
  equilibrium ranks pages (support by weight, then the KKT slack, then the best note's cosine); the evidence is
  the best notes of the ranked pages, ``k`` per page per round.
* **The sparse regime** (``alpha_factor < 1``): the penalty :math:`\alpha = b + (f - 1)|b|` below the spectral
  bound :math:`b`, where the payoff is no longer concave on the free vertices and an equilibrium is a small
  cohesive set (a dominant set proper) instead of a ranking of everything. The query may then leave the support;
  :func:`solve_peeling_to_query` keeps it there by peeling off the supports that miss it (the peeling
  extraction's rounds, stopped at the first that covers the query), or the game at the bound is read
  (:func:`keep_query`); either way the read-out ranks every note (support, then slack).

A note that describes another -- the caption (or Note/Source line) of a figure, table or chart -- can be read as
part of what it describes (:func:`fold_described`, ``describes`` ``[n]`` int: the index of the note a note describes,
-1 for none): the visual takes the best rank of itself and its caption notes and stands for them, one slot, so a
read-out never picks a caption and leaves its table behind. The visual's own note carries its caption's text.

Units: ``pages`` ``[n]`` int (a page, or any grouping a caller chooses), with ``doc_ids`` ``[n]`` int telling
units of several documents apart. A unit is represented by its first valid note (:func:`page_units`), so the page
game has the same static size as the note game and padding notes are never a unit.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.games.affinity import spectral_penalty
from cdsjax.core.baselines import cut_to_budget, same_unit
from cdsjax.core.implicit import ImplicitAdjoint, LoopAdjoint, equilibrium
from cdsjax.core.surrogates import equilibrium_scores
from cdsjax.core.ranking import read_selection
from cdsjax.core.solvers.replicator import softmax_prior
from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.types import FILL_NONE, FILL_SHORT_SUPPORT, SUPPORT_THRESHOLD, Affinity, Selection
from cdsjax.core.validation import as_query_matrix, check_budget, check_notes_valid

# The options of the page game and the sparse regime when none are given: the converged (active-set) solver.
STRUCTURE_OPTIONS = SolveOptions(solver=ActiveSet())
# MMR / k-DPP rank this many times the budget by their own greedy order (the rest by cosine): a page read-out of
# B notes needs the ranking only until B pages have shown up, and a greedy pass over every note of a 5-document
# pool would cost n steps of O(n) each.
GREEDY_DEPTH_FACTOR = 8


def page_units(pages: Array, valid: Array, doc_ids: Optional[Array] = None) -> tuple[Array, Array, Array]:
    """``(same [n, n] bool, rep [n] bool, owner [n] int32)``: which valid notes share a unit, which note represents
    its unit (the first valid one), and each note's representative (0 at padding)."""
    valid = jnp.asarray(valid, bool)
    same = same_unit(pages, valid, doc_ids)
    pos = jnp.arange(valid.shape[0])
    earlier = same & (pos[None, :] < pos[:, None])
    rep = valid & ~jnp.any(earlier, axis=1)
    owner = jnp.argmax(same & rep[None, :], axis=1).astype(jnp.int32)
    return same, rep, owner


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
    same = same_unit(pages, valid, doc_ids)
    tier = jnp.sum(same & (rank[None, :] < rank[:, None]), axis=1)
    group = tier // int(k)
    eligible = valid if fill else valid & (group == 0)
    group = jnp.where(eligible, group, n + 1)
    order = jnp.lexsort((jnp.arange(n), rank, group))  # last key first: group, then rank, then index
    return cut_to_budget(order, eligible, budget)


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
    keys = (jnp.arange(n), -jnp.where(valid, tie, -jnp.inf), slot, ~valid)
    order = jnp.lexsort(keys)
    return jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))


def _cosine(notes: Array, query: Array, valid: Array) -> Array:
    queries = as_query_matrix(query, notes)
    rel = jnp.max(queries @ notes.T, axis=0)
    return jnp.where(valid, rel, -jnp.inf)


def ranking_of(build: Callable[[int], Callable[..., Selection]], notes: Array, query: Array, valid: Array,
               depth: Optional[int] = None, **kwargs) -> tuple[Array, Selection]:
    """``(rank [n], selection)``: the ranking of a selector, built by ``build(budget)``, asked for ``depth`` notes
    (None: every note; statically capped at ``n``) and called with ``notes, query, valid`` and ``kwargs``."""
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    n = notes.shape[0]
    depth = n if depth is None else max(1, min(int(depth), n))
    sel = build(depth)(notes, query, valid, **kwargs)
    return rank_positions(sel.indices, sel.selected_valid, valid, _cosine(notes, query, valid)), sel


def select_structured(build: Callable[[int], Callable[..., Selection]], notes: Array, query: Array, valid: Array,
                      pages: Array, *, budget: int, k: int = 1, doc_ids: Optional[Array] = None,
                      depth: Optional[int] = None, fill: bool = True, describes: Optional[Array] = None,
                      **kwargs) -> Selection:
    """The structured read-out of a selector (module docstring): its ranking (:func:`ranking_of`), read at most
    ``k`` notes per page per round. With ``describes`` (``[n]`` int, :func:`fold_described`), a caption is read as
    part of the visual it describes: the visual at the better of the two ranks, in one slot. Scores are the notes'
    cosine; ``result``, ``support_size`` and ``beta`` are the ranking selection's (a CDS equilibrium's diagnostics
    survive the read-out)."""
    budget = check_budget(budget)
    rank, sel = ranking_of(build, notes, query, valid, depth, **kwargs)
    readable = jnp.asarray(valid, bool)
    if describes is not None:
        rank, readable = fold_described(rank, readable, describes)
    idx, ok = structured_readout(rank, readable, pages, budget=budget, k=k, doc_ids=doc_ids, fill=fill)
    cos = _cosine(jnp.asarray(notes), query, jnp.asarray(valid, bool))
    sel = sel.replace(indices=idx, selected_valid=ok, scores=jnp.where(ok, cos[idx], 0.0))
    if sel.support_size is None:
        return sel
    # an equilibrium's ranking lists its support first: picks ranked past it came from the fill rule
    filled = jnp.sum(ok & (rank[idx] >= sel.support_size)).astype(jnp.int32)
    return sel.replace(num_filled=filled,
                       fill_reason=jnp.where(filled > 0, FILL_SHORT_SUPPORT, FILL_NONE).astype(jnp.int32))


@struct.dataclass
class PageGameParams:
    r"""The page game's parameters: :math:`\beta` of the page--page dissimilarity, the penalty factor :math:`f`
    (:math:`\alpha = b + (f - 1)|b|`; :math:`f < 1` is the sparse regime) and ``w_doc`` (added to the edge of two
    pages of one document). Pytree leaves, so derivatives are :class:`PageGameParams` too."""

    beta: float | Array = 1.0
    alpha_factor: float | Array = 1.0
    w_doc: float | Array = 0.0


def page_affinity(notes: Array, query: Array, valid: Array, pages: Array, params: PageGameParams, *,
                  doc_ids: Optional[Array] = None, eps: float = 1e-3) -> tuple[Affinity, Array, Array, Array]:
    """The affinity of the page game (module docstring) over ``m + n`` vertices, pages at their representative's
    position (other notes and padding invalid).

    Returns:
      ``(affinity, rep [n] bool, owner [n] int32, page_cosine [n])``: the page vertices, each note's page, and each
      page's best-note cosine (the tie-break of the read-out; -inf off the page vertices). Differentiable in
      ``params``.
    """
    notes = jnp.asarray(notes)
    queries = as_query_matrix(query, notes)
    valid = check_notes_valid(notes, valid)
    dtype = jnp.result_type(notes.dtype, queries.dtype)
    notes, queries = notes.astype(dtype), queries.astype(dtype)
    params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), params)
    n, m = notes.shape[0], queries.shape[0]
    same, rep, owner = page_units(pages, valid, doc_ids)
    members = same & rep[:, None]
    summed = members.astype(dtype) @ notes
    norm = jnp.linalg.norm(summed, axis=1, keepdims=True)
    vec = summed / jnp.where(norm > 0, norm, 1.0)
    sims = queries @ notes.T  # [m, n]
    best = jnp.max(jnp.where(members[None, :, :], sims[:, None, :], -jnp.inf), axis=2)  # [m, n]: per page
    rel = jnp.where(rep[None, :], jnp.maximum(best, 0.0), 0.0)
    gram = vec @ vec.T
    block = jnp.maximum(params.beta, 0.0) * (1.0 - gram)
    if doc_ids is not None:
        doc_ids = jnp.asarray(doc_ids)
        block = block + params.w_doc * (doc_ids[:, None] == doc_ids[None, :]).astype(dtype)
    pair = rep[:, None] & rep[None, :] & ~jnp.eye(n, dtype=bool)
    w = jnp.where(pair, block, 0.0)
    matrix = jnp.concatenate([jnp.concatenate([jnp.zeros((m, m), dtype), rel], axis=1),
                              jnp.concatenate([rel.T, w], axis=1)], axis=0)
    all_valid = jnp.concatenate([jnp.ones((m,), bool), rep])
    constraint = jnp.concatenate([jnp.ones((m,), bool), jnp.zeros((n,), bool)])
    bound = spectral_penalty(matrix, all_valid & ~constraint, eps).astype(dtype)
    factor = jnp.maximum(params.alpha_factor, 0.0)
    alpha = bound + (factor - 1.0) * jnp.abs(bound)
    affinity = Affinity(matrix=matrix, constraint=constraint, valid=all_valid, alpha=alpha, num_queries=m)
    page_cos = jnp.where(rep, jnp.max(best, axis=0), -jnp.inf)
    return affinity, rep, owner, page_cos


def anchored_start(affinity: Affinity, temperature: float = 0.1) -> Array:
    r"""``[m+n]`` start of a sparse-regime solve: half the mass on the query vertices, half on the notes in
    proportion to :math:`\exp(r_i / T)` (the query-softmax prior of paper mode with the query's share raised),
    so the solver climbs to the local maximiser around the query rather than to a cluster elsewhere."""
    prior = softmax_prior(affinity, temperature)
    m = affinity.num_queries
    notes = prior[m:] / jnp.maximum(jnp.sum(prior[m:]), 1e-30)
    return jnp.concatenate([jnp.full((m,), 0.5 / m, prior.dtype), 0.5 * notes])


def solve_keeping_query(affinity: Affinity, bound: Optional[Affinity], options: SolveOptions,
                        sparse: Array) -> tuple:
    """``(result, affinity_used, kept)``: the equilibrium of ``affinity``, from :func:`anchored_start` when
    ``sparse`` (else the uniform start); where the query is not in its support and ``bound`` (the same game at the
    spectral bound) is given, the equilibrium of ``bound`` instead — the game then reads as at the bound. ``kept``
    says which happened ([] bool; True when not sparse)."""
    solver = options.limited_solver()
    m = affinity.num_queries
    valid = affinity.valid
    uniform = valid.astype(affinity.matrix.dtype) / jnp.sum(valid)
    x0 = jnp.where(sparse, anchored_start(affinity), uniform)
    result = equilibrium(affinity, solver, x0, adjoint=LoopAdjoint())
    kept = query_in_support(result, m) | ~jnp.asarray(sparse)
    if bound is None:
        return result, affinity, kept
    at_bound = equilibrium(bound, solver, adjoint=LoopAdjoint())
    pick = lambda a, b: jnp.where(kept, a, b)  # noqa: E731
    return (jax.tree_util.tree_map(pick, result, at_bound), jax.tree_util.tree_map(pick, affinity, bound), kept)


MAX_PEEL_ROUNDS = 16


def restrict_to(affinity: Affinity, active: Array) -> Affinity:
    """``affinity`` on the ``active`` ``[m+n]`` vertices only (the others padding), its penalty unchanged."""
    pair = active[:, None] & active[None, :]
    return affinity.replace(matrix=jnp.where(pair, affinity.matrix, 0.0), valid=affinity.valid & active,
                            constraint=affinity.constraint & active)


def solve_peeling_to_query(affinity: Affinity, options: SolveOptions, max_rounds: int = MAX_PEEL_ROUNDS) -> tuple:
    """``(result, kept, rounds)``: a sparse-regime equilibrium whose support holds the query, by peeling.

    Solves from around the query (:func:`anchored_start`); while the support misses every query vertex, its
    notes -- a cohesive set that does not need the query -- are peeled off (made padding) and the game is solved
    again on what is left, with the same penalty, at most ``max_rounds`` solves. With no note left the query alone
    is the support, so a cap is the only way ``kept`` ends False. ``result.x`` is the last round's point over all
    vertices (0 on peeled notes), ``num_iters`` summed over rounds."""
    solver = options.limited_solver()
    m = affinity.num_queries
    notes = jnp.arange(affinity.valid.shape[0]) >= m

    def round_(active):
        aff = restrict_to(affinity, active)
        res = equilibrium(aff, solver, anchored_start(aff), adjoint=LoopAdjoint())
        return res, query_in_support(res, m)

    def body(state):
        active, res, kept, rounds, iters = state
        peeled = active & notes & (res.x > SUPPORT_THRESHOLD)
        active = active & ~peeled
        res, kept = round_(active)
        return active, res, kept, rounds + 1, iters + res.num_iters

    first, kept = round_(affinity.valid)
    state = (affinity.valid, first, kept, jnp.asarray(1, jnp.int32), first.num_iters)
    state = lax.while_loop(lambda s: ~s[2] & (s[3] < max_rounds), body, state)
    _, res, kept, rounds, iters = state
    return res.replace(num_iters=iters), kept, rounds


KEEP_QUERY = ("peel", "bound")


def keep_query(affinity: Affinity, bound: Affinity, options: SolveOptions, factor, keep: str) -> tuple:
    """``(result, affinity_read, kept)`` of a sparse-regime game: ``keep="peel"`` peels supports that miss the query
    (:func:`solve_peeling_to_query`; the game read is the sparse one), ``"bound"`` reads the game at the spectral
    bound where the query leaves the support (:func:`solve_keeping_query`)."""
    if keep not in KEEP_QUERY:
        raise ValueError(f"keep must be one of {KEEP_QUERY}, got {keep!r}")
    if keep == "bound":
        return solve_keeping_query(affinity, bound, options, jnp.asarray(factor) < 1)
    result, kept, _ = solve_peeling_to_query(affinity, options)
    return result, affinity, kept


def _is_dense(factor) -> bool:
    """A static penalty factor at or above 1 (no sparse regime: no anchoring, no fallback solve)."""
    return isinstance(factor, (int, float)) and float(factor) >= 1.0


def page_game_ranking(notes: Array, query: Array, valid: Array, pages: Array,
                      params: PageGameParams = PageGameParams(), *, doc_ids: Optional[Array] = None,
                      options: Optional[SolveOptions] = None, keep: str = "bound") -> tuple[Array, Selection]:
    """``(rank [n], pages_read, kept)``: the notes' order under the page game — pages by its equilibrium (support by
    weight, then the fill rule), a page's notes by cosine — and the page selection it came from (its ``result`` is
    the page game's equilibrium: queries, then pages at their representative note's position; ``support_size``
    counts pages). In the sparse regime (``alpha_factor < 1``) the solve starts around the query and, where the query
    leaves the support, falls back to the game at the spectral bound (``keep="bound"``) or peels the supports that
    miss it (``keep="peel"``) (:func:`keep_query`; ``kept``)."""
    options = solve_options(STRUCTURE_OPTIONS if options is None else options)
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    n = notes.shape[0]
    affinity, rep, owner, page_cos = page_affinity(notes, query, valid, pages, params, doc_ids=doc_ids)
    if _is_dense(params.alpha_factor):
        result = equilibrium(affinity, options.limited_solver(), adjoint=LoopAdjoint())
        kept = jnp.asarray(True)
    else:
        bound = page_affinity(notes, query, valid, pages, params.replace(alpha_factor=1.0), doc_ids=doc_ids)[0]
        result, affinity, kept = keep_query(affinity, bound, options, params.alpha_factor, keep)
    ranked = read_selection(result, affinity, options.replace(fill=True), budget=n,
                            cosine=page_cos.astype(result.x.dtype), beta=jnp.asarray(params.beta, result.x.dtype))
    page_rank = rank_positions(ranked.indices, ranked.selected_valid, rep, page_cos)
    cos = _cosine(notes, query, valid)
    # notes ordered by their page's rank, then by cosine within the page, then by index; padding last
    order = jnp.lexsort((jnp.arange(n), -cos, page_rank[owner], ~valid))
    rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
    return rank, ranked, kept


def select_page_game(notes: Array, query: Array, valid: Array, pages: Array, params: PageGameParams = PageGameParams(),
                     *, budget: int, k: int = 1, doc_ids: Optional[Array] = None,
                     options: Optional[SolveOptions] = None) -> Selection:
    """Evidence from the page game: its ranking (:func:`page_game_ranking`) read ``k`` notes per page per round
    (:func:`structured_readout`); scores are the notes' cosine, the diagnostics the page game's."""
    budget = check_budget(budget)
    rank, ranked, _ = page_game_ranking(notes, query, valid, pages, params, doc_ids=doc_ids, options=options)
    valid = jnp.asarray(valid, bool)
    idx, ok = structured_readout(rank, valid, pages, budget=budget, k=k, doc_ids=doc_ids)
    cos = _cosine(jnp.asarray(notes), query, valid)
    return ranked.replace(indices=idx, selected_valid=ok, scores=jnp.where(ok, cos[idx], 0.0))


def page_scores(notes: Array, query: Array, valid: Array, pages: Array, params: PageGameParams, *,
                doc_ids: Optional[Array] = None, solver=ActiveSet(), tol: Optional[float] = None,
                max_iter: Optional[int] = None, threshold: float = SUPPORT_THRESHOLD, slack_weight: float = 1.0):
    r"""``(scores [n], result, affinity)``: the page game's equilibrium extended off its support by the KKT slack
    (:func:`~cdsjax.core.equilibrium_scores`), one score per page vertex (-inf elsewhere), differentiable in
    ``params`` by the implicit derivative of the KKT conditions (:func:`~cdsjax.core.attach_implicit`): the
    quantity a fit of the page game climbs."""
    affinity, rep, _, _ = page_affinity(notes, query, valid, pages, params, doc_ids=doc_ids)
    result = equilibrium(affinity, solver.with_limits(tol, max_iter), adjoint=ImplicitAdjoint(), threshold=threshold)
    scores = equilibrium_scores(affinity, result.x, slack_weight)
    return jnp.where(rep, scores, -jnp.inf), result, affinity


def sparse_affinity(affinity: Affinity, factor: float | Array) -> Affinity:
    r"""``affinity`` with its penalty moved to :math:`b + (f - 1)|b|`, ``affinity.alpha`` taken as the spectral
    bound :math:`b` (an affinity built at the bound); ``factor`` :math:`f < 1` is the sparse regime."""
    b = affinity.alpha
    return affinity.replace(alpha=b + (jnp.asarray(factor, b.dtype) - 1.0) * jnp.abs(b))


def query_in_support(result, num_queries: int = 1, threshold: float = SUPPORT_THRESHOLD) -> Array:
    """``[]`` bool: some query vertex carries weight above ``threshold`` at the equilibrium."""
    return jnp.any(result.x[:num_queries] > threshold)


def sparse_learned_ranking(notes: Array, query: Array, valid: Array, theta, factor: float | Array, *,
                           links: Optional[Array] = None, pages: Optional[Array] = None,
                           doc_ids: Optional[Array] = None, kinds: Optional[Array] = None,
                           options: Optional[SolveOptions] = None, keep: str = "peel") -> tuple[Array, Selection]:
    r"""``(rank [n], selection, kept)``: the learned game (:func:`cdsjax.core.games.learned.learned_affinity`, its penalty
    at the spectral bound) moved to the sparse regime :math:`\alpha = b + (f - 1)|b|` by :func:`sparse_affinity`, solved
    by the converged solver from around the query, every note ranked by the one read-out (support by weight, then the
    fill rule). ``keep="peel"`` (default): where the query leaves the support, that support is peeled off and the
    game solved again on the rest until a support holds the query (:func:`solve_peeling_to_query`; the cluster
    around the query, a dominant set proper); ``keep="bound"``: the game at the bound is read instead
    (:func:`solve_keeping_query`). ``kept``: the query is in the support that is read."""
    from cdsjax.core.games.learned import learned_affinity

    options = solve_options(STRUCTURE_OPTIONS if options is None else options)
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    n = notes.shape[0]
    bound = learned_affinity(notes, query, valid, theta.replace(alpha_factor=1.0), links=links, pages=pages,
                             doc_ids=doc_ids, kinds=kinds)
    affinity = sparse_affinity(bound, factor)
    result, affinity, kept = keep_query(affinity, bound, options, factor, keep)
    cos = _cosine(notes, query, valid)
    sel = read_selection(result, affinity, options.replace(fill=True), budget=n, cosine=cos.astype(result.x.dtype))
    return rank_positions(sel.indices, sel.selected_valid, valid, cos), sel, kept
