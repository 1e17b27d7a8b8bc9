"""The certified penalties on real blocks: how far above the float64 eigenvalue, and how many picks change.

Run (from the repository root; needs ``runs/bench_latency/qasper.npz`` from ``bench_latency.py``)::

    python experiments/check_bounds.py --questions 60

For the first ``--questions`` QASPER questions (each over its own paper's paragraphs, pages of five), three
penalties that depend on the question, each computed exactly (one ``eigvalsh``) and by a bound:

- the paper's game with ``alpha_from="full"`` (converged CDS): ``alpha_bound="certified"``
  (:func:`cdsjax.core.games.certified.certified_bound`, per question, O(k n²));
- peeling (two query rows: the question and its first note's embedding) with ``alpha_bound="certified"``
  for every round after the first;
- the learned game (the shipped fit) with relevance-weighted repulsion 1: the corpus bound of its
  repulsion-free block (:func:`cdsjax.core.games.learned.learned_corpus_bound`, once per paper).

It checks every bound against ``numpy.linalg.eigvalsh`` in float64 of the same block and reports the relative
excess and the share of questions whose picks (indices, in order) differ. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=60)
    p.add_argument("--budget", type=int, default=10)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from bench_latency import CACHE, PAGE_SIZE
    from cdsjax import core
    from cdsjax.core.batching import bucket_size
    from cdsjax.core.games.affinity import build_affinity
    from cdsjax.core.games.learned import learned_affinity
    from cdsjax.core.games.learned import learned_corpus_bound
    from cdsjax.learn import default_params

    data = np.load(CACHE / "qasper.npz")
    theta = default_params().replace(rel_repulsion=1.0)
    rows = {"full": [], "peel": [], "learned": []}
    for k in range(args.questions):
        i = int(data["paper_of"][k])
        s, n = int(data["starts"][i]), int(data["sizes"][i])
        size = bucket_size(n)
        z = np.zeros((size, data["notes"].shape[1]), np.float32)
        z[:n] = data["notes"][s:s + n]
        valid = np.arange(size) < n
        pages = np.full(size, -1, np.int32)
        pages[:n] = np.arange(n) // PAGE_SIZE
        q = data["questions"][k]
        problem = core.CDSProblem.create(z, q, valid, pages=pages)

        for mode in ("full", "peel", "learned"):
            if mode == "full":
                exact_p, bound_p = (core.CDSParams(alpha_from="full"),
                                    core.CDSParams(alpha_from="full", alpha_bound="certified"))
                a = core.cds(problem, core.Single(), exact_p, budget=args.budget)
                b = core.cds(problem, core.Single(), bound_p, budget=args.budget)
                aff = build_affinity(z, q, valid, bound_p)
                block = np.asarray(aff.matrix, np.float64)[np.ix_(np.asarray(aff.valid), np.asarray(aff.valid))]
                lam = np.linalg.eigvalsh(block)[-1]
                excess = (float(aff.alpha) - 1e-3 - lam) / abs(lam)
            elif mode == "peel":
                two = core.CDSProblem.create(z, np.stack([q, z[0]]), valid, pages=pages)
                a = core.cds(two, core.Peel(), core.CDSParams(), budget=args.budget, solver=core.ActiveSet())
                b = core.cds(two, core.Peel(), core.CDSParams(alpha_bound="certified"), budget=args.budget,
                             solver=core.ActiveSet())
                excess = np.nan  # rounds' blocks are internal; the guarantee is the same certified_bound
            else:
                a = core.cds(problem, core.Single(), theta, budget=args.budget)
                bound = learned_corpus_bound(jnp.asarray(z), jnp.asarray(valid), theta, pages=jnp.asarray(pages))
                b = core.cds(problem.replace(bound=bound), core.Single(), theta, budget=args.budget)
                aff = learned_affinity(z, q, valid, theta, pages=pages)
                free = np.asarray(aff.free)
                lam = np.linalg.eigvalsh(np.asarray(aff.matrix, np.float64)[np.ix_(free, free)])[-1]
                excess = (float(bound) - 1e-3 - lam) / abs(lam)
                assert float(bound) >= lam + 1e-3 - 1e-6, (k, float(bound), lam)
            if mode == "full":
                assert float(aff.alpha) >= lam + 1e-3, (k, float(aff.alpha), lam)
            same = np.asarray(a.indices)[np.asarray(a.selected_valid)].tolist() == \
                np.asarray(b.indices)[np.asarray(b.selected_valid)].tolist()
            rows[mode].append((excess, same))
        jax.clear_caches() if k % 20 == 19 else None

    print(f"{args.questions} QASPER questions, B = {args.budget}, load {os.getloadavg()[0]:.1f}")
    print("| penalty found per question | bound | bound >= float64 lambda_max | excess over it, median / max "
          "| picks changed |")
    print("|---|---|---|---|---|")
    names = {"full": ("paper game, alpha_from=\"full\"", "certified_bound per question"),
             "peel": ("peeling, 2 query rows, rounds after the first", "certified_bound per round"),
             "learned": ("learned game, rel_repulsion = 1", "corpus bound of its repulsion-free block")}
    for mode, r in rows.items():
        ex = np.asarray([e for e, _ in r], float)
        changed = sum(not s for _, s in r)
        stat = "n/a" if np.all(np.isnan(ex)) else f"{np.nanmedian(ex):.2e} / {np.nanmax(ex):.2e}"
        ok = "n/a" if np.all(np.isnan(ex)) else "all"
        print(f"| {names[mode][0]} | {names[mode][1]} | {ok} | {stat} | {changed} of {len(r)} "
              f"({100 * changed / len(r):.0f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
