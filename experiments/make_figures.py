r"""Draws the evaluation figures (PNG) from harness outputs.

Usage (from the repository root)::

    python experiments/make_figures.py --runs runs/ablations --out runs/figures \
        --pca-config configs/hotpotqa.py --cache-dir runs/cdsjax_runs/cache

* ``sweep_<param>.png``: recall vs each swept setting found in the ``summary.csv``
  files under ``--runs`` (labels ``<selector>_<param>=<value>``, see
  ``configs/ablations/sweeps.py``), one line per benchmark, cosine dashed.
* ``budget_<benchmark>.png``: recall vs budget, one line per selector, for every
  benchmark whose summaries hold several budgets of a plain selector.
* ``pca_<qid>.png`` (and ``.npz``, which the notebook redraws): one question's
  notes on their first two principal components with the gold notes, cosine's and
  CDS's picks (the paper's Figure 2).
* ``--tables``: instead of figures, prints the compact markdown tables of RESULTS.md. The question is ``--qid`` or the first of the
  config's questions on which the two selections differ.
"""

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cdsjax.pipeline.catalog import PAPER_SELECTOR, REFERENCE_SELECTOR, selector_spec  # noqa: E402
from cdsjax.eval import figures as F  # noqa: E402

SWEPT = ("lam", "prior", "coupling", "tau", "beta")


def pca_case(config, *, qid=None, selectors=(REFERENCE_SELECTOR, PAPER_SELECTOR), cache_dir=None,
             progress: bool = False) -> dict:
    """Builds one question's PCA case for :func:`cdsjax.eval.figures.pca_map`.

    Loads the config's benchmark (text benchmarks only: HotpotQA, QASPER), embeds its
    notes (cached under ``cache_dir``, default the config's), runs ``selectors`` at
    ``config.budget`` with the config's ``selector_options``, and returns the case of
    ``qid``, or else of the first question with gold notes where the last selector
    finds more gold than the first, else where their picks differ, else the first
    question with gold (the config's ``max_queries`` bounds the search).
    """
    import numpy as np

    from cdsjax.eval.problems import load_configured_benchmark, text_problems
    from cdsjax.eval.run import Executables, batch_chunk, cached_selector, run_selector
    from cdsjax.io.embed import Embedder

    bench = load_configured_benchmark(config)
    if not bench.corpora:
        raise ValueError(f"pca_case needs a text benchmark, got {config.benchmark!r}")
    cache = pathlib.Path(cache_dir or config.get("cache_dir", "") or pathlib.Path(config.output_dir) / "cache")
    problems = text_problems(bench, Embedder(config), cache_dir=cache,
                               link_window=int(config.get("link_window", 1)), progress=progress)
    if qid is not None:
        problems = [p for p in problems if p.query.qid == qid]
        if not problems:
            raise ValueError(f"--qid {qid!r}: no such question in {config.benchmark}")
    all_opts = config.get("selector_options", None) or {}
    all_opts = all_opts.to_dict() if hasattr(all_opts, "to_dict") else dict(all_opts)
    picks = {}
    executables = Executables()  # the run's compiled calls, per selector and shape
    for label in selectors:
        opts = dict(all_opts.get(label, {}))
        name = opts.pop("selector", label)
        fn = cached_selector(name, int(config.budget), opts)
        sels = run_selector(fn, problems, chunk=batch_chunk(fn), spec=selector_spec(name),
                              buckets=tuple(config.get("buckets", None) or (16, 64, 256, 1024)),
                              max_batch=int(config.get("max_batch", 64)), executables=executables)
        picks[label] = [[int(i) for i in np.asarray(s.indices)[np.asarray(s.selected_valid, bool)]]
                        for s in sels]
    candidates = []  # (case, rank): 2 = last selector finds more gold, 1 = picks differ, 0 = same picks
    for k, p in enumerate(problems):
        gold = [i for i, nid in enumerate(p.note_ids) if nid in set(p.query.gold_note_ids)]
        if not gold and qid is None:
            continue
        chosen = {label: picks[label][k] for label in selectors}
        found = [len(set(v) & set(gold)) for v in chosen.values()]
        differ = len({tuple(sorted(v)) for v in chosen.values()}) > 1
        titles = [t.split("\n", 1)[0][:28] for t in bench.corpora[p.query.doc_ids[0]].texts]
        candidates.append(({"qid": p.query.qid, "question": p.query.question, "notes": p.notes,
                            "query": p.query_emb, "picks": chosen, "gold": gold, "labels": titles},
                           2 if found[-1] > found[0] else int(differ)))
    if not candidates:
        raise ValueError(f"none of the {len(problems)} questions loaded has gold notes")
    best = max(rank for _, rank in candidates)
    return next(case for case, rank in candidates if rank == best)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/ablations", help="folder searched for summary.csv files")
    ap.add_argument("--out", default="runs/figures", help="where PNGs go")
    ap.add_argument("--pca-config", default="configs/hotpotqa.py",
                    help="text-benchmark config for the PCA map ('' skips it)")
    ap.add_argument("--cache-dir", default=None, help="embedding cache (default: the config's)")
    ap.add_argument("--qid", default=None, help="question of the PCA map (default: first that differs)")
    ap.add_argument("--selectors", default=f"{REFERENCE_SELECTOR},{PAPER_SELECTOR}",
                    help="selectors drawn on the PCA map")
    ap.add_argument("--tables", action="store_true",
                    help="only print one compact markdown table per run under --runs (as in RESULTS.md)")
    args = ap.parse_args(argv)
    if args.tables:
        rows = F.read_summary(args.runs)
        for run in dict.fromkeys(r["run"] for r in rows):
            bench = next(r["benchmark"] for r in rows if r["run"] == run)
            metrics = {"mmlongbench": ("page_recall", "box_recall")}.get(bench, ("paragraph_recall", "all_found"))
            if run.endswith("budget"):  # one column per budget
                metrics = metrics[:1]
            print(f"### {run} ({bench})\n\n{F.compact_table(rows, metrics, run=run)}\n")
        return 0

    import matplotlib

    matplotlib.use("Agg")
    out = pathlib.Path(args.out)
    written = []
    rows = F.read_summary(args.runs) if pathlib.Path(args.runs).exists() else []
    for param in SWEPT:
        if any(F.parse_label(r["selector"]) and F.parse_label(r["selector"])[1] == param for r in rows):
            written.append(F.save(F.plot_sweep(rows, param), out / f"sweep_{param}.png"))
    for bench in dict.fromkeys(r["benchmark"] for r in rows):
        plain = [r for r in rows if r["benchmark"] == bench and F.parse_label(r["selector"]) is None]
        if len({r["budget"] for r in plain}) > 1:
            multi = [r for r in plain if r["run"].endswith("budget")] or plain
            written.append(F.save(F.plot_budget(multi, bench), out / f"budget_{bench}.png"))
    if args.pca_config:
        from cdsjax.commands.eval import load_config

        config = load_config(args.pca_config)
        case = pca_case(config, qid=args.qid, selectors=[s for s in args.selectors.split(",") if s],
                        cache_dir=args.cache_dir)
        stem = "pca_" + "".join(c if c.isalnum() else "_" for c in case["qid"])
        F.save_case(out / f"{stem}.npz", **case)
        fig = F.pca_map(case["notes"], case["query"], case["picks"], case["gold"], labels=case["labels"],
                        title=f"{config.benchmark} {case['qid']}: B={config.budget}")
        written.append(F.save(fig, out / f"{stem}.png"))
        print(f"PCA question {case['qid']}: {case['question']}")
        print("  gold:", case["gold"], "| " + " | ".join(f"{k}: {v}" for k, v in case["picks"].items()))
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
