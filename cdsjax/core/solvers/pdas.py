r"""Primal-dual active set: the equilibrium of a single-query CDS game in a few face solves.

The converged solvers reach the equilibrium by moving one vertex at a time (InImDyn) or one blocking
vertex per Newton step (:mod:`cdsjax.core.solvers.active_set`); from the uniform start on a corpus of ``n`` notes
that is about ``n`` sequential steps before the support is the equilibrium's, and each step of a
``lax.while_loop`` on a CPU costs microseconds of overhead whatever its arithmetic. The KKT conditions of
:math:`\max_{x\in\Delta} x^\top M x` are

.. math:: (Mx)_i = \lambda \ (x_i > 0), \qquad (Mx)_i \le \lambda \ (x_i = 0),

and on a guessed support :math:`S` the first half is one linear system (the face's stationary point).
The primal-dual active-set rule (as for bound-constrained quadratic programs) then changes the guess by
whole sets: vertices of :math:`S` whose weight came out negative leave it, vertices outside whose payoff
beats :math:`\lambda` join it, and the face is solved again. On the CDS payoff of a served corpus this
finds the equilibrium's support in 2-5 face solves from a guess of the most relevant quarter of the
notes, where the vertex steps took about ``n``.

Each face is solved in correction form from the current point (so a repeated solve on the same support
refines it, as the active set's Newton step does), gathered into the smallest of ``capacities`` that
holds it:

* up to :data:`LU_ALWAYS` slots by LU of the bordered ``[K+1, K+1]`` system (any payoff);
* above, by conjugate gradients, and where they do not converge in :data:`CG_MAX_ITER` products by the LU
  up to ``lu_max`` slots (past it the run fails). CG needs the CDS structure: the query vertex first with a zero
  diagonal, and the note block :math:`W - \alpha I` negative definite (:math:`\alpha` at or above the
  spectral bound). With :math:`A_S = \alpha I - W_{SS}` the query eliminates,
  :math:`d_y = d_0 A_S^{-1} r_S - \mu A_S^{-1}\mathbf 1 + A_S^{-1} g_y`, and two scalar equations give
  :math:`d_0, \mu`. :math:`A_S` is a principal block of a positive definite matrix whose Perron
  direction the face mostly misses, so CG converges in about ten products of the ``[K, K]`` block
  (condition number 1.5-1.7 measured on the default game's faces), instead of an O(K³) factorisation.

It is a rule, not a descent method: it can cycle or leave the simplex on other payoffs. A run that does
not reach the Nash-error tolerance within ``max_iter`` face solves (or whose support outgrows the largest
capacity, or whose CG solve does not converge) ends unconverged. The serving solver
(:data:`cdsjax.core.solvers.options.SERVING_SOLVER`) is ``WithFallback(PrimalDualActiveSet(), ActiveSet(...))``: the rule
and, where it ends unconverged, a monotone solver (the active set from the uniform start). A converged run is a
KKT point to the same tolerance as every converged solve.
"""

from __future__ import annotations

import math
from typing import Optional

import jax.numpy as jnp
from flax import struct
from jax import Array, lax
from jax.scipy.sparse.linalg import cg

from cdsjax.core.solvers.active_set import bordered_direction, gathered_face, padded_matrix
from cdsjax.core.solvers.inimdyn import default_tol
from cdsjax.core.solvers.loop import LoopSolver, LoopState, check_count, nash_error, start_state, stop_rule

# Faces gathered into these many slots, the smallest that holds the support: LU up to LU_ALWAYS slots; above, CG,
# and LU where CG does not converge up to LU_MAX slots. Each size is compiled (about 0.4 s each, measured); a
# face padded to c slots costs a gather and CG products of c x c, and a served face is memory-bound (the default
# game's supports hold half to all of a corpus's notes), so the sizes step by at most 1.5x: past 128 slots a face
# is never padded to more than 1.5 times its support (experiments/bench_latency.py measures the served latency).
CAPACITIES = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
LU_ALWAYS = 128
LU_MAX = 1024
CG_MAX_ITER = 30
CG_TOL = 1e-6
CG_ACCEPT = 1e-4  # a CG solve whose relative residual stays above this fails the run
# The serving solver's fallback's gathered Newton systems' sizes (ActiveSet.gather): the smallest that holds the
# support is solved.
BLOCK_CAPACITIES = (64, 128, 256, 512, 1024, 2048, 4096)


def most_relevant(payoff, notes: Array, k: Array, most: Optional[int] = None) -> Array:
    """``[N]`` bool: the query vertex and the ``k`` notes of ``notes`` (``[N]`` bool) with the largest query edges
    (row 0 of the payoff), ties at the cut all kept. ``most``: a static bound on ``k`` (the cut is then the
    ``k``-th of a top-``most``, the same value as in a sort of every edge)."""
    rel = jnp.where(notes, payoff.row(jnp.asarray(0)), -jnp.inf)
    most = payoff.size if most is None else min(int(most), payoff.size)
    largest = jnp.sort(rel)[::-1] if most == payoff.size else lax.top_k(rel, most)[0]
    cut = largest[jnp.clip(k, 1, most) - 1]
    return (notes & (rel >= cut)) | (jnp.arange(payoff.size) == 0)


def relevance_guess(payoff, fraction: float) -> Array:
    r"""``[N]`` the start: uniform on the query vertex and the ``fraction`` of valid notes with the largest
    query edge, ties at the cut all kept."""
    notes = payoff.valid & (jnp.arange(payoff.size) > 0)
    k = jnp.ceil(fraction * jnp.sum(notes)).astype(jnp.int32)  # at most fraction * (N - 1), rounded up
    start = most_relevant(payoff, notes, k, math.ceil(fraction * (payoff.size - 1)) + 1) & payoff.valid
    return start.astype(payoff.dtype) / jnp.sum(start)


def top_half(payoff, support: Array) -> Array:
    """``[N]`` bool: the query vertex and the half of ``support``'s notes with the largest query edges."""
    notes = support & (jnp.arange(payoff.size) > 0)
    return most_relevant(payoff, notes, (jnp.sum(notes) + 1) // 2, payoff.size // 2 + 1)


def _lu_direction(block: Array, real: Array, g: Array) -> tuple[Array, Array]:
    d = bordered_direction(block, real, g)
    return d, jnp.all(jnp.isfinite(d))


def _cg_direction(block: Array, real: Array, g: Array) -> tuple[Array, Array]:
    """The same correction by CG on :math:`A_S = -M_{S'S'}` (module docstring); needs the query in slot 0."""
    dtype = block.dtype
    notes = real[1:]
    a_block = -block[1:, 1:] + jnp.diag(jnp.where(notes, 0.0, 1.0).astype(dtype))
    rel = jnp.where(notes, block[1:, 0], 0.0)
    gy = jnp.where(notes, g[1:], 0.0)
    rhs = jnp.stack([rel, notes.astype(dtype), gy], axis=1)
    sol, _ = cg(lambda v: a_block @ v, rhs, tol=CG_TOL, maxiter=CG_MAX_ITER)
    resid = jnp.linalg.norm(a_block @ sol - rhs) / jnp.maximum(jnp.linalg.norm(rhs), jnp.finfo(dtype).tiny)
    u, v, w = sol[:, 0], sol[:, 1], sol[:, 2]
    # d0 (r'u) - mu (r'v + 1) = -g0 - r'w ;  d0 (1 + 1'u) - mu (1'v) = -1'w
    lhs = jnp.array([[rel @ u, -(rel @ v + 1.0)], [1.0 + jnp.sum(u), -jnp.sum(v)]], dtype)
    d0, mu = jnp.linalg.solve(lhs, jnp.stack([-g[0] - rel @ w, -jnp.sum(w)]))
    dy = jnp.where(notes, d0 * u - mu * v + w, 0.0)
    d = jnp.concatenate([d0[None], dy])
    ok = jnp.all(jnp.isfinite(d)) & (resid <= CG_ACCEPT) & real[0]
    return d, ok


def face_point(payoff, x: Array, support: Array, capacity: int, lu_max: int = LU_MAX,
               padded: Optional[Array] = None) -> tuple[Array, Array]:
    r"""The stationary point of the face spanned by ``support`` (``[N]`` bool, at most ``capacity`` vertices),
    by a correction from ``x`` restricted to it (uniform on it where ``x`` has no weight there). ``padded``: the
    payoff's padded matrix the face is gathered from (:func:`~cdsjax.core.solvers.active_set.gathered_face`).

    Returns ``(x_face, ok)``: ``[N]`` zero off the support, summing to 1, possibly with negative entries (the
    face's stationary point need not lie in the simplex); ``ok`` False where the solve failed.
    """
    size = x.shape[0]
    dtype = x.dtype
    real, safe, block = gathered_face(payoff, support, capacity, padded)
    xs = jnp.where(real, x[safe], 0.0)
    mass = jnp.sum(xs)
    xs = jnp.where(mass > 0, xs / jnp.where(mass > 0, mass, 1.0), real.astype(dtype) / jnp.sum(real))
    g = block @ xs
    if capacity <= LU_ALWAYS:
        d, ok = _lu_direction(block, real, g)
    else:
        d, ok = _cg_direction(block, real, g)
        if capacity <= lu_max:  # CG did not converge (an ill-conditioned face, another game): LU
            d, ok = lax.cond(ok, lambda: (d, ok), lambda: _lu_direction(block, real, g))
    x_face = jnp.zeros((size,), dtype).at[safe].add(jnp.where(real, xs + d, 0.0))
    return x_face, ok


@struct.dataclass
class PrimalDualActiveSet(LoopSolver):
    r"""Primal-dual active set on the KKT conditions (module docstring), a solver for
    :func:`cdsjax.core.solvers.loop.iterate` on one problem's payoff with the query vertex first.

    One step is one face solve and one product with the payoff; ``num_iters`` counts face solves.
    ``err`` is the Nash error of the face's point where it lies in the simplex, infinite where it does not
    (the next support drops its negative vertices), NaN where the solve failed or the support outgrew the
    largest capacity (the run then stops, not converged).

    Attributes:
      tol: Nash-error tolerance; None picks the dtype's default (:func:`cdsjax.core.solvers.inimdyn.default_tol`).
      max_iter: maximum number of face solves.
      fraction: share of the notes in the start's support (those with the largest query edges), used
        when no start is given.
      capacities: the gathered faces' sizes.
      lu_max: the largest capacity where LU takes over from CG when CG does not converge (0: CG only above
        :data:`LU_ALWAYS`).
    """

    tol: Optional[float] = struct.field(pytree_node=False, default=None)
    max_iter: int = struct.field(pytree_node=False, default=24)
    fraction: float = struct.field(pytree_node=False, default=0.25)
    capacities: tuple = struct.field(pytree_node=False, default=CAPACITIES)
    lu_max: int = struct.field(pytree_node=False, default=LU_MAX)
    unroll: int = struct.field(pytree_node=False, default=1)

    name = "pdas"

    def tolerance(self, dtype) -> float:
        return default_tol(dtype) if self.tol is None else self.tol

    def prepare(self, payoff) -> tuple:
        """``(sizes, padded)``: the faces' capacities (:meth:`face_sizes`) and the payoff's padded matrix every face
        is gathered from (:func:`~cdsjax.core.solvers.active_set.padded_matrix`, built once per solve; None for a
        payoff without one)."""
        return self.face_sizes(payoff), padded_matrix(payoff)

    def face_sizes(self, payoff) -> tuple:
        """The capacities the faces of ``payoff`` are gathered into, ascending: those below its size, then its
        size where the largest capacity reaches it."""
        if payoff.batch:
            raise ValueError("PrimalDualActiveSet solves one problem at a time (vmap it over a batch)")
        for c in self.capacities:
            check_count("capacities", c, 1)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction!r}")
        # the sizes below the problem's, then the problem's own (a face of every vertex) where the largest
        # capacity would have reached it
        below = sorted({c for c in self.capacities if c < payoff.size})
        return tuple(below + [payoff.size]) if max(self.capacities) >= payoff.size else tuple(below)

    def init(self, payoff, x0: Optional[Array]) -> LoopState:
        x = relevance_guess(payoff, self.fraction) if x0 is None else jnp.asarray(x0, payoff.dtype)
        support = payoff.valid & ((x > 0) | (jnp.arange(payoff.size) == 0))
        return start_state(x, jnp.asarray(jnp.inf, payoff.dtype), support)

    def terminate(self, consts, state: LoopState) -> tuple[Array, Array]:
        return stop_rule(state, self.tolerance(state.x.dtype), self.max_iter)

    def step(self, payoff, consts: tuple, state: LoopState) -> LoopState:
        caps, padded = consts
        support = state.aux
        valid = payoff.valid
        count = jnp.sum(support).astype(jnp.int32)
        which = jnp.searchsorted(jnp.asarray(caps, jnp.int32), count, side="left")
        branches = [lambda c=c: face_point(payoff, state.x, support, c, self.lu_max, padded) for c in caps]
        branches.append(lambda: (jnp.full_like(state.x, jnp.nan), jnp.asarray(False)))
        face, ok = lax.switch(which, branches)
        # the face's point clipped to the simplex (itself where it lies there): its Nash error, and the
        # vertices outside the support whose payoff beats its value join
        kept = jnp.where(valid, jnp.maximum(face, 0.0), 0.0)
        mass = jnp.sum(kept)
        x = kept / jnp.where(mass > 0, mass, 1.0)
        mx = payoff.matvec(x)
        value = x @ mx
        inside = jnp.all(jnp.where(valid, face >= 0.0, True))
        err = jnp.where(inside, nash_error(x, mx, valid, value), jnp.inf).astype(x.dtype)
        err = jnp.where(ok & (mass > 0) & jnp.all(jnp.isfinite(mx)), err, jnp.nan)
        query = jnp.arange(payoff.size) == 0
        # drop first: an infeasible face loses its negative vertices; a feasible one gains every vertex whose
        # payoff beats its value
        gains = valid & ~support & (mx > value) & inside
        new_support = valid & ((support & (face > 0)) | gains | query)
        # a face whose point gives the query no weight holds notes the query cannot carry (less relevant than
        # the equilibrium's threshold): keep the more relevant half of its notes and solve again
        dropped = face[0] <= 0
        new_support = lax.cond(dropped, lambda: top_half(payoff, support), lambda: new_support)
        err = jnp.where(dropped & ~jnp.isnan(err), jnp.inf, err)
        x = jnp.where(ok & (mass > 0) & ~dropped, x, state.x)
        return state.replace(x=x, err=err, num_iters=state.num_iters + 1, aux=new_support)
