r"""The pool sweep: every selector at pool size in {1, 5, 10, 20} x distractors in
{random, similar} (``configs/pool_sweep.py``), and the open corpus at several K
(``configs/open_corpus.py``).

Usage (from the repository root)::

    python experiments/pool_sweep.py --benchmark mmlongbench --sizes 1,5 --distractors random,similar \
        --cache_dir runs/cache/mmlongbench
    python experiments/pool_sweep.py --benchmark mmlongbench --sizes 10,20 --max_queries 48 \
        --cache_dir runs/cache/mmlongbench
    python experiments/pool_sweep.py --benchmark mmlongbench --corpus_k 100,300 \
        --cache_dir runs/cache/mmlongbench

Each point runs :func:`cdsjax.eval.evaluate` into
``runs/pool_sweep/<benchmark>_<size>_<distractors>`` (or
``runs/eval/<benchmark>_corpus_k<K>``), resuming from its records, and prints its wall
time. Pool size 1 has no distractors, so it runs once (as ``_1_random``).
``experiments/pool_report.py`` turns the runs into tables and the figure.
"""

import argparse
import importlib
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _config_module(name: str):
    return importlib.import_module(f"configs.{name}")


def _csv(text: str):
    return [s.strip() for s in text.split(",") if s.strip()]


def points(benchmark: str, sizes, distractors, corpus_k):
    """``(name, config)`` of every requested point, in order."""
    sweep, corpus = _config_module("pool_sweep"), _config_module("open_corpus")
    out = []
    for size in sizes:
        for kind in (["random"] if size == 1 else distractors):
            out.append((f"{benchmark}_{size}_{kind}", sweep.get_config(f"{benchmark},{size},{kind}")))
    for k in corpus_k:
        out.append((f"{benchmark}_corpus_k{k}", corpus.get_config(f"{benchmark},{k}")))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmark", default="mmlongbench", choices=("mmlongbench", "qasper"))
    ap.add_argument("--sizes", default="", help="pool sizes, e.g. 1,5,10,20")
    ap.add_argument("--distractors", default="random,similar")
    ap.add_argument("--corpus_k", default="", help="open-corpus first-stage K values, e.g. 100,300")
    ap.add_argument("--max_queries", type=int, default=None, help="first questions only (all by default)")
    ap.add_argument("--selectors", default=None, help="default: the config's (all seven)")
    ap.add_argument("--cache_dir", default="", help="shared index / embedding cache")
    ap.add_argument("--data_root", default=None)
    ap.add_argument("--num_resamples", type=int, default=10_000)
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    from absl import logging

    logging.set_verbosity(logging.WARNING)
    from cdsjax.eval import evaluate

    todo = points(args.benchmark, [int(s) for s in _csv(args.sizes)], _csv(args.distractors),
                  [int(k) for k in _csv(args.corpus_k)])
    if not todo:
        ap.error("nothing to run: give --sizes and/or --corpus_k")
    for name, config in todo:
        config.max_queries = args.max_queries
        config.cache_dir = args.cache_dir
        config.num_resamples = args.num_resamples
        if args.selectors:
            config.selectors = args.selectors
        if args.data_root:
            config.data_root = args.data_root
        t0 = time.perf_counter()
        print(f"== {name} -> {config.output_dir}", flush=True)
        evaluate(config, progress=not args.no_progress)
        print(f"== {name}: {time.perf_counter() - t0:.1f} s wall", flush=True)


if __name__ == "__main__":
    main()
