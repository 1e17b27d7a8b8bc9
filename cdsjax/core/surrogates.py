r"""Differentiable retrieval objectives on the CDS equilibrium (what a fit or a sensitivity study optimises).

:func:`equilibrium_scores` extends :math:`x^*` off the support by the KKT slack
:math:`(Mx^*)_i - \lambda \le 0`, giving a ranking score that is continuous across
support changes and has non-zero derivatives for notes outside the support; the
retrieval surrogates (:func:`soft_recall`, :func:`gold_mass`) build on it, and
:func:`retrieval_surrogates` evaluates them on :func:`cdsjax.core.cds_equilibrium`.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.equilibrium import cds_equilibrium
from cdsjax.core.implicit import implicit_system_ok
from cdsjax.core.protocols import Game
from cdsjax.core.solvers.loop import support_count
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.types import CONVERGED, SUPPORT_THRESHOLD, Affinity, CDSProblem
from cdsjax.core.validation import check_budget, check_unit_norm


def equilibrium_scores(affinity: Affinity, x: Array, slack_weight: float = 1.0) -> Array:
    r"""Note scores :math:`s = x^* + c\,\big(Mx^* - \lambda\big)`, continuous across support changes.

    On the support the KKT slack :math:`(Mx^*)_i - \lambda` vanishes, so
    :math:`s_i = x^*_i > 0`; off the support :math:`x^*_i = 0` and the slack is
    :math:`\le 0`, so :math:`s_i \le 0` says how far the note is from entering. A
    note entering or leaving passes through :math:`s_i = 0` from either side, which
    makes :math:`s` continuous in the hyperparameters where :math:`x^*` only is
    (with derivatives for notes outside the support). Ranking by ``s`` above
    :math:`\theta` is ranking by :math:`x^*`.

    Args:
      affinity: the problem's :class:`Affinity` (differentiable).
      x: ``[m+n]`` float, the (differentiable) equilibrium.
      slack_weight: :math:`c`, payoff units to weight units.

    Returns:
      ``[n]`` float scores of the notes (queries excluded); padding gets ``-inf``.
    """
    m = affinity.num_queries
    payoff = affinity.payoff()
    mx = payoff @ x
    lam = x @ mx
    support = x > SUPPORT_THRESHOLD
    slack = jnp.where(support, 0.0, mx - lam)
    s = x + slack_weight * slack
    return jnp.where(affinity.valid[m:], s[m:], -jnp.inf)


# soft membership logit of a note that is certainly selected (log_sigmoid(-_ALL_IN) underflows to a miss of 0)
_ALL_IN = 1e4


def _soft_threshold(scores: Array, budget: int, threshold: float) -> tuple[Array, Array, Array]:
    """The soft top-B cut, its scale, and whether there is a cut at all.

    The cut ``t`` is the midpoint between the ``budget``-th and the next score (at
    least ``threshold``); the scale is the mean distance to ``t`` of the top
    ``2 * budget`` scores, the spread the soft membership has to resolve.
    """
    n = scores.shape[0]
    top = lax.top_k(scores, min(2 * budget, n) if budget < n else n)[0]
    if budget >= n:
        t = jnp.asarray(threshold, scores.dtype)
    else:
        kth, nxt = top[budget - 1], top[budget]
        safe_nxt = jnp.where(jnp.isfinite(nxt), nxt, 0.0)
        t = jnp.maximum(jnp.where(jnp.isfinite(nxt), 0.5 * (kth + safe_nxt), -jnp.inf), threshold)
    # no cut when fewer than budget + 1 scores are finite and the threshold is -inf (e.g. a read-out by pages on a
    # document of at most B pages): every finite score is in the top-B. The cut is then returned as 0 (finite, so
    # neither value nor gradient meets -inf) and soft_recall ignores it and the scale.
    cut = jnp.isfinite(t)
    t = jnp.where(cut, t, 0.0)
    near = jnp.isfinite(top)
    spread = jnp.sum(jnp.where(near, jnp.abs(jnp.where(near, top, 0.0) - t), 0.0)) / jnp.maximum(jnp.sum(near), 1)
    return t, jnp.maximum(spread, jnp.finfo(scores.dtype).tiny ** 0.5), cut


def soft_recall(
    scores: Array,
    gold_units: Array,
    *,
    budget: int,
    temperature: float = 0.2,
    threshold: float = SUPPORT_THRESHOLD,
    unit_valid: Optional[Array] = None,
) -> Array:
    r"""Smooth surrogate of gold recall@B: soft top-B membership, soft coverage per gold unit.

    Note :math:`i` is "selected" with probability
    :math:`p_i = \sigma\big((s_i - t)/(T\kappa)\big)`: :math:`t` is the midpoint
    between the B-th and (B+1)-th scores (at least :math:`\theta`, as the hard
    selection also needs :math:`x_i > \theta`) and :math:`\kappa` the mean distance
    of the top-2B scores to :math:`t`. Dividing by :math:`\kappa` makes :math:`T`
    relative: scaling all scores leaves the surrogate unchanged, so it stays as
    sharp when :math:`x^*` flattens (large :math:`\beta`, many notes) as when it is
    peaked. A gold unit (a page, a paragraph) is covered with
    :math:`1 - \prod_{i\in u}(1-p_i)`; the surrogate is the mean over units. As
    :math:`T \to 0` it tends to the recall of the top-B selection.

    Args:
      scores: ``[n]`` float, e.g. :func:`equilibrium_scores`; ``-inf`` at padding.
      gold_units: ``[g, n]`` bool, row ``u`` marks the notes of gold unit ``u``.
      budget: static B.
      temperature: :math:`T`, relative to the spread :math:`\kappa` (dimensionless).
      threshold: :math:`\theta`.
      unit_valid: optional ``[g]`` bool, the real gold units (padding False).
        Default: the rows with at least one note. Pass it to count gold units no
        note covers (e.g. a gold page without text) as missed.

    Returns:
      ``[]`` float in [0, 1]; NaN when there is no gold unit (as hard recall).
    """
    budget = check_budget(budget)
    t, spread, cut = _soft_threshold(scores, budget, threshold)
    unit_valid = _unit_valid(gold_units, unit_valid, scores.shape[0])
    finite = jnp.isfinite(scores)
    # without a cut every finite note is selected: a constant membership of 1 (z large)
    z = jnp.where(cut, (jnp.where(finite, scores, 0.0) - t) / (temperature * spread), _ALL_IN)
    log_miss = jnp.where(finite, jax.nn.log_sigmoid(-z), 0.0)
    unit_log_miss = jnp.sum(jnp.where(gold_units, log_miss[None, :], 0.0), axis=1)
    covered = -jnp.expm1(unit_log_miss)
    count = jnp.sum(unit_valid)
    total = jnp.sum(jnp.where(unit_valid, covered, 0.0))
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def page_readout_scores(scores: Array, pages: Array, doc_ids: Optional[Array] = None) -> Array:
    r"""Scores for the one-note-per-page read-out: a page scores its best note's score, kept at the page's first
    note; the page's other notes get ``-inf``.

    Reading a ranking one note per page (:func:`cdsjax.core.readouts.structured_readout`, ``k = 1``) picks, in
    its first round, the best note of each of the B pages whose best notes rank highest; so the top-B of these
    scores are those pages, and :func:`soft_recall` / :func:`hard_recall` of them (gold units as pages: rows
    that mark a gold page's notes) are the surrogate and the page recall@B of that read-out (when the problem
    has at least B pages; with fewer, every page is read in both). The maximum passes the gradient to each
    page's best note. A note without a page (``pages < 0``) is its own unit and keeps its score.

    Args:
      scores: ``[n]`` float note scores, e.g. :func:`equilibrium_scores`; ``-inf`` at padding.
      pages: ``[n]`` int page of each note (``-1`` unknown).
      doc_ids: optional ``[n]`` int document of each note (units are then ``(document, page)``).

    Returns:
      ``[n]`` float.
    """
    from cdsjax.core.baselines import same_unit

    n = scores.shape[0]
    pages = jnp.asarray(pages)
    known = jnp.isfinite(scores) & (pages >= 0)
    same = same_unit(pages, known, doc_ids)
    best = jnp.max(jnp.where(same, scores[None, :], -jnp.inf), axis=1)
    index = jnp.arange(n)
    first = known & ~jnp.any(same & (index[None, :] < index[:, None]), axis=1)
    return jnp.where(known, jnp.where(first, best, -jnp.inf), scores)


def _unit_valid(gold_units: Array, unit_valid: Optional[Array], n: int) -> Array:
    if gold_units.ndim != 2 or gold_units.shape[1] != n:
        raise ValueError(f"gold_units must have shape [g, {n}], got {gold_units.shape}")
    if unit_valid is None:
        return jnp.any(gold_units, axis=1)
    unit_valid = jnp.asarray(unit_valid)
    if unit_valid.shape != gold_units.shape[:1]:
        raise ValueError(f"unit_valid must have shape ({gold_units.shape[0]},), got {unit_valid.shape}")
    return unit_valid.astype(bool)


def hard_recall(
    scores: Array,
    gold_units: Array,
    *,
    budget: int,
    threshold: float = SUPPORT_THRESHOLD,
    unit_valid: Optional[Array] = None,
) -> Array:
    """Gold recall@B of the top-``budget`` scores above ``threshold`` (the measured metric).

    Arguments as :func:`soft_recall`; returns ``[]`` float, NaN without gold units.
    """
    budget = check_budget(budget)
    unit_valid = _unit_valid(gold_units, unit_valid, scores.shape[0])
    n = scores.shape[0]
    k = min(budget, n)
    values, idx = lax.top_k(scores, k)
    picked = jnp.zeros((n,), bool).at[idx].set(values > threshold)
    covered = jnp.any(gold_units & picked[None, :], axis=1)
    count = jnp.sum(unit_valid)
    return jnp.where(count > 0, jnp.sum(covered & unit_valid) / jnp.maximum(count, 1), jnp.nan)


def gold_mass(x_notes: Array, gold: Array, valid: Array) -> Array:
    r"""Share of the notes' equilibrium mass on gold notes, :math:`\sum_{i\in G} x_i / \sum_i x_i`.

    Args:
      x_notes: ``[n]`` float, the notes' part of :math:`x^*`.
      gold: ``[n]`` bool, gold notes.
      valid: ``[n]`` bool, real notes.

    Returns:
      ``[]`` float in [0, 1]; NaN when no note is gold.
    """
    x_notes = jnp.where(valid, x_notes, 0.0)
    total = jnp.sum(x_notes)
    on_gold = jnp.sum(jnp.where(gold & valid, x_notes, 0.0))
    safe = jnp.where(total > 0, total, 1.0)
    return jnp.where(jnp.any(gold & valid), on_gold / safe, jnp.nan)


def retrieval_surrogates(
    problem: CDSProblem,
    gold_units: Array,
    params: Game,
    options: Optional[SolveOptions] = None,
    *,
    budget: int,
    temperature: float = 0.2,
    slack_weight: float = 1.0,
    unit_valid: Optional[Array] = None,
    x0: Optional[Array] = None,
    adjoint=None,
    **overrides,
) -> dict:
    r"""Differentiable retrieval objectives of one query, with the measured recall and diagnostics.

    Args:
      problem, params, options, x0, adjoint, **overrides: as :func:`cds_equilibrium` (``options.threshold`` is
        also the selection threshold :math:`\theta`; ``adjoint`` says how the equilibrium is differentiated,
        e.g. ``ImplicitAdjoint(nan_if_unconverged=True)``). Notes and queries must be L2-normalised (checked on
        concrete arrays).
      gold_units: ``[g, n]`` bool gold units (pages or paragraphs) over the notes;
        all-False rows are padding.
      budget: static B.
      temperature: relative :math:`T` of :func:`soft_recall`.
      slack_weight: :math:`c` of :func:`equilibrium_scores`.
      unit_valid: optional ``[g]`` bool real gold units (see :func:`soft_recall`).

    Returns:
      dict of ``[]`` arrays: ``soft_recall`` and ``gold_mass`` (differentiable in
      ``params``), ``recall`` (hard recall@B of the selection, piecewise constant),
      ``converged``, ``kkt_residual``, ``support_size``, ``implicit_ok``.
    """
    options = solve_options(options, **overrides)
    threshold = options.threshold
    check_unit_norm(problem.notes, problem.queries, problem.valid)
    result, affinity = cds_equilibrium(problem, params, options, x0=x0, adjoint=adjoint)
    m = affinity.num_queries
    scores = equilibrium_scores(affinity, result.x, slack_weight)
    gold_notes = jnp.any(gold_units, axis=0)
    x_fixed = lax.stop_gradient(result.x)
    return {
        "soft_recall": soft_recall(scores, gold_units, budget=budget, temperature=temperature, threshold=threshold,
                                   unit_valid=unit_valid),
        "gold_mass": gold_mass(result.x[m:], gold_notes, problem.valid),
        "recall": hard_recall(lax.stop_gradient(scores), gold_units, budget=budget, threshold=threshold,
                              unit_valid=unit_valid),
        "converged": result.status == CONVERGED,
        "kkt_residual": result.kkt_residual,
        "support_size": support_count(result.x, affinity.free, threshold),
        "implicit_ok": implicit_system_ok(
            lax.stop_gradient(affinity.payoff()), x_fixed, affinity.valid, threshold),
    }
