"""Figures of the evaluation: a 2-D PCA map of one query's notes and ablation curves.

Pure functions over what the harness writes (``summary.csv`` rows, records) or over
one problem's arrays; each draws into a matplotlib ``Axes`` (a new figure when none
is given) and returns the figure. Nothing here imports JAX, so the notebook can draw
from saved results alone.

* :func:`read_summary` / :func:`read_cases` load ``summary.csv`` files and saved
  PCA cases (``pca_*.npz``, written by :func:`save_case`).
* :func:`parse_label` recovers ``(selector, param, value)`` from an ablation label
  such as ``cds_tau=0p3`` (see ``configs/ablations/sweeps.py``).
* :func:`sweep_points` / :func:`plot_sweep` give metric vs swept value, one line per
  benchmark; :func:`plot_budget` gives metric vs budget, one line per selector.
* :func:`pca_map` is the note map: notes projected on their first two principal
  components, the query, the gold notes and each selector's picks.
"""

from __future__ import annotations

import csv
import pathlib
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from cdsjax.core.registry import SPECS
from cdsjax.pipeline.catalog import REFERENCE_SELECTOR

# The headline metric of each benchmark.
PRIMARY_METRIC = {"hotpotqa": "paragraph_recall", "qasper": "paragraph_recall", "mmlongbench": "page_recall"}

_LABEL = re.compile(r"^(?P<selector>[a-z_]+?)_(?P<param>[a-z]+)=(?P<value>.+)$")
_NUMBER_P = re.compile(r"(\d)p(\d)")


def _figure(ax=None, size=(5.0, 3.6)):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=size)
    else:
        fig = ax.figure
    return fig, ax


def save(fig, path) -> pathlib.Path:
    """Saves ``fig`` as PNG (parents created) and closes it."""
    import matplotlib.pyplot as plt

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- loading


def read_summary(path) -> List[dict]:
    """Rows of a ``summary.csv`` (or of every ``summary.csv`` under a folder), with
    ``metric`` split into ``metric`` and integer ``budget`` and numbers as floats."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such summary file or folder")
    files = sorted(path.rglob("summary.csv")) if path.is_dir() else [path]
    rows = []
    for file in files:
        with open(file, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                metric, _, budget = r["metric"].rpartition("@")
                rows.append({"benchmark": r["benchmark"], "selector": r["selector"], "metric": metric,
                             "budget": int(budget), "mean": float(r["mean"]), "ci_low": float(r["ci_low"]),
                             "ci_high": float(r["ci_high"]), "n": int(r["n"]), "run": file.parent.name})
    return rows


def parse_label(label: str) -> Optional[Tuple[str, str, Any]]:
    """``"cds_tau=0p3" -> ("cds", "tau", 0.3)``; None for a plain selector label.

    Values that read as numbers become floats; others stay strings with ``p``
    between digits turned back into a dot (``softmax_T0p05 -> softmax_T0.05``).
    """
    m = _LABEL.match(label)
    if not m:
        return None
    value = _NUMBER_P.sub(r"\1.\2", m.group("value"))
    try:
        value = float(value)
    except ValueError:
        pass
    return m.group("selector"), m.group("param"), value


def sweep_points(rows: Sequence[Mapping[str, Any]], param: str, metric: str, *,
                 benchmark: Optional[str] = None) -> Dict[Tuple[str, str], List[Tuple[Any, float, float, float]]]:
    """``(benchmark, selector) -> [(value, mean, ci_low, ci_high), ...]`` of the
    variants sweeping ``param`` (labels ``<selector>_<param>=<value>``), in label
    order of the rows."""
    out: Dict[Tuple[str, str], List[Tuple[Any, float, float, float]]] = {}
    seen = set()
    for r in rows:
        parsed = parse_label(r["selector"])
        if parsed is None or parsed[1] != param or r["metric"] != metric:
            continue
        if benchmark is not None and r["benchmark"] != benchmark:
            continue
        key = (r["benchmark"], r["selector"], r["budget"])
        if key in seen:
            continue
        seen.add(key)
        out.setdefault((r["benchmark"], parsed[0]), []).append((parsed[2], r["mean"], r["ci_low"], r["ci_high"]))
    return out


def _paper_mode(selector: str) -> bool:
    """Paper-mode CDS (drawn solid in sweeps); False for any other selector or an unknown label."""
    spec = SPECS.get(selector)
    return spec is not None and spec.paper_mode


def baseline(rows: Sequence[Mapping[str, Any]], benchmark: str, selector: str, metric: str,
             budget: Optional[int] = None) -> Optional[float]:
    """Mean of ``metric`` for a plain ``selector`` on ``benchmark`` (first match)."""
    for r in rows:
        if (r["benchmark"], r["selector"], r["metric"]) == (benchmark, selector, metric) and (
                budget is None or r["budget"] == budget):
            return r["mean"]
    return None


# --------------------------------------------------------------------------- plots


def plot_sweep(rows: Sequence[Mapping[str, Any]], param: str, *, metrics: Optional[Mapping[str, str]] = None,
               ax=None, reference: Optional[str] = REFERENCE_SELECTOR, title: Optional[str] = None):
    """Metric vs swept ``param``, one line (with 95% interval bars) per benchmark and
    swept selector (e.g. ``cds`` and ``cds_converged``).

    Args:
      rows: summary rows (:func:`read_summary`), any benchmarks and runs.
      param: the swept option as it appears in labels (``tau``, ``beta``, ``lam``,
        ``prior``, ``coupling``).
      metrics: ``benchmark -> metric`` (default :data:`PRIMARY_METRIC`, else
        ``paragraph_recall``).
      reference: a plain selector drawn as a dashed level per benchmark (None: none).
    """
    metrics = dict(PRIMARY_METRIC, **(metrics or {}))
    fig, ax = _figure(ax)
    benchmarks = list(dict.fromkeys(r["benchmark"] for r in rows))
    categories: List[Any] = []
    line = 0
    for i, bench in enumerate(benchmarks):
        metric = metrics.get(bench, "paragraph_recall")
        for (_, selector), pts in sweep_points(rows, param, metric, benchmark=bench).items():
            values = [p[0] for p in pts]
            if all(isinstance(v, float) for v in values):
                order = np.argsort(values)
                x = np.asarray(values, float)[order]
            else:
                for v in values:
                    if v not in categories:
                        categories.append(v)
                order = np.arange(len(values))
                x = np.asarray([categories.index(v) for v in values], float)
            mean = np.asarray([p[1] for p in pts])[order]
            lo = np.asarray([p[2] for p in pts])[order]
            hi = np.asarray([p[3] for p in pts])[order]
            ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], marker="os^D"[line % 4], capsize=3,
                        color=f"C{i}", linestyle="-" if _paper_mode(selector) else ":",
                        label=f"{bench} {selector} ({metric})")
            line += 1
        if reference is not None:
            level = baseline(rows, bench, reference, metric)
            if level is not None:
                ax.axhline(level, color=f"C{i}", linestyle="--", linewidth=1, alpha=0.7)
    if categories:
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels([str(c) for c in categories], rotation=20)
    ax.set_xlabel(param)
    ax.set_ylabel("recall")
    ax.set_title(title or f"sweep of {param}" + (f" (dashed: {reference})" if reference else ""))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def plot_budget(rows: Sequence[Mapping[str, Any]], benchmark: str, *, metric: Optional[str] = None,
                selectors: Optional[Sequence[str]] = None, ax=None):
    """Metric vs budget B on one benchmark, one line per selector (with 95% bars)."""
    metric = metric or PRIMARY_METRIC.get(benchmark, "paragraph_recall")
    fig, ax = _figure(ax)
    mine = [r for r in rows if r["benchmark"] == benchmark and r["metric"] == metric]
    names = list(selectors or dict.fromkeys(r["selector"] for r in mine))
    for i, name in enumerate(names):
        pts = {}
        for r in mine:
            if r["selector"] == name:
                pts.setdefault(r["budget"], r)
        if len(pts) < 1:
            continue
        b = sorted(pts)
        mean = np.asarray([pts[k]["mean"] for k in b])
        lo = np.asarray([pts[k]["ci_low"] for k in b])
        hi = np.asarray([pts[k]["ci_high"] for k in b])
        ax.errorbar(b, mean, yerr=[mean - lo, hi - mean], marker="o", capsize=3, color=f"C{i}", label=name)
    ax.set_xlabel("budget B")
    ax.set_ylabel(metric)
    ax.set_title(f"{benchmark}: {metric} vs budget")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def pca_2d(notes: np.ndarray, query: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Projects notes ``[n, d]`` and the query ``[d]`` on the notes' first two
    principal components. Returns ``(note_xy [n, 2], query_xy [2], explained [2])``
    (``explained``: share of the notes' variance on each component)."""
    notes = np.asarray(notes, float)
    query = np.asarray(query, float)
    if notes.ndim != 2 or notes.shape[0] < 2:
        raise ValueError(f"notes must be [n >= 2, d], got {notes.shape}")
    if query.shape != notes.shape[1:]:
        raise ValueError(f"query must be [{notes.shape[1]}], got {query.shape}")
    mean = notes.mean(axis=0)
    centred = notes - mean
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    k = min(2, vt.shape[0])
    comps = np.zeros((2, notes.shape[1]))
    comps[:k] = vt[:k]
    var = s ** 2
    explained = np.zeros(2)
    explained[:k] = var[:k] / max(var.sum(), 1e-300)
    return centred @ comps.T, (query - mean) @ comps.T, explained


def pca_map(notes: np.ndarray, query: np.ndarray, picks: Mapping[str, Sequence[int]],
            gold: Sequence[int], *, ax=None, title: Optional[str] = None, labels: Optional[Sequence[str]] = None):
    """The note map of one query: every note on the first two principal components,
    gold notes ringed, each selector's picks with its own marker, and the query.

    Args:
      notes: ``[n, d]`` note embeddings.
      query: ``[d]`` query embedding.
      picks: ``selector -> selected note indices`` (e.g. cosine and CDS).
      gold: indices of the gold notes.
      labels: optional short text per note, written next to it.
    """
    xy, q, explained = pca_2d(notes, query)
    fig, ax = _figure(ax, size=(5.5, 4.5))
    ax.scatter(xy[:, 0], xy[:, 1], s=18, color="0.75", label="notes", zorder=1)
    gold = [int(i) for i in gold]
    if gold:
        ax.scatter(xy[gold, 0], xy[gold, 1], s=190, facecolors="none", edgecolors="gold",
                   linewidths=2.2, label="gold", zorder=2)
    markers = ["o", "s", "^", "D", "v"]
    sizes = [90, 40, 40, 30, 30]
    for i, (name, idx) in enumerate(picks.items()):
        idx = [int(j) for j in idx]
        ax.scatter(xy[idx, 0], xy[idx, 1], s=sizes[i % len(sizes)], marker=markers[i % len(markers)],
                   facecolors="none" if i == 0 else f"C{i}", edgecolors=f"C{i}", linewidths=1.5,
                   label=f"{name} picks", zorder=3 + i)
    ax.scatter([q[0]], [q[1]], s=140, marker="*", color="black", label="query", zorder=10)
    if labels is not None:
        for j, text in enumerate(labels):
            ax.annotate(str(text), xy[j], fontsize=6, xytext=(3, 3), textcoords="offset points", color="0.3")
    ax.set_xlabel(f"PC1 ({explained[0]:.0%} of variance)")
    ax.set_ylabel(f"PC2 ({explained[1]:.0%} of variance)")
    ax.set_title(title or "notes of one query (PCA)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return fig


def plot_equilibrium(weights: Sequence[float], *, gold: Sequence[int] = (), picks: Sequence[int] = (),
                     threshold: float = 1e-6, labels: Optional[Sequence[str]] = None, ax=None,
                     title: Optional[str] = None):
    """What the equilibrium did on one question: each note's weight :math:`x^*_i` (a bar, log scale), the support
    threshold (a line: notes above it are the support), the gold notes (gold bars) and the selected notes (a
    marker above the bar, numbered in pick order).

    Args:
      weights: ``[n]`` the notes' equilibrium weights (the query's entries left out).
      gold: indices of the gold notes.
      picks: indices of the selected notes, in the order they were picked (support first, then the fill rule).
      threshold: the support threshold :math:`\\theta` (``cdsjax.core.types.SUPPORT_THRESHOLD``).
      labels: optional short text per note (x tick labels).
    """
    w = np.asarray(weights, np.float64)
    floor = threshold / 100.0  # weights at 0 drawn just under the threshold's scale
    shown = np.maximum(w, floor)
    fig, ax = _figure(ax, size=(max(5.0, 0.35 * len(w) + 2.0), 3.6))
    gold = {int(i) for i in gold}
    colors = ["goldenrod" if i in gold else "C0" for i in range(len(w))]
    ax.bar(np.arange(len(w)), shown, color=colors, edgecolor="0.3", linewidth=0.5)
    ax.axhline(threshold, color="C3", linestyle="--", linewidth=1)
    picks = [int(j) for j in picks]
    ax.scatter(picks, [shown[i] * 1.6 for i in picks], marker="v", color="C2", s=25, zorder=3)
    for rank, i in enumerate(picks):
        ax.annotate(str(rank + 1), (i, shown[i] * 2.2), ha="center", va="bottom", fontsize=7, color="C2",
                    fontweight="bold")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color="C0", label="note"), Patch(color="goldenrod", label="gold note"),
               Line2D([], [], color="C3", linestyle="--", label=f"support threshold {threshold:g}"),
               Line2D([], [], color="C2", marker="v", linestyle="", label="picked (number: order)")]
    ax.set_yscale("log")
    ax.set_ylim(floor / 2.0, max(1.0, float(shown.max()) * 10.0))
    ax.set_xticks(np.arange(len(w)))
    ax.set_xticklabels([str(t) for t in labels] if labels is not None else [str(i) for i in range(len(w))],
                       fontsize=6, rotation=90 if labels is not None else 0)
    ax.set_xlabel("note")
    ax.set_ylabel("equilibrium weight x*")
    ax.set_title(title or f"equilibrium of one question: support {int(np.sum(w > threshold))} of {len(w)} notes")
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    return fig


# --------------------------------------------------------------------------- saved PCA cases


def save_case(path, *, qid: str, question: str, notes, query, picks: Mapping[str, Sequence[int]],
              gold: Sequence[int], labels: Optional[Sequence[str]] = None) -> pathlib.Path:
    """Writes what :func:`pca_map` needs for one query to an ``.npz``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"notes": np.asarray(notes, np.float32), "query": np.asarray(query, np.float32),
              "gold": np.asarray(list(gold), np.int64), "qid": np.asarray(qid),
              "question": np.asarray(question), "pick_names": np.asarray(list(picks))}
    for i, idx in enumerate(picks.values()):
        arrays[f"pick_{i}"] = np.asarray(list(idx), np.int64)
    if labels is not None:
        arrays["labels"] = np.asarray([str(t) for t in labels])
    np.savez(path, **arrays)
    return path


def load_case(path) -> dict:
    """Inverse of :func:`save_case`: keyword arguments of :func:`pca_map` plus qid/question."""
    with np.load(path, allow_pickle=False) as z:
        names = [str(n) for n in z["pick_names"]]
        return {"notes": z["notes"], "query": z["query"], "gold": z["gold"].tolist(),
                "picks": {n: z[f"pick_{i}"].tolist() for i, n in enumerate(names)},
                "labels": z["labels"].tolist() if "labels" in z else None,
                "qid": str(z["qid"]), "question": str(z["question"])}


def read_cases(folder) -> List[dict]:
    """Every ``pca_*.npz`` case under ``folder``."""
    return [load_case(p) for p in sorted(pathlib.Path(folder).rglob("pca_*.npz"))]


# --------------------------------------------------------------------------- tables


def compact_table(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], *, budget: Optional[int] = None,
                  run: Optional[str] = None) -> str:
    """A markdown table, selectors as rows and ``metric@B`` as columns, cells
    ``mean [ci_low, ci_high]``."""
    mine = [r for r in rows if r["metric"] in metrics and (budget is None or r["budget"] == budget)
            and (run is None or r["run"] == run)]
    cols = list(dict.fromkeys((r["metric"], r["budget"]) for r in sorted(
        mine, key=lambda r: (r["budget"], list(metrics).index(r["metric"])))))
    cell = {(r["selector"], r["metric"], r["budget"]): r for r in mine}
    lines = ["| selector | " + " | ".join(f"{m}@{b} (n={next(r['n'] for r in mine if (r['metric'], r['budget']) == (m, b))})"
                                          for m, b in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for sel in dict.fromkeys(r["selector"] for r in mine):
        cells = []
        for m, b in cols:
            r = cell.get((sel, m, b))
            cells.append("" if r is None else f"{r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
        lines.append(f"| {sel} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_pool_sizes(points: Mapping[str, Mapping[str, Sequence[Tuple[int, float]]]], *, metric: str,
                    title: str = "", reference: str = REFERENCE_SELECTOR):
    """Recall against pool size: one panel per distractor kind, one line per selector.

    Args:
      points: ``distractors -> selector -> [(pool size, mean metric), ...]``.
      metric: the y-axis label.
      title: figure title (e.g. the benchmark and the questions it covers).
      reference: drawn dashed and black (the selector others are compared with).

    Returns:
      The figure.
    """
    import matplotlib.pyplot as plt

    kinds = list(points)
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.6 * len(kinds), 3.6), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for i, (sel, pts) in enumerate(points[kind].items()):
            pts = sorted(pts)
            # Distinct markers keep selectors that coincide (paper-mode and converged CDS) visible.
            style = dict(color="black", linestyle="--") if sel == reference else {}
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="os^vDP*X"[i % 8], markersize=5,
                    label=sel, **style)
        sizes = sorted({p for pts in points[kind].values() for p, _ in pts})
        ax.set_xticks(sizes)
        ax.set_xlabel("documents per pool")
        ax.set_title(f"{kind} distractors")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    axes[0][-1].legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
