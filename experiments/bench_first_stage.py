r"""Is exact search the open corpus's bottleneck? Times the first stage
(:func:`cdsjax.eval.pools.first_stage`: one ``jnp`` matmul and ``lax.top_k``) on random
unit vectors at growing collection sizes.

Usage (from the repository root)::

    python experiments/bench_first_stage.py --queries 324 --sizes 4000,12000,100000,300000 --k 300

For each collection size N it prints the compile-inclusive first call and the median
of ``--repeats`` warm calls, in seconds per batch and milliseconds per question, next
to the collection's float32 size. Compare with the selectors' per-question times in
``timings.jsonl`` of an open-corpus run.
"""

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _unit(rng, n, d):
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=324)
    ap.add_argument("--sizes", default="4000,12000,100000,300000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from cdsjax.eval.pools import first_stage, top_k_notes

    search = top_k_notes()  # one compiled search for the first and the warm calls

    rng = np.random.default_rng(0)
    q = _unit(rng, args.queries, args.dim)
    print(f"| N notes | collection MB | first call s | warm s (median of {args.repeats}) | warm ms / question |")
    print("|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        z = _unit(rng, n, args.dim)
        t0 = time.perf_counter()
        first_stage(q, z, args.k, top_k=search)
        first = time.perf_counter() - t0
        warm = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            first_stage(q, z, args.k, top_k=search)
            warm.append(time.perf_counter() - t0)
        w = float(np.median(warm))
        print(f"| {n:,} | {z.nbytes / 2**20:.0f} | {first:.3f} | {w:.3f} | {1000 * w / args.queries:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
