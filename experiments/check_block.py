"""How often the serving path (the corpus's note block, solved by the selector's solver, ``pdas``: the primal-dual
active set, the active set as its fallback) picks other notes than the dense solve of each question, on real
embeddings.

The dense solve with the corpus's bound is what the evaluation ran before it gave each question its note block
(the selector's solver on a dense payoff: the active set), so a question whose picks differ here is one whose
evaluation record changed when the evaluation began to run the serving solver. Corpora: QASPER
paragraphs (``experiments/bench_latency.py``'s synthetic corpora of ``--sizes`` notes, every question on their
papers) and, with ``--index DIR,...``, an MMLongBench-Doc index with its benchmark questions. For each
question: the picks (indices in order) of both paths, the largest weight difference, and, where the picks
differ, whether the first differing pair was a near-tie in the dense path's scores.

    python experiments/check_block.py --sizes 164,1000 --index runs/idx38/A,runs/idx38/B --questions 200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import CACHE, qasper_embeddings, selectors, synthetic_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def compare(pipe, questions, names) -> dict:
    """Per selector: questions, same picks, and the differing questions' details."""
    import jax

    from cdsjax import core
    from cdsjax.pipeline.catalog import selector_spec

    out = {}
    for name in names:
        spec = selector_spec(name)
        pipe.select(questions[0], selector=name, budget=10)  # compiles, computes the bound and block
        fn = pipe.selector_fn(name, 10)
        same, diffs, max_dw = 0, [], 0.0
        for i, q in enumerate(questions):
            served = pipe.with_bound(fn, pipe.candidates.problem(q, spec), pipe.selector_key(name, 10))
            assert isinstance(served, core.BlockProblem), f"{name} does not run on the corpus block"
            dense = jax.device_get(fn(served.dense_problem()))
            fast = jax.device_get(fn(served))
            a = np.asarray(dense.indices)[np.asarray(dense.selected_valid)].tolist()
            b = np.asarray(fast.indices)[np.asarray(fast.selected_valid)].tolist()
            max_dw = max(max_dw, float(np.max(np.abs(np.asarray(dense.result.x) - np.asarray(fast.result.x)))))
            if a == b:
                same += 1
                continue
            k = next(j for j in range(min(len(a), len(b))) if a[j] != b[j])
            sd = np.asarray(dense.scores)
            diffs.append({"question": i, "dense": a, "block": b, "first_diff": k,
                          "dense_scores_at": [float(x) for x in sd[max(k - 1, 0):k + 2]],
                          "dense_kkt": float(dense.result.kkt_residual), "block_kkt": float(fast.result.kkt_residual),
                          "dense_filled": int(dense.num_filled), "block_filled": int(fast.num_filled)})
        out[name] = {"questions": len(questions), "same": same, "max_weight_diff": max_dw, "diffs": diffs}
        print(f"  {name}: {same}/{len(questions)} same picks, max |dx| {max_dw:.2e}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="164,1000")
    p.add_argument("--index", default=None, help="comma-separated index directories (one corpus)")
    p.add_argument("--questions", type=int, default=200, help="at most this many questions per corpus")
    p.add_argument("--out", default=str(CACHE / "check_block.json"))
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    args = p.parse_args(argv)

    from cdsjax.pipeline import Corpus, Pipeline

    from cdsjax.core.registry import LEARNED_SELECTOR

    names = [selectors()[0], selectors()[1], LEARNED_SELECTOR]
    report = {"load_start": os.getloadavg()[0], "corpora": {}}
    data = np.load(qasper_embeddings(data_root=args.data_root))
    for size in [int(s) for s in args.sizes.split(",") if s]:
        emb, docs, pages, questions = synthetic_corpus(data, size)
        n = len(emb)
        notes = [{"note_id": f"n{i}", "doc_id": f"paper{docs[i]}", "page": int(pages[i]), "kind": "text",
                  "text": "", "bbox": None} for i in range(n)]
        pipe = Pipeline(Corpus(embeddings=emb, links=np.zeros((n, n), bool), notes=notes,
                               embedder={"model": "all-MiniLM-L6-v2"}, roots=[]), embedder=object())
        print(f"qasper {n} notes, {min(len(questions), args.questions)} questions", flush=True)
        report["corpora"][f"qasper-{n}"] = compare(pipe, questions[:args.questions], names)
    if args.index:
        pipe = Pipeline.from_paths(args.index.split(","))
        samples = json.loads((Path(args.data_root) / "mmlongbench" / "samples.json").read_text())
        docs = {Path(d).name.rsplit("-", 1)[0] for d in args.index.split(",")}
        qs = [s["question"] for s in samples if Path(s.get("doc_id", "")).stem in docs][:args.questions]
        print(f"mmlongbench index {len(pipe.corpus)} notes, {len(qs)} questions", flush=True)
        report["corpora"][f"mmlongbench-{len(pipe.corpus)}"] = compare(pipe, pipe.encode(qs), names)
    report["load_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    t0 = time.time()
    code = main()
    print(f"done in {time.time() - t0:.0f}s")
    sys.exit(code)
