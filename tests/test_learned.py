"""The learned CDS game as a game of the one entry point (core.cds with LearnedParams): the paper's game at
theta_0 bit for bit under every strategy, pinned notes kept, implicit derivatives of every parameter through
core.cds against central finite differences (float64), and padding / jit / vmap invariance."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.compat import cds_select
from cdsjax.core.games.affinity import build_affinity, problem_affinity
from cdsjax.core.games.learned import LearnedParams, kind_codes, learned_affinity
from cdsjax.core.types import NOTE_KINDS


def as_problem(p, **extra):
    return core.CDSProblem.create(p["notes"], p["query"], p["valid"], links=p["links"], pages=p["pages"],
                                  doc_ids=p["doc_ids"], kinds=p["kinds"], **extra)


def cds_learned(p, theta, budget=4, solver=core.ActiveSet(), strategy=core.Single(), **kw):
    """The cds-learned selection: core.cds on the problem with the learned game as params."""
    return core.cds(as_problem(p), strategy, theta, core.SolveOptions(solver=solver), budget=budget, **kw)


def problem(seed=0, n=14, d=8, pad=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(4, d))
    z = centers[rng.integers(0, 4, n)] + 0.4 * rng.normal(size=(n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = centers[0] + 0.5 * rng.normal(size=d)
    q /= np.linalg.norm(q)
    links = rng.random((n, n)) < 0.2
    links = np.triu(links, 1)
    links = links | links.T
    pages = rng.integers(0, 4, n)
    docs = rng.integers(0, 2, n)
    kinds = rng.integers(0, len(NOTE_KINDS), n)
    z = np.concatenate([z, np.zeros((pad, d))]).astype(dtype)
    valid = np.arange(n + pad) < n
    grow = lambda a, v: np.concatenate([a, np.full((pad,), v, a.dtype)])
    big = np.zeros((n + pad, n + pad), bool)
    big[:n, :n] = links
    return dict(notes=z, query=q.astype(dtype), valid=valid, links=big, pages=grow(pages, -1),
                doc_ids=grow(docs, -1), kinds=grow(kinds, -1))


GENERIC = LearnedParams(beta=0.7, alpha_factor=1.3, tau=0.1, gate=0.4, log_gate_temperature=np.log(0.1),
                        sharpness=1.5, rel_repulsion=0.5, w_page=-0.15, w_doc=0.05, w_link=0.1, w_same_kind=-0.05,
                        w_text_visual=0.08)


@pytest.mark.slow
@pytest.mark.parametrize("solver", [core.ActiveSet(), core.Replicator()], ids=lambda s: s.name)
def test_paper_point_is_bit_identical(solver):
    p = problem(pad=3)
    structure = {k: p[k] for k in ("pages", "doc_ids", "kinds")}

    def today(z, q, v):
        return cds_select(z, q, v, budget=5, solver=solver)

    def learned(p):
        return cds_learned(p, LearnedParams.paper(), budget=5, solver=solver)

    a = jax.jit(today)(p["notes"], p["query"], p["valid"])
    b = jax.jit(learned)(p)
    assert np.array_equal(np.asarray(a.result.x), np.asarray(b.result.x))
    assert np.array_equal(np.asarray(a.indices), np.asarray(b.indices))
    assert np.array_equal(np.asarray(a.scores), np.asarray(b.scores))
    assert np.asarray(a.result.alpha) == np.asarray(b.result.alpha)
    aff_a = build_affinity(p["notes"], p["query"], p["valid"])
    aff_b = learned_affinity(p["notes"], p["query"], p["valid"], LearnedParams.paper(), links=p["links"], **structure)
    assert np.array_equal(np.asarray(aff_a.matrix), np.asarray(aff_b.matrix))
    assert np.asarray(aff_a.alpha) == np.asarray(aff_b.alpha)


@pytest.mark.slow
def test_generic_point_changes_the_game_and_keeps_the_bound():
    p = problem()
    paper = learned_affinity(p["notes"], p["query"], p["valid"], LearnedParams.paper())
    aff = learned_affinity(p["notes"], p["query"], p["valid"], GENERIC, links=p["links"], pages=p["pages"],
                           doc_ids=p["doc_ids"], kinds=p["kinds"])
    assert not np.allclose(np.asarray(paper.matrix), np.asarray(aff.matrix))
    m = aff.num_queries
    block = np.asarray(aff.matrix)[m:, m:]
    assert float(aff.alpha) >= np.linalg.eigvalsh(block)[-1]  # the query stays in the support


def _loss_fn(p, v, adjoint=None):
    options = core.SolveOptions(solver=core.ActiveSet(), tol=1e-13, max_iter=200_000)

    def loss(theta):  # through the one entry point: the selection's equilibrium carries the derivative
        sel = core.cds(as_problem(p), core.Single(), theta, options, budget=4, adjoint=adjoint)
        return jnp.sum(sel.result.x[1:] * v)
    return jax.jit(loss)  # one compilation for the 25 solves of the check


@pytest.mark.slow
@pytest.mark.x64
def test_implicit_gradient_of_every_parameter_matches_finite_differences():
    p = problem(seed=3, n=12, dtype=np.float64)
    v = np.random.default_rng(1).normal(size=12)
    loss = _loss_fn(p, v)
    theta = GENERIC.astype(jnp.float64)
    grad = jax.jit(jax.grad(loss))(theta)
    h = 1e-6
    for name in LearnedParams.names():
        plus = loss(theta.replace(**{name: getattr(theta, name) + h}))
        minus = loss(theta.replace(**{name: getattr(theta, name) - h}))
        fd = float(plus - minus) / (2 * h)
        g = float(getattr(grad, name))
        assert abs(g - fd) <= 1e-5 + 1e-4 * abs(fd), (name, g, fd)
    # some parameter has a non-zero derivative (the check above is not vacuous)
    assert max(abs(float(getattr(grad, k))) for k in LearnedParams.names()) > 1e-3


@pytest.mark.slow
@pytest.mark.x64
def test_gradient_at_the_paper_point_is_finite_and_moves_beta():
    p = problem(seed=3, n=12, dtype=np.float64)
    v = np.random.default_rng(1).normal(size=12)
    grad = jax.grad(_loss_fn(p, v))(LearnedParams.paper().astype(jnp.float64))
    vals = np.array([float(getattr(grad, k)) for k in LearnedParams.names()])
    assert np.all(np.isfinite(vals)) and abs(float(grad.beta)) > 0


def _select(p, theta, budget=4):
    return cds_learned(p, theta, budget=budget)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_padding_jit_and_vmap_invariance():
    small, padded = problem(seed=5), problem(seed=5, pad=6)
    a = _select(small, GENERIC)
    b = _select(padded, GENERIC)
    np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
    np.testing.assert_allclose(np.asarray(a.result.x), np.asarray(b.result.x)[:15], atol=1e-6)
    assert np.all(np.asarray(b.result.x)[15:] == 0)
    c = jax.jit(lambda p: _select(p, GENERIC))(padded)
    np.testing.assert_array_equal(np.asarray(b.indices), np.asarray(c.indices))
    batch = [problem(seed=s, pad=6) for s in (5, 6)]
    stacked = {k: np.stack([q[k] for q in batch]) for k in batch[0]}
    vm = jax.vmap(lambda p: _select(p, GENERIC))(stacked)
    for i, q in enumerate(batch):
        np.testing.assert_array_equal(np.asarray(vm.indices[i]), np.asarray(_select(q, GENERIC).indices))


@pytest.mark.slow
def test_params_dict_round_trip_and_projection():
    theta = GENERIC.replace(beta=-1.0, gate=2.0, alpha_factor=0.5)
    projected = theta.project()
    assert float(projected.beta) == 0.0 and float(projected.gate) == 1.0 and float(projected.alpha_factor) == 1.0
    assert LearnedParams.from_dict(GENERIC.to_dict()).to_dict() == GENERIC.to_dict()
    with pytest.raises(ValueError, match="unknown learned parameter"):
        LearnedParams.from_dict({"gamma": 1.0})
    with pytest.raises(ValueError, match="finite number"):
        LearnedParams.from_dict({"beta": "x"})
    assert kind_codes(["paragraph", "figure", None, "weird"]) == [0, 1, -1, -1]
    assert len(dataclasses.fields(LearnedParams)) <= 12


@pytest.mark.slow
@pytest.mark.x64
def test_implicit_and_loop_adjoints_agree_through_cds():
    p = problem(seed=3, n=12, dtype=np.float64)
    v = np.random.default_rng(1).normal(size=12)
    theta = GENERIC.astype(jnp.float64)
    implicit = jax.grad(_loss_fn(p, v))(theta)
    loop = jax.jacfwd(_loss_fn(p, v, adjoint=core.ForwardLoopAdjoint()))(theta)
    for name in ("beta", "w_page", "gate"):
        np.testing.assert_allclose(float(getattr(implicit, name)), float(getattr(loop, name)), rtol=1e-4, atol=1e-7)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
@pytest.mark.parametrize("strategy", ["peel", "support", "shared"])
def test_every_strategy_runs_the_learned_game(strategy):
    """The paper point of the learned game is the paper's game under every strategy of core.cds."""
    p = problem(pad=3)
    kw = {}
    strategy = {"peel": core.Peel(), "support": core.Support(num_steps=4), "shared": core.Shared()}[strategy]
    opts = core.SolveOptions(solver=core.ActiveSet())
    paper = core.cds(core.CDSProblem.create(p["notes"], p["query"], p["valid"]), strategy, core.CDSParams(), opts,
                     budget=5, **kw)
    learned = core.cds(as_problem(p), strategy, LearnedParams.paper(), opts, budget=5, **kw)
    np.testing.assert_array_equal(np.asarray(paper.indices), np.asarray(learned.indices))
    np.testing.assert_allclose(np.asarray(paper.result.x), np.asarray(learned.result.x), atol=1e-5)
    if isinstance(strategy, core.Peel):  # same affinity, same rounds: bit for bit
        assert np.array_equal(np.asarray(paper.result.x), np.asarray(learned.result.x))
    other = core.cds(as_problem(p), strategy, GENERIC, opts, budget=5, **kw)
    assert np.asarray(other.selected_valid).any()


@pytest.mark.slow
def test_pinned_notes_join_the_learned_constraint_set():
    p = problem(pad=2)
    pinned = np.zeros(len(p["valid"]), bool)
    pinned[[1, 4]] = True
    prob = as_problem(p, pinned=pinned)
    aff_paper = build_affinity(prob.notes, prob.queries, prob.valid, pinned=pinned)
    aff = problem_affinity(prob, LearnedParams.paper())
    assert np.array_equal(np.asarray(aff_paper.matrix), np.asarray(aff.matrix))
    assert np.array_equal(np.asarray(aff_paper.constraint), np.asarray(aff.constraint))
    assert np.asarray(aff_paper.alpha) == np.asarray(aff.alpha)
    generic = problem_affinity(as_problem(p, pinned=pinned), GENERIC)
    assert np.asarray(generic.constraint)[1:].tolist() == pinned.tolist()
    assert not np.array_equal(np.asarray(generic.alpha), np.asarray(problem_affinity(as_problem(p), GENERIC).alpha))
