"""One corpus, many questions (cdsjax.core.strategies.corpus): the note block built once is the dense affinity's, and a
question solved on it (the primal-dual active set, the active set as its fallback) picks the notes the dense solve picks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.pipeline import catalog
from cdsjax.core.games.affinity import problem_affinity
from cdsjax.core import registry
from cdsjax.core.solvers.active_set import ActiveSet, capacities
from cdsjax.core.strategies.corpus import NoCorpusBlock, check_block_problem, problem_block
from cdsjax.core.games.learned import LearnedParams, learned_affinity
from cdsjax.core.games.payoff import DensePayoff
from cdsjax.core.solvers.loop import iterate
from cdsjax.core.solvers.options import SERVING_SOLVER, SolveOptions
from tests.conftest import clustered_notes

SHIPPED = LearnedParams(beta=0.03, w_page=-1.0)
SERVING = SolveOptions(solver=SERVING_SOLVER)


def corpus(n, size, seed=0, d=48, clusters=6):
    """Clustered unit vectors padded to ``size``, questions near three notes, pages of five notes."""
    rng = np.random.default_rng(seed)
    z = clustered_notes(rng, n, size, d, clusters)
    qs = np.stack([z[i:i + 3].sum(0) + rng.normal(size=d) for i in range(0, 3 * 6, 3)])
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    pages = np.where(np.arange(size) < n, np.arange(size) // 5, -1).astype(np.int32)
    return z.astype(np.float32), qs.astype(np.float32), np.arange(size) < n, pages


@pytest.mark.slow
def test_the_block_is_the_dense_affinitys_note_block():
    z, qs, valid, pages = corpus(70, 128, seed=1)
    problem = core.CDSProblem.create(z, qs[0], valid, pages=pages)
    for params in (SHIPPED, core.CDSParams(), core.CDSParams(beta=0.3)):
        block = jax.jit(lambda p, g=params: problem_block(p, g, SERVING))(problem)
        dense = jax.jit(lambda p, g=params: problem_affinity(p, g).matrix[1:, 1:])(problem)
        # the same functions; XLA may fuse the two programs differently (last bits)
        np.testing.assert_allclose(np.asarray(block), np.asarray(dense), rtol=1e-6, atol=1e-7)
    # where the solve would not use it: none is built, and problem_block says why
    with pytest.raises(NoCorpusBlock, match="LearnedParams reads the question"):
        problem_block(problem, SHIPPED.replace(rel_repulsion=0.5), SERVING)
    for strategy in (core.Peel(), core.Support(), core.Shared()):  # strategies that solve the dense game
        assert strategy.corpus_block(problem, SHIPPED, SERVING) is None
    assert core.Single().corpus_block(problem, core.CDSParams(), SERVING) is not None
    # paper mode is kept on its dense payoff by its selector, not by a flag of the solver
    assert registry.corpus_block_fn(registry.make_selector("cds", budget=3)) is None
    for args, why in (((problem, core.CDSParams(alpha_from="full"), SERVING), "alpha_from"),
                      ((problem.replace(queries=jnp.asarray(qs[:2])), SHIPPED, SERVING), "several query rows"),
                      ((problem.replace(pinned=jnp.asarray(valid)), SHIPPED, SERVING), "pins notes"),
                      ((problem, SHIPPED, SERVING.replace(init="softmax")), "init='softmax'")):
        with pytest.raises(NoCorpusBlock, match=why):
            problem_block(*args)
    # a problem carrying a block is solved on it, or says why it cannot be
    posed = core.BlockProblem.pose(problem, jnp.ones(()), block)
    check_block_problem(posed, SERVING, None, None)
    with pytest.raises(ValueError, match="a start is given"):
        check_block_problem(posed, SERVING.replace(init="softmax"), None, None)


@pytest.mark.slow
@pytest.mark.parametrize("name,n,size", [("cds_learned", 90, 128), ("cds_converged", 45, 64),
                                         ("cds_learned", 200, 256), ("cds_learned_pages", 90, 128)])
def test_a_question_on_the_block_picks_what_the_dense_solve_picks(name, n, size):
    z, qs, valid, pages = corpus(n, size, seed=n)
    options = {"params": SHIPPED} if registry.SPECS[name].learned else {}
    fn = registry.make_selector(name, budget=10, **options)
    base = core.CDSProblem.create(z, qs[0], valid, links=np.zeros((size, size), bool), pages=pages,
                                  doc_ids=np.zeros(size, np.int32), kinds=np.zeros(size, np.int32))
    bound = jax.jit(registry.corpus_bound_fn(fn))(base)
    block = jax.jit(registry.corpus_block_fn(fn))(base)
    assert block is not None and block.shape == (size, size)
    run = jax.jit(fn)
    for q in qs:
        problem = base.replace(queries=jnp.asarray(q[None]), bound=bound)
        dense, fast = run(problem), run(core.with_corpus_arrays(problem, bound, block))
        assert int(fast.result.status) == core.CONVERGED and float(fast.result.kkt_residual) < 1e-5
        np.testing.assert_array_equal(np.asarray(fast.indices), np.asarray(dense.indices))
        np.testing.assert_array_equal(np.asarray(fast.selected_valid), np.asarray(dense.selected_valid))
        np.testing.assert_allclose(np.asarray(fast.scores), np.asarray(dense.scores), atol=2e-5)
        assert int(fast.support_size) == int(dense.support_size)
        assert float(fast.result.alpha) == float(dense.result.alpha)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_vertex_first_reaches_the_equilibrium_of_the_newton_start():
    """ActiveSet(vertex_first=True) skips the whole face's Newton step from the uniform start; with gathered
    sizes it solves each face in the smallest that holds the support, and reaches the same point."""
    z, qs, valid, pages = corpus(200, 256, seed=7)
    payoff = DensePayoff.from_affinity(learned_affinity(z, qs[1], valid, SHIPPED, pages=pages))
    run = jax.jit(lambda p, s: iterate(s, p, None), static_argnums=1)
    plain = run(payoff, ActiveSet())
    for solver in (ActiveSet(vertex_first=True), ActiveSet(vertex_first=True, gather=(16, 64, 128)),
                   ActiveSet(vertex_first=True, gather=(2, 4))):  # the last: every face past it, dense
        res = run(payoff, solver)
        assert int(res.status) == core.CONVERGED
        np.testing.assert_allclose(np.asarray(res.x), np.asarray(plain.x), atol=1e-5)
    assert capacities((512, 64, 64, 4096), 1025) == (64, 512)
    assert capacities(None, 10) == () and capacities(8, 8) == ()
    with pytest.raises(ValueError, match="gather"):
        capacities((0,), 10)


@pytest.mark.slow
def test_pipeline_keeps_the_block_with_the_bound():
    from cdsjax.pipeline import Corpus, Pipeline

    z, qs, valid, pages = corpus(150, 150, seed=3)
    notes = [{"note_id": f"n{i}", "doc_id": "d", "page": int(pages[i]), "kind": "text", "text": "", "bbox": None}
             for i in range(150)]
    pipe = Pipeline(Corpus(embeddings=z, links=np.zeros((150, 150), bool), notes=notes,
                           embedder={"model": "all-MiniLM-L6-v2"}, roots=[]), embedder=object())
    for selector in ("cds-learned", "cds-learned-pages", "cds-converged"):
        first = pipe.select(qs[0], selector=selector, budget=5)
        fn = pipe.selector_fn(selector, 5)
        problem = pipe.with_bound(fn, pipe.candidates.problem(qs[0], catalog.selector_spec(selector)),
                                  pipe.selector_key(selector, 5))
        assert isinstance(problem, core.BlockProblem) and problem.note_block.shape == (pipe.size, pipe.size)
        dense = fn(problem.dense_problem())
        np.testing.assert_array_equal(np.asarray(first.indices), np.asarray(dense.indices))
    assert pipe.select(qs[1], selector="cosine", budget=5).indices.shape == (5,)


@pytest.mark.slow
def test_the_integrations_chooser_keeps_them_per_candidate_set():
    from cdsjax.integrations._common import Chooser
    from cdsjax.pipeline.selection import Candidates, CorpusArrays

    z, qs, _, _ = corpus(60, 60, seed=4)
    chooser = Chooser("cds-converged", budget=5)
    computed = []

    def counting(f, role):
        jitted = jax.jit(f)

        def call(problem):
            computed.append(role)
            return jitted(problem)

        return call

    chooser.corpus_arrays = CorpusArrays(wrap=counting)
    first, _ = chooser(z, qs[0])
    assert computed == ["bound", "block"]
    chooser(z, qs[1])
    assert computed == ["bound", "block"]  # same candidates: kept
    chooser(z[::-1].copy(), qs[0])
    assert computed == ["bound", "block"] * 2  # other candidates: computed again
    # the picks are those of the same solver on the block, and of the dense solve with the bound
    problem = chooser._with_corpus(*(lambda c: (c, c.problem(qs[0], chooser.spec)))(Candidates.pad(z, min_size=5)))
    assert isinstance(problem, core.BlockProblem)
    dense = jax.jit(chooser.fn)(problem.dense_problem())
    assert [i for i, _ in first] == np.asarray(dense.indices)[np.asarray(dense.selected_valid)].tolist()


@pytest.mark.slow
def test_differentiating_the_serving_path_raises_and_the_dense_path_differentiates():
    z, qs, valid, pages = corpus(40, 64, seed=9)
    fn = registry.make_selector("cds_learned", budget=5, params=SHIPPED)
    base = core.CDSProblem.create(z, qs[0], valid, pages=pages)
    bound = registry.corpus_bound_fn(fn)(base)
    block = registry.corpus_block_fn(fn)(base)

    def weight(q, note_block):
        problem = core.with_corpus_arrays(base.replace(queries=q[None]), bound, note_block)
        return jnp.sum(fn(problem).scores)

    # a derivative taken through the block path: refused while JAX traces it, jitted or not
    with pytest.raises(ValueError, match="has no derivative"):
        jax.grad(weight)(jnp.asarray(qs[0]), block)
    with pytest.raises(ValueError, match="has no derivative"):
        jax.jit(jax.grad(weight))(jnp.asarray(qs[0]), block)
    # asking for one (an adjoint) with a block: refused at the call, before any tracing of a derivative
    problem = core.with_corpus_arrays(base, bound, block)
    for adjoint in (core.ImplicitAdjoint(), core.ForwardLoopAdjoint()):
        with pytest.raises(ValueError, match="adjoint"):
            core.cds(problem, core.Single(), SHIPPED, solver=SERVING_SOLVER, budget=5, adjoint=adjoint)
    # without the block the same solver's dense form is differentiable
    grad = jax.grad(weight)(jnp.asarray(qs[0]), None)
    assert np.all(np.isfinite(np.asarray(grad))) and np.any(np.asarray(grad) != 0)


def test_a_block_problem_is_its_own_type():
    """with_corpus_arrays poses a question with its block as a BlockProblem (a plain CDSProblem with its bound
    alone); its block and bound are required; a strategy that cannot use it refuses it; the implicit adjoint
    refuses a payoff stored in another form (it needs a dense game)."""
    z, qs, valid, _ = corpus(12, 16, seed=4, d=8)
    base = core.CDSProblem.create(z, qs[0], valid)
    bound, block = jnp.ones((), jnp.float32), jnp.zeros((16, 16), jnp.float32)
    assert core.with_corpus_arrays(base, None, block) is base
    assert type(core.with_corpus_arrays(base, bound)) is core.CDSProblem
    posed = core.with_corpus_arrays(base, bound, block)
    assert isinstance(posed, core.BlockProblem) and posed.note_block is block and posed.bound is bound
    assert type(posed.dense_problem()) is core.CDSProblem and posed.dense_problem().bound is bound
    assert type(core.with_corpus_arrays(posed, bound)) is core.CDSProblem  # the block dropped
    with pytest.raises(TypeError, match="note_block"):  # no default: a BlockProblem always has its block
        core.BlockProblem(notes=base.notes, queries=base.queries, valid=base.valid, bound=bound)
    with pytest.raises(ValueError, match="bound and note_block"):
        core.BlockProblem.pose(base, None, block)
    with pytest.raises(ValueError, match="note_block must have shape"):
        core.BlockProblem.pose(base, bound, block[:3])
    for strategy in (core.Peel(), core.Support(num_steps=2), core.Shared()):
        with pytest.raises(ValueError, match="cannot use a BlockProblem") as err:
            core.cds(posed, strategy, budget=3, solver=ActiveSet())
        assert "\n" not in str(err.value)
    payoff = core.SharedPayoff(coupling=block, rel=jnp.ones(16, jnp.float32), note_valid=jnp.asarray(valid),
                               alpha=bound, corpus_shift=jnp.zeros((), jnp.float32))
    with pytest.raises(TypeError, match="ImplicitAdjoint"):
        core.equilibrium(payoff, ActiveSet(), adjoint=core.ImplicitAdjoint())


@pytest.mark.slow
def test_a_block_problem_is_solved_by_the_one_equilibrium_which_says_which_solver_ran():
    """The "single" strategy solves a BlockProblem on its block with the same solver and equilibrium as the dense
    path, the result saying which solver gave the point (the fallback where the rule cannot finish), and
    diagnostics saying so."""
    z, qs, valid, _ = corpus(12, 16, seed=4, d=8)
    fn = registry.make_selector("cds_converged", budget=3)
    base = core.CDSProblem.create(z, qs[0], valid)
    posed = core.with_corpus_arrays(base, registry.corpus_bound_fn(fn)(base), registry.corpus_block_fn(fn)(base))
    on_block, dense = fn(posed), fn(posed.dense_problem())
    np.testing.assert_array_equal(np.asarray(on_block.indices), np.asarray(dense.indices))
    assert on_block.result.solver_run == "pdas" and dense.result.solver_run == "active_set"  # dense: the active set
    stuck = core.WithFallback(core.PrimalDualActiveSet(capacities=(2,)), ActiveSet())
    fell = core.cds(posed, core.Single(), options=core.SolveOptions(solver=stuck), budget=3)
    assert fell.result.solvers == ("pdas", "active_set") and int(fell.result.ran) == 1
    np.testing.assert_array_equal(np.asarray(fell.indices), np.asarray(dense.indices))
    d = core.diagnostics(fell)
    assert d["solver"] == "pdas" and d["solver_run"] == "active_set" and d["mode"] == "converged"
    assert core.diagnostics(dense)["solver"] == "active_set"  # the solver that ran on the dense payoff


def test_the_callers_solver_runs_on_the_block_as_given():
    """No solver is swapped for another on the block: replicator dynamics (a caller's choice for the learned game)
    run there with the dense payoff's shift and pick what they pick on the dense payoff."""
    z, qs, valid, _ = corpus(27, 30, seed=5, d=8)
    fn = registry.make_selector("cds_learned", budget=5, params=LearnedParams.paper(), solver=core.Replicator())
    problem = core.CDSProblem.create(z, qs[0], valid)
    posed = core.BlockProblem.pose(problem, fn.corpus_bound(problem), fn.corpus_block(problem))
    dense, on_block = jax.jit(fn)(problem), jax.jit(fn)(posed)
    assert on_block.result.solvers == dense.result.solvers == ("replicator",)
    np.testing.assert_array_equal(np.asarray(on_block.indices), np.asarray(dense.indices))
    np.testing.assert_allclose(np.asarray(on_block.result.x), np.asarray(dense.result.x), atol=1e-5)
