"""Reporting a run: ``summary.csv`` rows (mean and 95% bootstrap interval per selector and ``metric@B``),
the markdown tables, and ``timings.jsonl``."""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

import cdsjax.eval.metrics as M
from cdsjax.eval.scoring import SUMMARY_DIAGNOSTICS

SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
TIMINGS_FILE = "timings.jsonl"
SUMMARY_COLUMNS = ("benchmark", "selector", "metric", "mean", "ci_low", "ci_high", "n")


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
            w.writerow({k: r[k] for k in SUMMARY_COLUMNS})


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One table per benchmark and budget: selectors as rows, metrics as columns, cells
    ``mean [ci_low, ci_high]`` (``n`` in the header when the whole column shares it)."""
    out = []
    groups: Dict[Tuple[str, str], list] = {}
    for r in rows:
        metric, _, budget = r["metric"].rpartition("@")
        groups.setdefault((r["benchmark"], budget), []).append(dict(r, metric=metric))
    for (bench, budget), sub in groups.items():
        metrics = list(dict.fromkeys(r["metric"] for r in sub))
        selectors = list(dict.fromkeys(r["selector"] for r in sub))
        cell = {(r["selector"], r["metric"]): r for r in sub}
        header = []
        for m in metrics:
            ns = {cell[(s, m)]["n"] for s in selectors if (s, m) in cell}
            header.append(f"{m} (n={ns.pop()})" if len(ns) == 1 else m)
        buf = io.StringIO()
        buf.write(f"### {bench}, budget {budget}\n\n| selector | " + " | ".join(header) + " |\n")
        buf.write("|---|" + "---|" * len(metrics) + "\n")
        for s in selectors:
            cells = ["" if (s, m) not in cell else _fmt_cell(cell[(s, m)]) for m in metrics]
            buf.write(f"| {s} | " + " | ".join(cells) + " |\n")
        out.append(buf.getvalue())
    return "\n".join(out)


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
