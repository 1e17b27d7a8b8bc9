r"""Tables and the pool-size figure of RESULTS.md "Pools of documents and the open corpus", from the
records of pool / open-corpus runs (``experiments/pool_sweep.py``, ``run_eval.py``).

Usage (from the repository root)::

    python experiments/pool_report.py --runs "single=runs/pool_sweep/mmlongbench_1_random" \
        "5 random=runs/pool_sweep/mmlongbench_5_random" "5 similar=runs/pool_sweep/mmlongbench_5_similar"
    python experiments/pool_report.py --figure results/pool_size_mmlongbench.png \
        --sweep runs/pool_sweep --benchmark mmlongbench

For each ``label=run dir``: one row per selector with the mean [95% bootstrap
interval] of each metric over the questions with gold, the paired difference to cosine
(same questions) with its interval and better / tie / worse counts, the share of
converged solves, the median number of candidate notes, and the selection wall time
(``timings.jsonl``, compilation included). ``--max_queries`` keeps each run's first
questions (in benchmark order). The figure draws the primary metric against pool size per
selector over the questions present at every pool size of a distractor kind.
"""

import argparse
import collections
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cdsjax.pipeline.catalog import REFERENCE_SELECTOR  # noqa: E402
from cdsjax.core.registry import SPECS  # noqa: E402
from cdsjax.eval import metrics as M  # noqa: E402
from cdsjax.eval.records import RECORDS_FILE, read_records  # noqa: E402
from cdsjax.eval.report import TIMINGS_FILE  # noqa: E402

COLUMNS = {
    "mmlongbench": ("page_recall", "box_recall", "gold_doc_share", "gold_doc_hit", "distinct_docs"),
    "qasper": ("paragraph_recall", "best_annotator_recall", "gold_doc_share", "gold_doc_hit", "distinct_docs"),
}
PAIRED = {"mmlongbench": ("page_recall", "box_recall"), "qasper": ("paragraph_recall",)}
SELECTOR_ORDER = tuple(SPECS)  # rows in registry order: the reference baseline first, CDS last


def load_run(run_dir, max_queries=None):
    """``(records by selector -> qid -> record, qids in order, timings)`` of one run."""
    run_dir = pathlib.Path(run_dir)
    records = read_records(run_dir / RECORDS_FILE)
    if not records:
        raise SystemExit(f"{run_dir}: no records")
    by_sel = collections.defaultdict(dict)
    qids = []
    for r in records:
        by_sel[r["selector"]][r["qid"]] = r
        if r["qid"] not in qids:
            qids.append(r["qid"])
    qids.sort()  # qids sort in benchmark order for MMLongBench; stable for others
    if max_queries is not None:
        qids = qids[:max_queries]
    seconds, counts = collections.Counter(), collections.Counter()
    path = run_dir / TIMINGS_FILE
    if path.is_file():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            seconds.update(entry["seconds"])
            counts.update(entry.get("questions", {}))
    return by_sel, qids, (seconds, counts)


def _cell(mean, lo, hi, signed=False):
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"


def run_table(label, run_dir, benchmark, *, max_queries=None, num_resamples=10_000):
    by_sel, qids, (seconds, counts) = load_run(run_dir, max_queries)
    cols, paired = COLUMNS[benchmark], PAIRED[benchmark]
    sels = [s for s in SELECTOR_ORDER if s in by_sel] + sorted(set(by_sel) - set(SELECTOR_ORDER))
    base = by_sel.get(REFERENCE_SELECTOR, {})
    notes = [by_sel[sels[0]][q]["num_notes"] for q in qids if q in by_sel[sels[0]]]
    head = (f"**{label}** (`{run_dir}`): {len(qids)} questions, median {int(np.median(notes))} candidate "
            f"notes per question (min {min(notes)}, max {max(notes)})\n\n")
    header = ["selector"] + [f"{c} (n)" for c in cols] + [f"Δ {p} vs cosine (better/tie/worse)" for p in paired]
    header += ["converged", "time s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in sels:
        recs = [by_sel[s][q] for q in qids if q in by_sel[s]]
        row = [s]
        for c in cols:
            mean, lo, hi, n = M.mean_ci([np.nan if r["metrics"].get(c) is None else r["metrics"][c] for r in recs],
                                        num_resamples=num_resamples)
            row.append("—" if n == 0 else (f"{mean:.2f} [{lo:.2f}, {hi:.2f}] ({n})" if c == "distinct_docs"
                                           else _cell(mean, lo, hi) + f" ({n})"))
        for p in paired:
            if s == REFERENCE_SELECTOR or not base:
                row.append("")
                continue
            both = [q for q in qids if q in by_sel[s] and q in base]
            d = M.paired_difference([by_sel[s][q]["metrics"].get(p) for q in both],
                                    [base[q]["metrics"].get(p) for q in both], num_resamples=num_resamples)
            row.append(_cell(d["mean"], d["ci_low"], d["ci_high"], signed=True)
                       + f" ({d['better']}/{d['tie']}/{d['worse']})")
        conv = [r["diagnostics"]["converged"] for r in recs if "converged" in r.get("diagnostics", {})]
        row.append(f"{np.mean(conv):.3f}" if conv else "")
        key = [k for k in seconds if k.startswith(f"{s}@")]
        row.append(f"{sum(seconds[k] for k in key):.1f} ({sum(counts[k] for k in key)} q)" if key else "")
        lines.append("| " + " | ".join(row) + " |")
    extra = ""
    if "first_stage" in seconds:
        extra = f"\nFirst stage (exact cosine top-K over the collection, all questions): {seconds['first_stage']:.3f} s\n"
    return head + "\n".join(lines) + "\n" + extra


def pool_size_points(sweep_dir, benchmark, metric):
    """``distractors -> selector -> [(size, mean)]`` over the questions cosine has at every
    size of that kind (a selector missing at some size has no point there), and the
    number of those questions per kind."""
    sweep_dir = pathlib.Path(sweep_dir)
    runs = {}
    for d in sorted(sweep_dir.glob(f"{benchmark}_*_*")):
        _, size, kind = d.name.rsplit("_", 2)
        if size.isdigit() and (d / RECORDS_FILE).is_file():
            runs[(int(size), kind)] = load_run(d)[0]
    kinds = sorted({k for s, k in runs if s > 1}) or sorted({k for _, k in runs})  # size 1 has no kind
    out, counts = {}, {}
    for kind in kinds:
        sizes = sorted({s for s, k in runs if k == kind or s == 1})
        data = {s: runs.get((s, kind)) or runs.get((s, "random")) for s in sizes}
        common = set.intersection(*(set(v.get(REFERENCE_SELECTOR, {})) for v in data.values()))
        counts[kind] = len(common)
        out[kind] = {}
        sels = {sel for v in data.values() for sel in v}
        for sel in [x for x in SELECTOR_ORDER if x in sels]:
            pts = []
            for s in sizes:
                recs = data[s].get(sel, {})
                if not common or not common <= set(recs):
                    continue
                vals = [recs[q]["metrics"].get(metric) for q in common]
                vals = [v for v in vals if v is not None]
                pts.append((s, float(np.mean(vals))))
            if pts:
                out[kind][sel] = pts
    return out, counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=[], help="label=run_dir")
    ap.add_argument("--benchmark", default="mmlongbench", choices=sorted(COLUMNS))
    ap.add_argument("--max_queries", type=int, default=None)
    ap.add_argument("--num_resamples", type=int, default=10_000)
    ap.add_argument("--figure", default=None, help="PNG path of the pool-size figure")
    ap.add_argument("--sweep", default="runs/pool_sweep", help="folder of the sweep runs (for --figure)")
    args = ap.parse_args(argv)
    for spec in args.runs:
        label, _, run_dir = spec.rpartition("=")
        print(run_table(label, run_dir, args.benchmark, max_queries=args.max_queries,
                        num_resamples=args.num_resamples))
    if args.figure:
        from cdsjax.eval import figures as F

        metric = COLUMNS[args.benchmark][0]
        points, counts = pool_size_points(args.sweep, args.benchmark, metric)
        if not points:
            raise SystemExit(f"{args.sweep}: no {args.benchmark}_<size>_<distractors> runs")
        for kind, sel_pts in points.items():
            print(f"{kind} ({counts[kind]} questions): " + "; ".join(
                f"{sel} " + ", ".join(f"{s}:{v:.3f}" for s, v in pts) for sel, pts in sel_pts.items()))
        n = ", ".join(f"{k}: {c} questions" for k, c in counts.items())
        fig = F.plot_pool_sizes(points, metric=f"{metric}@B", title=f"{args.benchmark} ({n})")
        print(f"wrote {F.save(fig, args.figure)}")


if __name__ == "__main__":
    main()
