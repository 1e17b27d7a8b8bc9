r"""What the equilibrium selects: support sizes, fills, and the support-targeted CDS.

For each benchmark (one question's own document(s) as the note set) it runs
``cosine``, ``cds`` (paper mode), ``cds_converged`` and ``cds_support`` through the
evaluation harness (:func:`cdsjax.eval.evaluate`, records resumable under
``--output_dir``) and prints, per benchmark:

* per selector: recall (mean, 95% bootstrap interval), the support size in notes
  (median, share of questions whose support is every note), the share of
  questions whose selection needed the fill rule, the share of questions with at
  least 2B notes whose support lies in [B/2, 2B], and how much of the selection
  cosine also selects (mean share of shared notes, share of identical sets);
* paired differences in recall against ``cosine`` and ``cds_converged``: mean,
  95% bootstrap interval of the mean difference, win / tie / loss counts.

With ``--pool=<benchmarks>`` it also runs their pool configs (``configs/mmlongbench_pool.py``,
``configs/qasper_pool.py``, where present) and prints the gold-document share of
the selected notes, recall, support size and the single -> pool drop paired
against cosine and cds_converged.

Run from the repository root::

    nice -n 10 python experiments/support_study.py
    nice -n 10 python experiments/support_study.py --pool=mmlongbench --limits=qasper=300,mmlongbench_pool=120
    python experiments/support_study.py --benchmarks=hotpotqa --max_queries=50

Budgets are the benchmarks' own: HotpotQA B = 2, QASPER B = 5, MMLongBench-Doc
B = 10. Embeddings and indexes come from ``--cache_root/<benchmark>`` (MMLongBench-Doc:
the prebuilt indexes).
"""

from __future__ import annotations

import importlib
import pathlib
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, PAPER_SELECTOR, REFERENCE_SELECTOR  # noqa: E402
from cdsjax.core.registry import SPECS  # noqa: E402

BUDGETS = {"hotpotqa": 2, "qasper": 5, "mmlongbench": 10}
RECALL = {"hotpotqa": "paragraph_recall", "qasper": "paragraph_recall", "mmlongbench": "page_recall"}
# the reference baseline, paper-mode and default CDS, and support-targeted CDS (the converged CDS selector
# that takes no beta: it chooses beta per question)
SUPPORT = next(n for n, s in SPECS.items() if s.mode == "converged" and "beta" not in s.options)
SELECTORS = (REFERENCE_SELECTOR, PAPER_SELECTOR, DEFAULT_SELECTOR, SUPPORT)
REFERENCES = (REFERENCE_SELECTOR, DEFAULT_SELECTOR)

_BENCHMARKS = flags.DEFINE_list("benchmarks", ["hotpotqa", "qasper", "mmlongbench"], "Benchmarks to run.")
_MAX_QUERIES = flags.DEFINE_integer("max_queries", None, "Questions per benchmark (default: all).")
_LIMITS = flags.DEFINE_list("limits", [], "Per-run question limits overriding --max_queries, as NAME=N "
                            "(NAME a benchmark or <benchmark>_pool), e.g. qasper=300,mmlongbench_pool=120.")
_OUTPUT = flags.DEFINE_string("output_dir", "runs/support_study", "Where records go (one folder per run).")
_CACHE = flags.DEFINE_string("cache_root", "runs/cache", "Embedding / index caches: <cache_root>/<benchmark>.")
_SELECTORS = flags.DEFINE_list("selectors", list(SELECTORS), "Selectors to compare.")
_POOL = flags.DEFINE_list("pool", [], "Benchmarks to also run as pools (configs/<benchmark>_pool.py).")
_RESAMPLES = flags.DEFINE_integer("num_resamples", 10_000, "Bootstrap resamples.")


def load_config(name: str):
    """``configs/<name>.py``'s ``get_config()``."""
    return importlib.import_module(f"configs.{name}").get_config()


def run_benchmark(config_name: str, bench: str, selectors: Sequence[str], max_queries: Optional[int],
                  out_root: pathlib.Path, cache_root: pathlib.Path) -> List[dict]:
    """Runs (or resumes) the harness for one config and returns its records."""
    from cdsjax.eval import evaluate

    config = load_config(config_name)
    config.output_dir = str(out_root / config_name)
    config.cache_dir = str(cache_root / bench)
    config.selectors = ",".join(selectors)
    config.budget = BUDGETS[bench]
    config.budgets = (BUDGETS[bench],)
    config.max_queries = max_queries
    config.num_resamples = 1000  # the harness's own summary; the tables below use --num_resamples
    records, _ = evaluate(config, progress=True, log=lambda _msg: None)
    return records


def by_selector(records: Sequence[dict]) -> Dict[str, Dict[str, dict]]:
    out: Dict[str, Dict[str, dict]] = {}
    for r in records:
        out.setdefault(r["selector"], {})[r["qid"]] = r
    return out


def paired(a: Dict[str, dict], b: Dict[str, dict], value, num_resamples: int) -> Optional[dict]:
    """Mean paired difference value(a) - value(b) with a bootstrap interval and win/tie/loss."""
    from cdsjax.eval.metrics import mean_ci

    diffs = []
    for qid, ra in a.items():
        rb = b.get(qid)
        if rb is None:
            continue
        va, vb = value(ra), value(rb)
        if va is None or vb is None:
            continue
        diffs.append(va - vb)
    if not diffs:
        return None
    d = np.asarray(diffs)
    mean, lo, hi, n = mean_ci(d, num_resamples=num_resamples)
    return dict(mean=mean, lo=lo, hi=hi, n=n, win=int((d > 1e-12).sum()), tie=int((np.abs(d) <= 1e-12).sum()),
                loss=int((d < -1e-12).sum()))


def selector_table(sel: Dict[str, Dict[str, dict]], recall: str, budget: int, num_resamples: int) -> str:
    from cdsjax.eval.metrics import mean_ci

    lines = [f"| selector | n | {recall}@{budget} [95% CI] | support median (notes) | support = every note | "
             f"filled | support in [B/2, 2B] (n >= 2B) | overlap with cosine | same set as cosine |",
             "|---|---|---|---|---|---|---|---|---|"]
    cos = sel.get(REFERENCE_SELECTOR, {})
    for name, recs in sel.items():
        vals = [r["metrics"].get(recall) for r in recs.values()]
        vals = [np.nan if v is None else v for v in vals]
        mean, lo, hi, n = mean_ci(vals, num_resamples=num_resamples)
        diag = [r.get("diagnostics", {}) for r in recs.values()]
        if diag and "support_size" in diag[0]:
            sizes = np.asarray([d["support_size"] for d in diag])
            whole = np.mean([d.get("whole_support", False) for d in diag])
            filled = np.mean([d.get("num_filled", 0) > 0 for d in diag])
            big = [(d["support_size"], r["num_notes"]) for d, r in zip(diag, recs.values())
                   if r["num_notes"] >= 2 * budget]
            inside = np.mean([budget / 2 <= s <= 2 * budget for s, _ in big]) if big else float("nan")
            cells = [f"{np.median(sizes):.0f}", f"{whole:.1%}", f"{filled:.1%}", f"{inside:.1%} of {len(big)}"]
        else:
            cells = ["-", "-", "-", "-"]
        pairs = [(set(r["selected"]), set(cos[q]["selected"])) for q, r in recs.items() if q in cos]
        if pairs and name != REFERENCE_SELECTOR:
            overlap = np.mean([len(a & b) / max(len(b), 1) for a, b in pairs])
            cells += [f"{overlap:.3f}", f"{np.mean([a == b for a, b in pairs]):.1%}"]
        else:
            cells += ["-", "-"]
        lines.append(f"| {name} | {n} | {mean:.3f} [{lo:.3f}, {hi:.3f}] | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def beta_line(sel: Dict[str, Dict[str, dict]]) -> str:
    """The note-block strength cds_support chose, as beta and as beta * n."""
    recs = [r for r in sel.get(SUPPORT, {}).values() if "beta" in r.get("diagnostics", {})]
    if not recs:
        return ""
    beta = np.asarray([r["diagnostics"]["beta"] for r in recs])
    gamma = beta * np.asarray([r["num_notes"] for r in recs])
    q = lambda a: "{:.3g} [{:.3g}, {:.3g}]".format(*np.percentile(a, [50, 25, 75]))
    return f"cds_support's chosen beta, median [IQR]: {q(beta)}; beta * n: {q(gamma)}"


def paired_table(sel: Dict[str, Dict[str, dict]], value, label: str, num_resamples: int) -> str:
    lines = [f"| {label} | minus | n | mean diff [95% CI] | win / tie / loss |", "|---|---|---|---|---|"]
    for ref in REFERENCES:
        if ref not in sel:
            continue
        for name in sel:
            if name == ref or (name in REFERENCES and REFERENCES.index(name) < REFERENCES.index(ref)):
                continue
            p = paired(sel[name], sel[ref], value, num_resamples)
            if p is None:
                continue
            lines.append(f"| {name} | {ref} | {p['n']} | {p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] | "
                         f"{p['win']} / {p['tie']} / {p['loss']} |")
    return "\n".join(lines)


def share_table(sel: Dict[str, Dict[str, dict]], num_resamples: int) -> str:
    from cdsjax.eval.metrics import mean_ci

    lines = ["| selector | n | gold-document share [95% CI] |", "|---|---|---|"]
    for name, recs in sel.items():
        vals = [np.nan if gold_doc_share(r) is None else gold_doc_share(r) for r in recs.values()]
        mean, lo, hi, n = mean_ci(vals, num_resamples=num_resamples)
        lines.append(f"| {name} | {n} | {mean:.3f} [{lo:.3f}, {hi:.3f}] |")
    return "\n".join(lines)


def drop_table(drops: Dict[str, Dict[str, dict]], num_resamples: int) -> str:
    from cdsjax.eval.metrics import mean_ci

    lines = ["| selector | n | pool minus single [95% CI] |", "|---|---|---|"]
    for name, recs in drops.items():
        mean, lo, hi, n = mean_ci([r["drop"] for r in recs.values()], num_resamples=num_resamples)
        lines.append(f"| {name} | {n} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    return "\n".join(lines)


def num_notes_line(records: Sequence[dict]) -> str:
    first = {}
    for r in records:
        first.setdefault(r["qid"], r["num_notes"])
    n = np.asarray(list(first.values()))
    return f"{len(n)} questions, notes per question median {np.median(n):.0f} (min {n.min()}, max {n.max()})"


def gold_doc_share(r: dict) -> Optional[float]:
    """Share of the selected notes that come from the question's own document (pool runs)."""
    return r["metrics"].get("gold_doc_share")


def report(records, title: str, recall: str, budget: int) -> dict:
    """Prints one benchmark's tables (selectors, beta, paired differences); returns its records by selector."""
    sel = by_selector(records)
    print(f"\n#### {title}: {num_notes_line(records)}, B = {budget}\n")
    print(selector_table(sel, recall, budget, _RESAMPLES.value))
    print(beta_line(sel))
    print()
    print(paired_table(sel, lambda r: r["metrics"].get(recall), f"{recall}@{budget}", _RESAMPLES.value))
    return sel


def main(argv):
    from experiments.cli import check_argv

    check_argv(argv)  # this script takes flags, not a --config
    out_root = pathlib.Path(_OUTPUT.value)
    cache_root = pathlib.Path(_CACHE.value)
    for bench in _BENCHMARKS.value:
        if bench not in BUDGETS:
            raise app.UsageError(f"unknown benchmark {bench!r}; known: {sorted(BUDGETS)}")
    limits = {}
    for item in _LIMITS.value:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise app.UsageError(f"--limits entries are NAME=N, got {item!r}")
        limits[name] = int(value)
    import os

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for bench in _BENCHMARKS.value:
        budget, recall = BUDGETS[bench], RECALL[bench]
        records = run_benchmark(bench, bench, _SELECTORS.value, limits.get(bench, _MAX_QUERIES.value), out_root,
                                cache_root)
        sel = report(records, f"{bench} (single document)", recall, budget)
        pool_name = f"{bench}_pool"
        if bench in _POOL.value:
            if not (ROOT / "configs" / f"{pool_name}.py").is_file():
                raise app.UsageError(f"--pool={bench}: configs/{pool_name}.py does not exist")
            pool_limit = limits.get(pool_name, _MAX_QUERIES.value)
            pool_records = run_benchmark(pool_name, bench, _SELECTORS.value, pool_limit, out_root, cache_root)
            pool = report(pool_records, f"{bench} (pool)", recall, budget)
            print()
            print(share_table(pool, _RESAMPLES.value))
            print()
            print(paired_table(pool, gold_doc_share, "gold-document share", _RESAMPLES.value))
            # single -> pool drop per question, paired across selectors
            drops = {}
            for name in pool:
                if name not in sel:
                    continue
                drops[name] = {}
                for qid, r in pool[name].items():
                    s = sel[name].get(qid)  # single-document records of the same question
                    if s is None:
                        continue
                    a, b = r["metrics"].get(recall), s["metrics"].get(recall)
                    if a is None or b is None:
                        continue
                    drops[name][qid] = {"drop": a - b}
            print(f"\nsingle -> pool change of {recall}@{budget} (pool minus single), per selector and paired:\n")
            print(drop_table(drops, _RESAMPLES.value))
            print()
            print(paired_table(drops, lambda r: r["drop"], "drop", _RESAMPLES.value))
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    app.run(main)
