r"""The one loop every iterative solver of :math:`\max_{x\in\Delta} x^\top M x` runs.

A solver is a small frozen configuration (static ``tol`` / ``max_iter`` and its own
knobs) with three methods:

* ``init(payoff, x0) -> LoopState``: the start, with its stopping quantity ``err``;
* ``step(payoff, consts, state) -> LoopState``: one step of its rule (which may
  count several iterations, e.g. a run of vertex steps);
* ``proceed(consts, state) -> bool or None``: a limit of its own besides ``tol`` and
  ``max_iter`` (the active set's Newton cap); None when it has none.

``consts = solver.prepare(payoff)`` holds what a step needs but never changes.
:func:`iterate` runs them under one ``lax.while_loop`` whose stopping rule,
:func:`within_limits`, is the only place ``tol`` and ``max_iter`` are checked, and
returns a :class:`~cdsjax.core.SolverResult` whose ``status`` says how it ended.
The payoff is reached only through :mod:`cdsjax.core.payoff`'s methods, so a
batched payoff (:class:`~cdsjax.core.payoff.SharedPayoff`) runs through the same
loop: each batch row keeps its own stopping rule and is frozen once it stops.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.types import CONVERGED, MAX_STEPS, NONFINITE, SINGULAR, SUPPORT_THRESHOLD, SolverResult


@struct.dataclass
class LoopState:
    """The carry of :func:`iterate` (leaves with the payoff's batch axes in front).

    Attributes:
      x: ``[..., N]`` the current point on the simplex.
      err: ``[...]`` the stopping quantity (an L1 step, or the Nash error).
      num_iters: ``[...]`` int32 iterations so far.
      singular: ``[...]`` bool, a linear system of a step was singular.
      aux: the solver's own carry (e.g. :math:`Mx`), a pytree.
    """

    x: Array
    err: Array
    num_iters: Array
    singular: Array
    aux: Any = ()


def start_state(x: Array, err: Array, aux: Any = ()) -> LoopState:
    """A :class:`LoopState` at iteration 0 for a point ``x`` ``[..., N]``."""
    batch = x.shape[:-1]
    return LoopState(x=x, err=err, num_iters=jnp.zeros(batch, jnp.int32), singular=jnp.zeros(batch, bool),
                     aux=aux)


def within_limits(err: Array, num_iters: Array, tol: float, max_iter: int) -> Array:
    """The stopping rule of every solver: keep going while ``err >= tol`` and ``num_iters < max_iter``.

    False on a NaN ``err`` as well, so a non-finite point stops the loop.
    """
    return (err >= tol) & (num_iters < max_iter)


def check_count(name: str, value, minimum: int = 0) -> int:
    """Raises ``ValueError`` naming ``name`` unless ``value`` is an ``int >= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "non-negative" if minimum == 0 else "positive"
        raise ValueError(f"{name} must be a {kind} integer, got {value!r}")
    return value


def nash_error(x: Array, mx: Array, valid: Array, value: Optional[Array] = None) -> Array:
    r"""KKT residual (Nash error) :math:`\max_i |\min(x_i, -r_i)|`, :math:`r = Mx - (x^\top Mx)\mathbf 1`.

    Zero exactly at a KKT point of :math:`\max_{x\in\Delta} x^\top M x`; padding is ignored.

    Args:
      x: ``[..., N]`` point.
      mx: ``[..., N]`` :math:`Mx`.
      valid: ``[N]`` bool, True on real vertices.
      value: optional :math:`x^\top Mx` (broadcastable against ``mx``); computed as
        ``x @ mx`` when None.

    Returns:
      ``[...]`` the residual.
    """
    r = mx - (x @ mx if value is None else value)
    return jnp.max(jnp.where(valid, jnp.abs(jnp.minimum(x, -r)), 0.0), axis=-1)


def support_size(x: Array, valid: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    """``[...]`` int32 number of valid vertices with ``x_i > threshold``."""
    return jnp.sum(valid & (x > threshold), axis=-1).astype(jnp.int32)


def status_code(err: Array, tol: float, x: Array, singular: Array) -> Array:
    """``[...]`` int32 status: converged, else non-finite, else singular, else a step cap."""
    finite = jnp.isfinite(err) & jnp.all(jnp.isfinite(x), axis=-1)
    code = jnp.where(singular, SINGULAR, MAX_STEPS)
    code = jnp.where(finite, code, NONFINITE)
    return jnp.where(err < tol, CONVERGED, code).astype(jnp.int32)


def finish(payoff, x: Array, num_iters, err, tol: float, singular=False) -> SolverResult:
    """Packs a point of ``payoff`` and its diagnostics into a :class:`SolverResult`."""
    batch = x.shape[:-1]
    mx = payoff.matvec(x)
    value = payoff.value(x, mx)
    converged = err < tol
    return SolverResult(
        x=x,
        num_iters=jnp.asarray(num_iters, jnp.int32),
        converged=jnp.asarray(converged, bool),
        step=jnp.asarray(err, x.dtype),
        objective=jnp.reshape(value, batch),
        kkt_residual=nash_error(x, mx, payoff.valid, value),
        support_size=support_size(x, payoff.valid),
        alpha=jnp.broadcast_to(payoff.alpha, batch).astype(x.dtype),
        status=status_code(err, tol, x, jnp.broadcast_to(jnp.asarray(singular), batch)),
    )


def _keep(active: Array, new, old):
    """``new`` where ``active`` (batch axes in front), ``old`` elsewhere, leaf by leaf."""

    def pick(a, b):
        mask = active.reshape(active.shape + (1,) * (a.ndim - active.ndim))
        return jnp.where(mask, a, b)

    return jax.tree.map(pick, new, old)


def iterate(solver, payoff, x0: Optional[Array] = None) -> SolverResult:
    """Runs ``solver`` on ``payoff`` from ``x0`` (None: uniform) to its stopping rule.

    ``solver.unroll`` steps run per loop trip (a speed knob): each is masked once the
    stopping rule has fired, so the iterates and the step count are exactly those of
    one step per trip.

    Returns:
      :class:`~cdsjax.core.SolverResult` (leaves with the payoff's batch axes).
    """
    tol = solver.tolerance(payoff.dtype)
    max_iter = check_count("max_iter", solver.max_iter)
    unroll = check_count("unroll", solver.unroll, 1)
    consts = solver.prepare(payoff)

    def running(state):
        keep = within_limits(state.err, state.num_iters, tol, max_iter)
        extra = solver.proceed(consts, state)
        return keep if extra is None else keep & extra

    def body(state):
        for _ in range(unroll):
            state = _keep(running(state), solver.step(payoff, consts, state), state)
        return state

    state = lax.while_loop(lambda s: jnp.any(running(s)), body, solver.init(payoff, x0))
    return finish(payoff, state.x, state.num_iters, state.err, tol, state.singular)
