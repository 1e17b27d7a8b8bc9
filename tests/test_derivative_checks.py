"""Derivatives that say when they are meaningless: hard tau and unconverged solves warn, NaN on request;
retrieval_surrogates takes cds_equilibrium's keywords (adjoint= included); unit-norm inputs are checked."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.derivative_checks import DerivativeWarning
from cdsjax.core.surrogates import retrieval_surrogates


def _problem(n=8, d=6, seed=0):
    rng = np.random.default_rng(seed)
    notes = rng.normal(size=(n, d))
    notes /= np.linalg.norm(notes, axis=1, keepdims=True)
    q = rng.normal(size=(1, d))
    q /= np.linalg.norm(q)
    problem = core.CDSProblem(notes=jnp.asarray(notes, jnp.float32), queries=jnp.asarray(q, jnp.float32),
                              valid=jnp.ones(n, bool))
    return problem, jnp.zeros((1, n), bool).at[0, 2].set(True)


def _grad_tau(mode, **kwargs):
    problem, gold = _problem()

    def f(tau):
        params = core.CDSParams(beta=0.7, tau=tau, tau_mode=mode)
        return retrieval_surrogates(problem, gold, params, budget=3, **kwargs)["soft_recall"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = jax.block_until_ready(jax.jit(jax.grad(f))(0.2))
    return float(g), [w for w in caught if issubclass(w.category, DerivativeWarning)]


def test_a_derivative_through_hard_tau_warns_naming_tau():
    g, caught = _grad_tau("hard")
    assert g == 0.0 and len(caught) >= 1 and "tau" in str(caught[0].message)


def test_a_derivative_through_an_unconverged_solve_warns_or_is_nan():
    g, caught = _grad_tau("soft", max_iter=2)
    assert np.isfinite(g) and any("did not converge" in str(w.message) for w in caught)
    g, caught = _grad_tau("soft", max_iter=2, adjoint=core.ImplicitAdjoint(nan_if_unconverged=True))
    assert np.isnan(g) and caught
    g, caught = _grad_tau("soft", adjoint=core.ImplicitAdjoint(nan_if_unconverged=True))
    assert np.isfinite(g) and g != 0.0 and not caught  # converged, soft tau: nothing to say


def test_retrieval_surrogates_takes_the_adjoint_of_cds_equilibrium():
    problem, gold = _problem()
    params = core.CDSParams(beta=0.7, tau=0.2, tau_mode="soft")
    f = lambda adjoint: lambda beta: retrieval_surrogates(problem, gold, params.replace(beta=beta), budget=3,
                                                           adjoint=adjoint)["soft_recall"]
    assert float(jax.jit(jax.grad(f(core.NoDerivative())))(0.7)) == 0.0  # the adjoint is used, not refused
    with pytest.raises(ValueError, match="no derivative here"):
        jax.grad(f(core.NoAdjoint("no derivative here")))(0.7)


def test_unit_norm_is_checked_on_concrete_inputs():
    problem, gold = _problem()
    scaled = problem.replace(notes=problem.notes * 2.0)
    with pytest.raises(ValueError, match="L2-normalised"):
        retrieval_surrogates(scaled, gold, core.CDSParams(), budget=3)
    jax.jit(lambda p: retrieval_surrogates(p, gold, core.CDSParams(), budget=3)["recall"])(problem)
