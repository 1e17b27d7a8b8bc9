r"""The page game and the sparse regime: two structure-aware games kept as experiments, not served.

* **The page game** (:func:`page_affinity`, :func:`select_page_game`): the vertices are pages. A page's vector is
  the normalised sum of its notes' embeddings, its query edge is its best note's (clipped) cosine, the page--page
  edge is :math:`\beta(1 - v_p^\top v_{p'})` (plus ``w_doc`` for two pages of one document, in pools). The
  equilibrium ranks pages (support by weight, then the KKT slack, then the best note's cosine); the evidence is
  the best notes of the ranked pages, ``k`` per page per round (the served read-out,
  :func:`cdsjax.core.readouts.structured_readout`).
* **The sparse regime** (``alpha_factor < 1``): the penalty :math:`\alpha = b + (f - 1)|b|` below the spectral
  bound :math:`b`, where the payoff is no longer concave on the free vertices and an equilibrium is a small
  cohesive set (a dominant set proper) instead of a ranking of everything. The query may then leave the support;
  :func:`solve_peeling_to_query` keeps it there by peeling off the supports that miss it (the peeling
  extraction's rounds, stopped at the first that covers the query), or the game at the bound is read
  (:func:`keep_query`); either way the read-out ranks every note (support, then slack).

All pure JAX (``jit`` / ``vmap``-able, padding inert). Units: ``pages`` ``[n]`` int (a page, or any grouping a caller
chooses), with ``doc_ids`` ``[n]`` int telling units of several documents apart. A unit is represented by its first
valid note (:func:`page_units`), so the page game has the same static size as the note game and padding notes are
never a unit. ``experiments/page_and_sparse_games.py`` runs these games as selectors and
``experiments/structured_cv.py`` cross-validates them; the registry's per-page read-outs are
:mod:`cdsjax.core.readouts`.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.baselines import same_unit
from cdsjax.core.games.affinity import spectral_penalty
from cdsjax.core.adjoints import ForwardLoopAdjoint, ImplicitAdjoint
from cdsjax.core.equilibrium import equilibrium
from cdsjax.core.ranking import read_selection
from cdsjax.core.readouts import best_cosine, rank_positions, structured_readout
from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.solvers.replicator import softmax_prior
from cdsjax.core.surrogates import equilibrium_scores
from cdsjax.core.types import SUPPORT_THRESHOLD, Affinity, Selection
from cdsjax.core.validation import as_query_matrix, check_budget, check_notes_valid

# The options of the page game and the sparse regime when none are given: the converged (active-set) solver.
STRUCTURE_OPTIONS = SolveOptions(solver=ActiveSet())


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
    result = equilibrium(affinity, solver, x0, adjoint=ForwardLoopAdjoint())
    kept = query_in_support(result, m) | ~jnp.asarray(sparse)
    if bound is None:
        return result, affinity, kept
    at_bound = equilibrium(bound, solver, adjoint=ForwardLoopAdjoint())
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
        res = equilibrium(aff, solver, anchored_start(aff), adjoint=ForwardLoopAdjoint())
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
        result = equilibrium(affinity, options.limited_solver(), adjoint=ForwardLoopAdjoint())
        kept = jnp.asarray(True)
    else:
        bound = page_affinity(notes, query, valid, pages, params.replace(alpha_factor=1.0), doc_ids=doc_ids)[0]
        result, affinity, kept = keep_query(affinity, bound, options, params.alpha_factor, keep)
    ranked = read_selection(result, affinity, options.replace(fill=True), budget=n,
                            cosine=page_cos.astype(result.x.dtype), beta=jnp.asarray(params.beta, result.x.dtype))
    page_rank = rank_positions(ranked.indices, ranked.selected_valid, rep, page_cos)
    cos = best_cosine(notes, query, valid)
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
    cos = best_cosine(jnp.asarray(notes), query, valid)
    return ranked.replace(indices=idx, selected_valid=ok, scores=jnp.where(ok, cos[idx], 0.0))


def page_scores(notes: Array, query: Array, valid: Array, pages: Array, params: PageGameParams, *,
                doc_ids: Optional[Array] = None, solver=ActiveSet(), tol: Optional[float] = None,
                max_iter: Optional[int] = None, threshold: float = SUPPORT_THRESHOLD, slack_weight: float = 1.0):
    r"""``(scores [n], result, affinity)``: the page game's equilibrium extended off its support by the KKT slack
    (:func:`~cdsjax.core.surrogates.equilibrium_scores`), one score per page vertex (-inf elsewhere), differentiable in
    ``params`` by the implicit derivative of the KKT conditions (:func:`~cdsjax.core.implicit.attach_implicit`): the
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
    cos = best_cosine(notes, query, valid)
    sel = read_selection(result, affinity, options.replace(fill=True), budget=n, cosine=cos.astype(result.x.dtype))
    return rank_positions(sel.indices, sel.selected_valid, valid, cos), sel, kept
