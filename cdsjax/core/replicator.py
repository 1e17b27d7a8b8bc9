r"""Replicator dynamics on the simplex (paper mode), initial points and diagnostics."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.types import Affinity, SolverResult

SUPPORT_THRESHOLD = 1e-6
SHIFT_EPS = 1e-3


def uniform_x0(valid: Array, dtype=jnp.float32) -> Array:
    """``[N]`` uniform point over the valid vertices (0 at padding)."""
    v = valid.astype(dtype)
    return v / jnp.sum(v)


def softmax_prior(affinity: Affinity, temperature: float = 0.1) -> Array:
    r"""Query-softmax initial point.

    Each query vertex keeps :math:`1/(n+m)`; the notes share the rest in proportion
    to :math:`\exp(r_i / T)`, with :math:`r_i` the note's strongest query edge.

    Args:
      affinity: the problem's :class:`Affinity`.
      temperature: the softmax temperature ``T`` (paper: 0.1).

    Returns:
      ``[m+n]`` point on the simplex, 0 at padding.
    """
    m = affinity.num_queries
    valid = affinity.valid
    dtype = affinity.matrix.dtype
    rel = jnp.max(affinity.matrix[:m, m:], axis=0)
    note_valid = valid[m:]
    logits = jnp.where(note_valid, rel / temperature, -jnp.inf)
    weights = jax.nn.softmax(logits)
    weights = jnp.where(note_valid, weights, 0.0)
    total = jnp.sum(valid).astype(dtype)
    query_mass = jnp.full((m,), 1.0, dtype) / total
    return jnp.concatenate([query_mass, weights * (1.0 - m / total)]).astype(dtype)


def objective(payoff: Array, x: Array) -> Array:
    r""":math:`x^\top M x`."""
    return x @ (payoff @ x)


def kkt_residual(payoff: Array, x: Array, valid: Array) -> Array:
    r"""Nash error :math:`\max_i |\min(x_i, -r_i)|`, :math:`r = Mx - (x^\top Mx)\mathbf 1`.

    Zero exactly at a KKT point of :math:`\max_{x\in\Delta} x^\top M x`; padding is ignored.
    """
    mx = payoff @ x
    r = mx - x @ mx
    return jnp.max(jnp.where(valid, jnp.abs(jnp.minimum(x, -r)), 0.0))


def support_size(x: Array, valid: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    """Number of valid vertices with ``x_i > threshold``."""
    return jnp.sum(valid & (x > threshold)).astype(jnp.int32)


def prepare_x0(x0: Optional[Array], valid: Array, dtype) -> Array:
    """Masks a user point to the valid vertices and renormalises it; uniform if None."""
    if x0 is None:
        return uniform_x0(valid, dtype)
    x0 = jnp.asarray(x0, dtype)
    if x0.shape != valid.shape:
        raise ValueError(f"x0 must have shape {valid.shape}, got {x0.shape}")
    x0 = jnp.where(valid, jnp.maximum(x0, 0.0), 0.0)
    return x0 / jnp.sum(x0)


def replicator_shift(payoff: Array, valid: Array, eps: float = SHIFT_EPS) -> Array:
    r"""Shift :math:`c = \max(0, -\min M) + \varepsilon`, the minimum taken over valid entries."""
    pair = valid[:, None] & valid[None, :]
    lowest = jnp.min(jnp.where(pair, payoff, jnp.inf))
    return jnp.maximum(0.0, -lowest) + eps


def finish(payoff: Array, x: Array, valid: Array, num_iters, converged, step, alpha) -> SolverResult:
    """Packs a point and its diagnostics into a :class:`SolverResult`."""
    return SolverResult(
        x=x,
        num_iters=jnp.asarray(num_iters, jnp.int32),
        converged=jnp.asarray(converged, bool),
        step=jnp.asarray(step, x.dtype),
        objective=objective(payoff, x),
        kkt_residual=kkt_residual(payoff, x, valid),
        support_size=support_size(x, valid),
        alpha=jnp.asarray(alpha, x.dtype),
    )


def solve_replicator(
    affinity: Affinity,
    x0: Optional[Array] = None,
    *,
    tol: float = 1e-7,
    max_iter: int = 10_000,
    shift_eps: float = SHIFT_EPS,
    unroll: int = 8,
) -> SolverResult:
    r"""Runs discrete replicator dynamics on the payoff :math:`M = A - \alpha I_{\bar S}`.

    .. math:: x \leftarrow x \odot (Mx + c) / (x^\top M x + c)

    with :math:`c = \max(0, -\min M) + \varepsilon`, until
    :math:`\|x_{t+1}-x_t\|_1 <` ``tol`` or ``max_iter`` steps (the paper's settings:
    1e-7 and 10,000 — "paper mode"). Padded vertices start at 0 and stay 0.

    Args:
      affinity: the problem's :class:`Affinity`.
      x0: optional ``[m+n]`` initial point (masked and renormalised); uniform over
        valid vertices if None.
      tol: stopping tolerance on the L1 step.
      max_iter: maximum number of steps.
      shift_eps: the :math:`\varepsilon` of the shift.
      unroll: steps per loop trip (a speed knob; results do not depend on it).

    Returns:
      :class:`SolverResult`; ``converged`` is False when ``max_iter`` was hit.
    """
    if not isinstance(max_iter, int) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer, got {max_iter!r}")
    if not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"unroll must be a positive integer, got {unroll!r}")
    payoff = affinity.payoff()
    valid = affinity.valid
    dtype = payoff.dtype
    x = prepare_x0(x0, valid, dtype)
    c = replicator_shift(payoff, valid, shift_eps).astype(dtype)

    def cond(state):
        _, step, it = state
        return (step >= tol) & (it < max_iter)

    def body(state):
        # `unroll` steps per loop trip amortise the loop's per-trip overhead; each
        # step is masked once the stopping rule has fired, so the iterates and the
        # step count are exactly those of a one-step-per-trip loop.
        x, step, it = state
        for _ in range(unroll):
            active = (step >= tol) & (it < max_iter)
            mx = payoff @ x
            x_new = x * (mx + c) / (x @ mx + c)
            step_new = jnp.sum(jnp.abs(x_new - x))
            x = jnp.where(active, x_new, x)
            step = jnp.where(active, step_new, step)
            it = it + active.astype(it.dtype)
        return x, step, it

    init = (x, jnp.asarray(jnp.inf, dtype), jnp.asarray(0, jnp.int32))
    x, step, it = lax.while_loop(cond, body, init)
    return finish(payoff, x, valid, it, step < tol, step, affinity.alpha)
