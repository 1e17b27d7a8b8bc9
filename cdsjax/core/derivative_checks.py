r"""Derivatives that say when they are meaningless: one warning line, raised while JAX differentiates.

* :func:`hard_tau` — :math:`\tau` as the hard gate reads it. Edges switch on and off at :math:`\tau`, so the
  derivative with respect to it is exactly 0 almost everywhere; a derivative taken with respect to it warns
  (``tau_mode="soft"`` gives a useful one).
* :func:`check_converged` — an equilibrium's point; a derivative taken through it warns when the solve did not
  converge (the implicit derivative is only right at a fixed point), and is NaN where the caller asks
  (``ImplicitAdjoint(nan_if_unconverged=True)``).

Both are identities on their values; the checks run only when a tangent flows through them, so a solve that is not
differentiated pays nothing. A warning is a :class:`DerivativeWarning` (a ``UserWarning``).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

HARD_TAU = ("derivative with respect to tau under tau_mode='hard' is exactly 0 (the gate switches edges on and "
            "off); use tau_mode='soft' to differentiate tau")
UNCONVERGED = ("derivative through an equilibrium whose solve did not converge: the implicit derivative is only "
               "right at a fixed point (raise max_iter, use a converged solver such as ActiveSet(), and check "
               "converged)")


class DerivativeWarning(UserWarning):
    """A derivative was taken where it means nothing (hard tau, an unconverged solve)."""


@jax.custom_jvp
def hard_tau(tau: Array) -> Array:
    """``tau`` unchanged; differentiating it warns (:data:`HARD_TAU`), once per trace."""
    return tau


@hard_tau.defjvp
def _hard_tau_jvp(primals, tangents):
    warnings.warn(HARD_TAU, DerivativeWarning, stacklevel=2)
    return primals[0], tangents[0]


def _warn_unconverged(converged) -> None:
    if not np.all(np.asarray(converged)):
        warnings.warn(UNCONVERGED, DerivativeWarning, stacklevel=2)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def check_converged(x: Array, converged: Array, nan_if_unconverged: bool = False) -> Array:
    """``x`` unchanged; a derivative through it warns at run time when ``converged`` (a bool ``[]`` array) is
    False (:data:`UNCONVERGED`), and its tangent is NaN there with ``nan_if_unconverged``."""
    return x


@check_converged.defjvp
def _check_converged_jvp(nan_if_unconverged, primals, tangents):
    x, converged = primals
    jax.debug.callback(_warn_unconverged, converged)
    dx = tangents[0]
    if nan_if_unconverged:  # a factor, not a select: the tangent stays linear, so reverse mode carries the NaN
        dx = dx * jnp.where(converged, 1.0, jnp.nan).astype(dx.dtype)
    return x, dx
