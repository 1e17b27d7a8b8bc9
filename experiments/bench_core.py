"""Paper-mode CDS throughput: jitted, vmapped float32 JAX batch vs a per-query NumPy loop.

Run:
    .venv/bin/python experiments/bench_core.py            # the three (b, n) shapes of the issue
    .venv/bin/python experiments/bench_core.py --quick    # smaller, for a smoke run
    .venv/bin/python experiments/bench_core.py --shared-only --shared-shape 32 512   # only the last section

The last section times converged CDS (the active-set solver) for b questions on ONE corpus two ways:
per question on dense [n+1, n+1] payoffs (jit(vmap(cds_select))) and with the Shared() strategy of
core.cds (the note block once, each question's rows formed on demand, questions solved one after
another), and prints XLA's temporary buffer bytes of each compiled function and the largest
intermediate array each traces.

Everything in one table is measured in one run (machines here are shared and
noisy; compare the ratios, not the absolute numbers). Embeddings are synthetic
clustered unit vectors of dimension 384 (all-MiniLM-L6-v2's width).

Achieved GFLOP/s counts 2 N^2 flops per replicator step per query (one
matrix-vector product, N = n + 1 vertices). "useful" counts each query's own
steps; "executed" counts the steps the vmapped loop actually runs (the batch
runs until its slowest query stops). The matmul peak is a jitted float32
2048 x 2048 jnp.matmul measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from cdsjax import core
from cdsjax.core.compat import cds_select
from cdsjax.io.util import usable_cores


def clustered(rng, b, n, d=384, clusters=12, spread=0.35):
    centers = rng.normal(size=(b, clusters, d))
    labels = rng.integers(0, clusters, size=(b, n))
    z = np.take_along_axis(centers, labels[..., None], axis=1) + spread * np.sqrt(d / 16) * 0.25 * rng.normal(size=(b, n, d))
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    q = z[:, 0] + 0.5 * rng.normal(size=(b, d)) / np.sqrt(d)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return z.astype(np.float32), q.astype(np.float32)


def numpy_cds(notes, query, budget=10, tol=1e-7, max_iter=10_000, eps=1e-3):
    """A straightforward per-query implementation: build M, run the loop, take top-B."""
    n = notes.shape[0]
    w = 1.0 - notes @ notes.T
    np.fill_diagonal(w, 0.0)
    alpha = np.linalg.eigvalsh(w)[-1] + eps
    m = np.zeros((n + 1, n + 1), notes.dtype)
    r = np.maximum(notes @ query, 0.0)
    m[0, 1:] = r
    m[1:, 0] = r
    m[1:, 1:] = w - alpha * np.eye(n, dtype=notes.dtype)
    x = np.full(n + 1, 1.0 / (n + 1), notes.dtype)
    c = max(0.0, -m.min()) + eps
    it = 0
    while it < max_iter:
        mx = m @ x
        new = x * (mx + c) / (x @ mx + c)
        step = np.abs(new - x).sum()
        x = new
        it += 1
        if step < tol:
            break
    top = np.argsort(-x[1:], kind="stable")[:budget]
    return top, it


def matmul_peak(size=2048, reps=10):
    a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), jnp.float32)
    f = jax.jit(lambda u, v: u @ v)
    f(a, a).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        out = f(a, a)
    out.block_until_ready()
    return 2 * size**3 * reps / (time.perf_counter() - t) / 1e9


def matvec_floor(n, steps=4000):
    """Seconds per step of a bare jitted loop ``x <- (M @ x) * 1e-3`` with a float32 ``[n+1, n+1]`` M."""
    size = n + 1
    m = jnp.asarray(np.random.default_rng(1).random((size, size)), jnp.float32)
    x = jnp.full((size,), 1.0 / size, jnp.float32)
    run = jax.jit(lambda m, x: jax.lax.fori_loop(0, steps, lambda i, x: (m @ x) * 1e-3, x))
    run(m, x).block_until_ready()
    dt, _ = seconds_per_call(lambda: run(m, x))
    return dt / steps


def selector_fns(budget):
    """Name -> per-query function (notes, query, valid, links, key) -> Selection, for every selector."""
    fns = {
        "cds (paper mode)": lambda z, q, v, links, key: cds_select(z, q, v, budget=budget),
    }
    try:
        from cdsjax.catalog import DEFAULT_SELECTOR  # the path older trees have too (DESIGN 7.5)
        from cdsjax.core import registry
        from cdsjax.learn import default_params
    except ImportError:
        return fns
    # every baseline, and the default selector (paper mode is timed above)
    for name in [n for n, s in registry.SPECS.items() if s.solver is None] + [DEFAULT_SELECTOR]:
        try:
            fn = registry.make_selector(name, budget=budget, **(
                {"params": default_params()} if registry.SPECS[name].learned else {}))
            fns[name] = lambda z, q, v, links, key, fn=fn: fn(core.CDSProblem.create(z, q, v, links=links), key)
        except ValueError:
            pass
    return fns


def seconds_per_call(f, min_seconds=0.2):
    """Mean wall time of ``f()`` (already warm), repeated until ``min_seconds`` have passed."""
    calls, t = 0, time.perf_counter()
    while True:
        jax.block_until_ready(f())
        calls += 1
        elapsed = time.perf_counter() - t
        if elapsed >= min_seconds:
            return elapsed / calls, calls


def bench_shape(b, n, *, budget, numpy_queries, rng, selectors=None, loop_queries=8, chunk=None):
    notes, queries = clustered(rng, b, n)
    valid = np.ones((b, n), bool)
    links = np.zeros((b, n, n), bool)
    idx = np.arange(n)
    links[:, idx[:-1], idx[1:]] = True  # a reading-order chain for PPR
    links = links | links.transpose(0, 2, 1)
    keys = jax.random.split(jax.random.PRNGKey(0), b)
    # JAX timings exclude the host-to-device copy: the batch and each query's slice are placed first.
    on_device = jax.device_put((notes, queries, valid, links, keys))
    per_query = [jax.device_put((notes[i], queries[i], valid[i], links[i], keys[i])) for i in range(min(b, loop_queries))]

    rows = []
    # per-query NumPy loop on the first few queries (queries/s extrapolates exactly: it is a loop)
    k = min(b, numpy_queries)
    t = time.perf_counter()
    np_iters = [numpy_cds(notes[i], queries[i], budget)[1] for i in range(k)]
    np_qps = k / (time.perf_counter() - t)

    named = (selectors or selector_fns(budget)).items()
    chunks = [(None, "vmap"), ("auto", "auto")] + ([(chunk, f"chunk {chunk}")] if chunk else [])
    variants = [(f"{name} [{label}]", fn, c) for name, fn in named for c, label in chunks]
    for name, fn, chunk_size in variants:
        batched = core.batched(fn, chunk=chunk_size)
        out = batched(*on_device)
        jax.block_until_ready(out)  # compile + warm
        dt, _ = seconds_per_call(lambda: batched(*on_device))
        row = dict(name=name, b=b, n=n, qps=b / dt, seconds=dt)
        # the same selector jitted for one query, called in a Python loop over the first few queries
        single = jax.jit(fn)
        jax.block_until_ready(single(*per_query[0]))
        k_loop = min(b, loop_queries)
        loop_dt, _ = seconds_per_call(
            lambda: [jax.block_until_ready(single(*args)) for args in per_query[:k_loop]])
        row["loop_qps"] = k_loop / loop_dt
        if out.result is not None:
            iters = np.asarray(out.result.num_iters)
            flops_step = 2.0 * (n + 1) ** 2
            row["useful_gflops"] = iters.sum() * flops_step / dt / 1e9
            row["executed_gflops"] = iters.max() * b * flops_step / dt / 1e9
            row["mean_iters"] = float(iters.mean())
            row["converged"] = float((np.asarray(out.result.status) == core.CONVERGED).mean())
        rows.append(row)
    return rows, np_qps, float(np.mean(np_iters)), matvec_floor(n)


def _largest_intermediate(fn, *args):
    """``(shape, bytes)`` of the largest intermediate array in ``fn``'s jaxpr (loops and branches included)."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            found.extend(v.aval for v in eqn.outvars if hasattr(v.aval, "shape"))
            for param in eqn.params.values():
                for inner in param if isinstance(param, (tuple, list)) else (param,):
                    inner = getattr(inner, "jaxpr", inner)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    aval = max(found, key=lambda a: int(np.prod(a.shape)) * a.dtype.itemsize)
    return tuple(aval.shape), int(np.prod(aval.shape)) * aval.dtype.itemsize


def bench_shared(b, n, *, budget, rng):
    """Converged CDS for ``b`` questions on one corpus: dense per-question payoffs vs the shared strategy."""
    notes, queries = clustered(rng, b, n)
    notes = notes[0]
    valid = np.ones(n, bool)
    dense = jax.jit(jax.vmap(lambda q: cds_select(notes, q, valid, budget=budget, solver=core.ActiveSet())))
    shared = jax.jit(lambda q: core.cds(core.CDSProblem.create(notes, q, valid), core.Shared(), budget=budget,
                                        solver=core.ActiveSet()))
    rows = []
    for label, fn in (("dense per question (jit(vmap(cds_select)))", dense), ("shared corpus (cds(..., Shared()))", shared)):
        compiled = fn.lower(queries).compile()
        memory = compiled.memory_analysis()
        temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
        out = fn(queries)
        jax.block_until_ready(out)
        dt, _ = seconds_per_call(lambda: fn(queries))
        shape, nbytes = _largest_intermediate(fn, queries)
        rows.append(dict(label=label, out=out, seconds=dt, temp=temp, shape=shape, nbytes=nbytes))
    same = float(np.mean(np.all(np.asarray(rows[0]["out"].indices) == np.asarray(rows[1]["out"].indices), axis=1)))
    dx = float(np.max(np.abs(np.asarray(rows[0]["out"].result.x) - np.asarray(rows[1]["out"].result.x))))
    print()
    print(f"Converged CDS (active set), b = {b} questions on one corpus of n = {n} notes, budget {budget}:")
    print("| path | seconds per batch | q/s | XLA temp buffers (MB) | largest intermediate | its size (MB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        temp = "n/a" if r["temp"] is None else f"{r['temp'] / 1e6:.1f}"
        print(f"| {r['label']} | {r['seconds']:.3g} | {b / r['seconds']:.1f} | {temp} | {list(r['shape'])} | "
              f"{r['nbytes'] / 1e6:.2f} |")
    print(f"same selections: {same:.0%} of questions; max |x_dense - x_shared| = {dx:.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes for a smoke run")
    parser.add_argument("--budget", type=int, default=10)
    parser.add_argument("--numpy-queries", type=int, default=4, help="queries timed in the NumPy loop per shape")
    parser.add_argument("--cds-only", action="store_true", help="only CDS paper mode (skip the baselines)")
    parser.add_argument("--selectors", help="comma-separated subset of the table's selector names")
    parser.add_argument("--shape", type=int, nargs=2, action="append", metavar=("B", "N"),
                        help="a (b, n) shape to run instead of the defaults (repeatable)")
    parser.add_argument("--loop-queries", type=int, default=8, help="queries timed in the per-query JAX loop")
    parser.add_argument("--chunk", type=int, help="also time each selector batched in fixed chunks of this many queries")
    parser.add_argument("--shared-shape", type=int, nargs=2, metavar=("B", "N"),
                        help="(b, n) of the shared-corpus section (default 32 512; --quick: 8 64)")
    parser.add_argument("--shared-only", action="store_true", help="only the shared-corpus section")
    args = parser.parse_args()
    shared_shape = tuple(args.shared_shape) if args.shared_shape else ((8, 64) if args.quick else (32, 512))
    if args.shared_only:
        bench_shared(*shared_shape, budget=args.budget, rng=np.random.default_rng(0))
        return
    shapes = [(1, 32), (8, 64), (4, 128)] if args.quick else [(1, 64), (64, 256), (16, 1024)]
    shapes = [tuple(s) for s in args.shape] if args.shape else shapes
    rng = np.random.default_rng(0)
    peak = matmul_peak()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; float32 jnp.matmul peak: {peak:.1f} GFLOP/s")
    selectors = {"cds (paper mode)": selector_fns(args.budget)["cds (paper mode)"]} if args.cds_only else None
    if args.selectors:
        wanted = args.selectors.split(",")
        selectors = {k: v for k, v in selector_fns(args.budget).items() if k in wanted}
        if set(wanted) - set(selectors):
            parser.error(f"unknown or unavailable selectors: {sorted(set(wanted) - set(selectors))}")
    cores = usable_cores()
    ceilings = []
    print()
    print("| selector | (b, n) | JAX batch q/s | JAX per-query loop q/s | batch/loop | NumPy CDS loop q/s | ratio | mean steps | converged | useful GFLOP/s | executed GFLOP/s | % of matmul peak (executed) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b, n in shapes:
        rows, np_qps, np_iters, floor = bench_shape(b, n, budget=args.budget, numpy_queries=args.numpy_queries,
                                             rng=rng, selectors=selectors, loop_queries=args.loop_queries,
                                             chunk=args.chunk)
        for r in rows:
            extra = ("| {mean_iters:.0f} | {converged:.0%} | {useful_gflops:.2f} | {executed_gflops:.2f} | {pct:.1f}% |"
                     .format(pct=100 * r["executed_gflops"] / peak, **r)) if "mean_iters" in r else "| – | – | – | – | – |"
            ratio = r["qps"] / np_qps
            loop = f"{r['loop_qps']:.1f} | {r['qps'] / r['loop_qps']:.1f}x"
            print(f"| {r['name']} | ({b}, {n}) | {r['qps']:.1f} | {loop} | {np_qps:.2f} | {ratio:.1f}x {extra}")
        print(f"|  | ({b}, {n}) NumPy loop mean steps: {np_iters:.0f} | | | | | | | | | | |")
        np_step = 1.0 / np_qps / np_iters
        ceilings.append(f"({b}, {n}): NumPy {np_step * 1e6:.2f} us/step (setup included), bare [{n + 1}, {n + 1}] "
                        f"matvec {floor * 1e6:.2f} us/step -> ceiling {np_step / floor:.1f}x on one core, "
                        f"{cores * np_step / floor:.1f}x with all {cores} cores busy")
    print()
    print("Ceiling on the ratio for per-query payoffs (one matrix-vector product per step):")
    for line in ceilings:
        print("  " + line)
    bench_shared(*shared_shape, budget=args.budget, rng=rng)


if __name__ == "__main__":
    main()
