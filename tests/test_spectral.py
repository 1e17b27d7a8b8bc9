"""The penalty without a per-question eigendecomposition (cdsjax.core.games): the corpus bound is the
per-question bound bit for bit; the certified bound is never below float64 eigvalsh and tight on CDS blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core.games.learned import LearnedParams, learned_affinity
from cdsjax.core.games.affinity import corpus_bound
from cdsjax.core.games.certified import certified_bound, gershgorin
from cdsjax.core.games.learned import learned_corpus_bound, learned_is_corpus_level
from tests.conftest import clustered_notes

SHIPPED = LearnedParams(beta=0.03, w_page=-1.0)


def corpus(n, size, seed=0, d=48, clusters=6):
    """Clustered unit vectors (a corpus of a few topics), padded to ``size``, and the page of each note."""
    rng = np.random.default_rng(seed)
    z = clustered_notes(rng, n, size, d, clusters)
    q = z[: 3].sum(0) + rng.normal(size=d)
    return (z.astype(np.float32), (q / np.linalg.norm(q)).astype(np.float32), np.arange(size) < n,
            (np.arange(size) // 5).astype(np.int32))


@pytest.mark.parametrize("n,size", [(20, 32), pytest.param(45, 64, marks=pytest.mark.slow),
                                    pytest.param(100, 128, marks=pytest.mark.slow)])
def test_corpus_bound_is_the_per_question_penalty_bit_for_bit(n, size):
    z, q, valid, _ = corpus(n, size, seed=n)
    for params in (core.CDSParams(), core.CDSParams(beta=0.3), core.CDSParams(coupling="similarity", beta=0.5)):
        bound = jax.jit(lambda z, v, p=params: corpus_bound(z, v, p))(z, valid)
        per_question = jax.jit(lambda z, q, v, p=params: build_affinity(z, q, v, p).alpha)
        assert np.asarray(bound).tobytes() == np.asarray(per_question(z, q, valid)).tobytes()
        # a batch of questions on the corpus (vmap, as the evaluation runs them) sees the same number
        qs = np.stack([q, z[0], z[1]])
        batch = jax.jit(jax.vmap(per_question, in_axes=(None, 0, None)))(z, qs, valid)
        assert set(np.asarray(batch).tobytes()[i:i + 4] for i in range(0, 12, 4)) == {np.asarray(bound).tobytes()}
    two = corpus_bound(z, valid, num_queries=2)
    assert np.asarray(two).tobytes() == np.asarray(build_affinity(z, np.stack([q, z[0]]), valid).alpha).tobytes()


def test_corpus_bound_refuses_a_question_dependent_penalty():
    z, _, valid, _ = corpus(10, 16)
    with pytest.raises(ValueError, match="alpha_from='free'"):
        corpus_bound(z, valid, core.CDSParams(alpha_from="full"))
    assert learned_is_corpus_level(SHIPPED) and not learned_is_corpus_level(SHIPPED.replace(rel_repulsion=0.5))
    # traced parameters would take another path than eager ones: refused, not decided silently
    with pytest.raises(TypeError, match="rel_repulsion"):
        jax.jit(lambda theta: core.Single().corpus_bound(core.CDSProblem.create(z, z[0], valid), theta))(SHIPPED)


@pytest.mark.slow
def test_learned_corpus_bound_is_the_per_question_bound_bit_for_bit():
    z, q, valid, pages = corpus(70, 128, seed=3)
    for theta in (SHIPPED, SHIPPED.replace(alpha_factor=1.5), LearnedParams.paper()):
        bound = jax.jit(lambda z, v, p, t=theta: learned_corpus_bound(z, v, t, pages=p))(z, valid, pages)
        plain = learned_affinity(z, q, valid, theta.replace(alpha_factor=1.0), pages=pages).alpha
        assert np.asarray(bound).tobytes() == np.asarray(plain).tobytes()
    # with relevance-weighted repulsion the block reads the question: the corpus bound is an upper bound
    theta = SHIPPED.replace(rel_repulsion=1.0)
    bound = float(learned_corpus_bound(z, valid, theta, pages=pages))
    for query in (q, z[0], z[40]):
        aff = learned_affinity(z, query, valid, theta, pages=pages)
        free = np.asarray(aff.free)
        lam = np.linalg.eigvalsh(np.asarray(aff.matrix, np.float64)[np.ix_(free, free)])[-1]
        assert bound >= lam + 1e-3 - 1e-6


@pytest.mark.slow
def test_a_problem_carrying_its_bound_selects_bit_for_bit_as_without():
    """cds() on a problem with its strategy's corpus bound (strategy.corpus_bound) == the same problem computing
    it per question, for the paper game's strategies and the learned game; the registry's selectors supply it."""
    from cdsjax.core.registry import corpus_bound_fn

    z, q, valid, pages = corpus(40, 64, seed=7)
    problem = core.CDSProblem.create(z, q, valid, pages=pages)
    for strategy, params in ((core.Single(), core.CDSParams()), (core.Peel(), core.CDSParams(beta=0.3)),
                             (core.Support(), core.CDSParams()), (core.Single(), SHIPPED)):
        with_bound = problem.replace(bound=strategy.corpus_bound(problem, params))
        a = core.cds(problem, strategy, params, budget=5)
        b = core.cds(with_bound, strategy, params, budget=5)
        assert np.asarray(a.indices).tobytes() == np.asarray(b.indices).tobytes(), strategy
        assert np.asarray(a.scores).tobytes() == np.asarray(b.scores).tobytes(), strategy
    assert core.Single().corpus_bound(problem, core.CDSParams(alpha_from="full")) is None
    # its penalty stays per question
    assert core.Single().corpus_bound(problem, SHIPPED.replace(rel_repulsion=1.0)) is None
    assert core.Support().corpus_bound(problem, SHIPPED) is None  # each step rebuilds the learned affinity
    assert core.Shared().corpus_bound(problem, core.CDSParams()) is None
    assert corpus_bound_fn(core.make_selector("cosine", budget=3)) is None
    fn = core.make_selector("cds_converged", budget=3)
    assert float(corpus_bound_fn(fn)(problem)) == float(core.Single().corpus_bound(problem, core.CDSParams()))


def test_certified_option_keeps_the_guarantee_for_question_dependent_penalties():
    z, q, valid, _ = corpus(40, 64, seed=8)
    exact = build_affinity(z, q, valid, core.CDSParams(alpha_from="full"))
    cert = build_affinity(z, q, valid, core.CDSParams(alpha_from="full", alpha_bound="certified"))
    lam = np.linalg.eigvalsh(np.asarray(exact.matrix, np.float64))[-1]
    assert float(cert.alpha) >= lam + 1e-3 and float(cert.alpha) <= float(exact.alpha) * (1 + 1e-3)
    sel = core.cds(core.CDSProblem.create(z, q, valid), core.Peel(), core.CDSParams(alpha_bound="certified"), budget=5,
                   solver=core.ActiveSet())
    assert int(sel.result.status) == 0 and int(np.sum(sel.selected_valid)) == 5
    with pytest.raises(ValueError, match="alpha_bound"):
        core.CDSParams(alpha_bound="approx").check()


@pytest.mark.slow
def test_run_selector_computes_one_bound_per_corpus():
    """The evaluation's batches: questions on one document share its bound (one computation, from the run's
    CorpusArrays), and the selections are those of the per-question penalty, bit for bit (paper mode: the bound
    alone, no note block)."""
    from cdsjax.eval import run as R
    from cdsjax.eval.problems import Problem
    from cdsjax.io.datasets import Query
    from cdsjax.pipeline.selection import CorpusArrays

    docs = [corpus(n, n, seed=n) for n in (20, 27)]
    rng = np.random.default_rng(0)
    problems = []
    for k in range(6):
        z, _, _, pages = docs[k % 2]
        q = rng.normal(size=z.shape[1])
        problems.append(Problem(Query(qid=f"q{k}", question="", answer="", doc_ids=(f"d{k % 2}",)), z,
                                (q / np.linalg.norm(q)).astype(np.float32), np.zeros((len(z), len(z)), bool),
                                [f"n{i}" for i in range(len(z))], [f"d{k % 2}"] * len(z), pages=list(pages)))
    spec = core.SPECS["cds"]
    fn = core.make_selector("cds", budget=4, max_iter=300)
    concrete = []

    def counting(f, role):
        inner = R.OneCoreJit.of(f, role)

        def call(problem):
            concrete.append((role, not isinstance(problem.notes, jax.core.Tracer)))
            return inner(problem)

        return call

    with_bound = R.run_selector(fn, problems, buckets=(32,), max_batch=4, spec=spec, chunk=R.batch_chunk(fn),
                                corpus=CorpusArrays(wrap=counting))
    assert concrete.count(("bound", True)) == 2  # two documents, six questions in two chunks
    plain = R.run_selector(fn, problems, buckets=(32,), max_batch=4, spec=spec, chunk=R.batch_chunk(fn),
                           corpus=CorpusArrays(wrap=lambda f, role: lambda problem: None))  # the per-question penalty
    for a, b in zip(with_bound, plain):
        assert np.asarray(a.indices).tobytes() == np.asarray(b.indices).tobytes()
        assert np.asarray(a.scores).tobytes() == np.asarray(b.scores).tobytes()


def blocks(seed):
    """Symmetric test matrices: Gaussian (no separated top eigenvalue), CDS note blocks (paper and the
    shipped learned game's same-page weight), a query-augmented matrix (alpha_from='full'), a negative one."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in (7, 60, 200):
        a = rng.normal(size=(n, n))
        out[f"gauss{n}"] = (a + a.T) / 2
        z, q, valid, pages = corpus(n, n, seed=seed + n)
        w = 1.0 - z.astype(np.float64) @ z.T.astype(np.float64)
        np.fill_diagonal(w, 0.0)
        out[f"paper{n}"] = w
        learned = 0.03 * w - (pages[:, None] == pages[None, :])
        np.fill_diagonal(learned, 0.0)
        out[f"learned{n}"] = learned
        rel = np.maximum(z @ q, 0.0)
        full = np.zeros((n + 1, n + 1))
        full[0, 1:] = full[1:, 0] = rel
        full[1:, 1:] = w
        out[f"full{n}"] = full
        out[f"negative{n}"] = -np.abs(learned) - np.eye(n)
    return out


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
@pytest.mark.parametrize("seed", [0, 1])
def test_certified_bound_is_never_below_the_float64_eigenvalue(seed):
    rng = np.random.default_rng(seed)
    fn = jax.jit(certified_bound, static_argnames=("eps", "steps"))
    for name, a in blocks(seed).items():
        for mask in (np.ones(len(a), bool), rng.random(len(a)) < 0.7):
            lam = np.linalg.eigvalsh(a[np.ix_(mask, mask)])[-1] if mask.any() else -np.inf
            bound = float(fn(jnp.asarray(a, jnp.float32), jnp.asarray(mask), eps=1e-3))
            assert bound >= lam + 1e-3, (name, bound, lam)
            assert bound <= float(gershgorin(jnp.asarray(a), jnp.asarray(mask))) + 1e-3 + 1e-3 * abs(lam) + 1e-5
            if name.startswith(("paper", "full")) and len(a) > 50:
                # the CDS note block's Perron eigenvalue stands clear of the rest: the bound is tight
                assert bound - 1e-3 - lam <= 2e-3 * abs(lam), (name, bound, lam)
    assert float(certified_bound(jnp.eye(4), jnp.zeros(4, bool), 1e-3)) == pytest.approx(1e-3)


@pytest.mark.slow
@pytest.mark.x64
def test_certified_bound_in_float64_holds_any_test_vector():
    a = blocks(2)["learned200"]
    lam = np.linalg.eigvalsh(a)[-1]
    mask = jnp.ones(len(a), bool)
    for v in (None, np.ones(len(a)), np.random.default_rng(0).normal(size=len(a))):
        bound = float(certified_bound(jnp.asarray(a), mask, 0.0, vector=v))
        assert bound >= lam


@pytest.mark.slow
def test_gathered_newton_matches_the_dense_system():
    """ActiveSet(gather=K) solves the face's Newton system on the gathered support (O(K³ + KN)); with a
    support that fits it reaches the same equilibrium as the dense system, and one that does not fit
    falls back to the dense system."""
    from cdsjax.core.solvers.active_set import ActiveSet
    from cdsjax.core.games.payoff import DensePayoff
    from cdsjax.core.solvers.loop import iterate

    z, q, valid, pages = corpus(100, 128, seed=5)
    aff = learned_affinity(z, q, valid, SHIPPED, pages=pages)
    payoff = DensePayoff.from_affinity(aff)
    run = jax.jit(lambda p, k: iterate(ActiveSet(gather=k), p, None), static_argnums=1)
    dense = run(payoff, None)
    support = int(np.sum(np.asarray(dense.x) > 0))
    assert 1 < support < 64 and int(dense.status) == core.CONVERGED
    for k in (64, 2):  # fits; does not fit (the dense system)
        res = run(payoff, k)
        assert int(res.status) == core.CONVERGED
        np.testing.assert_allclose(np.asarray(res.x), np.asarray(dense.x), atol=1e-5)
