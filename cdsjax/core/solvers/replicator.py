r"""Replicator dynamics on the simplex (paper mode), initial points and diagnostics."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array

from cdsjax.core.games.payoff import SHIFT_EPS, DensePayoff, prepare_x0
from cdsjax.core.solvers.loop import LoopSolver, LoopState, iterate, nash_error, start_state, stop_rule
from cdsjax.core.types import Affinity, SolverResult


def uniform_x0(valid: Array, dtype=jnp.float32) -> Array:
    """``[N]`` uniform point over the valid vertices (0 at padding)."""
    return prepare_x0(None, valid, dtype)


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
    r"""Nash error :math:`\max_i |\min(x_i, -r_i)|`, :math:`r = Mx - (x^\top Mx)\mathbf 1` (:func:`nash_error`).

    Zero exactly at a KKT point of :math:`\max_{x\in\Delta} x^\top M x`; padding is ignored.
    """
    return nash_error(x, payoff @ x, valid)


@struct.dataclass
class Replicator(LoopSolver):
    r"""Discrete replicator dynamics (paper mode), a solver for :func:`cdsjax.core.solvers.loop.iterate`.

    .. math:: x \leftarrow x \odot (Mx + c) / (x^\top M x + c)

    with :math:`c = \max(0, -\min M) + \varepsilon`, until
    :math:`\|x_{t+1}-x_t\|_1 <` ``tol`` or ``max_iter`` steps (the paper's settings:
    1e-7 and 10,000). Padded vertices start at 0 and stay 0. Runs on a dense or a
    shared-corpus payoff (:mod:`cdsjax.core.games.payoff`).

    Attributes:
      tol: stopping tolerance on the L1 step.
      max_iter: maximum number of steps.
      shift_eps: the :math:`\varepsilon` of the shift (a shared corpus fixes its own).
      unroll: steps per loop trip (a speed knob; results do not depend on it).
    """

    tol: float = struct.field(pytree_node=False, default=1e-7)
    max_iter: int = struct.field(pytree_node=False, default=10_000)
    shift_eps: float = struct.field(pytree_node=False, default=SHIFT_EPS)
    unroll: int = struct.field(pytree_node=False, default=8)

    name = "replicator"

    def solve(self, payoff, x0: Optional[Array] = None) -> SolverResult:
        """:func:`~cdsjax.core.solvers.loop.iterate` on ``payoff``, a batch of questions in one loop (one
        ``[b, n] @ [n, n]`` product per step, each row frozen as it stops)."""
        return iterate(self, payoff, x0)

    def tolerance(self, dtype) -> float:
        return self.tol

    def prepare(self, payoff) -> Array:
        return payoff.shift(self.shift_eps)

    def init(self, payoff, x0: Optional[Array]) -> LoopState:
        x = prepare_x0(x0, payoff.valid, payoff.dtype, payoff.batch)
        return start_state(x, jnp.full(payoff.batch, jnp.inf, payoff.dtype))

    def terminate(self, consts, state: LoopState) -> tuple[Array, Array]:
        return stop_rule(state, self.tolerance(state.x.dtype), self.max_iter)

    def step(self, payoff, c: Array, state: LoopState) -> LoopState:
        x = state.x
        mx = payoff.matvec(x)
        x_new = x * (mx + c) / (payoff.value(x, mx) + c)
        return state.replace(x=x_new, err=jnp.sum(jnp.abs(x_new - x), axis=-1), num_iters=state.num_iters + 1)


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
    solver = Replicator(tol=tol, max_iter=max_iter, shift_eps=shift_eps, unroll=unroll)
    return iterate(solver, DensePayoff.from_affinity(affinity), x0)
