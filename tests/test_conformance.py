"""Conformance of every registered selector, and the solvers' status codes.

For each selector in ``core.SPECS`` (baselines and every CDS solver) and the two experiment games
(``experiments/page_and_sparse_games.py``), with and without
``jit``, in float32 and float64: jit equals eager, trailing padding changes nothing, and
``vmap`` over a padded batch equals per-question calls on the unpadded problems. The default run
has the jit variants (which also compare with eager) in float32 for every selector and in float64 for all but
``F64_SLOW``; the rest run with the slow tests (``-m slow``). The
precision is set locally (``jax.enable_x64``), so these tests do not depend on the
suite's global setting.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id
from cdsjax.core.compat import cds_peel, cds_select, cds_support
from cdsjax.core.games.affinity import build_affinity
from cdsjax.core.solvers.loop import iterate
from cdsjax.core.types import MAX_STEPS, NONFINITE, SINGULAR, STATUSES
from cdsjax.learn import default_params
from tests.conftest import on_arrays
from cdsjax.core.games.payoff import DensePayoff
from experiments.page_and_sparse_games import SPECS as GAMES

BUDGET = 3
PADDED = 8
SIZES = (6, 4)
DTYPES = {"float32": (np.float32, False), "float64": (np.float64, True)}
# every option at its default; cds_support's bisection is kept short to stay fast
# the learned selector's parameters are a value the caller supplies: the shipped fit (read by cdsjax.learn)
OPTIONS = {"cds_support": {"num_steps": 4}, "cds_learned": {"params": default_params()},
           "cds_learned_pages": {"params": default_params()}, "cds_learned_sparse": {"params": default_params()}}
# every selector: the registry's and the experiment games
ALL_SPECS = {**core.SPECS, **GAMES}
# the selectors that need the notes' pages (the page rule, the per-page read-outs, the page game)
NEEDS_PAGES = ("cosine_pages", "mmr_pages", "dpp_pages", "cds_pages", "cds_learned_pages")


def problem(seed, n, dtype):
    rng = np.random.default_rng(seed)
    notes = rng.normal(size=(n, 6))
    notes /= np.linalg.norm(notes, axis=1, keepdims=True)
    query = notes[0] + 0.5 * rng.normal(size=6)
    query /= np.linalg.norm(query)
    links = rng.random((n, n)) < 0.3
    return notes.astype(dtype), query.astype(dtype), links


def pad(notes, links, size, seed):
    """Trailing padding filled with junk: padded notes and links must not matter."""
    rng = np.random.default_rng(seed)
    n = notes.shape[0]
    junk = rng.normal(size=(size - n, notes.shape[1])).astype(notes.dtype)
    padded_links = rng.random((size, size)) < 0.5
    padded_links[:n, :n] = links
    return np.concatenate([notes, junk]), padded_links, np.arange(size) < n


def assert_same(a, b, rtol):
    np.testing.assert_array_equal(np.asarray(a.selected_valid), np.asarray(b.selected_valid))
    ok = np.asarray(a.selected_valid)
    np.testing.assert_array_equal(np.asarray(a.indices)[ok], np.asarray(b.indices)[ok])
    np.testing.assert_allclose(np.asarray(a.scores), np.asarray(b.scores), rtol=rtol, atol=rtol)


# Variants of one CDS solver path whose float64 run repeats what `cds` and `cds_learned` check in float64 (the same
# solvers, padding and vmap code; each compiles four executables, ~10 s on 2 cores): their float32 run stays in the
# default suite, their float64 run goes with the slow tests.
F64_SLOW = ("cds_converged", "cds_inimdyn", "cds_support", "cds_pages", "cds_learned_pages", "cds_learned_sparse")


def _conformance_cases():
    assert set(F64_SLOW) <= set(ALL_SPECS), set(F64_SLOW) - set(ALL_SPECS)  # a renamed selector is not skipped unseen
    for name in sorted(ALL_SPECS):
        for dtype_name in sorted(DTYPES):
            slow_dtype = dtype_name == "float64" and name in F64_SLOW
            for use_jit in (True, False):
                # the eager variant is slow (10 000 eager replicator steps); the jit variant also compares with eager
                marks = [pytest.mark.slow] if (slow_dtype or not use_jit) else []
                yield pytest.param(name, use_jit, dtype_name, marks=marks,
                                   id=f"{name}-{'jit' if use_jit else 'eager'}-{dtype_name}")


@pytest.mark.slow
@pytest.mark.parametrize("name, use_jit, dtype_name", list(_conformance_cases()))
def test_selector_conformance(name, use_jit, dtype_name):
    dtype, x64 = DTYPES[dtype_name]
    rtol = 1e-4 if dtype is np.float32 else 1e-9
    with jax.enable_x64(x64):
        fn = on_arrays(ALL_SPECS[name].make(BUDGET, **OPTIONS.get(name, {})))
        if name in NEEDS_PAGES:  # its pages: three per problem, padding on pages too
            plain = fn
            fn = lambda z, q, v, l, k: plain(z, q, v, l, k, pages=jnp.arange(z.shape[0]) % 3)  # noqa: E731
        run = jax.jit(fn) if use_jit else fn
        key = key_from_query_id(f"{name}-q")
        problems = [problem(seed, n, dtype) for seed, n in enumerate(SIZES)]

        # one question, unpadded
        notes, query, links = problems[0]
        alone = run(notes, query, np.ones(len(notes), bool), links, key)
        assert alone.indices.shape == (BUDGET,) and alone.indices.dtype == jnp.int32
        if alone.result is not None:
            assert alone.result.x.dtype == dtype
            assert int(alone.result.status) == core.CONVERGED
        if use_jit:  # jit equals eager
            assert_same(fn(notes, query, np.ones(len(notes), bool), links, key), alone, rtol)

        # trailing padding (filled with junk) changes nothing
        padded = [pad(notes, links, PADDED, seed) for seed, (notes, _, links) in enumerate(problems)]
        singles = [run(notes_p, query, valid_p, links_p, key)
                   for (notes_p, links_p, valid_p), (_, query, _) in zip(padded, problems)]
        assert_same(singles[0], alone, rtol)

        # vmap over the padded batch equals the per-question calls
        batch = [np.stack(column) for column in zip(*padded)]
        queries = np.stack([query for _, query, _ in problems])
        keys = jnp.stack([key] * len(problems))
        vmapped = jax.vmap(fn)
        out = (jax.jit(vmapped) if use_jit else vmapped)(batch[0], queries, batch[2], batch[1], keys)
        for i, sel in enumerate(singles):
            assert_same(jax.tree.map(lambda leaf: leaf[i], out.replace(result=None)), sel.replace(result=None), rtol)


def cds_payoff(dtype, n=8, seed=0):
    notes, query, _ = problem(seed, n, dtype)
    return DensePayoff.from_affinity(build_affinity(notes, query, np.ones(n, bool)))


SOLVERS = {
    "replicator": core.Replicator(),
    "inimdyn": core.InImDyn(),
    "active_set": core.ActiveSet(),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_status_converged_step_cap_and_nonfinite(solver, dtype_name):
    dtype, x64 = DTYPES[dtype_name]
    config = SOLVERS[solver]
    with jax.enable_x64(x64):
        payoff = cds_payoff(dtype)
        done = jax.jit(iterate, static_argnums=0)(config, payoff)
        assert int(done.status) == core.CONVERGED

        capped = iterate(config.replace(max_iter=1, tol=0.0), payoff)
        assert int(capped.status) == MAX_STEPS
        assert int(capped.num_iters) == 1

        nan = payoff.replace(matrix=payoff.matrix.at[2, 3].set(jnp.nan))
        broken = iterate(config, nan)
        assert int(broken.status) == NONFINITE


@pytest.mark.slow
def test_status_nonfinite_from_nan_embeddings_through_selectors():
    notes, query, links = problem(1, 8, np.float32)
    notes[3, 0] = np.nan
    for name in ("cds", "cds_converged", "cds_inimdyn"):
        sel = on_arrays(core.make_selector(name, budget=BUDGET))(notes, query, np.ones(8, bool), links, None)
        assert int(sel.result.status) == NONFINITE, name
        assert STATUSES[int(sel.result.status)] == "nonfinite"


@pytest.mark.slow
def test_status_singular_newton_system():
    # On the support {0, 1, 2} the bordered system [[M, -1], [1, 0]] has rank 3 < 4: the Newton
    # direction from the uniform start is NaN; that point is not a KKT point, so the step cap ends it.
    payoff = DensePayoff.of(jnp.asarray([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], jnp.float32))
    capped = iterate(core.ActiveSet(tol=1e-6, max_iter=1), payoff)
    assert int(capped.status) == SINGULAR
    # the vertex steps that follow still reach the equilibrium (1/2, 1/2, 0): converged wins
    done = iterate(core.ActiveSet(tol=1e-6), payoff)
    assert int(done.status) == core.CONVERGED
    np.testing.assert_allclose(np.asarray(done.x), [0.5, 0.5, 0.0], atol=1e-6)


@pytest.mark.slow
def test_peel_status_is_the_first_unconverged_round():
    notes, _, _ = problem(2, 10, np.float64)
    queries = notes[:2] + 0.1
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    capped = cds_peel(notes, queries, np.ones(10, bool), budget=4, max_iter=2)
    assert int(capped.result.status) == MAX_STEPS
    done = cds_peel(notes, queries, np.ones(10, bool), budget=4, solver=core.ActiveSet())
    assert int(done.result.status) == core.CONVERGED


@pytest.mark.slow
def test_beta_and_tau_are_leaves_a_sweep_does_not_recompile():
    notes, query, links = problem(3, 8, np.float32)
    traces = []

    def select(params):
        traces.append(1)
        return cds_select(notes, query, np.ones(8, bool), budget=BUDGET, params=params, solver=core.ActiveSet())

    run = jax.jit(select)
    for beta, tau in ((1.0, 0.0), (0.5, 0.1), (0.1, 0.2)):
        run(core.CDSParams(beta=jnp.float32(beta), tau=jnp.float32(tau)))
    assert len(traces) == 1


def test_solve_options_are_one_object_shared_by_the_selectors():
    notes, query, _ = problem(4, 9, np.float64)
    options = core.SolveOptions(solver=core.ActiveSet(), threshold=1e-4, fill=False)
    valid = np.ones(9, bool)
    a = cds_select(notes, query, valid, budget=BUDGET, options=options)
    b = cds_select(notes, query, valid, budget=BUDGET, solver=core.ActiveSet(), threshold=1e-4, fill=False)
    assert_same(a, b, 0.0)
    with pytest.raises(TypeError, match="colour"):
        cds_select(notes, query, valid, budget=3, colour="red")
    with pytest.raises(TypeError, match="warm_start"):  # a warm start is a solver (WarmStart), not an option
        cds_support(notes, query, valid, budget=3, warm_start=core.Replicator())
