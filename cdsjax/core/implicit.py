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
ordinary autodiff of :func:`cdsjax.core.games.affinity.build_affinity`, so every input
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
  :math:`\tau`-derivatives. Taking one under hard :math:`\tau` warns, and so does a
  derivative through a solve that did not converge (:mod:`cdsjax.core.derivative_checks`).

This module is the derivative's arithmetic (:func:`attach_implicit`); how to differentiate a solve is an
adjoint object (:mod:`cdsjax.core.adjoints`: :class:`~cdsjax.core.adjoints.ImplicitAdjoint` attaches this
derivative), and the one solve every strategy runs is :func:`cdsjax.core.equilibrium.equilibrium`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import Array

from cdsjax.core.types import SUPPORT_THRESHOLD, Affinity


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
