r"""Does the evidence hold the answer under each relevance? Reader-free, on the development data.

For each relevance variant (``dense`` without context = the relevance before this study, ``dense+context``,
``hybrid``, ``hybrid+context``; ``--variants`` picks), the evaluation selects ``--budget`` notes per question
with each selector, the notes are fitted to ``--tokens`` evidence tokens as the reader gets them
(:func:`cdsjax.io.reading.reader.fit_items`), and has-answer (the gold answer's text is in what the reader gets) is scored.
Prints per selector and variant: has-answer over the covered questions, page recall where the benchmark has pages
(MMLongBench-Doc), and the paired difference to the first variant (bootstrap 95% interval, W/T/L); writes
``results/relevance/<bench>.md`` and a per-question CSV.

    python experiments/relevance_table.py qasper --questions 300
    python experiments/relevance_table.py mmlongbench --questions 150
    python experiments/relevance_table.py hotpotqa --questions 200 --budget 4

With ``--weights 0.1,0.2,...`` it also prints the cross-validated choice of the lexical weight: for each of
``--folds`` folds of the questions, the weight with the best has-answer on the other folds, scored on the held-out
fold (``hybrid+context`` variants only).
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "relevance"
VARIANTS = {"dense": ("dense", False), "dense+context": ("dense", True), "hybrid": ("hybrid", False),
            "hybrid+context": ("hybrid", True)}


def paired(diffs: np.ndarray, resamples: int = 10_000, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def run_variant(bench: str, questions: int, budget: int, tokens: int, selectors: str, mode: str, context: bool,
                weight: float, cache: str = "") -> dict:
    """``{(selector, qid): (has_answer or None, page_recall or None)}`` of one relevance variant; kept under the
    cache (``scores-*.json``, named by every argument and the code's commit) so a rerun of the same variant in the
    same code reads it back."""
    import hashlib
    import json
    import subprocess

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    where = pathlib.Path(cache or ROOT / "runs" / "relevance-cache" / bench)
    name = f"{bench}-{questions}-{budget}-{tokens}-{selectors}-{mode}-{int(context)}-{weight}-{commit.strip()}"
    kept = where / f"scores-{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"
    if kept.is_file():
        rows = json.loads(kept.read_text())
        if rows.get("name") == name:
            return {(s, q): (h, r) for s, q, h, r in rows["rows"]}
    out = _run_variant(bench, questions, budget, tokens, selectors, mode, context, weight, cache)
    where.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"name": name, "rows": [[s, q, h, r] for (s, q), (h, r) in out.items()]}))
    return out


def _run_variant(bench: str, questions: int, budget: int, tokens: int, selectors: str, mode: str, context: bool,
                 weight: float, cache: str = "") -> dict:
    from configs import answers
    from cdsjax.eval import evaluate
    from cdsjax.eval.answer_evidence import sentence_similarity
    from cdsjax.eval.evaluate import config_evidence
    from cdsjax.eval.answers import has_answer
    from cdsjax.eval.records import RECORDS_FILE, read_records
    from cdsjax.io.embed import Embedder
    from cdsjax.io.reading.prompt import note_text
    from cdsjax.io.reading.reader import fit_items

    config = answers.get_config(bench) if bench != "hotpotqa" else _hotpot_config()
    config.reader.local = ""
    config.reader.url = ""
    config.max_queries = questions
    config.selectors = selectors
    config.budget, config.budgets = budget, (budget,)
    config.num_resamples = 100
    config.relevance.mode, config.relevance.context, config.relevance.lexical_weight = mode, context, weight
    with tempfile.TemporaryDirectory() as tmp:
        config.output_dir = tmp
        config.cache_dir = cache or str(ROOT / "runs" / "relevance-cache" / bench)
        evaluate(config, progress=False, log=lambda s: None)
        records = list(read_records(pathlib.Path(tmp) / RECORDS_FILE))
    embedder = Embedder(config)
    problems, source = config_evidence(config, embedder)
    by_qid = {q.query.qid: q for q in problems}
    similarity = sentence_similarity(embedder)
    out = {}
    for rec in records:
        problem = by_qid[rec["qid"]]
        targets = problem.answer_targets()
        hit = None
        if targets is not None:
            fitted = fit_items(problem.query.question, source.items(rec["selected"]), tokens, max_text_chars=1500,
                               images=False, similarity=similarity)
            hit = bool(has_answer([note_text(i, 1500) for i in fitted.items], targets))
        recall = next((v for k, v in rec.get("metrics", rec).items() if str(k).startswith("page_recall")), None)
        out[(rec["selector"], rec["qid"])] = (hit, recall)
    return out


def _hotpot_config():
    from configs import hotpotqa

    config = hotpotqa.get_config()
    from cdsjax.eval.reader_setup import reader_settings

    if "reader" not in config:
        config.reader = reader_settings()
    return config


def main(argv=None) -> int:
    from cdsjax.defaults import DEFAULT_LEXICAL_WEIGHT
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", choices=("qasper", "mmlongbench", "hotpotqa"))
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--budget", type=int, default=5)
    p.add_argument("--tokens", type=int, default=500, help="evidence tokens the reader gets (default: 500)")
    p.add_argument("--selectors", default=f"{REFERENCE_SELECTOR},{DEFAULT_SELECTOR}")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--weight", type=float, default=DEFAULT_LEXICAL_WEIGHT)
    p.add_argument("--weights", default="", help="lexical weights to cross-validate (hybrid+context)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--cache", default="", help="the evaluation's cache (indexes, vectors); default runs/relevance-cache/BENCH")
    args = p.parse_args(argv)

    variants = [v for v in args.variants.split(",") if v]
    results = {}
    for v in variants:
        mode, context = VARIANTS[v]
        results[v] = run_variant(args.bench, args.questions, args.budget, args.tokens, args.selectors, mode,
                                 context, args.weight, args.cache)
        print(f"ran {v}", flush=True)
    base = variants[0]
    selectors = list(dict.fromkeys(s for s, _ in results[base]))
    lines = [f"{args.bench}: {args.questions} questions asked, B = {args.budget} notes fitted to {args.tokens} evidence "
             f"tokens; has-answer over the covered questions; lexical weight {args.weight}; paired difference to "
             f"`{base}` (95% bootstrap interval, W/T/L)", "",
             "| selector | relevance | n | has-answer | vs " + base + " | W/T/L | page recall |", "|---|---|---|---|---|---|---|"]
    rows = []
    for s in selectors:
        qids = [q for (sel, q), (h, _) in results[base].items() if sel == s and h is not None]
        for v in variants:
            hits = np.array([results[v][(s, q)][0] for q in qids], float)
            ref = np.array([results[base][(s, q)][0] for q in qids], float)
            d = hits - ref
            lo, hi = paired(d) if v != base else (0.0, 0.0)
            recalls = [results[v][(s, q)][1] for (sel, q) in results[v] if sel == s and results[v][(s, q)][1] is not None]
            rec = f"{np.mean(recalls):.3f}" if recalls else ""
            wtl = f"{int((d > 0).sum())}/{int((d == 0).sum())}/{int((d < 0).sum())}"
            lines.append(f"| {s} | {v} | {len(qids)} | {hits.mean():.3f} | "
                         f"{'–' if v == base else f'{d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]'} | {wtl} | {rec} |")
            for q in qids:
                rows.append(dict(selector=s, relevance=v, qid=q, has_answer=int(results[v][(s, q)][0])))
    if args.weights:
        lines += ["", *cross_validate(args, [float(w) for w in args.weights.split(",")])]
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.bench}.md").write_text(text + "\n")
    with open(OUT / f"{args.bench}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


def cross_validate(args, weights) -> list:
    """Lines of the table of the lexical weight and context chosen together by ``args.folds``-fold
    cross-validation (each weight with the context and without)."""
    per = {}
    for w in weights:
        for context in (True, False):
            per[(w, context)] = run_variant(args.bench, args.questions, args.budget, args.tokens, args.selectors,
                                            "hybrid", context, w, args.cache)
            print(f"ran weight {w}, context {context}", flush=True)
    weights = list(per)
    selectors = list(dict.fromkeys(s for s, _ in per[weights[0]]))
    qids = sorted({q for (s, q), (h, _) in per[weights[0]].items() if h is not None})
    folds = np.arange(len(qids)) % args.folds
    rng = np.random.default_rng(0)
    rng.shuffle(folds)
    lines = [f"Lexical weight and context by {args.folds}-fold cross-validation (has-answer of "
             f"{', '.join(selectors)} together):", "", "| weight, context | has-answer (all questions) |", "|---|---|"]
    score = {w: np.array([[per[w][(s, q)][0] for s in selectors] for q in qids], float).mean(axis=1)
             for w in weights}
    for w in weights:
        lines.append(f"| {w[0]}, {'with' if w[1] else 'without'} | {score[w].mean():.3f} |")
    held, chosen = [], []
    for k in range(args.folds):
        train = folds != k
        best = max(weights, key=lambda w: (score[w][train].mean(), -w[0], w[1]))
        chosen.append(best)
        held.append(score[best][~train])
    lines += ["", f"chosen per fold: {chosen}; held-out has-answer of the chosen weights: "
              f"{np.concatenate(held).mean():.3f}"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
