r"""Fits the "not in the document" rule (:mod:`cdsjax.pipeline.abstain`) on the development data, cross-validated by
document, and writes the shipped rules file. Reader-free; rerun it whenever the relevance or a selector changes.

    python experiments/abstain_fit.py                 # evaluate (resumable) + fit + tables; rules file unchanged
    python experiments/abstain_fit.py --write         # ... and write cdsjax/pipeline/abstain_rules.json

Data: the first 300 QASPER and 150 MMLongBench-Doc development questions, each selector's selection at B = 5
(``configs/answers.py`` settings, no reader), evaluated into ``--runs/<bench>`` (indexes and embeddings cached under
``--cache/<bench>``). Each record carries the scores a rule may use (``strength``,
:func:`cdsjax.pipeline.abstain.strength_features`).

What a rule should do: abstain on an **unanswerable** question (U: QASPER's all-annotators-unanswerable,
MMLongBench-Doc's "Not answerable") and read an answerable question whose selected evidence **holds the answer**
(H: ``has_answer`` 1); an answerable question whose evidence does not hold the answer is left out of the objective
(its reader is wrong either way, up to ~1.5%, RESULTS). A rule is a score (``best_relevance``, ``margin``,
``top_score``; CDS ``payoff`` for ``top_score``) and a threshold; it is chosen per selector to maximise right decisions
(#U abstained + #H read; ties to the lowest threshold), over both benchmarks' questions together. A selector's
rule ships only where its cross-validated right decisions beat never abstaining with the 95% interval above 0;
otherwise it never abstains (the fitted threshold is kept in the file as ``fitted_threshold``). The ``"*"`` rule
(every other selector) never abstains.

Cross-validation: 5 folds by document per benchmark (:func:`cdsjax.eval.folds.document_folds`, seed 0), fold i of
both benchmarks one fold; each fold's questions are decided by the rule (score and threshold) chosen on the other
folds. The tables report, per selector and benchmark, the abstention rate on U, on H (a right answer's evidence
withheld) and on the other answerable questions, right decisions against never abstaining (paired bootstrap), the
AUC of each score (U against H), and, where ``results/answers/*-order`` hold the committed local-reader answers of
the same selections, the reader's accuracy replayed with the cross-validated decisions (abstained: right exactly on the
unanswerable questions), answerable and unanswerable apart. Outputs: ``results/abstain/cv.md``,
``results/abstain/records.jsonl`` (one line per selector and question: scores, label, CV decision).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
from typing import Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "abstain"
def _answer_selectors(bench: str) -> str:
    """The selectors the answer tables compare on ``bench`` (configs/answers.py), less the question alone and the
    paper's replicator dynamics."""
    from configs.answers import SELECTORS
    from cdsjax.pipeline.catalog import PAPER_SELECTOR

    return ",".join(s for s in SELECTORS[bench].split(",") if s not in ("none", PAPER_SELECTOR))


BENCHES = {"qasper": (300, _answer_selectors("qasper")), "mmlongbench": (150, _answer_selectors("mmlongbench"))}
ANSWERS = {"qasper": "results/answers/qasper-order/answers.jsonl",
           "mmlongbench": "results/answers/mmlongbench-order/answers.jsonl"}
FOLDS, SEED, BUDGET = 5, 0, 5
NEVER = -1e9  # a threshold no score is below
FEATURES = ("best_relevance", "margin", "top_score", "payoff", "support")


def collect(bench: str, runs: pathlib.Path, cache: pathlib.Path) -> tuple:
    """The reader-free records of ``bench`` (evaluated, or resumed) and its questions by qid."""
    from configs import answers
    from cdsjax.eval import evaluate
    from cdsjax.eval.problems import load_configured_benchmark
    from cdsjax.eval.records import RECORDS_FILE, read_records

    n, selectors = BENCHES[bench]
    config = answers.get_config(bench)
    config.reader.local = ""
    config.max_queries, config.selectors = n, selectors
    config.budget, config.budgets = BUDGET, (BUDGET,)
    config.output_dir, config.cache_dir = str(runs / bench), str(cache / bench)
    config.num_resamples = 200
    evaluate(config, progress=False, log=lambda s: None)
    records = [r for r in read_records(runs / bench / RECORDS_FILE) if "margin" in r.get("strength", {})]
    queries = {q.qid: q for q in load_configured_benchmark(config).queries}
    return records, queries


def answerable(query) -> bool:
    return bool((query.meta or {}).get("answerable", True))


def candidates(scores: np.ndarray) -> np.ndarray:
    """Thresholds worth trying: never abstain, and between each pair of neighbouring scores."""
    s = np.unique(scores)
    return np.concatenate([[NEVER], (s[1:] + s[:-1]) / 2 if len(s) > 1 else [], [s[-1] + 1e-6] if len(s) else []])


def right(scores: np.ndarray, label: np.ndarray, t: float) -> int:
    """Right decisions at threshold ``t``: unanswerable (label 0) abstained + answer-held (label 1) read."""
    abstain = scores < t
    return int(((label == 0) & abstain).sum() + ((label == 1) & ~abstain).sum())


def fit(rows: List[dict], features) -> dict:
    """The (feature, threshold) with the most right decisions on ``rows`` (ties: fewest abstentions)."""
    label = np.array([r["label"] for r in rows])
    best = None
    for f in features:
        s = np.array([r["strength"].get(f, np.nan) for r in rows])
        if np.isnan(s).any():
            continue
        for t in candidates(s):
            key = (right(s, label, t), -int((s < t).sum()))
            if best is None or key > best[0]:
                best = (key, f, float(t))
    return {"feature": best[1], "threshold": best[2]}


def shown_rule(rule: dict) -> str:
    if rule["threshold"] <= NEVER:
        fitted = rule.get("fitted_threshold")
        return "never abstains" + (f" (fitted {rule['feature']} < {fitted:.4f}; no gain out of fold)"
                                   if fitted is not None and fitted > NEVER else "")
    return f"{rule['feature']} < {rule['threshold']:.4f}"


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of an answer-held question > score of an unanswerable one), ties half."""
    if not len(pos) or not len(neg):
        return float("nan")
    d = pos[:, None] - neg[None, :]
    return float(((d > 0).sum() + 0.5 * (d == 0).sum()) / d.size)


def paired(diffs: np.ndarray, resamples: int = 10_000) -> tuple:
    rng = np.random.default_rng(0)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    return float(diffs.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def cv_gain(rows: List[dict]) -> tuple:
    """Right decisions of the CV decisions less never abstaining, per question of U and H (mean, 95% interval)."""
    keep = [r for r in rows if r["label"] >= 0]
    cv = np.array([r["cv_abstained"] if r["label"] == 0 else not r["cv_abstained"] for r in keep], float)
    never = np.array([r["label"] == 1 for r in keep], float)
    return paired(cv - never)


def features_of(selector: str) -> tuple:
    """The scores a selector's rule may use. Not ``support``: on QASPER it tracks the paper's length (the few
    unanswerable questions come from short papers; RESULTS), which says nothing of a new document."""
    from cdsjax.pipeline.catalog import selector_spec

    cds = selector_spec(selector).solver is not None  # a game's equilibrium: its payoff is a score
    return ("best_relevance", "margin", "payoff") if cds else ("best_relevance", "margin", "top_score")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/abstain", help="evaluation output per benchmark (default: runs/abstain)")
    p.add_argument("--cache", default="runs/cache", help="index / embedding cache per benchmark (default: runs/cache)")
    p.add_argument("--benches", default=",".join(BENCHES), help="benchmarks (default: qasper,mmlongbench)")
    p.add_argument("--write", action="store_true", help="write the fitted rules to cdsjax/pipeline/abstain_rules.json")
    args = p.parse_args(argv)
    from cdsjax.eval.folds import document_folds
    from cdsjax.pipeline.abstain import RULES_FILE

    rows: List[dict] = []
    for bench in args.benches.split(","):
        records, queries = collect(bench, pathlib.Path(args.runs), pathlib.Path(args.cache))
        docs = sorted({queries[r["qid"]].doc_ids[0] for r in records})
        fold_of = {d: f.index for f in document_folds(docs, FOLDS, seed=SEED) for d in f.test}
        for r in records:
            q = queries[r["qid"]]
            held = r["metrics"].get("has_answer")
            label = 0 if not answerable(q) else (1 if held == 1.0 else -1)  # -1: answerable, answer not held
            rows.append(dict(bench=bench, selector=r["selector"], qid=r["qid"], doc=q.doc_ids[0],
                             fold=fold_of[q.doc_ids[0]], label=label, has_answer=held, strength=r["strength"],
                             selected=r["selected"]))
    selectors = sorted({r["selector"] for r in rows})
    fitted = {"*": dict(fit([r for r in rows if r["label"] >= 0], ("margin",)), threshold=NEVER)}
    for s in selectors:  # CV decisions, then the rule fitted on everything
        mine = [r for r in rows if r["selector"] == s]
        for k in range(FOLDS):
            rule = fit([r for r in mine if r["fold"] != k and r["label"] >= 0], features_of(s))
            for r in mine:
                if r["fold"] == k:
                    r["cv_rule"] = rule
                    r["cv_abstained"] = bool(r["strength"][rule["feature"]] < rule["threshold"])
        fitted[s] = fit([r for r in mine if r["label"] >= 0], features_of(s))
        gain = cv_gain(mine)
        fitted[s]["cv_gain"] = [round(g, 4) for g in gain]
        if gain[1] <= 0:  # the rule does not beat never abstaining out of fold: it ships as never abstaining
            fitted[s].update(threshold=NEVER, fitted_threshold=fitted[s]["threshold"])

    lines = report(rows, selectors, fitted)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cv.md").write_text("\n".join(lines) + "\n")
    with open(OUT / "records.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: v for k, v in r.items() if k != "selected"}) + "\n")
    print("\n".join(lines))
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        data = {"rules": fitted, "provenance": {
            "command": "python experiments/abstain_fit.py --write", "commit": commit,
            "date": datetime.date.today().isoformat(),
            "data": "development questions: QASPER first 300, MMLongBench-Doc first 150; selections at B = 5, "
                    "reader-free; relevance: cosine of the benchmark embedder",
            "objective": "most right decisions: unanswerable abstained + answerable with the answer in the "
                         "evidence read; 5-fold CV by document in results/abstain/cv.md"}}
        RULES_FILE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {RULES_FILE.relative_to(ROOT)}")
    return 0


def report(rows: List[dict], selectors, fitted) -> List[str]:
    lines = ["Abstention before reading, 5-fold CV by document (`python experiments/abstain_fit.py`). U: unanswerable "
             "questions; H: answerable, the selected evidence (B = 5) holds the answer; A-: answerable, it does not. "
             "Rates are the share abstained; 'right' = U abstained + H read, per question, against never abstaining "
             "(paired bootstrap 95%).", "",
             "| selector | benchmark | U | H | A- | abstained U | abstained H | abstained A- | right (CV) | vs never |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in selectors:
        for bench in BENCHES:
            mine = [r for r in rows if r["selector"] == s and r["bench"] == bench]
            if not mine:
                continue
            lab = np.array([r["label"] for r in mine])
            ab = np.array([r["cv_abstained"] for r in mine])
            rate = lambda m: f"{ab[m].mean():.2f}" if m.any() else "–"  # noqa: E731
            keep = lab >= 0
            cv = np.where(lab == 0, ab, ~ab).astype(float)[keep]
            never = (lab == 1).astype(float)[keep]
            mean, lo, hi = paired(cv - never)
            lines.append(f"| {s} | {bench} | {(lab == 0).sum()} | {(lab == 1).sum()} | {(lab == -1).sum()} | "
                         f"{rate(lab == 0)} | {rate(lab == 1)} | {rate(lab == -1)} | {cv.mean():.3f} | "
                         f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    lines += ["", "AUC of each score, H against U (0.5: no signal; the rule fitted on both benchmarks):", "",
              "| selector | benchmark | " + " | ".join(FEATURES) + " | rule |", "|---|---|---|---|---|---|---|---|"]
    for s in selectors:
        for bench in BENCHES:
            mine = [r for r in rows if r["selector"] == s and r["bench"] == bench]
            if not mine:
                continue
            cells = []
            for f in FEATURES:
                pos = np.array([r["strength"][f] for r in mine if r["label"] == 1 and f in r["strength"]])
                neg = np.array([r["strength"][f] for r in mine if r["label"] == 0 and f in r["strength"]])
                cells.append(f"{auc(pos, neg):.3f}" if len(pos) else "–")
            lines.append(f"| {s} | {bench} | " + " | ".join(cells) + f" | {shown_rule(fitted[s])} |")
    lines.append(f"\n`*` (any other selector): {shown_rule(fitted['*'])}. Right decisions out of fold less never "
                 "abstaining, both benchmarks (a rule ships only where the interval is above 0): "
                 + "; ".join(f"{s} {g[0]:+.3f} [{g[1]:+.3f}, {g[2]:+.3f}]" for s, g in
                             ((s, fitted[s]["cv_gain"]) for s in selectors)))
    lines += replayed(rows, selectors)
    return lines


def replayed(rows: List[dict], selectors) -> List[str]:
    """The committed local-reader accuracy with the CV decisions replayed, where the reader read the same notes."""
    out = ["", "Local reader (1.5B, committed answers of the same selections) replayed: an abstained question scores 1 "
           "when unanswerable, else 0. Score: accuracy (MMLongBench-Doc), else token F1, else exact match (QASPER's "
           "unanswerable). 'same' = questions whose committed evidence equals this selection; 'right answers withheld' "
           "= answerable questions scoring > 0.5 that were abstained.", "",
           "| selector | benchmark | same | accuracy read | with abstention | answerable | unanswerable | "
           "right answers withheld | vs read |", "|---|---|---|---|---|---|---|---|---|"]
    for bench, path in ANSWERS.items():
        f = ROOT / path
        if not f.is_file():
            continue
        answers: Dict[tuple, dict] = {}
        for line in f.read_text().splitlines():
            a = json.loads(line)
            score = next((a["metrics"].get(m) for m in ("accuracy", "answer_f1", "exact_match")
                          if a["metrics"].get(m) is not None), None)
            if a.get("seed", 0) == 0 and score is not None:
                answers[(a["selector"], a["qid"])] = dict(a, score=score)
        for s in selectors:
            pairs = [(r, answers[(s, r["qid"])]) for r in rows if r["bench"] == bench and r["selector"] == s
                     and (s, r["qid"]) in answers and answers[(s, r["qid"])]["evidence"] == r["selected"]]
            if not pairs:
                continue
            acc = np.array([a["score"] for _, a in pairs])
            unans = np.array([r["label"] == 0 for r, _ in pairs])
            ab = np.array([r["cv_abstained"] for r, _ in pairs])
            new = np.where(ab, unans.astype(float), acc)
            mean, lo, hi = paired(new - acc)
            withheld = int((ab & ~unans & (acc > 0.5)).sum())
            out.append(f"| {s} | {bench} | {len(pairs)} | {acc.mean():.3f} | {new.mean():.3f} | "
                       f"{new[~unans].mean():.3f} (was {acc[~unans].mean():.3f}) | "
                       f"{new[unans].mean() if unans.any() else float('nan'):.3f} "
                       f"(was {acc[unans].mean() if unans.any() else float('nan'):.3f}) | {withheld} of "
                       f"{int((~unans & (acc > 0.5)).sum())} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    return out


if __name__ == "__main__":
    sys.exit(main())
