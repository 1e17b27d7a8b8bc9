r"""The default's read-out with and without captions read with their visuals (issue 62, item 8), on MMLongBench-Doc
development documents: for each question, the default selector (``cds_learned_pages``) is run on the same problem
with the notes' ``describes`` (a caption read as the figure or table it describes) and without it (the read-out
before), cosine alongside as a control; prints page recall, box recall, has-answer and distinct pages, how many
questions' evidence changed, and how many visual and caption notes the evidence holds.

Usage (from the repository root; indexes cached under ``--cache``)::

    python experiments/caption_readout.py --docs 2310.05634v2.pdf,2303.08559v2.pdf,PH_2016.06.08_Economy-Final.pdf
"""

import argparse
import dataclasses
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VISUALS = ("figure", "table", "chart")


def main(argv=None):
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR
    from cdsjax.eval.problems import pdf_problems
    from cdsjax.eval.run import Executables, batch_chunk, run_selector
    from cdsjax.eval.scoring import score_problem
    from cdsjax.io.datasets import load_benchmark
    from cdsjax.io.embed import Embedder
    from cdsjax.pipeline.selection import resolve_selector
    from configs import mmlongbench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", required=True, help="comma-separated MMLongBench-Doc document names")
    ap.add_argument("--data-root", default="../shared/data")
    ap.add_argument("--cache", default="runs/caption_readout/cache")
    ap.add_argument("--budgets", default="5,10")
    args = ap.parse_args(argv)
    docs = args.docs.split(",")
    config = mmlongbench.get_config()
    config.data_root = args.data_root
    config.index_workers = 1
    bench = load_benchmark("mmlongbench", config.data_root, None, page_source="mmlongbench", with_boxes=True)
    missing = sorted(set(docs) - set(bench.documents))
    if missing:
        raise SystemExit(f"not MMLongBench-Doc documents here: {', '.join(missing)}")
    bench = dataclasses.replace(bench, queries=[q for q in bench.queries if q.doc_ids[0] in docs],
                                documents={d: bench.documents[d] for d in docs})
    t0 = time.time()
    problems = pdf_problems(bench, config, Embedder(config), cache_dir=pathlib.Path(args.cache))
    print(f"{len(problems)} questions on {len(docs)} documents ({time.time() - t0:.0f} s to index and embed)")
    before = [dataclasses.replace(p, describes=None) for p in problems]
    executables = Executables()  # the run's compiled calls, per selector and shape
    for budget in (int(b) for b in args.budgets.split(",")):
        for name in (REFERENCE_SELECTOR, DEFAULT_SELECTOR):
            spec, fn = resolve_selector(name, budget)
            picks, scores = {}, {}
            for label, ps in (("before", before), ("after", problems)):
                sels = run_selector(fn, ps, buckets=tuple(config.buckets), max_batch=8, spec=spec,
                                    chunk=batch_chunk(fn), executables=executables)
                picks[label] = [[int(i) for i, ok in zip(s.indices, s.selected_valid) if ok] for s in sels]
                scores[label] = [score_problem(p, s, kind="pdf") for p, s in zip(ps, sels)]
            changed = sum(a != b for a, b in zip(picks["before"], picks["after"]))
            print(f"B={budget} {name}: evidence changed on {changed} of {len(problems)} questions")
            for metric in ("page_recall", "box_recall", "has_answer", "distinct_pages"):
                cells = []
                for label in ("before", "after"):
                    v = [r[metric] for r in scores[label] if r.get(metric) is not None]
                    cells.append(f"{label} {np.mean(v):.3f} (n={len(v)})" if v else f"{label} -")
                print(f"  {metric}: " + ", ".join(cells))
            for label in ("before", "after"):
                chosen = [(p, j) for p, idx in zip(problems, picks[label]) for j in idx]
                visual = sum(p.kinds[j] in VISUALS for p, j in chosen)
                caption = sum(bool(p.describes[j]) for p, j in chosen)
                print(f"  {label}: {visual} visual notes, {caption} caption notes, of {len(chosen)}")


if __name__ == "__main__":
    main()
