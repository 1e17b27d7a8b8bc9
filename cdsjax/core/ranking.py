r"""Reading B notes off an equilibrium: the support first, then the fill rule.

The paper's evidence is the support :math:`\sigma(x^*) = \{i : x^*_i > \theta\}` of
the equilibrium, constraint (query) vertices removed, ranked by :math:`x^*_i` and
cut to the top :math:`B`. The support can hold fewer than :math:`B` notes: a tight
cluster, or only the query itself when no note has a positive query edge (every
cosine :math:`\le 0`, so :math:`r = 0` and :math:`x^* = e_q`). The reader would
then see little or no evidence. The **fill rule** completes the selection:

1. The support's notes come first, by weight :math:`x^*_i` (the paper's ranking).
2. The remaining slots take valid notes outside the support by their KKT slack

   .. math:: s_i = (Mx^*)_i - x^{*\top} M x^*,

   largest first. At a KKT point :math:`s_i = 0` on the support and
   :math:`s_i \le 0` off it; :math:`-s_i` is the payoff a note lacks to enter the
   support (a note about to enter as :math:`\beta` or :math:`\tau` moves has
   :math:`s_i \to 0^-`). These are the extended scores of
   :func:`cdsjax.core.surrogates.equilibrium_scores`, so a filled selection is the top-B of a
   score that is continuous across support changes.
3. Equal slacks go to the higher cosine :math:`\bar q^\top z_i` (mean over the
   query vertices, before the :math:`\max(\cdot, 0)` clip), then to the lower index.
4. When no valid note has a positive edge to any query vertex and no note is
   pinned, the query vertices are isolated and the equilibrium is known exactly:
   the free note block :math:`W - \alpha I` is negative definite under the spectral
   penalty, so :math:`x^\top M x \le 0` with equality only at the query alone. Its
   note support is empty and every note's slack is exactly 0, so rule 3 ranks the
   whole selection by cosine. The selection uses this exact equilibrium in every
   mode: paper mode decays towards it at a rate of order :math:`\varepsilon` and
   after 10,000 steps still spreads weight over every note in a pattern that does
   not depend on the question.

The same rule serves paper mode, converged mode, peeling and the support-targeted
CDS. Filled picks carry their slack as their score (so scores stay comparable with
:func:`~cdsjax.core.surrogates.equilibrium_scores`) and the :class:`~cdsjax.core.Selection`
reports ``support_size``, ``num_filled`` and ``fill_reason``.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import FILL_NO_QUERY_EDGE, FILL_NONE, FILL_SHORT_SUPPORT, Affinity, Selection, SolverResult
from cdsjax.core.validation import check_budget, query_similarity


def top_b(scores: Array, eligible: Array, budget: int) -> tuple[Array, Array, Array]:
    """Top-``budget`` entries of ``scores`` among ``eligible``, best first.

    Ties go to the lowest index. When fewer than ``budget`` entries are eligible the
    tail is marked invalid (index 0, score 0).

    Args:
      scores: ``[n]`` float.
      eligible: ``[n]`` bool.
      budget: static number of picks (may exceed ``n``).

    Returns:
      ``(indices [budget] int32, selected_valid [budget] bool, scores [budget])``.
    """
    budget = check_budget(budget)
    n = scores.shape[0]
    masked = jnp.where(eligible, scores, -jnp.inf)
    if budget > n:
        masked = jnp.concatenate([masked, jnp.full((budget - n,), -jnp.inf, masked.dtype)])
    values, idx = lax.top_k(masked, budget)
    ok = jnp.isfinite(values)
    return (
        jnp.where(ok, idx, 0).astype(jnp.int32),
        ok,
        jnp.where(ok, values, 0.0),
    )


def kkt_slack(affinity: Affinity, x: Array) -> Array:
    r"""``[n]`` slack :math:`(Mx)_i - x^\top M x` of the notes (queries excluded)."""
    payoff = affinity.payoff()
    mx = payoff @ x
    return (mx - x @ mx)[affinity.num_queries :]


def isolated_query(affinity: Affinity) -> Array:
    """``[]`` bool: no valid note has a positive edge to a query vertex and none is pinned
    (rule 4 of the module docstring: the equilibrium is the query alone)."""
    m = affinity.num_queries
    note_valid = affinity.valid[m:]
    edge = jnp.any((affinity.matrix[:m, m:] > 0) & note_valid[None, :])
    pinned = jnp.any(affinity.constraint[m:] & note_valid)
    return ~edge & ~pinned


def query_cosine(notes: Array, query: Array, query_scores: Optional[Array] = None) -> Array:
    r"""``[n]`` mean cosine :math:`\bar q^\top z_i` over the query rows (``query`` ``[d]`` or ``[m, d]``), or the
    mean of ``query_scores`` ``[m, n]`` where given (:attr:`CDSProblem.query_scores`)."""
    query = jnp.asarray(query)
    if query.ndim == 1:
        query = query[None, :]
    return jnp.mean(query_similarity(jnp.asarray(notes), query, query_scores), axis=0)


def fill_order(
    support: Array, note_valid: Array, slack: Array, cosine: Array, isolated: Array, budget: int
) -> tuple[Array, Array]:
    """Notes outside the support in fill order (rules 2-4 of the module docstring).

    Returns:
      ``(order [max(n, budget)] int32, count [])``: the first ``count`` entries of
      ``order`` are the fill candidates, best first.
    """
    n = slack.shape[0]
    rest = note_valid & ~support
    slack = jnp.where(isolated | ~jnp.isfinite(slack), 0.0, slack)
    cosine = jnp.where(jnp.isfinite(cosine), cosine, -jnp.inf)
    # lexicographic: candidates first, then larger slack, then larger cosine; the stable
    # sort keeps lower indices first among exact ties
    keys = (
        jnp.where(rest, 0, 1).astype(jnp.int32),
        jnp.where(rest, -slack, 0.0),
        jnp.where(rest, -cosine, 0.0),
        jnp.arange(n, dtype=jnp.int32),
    )
    order = lax.sort(keys, num_keys=3, is_stable=True)[3]
    if budget > n:
        order = jnp.concatenate([order, jnp.zeros((budget - n,), jnp.int32)])
    return order, jnp.sum(rest).astype(jnp.int32)


def _fill(idx, ok, support, note_valid, slack, cosine, isolated, budget):
    """Completes the support's picks ``(idx, ok)`` by the fill rule; returns the picks, their scores' fill
    values and ``(num_filled, fill_reason)``."""
    cosine = jnp.zeros_like(slack) if cosine is None else cosine
    order, count = fill_order(support, note_valid, slack, cosine, isolated, budget)
    k = jnp.sum(ok).astype(jnp.int32)
    slots = jnp.arange(budget, dtype=jnp.int32)
    j = jnp.clip(slots - k, 0, order.shape[0] - 1)
    filled = (slots >= k) & (slots - k < count)
    pick = order[j]
    slack_pick = jnp.where(isolated, 0.0, slack[pick])
    num_filled = jnp.sum(filled).astype(jnp.int32)
    reason = jnp.where(num_filled > 0, jnp.where(isolated, FILL_NO_QUERY_EDGE, FILL_SHORT_SUPPORT), FILL_NONE)
    return filled, jnp.where(filled, pick, idx).astype(jnp.int32), slack_pick, num_filled, reason.astype(jnp.int32)


def read_out(
    result: SolverResult,
    note_valid: Array,
    *,
    budget: int,
    threshold: float = 1e-6,
    slack: Array | None = None,
    cosine: Array | None = None,
    isolated: Array | None = None,
    beta: Array | None = None,
    rank: Array | None = None,
) -> Selection:
    r"""The one read-out of every CDS strategy: the support by weight, then the fill rule, as a :class:`Selection`.

    Args:
      result: the solver's result (``x`` ``[m+n]``, queries first); stored in the selection.
      note_valid: ``[n]`` bool, True on real notes.
      budget: static number of picks.
      threshold: support threshold :math:`\theta`.
      slack: ``[n]`` KKT slack of the notes (:func:`kkt_slack`), or None for no fill (the paper's
        reading: fewer picks when the support is short).
      cosine: optional ``[n]`` raw query cosine, the tie-break (:func:`query_cosine`); None ranks
        ties by index.
      isolated: optional ``[]`` bool, the query vertices are isolated (:func:`isolated_query`): the
        support is then empty whatever ``x`` holds.
      beta: optional ``[]`` note-block strength to report.
      rank: optional ``[n]`` weights to rank the notes by (default: the notes' part of ``result.x``;
        peeling ranks by round, then weight).

    Returns:
      :class:`Selection` with ``support_size``, ``num_filled`` and ``fill_reason``.
    """
    budget = check_budget(budget)
    x_notes = result.x[result.x.shape[-1] - note_valid.shape[-1]:] if rank is None else rank
    isolated = jnp.asarray(False) if isolated is None else jnp.asarray(isolated)
    support = note_valid & (x_notes > threshold) & ~isolated
    size = jnp.sum(support).astype(jnp.int32)
    if slack is not None and budget == note_valid.shape[-1] and float(threshold) >= 0.0:
        return _read_every_note(result, note_valid, x_notes, support, size, slack, cosine, isolated, beta)
    idx, ok, scores = top_b(x_notes, support, budget)
    num_filled = reason = jnp.zeros((), jnp.int32)
    if slack is not None:
        filled, idx, slack_pick, num_filled, reason = _fill(idx, ok, support, note_valid, slack, cosine, isolated,
                                                            budget)
        scores = jnp.where(filled, slack_pick, scores)
        ok = ok | filled
    return Selection(
        indices=idx, selected_valid=ok, scores=scores, result=result, support_size=size, num_filled=num_filled,
        fill_reason=reason, beta=None if beta is None else jnp.asarray(beta, result.x.dtype),
    )


def _read_every_note(result, note_valid, x_notes, support, size, slack, cosine, isolated, beta) -> Selection:
    """:func:`read_out` of every note (``budget`` the number of notes, with the fill rule): the support by weight
    and the fill order of the rest in one sort, where the top-B of the weights and the fill rule's order took a sort
    each. The same selection for weights that are finite on the support (an equilibrium's, a peeling's round and
    weight) with ``threshold >= 0``: positive weights descending, ties to the lower index, as ``lax.top_k`` takes
    them."""
    n = note_valid.shape[-1]
    rest = note_valid & ~support
    slack_key = jnp.where(isolated | ~jnp.isfinite(slack), 0.0, slack)
    cosine = jnp.zeros_like(slack) if cosine is None else cosine
    cosine_key = jnp.where(jnp.isfinite(cosine), cosine, -jnp.inf)
    # the support first (largest weight first), then the fill candidates (the keys of fill_order), then the rest;
    # the stable sort keeps lower indices first among exact ties
    keys = (
        jnp.where(support, 0, jnp.where(rest, 1, 2)).astype(jnp.int32),
        jnp.where(support, -x_notes, jnp.where(rest, -slack_key, 0.0)),
        jnp.where(rest, -cosine_key, 0.0),
        jnp.arange(n, dtype=jnp.int32),
    )
    order = lax.sort(keys, num_keys=3, is_stable=True)[3]
    slots = jnp.arange(n)
    picked = slots < size + jnp.sum(rest).astype(jnp.int32)
    filled = picked & (slots >= size)
    scores = jnp.where(slots < size, x_notes[order], 0.0)
    scores = jnp.where(filled, jnp.where(isolated, 0.0, slack[order]), scores)
    num_filled = jnp.sum(filled).astype(jnp.int32)
    reason = jnp.where(num_filled > 0, jnp.where(isolated, FILL_NO_QUERY_EDGE, FILL_SHORT_SUPPORT), FILL_NONE)
    return Selection(
        indices=jnp.where(picked, order, 0).astype(jnp.int32), selected_valid=picked, scores=scores, result=result,
        support_size=size, num_filled=num_filled, fill_reason=reason.astype(jnp.int32),
        beta=None if beta is None else jnp.asarray(beta, result.x.dtype),
    )


def read_selection(result: SolverResult, affinity: Affinity, options: SolveOptions, *, budget: int,
                   cosine: Array | None = None, beta: Array | None = None) -> Selection:
    r"""The :class:`Selection` of an equilibrium of a dense ``affinity``: :func:`read_out` with its slack
    (when ``options.fill``), its isolated-query test and ``options.threshold``.

    Args:
      result: the solver's result on ``affinity``.
      affinity: the problem's :class:`Affinity` (gives the payoff for the slack).
      options: the :class:`SolveOptions` (``threshold``, ``fill``).
      budget: static number of picks.
      cosine: optional ``[n]`` raw query cosine of the notes, the tie-break (:func:`query_cosine`).
      beta: optional ``[]`` note-block strength to report.
    """
    m = affinity.num_queries
    return read_out(result, affinity.valid[m:], budget=budget, threshold=options.threshold,
                    slack=kkt_slack(affinity, result.x) if options.fill else None, cosine=cosine,
                    isolated=isolated_query(affinity), beta=beta)
