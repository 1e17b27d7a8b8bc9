"""Reporting a run: ``summary.csv`` rows (mean and 95% bootstrap interval per selector and ``metric@B``; each
selector's paired difference to a reference selector, ``metric_vs_REF@B``, with its interval, W/T/L and the
smallest difference the run could detect; the per-question oracle), the markdown tables, and
``timings.jsonl``."""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import cdsjax.eval.metrics as M
from cdsjax.eval.scoring import SUMMARY_DIAGNOSTICS

SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
TIMINGS_FILE = "timings.jsonl"
SUMMARY_COLUMNS = ("benchmark", "selector", "metric", "mean", "ci_low", "ci_high", "n", "wins", "ties", "losses",
                   "mde")
ORACLE = "oracle"  # the best selector per question (selectors only; the reader's controls are not selections)
CONTROLS = ("none", "full")
NOT_PAIRED = ("reader_error", "judge_error", "num_selected")  # counts of failures, not qualities
NOT_MAXIMISED = ("redundancy", "distinct_pages", "distinct_docs", "num_selected", "markers_only", "no_answer",
                 "reader_error", "judge_error")  # higher is not better: no oracle


def paired_rows(records: Iterable[Mapping[str, Any]], metric_names: Sequence[str], reference: str, *,
                num_resamples: int = 10_000, seed: int = 0) -> List[dict]:
    """``summary.csv`` rows comparing each selector with ``reference`` on the same questions, per benchmark,
    budget and metric (:func:`cdsjax.eval.metrics.paired_difference`): ``metric_vs_REF@B`` with the mean
    difference, its 95% bootstrap interval, ``wins`` / ``ties`` / ``losses`` and ``mde`` (the smallest
    difference the run could detect). Also the per-question oracle, selector :data:`ORACLE`: each question's best
    value over the selectors (controls left out), its mean (``metric@B``) and its paired difference to
    ``reference`` (how much choosing the selector per question could gain at all). Nothing where
    ``reference`` has no records."""
    values: Dict[Tuple[str, str, int, str], Mapping[str, Any]] = {}
    groups: Dict[Tuple[str, int], List[str]] = {}
    for r in records:
        values[(r["benchmark"], r["selector"], int(r["budget"]), r["qid"])] = r["metrics"]
        sels = groups.setdefault((r["benchmark"], int(r["budget"])), [])
        if r["selector"] not in sels:
            sels.append(r["selector"])
    rows = []
    for (bench, b), sels in groups.items():
        if reference not in sels:
            continue
        qids = [k[3] for k in values if k[:3] == (bench, reference, b)]
        real = [s for s in sels if s not in CONTROLS]
        for m in metric_names:
            if m in NOT_PAIRED:
                continue
            get = lambda s, q: (values.get((bench, s, b, q)) or {}).get(m)
            ref = [get(reference, q) for q in qids]
            if all(v is None for v in ref):
                continue
            compared = [(s, [get(s, q) for q in qids]) for s in sels if s != reference]
            if m not in NOT_MAXIMISED and len(real) > 1:
                best = []
                for q in qids:
                    vals = [float(get(s, q)) for s in real if get(s, q) is not None]
                    best.append(max(vals) if vals else None)
                mean, lo, hi, n = M.mean_ci([v for v in best if v is not None], num_resamples=num_resamples,
                                            seed=seed)
                rows.append({"benchmark": bench, "selector": ORACLE, "metric": f"{m}@{b}", "mean": mean,
                             "ci_low": lo, "ci_high": hi, "n": n})
                compared.append((ORACLE, best))
            for s, ours in compared:
                d = M.paired_difference(ours, ref, num_resamples=num_resamples, seed=seed)
                if d["n"]:
                    rows.append({"benchmark": bench, "selector": s, "metric": f"{m}_vs_{reference}@{b}",
                                 "mean": d["mean"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"],
                                 "wins": d["better"], "ties": d["tie"], "losses": d["worse"], "mde": d["mde"]})
    return rows


def is_paired(row: Mapping[str, Any]) -> bool:
    """Whether a summary row is a paired difference (it has W/T/L)."""
    return row.get("wins") is not None


def summary_rows(records: Iterable[Mapping[str, Any]], metric_names: Sequence[str], *,
                 num_resamples: int = 10_000, seed: int = 0) -> List[dict]:
    """Rows of ``summary.csv``: per (benchmark, selector) and metric ``name@B``, the mean
    over queries with a 95% percentile-bootstrap interval (NaN/None skipped)."""
    flat = []
    for r in records:
        row = {"benchmark": r["benchmark"], "selector": r["selector"]}
        for m in metric_names:
            row[f"{m}@{r['budget']}"] = r["metrics"].get(m)
        for d in SUMMARY_DIAGNOSTICS:
            if d in r.get("diagnostics", {}):
                row[f"{d}@{r['budget']}"] = float(r["diagnostics"][d])
        flat.append(row)
    names = []
    for row in flat:
        for k in row:
            if k not in ("benchmark", "selector") and k not in names:
                names.append(k)
    names.sort(key=lambda k: (int(k.rsplit("@", 1)[1]), _metric_rank(k.rsplit("@", 1)[0], metric_names)))
    rows = M.summarize(flat, names, num_resamples=num_resamples, seed=seed)
    return [r for r in rows if r["n"] > 0]


def _metric_rank(name: str, metric_names: Sequence[str]) -> int:
    order = list(metric_names) + list(SUMMARY_DIAGNOSTICS)
    return order.index(name) if name in order else len(order)


def write_summary_csv(rows: Sequence[Mapping[str, Any]], path: pathlib.Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(SUMMARY_COLUMNS))
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in SUMMARY_COLUMNS})


def markdown_table(rows: Sequence[Mapping[str, Any]], provenance: Optional[Mapping[str, Any]] = None) -> str:
    """One table per benchmark and budget: selectors as rows, metrics as columns, cells
    ``mean [ci_low, ci_high]`` (``n`` in the header when the whole column shares it); then, per reference
    selector, the paired differences (:func:`paired_rows`): cells ``+diff [lo, hi] W/T/L w/t/l``, the smallest
    detectable difference per column in the header. With ``provenance``, a last line names the code, library
    versions and device (:func:`cdsjax.io.provenance.provenance_line`)."""
    out = []
    groups: Dict[Tuple[str, str], list] = {}
    for r in rows:
        metric, _, budget = r["metric"].rpartition("@")
        groups.setdefault((r["benchmark"], budget), []).append(dict(r, metric=metric))
    for (bench, budget), sub in groups.items():
        buf = io.StringIO()
        buf.write(f"### {bench}, budget {budget}\n\n")
        buf.write(_table([r for r in sub if not is_paired(r)], _fmt_cell))
        by_ref: Dict[str, list] = {}
        for r in sub:
            if is_paired(r):
                metric, _, ref = r["metric"].rpartition("_vs_")
                by_ref.setdefault(ref, []).append(dict(r, metric=metric))
        for ref, paired in by_ref.items():
            buf.write(f"\nPaired difference to {ref} (same questions; 95% bootstrap interval; W/T/L = questions "
                      f"better / tied / worse; mde = smallest difference this run could detect):\n\n")
            buf.write(_table(paired, _fmt_paired, mde=True))
        out.append(buf.getvalue())
    from cdsjax.io.provenance import provenance_line

    return "\n".join(out) + ("\n" + provenance_line(provenance) if provenance else "")


def _table(sub: Sequence[Mapping[str, Any]], fmt: Callable[[Mapping[str, Any]], str], mde: bool = False) -> str:
    metrics = list(dict.fromkeys(r["metric"] for r in sub))
    selectors = list(dict.fromkeys(r["selector"] for r in sub))
    if not metrics:
        return ""
    cell = {(r["selector"], r["metric"]): r for r in sub}
    header = []
    for m in metrics:
        ns = {cell[(s, m)]["n"] for s in selectors if (s, m) in cell}
        head = f"{m} (n={ns.pop()})" if len(ns) == 1 else m
        if mde:
            mdes = [cell[(s, m)]["mde"] for s in selectors if (s, m) in cell and s != ORACLE]
            mdes = [v for v in mdes if v is not None and not math.isnan(v)]
            head += f", mde {max(mdes):.3f}" if mdes else ""
        header.append(head)
    buf = io.StringIO()
    buf.write("| selector | " + " | ".join(header) + " |\n")
    buf.write("|---|" + "---|" * len(metrics) + "\n")
    for s in selectors:
        cells = ["" if (s, m) not in cell else fmt(cell[(s, m)]) for m in metrics]
        buf.write(f"| {s} | " + " | ".join(cells) + " |\n")
    return buf.getvalue()


def _fmt_paired(r: Mapping[str, Any]) -> str:
    m, lo, hi = r["mean"], r["ci_low"], r["ci_high"]
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] W/T/L {r['wins']}/{r['ties']}/{r['losses']}"


def _fmt_cell(r: Mapping[str, Any]) -> str:
    """``mean [ci_low, ci_high]``, or the mean alone for a row without an interval (NaN bounds: the spread over
    seeds)."""
    m, lo, hi = r["mean"], r["ci_low"], r["ci_high"]
    fmt = ".3g" if abs(m) >= 100 or (abs(m) < 1e-3 and m != 0) else ".3f"
    if math.isnan(lo) and math.isnan(hi):
        return f"{m:{fmt}}"
    return f"{m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def write_timings(out_dir: pathlib.Path, seconds: Mapping[str, float], counts: Mapping[str, int]) -> None:
    """Appends this invocation's wall times to ``timings.jsonl``: seconds per
    ``selector@B`` (compilation included) with the number of questions it solved, and
    the open-corpus first stage."""
    entry = {"seconds": {k: round(float(v), 4) for k, v in seconds.items()},
             "questions": {k: int(v) for k, v in counts.items() if v}}
    with open(out_dir / TIMINGS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
