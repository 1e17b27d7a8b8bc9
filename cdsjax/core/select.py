r"""Constrained-dominant-set selection: affinity -> equilibrium -> top-B notes."""

from __future__ import annotations

from typing import Dict, Optional

import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.active_set import ActiveSet
from cdsjax.core.affinity import build_affinity, spectral_penalty
from cdsjax.core.graph import diffusion_prior
from cdsjax.core.inimdyn import InImDyn
from cdsjax.core.payoff import DensePayoff
from cdsjax.core.ranking import isolated_query, kkt_slack, query_cosine, rank_support, read_selection
from cdsjax.core.replicator import Replicator, softmax_prior
from cdsjax.core.solver import iterate
from cdsjax.core.types import CONVERGED, INITS, SUPPORT_THRESHOLD, Affinity, CDSParams, Selection, SolveOptions, SolverResult, solve_options
from cdsjax.core.validation import check_budget, check_option

# name -> solver configuration with its default limits (tol None: the dtype's default).
SOLVERS: Dict[str, object] = {
    "replicator": Replicator(),  # paper mode: tol 1e-7, 10,000 steps
    "inimdyn": InImDyn(),
    "active_set": ActiveSet(),
    # The default converged mode (``solver="converged"``): on the CDS payoff it reached
    # KKT <= 1e-8 in one Newton step where InImDyn took 1e4-2e5 vertex steps
    # (experiments/bench_solvers.py).
    "converged": ActiveSet(),
}


def register_solver(name: str, solver) -> None:
    """Makes a solver configuration (``init`` / ``step`` / ``proceed``, :mod:`cdsjax.core.solver`)
    available as ``solver=name``."""
    SOLVERS[name] = solver


def configured_solver(solver: str, tol: Optional[float] = None, max_iter: Optional[int] = None):
    """The registered solver ``solver`` with ``tol`` / ``max_iter`` replaced where given."""
    check_option("solver", solver, tuple(SOLVERS))
    limits = {k: v for k, v in (("tol", tol), ("max_iter", max_iter)) if v is not None}
    config = SOLVERS[solver]
    return config.replace(**limits) if limits else config


def selection_from_solution(
    result: SolverResult,
    num_queries: int,
    note_valid: Array,
    *,
    budget: int,
    threshold: float = SUPPORT_THRESHOLD,
    affinity: Optional[Affinity] = None,
    cosine: Optional[Array] = None,
    fill: bool = True,
    beta: Optional[Array] = None,
) -> Selection:
    r"""Reads the top-``budget`` notes (queries excluded) with :math:`x_i >` ``threshold``.

    With ``affinity`` given (and ``fill``), slots the support leaves empty are filled
    by the fill rule of :mod:`cdsjax.core.ranking` (KKT slack, then ``cosine``);
    without it the selection holds only the support (fewer picks, masked).
    """
    if affinity is not None:
        if affinity.num_queries != num_queries:
            raise ValueError(f"num_queries={num_queries} does not match the affinity's {affinity.num_queries}")
        return read_selection(result, affinity, budget=budget, threshold=threshold, cosine=cosine, fill=fill,
                              beta=beta)
    idx, ok, scores, size, num_filled, reason = rank_support(
        result.x[num_queries:], note_valid, budget=budget, threshold=threshold)
    return Selection(indices=idx, selected_valid=ok, scores=scores, result=result, support_size=size,
                     num_filled=num_filled, fill_reason=reason,
                     beta=None if beta is None else jnp.asarray(beta, result.x.dtype))


def initial_point(
    affinity: Affinity, init: str = "uniform", temperature: float = 0.1, links: Optional[Array] = None
) -> Optional[Array]:
    """The solver's starting point: None (uniform), the query-softmax or the graph-diffusion prior."""
    check_option("init", init, INITS)
    if init == "softmax":
        return softmax_prior(affinity, temperature)
    if init == "diffusion":
        if links is None:
            raise ValueError("init='diffusion' needs links ([n, n] bool note-link adjacency)")
        return diffusion_prior(affinity, links, temperature)
    return None


def solve(
    affinity: Affinity,
    x0: Optional[Array] = None,
    *,
    solver: str = "replicator",
    tol: Optional[float] = None,
    max_iter: Optional[int] = None,
) -> SolverResult:
    """Runs a registered solver on ``affinity``'s payoff with its default ``tol`` / ``max_iter``."""
    return iterate(configured_solver(solver, tol, max_iter), DensePayoff.from_affinity(affinity), x0)


def cds_select(
    notes: Array,
    query: Array,
    valid: Array,
    *,
    budget: int = 10,
    params: CDSParams = CDSParams(),
    options: Optional[SolveOptions] = None,
    x0: Optional[Array] = None,
    pinned: Optional[Array] = None,
    links: Optional[Array] = None,
    **overrides,
) -> Selection:
    r"""Selects evidence as a constrained dominant set (single extraction).

    Builds the query-augmented affinity, solves :math:`\max_{x\in\Delta} x^\top M x`
    and keeps the top-``budget`` notes by equilibrium weight above ``threshold``;
    when fewer clear it, the fill rule (:mod:`cdsjax.core.ranking`: KKT slack, then
    cosine) completes the ``budget`` picks and ``num_filled`` / ``fill_reason`` say so.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s); every
        query is a constraint vertex.
      valid: ``[n]`` bool, True on real notes.
      budget: static number of notes to return (fewer if fewer clear ``threshold``).
      params: :class:`CDSParams`.
      options: :class:`SolveOptions` (solver, threshold, limits, init, warm start,
        fill); ``solver`` None means ``"replicator"`` (paper mode).
      x0: optional ``[m+n]`` initial point; overrides ``options.init``.
      pinned: optional ``[n]`` bool, notes added to the constraint set.
      links: optional ``[n, n]`` bool note-link adjacency, for ``init="diffusion"``.
      **overrides: :class:`SolveOptions` fields replacing those of ``options``
        (``solver="converged"``, ``max_iter=500``, ...).

    Returns:
      :class:`Selection` with ``result`` holding the solver diagnostics and
      ``support_size`` (notes only), ``num_filled``, ``fill_reason``, ``beta``.
    """
    budget = check_budget(budget)
    options = solve_options(options, **overrides)
    solver = options.solver or "replicator"
    check_option("solver", solver, tuple(SOLVERS))
    affinity = build_affinity(notes, query, valid, params, pinned=pinned)
    if x0 is None:
        x0 = initial_point(affinity, options.init, options.prior_temperature, links)
    if options.warm_start == "replicator" and solver != "replicator":
        x0 = solve(affinity, x0, solver="replicator").x
    result = solve(affinity, x0, solver=solver, tol=options.tol, max_iter=options.max_iter)
    return read_selection(result, affinity, budget=budget, threshold=options.threshold,
                          cosine=query_cosine(notes, query).astype(result.x.dtype), fill=options.fill,
                          beta=params.beta)


def cds_peel(
    notes: Array,
    query: Array,
    valid: Array,
    *,
    budget: int = 10,
    params: CDSParams = CDSParams(),
    options: Optional[SolveOptions] = None,
    pinned: Optional[Array] = None,
    **overrides,
) -> Selection:
    r"""Peeling extraction for several constraint vertices.

    Extracts a constrained dominant set, removes its support (the notes and the
    constraint vertices it covers), and repeats on what is left until every
    constraint vertex is covered (at most one round per constraint vertex). Notes
    are ranked by round, then by their weight within the round; ``scores`` hold
    those weights. ``result`` is the first round's solver result, with
    ``num_iters`` summed over rounds and ``converged`` (and ``status``) true only if
    every round converged. ``support_size`` counts the notes of every round's
    support; when they are fewer than ``budget``, the fill rule
    (:mod:`cdsjax.core.ranking`) completes the picks using the first round's slack.

    Args: as :func:`cds_select` (every round starts uniformly: ``options.init`` and
      ``warm_start`` are not used); ``query`` is ``[m, d]`` (or ``[d]``, which makes
      peeling a single extraction).

    Returns:
      :class:`Selection`.
    """
    budget = check_budget(budget)
    options = solve_options(options, **overrides)
    solver = configured_solver(options.solver or "replicator", options.tol, options.max_iter)
    threshold = options.threshold
    base = build_affinity(notes, query, valid, params, pinned=pinned)
    m = base.num_queries
    n = notes.shape[0]
    max_rounds = m + n
    dtype = base.matrix.dtype

    def extract(state):
        active, uncovered, rank_key, total_iters, status, r = state
        res = iterate(solver, DensePayoff.from_affinity(_restrict(base, active, params)), None)
        support = active & (res.x > threshold)
        new_notes = support & ~base.constraint
        # Earlier rounds rank above later ones: key = (max_rounds - r) + x, x in [0, 1].
        rank_key = jnp.where(new_notes, (max_rounds - r).astype(dtype) + res.x, rank_key)
        covered = uncovered & support
        # A round that covers nothing would repeat forever: give up on the rest.
        uncovered = jnp.where(jnp.any(covered), uncovered & ~covered, jnp.zeros_like(uncovered))
        # the first round that did not converge decides the status
        status = jnp.where(status == CONVERGED, res.status, status)
        state = (active & ~support, uncovered, rank_key, total_iters + res.num_iters, status, r + 1)
        return state, res

    init = (
        base.valid,
        base.constraint & base.valid,
        jnp.full((m + n,), -jnp.inf, dtype),
        jnp.asarray(0, jnp.int32),
        jnp.asarray(0, jnp.int32),
        jnp.asarray(0, jnp.int32),
    )
    state, first = extract(init)
    state = lax.while_loop(
        lambda s: jnp.any(s[1]) & (s[5] < max_rounds),
        lambda s: extract(s)[0],
        state,
    )
    _, _, rank_key, total_iters, status, _ = state
    note_key = rank_key[m:]
    note_valid = base.valid[m:]
    # every round's support has key >= 1 > threshold; the fill uses the first round's point
    first_round = _restrict(base, base.valid, params)
    idx, ok, scores, size, num_filled, reason = rank_support(
        note_key, note_valid, budget=budget, threshold=threshold,
        slack=kkt_slack(first_round, first.x) if options.fill else None,
        cosine=query_cosine(notes, query).astype(dtype), isolated=isolated_query(base))
    # support picks fill the first slots; their score is the weight within their round
    in_support = jnp.arange(budget) < size
    picked = jnp.where(in_support, note_key[idx], 0.0)
    scores = jnp.where(in_support, picked - jnp.ceil(picked - 1.0), scores)
    result = first.replace(num_iters=total_iters, converged=status == CONVERGED, status=status)
    return Selection(indices=idx, selected_valid=ok, scores=scores, result=result, support_size=size,
                     num_filled=num_filled, fill_reason=reason, beta=jnp.asarray(params.beta, dtype))


def _restrict(base: Affinity, active: Array, params: CDSParams) -> Affinity:
    """The affinity of the subgraph on ``active`` vertices, with its own penalty."""
    # An empty graph would make the uniform start 0/0; solve the base one instead
    # (callers only read rounds that still have an active constraint vertex).
    active = jnp.where(jnp.any(active), active, base.valid)
    pair = active[:, None] & active[None, :]
    matrix = jnp.where(pair, base.matrix, 0.0)
    constraint = base.constraint & active
    if params.alpha_from == "free":
        mask = active & ~constraint
    else:
        mask = active
    alpha = spectral_penalty(matrix, mask, params.eps).astype(matrix.dtype)
    return Affinity(matrix=matrix, constraint=constraint, valid=active, alpha=alpha, num_queries=base.num_queries)
