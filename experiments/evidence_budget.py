r"""Does evidence sized for the reader in tokens keep the answer? Reader-free, on the development data.

Each selector picks ``--budget`` notes per question (the evaluation's selection, no reader); the notes then go to
the reader three ways, and has-answer (the gold answer's text is in what the reader gets; ``has_answer`` of the
evaluation) is scored for each:

* ``whole``: every selected note, whole;
* ``cut``: every note cut at 1,500 characters (what the reader got before token budgets, B notes at any length);
* ``fitted@T``: the notes filling ``T`` estimated tokens in rank order, the one that does not fit cut to its
  sentences nearest the question (cosine under the benchmark's embedder), as :meth:`cdsjax.io.reading.reader.Reader.answer`
  sends them (:func:`cdsjax.io.reading.reader.fit_items`).

    python experiments/evidence_budget.py qasper --questions 300 --tokens 300,500,700
    python experiments/evidence_budget.py mmlongbench --questions 60

Prints one row per (selector, way): has-answer over the covered questions, the mean estimated evidence tokens,
and the paired difference to ``cut`` with a bootstrap interval; writes ``results/evidence_budget/<bench>.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "evidence_budget"


def paired_interval(diffs: np.ndarray, resamples: int = 10_000, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", choices=("qasper", "mmlongbench"))
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--budget", type=int, default=5, help="notes selected per question (default: 5)")
    p.add_argument("--tokens", default="300,500,700", help="evidence token budgets (default: 300,500,700)")
    p.add_argument("--selectors", default=None, help="selectors (default: the reference and the default selector)")
    args = p.parse_args(argv)

    from configs import answers
    from cdsjax.eval import evaluate
    from cdsjax.eval.answers import has_answer
    from cdsjax.eval.answer_evidence import sentence_similarity
    from cdsjax.eval.evaluate import config_evidence
    from cdsjax.eval.records import RECORDS_FILE, read_records
    from cdsjax.io.embed import Embedder
    from cdsjax.io.reading.evidence_fit import estimate_tokens
    from cdsjax.io.reading.reader import fit_items
    from cdsjax.io.reading.prompt import note_text

    config = answers.get_config(args.bench)
    config.reader.local = ""
    config.max_queries = args.questions
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR

    config.selectors = args.selectors or f"{REFERENCE_SELECTOR},{DEFAULT_SELECTOR}"
    config.budget, config.budgets = args.budget, (args.budget,)
    config.num_resamples = 200
    tokens = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        config.output_dir = tmp
        evaluate(config, progress=False, log=lambda s: None)
        records = list(read_records(pathlib.Path(tmp) / RECORDS_FILE))
    embedder = Embedder(config)
    problems, source = config_evidence(config, embedder)
    by_qid = {q.query.qid: q for q in problems}

    similarity = sentence_similarity(embedder)  # as the evaluation's reader stage trims

    rows = {}
    for rec in records:
        problem = by_qid[rec["qid"]]
        targets = problem.answer_targets()
        if targets is None:
            continue
        question = problem.query.question
        items = source.items(rec["selected"])
        ways = {"whole": ([i.text or i.summary for i in items], None),
                "cut": ([note_text(i, 1500) for i in items], None)}
        ways["cut"] = (ways["cut"][0], sum(estimate_tokens(t) for t in ways["cut"][0]))
        for t in tokens:
            fitted = fit_items(question, items, t, max_text_chars=1500, images=False, similarity=similarity)
            ways[f"fitted@{t}"] = ([note_text(i, 1500) for i in fitted.items], fitted.tokens)
        for way, (texts, n_tokens) in ways.items():
            rows.setdefault((rec["selector"], way), []).append((rec["qid"], has_answer(texts, targets), n_tokens))

    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"{config.benchmark}: {args.questions} questions asked, B = {args.budget} notes; has-answer over the covered "
             "questions; paired difference to `cut` (95% bootstrap interval)", "",
             "| selector | evidence | n | has-answer | mean tokens | vs cut |", "|---|---|---|---|---|---|"]
    table = []
    for (selector, way), values in sorted(rows.items(), key=lambda kv: (kv[0][0], list(ways).index(kv[0][1]))):
        hits = np.array([v[1] for v in values])
        cut = {q: h for q, h, _ in rows[(selector, "cut")]}
        diffs = np.array([h - cut[q] for q, h, _ in values])
        lo, hi = paired_interval(diffs) if way != "cut" else (0.0, 0.0)
        toks = [v[2] for v in values if v[2] is not None]
        row = dict(benchmark=config.benchmark, selector=selector, evidence=way, n=len(values), has_answer=hits.mean(),
                   mean_tokens=float(np.mean(toks)) if toks else None, diff_vs_cut=diffs.mean(), lo=lo, hi=hi)
        table.append(row)
        mean_tokens = "" if row["mean_tokens"] is None else f"{row['mean_tokens']:.0f}"
        versus = "–" if way == "cut" else f"{diffs.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {selector} | {way} | {len(values)} | {hits.mean():.3f} | {mean_tokens} | {versus} |")
    print("\n".join(lines))
    with open(OUT / f"{config.benchmark}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    from cdsjax.io.provenance import provenance, provenance_line

    prov = provenance()
    (OUT / f"{config.benchmark}.md").write_text("\n".join(lines) + "\n\n" + provenance_line(prov))
    (OUT / f"{config.benchmark}.provenance.json").write_text(json.dumps(prov, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
