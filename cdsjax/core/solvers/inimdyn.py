r"""Infection--immunization dynamics (InImDyn): a converged-mode solver.

InImDyn (Rota Bulò, Pelillo & Bomze, 2011) maximises :math:`x^\top M x` on the
simplex by moving, at each step, along a single vertex direction: towards a pure
strategy :math:`e_i` ("infection", weight flows to :math:`i`) or away from it
("immunization", the co-strategy, weight flows out of :math:`i`). Both moves are
:math:`x + s(e_i - x)` with

.. math:: s \in [\,-x_i/(1-x_i),\ 1\,],

the lower end removing :math:`i` from the support and the upper end putting all
weight on it. Along that line, with :math:`r = Mx - (x^\top Mx)\mathbf 1`,

.. math:: f(x + s(e_i - x)) = f(x) + 2 s\, r_i + s^2 C_i,\qquad
          C_i = M_{ii} - 2 (Mx)_i + x^\top M x,

a one-dimensional quadratic, so the exact line search is the best of the two
ends and the clipped stationary point :math:`-r_i/C_i`. Nothing here assumes a
sign for :math:`M` (no shift is needed, unlike replicator dynamics). After the
move :math:`Mx` changes to :math:`(1-s)Mx + s M_{i,:}`, an O(n) update; it is
recomputed exactly every ``refresh`` steps (and before stopping) so rounding
does not accumulate.

The vertex chosen at each step is the most infective one: the largest
:math:`|r_i|` over pure strategies with :math:`r_i > 0` and co-strategies of
support vertices with :math:`r_i < 0` (:func:`infectivity`). The dynamics stop
when the Nash error :math:`\max_i |\min(x_i, -r_i)|` (the KKT residual of
:func:`cdsjax.core.solvers.loop.nash_error`) is below ``tol``.

Achievable residual by dtype: :math:`r` is a difference of payoffs
:math:`(Mx)_i` of order one on the CDS payoff, so rounding leaves a floor of a
few units of roundoff times that. In float64 ``1e-10`` (the default) is reached;
in float32 the residuals measured at n <= 1024 bottom out near ``1e-6``, and the
default tolerance is ``1e-5`` (:func:`default_tol`).

On the CDS payoff (:math:`\alpha = \lambda_{\max}(W) + \varepsilon` leaves the
free block with an eigenvalue of only :math:`-\varepsilon`) InImDyn, like every
first-order method, needs many steps when the support is large; the active-set
Newton solver of :mod:`cdsjax.core.solvers.active_set` solves such faces exactly.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.games.payoff import DensePayoff, prepare_x0
from cdsjax.core.solvers.loop import LoopSolver, LoopState, check_count, iterate, nash_error, start_state, stop_rule, within_limits
from cdsjax.core.types import Affinity, SolverResult

TOL_FLOAT64 = 1e-10
TOL_FLOAT32 = 1e-5
DEFAULT_MAX_ITER = 1_000_000


def default_tol(dtype) -> float:
    """The default Nash-error tolerance for ``dtype``: 1e-10 in float64, 1e-5 below."""
    return TOL_FLOAT64 if jnp.dtype(dtype) == jnp.float64 else TOL_FLOAT32


def infectivity(x: Array, mx: Array, valid: Array) -> Array:
    r"""How strongly each vertex calls for a move (0 where it calls for none).

    Pure strategy :math:`e_i` is infective when :math:`r_i > 0`; the co-strategy of a
    support vertex when :math:`r_i < 0`. Both score :math:`|r_i|`, the payoff
    difference :math:`|\pi(e_i - x \mid x)|`: ranking co-strategies by the size
    of their step (:math:`\propto x_i`) instead would leave many small, dying
    vertices alive for a long time.
    """
    r = mx - x @ mx
    score = jnp.where(x > 0, jnp.abs(r), jnp.maximum(r, 0.0))
    return jnp.where(valid, score, -1.0)


def vertex_step(payoff, x: Array, mx: Array, f: Array, i: Array) -> tuple[Array, Array, Array]:
    r"""Moves ``x`` along :math:`e_i - x` with the exact line search.

    Args:
      payoff: a :class:`~cdsjax.core.games.payoff.DensePayoff` (or its ``[N, N]`` symmetric matrix :math:`M`).
      x: ``[N]`` point on the simplex.
      mx: ``[N]`` :math:`Mx`.
      f: ``[]`` :math:`x^\top M x`.
      i: ``[]`` int, the vertex.

    Returns:
      ``(x, mx, f)`` after the move.
    """
    dtype = x.dtype
    row = DensePayoff.of(payoff).row(i)
    xi = x[i]
    r_i = mx[i] - f
    curv = row[i] - 2.0 * mx[i] + f
    rest = 1.0 - xi
    lo = jnp.where(rest > 0, -xi / jnp.where(rest > 0, rest, 1.0), 0.0)
    hi = jnp.asarray(1.0, dtype)
    concave = curv < 0
    interior = jnp.clip(jnp.where(concave, -r_i / jnp.where(concave, curv, -1.0), 0.0), lo, hi)

    def gain(s):
        return 2.0 * s * r_i + s * s * curv

    cands = jnp.stack([jnp.zeros((), dtype), lo, hi, interior])
    gains = gain(cands)
    s = cands[jnp.argmax(gains)]
    x_new = jnp.maximum((1.0 - s) * x, 0.0)
    # At the lower end the vertex leaves the support: set it to exactly 0.
    xi_new = jnp.where((lo < 0) & (s <= lo), 0.0, jnp.maximum((1.0 - s) * xi + s, 0.0))
    x_new = x_new.at[i].set(xi_new)
    mx_new = (1.0 - s) * mx + s * row
    f_new = f + gain(s)
    return x_new, mx_new, f_new


def vertex_steps(payoff: DensePayoff, x: Array, mx: Array, err: Array, it: Array, *,
                 tol: float, max_iter: int, steps: int) -> tuple[Array, Array]:
    """Up to ``steps`` InImDyn vertex steps from ``(x, mx)`` with ``mx`` updated in O(n) per step.

    Stops early at the solvers' stopping rule (:func:`~cdsjax.core.solvers.loop.within_limits`).
    Returns the new point (``Mx`` drifts from the O(n) updates: recompute it) and ``it``.
    """
    valid = payoff.valid

    def cond(state):
        _, _, _, err, it, k = state
        return within_limits(err, it, tol, max_iter) & (k < steps)

    def body(state):
        x, mx, f, _, it, k = state
        i = jnp.argmax(infectivity(x, mx, valid))
        x, mx, f = vertex_step(payoff, x, mx, f, i)
        return x, mx, f, nash_error(x, mx, valid), it + 1, k + 1

    state = (x, mx, x @ mx, err, it, jnp.asarray(0, jnp.int32))
    x, _, _, _, it, _ = lax.while_loop(cond, body, state)
    return x, it


def exact_point(payoff: DensePayoff, x: Array) -> tuple[Array, Array, Array]:
    """``x`` clipped to the valid simplex, with :math:`Mx` and the Nash error recomputed exactly."""
    x = jnp.where(payoff.valid, jnp.maximum(x, 0.0), 0.0)
    x = x / jnp.sum(x)
    mx = payoff.matvec(x)
    return x, mx, nash_error(x, mx, payoff.valid)


@struct.dataclass
class InImDyn(LoopSolver):
    r"""Infection--immunization dynamics, a solver for :func:`cdsjax.core.solvers.loop.iterate`.

    One step of the loop is up to ``refresh`` O(N) vertex steps followed by an exact
    recomputation of :math:`Mx` and the Nash error; ``num_iters`` counts vertex steps.

    Attributes:
      tol: Nash-error tolerance; None picks :func:`default_tol` of the dtype.
      max_iter: maximum number of vertex steps.
      refresh: vertex steps between exact recomputations; None uses ``max(N, 16)``.
    """

    tol: Optional[float] = struct.field(pytree_node=False, default=None)
    max_iter: int = struct.field(pytree_node=False, default=DEFAULT_MAX_ITER)
    refresh: Optional[int] = struct.field(pytree_node=False, default=None)
    unroll: int = struct.field(pytree_node=False, default=1)

    name = "inimdyn"

    def tolerance(self, dtype) -> float:
        return default_tol(dtype) if self.tol is None else self.tol

    def prepare(self, payoff: DensePayoff) -> int:
        refresh = max(payoff.size, 16) if self.refresh is None else self.refresh
        return check_count("refresh", refresh, 1)

    def init(self, payoff: DensePayoff, x0: Optional[Array]) -> LoopState:
        x, mx, err = exact_point(payoff, prepare_x0(x0, payoff.valid, payoff.dtype))
        return start_state(x, err, mx)

    def terminate(self, consts, state: LoopState) -> tuple[Array, Array]:
        return stop_rule(state, self.tolerance(state.x.dtype), self.max_iter)

    def step(self, payoff: DensePayoff, refresh: int, state: LoopState) -> LoopState:
        x, it = vertex_steps(payoff, state.x, state.aux, state.err, state.num_iters,
                             tol=self.tolerance(payoff.dtype), max_iter=self.max_iter, steps=refresh)
        x, mx, err = exact_point(payoff, x)
        return state.replace(x=x, err=err, num_iters=it, aux=mx)


def solve_inimdyn(
    affinity: Affinity,
    x0: Optional[Array] = None,
    *,
    tol: Optional[float] = None,
    max_iter: int = DEFAULT_MAX_ITER,
    refresh: Optional[int] = None,
) -> SolverResult:
    r"""Maximises :math:`x^\top M x` on the simplex with infection--immunization dynamics.

    Converged mode: runs until the Nash error (KKT residual) is below ``tol``.
    Each step is O(N); :math:`Mx` is recomputed exactly every ``refresh`` steps.
    Works for payoffs of any sign, with trailing padding (padded vertices start
    and stay at 0), and under ``jax.vmap``.

    Args:
      affinity: the problem's :class:`Affinity`; the payoff is
        :math:`M = A - \alpha I_{\bar S}`.
      x0: optional ``[m+n]`` initial point (masked and renormalised); uniform over
        valid vertices if None.
      tol: Nash-error tolerance; None picks :func:`default_tol` of the dtype
        (1e-10 in float64, 1e-5 in float32).
      max_iter: maximum number of vertex steps.
      refresh: steps between exact recomputations of :math:`Mx`; None uses ``N``
        (at most 2x the cost of the O(N) steps).

    Returns:
      :class:`SolverResult`; ``step`` is the Nash error at the last exact check,
      ``converged`` whether it fell below ``tol`` before ``max_iter`` steps.
    """
    return iterate(InImDyn(tol=tol, max_iter=max_iter, refresh=refresh), DensePayoff.from_affinity(affinity), x0)
