r"""The one loop every iterative solver of :math:`\max_{x\in\Delta} x^\top M x` runs.

A loop solver (the :class:`~cdsjax.core.protocols.IterativeSolver` protocol) is a small frozen configuration (static
``tol`` / ``max_iter`` and its own knobs) with four methods:

* ``prepare(payoff) -> consts``: what a step needs but never changes;
* ``init(payoff, x0) -> LoopState``: the start, with its stopping quantity ``err``;
* ``step(payoff, consts, state) -> LoopState``: one step of its rule (which may
  count several iterations, e.g. a run of vertex steps);
* ``terminate(consts, state) -> (done, status)``: whether to stop and why, a
  :class:`~cdsjax.core.protocols.Status` code. :func:`stop_rule` is the common part
  (``tol``, ``max_iter``, non-finite points); a solver adds its own reasons (the
  active set's Newton cap and singular systems).

:func:`iterate` runs them under one ``lax.while_loop`` that carries the status, so
how a solve ended is decided in the loop, and returns a
:class:`~cdsjax.core.SolverResult`. The payoff is reached only through the
:class:`~cdsjax.core.protocols.Payoff` methods, so a batched payoff
(:class:`~cdsjax.core.games.payoff.SharedPayoff`) runs through the same loop: each batch
row keeps its own stopping rule and is frozen once it stops.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.protocols import IterativeSolver, Payoff
from cdsjax.core.types import CONVERGED, MAX_STEPS, NONFINITE, SINGULAR, SUPPORT_THRESHOLD, SolverResult


@struct.dataclass
class LoopState:
    """The carry of :func:`iterate` (leaves with the payoff's batch axes in front).

    Attributes:
      x: ``[..., N]`` the current point on the simplex.
      err: ``[...]`` the stopping quantity (an L1 step, or the Nash error).
      num_iters: ``[...]`` int32 iterations so far.
      aux: the solver's own carry (e.g. :math:`Mx`), a pytree.
    """

    x: Array
    err: Array
    num_iters: Array
    aux: Any = ()


def start_state(x: Array, err: Array, aux: Any = ()) -> LoopState:
    """A :class:`LoopState` at iteration 0 for a point ``x`` ``[..., N]``."""
    batch = x.shape[:-1]
    return LoopState(x=x, err=err, num_iters=jnp.zeros(batch, jnp.int32), aux=aux)


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


def support_count(x: Array, mask: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    """``[...]`` int32 number of vertices in ``mask`` with ``x_i > threshold`` (``mask`` the free vertices:
    the notes of the support, the count a selection reports as ``support_size``)."""
    return jnp.sum(mask & (x > threshold), axis=-1).astype(jnp.int32)


def stop_rule(state: LoopState, tol: float, max_iter: int, *, capped: Optional[Array] = None,
              singular: Optional[Array] = None) -> tuple[Array, Array]:
    """The common ``terminate``: ``(done, status)`` of ``state`` under ``tol`` and ``max_iter``.

    Done when ``err < tol`` (:data:`CONVERGED`), when ``err`` is NaN (the point is then
    :data:`NONFINITE`), at ``max_iter`` steps, or where the solver's own cap says so (``capped``).
    A run stopped short of ``tol`` is :data:`NONFINITE` if its point or residual is not finite,
    else :data:`SINGULAR` where ``singular`` (a solver's linear system failed), else :data:`MAX_STEPS`.
    """
    err, x = state.err, state.x
    done = ~within_limits(err, state.num_iters, tol, max_iter)
    if capped is not None:
        done = done | capped
    finite = jnp.isfinite(err) & jnp.all(jnp.isfinite(x), axis=-1)
    code = jnp.full(err.shape, MAX_STEPS, jnp.int32) if singular is None else jnp.where(singular, SINGULAR, MAX_STEPS)
    code = jnp.where(finite, code, NONFINITE)
    return done, jnp.where(err < tol, CONVERGED, code).astype(jnp.int32)


def finish(payoff, x: Array, num_iters, err, status: Array, name: str) -> SolverResult:
    """Packs a point of ``payoff`` found by the solver ``name`` and its diagnostics into a :class:`SolverResult`."""
    batch = x.shape[:-1]
    mx = payoff.matvec(x)
    value = payoff.value(x, mx)
    return SolverResult(
        x=x,
        num_iters=jnp.asarray(num_iters, jnp.int32),
        step=jnp.asarray(err, x.dtype),
        objective=jnp.reshape(value, batch),
        kkt_residual=nash_error(x, mx, payoff.valid, value),
        alpha=jnp.broadcast_to(payoff.alpha, batch).astype(x.dtype),
        status=jnp.asarray(status, jnp.int32),
        ran=jnp.zeros(batch, jnp.int32),
        solvers=(name,),
    )


class LoopSolver:
    """What the solvers :func:`iterate` drives share: ``solve`` runs the loop, ``with_limits`` replaces ``tol`` /
    ``max_iter``; a subclass sets its ``name`` and its rule. A payoff with batch axes (the ``Shared`` strategy's
    questions) is solved one question at a time (:func:`each_question`): the active-set rules read one problem's
    submatrices; replicator dynamics override ``solve`` to run the whole batch in one loop."""

    name = "loop"

    def with_limits(self, tol: Optional[float] = None, max_iter: Optional[int] = None):
        """This solver with ``tol`` / ``max_iter`` replaced where given (None keeps its own)."""
        limits = {k: v for k, v in (("tol", tol), ("max_iter", max_iter)) if v is not None}
        return self.replace(**limits) if limits else self

    def solve(self, payoff: Payoff, x0: Optional[Array] = None) -> SolverResult:
        """:func:`iterate` of this solver on ``payoff`` from ``x0`` (None: the solver's own start), question by
        question on a batched payoff."""
        if payoff.batch:
            return each_question(self.solve, payoff, x0)
        return iterate(self, payoff, x0)


def each_question(solve, payoff: Payoff, x0: Optional[Array] = None) -> SolverResult:
    """``solve(payoff.question(i), x0[i])`` for each question ``i`` of a payoff with one batch axis, under
    ``lax.map`` (one at a time: a ``vmap`` would run every branch of a solver's ``lax.cond`` for the batch);
    the results stacked."""
    if len(payoff.batch) != 1:
        raise ValueError(f"a batched payoff has one batch axis (its questions), got batch {payoff.batch}")
    index = jnp.arange(payoff.batch[0])
    if x0 is None:
        return lax.map(lambda i: solve(payoff.question(i), None), index)
    return lax.map(lambda a: solve(payoff.question(a[0]), a[1]), (index, jnp.asarray(x0)))


def _keep(active: Array, new, old):
    """``new`` where ``active`` (batch axes in front), ``old`` elsewhere, leaf by leaf."""

    def pick(a, b):
        mask = active.reshape(active.shape + (1,) * (a.ndim - active.ndim))
        return jnp.where(mask, a, b)

    return jax.tree.map(pick, new, old)


def iterate(solver: IterativeSolver, payoff: Payoff, x0: Optional[Array] = None) -> SolverResult:
    """Runs ``solver`` on ``payoff`` from ``x0`` (None: uniform) until its ``terminate`` says done.

    The loop carries ``(state, done, status)``; ``solver.unroll`` steps run per loop
    trip (a speed knob): each is masked once its row is done, so the iterates, the step
    count and the status are exactly those of one step per trip.

    Returns:
      :class:`~cdsjax.core.SolverResult` (leaves with the payoff's batch axes).
    """
    check_count("max_iter", solver.max_iter)
    unroll = check_count("unroll", solver.unroll, 1)
    consts = solver.prepare(payoff)

    def body(carry):
        state, done, status = carry
        for _ in range(unroll):
            state = _keep(~done, solver.step(payoff, consts, state), state)
            done, status = solver.terminate(consts, state)
        return state, done, status

    state = solver.init(payoff, x0)
    state, _, status = lax.while_loop(lambda c: jnp.any(~c[1]), body, (state, *solver.terminate(consts, state)))
    return finish(payoff, state.x, state.num_iters, state.err, status, solver.name)
