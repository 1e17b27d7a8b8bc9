"""Implicit derivatives of the CDS equilibrium in beta and tau, and the retrieval surrogates.

References are independent float64 NumPy code: the payoff is rebuilt in NumPy and the
equilibrium on a known support is the exact solution of its KKT linear system, so
central finite differences of the reference have no solver error in them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.compat import cds_weights
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core import implicit, surrogates
from tests.test_inimdyn import np_face_solution

# Every test compares with float64 references at tolerances float32 cannot reach.
pytestmark = pytest.mark.x64
TIGHT = dict(solver=core.Replicator(), tol=1e-15, max_iter=1_000_000)
TAU_T = 0.05


# --------------------------------------------------------------------------- references
def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def clustered_problem(seed=0, n=12, d=8, clusters=4):
    rng = np.random.default_rng(seed)
    centers = unit_rows(rng.normal(size=(clusters, d)))
    notes = unit_rows(centers[rng.integers(0, clusters, n)] + 0.3 * rng.normal(size=(n, d)))
    query = unit_rows(centers[0] + 0.5 * rng.normal(size=d))
    return notes, query


def np_payoff(notes, query, beta, tau, alpha_from="free", eps=1e-3):
    """M = A - alpha I_free with soft tau, one query first; NumPy float64."""
    n = notes.shape[0]
    s = notes @ query
    r = np.maximum(s, 0.0) / (1.0 + np.exp(-(s - tau) / TAU_T))
    w = beta * (1.0 - notes @ notes.T)
    np.fill_diagonal(w, 0.0)
    a = np.zeros((n + 1, n + 1))
    a[0, 1:] = r
    a[1:, 0] = r
    a[1:, 1:] = w
    block = w if alpha_from == "free" else a
    alpha = np.linalg.eigvalsh(block)[-1] + eps
    m = a.copy()
    m[1:, 1:] -= alpha * np.eye(n)
    return m, alpha


def np_equilibrium(notes, query, theta, support, **kw):
    m, _ = np_payoff(notes, query, theta[0], theta[1], **kw)
    x = np_face_solution(m, support)
    slack = m @ x - x @ m @ x
    # A genuine equilibrium on this support: positive on it, no profitable deviation off it.
    assert np.all(x[support] > 0) and np.all(slack[~support] < 1e-12)
    return x


def np_central_jacobian(fn, theta, h=1e-5):
    cols = [(fn(theta + h * e) - fn(theta - h * e)) / (2 * h) for e in np.eye(len(theta))]
    return np.stack(cols, axis=-1)


def params_of(theta, **kw):
    return core.CDSParams(beta=theta[0], tau=theta[1], tau_mode="soft", tau_temperature=TAU_T, **kw)


def _weights(theta, notes, query, valid, differentiate="implicit", alpha_from="free", solver="replicator"):
    solver_kw = TIGHT if solver == "replicator" else dict(solver=core.solver_from_name(solver), tol=1e-13)
    adjoint = core.ForwardLoopAdjoint() if differentiate == "loop" else core.ImplicitAdjoint()
    return cds_weights(notes, query, valid, params_of(theta, alpha_from=alpha_from), adjoint=adjoint, **solver_kw)


# Compiled once per shape and option set, shared by the tests.
STATIC = ("differentiate", "alpha_from", "solver")
weights = jax.jit(_weights, static_argnames=STATIC)
jac_fwd = jax.jit(jax.jacfwd(_weights), static_argnames=STATIC)


def weights_fn(notes, query, valid, differentiate="implicit", **kw):
    """``theta -> x*`` for one problem, compiled."""
    args = (jnp.asarray(notes), jnp.asarray(query), jnp.asarray(valid))
    return lambda theta: weights(jnp.asarray(theta), *args, differentiate=differentiate, **kw)


def jac_fn(notes, query, valid, differentiate="implicit", **kw):
    """``theta -> d x* / d theta`` ``[m+n, 2]`` for one problem, compiled."""
    args = (jnp.asarray(notes), jnp.asarray(query), jnp.asarray(valid))
    return lambda theta: jac_fwd(jnp.asarray(theta), *args, differentiate=differentiate, **kw)


# --------------------------------------------------------------------------- tests
@pytest.mark.slow
@pytest.mark.parametrize("theta", [(0.3, 0.1), (1.0, 0.25)])
def test_implicit_jacfwd_grad_loop_and_finite_differences_agree(theta):
    notes, query = clustered_problem()
    valid = np.ones(len(notes), bool)
    theta = jnp.asarray(theta)
    result, _ = core.cds_equilibrium(core.CDSProblem.create(notes, query, valid), params_of(theta), **TIGHT)
    assert int(result.status) == core.CONVERGED and float(result.kkt_residual) < 1e-12
    support = np.asarray(result.x) > 1e-6
    x_ref = np_equilibrium(notes, query, np.asarray(theta), support)
    np.testing.assert_allclose(np.asarray(result.x), x_ref, atol=1e-11)

    fwd = np.asarray(jac_fn(notes, query, valid)(theta))
    loop = np.asarray(jac_fn(notes, query, valid, "loop")(theta))
    fd = np_central_jacobian(lambda t: np_equilibrium(notes, query, t, support), np.asarray(theta))
    assert np.abs(fd).max() > 1e-3  # a non-trivial derivative
    np.testing.assert_allclose(fwd, fd, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(loop, fd, rtol=1e-5, atol=1e-9)
    assert np.all(fwd[~support] == 0.0)

    # Reverse mode: jax.grad of a scalar functional = the same contraction of the Jacobian.
    probe = jnp.asarray(np.random.default_rng(1).normal(size=fwd.shape[0]))
    args = (jnp.asarray(notes), jnp.asarray(query), jnp.asarray(valid))
    grad = jax.jit(jax.grad(lambda t: _weights(t, *args) @ probe))(theta)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(probe) @ fwd, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(probe) @ fd, rtol=1e-5, atol=1e-9)


def test_implicit_derivative_does_not_depend_on_the_solver():
    notes, query = clustered_problem(seed=2)
    valid = np.ones(len(notes), bool)
    theta = jnp.asarray([0.3, 0.1])
    by_replicator = jac_fn(notes, query, valid)(theta)
    by_inimdyn = jac_fn(notes, query, valid, solver="inimdyn")(theta)
    np.testing.assert_allclose(np.asarray(by_inimdyn), np.asarray(by_replicator), rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_alpha_derivative_is_the_top_eigenvector_formula():
    notes, query = clustered_problem(seed=3)
    valid = jnp.ones(len(notes), bool)
    beta, tau = 0.7, 0.15

    def alpha(theta, alpha_from):
        aff = build_affinity(jnp.asarray(notes), jnp.asarray(query), valid, params_of(theta, alpha_from=alpha_from))
        return aff.alpha

    theta = jnp.asarray([beta, tau])
    # Free block: alpha - eps = beta * lambda_max(1 - G), so d alpha / d beta = (alpha - eps) / beta.
    d_free = np.asarray(jax.grad(alpha)(theta, "free"))
    _, a_free = np_payoff(notes, query, beta, tau)
    np.testing.assert_allclose(d_free, [(a_free - 1e-3) / beta, 0.0], rtol=1e-10, atol=1e-12)
    # Full matrix: d lambda_max = v' dA v with v the top eigenvector (NumPy), dA by central differences.
    m, _ = np_payoff(notes, query, beta, tau, alpha_from="full")
    a = m.copy()
    a[1:, 1:] += (np_payoff(notes, query, beta, tau, alpha_from="full")[1]) * np.eye(len(notes))
    v = np.linalg.eigh(a)[1][:, -1]

    def full_affinity(b, t):
        mm, al = np_payoff(notes, query, b, t, alpha_from="full")
        mm[1:, 1:] += al * np.eye(len(notes))
        return mm

    h = 1e-6
    da_beta = (full_affinity(beta + h, tau) - full_affinity(beta - h, tau)) / (2 * h)
    da_tau = (full_affinity(beta, tau + h) - full_affinity(beta, tau - h)) / (2 * h)
    d_full = np.asarray(jax.grad(alpha)(theta, "full"))
    np.testing.assert_allclose(d_full, [v @ da_beta @ v, v @ da_tau @ v], rtol=1e-6)
    assert abs(d_full[1]) > 1e-4


@pytest.mark.slow
def test_derivative_with_full_alpha_matches_finite_differences():
    notes, query = clustered_problem(seed=1)
    valid = np.ones(len(notes), bool)
    theta = jnp.asarray([0.3, 0.1])
    fwd = np.asarray(jac_fn(notes, query, valid, alpha_from="full")(theta))
    x = np.asarray(weights_fn(notes, query, valid, alpha_from="full")(theta))
    support = x > 1e-6
    fd = np_central_jacobian(lambda t: np_equilibrium(notes, query, t, support, alpha_from="full"), np.asarray(theta))
    np.testing.assert_allclose(fwd, fd, rtol=1e-5, atol=1e-9)


@pytest.mark.slow
def test_support_change_gives_finite_one_sided_derivatives():
    """Across a beta where a note joins the support, x* is continuous with a kink.

    The derivative on each side is that side's branch (it matches one-sided finite
    differences there), never NaN; the extended scores stay continuous through it.
    """
    notes, query = clustered_problem()
    valid = jnp.ones(len(notes), bool)
    tau = 0.1
    betas = jnp.linspace(0.3, 1.0, 15)
    thetas = jnp.stack([betas, jnp.full_like(betas, tau)], axis=1)
    # InImDyn: near the kink the slack of the changing note is tiny and replicator
    # dynamics slow to a crawl, while InImDyn's exact line search still converges.
    fn = weights_fn(notes, query, np.ones(len(notes), bool), solver="inimdyn")
    xs = np.stack([np.asarray(fn(t)) for t in thetas])
    sizes = (xs[:, 1:] > 1e-6).sum(axis=1)
    k = int(np.flatnonzero(np.diff(sizes) != 0)[0])
    lo, hi = float(betas[k]), float(betas[k + 1])
    # Bisect to the change point.
    size_lo = sizes[k]
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        size_mid = int((np.asarray(fn(jnp.asarray([mid, tau])))[1:] > 1e-6).sum())
        lo, hi = (mid, hi) if size_mid == size_lo else (lo, mid)
    kink = 0.5 * (lo + hi)
    grid = jnp.stack([kink + jnp.asarray([-1e-3, -1e-6, 1e-6, 1e-3]), jnp.full((4,), tau)], axis=1)
    jac_at = jac_fn(notes, query, np.ones(len(notes), bool), solver="inimdyn")
    jac = np.stack([np.asarray(jac_at(t)) for t in grid])[:, :, 0]
    assert np.all(np.isfinite(jac))
    # Left and right branches differ (a kink), and each side matches its own finite differences.
    assert np.abs(jac[1] - jac[2]).max() > 1e-3
    for point, side in ((kink - 1e-3, jac[0]), (kink + 1e-3, jac[3])):
        x = np.asarray(fn(jnp.asarray([point, tau])))
        support = x > 1e-6
        fd = np_central_jacobian(lambda t: np_equilibrium(notes, query, t, support), np.asarray([point, tau]))
        np.testing.assert_allclose(side, fd[:, 0], rtol=1e-5, atol=1e-8)

    # Extended scores pass through 0 for the note that changes status: continuous at the kink.
    def scores(theta):
        result, aff = core.cds_equilibrium(core.CDSProblem.create(notes, query, valid), params_of(theta),
                                               solver=core.InImDyn(), tol=1e-13)
        return surrogates.equilibrium_scores(aff, result.x)

    scores_and_tangent = jax.jit(lambda t: jax.jvp(scores, (t,), (jnp.asarray([1.0, 0.0]),)))
    near = [tuple(map(np.asarray, scores_and_tangent(t))) for t in grid[:3]]
    changed = np.flatnonzero((near[1][0] > 1e-6) != (near[2][0] > 1e-6))
    assert changed.size >= 1
    assert np.abs(np.stack([near[1][0], near[2][0]])[:, changed]).max() < 1e-4
    value, tangent = near[0]
    assert np.all(np.isfinite(tangent)) and np.any(tangent[value < 0] != 0.0)


@pytest.mark.slow
def test_singular_kkt_system_gives_zero_tangent_not_nan():
    size = 4
    aff = core.Affinity(matrix=jnp.zeros((size, size)), constraint=jnp.array([True, False, False, False]),
                        valid=jnp.ones(size, bool), alpha=jnp.asarray(0.0), num_queries=1)
    x = jnp.full(size, 0.25)  # every point is an equilibrium of the zero payoff: K is singular
    assert not bool(implicit.implicit_system_ok(aff.payoff(), x, aff.valid))

    def fn(scale):
        return implicit.attach_implicit(aff.replace(matrix=scale * jnp.ones((size, size))), x)

    _, tangent = jax.jit(lambda s: jax.jvp(fn, (s,), (1.0,)))(0.0)
    np.testing.assert_array_equal(np.asarray(tangent), 0.0)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(lambda s: fn(s).sum()))(0.0)), 0.0)


@pytest.mark.slow
def test_vmap_over_padded_queries_matches_unpadded_calls():
    problems = [clustered_problem(seed=s, n=n) for s, n in ((0, 12), (3, 7))]
    width = 12
    theta = jnp.asarray([0.3, 0.1])
    notes = np.zeros((len(problems), width, 8))
    valid = np.zeros((len(problems), width), bool)
    for b, (z, _) in enumerate(problems):
        notes[b, : len(z)] = z
        valid[b, : len(z)] = True
    queries = np.stack([q for _, q in problems])

    batched_jac = jax.vmap(lambda z, q, v: jac_fwd(theta, z, q, v))
    batch = np.asarray(batched_jac(jnp.asarray(notes), jnp.asarray(queries), jnp.asarray(valid)))
    for b, (z, q) in enumerate(problems):
        single = np.asarray(jac_fn(z, q, np.ones(len(z), bool))(theta))
        np.testing.assert_allclose(batch[b, : len(z) + 1], single, rtol=1e-7, atol=1e-10)
        np.testing.assert_array_equal(batch[b, len(z) + 1 :], 0.0)


@pytest.mark.slow
def test_hard_tau_has_zero_tau_derivative():
    notes, query = clustered_problem()
    valid = jnp.ones(len(notes), bool)

    def fn(tau):
        params = core.CDSParams(beta=0.5, tau=tau, tau_mode="hard")
        return cds_weights(jnp.asarray(notes), jnp.asarray(query), valid, params, **TIGHT)

    np.testing.assert_array_equal(np.asarray(jax.jit(jax.jacfwd(fn))(0.2)), 0.0)


# --------------------------------------------------------------------------- surrogates
def np_soft_recall(scores, units, budget, temperature, threshold=1e-6):
    order = np.sort(scores[np.isfinite(scores)])[::-1]
    t = threshold if len(order) <= budget else max(threshold, 0.5 * (order[budget - 1] + order[budget]))
    spread = np.mean(np.abs(order[: 2 * budget] - t))
    p = 1.0 / (1.0 + np.exp(-(scores - t) / (temperature * spread)))
    p[~np.isfinite(scores)] = 0.0
    units = units[units.any(axis=1)]
    covered = [1.0 - np.prod(1.0 - p[u]) for u in units]
    return np.mean(covered)


@pytest.mark.slow
def test_soft_recall_matches_reference_and_tends_to_hard_recall():
    rng = np.random.default_rng(4)
    scores = np.concatenate([rng.uniform(-0.2, 0.3, size=14), [-np.inf, -np.inf]])
    units = np.zeros((4, 16), bool)
    units[0, [0, 3]] = True
    units[1, [5]] = True
    units[2, [7, 8, 9]] = True  # unit 3 is padding
    for budget in (1, 4, 8):
        got = surrogates.soft_recall(jnp.asarray(scores), jnp.asarray(units), budget=budget, temperature=0.3)
        np.testing.assert_allclose(float(got), np_soft_recall(scores, units, budget, 0.3), rtol=1e-12)
        # The temperature is relative: scaling every score leaves the surrogate unchanged.
        scaled = surrogates.soft_recall(jnp.asarray(scores * 1e-3), jnp.asarray(units), budget=budget, temperature=0.3,
                                      threshold=1e-9)
        np.testing.assert_allclose(float(scaled), float(got), rtol=1e-9)
        sharp = surrogates.soft_recall(jnp.asarray(scores), jnp.asarray(units), budget=budget, temperature=1e-7)
        picked = np.argsort(-scores)[:budget]
        picked = picked[scores[picked] > 1e-6]
        hard = np.mean([np.isin(np.flatnonzero(u), picked).any() for u in units[:3]])
        np.testing.assert_allclose(float(sharp), hard, atol=1e-6)
        np.testing.assert_allclose(
            float(surrogates.hard_recall(jnp.asarray(scores), jnp.asarray(units), budget=budget)), hard)
    assert np.isnan(float(surrogates.soft_recall(jnp.asarray(scores), jnp.zeros((2, 16), bool), budget=3)))
    # A real gold unit that no note covers (a page without text) counts as missed when declared valid.
    declared = jnp.asarray([True, True, True, True])
    for fn in (functools.partial(surrogates.soft_recall, temperature=1e-7), surrogates.hard_recall):
        counted = float(fn(jnp.asarray(scores), jnp.asarray(units), budget=4, unit_valid=declared))
        default = float(fn(jnp.asarray(scores), jnp.asarray(units), budget=4))
        np.testing.assert_allclose(counted, default * 3 / 4, atol=1e-6)
    with pytest.raises(ValueError, match="gold_units"):
        surrogates.hard_recall(jnp.asarray(scores), jnp.asarray(units[:, :8]), budget=2)


def test_gold_mass_and_surrogate_gradients():
    notes, query = clustered_problem()
    n = len(notes)
    valid = jnp.ones(n, bool)
    gold_units = np.zeros((2, n), bool)
    gold_units[0, 2] = True
    gold_units[1, [6, 7]] = True
    theta = jnp.asarray([0.5, 0.1])

    def objectives(t):
        out = surrogates.retrieval_surrogates(core.CDSProblem.create(notes, query, valid), jnp.asarray(gold_units),
                                            params_of(t), budget=3, temperature=0.3, **TIGHT)
        return jnp.stack([out["soft_recall"], out["gold_mass"]])

    x = np.asarray(weights_fn(notes, query, np.ones(n, bool))(theta))
    gold = gold_units.any(axis=0)
    np.testing.assert_allclose(float(jax.jit(objectives)(theta)[1]), x[1:][gold].sum() / x[1:].sum(), rtol=1e-12)
    fwd = np.asarray(jax.jit(jax.jacfwd(objectives))(theta))
    rev = np.asarray(jax.jit(jax.jacrev(objectives))(theta))
    np.testing.assert_allclose(rev, fwd, rtol=1e-9, atol=1e-12)
    support = x > 1e-6

    def reference(t):
        xx = np_equilibrium(notes, query, t, support)
        m, _ = np_payoff(notes, query, t[0], t[1])
        slack = np.where(support, 0.0, m @ xx - xx @ m @ xx)
        scores = (xx + slack)[1:]
        return np.array([np_soft_recall(scores, gold_units, 3, 0.3), xx[1:][gold].sum() / xx[1:].sum()])

    fd = np_central_jacobian(reference, np.asarray(theta))
    assert np.abs(fd).max() > 1e-3
    np.testing.assert_allclose(fwd, fd, rtol=1e-5, atol=1e-9)


class _Bare:
    """A user's solver with nothing but the Solver protocol: a name, ``solve`` and ``with_limits`` (no flag)."""

    name = "bare"

    def solve(self, payoff, x0=None):
        return core.ActiveSet(tol=1e-12).solve(payoff, x0)

    def with_limits(self, tol=None, max_iter=None):
        return self


@pytest.mark.x64
def test_a_solver_is_its_algorithm_and_every_strategy_and_adjoint_runs_it_as_given():
    """A solver with no property but its name runs under every strategy (none reads a flag of it) and every
    adjoint, used as the caller gave it: NoDerivative is a zero derivative, NoAdjoint refuses one."""
    notes, query = clustered_problem(3, n=8)
    notes, query = jnp.asarray(notes), jnp.asarray(query)
    problem = core.CDSProblem.create(notes, query, jnp.ones(8, bool))
    bare = _Bare()
    ref = core.cds(problem, core.Single(), budget=3, solver=core.ActiveSet(tol=1e-12))
    for strategy in (core.Single(), core.Peel(), core.Shared()):
        sel = core.cds(problem, strategy, budget=3, solver=bare)
        sel = jax.tree.map(lambda a: a[0], sel) if isinstance(strategy, core.Shared) else sel
        np.testing.assert_array_equal(np.asarray(sel.indices), np.asarray(ref.indices))
        np.testing.assert_allclose(np.asarray(sel.scores), np.asarray(ref.scores), atol=1e-9)
    assert int(core.cds(problem, core.Support(num_steps=3), budget=3, solver=bare).support_size) >= 1

    def x_at(adjoint):
        return lambda beta: core.equilibrium(core.CDSParams(beta=beta).affinity(problem), bare, adjoint=adjoint).x

    implicit = jax.jacfwd(x_at(core.ImplicitAdjoint()))(0.5)
    assert np.abs(np.asarray(implicit)).max() > 0
    np.testing.assert_allclose(np.asarray(jax.grad(lambda b: x_at(core.ImplicitAdjoint())(b)[1])(0.5)),
                               np.asarray(implicit)[1], rtol=1e-9, atol=1e-12)
    assert not np.any(np.asarray(jax.jacfwd(x_at(core.NoDerivative()))(0.5)))
    with pytest.raises(ValueError, match="no derivative"):
        jax.jacfwd(x_at(core.NoAdjoint()))(0.5)


def test_the_callers_adjoint_is_used_or_refused_in_one_line_never_swapped():
    """The shared strategy's payoff has no implicit derivative: ImplicitAdjoint is refused (one line, naming what
    to pass), ForwardLoopAdjoint is used (as its default is), and a BlockProblem refuses an adjoint asking for a
    derivative but takes NoDerivative() as given."""
    notes, query = clustered_problem(3, n=8)
    many = core.CDSProblem.create(jnp.asarray(notes), jnp.asarray(query)[None], jnp.ones(8, bool))
    with pytest.raises(ValueError) as err:
        core.cds(many, core.Shared(), budget=3, adjoint=core.ImplicitAdjoint())
    assert "\n" not in str(err.value) and "ForwardLoopAdjoint()" in str(err.value)

    def first_weight(adjoint):
        def f(beta):
            sel = core.cds(many, core.Shared(), core.CDSParams(beta=beta), budget=3, adjoint=adjoint,
                           solver=core.Replicator(max_iter=50))
            return sel.result.x[0, 1]
        return jax.jacfwd(f)(0.5)

    assert float(first_weight(core.ForwardLoopAdjoint())) == float(first_weight(None)) != 0.0  # the default: the loop
    assert float(first_weight(core.NoDerivative())) == 0.0  # used as given, not replaced by the loop
    fn = core.make_selector("cds_converged", budget=3)
    one = core.CDSProblem.create(jnp.asarray(notes), jnp.asarray(query), jnp.ones(8, bool))
    posed = core.BlockProblem.pose(one, fn.corpus_bound(one), fn.corpus_block(one))
    for adjoint in (core.ImplicitAdjoint(), core.ForwardLoopAdjoint()):
        with pytest.raises(ValueError, match="^a BlockProblem is solved on its corpus block, but an adjoint") as err:
            core.cds(posed, core.Single(), budget=3, solver=core.SERVING_SOLVER, adjoint=adjoint)
        assert "\n" not in str(err.value)
    given = core.cds(posed, core.Single(), budget=3, solver=core.SERVING_SOLVER, adjoint=core.NoDerivative())
    np.testing.assert_array_equal(np.asarray(given.indices), np.asarray(fn(posed).indices))
