r"""Every core: ingestion with 1 and 2 workers, evaluation with 1 and 2 processes, measured in one run.

    python experiments/bench_scale.py                       # 4 smallest dev PDFs; paper-mode CDS on 200 questions
    python experiments/bench_scale.py --pdfs 8 --queries 324

Ingestion: ``build_index(..., workers=W)`` of the same PDFs into a fresh temporary document cache each time
(nothing reused), pages per wall-clock second, and a check that both indexes are the same (notes, element
ids, embeddings within 1e-5). It also prints the stage seconds of the one-worker run and the time to load the
embedding model, the figures behind embedding in each worker rather than batched in the parent.

Evaluation: ``run_eval.py --config configs/mmlongbench.py --config.selectors=cds`` (paper mode) on the first
``--queries`` dev questions with ``--processes 1`` and ``--processes 2``; the indexes come from
``--mmlb-cache`` (read only; question vectors go to a temporary cache, filled by a warm-up run first so neither
timed run encodes). Throughput is questions per second of wall time for the whole command and of the
selection phase (the slowest process's selector seconds, compilation included), and the selections of the
two runs must be identical. Prints the load average before and after.

Each part also runs once more with one worker / one process pinned to a single core. A single process is not
single-threaded (PyMuPDF's layout model runs on onnxruntime's thread pool; XLA compiles with several threads),
so the pinned row separates "how much a second process adds" from "how much a second core adds to one process".
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

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


def ingest(pdfs, workers: int, tmp: pathlib.Path, *, one_core: bool = False, embed_in: str = "parent"):
    from cdsjax.io.index import build_index, default_config, load_index

    config = default_config()
    config.embedder.show_progress = False
    tag = f"w{workers}-{embed_in}" + ("-core" if one_core else "")
    allowed = os.sched_getaffinity(0)
    if one_core:  # this process (the one worker) and every thread it starts on one core
        os.sched_setaffinity(0, {min(allowed)})
    try:
        t0 = time.perf_counter()
        s = build_index(pdfs, tmp / f"index-{tag}", config=config, cache_dir=tmp / f"cache-{tag}",
                        workers=workers, progress=True, embed_in=embed_in)
        wall = time.perf_counter() - t0
    finally:
        os.sched_setaffinity(0, allowed)
    if s.failures or s.processed != len(pdfs):
        raise SystemExit(f"bench_scale: ingestion with {workers} workers failed: {s.failures}")
    return wall, s, load_index(tmp / f"index-{tag}")


def same_index(a, b) -> bool:
    import numpy as np

    strip = lambda n: {k: v for k, v in n.items() if k != "image_path"}  # noqa: E731
    return ([strip(n) for n in a.notes] == [strip(n) for n in b.notes]
            and [e.get("element_id") for e in a.elements()] == [e.get("element_id") for e in b.elements()]
            and bool(np.allclose(a.embeddings, b.embeddings, atol=1e-5)) and bool((a.links == b.links).all()))


def run_eval(out: pathlib.Path, cache: pathlib.Path, queries: int, processes: int, selectors: str = "cds", *,
             one_core: bool = False):
    cmd = [sys.executable, str(ROOT / "experiments" / "run_eval.py"), "--config", str(ROOT / "configs" / "mmlongbench.py"),
           f"--config.max_queries={queries}", f"--config.selectors={selectors}", f"--config.output_dir={out}",
           f"--config.cache_dir={cache}", "--config.num_resamples=1000", "--noprogress", f"--processes={processes}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    t0 = time.perf_counter()
    pin = (lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_core else None
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=pin)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_scale: run_eval --processes {processes} failed:\n{proc.stderr[-3000:]}")
    select = max(sum(json.loads(line)["seconds"].values())
                 for line in (out / "timings.jsonl").read_text().splitlines() if line.strip())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return wall, select, {(r["selector"], r["budget"], r["qid"]): r["selected"] for r in records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pdfs", type=int, default=4)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--mmlb-cache", default="/work/cache/mmlongbench",
                    help="a cache_dir holding the dev indexes of configs/mmlongbench.py (read only)")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-eval", action="store_true")
    args = ap.parse_args()
    data, mmlb = pathlib.Path(args.data), pathlib.Path(args.mmlb_cache)
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; cores: {len(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory(prefix="bench_scale-") as tmp:
        tmp = pathlib.Path(tmp)
        if not args.skip_ingest:
            pdfs = dev_pdfs(data, mmlb, args.pdfs)
            from cdsjax.io.embed import Embedder
            from cdsjax.io.index import default_config

            t0 = time.perf_counter()
            Embedder(default_config()).model  # noqa: B018 (the load is what is timed)
            load_s = time.perf_counter() - t0
            w1, s1, i1 = ingest(pdfs, 1, tmp)
            w2, s2, i2 = ingest(pdfs, 2, tmp)
            wc, sc, _ = ingest(pdfs, 1, tmp, one_core=True)
            same = same_index(i1, i2)
            # the alternative design: workers parse and enrich, the parent embeds every note in one batch
            from cdsjax.io.notes import embedding_text

            embedder = Embedder(default_config())
            t0 = time.perf_counter()
            embedder.encode_documents([embedding_text(n) for n in i1.notes], show_progress=False)
            batch_s = time.perf_counter() - t0
            r1, r2, rc = s1.pages / w1, s2.pages / w2, sc.pages / wc
            print(f"\ningestion of {len(pdfs)} dev PDFs, {s1.pages} pages ({', '.join(p.name for p in pdfs)}), "
                  f"fresh cache each run")
            print("| workers | wall s | pages/s |")
            print("|---|---|---|")
            print(f"| 1 | {w1:.1f} | {r1:.2f} |")
            print(f"| 2 | {w2:.1f} | {r2:.2f} |")
            print(f"| 1, pinned to one core | {wc:.1f} | {rc:.2f} |")
            print(f"ratio 2/1: {r2 / r1:.2f} (target >= 1.6); indexes identical: {same}; 2 workers against one "
                  f"worker on one core: {r2 / rc:.2f}; one worker's use of the second core: {r1 / rc:.2f}")
            stages = {k: round(v, 1) for k, v in s1.seconds.items()}
            work = sum(v for k, v in s1.seconds.items() if k in ("parse", "notes", "embed"))
            print(f"one-worker stage seconds: {stages}; embedding is {100 * s1.seconds.get('embed', 0) / work:.0f}% "
                  f"of parse+notes+embed; loading the embedding model (in this process, warm disk): {load_s:.1f} s")
            print(f"embedding all {len(i1.notes)} notes in one batch in the parent (model loaded): {batch_s:.1f} s "
                  f"(serial, after the workers) against one model load per worker ({load_s:.1f} s, in parallel)")
        if not args.skip_eval:
            cache = tmp / "mmlb-cache"
            cache.mkdir()
            (cache / "indexes").symlink_to(mmlb / "indexes")  # read only: every dev index is current there
            run_eval(tmp / "warmup", cache, args.queries, 1, selectors="cosine")  # question vectors, once
            e1 = run_eval(tmp / "p1", cache, args.queries, 1)
            e2 = run_eval(tmp / "p2", cache, args.queries, 2)
            ec = run_eval(tmp / "p1core", cache, args.queries, 1, one_core=True)
            n = len(e1[2])
            print(f"\nevaluation: paper-mode CDS (selector cds, budget 10) on the first {args.queries} MMLongBench-Doc "
                  f"dev questions ({n} records)")
            print("| processes | wall s | q/s (wall) | selection s | q/s (selection) |")
            print("|---|---|---|---|---|")
            for p, (wall, sel, _) in (("1", e1), ("2", e2), ("1, pinned to one core", ec)):
                print(f"| {p} | {wall:.1f} | {n / wall:.2f} | {sel:.1f} | {n / sel:.2f} |")
            same_order = sum(e1[2][k] == e2[2].get(k) for k in e1[2])
            same_set = sum(set(e1[2][k]) == set(e2[2].get(k, ())) for k in e1[2])
            print(f"ratio 2/1: wall {e1[0] / e2[0]:.2f}, selection {e1[1] / e2[1]:.2f} (target >= 1.7); "
                  f"identical selections (same notes, same order): {same_order}/{n}; same set of notes: "
                  f"{same_set}/{n}")
            print(f"2 processes against one process on one core: wall {ec[0] / e2[0]:.2f}, selection "
                  f"{ec[1] / e2[1]:.2f}; one process's use of the second core: selection {ec[1] / e1[1]:.2f}")
    load1 = os.getloadavg()
    print(f"load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
