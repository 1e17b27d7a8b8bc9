"""Asking, cold and warm: `cdsjax ask` as a fresh process (today's code and this one) vs `cdsjax serve`.

Run (from the repository root):

    python experiments/bench_ask.py --old-root DIR                   # COSTCO 10-K (76 pages), 60 questions
    python experiments/bench_ask.py --old-root DIR --pdf ../shared/data/mmlongbench/documents/NIKE_2021_10K.pdf
    python experiments/bench_ask.py --old-root ../main-before        # a checkout of "today's" code to compare against

Everything is measured in one run, cold runs of the old and new code interleaved so both see the same load:

- cold `cdsjax ask INDEX "question" --json`: wall time of a fresh process, split into start-up (Python,
  imports: wall minus what the command times itself), load (the index), encode and select. Each run asks a
  different question. "new, first run" uses an empty cache directory (no persistent compilation cache yet);
  "new" runs share a cache directory, as a user's runs do. "old" is the same command line with
  ``--old-root`` on PYTHONPATH (today's default selector there is paper-mode CDS; the row "new,
  --selector cds-paper" runs the same selector as the old default).
- a new PDF: `cdsjax ask NEW.pdf "question" --json` on a PDF no cache has seen (``--new-pdf``, default the first
  50 pages of NIKE_2021_10K.pdf written to a temporary file), from a warm install (the runs above have filled
  the compilation cache; the document cache does not hold this PDF): old and new code, one run each (``--new-runs``),
  each into a document cache of its own. "load" is then the indexing of the PDF.
- warm: one `cdsjax serve INDEX` process; a client POSTs /select (the reader excluded) for each question
  one after another; latency is measured by the client (HTTP included).

Questions are the MMLongBench-Doc dev questions (all documents), asked of the one index: the point is
latency, not answers. The index is built on first use under runs/bench_ask/ (or pass ``--index``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def run_cli(pythonpath: str, argv, env_extra=None, timeout=600):
    env = dict(os.environ, PYTHONPATH=pythonpath, **(env_extra or {}))
    env.pop("CDSJAX_READER_URL", None)
    t0 = time.perf_counter()
    # cwd = the code's root: `python -m` puts the working directory first on sys.path
    proc = subprocess.run([sys.executable, "-m", "cdsjax.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=pythonpath)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_ask: `cdsjax {' '.join(argv[:2])} ...` failed ({pythonpath}): "
                         f"{proc.stderr.strip().splitlines()[-1:]}")
    return wall, proc.stdout


def cold_ask(pythonpath, index, question, cache, extra=()):
    wall, out = run_cli(pythonpath, ["ask", str(index), question, "--json", *extra], {"CDSJAX_CACHE": str(cache)})
    result = json.loads(out)
    t = result["timings"]
    stages = dict(load=t.get("load", 0.0), encode=t["encode"], select=t["select"])
    stages["startup"] = wall - sum(stages.values())
    return dict(wall=wall, **stages, selector=result.get("selector"),
                converged=(result.get("diagnostics") or {}).get("converged"))


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pdf", default=str(DATA / "mmlongbench" / "documents" / "COSTCO_2021_10K.pdf"))
    ap.add_argument("--index", default=None, help="an existing index of --pdf (default: built under runs/)")
    ap.add_argument("--questions", type=int, default=60, help="warm questions (default: 60)")
    ap.add_argument("--cold", type=int, default=3, help="cold runs per variant (default: 3)")
    ap.add_argument("--new-pdf", default=None, help="a PDF for the first-ask rows (default: 50 pages of NIKE 10-K)")
    ap.add_argument("--new-runs", type=int, default=1, help="first asks of the new PDF per code (default: 1; 0: none)")
    ap.add_argument("--old-root", required=True, help="a checkout of the code to compare against (e.g. git worktree add)")
    args = ap.parse_args()

    from tqdm import tqdm

    pdf = Path(args.pdf).resolve()
    questions = [s["question"] for s in json.loads((DATA / "mmlongbench" / "samples.json").read_text())]
    if len(questions) < args.questions + 2 * args.cold + 1:
        raise SystemExit("bench_ask: not enough questions in samples.json")
    load_before = os.getloadavg()
    work = ROOT / "runs" / "bench_ask"
    index = (Path(args.index) if args.index else work / (pdf.stem + "-index")).resolve()
    if not index.is_dir():
        print(f"indexing {pdf} into {index} ...", file=sys.stderr)
        run_cli(str(ROOT), ["index", str(pdf), "--out", str(index)], timeout=3600)
    import pymupdf

    pages = pymupdf.open(pdf).page_count
    notes = sum(1 for _ in open(index / "notes.jsonl"))
    old_commit = subprocess.run(["git", "-C", args.old_root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "?"
    new_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "?"

    sys.path.insert(0, str(ROOT))
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, PAPER_SELECTOR, display

    default, paper = display(DEFAULT_SELECTOR), display(PAPER_SELECTOR)
    paper_row = f"new, --selector {paper}"
    tmp = Path(tempfile.mkdtemp(prefix="bench_ask_"))
    shared_cache = tmp / "cache"
    rows = {"old": [], "new, first run (empty cache)": [], "new": [], paper_row: []}
    cold_qs = iter(questions[args.questions:])
    # first-ever run of the new code: no compilation cache yet
    rows["new, first run (empty cache)"].append(cold_ask(str(ROOT), index, next(cold_qs), shared_cache))
    if rows["new, first run (empty cache)"][0]["selector"] != default:
        raise SystemExit("bench_ask: the new code did not run (is another cdsjax first on sys.path?)")
    for _ in tqdm(range(args.cold), desc="cold runs (old/new interleaved)", file=sys.stderr):
        rows["old"].append(cold_ask(args.old_root, index, next(cold_qs), tmp / "old-cache"))
        rows["new"].append(cold_ask(str(ROOT), index, next(cold_qs), shared_cache))
        rows[paper_row].append(cold_ask(str(ROOT), index, next(cold_qs), shared_cache, ("--selector", paper)))

    # a PDF not seen before, from a warm install (compilation cache filled above, no document cache entry)
    new_rows = {"old": [], "new": []}
    new_pdf = Path(args.new_pdf).resolve() if args.new_pdf else tmp / "new50.pdf"
    if args.new_runs and not args.new_pdf:
        src = pymupdf.open(DATA / "mmlongbench" / "documents" / "NIKE_2021_10K.pdf")
        out = pymupdf.open()
        out.insert_pdf(src, from_page=0, to_page=49)
        out.save(new_pdf)
    for i in range(args.new_runs):
        for code, root, cache in (("old", args.old_root, tmp / "old-cache"), ("new", str(ROOT), shared_cache)):
            for d in [Path(cache) / "docs", *Path(cache).glob(new_pdf.stem[:60] + "-*")]:
                shutil.rmtree(d, ignore_errors=True)  # the PDF's document entry and index: not seen before
            wall, out_text = run_cli(root, ["ask", str(new_pdf), next(cold_qs), "--json"], {"CDSJAX_CACHE": str(cache)})
            t = json.loads(out_text)["timings"]
            new_rows[code].append(dict(wall=wall, load=t.get("load", 0.0), encode=t["encode"], select=t["select"]))

    # warm: one serve process
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CDSJAX_CACHE=str(shared_cache))
    env.pop("CDSJAX_READER_URL", None)
    t0 = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "serve", str(index), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    try:
        line = server.stdout.readline()
        if "listening" not in line:
            raise SystemExit(f"bench_ask: serve did not start: {line} {server.stderr.read()[-500:]}")
        ready_s = time.perf_counter() - t0
        url = f"http://127.0.0.1:{port}/select"
        warm, server_side, unconverged = [], [], 0
        for q in tqdm(questions[: args.questions], desc="warm /select", file=sys.stderr):
            t1 = time.perf_counter()
            result = post(url, {"question": q})
            warm.append(time.perf_counter() - t1)
            server_side.append(result["timings"]["encode"] + result["timings"]["select"])
            unconverged += not result["diagnostics"].get("converged", True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    load_after = os.getloadavg()

    def med(rs, key):
        return statistics.median(r[key] for r in rs)

    print(f"\n## bench_ask: {pdf.name} ({pages} pages, {notes} notes); old = {Path(args.old_root).resolve().name} @ {old_commit}, "
          f"new = {new_commit}; {os.cpu_count()} cores")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}\n")
    print("Cold `cdsjax ask INDEX \"question\" --json` (a fresh process each; seconds, median of runs):\n")
    print("| code | runs | wall | start-up | load | encode | select | selector |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, rs in rows.items():
        print(f"| {name} | {len(rs)} | {med(rs, 'wall'):.2f} | {med(rs, 'startup'):.2f} | {med(rs, 'load'):.2f} | "
              f"{med(rs, 'encode'):.2f} | {med(rs, 'select'):.2f} | {rs[0]['selector']} |")
    if any(new_rows.values()):
        new_pages = pymupdf.open(new_pdf).page_count
        print(f"\nFirst `cdsjax ask NEW.pdf \"question\" --json` on a PDF no cache holds ({new_pdf.name}, {new_pages} "
              f"pages), warm install; load = indexing the PDF (seconds, median of runs):\n")
        print("| code | runs | wall | load (index the PDF) | encode | select | pages/s of the whole ask |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for code, rs in new_rows.items():
            print(f"| {code} | {len(rs)} | {med(rs, 'wall'):.2f} | {med(rs, 'load'):.2f} | {med(rs, 'encode'):.2f} | "
                  f"{med(rs, 'select'):.2f} | {new_pages / med(rs, 'wall'):.2f} |")
        if args.new_runs > 1:  # each run on its own: a later run finds what the first compiled in the cache
            print("\nEach run (old and new alternate; run 2 onwards find the executables run 1 compiled, e.g. the "
                  "selector at this index's padded size):\n")
            print("| code | run | wall | load (index the PDF) | encode | select |")
            print("|---|---:|---:|---:|---:|---:|")
            for code, rs in new_rows.items():
                for i, r in enumerate(rs, 1):
                    print(f"| {code} | {i} | {r['wall']:.2f} | {r['load']:.2f} | {r['encode']:.2f} | {r['select']:.2f} |")
        print(f"\nnew / old wall: {med(new_rows['new'], 'wall') / med(new_rows['old'], 'wall'):.2f} "
              f"(target: new <= 15 s; here {med(new_rows['new'], 'wall'):.1f} s)")
    p50, p95 = percentile(warm, 0.5), percentile(warm, 0.95)
    print(f"\nWarm `cdsjax serve` (POST /select, default selector, reader excluded), {len(warm)} questions asked "
          f"one after another; server ready {ready_s:.1f}s after launch:\n")
    print("| latency | p50 | p95 | max | server-side p50 (encode + select) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| seconds | {p50:.3f} | {p95:.3f} | {max(warm):.3f} | {percentile(server_side, 0.5):.3f} |")
    old, new = med(rows["old"], "wall"), med(rows["new"], "wall")
    print("\nRatios (same run):\n")
    print(f"- cold new / cold old: {new / old:.2f} (target <= 0.40); first-run new / cold old: "
          f"{med(rows['new, first run (empty cache)'], 'wall') / old:.2f}; "
          f"new {paper} / cold old: {med(rows[paper_row], 'wall') / old:.2f}")
    print(f"- warm p50 / cold old: {p50 / old:.3f}; warm p50 / cold new: {p50 / new:.3f}; "
          f"warm p50 {p50:.3f}s (target <= 0.2 s)")
    print(f"- unconverged solves among the warm questions: {unconverged} of {len(warm)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
