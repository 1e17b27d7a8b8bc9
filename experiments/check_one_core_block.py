"""Whether the evaluation's batched selection on the corpus block runs when compiled as for one core.

The evaluation compiles every selector with the compiling thread on one core (``cdsjax.eval.run.compiling_on_one_core``:
the same executables in every process). With each question's note block given (the serving solver ``pdas``
under ``jax.vmap``), the program compiled that way did not finish at 256 notes and 16 questions on a 2-core
CPU (still waiting after minutes), where the same program compiled normally ran in about half a second. This
script compiles ``jit(vmap(selector))`` either way and runs it once, each run under a watchdog.

    python experiments/check_one_core_block.py --notes 256 --batch 16 --one-core 1
    python experiments/check_one_core_block.py --notes 256 --batch 16 --one-core 0
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def synthetic(n: int, count: int, d: int = 64, seed: int = 5):
    """``count`` random corpora of ``n`` unit notes with links, pages of four notes, a question near note 0."""
    from cdsjax.selection import structure_codes

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        z = rng.normal(size=(n, d)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        q = (z[0] + 0.5 * rng.normal(size=d)).astype(np.float32)
        links = np.triu(rng.random((n, n)) < 0.2, 1)
        out.append((z, q / np.linalg.norm(q), links | links.T,
                    structure_codes(["doc"] * n, [j % 4 for j in range(n)], ["text"] * n)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--notes", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--one-core", type=int, default=1)
    p.add_argument("--watchdog", type=int, default=150, help="seconds before the run is reported stuck")
    args = p.parse_args(argv)
    faulthandler.dump_traceback_later(args.watchdog, exit=True, file=sys.stderr)

    import jax

    from cdsjax.eval.run import compiling_on_one_core
    from cdsjax.selection import Candidates, CorpusArrays, make_selector

    spec, fn = make_selector("cds_learned_pages", 10)
    corpus = CorpusArrays(wrap=lambda f, role: jax.jit(f))
    problems = [corpus.attach(fn, Candidates.pad(z, links=l, structure=s).problem(q, spec))
                for z, q, l, s in synthetic(args.notes, args.batch)]
    batch = jax.tree_util.tree_map(lambda *a: np.stack(a), *problems)
    keys = jax.numpy.stack([jax.random.PRNGKey(0)] * args.batch)
    t = time.perf_counter()
    lowered = jax.jit(jax.vmap(fn)).lower(batch, keys)
    if args.one_core:
        with compiling_on_one_core():
            call = lowered.compile()
    else:
        call = lowered.compile()
    print(f"compiled in {time.perf_counter() - t:.1f}s (one core: {bool(args.one_core)})", flush=True)
    t = time.perf_counter()
    jax.block_until_ready(call(batch, keys))
    print(f"ran in {time.perf_counter() - t:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
