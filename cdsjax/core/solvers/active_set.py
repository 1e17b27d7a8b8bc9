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
2. Up to ``inner_steps`` InImDyn vertex steps (:mod:`cdsjax.core.solvers.inimdyn`), which
   bring in infective vertices from outside :math:`S` and drop dying ones at O(N)
   per step.

It stops on the Nash error (the KKT residual) like InImDyn. Each Newton step
costs one dense ``(N+1)``-square solve, O(N^3); the number of outer iterations is
small when the support is found early (one or two on the CDS payoff from the
uniform start).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from cdsjax.core.solvers.inimdyn import DEFAULT_MAX_ITER, default_tol, exact_point, vertex_steps
from cdsjax.core.games.payoff import DensePayoff, prepare_x0
from cdsjax.core.solvers.loop import LoopSolver, LoopState, check_count, iterate, nash_error, start_state, stop_rule
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


def gathered_face(payoff, support: Array, capacity: int, padded: Optional[Array] = None
                  ) -> tuple[Array, Array, Array]:
    """``(real, safe, block)``: the support's indices in ``capacity`` slots (``safe``, 0 past the support, where
    ``real`` is False) and the ``[K, K]`` payoff on them (:meth:`Payoff.submatrix`, zero off real slots).

    ``padded``: the payoff's ``[N+1, N+1]`` matrix with a zero last row and column (``payoff.padded()``, built once
    per solve: :func:`padded_matrix`); the block is then one gather from it, the same values bit for bit, where
    the payoff's own ``submatrix`` masks every entry as it gathers it."""
    size = support.shape[0]
    if padded is not None:
        idx = compact_indices(support, capacity)
        # unsigned indices: no negative-index wrap computed for each of the K² entries
        rows = idx.astype(jnp.uint32)
        block = padded.at[rows[:, None], rows[None, :]].get(mode="promise_in_bounds")
        real = idx < size
        return real, jnp.where(real, idx, 0), block
    idx = jnp.nonzero(support, size=capacity, fill_value=size)[0]
    real = idx < size
    safe = jnp.where(real, idx, 0)
    block = payoff.submatrix(safe)
    return real, safe, jnp.where(real[:, None] & real[None, :], block, 0.0)


def compact_indices(mask: Array, capacity: int) -> Array:
    """``[capacity]`` int32: the positions of ``mask``'s True entries in order, then ``mask``'s size (what
    ``jnp.nonzero(mask, size=capacity, fill_value=size)`` gives), by one scatter of the entries' ranks."""
    size = mask.shape[0]
    rank = jnp.cumsum(mask.astype(jnp.int32)) - 1
    slot = jnp.where(mask, rank, capacity)
    return jnp.full((capacity,), size, jnp.int32).at[slot].set(jnp.arange(size, dtype=jnp.int32), mode="drop")


def padded_matrix(payoff) -> Optional[Array]:
    """``payoff.padded()`` (its ``[N+1, N+1]`` matrix with a zero last row and column, :func:`gathered_face`'s
    source) for a payoff of one problem that has it; None otherwise (a payoff of the caller's own: its
    ``submatrix`` is gathered)."""
    padded = getattr(payoff, "padded", None)
    return padded() if callable(padded) and not payoff.batch else None


def bordered_direction(block: Array, real: Array, g: Array) -> Array:
    r"""``[K]`` the correction :math:`d` on the slots: :math:`M_{SS} d - \mu \mathbf 1 = -g`, :math:`\mathbf 1^\top d
    = 0` as one bordered ``[K+1, K+1]`` LU solve; slots past the support (``real`` False) read :math:`d_i = 0`."""
    k = block.shape[0]
    dtype = block.dtype
    ones = real.astype(dtype)
    system = jnp.zeros((k + 1, k + 1), dtype)
    system = system.at[:k, :k].set(block + jnp.diag(1.0 - ones))
    system = system.at[:k, k].set(-ones)
    system = system.at[k, :k].set(ones)
    rhs = jnp.concatenate([jnp.where(real, -g, 0.0), jnp.zeros((1,), dtype)])
    return jnp.linalg.solve(system, rhs)[:k]


def gathered_direction(payoff, x: Array, mx: Array, support: Array, capacity: int) -> Array:
    r"""The direction of :func:`newton_direction` from a ``[K+1, K+1]`` system on the support alone.

    The support's indices are gathered into ``capacity`` slots (K), the payoff on them read
    (:func:`gathered_face`) and the bordered system solved at O(K³) instead of O(N³). Slots past
    the support read :math:`d_i = 0`. The caller makes sure the support fits (``sum(support) <= K``).
    """
    real, safe, block = gathered_face(payoff, support, capacity)
    step = bordered_direction(block, real, mx[safe])
    return jnp.zeros(x.shape, x.dtype).at[safe].add(jnp.where(real, step, 0.0))


def dense_rows(payoff) -> Array:
    """``[N, N]`` the payoff of one problem assembled from its rows (:meth:`Payoff.row`).

    The face's Newton system is dense whatever the payoff's storage; reading it row by row keeps
    the solver off the payoff's internals (a shared corpus builds one question's rows on demand).
    """
    return jax.vmap(payoff.row)(jnp.arange(payoff.size))


def capacities(gather, size: int) -> tuple:
    """The gathered systems' sizes below ``size``, ascending (``gather`` an int, a tuple of ints or None)."""
    if gather is None:
        return ()
    caps = (gather,) if isinstance(gather, int) else tuple(gather)
    for c in caps:
        check_count("gather", c, 1)
    return tuple(sorted({c for c in caps if c < size}))


def newton_step(payoff, x: Array, mx: Array, valid: Array, capacity=None) -> tuple[Array, Array, Array]:
    """One Newton step on the support of ``x`` with ratio test and exact line search.

    ``payoff`` is a :class:`~cdsjax.core.protocols.Payoff` of one problem (or its ``[N, N]`` matrix).
    ``capacity`` K (below N; or several sizes, the smallest that holds the support is used) solves the face's
    system on the gathered support (:func:`gathered_direction`, O(K³ + KN)) when the support fits, the dense
    one otherwise.

    Returns:
      ``(x, gain, singular)``: the new point (``x`` itself when the step fails or
      gains nothing), the objective gain (0 then) and whether the face's system was
      singular (its direction non-finite).
    """
    payoff = DensePayoff.of(payoff)
    support = valid & (x > 0)
    caps = capacities(capacity, x.shape[0])
    if not caps:
        return line_step(payoff, x, mx, valid, newton_direction(dense_rows(payoff), x, mx, support))
    count = jnp.sum(support).astype(jnp.int32)
    which = jnp.searchsorted(jnp.asarray(caps, jnp.int32), count, side="left")
    branches = [lambda c=c: gathered_direction(payoff, x, mx, support, c) for c in caps]
    branches.append(lambda: newton_direction(dense_rows(payoff), x, mx, support))
    return line_step(payoff, x, mx, valid, lax.switch(which, branches))


def line_step(payoff, x: Array, mx: Array, valid: Array, d: Array) -> tuple[Array, Array, Array]:
    """The step of :func:`newton_step` along direction ``d``: ratio test, exact line search, renormalised."""
    dtype = x.dtype
    support = valid & (x > 0)
    ok = jnp.all(jnp.isfinite(d))
    d = jnp.where(ok & support, d, 0.0)
    shrinking = d < 0
    ratios = jnp.where(shrinking, x / jnp.where(shrinking, -d, 1.0), jnp.inf)
    block_at = jnp.argmin(ratios)
    t_max = ratios[block_at]
    t_max = jnp.where(jnp.isfinite(t_max), t_max, 0.0)
    slope = d @ mx
    curv = d @ payoff.matvec(d)
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
    return x_new, gains[best], ~ok


@struct.dataclass
class ActiveSet(LoopSolver):
    r"""Active-set Newton on the support, a solver for :func:`cdsjax.core.solvers.loop.iterate`.

    One step of the loop is a Newton step on the current support followed by up to
    ``inner_steps`` InImDyn vertex steps; ``num_iters`` counts both. Runs on any
    payoff of one problem (the face's system is assembled from :meth:`Payoff.row`).
    It stops, besides ``tol`` and ``max_iter``, after ``max_newton`` Newton steps; a run
    stopped short whose Newton systems were ever singular ends :data:`SINGULAR`.

    Attributes:
      tol: Nash-error tolerance; None picks the dtype's default
        (:func:`cdsjax.core.solvers.inimdyn.default_tol`).
      max_iter: maximum number of steps, Newton and vertex steps together.
      inner_steps: vertex steps between Newton steps; None uses ``N``.
      max_newton: maximum number of Newton steps; None uses ``N``.
      gather: K, solve the face's Newton system on the support gathered into K slots when it fits
        (O(K³ + KN) instead of O(N³)); a tuple of sizes uses the smallest that fits; None solves the dense
        ``[N+1, N+1]`` system.
      vertex_first: True starts with the vertex steps alone, the first Newton step after them: from the
        uniform start every vertex is in the support, and the whole face's O(N³) system gains little
        there (the vertex steps shrink the support first, O(N) each). False (the default) starts with
        a Newton step.
    """

    tol: Optional[float] = struct.field(pytree_node=False, default=None)
    max_iter: int = struct.field(pytree_node=False, default=DEFAULT_MAX_ITER)
    inner_steps: Optional[int] = struct.field(pytree_node=False, default=None)
    max_newton: Optional[int] = struct.field(pytree_node=False, default=None)
    unroll: int = struct.field(pytree_node=False, default=1)
    gather: Optional[int | tuple] = struct.field(pytree_node=False, default=None)
    vertex_first: bool = struct.field(pytree_node=False, default=False)

    name = "active_set"

    def tolerance(self, dtype) -> float:
        return default_tol(dtype) if self.tol is None else self.tol

    def prepare(self, payoff: DensePayoff) -> tuple[int, int]:
        size = payoff.size
        inner = size if self.inner_steps is None else self.inner_steps
        newton = size if self.max_newton is None else self.max_newton
        return check_count("inner_steps", inner), check_count("max_newton", newton)

    def init(self, payoff: DensePayoff, x0: Optional[Array]) -> LoopState:
        x = prepare_x0(x0, payoff.valid, payoff.dtype)
        mx = payoff.matvec(x)
        return start_state(x, nash_error(x, mx, payoff.valid), (mx, jnp.asarray(0, jnp.int32), jnp.asarray(False)))

    def terminate(self, consts: tuple[int, int], state: LoopState) -> tuple[Array, Array]:
        _, newton, singular = state.aux
        return stop_rule(state, self.tolerance(state.x.dtype), self.max_iter, capped=newton >= consts[1],
                         singular=singular)

    def step(self, payoff: DensePayoff, consts: tuple[int, int], state: LoopState) -> LoopState:
        inner_steps, _ = consts
        mx, newton, was_singular = state.aux
        valid = payoff.valid
        if self.vertex_first:
            x, _, singular = lax.cond(newton > 0, lambda: newton_step(payoff, state.x, mx, valid, self.gather),
                                      lambda: (state.x, jnp.zeros((), state.x.dtype), jnp.asarray(False)))
        else:
            x, _, singular = newton_step(payoff, state.x, mx, valid, self.gather)
        mx = payoff.matvec(x)
        err = nash_error(x, mx, valid)
        x, it = vertex_steps(payoff, x, mx, err, state.num_iters + 1, tol=self.tolerance(payoff.dtype),
                             max_iter=self.max_iter, steps=inner_steps)
        x, mx, err = exact_point(payoff, x)
        return state.replace(x=x, err=err, num_iters=it, aux=(mx, newton + 1, was_singular | singular))


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
        1e-5 in float32; see :func:`cdsjax.core.solvers.inimdyn.default_tol`).
      max_iter: maximum number of steps, Newton and vertex steps together.
      inner_steps: vertex steps between Newton steps; None uses ``N``.
      max_newton: maximum number of Newton steps; None uses ``N`` (each removes a
        blocking vertex or solves a face, so more are never needed in practice).

    Returns:
      :class:`SolverResult`; ``num_iters`` counts Newton and vertex steps,
      ``step`` is the final Nash error.
    """
    solver = ActiveSet(tol=tol, max_iter=max_iter, inner_steps=inner_steps, max_newton=max_newton)
    return iterate(solver, DensePayoff.from_affinity(affinity), x0)
