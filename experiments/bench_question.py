"""A question encoded in a fresh process: today's code against a checkout of older code, alternating.

    python experiments/bench_question.py --old-root DIR [--pairs 6]

Each run is ``python -c`` with the code's root on PYTHONPATH and JAX's persistent compilation cache on (a cache
directory per code, shared by its runs, as a user's runs share one): the import, the encoder's load
(``from_info`` of the shipped MiniLM: ``cdsjax.io.onnx_encoder.SentenceEncoder`` here, or the older
``cdsjax.io.query_encoder.QueryEncoder`` where the checkout has it) and one question's encode. Prints each run,
then the medians without each code's first run (which fills its compilation cache) and the ratio of walls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
from cdsjax.io.compilation_cache import enable_compilation_cache
enable_compilation_cache(sys.argv[1])
MINILM = dict(model="all-MiniLM-L6-v2", query_prefix="", document_prefix="", normalize=True)
try:
    from cdsjax.io.onnx_encoder import SentenceEncoder as Encoder
except ImportError:
    from cdsjax.io.query_encoder import QueryEncoder as Encoder
encoder = Encoder.from_info(MINILM)
t1 = time.perf_counter()
encoder.encode_queries(["What was the total revenue of the company in fiscal 2021?"])
t2 = time.perf_counter()
print(json.dumps(dict(encoder=Encoder.__name__, load=t1 - t0, encode=t2 - t1, torch="torch" in sys.modules)))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-root", required=True, help="a checkout of the code to compare against")
    ap.add_argument("--pairs", type=int, default=6)
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="bench_question_"))
    rows = {"old": [], "new": []}
    load = os.getloadavg()
    for i in range(args.pairs):
        for name, root in (("old", str(Path(args.old_root).resolve())), ("new", str(ROOT))):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", CHILD, str(cache / name)], cwd=root, capture_output=True,
                                  env=dict(os.environ, PYTHONPATH=root), text=True, timeout=600)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"bench_question: {name} failed: {proc.stderr[-1000:]}")
            row = dict(json.loads(proc.stdout.strip().splitlines()[-1]), wall=wall)
            rows[name].append(row)
            print(i, name, row, flush=True)
    after = os.getloadavg()
    print(f"\nload average before {load[0]:.2f}, after {after[0]:.2f}; medians without each code's first run:\n")
    print("| code | encoder | torch imported | wall s | load s | encode s |")
    print("|---|---|---|---:|---:|---:|")
    med = {}
    for name, rs in rows.items():
        rest = rs[1:] or rs
        med[name] = {k: statistics.median(r[k] for r in rest) for k in ("wall", "load", "encode")}
        print(f"| {name} | {rs[0]['encoder']} | {any(r['torch'] for r in rs)} | {med[name]['wall']:.2f} | "
              f"{med[name]['load']:.2f} | {med[name]['encode']:.3f} |")
    print(f"\nwall new / old: {med['new']['wall'] / med['old']['wall']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
