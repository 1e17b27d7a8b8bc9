r"""Every core: ingestion with 1 and 2 workers, evaluation with 1 and 2 processes, measured in one run.

    python experiments/bench_scale.py                    # 8 smallest dev PDFs; all 324 dev questions, both settings
    python experiments/bench_scale.py --pdfs 4 --queries 100 --settings single

Ingestion: ``build_index(..., workers=W)`` of the same PDFs into a fresh temporary document cache each time
(nothing reused), pages per wall-clock second, CPU seconds (all processes), and a check that the indexes are
the same (notes, element ids, embeddings within 1e-5). Rows: one worker (this process, with the thread pools
onnxruntime and torch start by default); two workers with the parent embedding (the default) and with each
worker embedding (the alternative, ``embed_in="worker"``); one worker held to one core (a spawned process
pinned to a core, with onnxruntime and torch limited to one thread: onnxruntime pins its own threads, so
pinning the process alone does not hold them).

Evaluation: ``run_eval.py --config.selectors=cds`` (paper mode, budget 10) on the first ``--queries`` dev
questions of MMLongBench-Doc, for each setting: ``single`` (each question searches its own document,
``configs/mmlongbench.py``) and ``pool`` (five-document pools, ``configs/mmlongbench_pool.py``), with
``--processes 1``, ``--processes 2`` and one process pinned to one core. The indexes come from ``--mmlb-cache``
(read only; question vectors go to a temporary cache, filled by a warm-up run first so no timed run encodes).
Throughput is questions per second of wall time for the whole command and of the selection phase (the slowest
process's selector seconds, compilation included); the selections of all runs must be identical. Prints the
load average before and after.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def dev_pdfs(data: pathlib.Path, cache: pathlib.Path, count: int):
    """The ``count`` dev PDFs with the fewest pages (the dev set: the PDFs with an index in ``cache``)."""
    import pymupdf

    stems = {p.name.rsplit("-", 1)[0] for p in (cache / "indexes").iterdir() if p.is_dir()}
    pdfs = [p for p in sorted((data / "mmlongbench" / "documents").glob("*.pdf")) if p.stem[:60] in stems]
    pages = {p: pymupdf.open(p).page_count for p in pdfs}
    return sorted(pdfs, key=lambda p: (pages[p], p.name))[:count]


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _child_init(core) -> None:
    """A fresh process for one ingestion, like a new ``cdsjax index`` command; with ``core``, held to it."""
    if core is not None:
        os.sched_setaffinity(0, {core})
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
        from cdsjax.io.parse import limit_layout_threads

        limit_layout_threads(1)
    import cdsjax.io.index  # noqa: F401  (the package import is not timed; torch and the model load are)


def _timed_build(pdfs, out, cache, workers, embed_in):
    from cdsjax.io.index import build_index, default_config

    config = default_config()
    config.embedder.show_progress = False
    t0, c0 = time.perf_counter(), cpu_seconds()
    s = build_index(pdfs, out, config=config, cache_dir=cache, workers=workers, progress=True, embed_in=embed_in)
    return time.perf_counter() - t0, cpu_seconds() - c0, s


def ingest(pdfs, workers: int, tmp: pathlib.Path, *, one_core: bool = False, embed_in: str = "parent"):
    """``(wall s, CPU s, summary, index)`` of one ingestion into a fresh cache, in a fresh process (so each run
    pays the embedding model's load like a new command); CPU s counts that process and its workers."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from cdsjax.io.index import load_index

    tag = f"w{workers}-{embed_in}" + ("-core" if one_core else "")
    out, cache = tmp / f"index-{tag}", tmp / f"cache-{tag}"
    core = min(os.sched_getaffinity(0)) if one_core else None
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_init,
                             initargs=(core,)) as pool:
        pool.submit(os.getpid).result()  # started before the clock starts
        wall, cpu, s = pool.submit(_timed_build, pdfs, out, cache, workers, embed_in).result()
    if s.failures or s.processed != len(pdfs):
        raise SystemExit(f"bench_scale: ingestion with {workers} workers failed: {s.failures}")
    return wall, cpu, s, load_index(out)


def same_index(a, b) -> bool:
    import numpy as np

    strip = lambda n: {k: v for k, v in n.items() if k != "image_path"}  # noqa: E731
    return ([strip(n) for n in a.notes] == [strip(n) for n in b.notes]
            and [e.get("element_id") for e in a.elements()] == [e.get("element_id") for e in b.elements()]
            and bool(np.allclose(a.embeddings, b.embeddings, atol=1e-5)) and bool((a.links == b.links).all()))


CONFIGS = {"single": "mmlongbench.py", "pool": "mmlongbench_pool.py"}


def run_eval(out: pathlib.Path, cache: pathlib.Path, queries: int, processes: int, setting: str,
             selectors: Optional[str] = None, *, one_core: bool = False):
    """``(wall s, selection s, CPU s, {(selector, budget, qid): selected}, [selection s of each process])`` of
    one ``run_eval.py`` command (selection s: the slowest process's); ``selectors`` defaults to paper-mode CDS."""
    if selectors is None:
        from cdsjax.pipeline.catalog import PAPER_SELECTOR

        selectors = PAPER_SELECTOR
    cmd = [sys.executable, str(ROOT / "experiments" / "run_eval.py"), "--config", str(ROOT / "configs" / CONFIGS[setting]),
           f"--config.max_queries={queries}", f"--config.selectors={selectors}", f"--config.output_dir={out}",
           f"--config.cache_dir={cache}", "--config.num_resamples=1000", "--noprogress", f"--processes={processes}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), CDSJAX_JAX_CACHE="0")  # every run compiles (no warm cache)
    env.pop("XLA_FLAGS", None)
    if one_core:  # the command and every thread it starts on one core
        cmd = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] + cmd
    t0, c0 = time.perf_counter(), cpu_seconds()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if proc.returncode != 0:
        raise SystemExit(f"bench_scale: run_eval --processes {processes} failed:\n{proc.stderr[-3000:]}")
    each = [sum(json.loads(line)["seconds"].values())
            for line in (out / "timings.jsonl").read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return wall, max(each), cpu, {(r["selector"], r["budget"], r["qid"]): r["selected"] for r in records}, each


def ceiling(one: float, one_core: float, target: str) -> str:
    """The highest 2/1 ratio this machine allows, from the run's own times.

    Two processes cannot finish in less than the work held to one core (``one_core`` seconds: no thread pool
    spinning, nothing repeated) divided by the two cores, so 2/1 = one / two <= 2 * one / one_core. That reaches
    the target only where one default process gets little from the second core. With more cores than processes,
    each process keeps its thread pools and this bound does not apply.
    """
    cores = len(os.sched_getaffinity(0))
    if cores > 2:
        return f"{cores} cores: more cores than processes, so no bound from the one-core time"
    bound = 2 * one / one_core
    return (f"highest 2/1 possible on {cores} cores (2 x one-process time / one-core time): {bound:.2f}; "
            f"the target {target} is {'within' if bound >= float(target) else 'beyond'} it")


def bench_ingest(data: pathlib.Path, mmlb: pathlib.Path, count: int, tmp: pathlib.Path, *, short: bool = False) -> None:
    """Ingestion with 1 and 2 workers; unless ``short``, also with each worker embedding and on one core."""
    pdfs = dev_pdfs(data, mmlb, count)
    runs = {"1 worker": ingest(pdfs, 1, tmp),
            "2 workers, the parent embeds (default)": ingest(pdfs, 2, tmp)}
    if not short:
        runs.update({"2 workers, each worker embeds": ingest(pdfs, 2, tmp, embed_in="worker"),
                     "1 worker on one core": ingest(pdfs, 1, tmp, one_core=True)})
    pages = runs["1 worker"][2].pages
    names = ", ".join(p.name for p in pdfs) if len(pdfs) <= 10 else f"{len(pdfs)} files"
    print(f"\ningestion of {len(pdfs)} dev PDFs, {pages} pages ({names}), fresh cache each run")
    print("| run | wall s | pages/s | CPU s | cores busy |")
    print("|---|---|---|---|---|")
    for name, (wall, cpu, _, _) in runs.items():
        print(f"| {name} | {wall:.1f} | {pages / wall:.2f} | {cpu:.1f} | {cpu / wall:.2f} |")
    w1, w2 = runs["1 worker"][0], runs["2 workers, the parent embeds (default)"][0]
    index1 = runs["1 worker"][3]
    same = all(same_index(index1, r[3]) for r in runs.values())
    line = f"ratio 2/1: {w1 / w2:.2f} (target >= 1.6)"
    if not short:
        w2w, wc = runs["2 workers, each worker embeds"][0], runs["1 worker on one core"][0]
        line += (f"; with each worker embedding: {w1 / w2w:.2f}; 2 workers against one worker on one core: "
                 f"{wc / w2:.2f}; one worker's gain from its thread pools: {wc / w1:.2f}")
    print(f"{line}; indexes identical: {same}")
    if not short:
        print(ceiling(w1, runs["1 worker on one core"][0], "1.6"))
    stages = {k: round(v, 1) for k, v in runs["1 worker"][2].seconds.items()}
    print(f"one-worker stage seconds: {stages}")


def bench_eval(mmlb: pathlib.Path, queries: int, settings, tmp: pathlib.Path) -> None:
    from cdsjax.pipeline.catalog import REFERENCE_SELECTOR as reference

    cache = tmp / "mmlb-cache"
    cache.mkdir()
    (cache / "indexes").symlink_to(mmlb / "indexes")  # read only: every dev index is current there
    for setting in settings:
        run_eval(tmp / f"warmup-{setting}", cache, queries, 1, setting, selectors=reference)  # question vectors
        runs = {"1": run_eval(tmp / f"{setting}-p1", cache, queries, 1, setting),
                "2": run_eval(tmp / f"{setting}-p2", cache, queries, 2, setting),
                "1, pinned to one core": run_eval(tmp / f"{setting}-p1core", cache, queries, 1, setting,
                                                  one_core=True)}
        ref = runs["1"][3]
        n = len(ref)
        print(f"\nevaluation ({setting}): paper-mode CDS (selector cds, budget 10) on the first {queries} "
              f"MMLongBench-Doc dev questions ({n} records)")
        print("| processes | wall s | q/s (wall) | selection s | q/s (selection) | CPU s |")
        print("|---|---|---|---|---|---|")
        for p, (wall, sel, cpu, *_) in runs.items():
            print(f"| {p} | {wall:.1f} | {n / wall:.2f} | {sel:.1f} | {n / sel:.2f} | {cpu:.1f} |")
        e1, e2, ec = runs.values()
        same = {p: sum(ref[k] == r[3].get(k) for k in ref) for p, r in runs.items()}
        print(f"ratio 2/1: wall {e1[0] / e2[0]:.2f}, selection {e1[1] / e2[1]:.2f} (target >= 1.7); identical "
              f"selections (same notes, same order) against 1 process: 2 processes {same['2']}/{n}, pinned "
              f"{same['1, pinned to one core']}/{n}")
        print(f"2 processes against one process on one core: wall {ec[0] / e2[0]:.2f}, selection "
              f"{ec[1] / e2[1]:.2f}; one process's use of the second core: selection {ec[1] / e1[1]:.2f}")
        print(ceiling(e1[1], ec[1], "1.7"))
        print(f"2 processes, each one's selection s: {' / '.join(f'{t:.1f}' for t in e2[4])} (the same work split "
              f"evenly: {sum(e2[4]) / len(e2[4]):.1f}, a 2/1 of {len(e2[4]) * e1[1] / sum(e2[4]):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pdfs", type=int, default=8)
    ap.add_argument("--queries", type=int, default=324)
    ap.add_argument("--settings", default="single,pool", help="evaluation settings: single, pool or both")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--mmlb-cache", default="runs/cache/mmlongbench",
                    help="a cache_dir holding the dev indexes of configs/mmlongbench.py (read only)")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--ingest-runs", choices=("all", "short"), default="all",
                    help="short: ingestion with 1 and 2 workers only (for long document sets)")
    args = ap.parse_args()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = sorted(set(settings) - set(CONFIGS))
    if bad:
        raise SystemExit(f"bench_scale: unknown setting(s) {bad}; choose from {sorted(CONFIGS)}")
    data, mmlb = pathlib.Path(args.data), pathlib.Path(args.mmlb_cache)
    if not (mmlb / "indexes").is_dir():
        raise SystemExit(f"bench_scale: {mmlb}/indexes not found (build it with run_eval.py --config "
                         f"configs/mmlongbench.py --config.cache_dir={mmlb})")
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; cores: {len(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory(prefix="bench_scale-") as tmp:
        tmp = pathlib.Path(tmp)
        if not args.skip_ingest:
            bench_ingest(data, mmlb, args.pdfs, tmp, short=args.ingest_runs == "short")
            load = os.getloadavg()
            print(f"load average after ingestion: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        if not args.skip_eval:
            bench_eval(mmlb, args.queries, settings, tmp)
    load1 = os.getloadavg()
    print(f"load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
