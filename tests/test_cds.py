"""The one CDS entry point: every strategy x solver x payoff, the shared options, the declared interfaces.

``core.cds(problem, strategy, params, options)`` runs four strategy objects (``Single()``, ``Peel()``,
``Support()``, ``Shared()``) with any registered solver on a dense or a shared-corpus payoff. These tests check that
they agree where they should (same equilibrium, same selection), that padding, ``jit`` and ``vmap``
change nothing, that ``fill=False`` and the default solver mean the same in every strategy, that
``SolveOptions`` enforces its hard limits, and that the shared corpus never builds per-question
dense matrices.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id
from cdsjax.core.compat import cds_select
from cdsjax.core.registry import PPR_MAX_ITER_CAP
from cdsjax.core.solvers.loop import iterate
from cdsjax.core.solvers.options import DEFAULT_SOLVER
from cdsjax.core.strategies.shared import corpus_affinity
from cdsjax.core.strategies.support import support_settings
from cdsjax.core.types import FILL_NO_QUERY_EDGE, MAX_ITER_CAP, MAX_STEPS, MAX_SUPPORT_STEPS, NONFINITE, NOTE_KINDS, SINGULAR, STATUSES, kind_code
from cdsjax.core.games.payoff import DensePayoff
from cdsjax.core.strategies.shared import question_affinity, question_relevance, shared_payoff

N, D, B, BUDGET = 9, 6, 3, 3
CONVERGED_SOLVERS = ("inimdyn", "active_set")


def strategy_of(name: str, num_steps=None):
    """The strategy object a parametrised test names (``num_steps``: the Support strategy's bisection steps)."""
    return {"single": core.Single(), "peel": core.Peel(), "support": core.Support(num_steps=num_steps),
            "shared": core.Shared()}[name]


def corpus(seed=0, n=N, b=B):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, D))
    notes = centres[np.arange(n) % 3] + 0.4 * rng.normal(size=(n, D))
    notes /= np.linalg.norm(notes, axis=1, keepdims=True)
    queries = notes[:b] + 0.3 * rng.normal(size=(b, D))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return notes, queries


def same_selection(a, b, atol):
    np.testing.assert_array_equal(np.asarray(a.selected_valid), np.asarray(b.selected_valid))
    ok = np.asarray(a.selected_valid)
    np.testing.assert_array_equal(np.asarray(a.indices)[ok], np.asarray(b.indices)[ok])
    np.testing.assert_allclose(np.asarray(a.scores), np.asarray(b.scores), atol=atol)


# --------------------------------------------------------------------------- payoffs and solvers
def test_shared_payoff_has_the_dense_rows_diagonal_and_products():
    with jax.enable_x64(True):
        notes, queries = corpus()
        valid = np.arange(N) < N - 2  # trailing padding
        shared = corpus_affinity(notes, valid)
        rel = question_relevance(shared, queries)
        batched = shared_payoff(shared, rel)
        x = jnp.asarray(np.random.default_rng(1).random((B, N + 1)))
        for k in range(B):
            dense = DensePayoff.from_affinity(question_affinity(shared, rel[k]))
            one = shared_payoff(shared, rel[k])
            assert one.batch == () and batched.batch == (B,)
            np.testing.assert_allclose(np.asarray(one.diag()), np.asarray(dense.diag()), atol=1e-14)
            np.testing.assert_allclose(np.asarray(batched.diag()[k]), np.asarray(dense.diag()), atol=1e-14)
            np.testing.assert_allclose(np.asarray(one.matvec(x[k])), np.asarray(dense.matvec(x[k])), atol=1e-13)
            for i in range(N + 1):
                np.testing.assert_allclose(np.asarray(one.row(i)), np.asarray(dense.row(i)), atol=1e-14)
            rows = batched.row(jnp.full((B,), 4))
            np.testing.assert_allclose(np.asarray(rows[k]), np.asarray(dense.row(4)), atol=1e-14)
        assert isinstance(batched, core.Payoff) and isinstance(dense, core.Payoff)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
@pytest.mark.parametrize("solver", ("replicator", "inimdyn", "active_set"))
def test_every_solver_runs_on_every_payoff(solver):
    with jax.enable_x64(True):
        notes, queries = corpus(2)
        valid = np.ones(N, bool)
        shared = corpus_affinity(notes, valid)
        rel = question_relevance(shared, queries)
        config = core.solver_from_name(solver)
        assert isinstance(config, core.IterativeSolver) and isinstance(config, core.Solver)
        for k in range(B):
            dense = iterate(config, DensePayoff.from_affinity(question_affinity(shared, rel[k])))
            on_shared = iterate(config, shared_payoff(shared, rel[k]))
            np.testing.assert_allclose(np.asarray(on_shared.x), np.asarray(dense.x), atol=1e-9)
            assert int(on_shared.status) == int(dense.status)


@pytest.mark.slow
def test_status_enumeration_keeps_the_recorded_codes():
    assert [s.label for s in core.Status] == list(STATUSES)
    assert [int(s) for s in core.Status] == [core.CONVERGED, MAX_STEPS, NONFINITE, SINGULAR]
    assert all(s.message.endswith(".") for s in core.Status)
    # the loop records why it stopped: a step cap
    notes, queries = corpus()
    sel = core.cds(core.CDSProblem.create(notes, queries[0]), budget=BUDGET, max_iter=3)
    assert int(sel.result.status) == core.Status.MAX_STEPS and int(sel.result.num_iters) == 3


# --------------------------------------------------------------------------- strategies agree
@pytest.mark.slow
@pytest.mark.parametrize("solver", ("replicator",) + CONVERGED_SOLVERS)
def test_strategies_agree_where_they_should(solver):
    """One question: single == peel (one constraint vertex) == shared (the shared payoff), per solver;
    the converged solvers reach the same equilibrium, so the same selection, in every strategy."""
    name, solver = solver, core.solver_from_name(solver)
    with jax.enable_x64(True):
        notes, queries = corpus(3)
        valid = np.ones(N, bool)
        shared = core.cds(core.CDSProblem.create(notes, queries, valid), core.Shared(), budget=BUDGET, solver=solver)
        for k in range(B):
            problem = core.CDSProblem.create(notes, queries[k], valid)
            single = core.cds(problem, core.Single(), budget=BUDGET, solver=solver)
            peel = core.cds(problem, core.Peel(), budget=BUDGET, solver=solver)
            same_selection(single, peel, 1e-12)
            np.testing.assert_allclose(np.asarray(peel.result.x), np.asarray(single.result.x), atol=1e-15)
            row = jax.tree.map(lambda a: a[k], shared)
            same_selection(single, row, 1e-9)
            np.testing.assert_allclose(np.asarray(row.result.x), np.asarray(single.result.x), atol=1e-9)
            if name != "replicator":
                reference = core.cds(problem, core.Single(), budget=BUDGET, solver=core.ActiveSet())
                same_selection(single, reference, 1e-8)
                support = core.cds(problem, core.Support(num_steps=6), budget=BUDGET, solver=solver)
                support_ref = core.cds(problem, core.Support(num_steps=6), budget=BUDGET, solver=core.ActiveSet())
                same_selection(support, support_ref, 1e-8)
                assert float(support.beta) == float(support_ref.beta)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ("single", "peel", "support"))
def test_padding_jit_and_vmap_change_nothing(strategy):
    with jax.enable_x64(True):
        notes, queries = corpus(4)
        pad = 4
        junk = np.random.default_rng(9).normal(size=(pad, D))
        padded = np.concatenate([notes, junk])
        valid = np.arange(N + pad) < N
        kw = dict(budget=BUDGET, solver=core.ActiveSet())
        strategy = strategy_of(strategy, 5)
        plain = [core.cds(core.CDSProblem.create(notes, q), strategy, **kw) for q in queries]
        run = jax.jit(lambda p: core.cds(p, strategy, **kw))
        problems = [core.CDSProblem.create(padded, q, valid) for q in queries]
        batch = jax.jit(jax.vmap(lambda p: core.cds(p, strategy, **kw)))(jax.tree.map(lambda *a: jnp.stack(a), *problems))
        for k, problem in enumerate(problems):
            same_selection(run(problem), plain[k], 1e-9)
            same_selection(jax.tree.map(lambda a: a[k], batch), plain[k], 1e-9)


@pytest.mark.slow
def test_shared_strategy_ignores_padding():
    with jax.enable_x64(True):
        notes, queries = corpus(5)
        padded = np.concatenate([notes, np.random.default_rng(3).normal(size=(3, D))])
        valid = np.arange(N + 3) < N
        for solver in (core.Replicator(), core.ActiveSet()):
            a = core.cds(core.CDSProblem.create(notes, queries), core.Shared(), budget=BUDGET, solver=solver)
            b = jax.jit(lambda p: core.cds(p, core.Shared(), budget=BUDGET, solver=solver))(
                core.CDSProblem.create(padded, queries, valid))
            same_selection(a, b, 1e-9)


# --------------------------------------------------------------------------- one meaning of each option
STRATEGIES = ("single", "peel", "support", "shared")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fill_false_is_honoured_in_every_strategy(strategy):
    """Every cosine is negative: the query is isolated and the support empty. With fill the picks come
    from the fill rule; without it the selection is empty (the paper's reading)."""
    notes = np.abs(np.random.default_rng(6).normal(size=(N, D)))
    notes /= np.linalg.norm(notes, axis=1, keepdims=True)
    query = -notes.mean(0) / np.linalg.norm(notes.mean(0))
    problem = core.CDSProblem.create(notes, query[None] if strategy == "shared" else query)
    kw = dict(budget=BUDGET, solver=core.ActiveSet())
    filled = core.cds(problem, strategy_of(strategy, 4), **kw)
    bare = core.cds(problem, strategy_of(strategy, 4), fill=False, **kw)
    assert int(np.sum(filled.selected_valid)) == BUDGET and int(np.sum(filled.num_filled)) == BUDGET
    assert int(np.sum(filled.fill_reason)) == FILL_NO_QUERY_EDGE
    assert not np.any(np.asarray(bare.selected_valid)) and int(np.sum(bare.num_filled)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES + ("equilibrium",))
def test_every_strategy_runs_the_solver_object_it_is_given(strategy):
    """Every strategy (and the differentiable equilibrium) runs the caller's solver object, limits included: a
    5-step replicator stops every solve at 5 steps. Unset, the solver is DEFAULT_SOLVER, paper mode."""
    assert core.SolveOptions().solver == DEFAULT_SOLVER == core.Replicator()
    five = core.Replicator(tol=1e-300, max_iter=5)
    notes, queries = corpus(7)
    if strategy == "equilibrium":
        result, _ = core.cds_equilibrium(core.CDSProblem.create(notes, queries[0]), solver=five)
    else:
        problem = core.CDSProblem.create(notes, queries if strategy == "shared" else queries[0])
        result = core.cds(problem, strategy_of(strategy, 3), budget=BUDGET, solver=five).result
    assert np.all(np.asarray(result.num_iters) == 5)
    assert np.all(np.asarray(result.status) == MAX_STEPS)


@pytest.mark.parametrize("field,value", [("tol", 0.0), ("tol", -1.0), ("tol", float("nan")), ("max_iter", 0),
                                         ("max_iter", MAX_ITER_CAP + 1), ("max_iter", 2_147_483_647),
                                         ("num_steps", 0), ("num_steps", MAX_SUPPORT_STEPS + 1)])
def test_solve_options_enforce_hard_limits(field, value):
    support = field == "num_steps"  # the support strategy's own setting, not a SolveOptions field
    with pytest.raises(ValueError, match=field):
        support_settings(value) if support else core.SolveOptions(**{field: value}).check()
    notes, queries = corpus()
    with pytest.raises(ValueError, match=field):
        if support:
            core.cds(core.CDSProblem.create(notes, queries[0]), core.Support(**{field: value}), budget=3)
        else:
            core.cds(core.CDSProblem.create(notes, queries[0]), core.Single(), budget=3, **{field: value})
    with pytest.raises(ValueError, match=field):
        core.make_selector("cds_support" if field == "num_steps" else "cds", budget=3, **{field: value})


def test_hard_limits_keep_the_documented_settings_legal():
    core.SolveOptions(tol=1e-7, max_iter=10_000).check()  # paper mode
    core.SolveOptions(tol=1e-15, max_iter=MAX_ITER_CAP).check()
    assert support_settings(MAX_SUPPORT_STEPS)[0] == MAX_SUPPORT_STEPS
    with pytest.raises(TypeError, match="num_steps"):  # the Support strategy's own setting, not a cds() argument
        core.cds(core.CDSProblem.create(*corpus()[:1], corpus()[1][0]), core.Single(), budget=3, num_steps=3)
    for bad in ({"tol": 0.0}, {"tol": -1e-9}, {"max_iter": 0}, {"max_iter": PPR_MAX_ITER_CAP + 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            core.make_selector("ppr", budget=3, **bad)
    core.make_selector("ppr", budget=3, tol=1e-9, max_iter=PPR_MAX_ITER_CAP)


def test_entry_point_rejects_what_a_strategy_does_not_take():
    notes, queries = corpus()
    problem = core.CDSProblem.create(notes, queries[0])
    with pytest.raises(TypeError, match="strategy must be a strategy object"):
        core.cds(problem, "single", budget=3)  # a strategy is an object the caller picks, not a name
    for strategy in (core.Peel(), core.Support(), core.Shared()):
        with pytest.raises(ValueError, match="x0 is only used by the Single"):
            core.cds(problem, strategy, budget=3, x0=jnp.ones(N + 1))
    with pytest.raises(TypeError, match="solver must be a solver object"):
        core.cds(problem, budget=3, solver="converged")  # a name is converted at the edge (solver_from_name)
    with pytest.raises(ValueError, match="solver"):
        core.solver_from_name("converged")  # no aliases
    with pytest.raises(ValueError, match="pages"):
        core.CDSProblem.create(notes, queries[0], pages=np.zeros(N + 1, np.int32))
    assert core.CDSProblem.create(notes, queries[0]).queries.shape == (1, D)


# --------------------------------------------------------------------------- the selector contract
@pytest.mark.slow
@pytest.mark.x64  # equal selections (scores at rtol 1e-7): float64, where two traces cannot differ by float32 ulps
def test_every_selector_takes_a_problem_and_its_spec_says_what_it_reads():
    notes, queries = corpus(8)
    links = np.random.default_rng(0).random((N, N)) < 0.3
    structure = dict(pages=np.arange(N) // 3, doc_ids=np.arange(N) % 2, kinds=[kind_code("text")] * N)
    problem = core.CDSProblem.create(notes, queries[0], links=links, **structure)
    bare = core.CDSProblem.create(notes, queries[0], links=links)
    assert kind_code("table") == NOTE_KINDS.index("table") and kind_code("?") == 5
    key = key_from_query_id("q")
    theta = core.LearnedParams(beta=0.2, w_page=-0.5, w_doc=0.3)
    for name, spec in core.SPECS.items():
        opts = {"num_steps": 3} if name == "cds_support" else {"params": theta} if spec.learned else {}
        fn = core.make_selector(name, budget=BUDGET, **opts)
        a = fn(problem, key)
        same_selection(a, jax.jit(fn)(problem, key), 0.0)
        if not spec.structure:  # a selector that does not declare structure ignores it
            same_selection(a, fn(bare, key), 0.0)
        elif name in ("mmr_pages", "dpp_pages", "cds_learned_pages"):  # the page read-outs need pages
            with pytest.raises(ValueError, match="needs pages"):
                fn(bare, key)
        elif name != "cosine_pages":  # one that declares it reads it (cosine-pages needs it)
            assert not np.array_equal(np.asarray(a.result.x), np.asarray(fn(bare, key).result.x)), name
    with pytest.raises(ValueError, match="needs params=LearnedParams"):
        core.make_selector("cds_learned", budget=BUDGET, params="some/file.json")


# --------------------------------------------------------------------------- no per-question dense matrices
def _shapes(jaxpr, out):
    """Every intermediate shape of ``jaxpr``, nested jaxprs (loops, branches, calls) included."""
    for eqn in jaxpr.eqns:
        out.extend(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    _shapes(inner, out)
    return out


def test_shared_corpus_never_materialises_per_question_dense_matrices():
    notes, queries = corpus(b=5, n=11)
    problem = core.CDSProblem.create(notes, queries)
    size = N + 2  # n = 11 notes

    def dense_batches(fn):
        shapes = _shapes(jax.make_jaxpr(fn)(problem).jaxpr, [])
        return [s for s in shapes if len(s) >= 3 and s[0] == 5 and min(s[-2:]) >= size]

    for solver in (core.Replicator(), core.InImDyn(), core.ActiveSet()):
        assert dense_batches(lambda p: core.cds(p, core.Shared(), budget=BUDGET, solver=solver)) == [], solver
    # the per-question path does build them: the check can fail
    per_question = jax.vmap(lambda q: cds_select(problem.notes, q, problem.valid, budget=BUDGET,
                                                      solver=core.ActiveSet()))
    assert dense_batches(lambda p: per_question(p.queries))
