r"""Only as much evidence as the answer needs? Fixed against adaptive amounts of evidence, reader-free.

Each selector's selection of B = 5 notes (the records of ``experiments/abstain_fit.py``, evaluated or resumed under
``--runs``) goes to the reader's token budget (``--tokens``, the local reader's 500 by default) as
:meth:`cdsjax.io.reading.reader.Reader.answer` fits it (:func:`cdsjax.io.reading.reader.fit_items`: rank order, the note that does
not fit cut to its sentences nearest the question), in several amounts:

* ``fixed``: all B notes (what the reader gets now);
* ``support``: CDS only, the first ``max(1, support size)`` notes (the equilibrium's own notes, fill picks left out);
* ``drop@d``: the notes whose relevance is within ``d`` of the best selected note's (scores that fall off are cut);
* ``drop@cv``: ``drop@d`` with ``d`` chosen on the other folds (5 folds by document, seed 0): the smallest ``d``
  whose has-answer there is within 0.01 of ``fixed``'s.

    python experiments/evidence_amount.py qasper
    python experiments/evidence_amount.py mmlongbench

Prints, per selector and amount, the notes sent, the evidence tokens sent (estimated, :mod:`cdsjax.io.reading.evidence_fit`),
the prompt tokens they stand for (the reader's count, by a line fitted to the committed local-reader answers of the
benchmark, ``results/answers/<bench>-order``: prompt against estimated evidence tokens), has-answer over the covered
questions, and
the paired differences to ``fixed`` (95% bootstrap, W/T/L for has-answer); writes
``results/evidence_amount/<bench>.md`` and ``<bench>.jsonl`` (per question and amount).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "evidence_amount"
DELTAS = (0.05, 0.1, 0.15, 0.2)
TOLERANCE = 0.01


def paired(diffs: np.ndarray, resamples: int = 10_000) -> tuple:
    rng = np.random.default_rng(0)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    return float(diffs.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", choices=("qasper", "mmlongbench"))
    p.add_argument("--tokens", type=int, default=None, help="evidence token budget (default: the local reader's)")
    p.add_argument("--runs", default="runs/abstain")
    p.add_argument("--cache", default="runs/cache")
    args = p.parse_args(argv)

    from configs import answers
    from experiments.abstain_fit import BENCHES, BUDGET, FOLDS, SEED, collect
    from cdsjax.eval.answer_evidence import sentence_similarity
    from cdsjax.eval.evaluate import config_evidence
    from cdsjax.eval.answers import has_answer
    from cdsjax.eval.folds import document_folds
    from cdsjax.io.embed import Embedder
    from cdsjax.io.reading.prompt import note_text
    from cdsjax.io.reading.reader import fit_items
    from cdsjax.pipeline.abstain import note_relevance
    from cdsjax.pipeline.amount import notes_to_read
    from cdsjax.defaults import LOCAL_EVIDENCE_TOKENS

    tokens = args.tokens or LOCAL_EVIDENCE_TOKENS
    records, _ = collect(args.bench, pathlib.Path(args.runs), pathlib.Path(args.cache))
    config = answers.get_config(args.bench)
    config.max_queries = BENCHES[args.bench][0]
    config.cache_dir = str(pathlib.Path(args.cache) / args.bench)
    embedder = Embedder(config)
    problems, source = config_evidence(config, embedder)
    by_qid = {q.query.qid: q for q in problems}
    raw_similarity, memo = sentence_similarity(embedder), {}

    def similarity(question, sentences):  # the same trimmed note recurs across amounts: encode it once
        key = (question, tuple(sentences))
        if key not in memo:
            memo[key] = raw_similarity(question, sentences)
        return memo[key]

    fold_of = {d: f.index for f in document_folds(sorted({pr.query.doc_ids[0] for pr in problems}), FOLDS, seed=SEED)
               for d in f.test}
    rows = []
    for rec in records:
        problem = by_qid[rec["qid"]]
        targets = problem.answer_targets()
        if targets is None or int(rec["budget"]) != BUDGET:
            continue
        position = {n: i for i, n in enumerate(problem.note_ids)}
        rel = note_relevance(problem.notes, problem.query_emb)[[position[n] for n in rec["selected"]]]
        support = rec["diagnostics"].get("support_size")
        items = source.items(rec["selected"])
        amounts = {"fixed": list(range(len(items)))}
        if support is not None:
            amounts["support"] = notes_to_read(rel, support=support, delta=None)
        for d in DELTAS:
            amounts[f"drop@{d:g}"] = notes_to_read(rel, support=None, delta=d)
        for name, keep in amounts.items():
            fitted = fit_items(problem.query.question, [items[i] for i in keep], tokens, max_text_chars=1500,
                               images=False, similarity=similarity)
            texts = [note_text(i, 1500) for i in fitted.items]
            rows.append(dict(selector=rec["selector"], qid=rec["qid"], fold=fold_of[problem.query.doc_ids[0]],
                             amount=name, notes=len(keep), sent=len(fitted.items), tokens=int(fitted.tokens),
                             has_answer=float(has_answer(texts, targets))))
    rows += cv_rows(rows)
    lines = table(config.benchmark, rows, tokens, prompt_line(args.bench))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{config.benchmark}.md").write_text("\n".join(lines) + "\n")
    with open(OUT / f"{config.benchmark}.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("\n".join(lines))
    return 0


def prompt_line(bench: str) -> tuple:
    """``(slope, intercept)`` of the reader's prompt tokens against the estimated evidence tokens in the committed
    local-reader answers of ``bench`` (None where there are none)."""
    path = ROOT / "results" / "answers" / f"{bench}-order" / "answers.jsonl"
    if not path.is_file():
        return None
    pairs = [(a["evidence_tokens"], a["prompt_tokens"]) for a in map(json.loads, path.read_text().splitlines())
             if a.get("evidence_tokens") and a.get("prompt_tokens")]
    if len(pairs) < 10:
        return None
    x, y = np.array(pairs, float).T
    return tuple(float(v) for v in np.polyfit(x, y, 1))


def cv_rows(rows) -> list:
    """``drop@cv``: per test fold, the smallest delta whose has-answer on the other folds is within TOLERANCE of
    ``fixed``'s there (the fixed amount when none is)."""
    out = []
    for selector in sorted({r["selector"] for r in rows}):
        mine = [r for r in rows if r["selector"] == selector]
        for k in sorted({r["fold"] for r in mine}):
            train = [r for r in mine if r["fold"] != k]
            mean = lambda name: np.mean([r["has_answer"] for r in train if r["amount"] == name])  # noqa: E731
            chosen = next((f"drop@{d:g}" for d in DELTAS if mean(f"drop@{d:g}") >= mean("fixed") - TOLERANCE),
                          "fixed")
            out += [dict(r, amount="drop@cv", chosen=chosen) for r in mine if r["fold"] == k and r["amount"] == chosen]
    return out


def table(name: str, rows, tokens: int, line=None) -> list:
    prompt = (lambda t: f"{line[0] * t + line[1]:.0f}") if line else (lambda t: "–")  # noqa: E731
    lines = [f"{name}: B = 5 notes, evidence fitted to {tokens} estimated tokens; has-answer over the covered "
             "questions; differences to `fixed`, paired (95% bootstrap)"
             + (f"; prompt tokens = {line[0]:.2f} x evidence tokens + {line[1]:.0f} (fitted to the committed "
                "local-reader answers)" if line else ""), "",
             "| selector | amount | n | notes sent | evidence tokens | prompt tokens | has-answer | tokens vs fixed | "
             "has-answer vs fixed (W/T/L) |", "|---|---|---|---|---|---|---|---|---|"]
    order = ["fixed", "support"] + [f"drop@{d:g}" for d in DELTAS] + ["drop@cv"]
    for selector in sorted({r["selector"] for r in rows}):
        base = {r["qid"]: r for r in rows if r["selector"] == selector and r["amount"] == "fixed"}
        for amount in order:
            mine = [r for r in rows if r["selector"] == selector and r["amount"] == amount]
            if not mine:
                continue
            h = np.array([r["has_answer"] for r in mine])
            t = np.array([r["tokens"] for r in mine], float)
            dh = h - np.array([base[r["qid"]]["has_answer"] for r in mine])
            dt = t - np.array([base[r["qid"]]["tokens"] for r in mine], float)
            if amount == "fixed":
                vs_t = vs_h = "–"
            else:
                m, lo, hi = paired(dt)
                vs_t = f"{m:+.0f} [{lo:+.0f}, {hi:+.0f}]"
                m, lo, hi = paired(dh)
                vs_h = (f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] ({(dh > 0).sum()}/{(dh == 0).sum()}/{(dh < 0).sum()})")
            lines.append(f"| {selector} | {amount} | {len(mine)} | {np.mean([r['sent'] for r in mine]):.2f} | "
                         f"{t.mean():.0f} | {prompt(t.mean())} | {h.mean():.3f} | {vs_t} | {vs_h} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
