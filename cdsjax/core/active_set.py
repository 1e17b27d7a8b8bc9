r"""Active-set Newton on the support: a second converged-mode solver.

Replicator dynamics and InImDyn are first-order: on the CDS payoff they crawl,
because :math:`\alpha = \lambda_{\max}(W) + \varepsilon` leaves the free block
:math:`W - \alpha I` with one eigenvalue of only :math:`-\varepsilon` (the
problem's curvature spans a ratio of about :math:`\lambda_{\max}/\varepsilon`).
The equilibrium also tends to have a large support. On a fixed support
:math:`S` the stationarity conditions are linear,

.. math:: M_{SS}\, x_S = \lambda \mathbf 1, \qquad \mathbf 1^\top x_S = 1,

so one Newton step solves the face exactly whatever its conditioning.

Each outer iteration:

1. Newton on the current support :math:`S = \{i : x_i > 0\}`: the direction
   :math:`d` solves :math:`M_{SS} d_S - \mu \mathbf 1 = -(Mx)_S`,
   :math:`\mathbf 1^\top d_S = 0` (the correction form, so repeated steps refine
   in low precision), :math:`d = 0` off :math:`S`. The step :math:`t` is the exact
   maximiser of the quadratic :math:`f(x + t d)` on :math:`[0, t_{\max}]`, with
   :math:`t_{\max}` the ratio test that keeps :math:`x \ge 0`; a vertex that blocks
   leaves the support. Ascent is monotone, so saddle faces are left, not sought.
2. Up to ``inner_steps`` InImDyn vertex steps (:mod:`cdsjax.core.inimdyn`), which
   bring in infective vertices from outside :math:`S` and drop dying ones at O(N)
   per step.

It stops on the Nash error (the KKT residual) like InImDyn. Each Newton step
costs one dense ``(N+1)``-square solve, O(N^3); the number of outer iterations is
small when the support is found early (one or two on the CDS payoff from the
uniform start).
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.inimdyn import DEFAULT_MAX_ITER, default_tol, nash_error, vertex_steps
from cdsjax.core.replicator import finish, prepare_x0
from cdsjax.core.select import register_solver
from cdsjax.core.types import Affinity, SolverResult


def newton_direction(payoff: Array, x: Array, mx: Array, support: Array) -> Array:
    r"""Direction to the stationary point of the face spanned by ``support``.

    Solves :math:`M_{SS} d_S - \mu\mathbf 1 = -(Mx)_S`, :math:`\mathbf 1^\top d_S = 0`
    as one bordered ``[N+1, N+1]`` system whose rows off the support read
    :math:`d_i = 0`.

    Args:
      payoff: ``[N, N]`` symmetric payoff.
      x: ``[N]`` point on the simplex, zero off ``support``.
      mx: ``[N]`` :math:`Mx`.
      support: ``[N]`` bool.

    Returns:
      ``[N]`` direction (zero off the support; may be non-finite if the face's
      system is singular).
    """
    size = x.shape[0]
    dtype = x.dtype
    pair = support[:, None] & support[None, :]
    block = jnp.where(pair, payoff, 0.0) + jnp.diag(jnp.where(support, 0.0, 1.0).astype(dtype))
    ones = support.astype(dtype)
    system = jnp.zeros((size + 1, size + 1), dtype)
    system = system.at[:size, :size].set(block)
    system = system.at[:size, size].set(-ones)
    system = system.at[size, :size].set(ones)
    rhs = jnp.concatenate([jnp.where(support, -mx, 0.0), jnp.zeros((1,), dtype)])
    return jnp.linalg.solve(system, rhs)[:size]


def newton_step(payoff: Array, x: Array, mx: Array, valid: Array) -> tuple[Array, Array]:
    """One Newton step on the support of ``x`` with ratio test and exact line search.

    Returns:
      ``(x, gain)``: the new point (``x`` itself when the step fails or gains
      nothing) and the objective gain (0 then).
    """
    dtype = x.dtype
    support = valid & (x > 0)
    d = newton_direction(payoff, x, mx, support)
    ok = jnp.all(jnp.isfinite(d))
    d = jnp.where(ok & support, d, 0.0)
    shrinking = d < 0
    ratios = jnp.where(shrinking, x / jnp.where(shrinking, -d, 1.0), jnp.inf)
    block_at = jnp.argmin(ratios)
    t_max = ratios[block_at]
    t_max = jnp.where(jnp.isfinite(t_max), t_max, 0.0)
    slope = d @ mx
    curv = d @ (payoff @ d)
    concave = curv < 0
    interior = jnp.clip(jnp.where(concave, -slope / jnp.where(concave, curv, -1.0), 0.0), 0.0, t_max)
    cands = jnp.stack([jnp.zeros((), dtype), t_max, interior])
    gains = 2.0 * cands * slope + cands * cands * curv
    best = jnp.argmax(gains)
    t = cands[best]
    x_new = jnp.maximum(x + t * d, 0.0)
    x_new = jnp.where((best == 1) & (jnp.arange(x.shape[0]) == block_at), 0.0, x_new)
    x_new = jnp.where(valid, x_new, 0.0)
    x_new = x_new / jnp.sum(x_new)
    return x_new, gains[best]


def solve_active_set(
    affinity: Affinity,
    x0: Optional[Array] = None,
    *,
    tol: Optional[float] = None,
    max_iter: int = DEFAULT_MAX_ITER,
    inner_steps: Optional[int] = None,
    max_newton: Optional[int] = None,
) -> SolverResult:
    r"""Maximises :math:`x^\top M x` on the simplex by Newton steps on the support.

    Converged mode: alternates a Newton step on the current support (exact line
    search, ratio test) with up to ``inner_steps`` InImDyn vertex steps, until the
    Nash error (KKT residual) is below ``tol``. Payoffs of any sign, trailing
    padding and ``jax.vmap`` are supported.

    Args:
      affinity: the problem's :class:`Affinity`.
      x0: optional ``[m+n]`` initial point (masked and renormalised); uniform over
        valid vertices if None.
      tol: Nash-error tolerance; None picks the dtype's default (1e-10 in float64,
        1e-5 in float32; see :func:`cdsjax.core.inimdyn.default_tol`).
      max_iter: maximum number of steps, Newton and vertex steps together.
      inner_steps: vertex steps between Newton steps; None uses ``N``.
      max_newton: maximum number of Newton steps; None uses ``N`` (each removes a
        blocking vertex or solves a face, so more are never needed in practice).

    Returns:
      :class:`SolverResult`; ``num_iters`` counts Newton and vertex steps,
      ``step`` is the final Nash error.
    """
    if not isinstance(max_iter, int) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer, got {max_iter!r}")
    payoff = affinity.payoff()
    valid = affinity.valid
    dtype = payoff.dtype
    size = payoff.shape[0]
    inner_steps = size if inner_steps is None else inner_steps
    max_newton = size if max_newton is None else max_newton
    for name, value in (("inner_steps", inner_steps), ("max_newton", max_newton)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if tol is None:
        tol = default_tol(dtype)
    x = prepare_x0(x0, valid, dtype)

    def outer_cond(state):
        _, _, err, it, newton = state
        return (err >= tol) & (it < max_iter) & (newton < max_newton)

    def outer_body(state):
        x, mx, _, it, newton = state
        x, _ = newton_step(payoff, x, mx, valid)
        mx = payoff @ x
        err = nash_error(x, mx, valid)
        x, it = vertex_steps(payoff, valid, x, mx, err, it + 1, tol=tol, max_iter=max_iter, steps=inner_steps)
        x = jnp.where(valid, jnp.maximum(x, 0.0), 0.0)
        x = x / jnp.sum(x)
        mx = payoff @ x
        return x, mx, nash_error(x, mx, valid), it, newton + 1

    mx = payoff @ x
    init = (x, mx, nash_error(x, mx, valid), jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))
    x, mx, err, it, _ = lax.while_loop(outer_cond, outer_body, init)
    return finish(payoff, x, valid, it, err < tol, err, affinity.alpha)


register_solver("active_set", solve_active_set, None, DEFAULT_MAX_ITER)
# The default converged mode (``solver="converged"``): on the CDS payoff it reached
# KKT <= 1e-8 in one Newton step where InImDyn took 1e4-2e5 vertex steps
# (experiments/bench_solvers.py).
register_solver("converged", solve_active_set, None, DEFAULT_MAX_ITER)
