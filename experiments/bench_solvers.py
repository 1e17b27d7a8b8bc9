"""Paper mode vs converged mode, and shared-corpus batch throughput.

Run:
    .venv/bin/python experiments/bench_solvers.py                 # full run (~15 min on 2 busy cores)
    .venv/bin/python experiments/bench_solvers.py --quick         # smoke run: small n, no MiniLM
    .venv/bin/python experiments/bench_solvers.py --json out.json # also write every measured number

Part 1 (float64), for n in {64, 256, 1024} notes, on synthetic clustered
embeddings (d = 384) and on real notes: page-text chunks (~1000 characters) of
the MMLongBench-Doc PDFs in ../shared/data/mmlongbench, embedded with the
packaged all-MiniLM-L6-v2, with that benchmark's questions as queries. A real
corpus for a question is its own document's chunks, followed by the next
documents' chunks until it holds n notes (an index over a folder of PDFs).
  * steps and wall time to reach KKT residual <= 1e-8: replicator dynamics (the
    paper's update, run in jitted chunks of steps from the uniform start, capped
    at --rep-cap steps or --rep-budget seconds, whichever comes first: a capped
    entry is a lower bound and marked ">=") and each converged solver (tol=1e-8);
  * paper mode (tol 1e-7, 10,000 steps): share of queries whose L1 stopping rule
    fires within 10,000 steps, share whose KKT residual is <= 1e-8, median KKT;
  * top-10 overlap between paper-mode and converged (KKT <= 1e-10) selections.
Part 2 (float32, production dtype): paper mode for 64 questions on one corpus
of n = 1024 notes: the per-question path (jitted cds_select, one question
at a time: its own affinity, eigenvalue problem and matrix-vector steps) vs the
shared-corpus path (cds_select_shared: W and alpha once, one [64, n] @ [n, n]
product per step). The per-question path runs on --per-question-sample questions
and its 64-question time is extrapolated (marked). Achieved GFLOP/s counts
2 N^2 flops per replicator step per question (N = n + 1), each question's own
steps ("useful"); the peak is the best jnp.matmul rate over float32 products
(1024^3, 2048^3 and the [64, 1024] @ [1024, 1024] product itself, each best of
several repeats, and that product repeated in a jitted loop), measured in the
same run. Times exclude compilation;
converged solvers are timed best of 3.
"""

from __future__ import annotations

import os

# LAPACK calls (eigvalsh, the active-set solver's linear solves) go through
# scipy's OpenBLAS; on a few oversubscribed cores its spinning threads made a
# 258 x 258 float64 solve take ~400 ms instead of ~1 ms. One thread each.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cdsjax import core  # noqa: E402
from cdsjax.core.compat import cds_select, cds_select_shared  # noqa: E402
from cdsjax.core.games.affinity import build_affinity  # noqa: E402
from cdsjax.core.solvers.options import solve  # noqa: E402
from cdsjax.core.games.payoff import prepare_x0, replicator_shift  # noqa: E402
from cdsjax.core.strategies.shared import corpus_affinity, question_relevance, solve_replicator_shared  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "mmlongbench"
TARGET = 1e-8
CONVERGED = ("inimdyn", "active_set")


# ----------------------------------------------------------------------------- data


def synthetic(rng, n, d=384, clusters=12, noise=1.0):
    """Clustered unit vectors (MiniLM width) and a query near one cluster.

    With per-coordinate noise ``noise`` around standard-normal centres, two notes of
    one cluster have cosine about ``1 / (1 + noise**2)`` (0.5), of two clusters about 0.
    """
    centres = rng.normal(size=(clusters, d))
    z = centres[rng.integers(clusters, size=n)] + noise * rng.normal(size=(n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = centres[rng.integers(clusters)] + noise * rng.normal(size=d)
    return z, q / np.linalg.norm(q)


def page_chunks(pdf: pathlib.Path, size=1000, overlap=100):
    """Plain page-text chunks of one PDF (pymupdf text, recursive character splitting)."""
    import pymupdf
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(chunk_size=size, chunk_overlap=overlap)
    chunks = []
    with pymupdf.open(pdf) as doc:
        for page in doc:
            text = page.get_text("text").strip()
            if text:
                chunks.extend(c for c in splitter.split_text(text) if c.strip())
    return chunks


class RealNotes:
    """MMLongBench-Doc questions with MiniLM embeddings of their documents' chunks (cached)."""

    def __init__(self, cache: pathlib.Path):
        from cdsjax.io.embed import Embedder
        from cdsjax.io.index import default_config

        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)
        self.embedder = Embedder(default_config())
        samples = json.loads((DATA / "samples.json").read_text())
        self.docs = sorted({s["doc_id"] for s in samples if (DATA / "documents" / s["doc_id"]).is_file()})
        first = {}
        for s in samples:
            first.setdefault(s["doc_id"], s["question"])
        self.first_question = first
        self.samples = [s for s in samples if s["doc_id"] in set(self.docs)]
        self._emb = {}

    def doc_embeddings(self, doc: str) -> np.ndarray:
        if doc not in self._emb:
            path = self.cache / (doc.replace("/", "_") + ".npy")
            if path.is_file():
                self._emb[doc] = np.load(path)
            else:
                chunks = page_chunks(DATA / "documents" / doc)
                emb = self.embedder.encode_documents(chunks, show_progress=False) if chunks else np.zeros((0, 384))
                np.save(path, emb)
                self._emb[doc] = emb
        return self._emb[doc]

    def corpus(self, start: int, n: int) -> np.ndarray:
        """``n`` chunk embeddings: document ``start`` first, then the following documents."""
        parts, total, k = [], 0, start
        while total < n:
            emb = self.doc_embeddings(self.docs[k % len(self.docs)])
            parts.append(emb)
            total += len(emb)
            k += 1
        return np.concatenate(parts)[:n].astype(np.float64)

    def question(self, start: int) -> np.ndarray:
        q = self.embedder.encode_queries([self.first_question[self.docs[start % len(self.docs)]]])[0]
        return q.astype(np.float64)

    def questions(self, count: int) -> np.ndarray:
        return self.embedder.encode_queries([s["question"] for s in self.samples[:count]])


# ----------------------------------------------------------------------------- timing helpers


def timed(fn, *args, repeats=1):
    """Runs ``fn`` once to compile, then ``repeats`` times; returns (output, best seconds)."""
    jax.block_until_ready(fn(*args))
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return out, best


@functools.partial(jax.jit, static_argnames=("chunk",))
def _replicator_chunk(affinity, x, chunk):
    """``chunk`` replicator steps; returns the new x and the first step (1-based) with KKT <= TARGET, or 0."""
    payoff = affinity.payoff()
    valid = affinity.valid
    c = replicator_shift(payoff, valid)

    def body(k, state):
        x, hit = state
        mx = payoff @ x
        f = x @ mx
        kkt = jnp.max(jnp.where(valid, jnp.abs(jnp.minimum(x, -(mx - f))), 0.0))
        hit = jnp.where((hit == 0) & (kkt <= TARGET), k + 1, hit)
        x_new = x * (mx + c) / (f + c)
        return jnp.where(hit == 0, x_new, x), hit

    return jax.lax.fori_loop(0, chunk, body, (x, jnp.asarray(0, jnp.int32)))


def replicator_to_target(affinity, cap: int, budget_s: float, chunk: int = 10_000):
    """Steps and seconds for replicator dynamics (uniform start) to reach KKT <= TARGET.

    The hit step counts the steps taken before the point that satisfies the
    target. Returns ``(steps, seconds, reached)``; when not reached, the steps
    and time spent when the cap or the time budget stopped it.
    """
    x = prepare_x0(None, affinity.valid, affinity.matrix.dtype)
    jax.block_until_ready(_replicator_chunk(affinity, x, chunk))  # compile
    steps, elapsed = 0, 0.0
    while steps < cap and elapsed < budget_s:
        t0 = time.perf_counter()
        x, hit = jax.block_until_ready(_replicator_chunk(affinity, x, chunk))
        dt = time.perf_counter() - t0
        hit = int(hit)
        if hit:
            # Charge only the steps taken before the hit (the chunk's time is pro-rated).
            return steps + hit - 1, elapsed + dt * (hit - 1) / chunk, True
        elapsed += dt
        steps += chunk
    return steps, elapsed, False


def solver_fn(name, **limits):
    return jax.jit(functools.partial(solve, solver=core.solver_from_name(name).with_limits(**limits)))


def top10(x):
    notes = np.asarray(x)[1:]
    return set(np.argsort(-notes, kind="stable")[:10].tolist())


# ----------------------------------------------------------------------------- part 1


def part1(args, real):
    rows, overlap_rows = [], []
    paper = solver_fn("replicator")
    exact = {name: solver_fn(name, tol=1e-10) for name in CONVERGED}
    to_target = {name: solver_fn(name, tol=TARGET) for name in CONVERGED}
    sources = ["synthetic"] + (["mmlongbench"] if real is not None else [])
    for source in sources:
        for n in args.sizes:
            rng = np.random.default_rng(n)
            problems = []
            for k in range(args.queries):
                if source == "synthetic":
                    z, q = synthetic(rng, n)
                else:
                    z, q = real.corpus(k, n), real.question(k)
                problems.append(build_affinity(jnp.asarray(z), jnp.asarray(q), jnp.ones(n, bool)))
            # Paper mode and converged selections on every query.
            stats = dict(paper_stop=0, paper_kkt_ok=0, kkt=[], overlap=[], conv_ok=0)
            for aff in problems:
                p = paper(aff)
                e = exact[args.reference](aff)
                stats["paper_stop"] += int(p.status) == core.CONVERGED
                stats["paper_kkt_ok"] += float(p.kkt_residual) <= TARGET
                stats["kkt"].append(float(p.kkt_residual))
                stats["conv_ok"] += int(e.status) == core.CONVERGED
                stats["overlap"].append(len(top10(p.x) & top10(e.x)))
            overlap_rows.append(
                dict(source=source, n=n, queries=len(problems),
                     paper_stops=stats["paper_stop"] / len(problems),
                     paper_kkt_le_1e8=stats["paper_kkt_ok"] / len(problems),
                     paper_kkt_median=float(np.median(stats["kkt"])),
                     converged_ok=stats["conv_ok"] / len(problems),
                     overlap_mean=float(np.mean(stats["overlap"])),
                     overlap_min=int(np.min(stats["overlap"])))
            )
            # Time to KKT <= 1e-8 on the first --timing-queries queries.
            timing = args.timing_queries if n < 1024 else args.timing_queries_1024
            for k, aff in enumerate(problems[:timing]):
                steps, secs, reached = replicator_to_target(aff, args.rep_cap, args.rep_budget)
                row = dict(source=source, n=n, query=k, replicator_steps=steps, replicator_s=secs,
                           replicator_reached=reached)
                for name in CONVERGED:
                    res, secs_c = timed(to_target[name], aff, repeats=3)
                    row[f"{name}_steps"] = int(res.num_iters)
                    row[f"{name}_s"] = secs_c
                    row[f"{name}_kkt"] = float(res.kkt_residual)
                    row[f"{name}_ok"] = int(res.status) == core.CONVERGED and float(res.kkt_residual) <= TARGET
                rows.append(row)
                print(f"  [{source} n={n} q{k}] " + ", ".join(f"{a}={b:.3g}" if isinstance(b, float) else f"{a}={b}"
                                                             for a, b in row.items() if a not in ("source", "n", "query")),
                      flush=True)
    return rows, overlap_rows


def print_part1(rows, overlap_rows):
    print("\n### Time to KKT residual <= 1e-8 (float64, uniform start; '>=' = replicator stopped by cap/budget)\n")
    head = "| source | n | q | replicator steps | replicator s |"
    for name in CONVERGED:
        head += f" {name} steps | {name} s | {name} KKT |"
    head += " speedup (replicator s / best converged s) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        mark = "" if r["replicator_reached"] else ">="
        line = f"| {r['source']} | {r['n']} | {r['query']} | {mark}{r['replicator_steps']} | {mark}{r['replicator_s']:.3g} |"
        best = min(r[f"{name}_s"] for name in CONVERGED if r[f"{name}_ok"]) if any(
            r[f"{name}_ok"] for name in CONVERGED) else float("nan")
        for name in CONVERGED:
            ok = "" if r[f"{name}_ok"] else " (not reached)"
            line += f" {r[f'{name}_steps']} | {r[f'{name}_s']:.3g} | {r[f'{name}_kkt']:.1e}{ok} |"
        line += f" {mark}{r['replicator_s'] / best:.0f}x |"
        print(line)
    print("\n### Paper mode (tol 1e-7, 10,000 steps) against the converged equilibrium (KKT <= 1e-10)\n")
    print("| source | n | queries | paper stops <= 10k | paper KKT <= 1e-8 | paper KKT median |"
          " converged solver OK | top-10 overlap mean | top-10 overlap min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in overlap_rows:
        print(f"| {r['source']} | {r['n']} | {r['queries']} | {r['paper_stops']:.0%} | {r['paper_kkt_le_1e8']:.0%} |"
              f" {r['paper_kkt_median']:.1e} | {r['converged_ok']:.0%} | {r['overlap_mean']:.1f} | {r['overlap_min']} |")


# ----------------------------------------------------------------------------- part 2


def matmul_peak(b, n, repeats=5, loop_steps=500):
    """Best float32 jnp.matmul GFLOP/s over a few shapes (and each shape's own rate).

    Also the sustained rate of the shared path's own product, ``[b, n] @ [n, n]``,
    repeated ``loop_steps`` times in a jitted ``fori_loop`` (best of ``repeats``):
    what a loop of bare matrix products gets on this machine right now.
    """
    rng = np.random.default_rng(0)
    mm = jax.jit(jnp.matmul)
    rates = {}
    for m, k, p in ((1024, 1024, 1024), (2048, 2048, 2048), (b, n, n)):
        x = jnp.asarray(rng.random((m, k)), jnp.float32)
        y = jnp.asarray(rng.random((k, p)), jnp.float32)
        jax.block_until_ready(mm(x, y))
        best = np.inf
        for _ in range(repeats if m > b else 20 * repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(mm(x, y))
            best = min(best, time.perf_counter() - t0)
        rates[f"{m}x{k}x{p}"] = 2 * m * k * p / best / 1e9
    w = jnp.asarray(rng.random((n, n)) / n, jnp.float32)
    loop = jax.jit(lambda y: jax.lax.fori_loop(0, loop_steps, lambda i, y: y @ w, y))
    _, secs = timed(loop, jnp.asarray(rng.random((b, n)), jnp.float32), repeats=repeats)
    sustained = 2 * b * n * n * loop_steps / secs / 1e9
    return max(max(rates.values()), sustained), rates, sustained


def part2(args, real):
    n, b = args.throughput_n, args.throughput_b
    if real is not None:
        notes = real.corpus(0, n).astype(np.float32)
        queries = real.questions(b).astype(np.float32)
        source = "mmlongbench"
    else:
        rng = np.random.default_rng(7)
        notes, _ = synthetic(rng, n)
        queries = np.stack([synthetic(rng, 8)[1] for _ in range(b)])
        source = "synthetic"
    notes = jnp.asarray(notes, jnp.float32)
    queries = jnp.asarray(queries, jnp.float32)
    valid = jnp.ones(n, bool)
    size = n + 1

    peak, rates, sustained = matmul_peak(b, n)

    shared_all = jax.jit(functools.partial(cds_select_shared, budget=10))
    sel, t_shared_all = timed(shared_all, notes, queries, valid)
    corpus = jax.jit(corpus_affinity)(notes, valid)
    rel = jax.jit(question_relevance)(corpus, queries)
    res, t_shared_solve = timed(jax.jit(solve_replicator_shared), corpus, rel, repeats=args.shared_repeats)
    steps = np.asarray(res.num_iters)
    flops_useful = 2.0 * size * size * steps.sum()
    flops_executed = 2.0 * size * size * b * steps.max()

    single = jax.jit(functools.partial(cds_select, budget=10))
    sample = min(args.per_question_sample, b)
    jax.block_until_ready(single(notes, queries[0], valid))
    same_idx, max_dx, t_single = 0, 0.0, 0.0
    single_steps = 0
    for k in range(sample):
        t0 = time.perf_counter()
        s = jax.block_until_ready(single(notes, queries[k], valid))
        t_single += time.perf_counter() - t0
        single_steps += int(s.result.num_iters)
        same_idx += bool(np.array_equal(np.asarray(s.indices), np.asarray(sel.indices[k])))
        max_dx = max(max_dx, float(np.max(np.abs(np.asarray(s.result.x) - np.asarray(sel.result.x[k])))))
    t_single_64 = t_single / sample * b
    out = dict(
        source=source, n=n, b=b, peak_gflops=peak, matmul_rates=rates, matmul_loop_gflops=sustained,
        shared_total_s=t_shared_all, shared_solve_s=t_shared_solve,
        shared_useful_gflops=flops_useful / t_shared_solve / 1e9,
        shared_executed_gflops=flops_executed / t_shared_solve / 1e9,
        steps_mean=float(steps.mean()), steps_max=int(steps.max()), converged_share=float(np.mean(steps < 10_000)),
        per_question_sample=sample, per_question_s_each=t_single / sample, per_question_64_s_extrapolated=t_single_64,
        per_question_useful_gflops=2.0 * size * size * single_steps / t_single / 1e9,
        same_indices=f"{same_idx}/{sample}", max_abs_dx=max_dx, shared_repeats=args.shared_repeats,
    )
    return out


def print_part2(r):
    print(f"\n### Paper-mode throughput, {r['b']} questions on one corpus of n = {r['n']} notes ({r['source']}, float32)\n")
    print("jnp.matmul rates (GFLOP/s): " + ", ".join(f"{k} {v:.1f}" for k, v in r["matmul_rates"].items())
          + f"; the same [b, n] @ [n, n] product in a jitted 500-step loop: {r['matmul_loop_gflops']:.1f};"
          f" peak (the largest of these) = {r['peak_gflops']:.1f}")
    print(f"replicator steps per question: mean {r['steps_mean']:.0f}, max {r['steps_max']};"
          f" stopped before 10,000: {r['converged_share']:.0%}\n")
    print(f"| path | wall s ({r['b']} questions) | questions/s | useful GFLOP/s | % of matmul peak |")
    print("|---|---|---|---|---|")
    print(f"| per-question (jit cds_select, {r['per_question_sample']} run, x{r['b'] / r['per_question_sample']:.0f}"
          f" extrapolated) | {r['per_question_64_s_extrapolated']:.3g} | {r['b'] / r['per_question_64_s_extrapolated']:.3g} |"
          f" {r['per_question_useful_gflops']:.3g} | {r['per_question_useful_gflops'] / r['peak_gflops']:.0%} |")
    print(f"| shared corpus (cds_select_shared, all included) | {r['shared_total_s']:.3g} |"
          f" {r['b'] / r['shared_total_s']:.3g} | | |")
    print(f"| shared corpus (solve_replicator_shared only, best of {r['shared_repeats']}) | {r['shared_solve_s']:.3g} |"
          f" {r['b'] / r['shared_solve_s']:.3g} |"
          f" {r['shared_useful_gflops']:.3g} (executed {r['shared_executed_gflops']:.3g}) |"
          f" {r['shared_useful_gflops'] / r['peak_gflops']:.0%} |")
    print(f"\nshared path vs the bare matrix-product loop: {r['shared_useful_gflops'] / r['matmul_loop_gflops']:.0%}")
    print(f"\nspeedup shared (all included) vs per-question: {r['per_question_64_s_extrapolated'] / r['shared_total_s']:.1f}x;"
          f" same top-10 on the sampled questions: {r['same_indices']}, max |x_shared - x_single| = {r['max_abs_dx']:.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--queries", type=int, default=8, help="queries per (source, n) for the paper-mode table")
    ap.add_argument("--timing-queries", type=int, default=2, help="queries timed to KKT <= 1e-8 for n < 1024")
    ap.add_argument("--timing-queries-1024", type=int, default=1)
    ap.add_argument("--rep-cap", type=int, default=1_000_000, help="replicator step cap")
    ap.add_argument("--rep-budget", type=float, default=150.0, help="replicator seconds per timed query")
    ap.add_argument("--reference", default="active_set", choices=CONVERGED, help="solver for the KKT<=1e-10 reference")
    ap.add_argument("--throughput-n", type=int, default=1024)
    ap.add_argument("--throughput-b", type=int, default=64)
    ap.add_argument("--per-question-sample", type=int, default=8)
    ap.add_argument("--shared-repeats", type=int, default=3, help="timed runs of the shared solve (best kept)")
    ap.add_argument("--no-real", action="store_true", help="synthetic data only (no PDFs, no MiniLM)")
    ap.add_argument("--cache", default="runs/bench_solvers/cache", help="embedding cache directory")
    ap.add_argument("--skip-part1", action="store_true")
    ap.add_argument("--skip-part2", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smoke run: n in {32, 64}, synthetic, small throughput")
    ap.add_argument("--json", default=None, help="write all numbers to this file")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.queries, args.timing_queries, args.rep_cap, args.rep_budget = [32, 64], 3, 1, 200_000, 20.0
        args.throughput_n, args.throughput_b, args.per_question_sample, args.no_real = 128, 16, 2, True
        args.shared_repeats = 1
    real = None if args.no_real else RealNotes(pathlib.Path(args.cache))
    print(f"jax {jax.__version__}, devices {jax.devices()}", flush=True)
    out = {}
    if not args.skip_part1:
        jax.config.update("jax_enable_x64", True)
        rows, overlap_rows = part1(args, real)
        print_part1(rows, overlap_rows)
        out.update(part1_timing=rows, part1_paper_mode=overlap_rows)
        jax.config.update("jax_enable_x64", False)
    if not args.skip_part2:
        r = part2(args, real)
        print_part2(r)
        out.update(part2=r)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
