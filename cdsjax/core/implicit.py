r"""Derivatives of the CDS equilibrium with respect to its hyperparameters.

At a KKT point :math:`x^*` of :math:`\max_{x\in\Delta} x^\top M x` with support
:math:`S = \{i : x^*_i > \theta\}`,

.. math:: (M x^*)_i = \lambda \ (i \in S), \qquad x^*_i = 0 \ (i \notin S), \qquad \textstyle\sum_i x^*_i = 1,

with :math:`\lambda = x^{*\top} M x^*`. As long as the support does not change,
differentiating these equations in a perturbation :math:`\mathrm{d}M` gives the
bordered linear system

.. math:: M_{SS}\,\mathrm{d}x_S - \mathrm{d}\lambda\,\mathbf 1 = -(\mathrm{d}M\,x^*)_S,
          \qquad \mathbf 1^\top \mathrm{d}x_S = 0, \qquad \mathrm{d}x_{\bar S} = 0,

solved here at a fixed shape ``[N+1, N+1]`` by replacing the rows (and columns) of
vertices off the support with identity rows, so it jits and vmaps. The tangent is
linear in :math:`\mathrm{d}M`, so the ``jax.custom_jvp`` rule transposes and
``jax.grad`` works as well as ``jax.jacfwd``. :math:`\mathrm{d}M` itself comes from
ordinary autodiff of :func:`cdsjax.core.affinity.build_affinity`, so every input
of the affinity is covered: :math:`\beta`, :math:`\tau` (soft mode), the embeddings,
and the penalty :math:`\alpha = \lambda_{\max}(A|_{\bar S}) + \varepsilon` through
``eigvalsh`` (:math:`\mathrm{d}\lambda_{\max} = v^\top \mathrm{d}A\, v` for a simple
top eigenvalue; for the dissimilarity coupling :math:`\alpha - \varepsilon` is
linear in :math:`\beta`).

What the derivative means:

* It is the derivative of the equilibrium *branch* through :math:`x^*` with the
  current support. It is exact only at a converged point: report ``converged`` /
  ``kkt_residual`` next to it (:func:`cds_equilibrium` returns them).
* Where the support changes (a note enters or leaves as :math:`\beta` or
  :math:`\tau` moves) the equilibrium is continuous but has a kink; the derivative
  returned there is the one-sided derivative of the branch whose support is
  :math:`\{x^*_i > \theta\}`. It is always finite: if the restricted system is
  singular (a degenerate equilibrium) the tangent is 0 and
  :func:`implicit_system_ok` reports it.
* Hard :math:`\tau` is piecewise constant in :math:`\tau` (edges switch on and off),
  so its derivative is 0 almost everywhere; use ``tau_mode="soft"`` for
  :math:`\tau`-derivatives.

:func:`equilibrium_scores` extends :math:`x^*` off the support by the KKT slack
:math:`(Mx^*)_i - \lambda \le 0`, giving a ranking score that is continuous across
support changes and has non-zero derivatives for notes outside the support; the
retrieval surrogates (:func:`soft_recall`, :func:`gold_mass`) build on it.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import Array, lax

from cdsjax.core.affinity import build_affinity
from cdsjax.core.solvers import solve, solver_name
from cdsjax.core.types import SUPPORT_THRESHOLD, Affinity, CDSParams, CDSProblem, SolveOptions, SolverResult, solve_options
from cdsjax.core.validation import check_budget, check_option

DIFFERENTIATE = ("implicit", "loop")


def implicit_system(payoff: Array, x: Array, valid: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    r"""The bordered KKT matrix of the support, padded to ``[N+1, N+1]``.

    Args:
      payoff: ``[N, N]`` float, the payoff :math:`M` (symmetric).
      x: ``[N]`` float, an equilibrium on the simplex (0 at padding).
      valid: ``[N]`` bool, True on real vertices.
      threshold: support threshold :math:`\theta`.

    Returns:
      ``[N+1, N+1]`` float :math:`K` with :math:`K_{SS} = M_{SS}`, the border
      :math:`-\mathbf 1_S` in the last row and column, identity rows and columns on
      vertices off the support (including padding), and :math:`K_{N,N} = 0`.
    """
    size = x.shape[0]
    dtype = payoff.dtype
    support = valid & (x > threshold)
    pair = support[:, None] & support[None, :]
    eye = jnp.eye(size, dtype=dtype)
    top = jnp.where(pair, payoff, jnp.where(support[:, None], 0.0, eye))
    border = -support.astype(dtype)
    upper = jnp.concatenate([top, border[:, None]], axis=1)
    lower = jnp.concatenate([border, jnp.zeros((1,), dtype)])[None, :]
    return jnp.concatenate([upper, lower], axis=0)


def _factor(system: Array) -> tuple[tuple[Array, Array], Array]:
    """LU factors of ``system`` and whether it is numerically nonsingular.

    A singular system is replaced by the identity (the caller zeroes the tangent),
    so no NaN reaches the derivative.
    """
    lu, piv = jsl.lu_factor(system)
    pivots = jnp.abs(jnp.diagonal(lu))
    scale = jnp.max(jnp.abs(system))
    tiny = jnp.finfo(system.dtype).eps * system.shape[0] * scale
    ok = jnp.all(jnp.isfinite(lu)) & (jnp.min(pivots) > tiny)
    eye = jnp.eye(system.shape[0], dtype=system.dtype)
    lu = jnp.where(ok, lu, eye)
    piv = jnp.where(ok, piv, jnp.arange(system.shape[0], dtype=piv.dtype))
    return (lu, piv), ok


def implicit_system_ok(payoff: Array, x: Array, valid: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    """``[]`` bool: whether the restricted KKT system at ``x`` is nonsingular (its tangent is used)."""
    return _factor(implicit_system(payoff, x, valid, threshold))[1]


def implicit_tangent(
    payoff: Array, x: Array, valid: Array, d_payoff: Array, threshold: float = SUPPORT_THRESHOLD
) -> Array:
    r"""Tangent :math:`\mathrm{d}x^*` of the equilibrium for a payoff tangent :math:`\mathrm{d}M`.

    Linear in ``d_payoff`` (so it transposes for reverse mode).

    Args:
      payoff: ``[N, N]`` float, :math:`M`.
      x: ``[N]`` float, the equilibrium.
      valid: ``[N]`` bool, True on real vertices.
      d_payoff: ``[N, N]`` float, :math:`\mathrm{d}M`.
      threshold: support threshold :math:`\theta`.

    Returns:
      ``[N]`` float, :math:`\mathrm{d}x^*` (0 off the support and at padding; 0
      everywhere when the restricted system is singular).
    """
    support = valid & (x > threshold)
    factors, ok = _factor(implicit_system(payoff, x, valid, threshold))
    rhs = jnp.where(support, -(d_payoff @ x), 0.0)
    rhs = jnp.concatenate([rhs, jnp.zeros((1,), rhs.dtype)])
    sol = jsl.lu_solve(factors, rhs)
    return jnp.where(ok & support, sol[:-1], 0.0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def attach_implicit(affinity: Affinity, x: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    r"""Returns ``x`` unchanged; its derivative is the implicit one through ``affinity``.

    ``x`` must be an equilibrium of ``affinity.payoff()`` computed with gradients
    stopped (its own tangent is ignored). The JVP differentiates the KKT conditions
    on the support (see the module docstring), so it does not depend on which
    solver produced ``x``.

    Args:
      affinity: the :class:`Affinity`; tangents of ``matrix`` and ``alpha`` are used.
      x: ``[m+n]`` float, the equilibrium.
      threshold: static support threshold :math:`\theta`.

    Returns:
      ``x``.
    """
    return x


@attach_implicit.defjvp
def _attach_implicit_jvp(threshold, primals, tangents):
    affinity, x = primals
    d_affinity, _ = tangents
    free = affinity.free
    d_payoff = d_affinity.matrix - jnp.diag(jnp.where(free, d_affinity.alpha, 0.0).astype(x.dtype))
    dx = implicit_tangent(affinity.payoff(), x, affinity.valid, d_payoff, threshold)
    return x, dx


def cds_equilibrium(
    problem: CDSProblem,
    params: CDSParams = CDSParams(),
    options: Optional[SolveOptions] = None,
    *,
    x0: Optional[Array] = None,
    differentiate: str = "implicit",
    **overrides,
) -> tuple[SolverResult, Affinity]:
    r"""Solves the CDS problem and returns a result whose ``x`` is differentiable (the companion of
    :func:`cdsjax.core.cds` for derivatives).

    Args:
      problem: the :class:`CDSProblem` (one question; its ``pinned`` notes join the constraint set).
      params: :class:`CDSParams`; ``beta`` and ``tau`` are differentiable leaves
        (``tau`` only in ``tau_mode="soft"``; hard :math:`\tau` has derivative 0).
      options: :class:`SolveOptions`: ``solver`` (None: :data:`~cdsjax.core.types.DEFAULT_SOLVER`,
        paper mode; pass a converged one, ``"inimdyn"`` or ``"converged"``, for exact derivatives),
        ``tol`` / ``max_iter``, and ``threshold`` (the support of the implicit system).
      x0: optional ``[m+n]`` initial point.
      differentiate: ``"implicit"`` (KKT implicit function; forward and reverse
        mode, solver-independent) or ``"loop"`` (forward-mode differentiation
        through the solver's iterations; the reference, forward mode only).
      **overrides: :class:`SolveOptions` fields replacing those of ``options``.

    Returns:
      ``(result, affinity)``: the :class:`SolverResult` with differentiable ``x``
      (``[m+n]``, queries first; diagnostics are those of the solve, without
      derivatives), and the differentiable :class:`Affinity`. The derivative is
      only right where ``result.converged`` holds.
    """
    check_option("differentiate", differentiate, DIFFERENTIATE)
    options = solve_options(options, **overrides)
    solver = solver_name(options.solver)

    def run(aff):
        return solve(aff, x0, solver=solver, tol=options.tol, max_iter=options.max_iter)

    affinity = build_affinity(problem.notes, problem.queries, problem.valid, params, pinned=problem.pinned)
    if differentiate == "loop":
        return run(affinity), affinity
    result = run(lax.stop_gradient(affinity))
    x = attach_implicit(affinity, lax.stop_gradient(result.x), options.threshold)
    return result.replace(x=x), affinity


def cds_weights(notes: Array, query: Array, valid: Array, params: CDSParams = CDSParams(), *,
                pinned: Optional[Array] = None, **kwargs) -> Array:
    r"""The equilibrium :math:`x^*` ``[m+n]`` (queries first), differentiable in ``params``.

    A thin wrapper of :func:`cds_equilibrium` on ``CDSProblem.create(notes, query, valid, pinned=pinned)``
    (``kwargs``: ``options``, ``x0``, ``differentiate`` and :class:`SolveOptions` fields) for callers
    that only need the weights; use :func:`cds_equilibrium` to also get the convergence diagnostics
    that say whether the derivative can be trusted.
    """
    return cds_equilibrium(CDSProblem.create(notes, query, valid, pinned=pinned), params, **kwargs)[0].x


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


def _soft_threshold(scores: Array, budget: int, threshold: float) -> tuple[Array, Array]:
    """The soft top-B cut and its scale.

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
    near = jnp.isfinite(top)
    spread = jnp.sum(jnp.where(near, jnp.abs(jnp.where(near, top, 0.0) - t), 0.0)) / jnp.maximum(jnp.sum(near), 1)
    return t, jnp.maximum(spread, jnp.finfo(scores.dtype).tiny ** 0.5)


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
    t, spread = _soft_threshold(scores, budget, threshold)
    unit_valid = _unit_valid(gold_units, unit_valid, scores.shape[0])
    finite = jnp.isfinite(scores)
    z = (jnp.where(finite, scores, 0.0) - t) / (temperature * spread)
    log_miss = jnp.where(finite, jax.nn.log_sigmoid(-z), 0.0)
    unit_log_miss = jnp.sum(jnp.where(gold_units, log_miss[None, :], 0.0), axis=1)
    covered = -jnp.expm1(unit_log_miss)
    count = jnp.sum(unit_valid)
    total = jnp.sum(jnp.where(unit_valid, covered, 0.0))
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


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
    params: CDSParams,
    options: Optional[SolveOptions] = None,
    *,
    budget: int,
    temperature: float = 0.2,
    slack_weight: float = 1.0,
    unit_valid: Optional[Array] = None,
    **overrides,
) -> dict:
    r"""Differentiable retrieval objectives of one query, with the measured recall and diagnostics.

    Args:
      problem, params, options, **overrides: as :func:`cds_equilibrium` (``options.threshold`` is
        also the selection threshold :math:`\theta`).
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
    result, affinity = cds_equilibrium(problem, params, options)
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
        "converged": result.converged,
        "kkt_residual": result.kkt_residual,
        "support_size": result.support_size,
        "implicit_ok": implicit_system_ok(
            lax.stop_gradient(affinity.payoff()), x_fixed, affinity.valid, threshold),
    }
