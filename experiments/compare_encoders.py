r"""Does all-mpnet-base-v2 (registry preset, :mod:`cdsjax.io.embed_models`) find better evidence than the default
all-MiniLM-L6-v2? Reader-free, on the development data, with today's dense relevance (cosine of the encoder's
vectors), the same questions and the same notes for both encoders.

    python experiments/compare_encoders.py qasper --questions 150
    python experiments/compare_encoders.py mmlongbench --questions 40
    python experiments/compare_encoders.py hotpotqa
    python experiments/compare_encoders.py index_timing --pdf ../shared/data/mmlongbench/documents/X.pdf --rounds 2

``qasper`` / ``mmlongbench``: each encoder's evaluation (the answer tables' config, ``configs/answers.py``, without
the reader; the default selector and cosine, B = 5 notes), then has-answer of the evidence the local reader would
get (the notes fitted to the default 500 evidence tokens, :func:`cdsjax.io.reading.reader.fit_items`, trimmed with the same
encoder), and the selection's recall of the gold pages (MMLongBench-Doc) or paragraphs (QASPER). ``hotpotqa``:
all-found@4 and paragraph recall@4. Paired differences (mpnet - MiniLM) per question with 95% bootstrap intervals
and W/T/L
(:func:`cdsjax.eval.metrics.paired_difference`). ``index_timing``: whole indexing of ``--pdf`` files with each
encoder (:func:`cdsjax.io.index.build_index` from nothing, interleaved ``--rounds`` times; the same notes for
both), wall seconds per page and the index's own embed-stage seconds per page (the encode time, on the ONNX path).

Writes ``results/compare_encoders/<what>.md`` (the table printed) and ``<what>.jsonl`` (per-question values).
Indexes and question vectors are cached under ``runs/compare_encoders/<bench>/<encoder>``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "compare_encoders"
ENCODERS = ("all-MiniLM-L6-v2", "all-mpnet-base-v2")
SHORT = {"all-MiniLM-L6-v2": "minilm", "all-mpnet-base-v2": "mpnet"}


def config_for(bench: str, encoder: str, questions, selectors: str):
    from configs import answers, hotpotqa

    config = hotpotqa.get_config() if bench == "hotpotqa" else answers.get_config(bench)
    config.reader.local = ""
    config.max_queries = questions
    config.selectors = selectors
    if bench != "hotpotqa":
        config.budget, config.budgets = 5, (5,)
    else:
        config.budget, config.budgets = 4, (4,)
    config.num_resamples = 200
    config.embedder.model = encoder
    config.cache_dir = str(ROOT / "runs" / "compare_encoders" / bench / SHORT[encoder])
    return config


def run_one(bench: str, encoder: str, questions, selectors: str, tokens: int) -> dict:
    """``(selector, qid) -> {metric: value}`` for one encoder."""
    from cdsjax.eval import evaluate
    from cdsjax.eval.answers import has_answer
    from cdsjax.eval.answer_evidence import sentence_similarity
    from cdsjax.eval.evaluate import config_evidence
    from cdsjax.eval.records import RECORDS_FILE, read_records
    from cdsjax.io.embed import Embedder
    from cdsjax.io.reading.prompt import note_text
    from cdsjax.io.reading.reader import fit_items

    config = config_for(bench, encoder, questions, selectors)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        config.output_dir = tmp
        evaluate(config, progress=False, log=lambda s: None)
        records = list(read_records(pathlib.Path(tmp) / RECORDS_FILE))
    print(f"{bench} {encoder}: evaluated in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    out = {}
    if bench == "hotpotqa":
        for rec in records:
            m = rec["metrics"]
            out[(rec["selector"], rec["qid"])] = {"all_found@4": m["all_found"],
                                                  "paragraph_recall@4": m["paragraph_recall"]}
        return out
    embedder = Embedder(config)
    problems, source = config_evidence(config, embedder)
    by_qid = {q.query.qid: q for q in problems}
    similarity = sentence_similarity(embedder)
    for rec in records:
        problem = by_qid[rec["qid"]]
        values = {}
        for metric in ("page_recall", "paragraph_recall"):  # MMLongBench-Doc's pages, QASPER's gold paragraphs
            if rec["metrics"].get(metric) is not None:
                values[f"{metric}@5"] = rec["metrics"][metric]
        targets = problem.answer_targets()
        if targets is not None:
            items = source.items(rec["selected"])
            fitted = fit_items(problem.query.question, items, tokens, max_text_chars=1500, images=False,
                               similarity=similarity)
            values[f"has_answer@{tokens}tok"] = float(has_answer([note_text(i, 1500) for i in fitted.items], targets))
        out[(rec["selector"], rec["qid"])] = values
    return out


def compare(bench: str, questions, selectors: str, tokens: int) -> str:
    from cdsjax.eval.metrics import paired_difference

    runs = {enc: run_one(bench, enc, questions, selectors, tokens) for enc in ENCODERS}
    a, b = runs[ENCODERS[1]], runs[ENCODERS[0]]
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{bench}.jsonl", "w") as f:
        for key in sorted(set(a) | set(b)):
            f.write(json.dumps(dict(selector=key[0], qid=key[1], minilm=b.get(key), mpnet=a.get(key))) + "\n")
    lines = [f"{bench}: {questions or 'all'} questions asked; mpnet - MiniLM paired per question "
             "(95% bootstrap interval, W/T/L = mpnet better / tie / worse)", "",
             "| selector | metric | n | MiniLM | mpnet | mpnet - MiniLM | W/T/L |", "|---|---|---|---|---|---|---|"]
    for selector in selectors.split(","):
        keys = sorted(k for k in set(a) & set(b) if k[0] == selector)
        metrics = sorted({m for k in keys for m in a[k]} & {m for k in keys for m in b[k]})
        for metric in metrics:
            pairs = [(a[k][metric], b[k][metric]) for k in keys if metric in a[k] and metric in b[k]]
            x, y = [p[0] for p in pairs], [p[1] for p in pairs]
            d = paired_difference(x, y, num_resamples=10_000)
            lines.append(f"| {selector} | {metric} | {d['n']} | {np.mean(y):.3f} | {np.mean(x):.3f} | "
                         f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | "
                         f"{d['better']}/{d['tie']}/{d['worse']} |")
    return "\n".join(lines)


def index_timing(pdfs, rounds: int) -> str:
    """Whole indexing (parse, notes, embed, write) of the same PDFs with each encoder, interleaved, every build in
    a fresh cache (nothing reused), one worker: wall seconds and the index's own stage seconds, per page."""
    from cdsjax.io.index import build_index, default_config

    from cdsjax.io.embed import Embedder

    def build(enc: str, paths):
        config = default_config()
        config.embedder.model = enc
        config.embedder.show_progress = False
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            summary = build_index([str(p) for p in paths], pathlib.Path(tmp) / "index", config=config,
                                  cache_dir=pathlib.Path(tmp) / "cache", workers=1, log=lambda s: None)
            wall = time.perf_counter() - t0
        return dict(wall=wall, pages=summary.pages, notes=summary.notes, seconds=summary.seconds)

    build(ENCODERS[0], pdfs[:1])  # warm-up, not counted: the layout models and the first encoder load
    for enc in ENCODERS:  # each encoder's ONNX session loaded once, as a warm process has it
        config = default_config()
        config.embedder.model = enc
        Embedder(config).load()
    runs = {enc: [] for enc in ENCODERS}
    for r in range(rounds):
        for enc in (ENCODERS if r % 2 == 0 else ENCODERS[::-1]):
            runs[enc].append(build(enc, pdfs))
    pages = runs[ENCODERS[0]][0]["pages"]
    lines = [f"index time: {', '.join(p.name for p in pdfs)} ({pages} pages, "
             f"{runs[ENCODERS[0]][0]['notes']} notes), {rounds} interleaved builds per encoder, each from nothing "
             "(fresh cache), one worker; median seconds per page", "",
             "| encoder | wall s / page | embed s / page | parse + notes s / page | wall vs MiniLM |",
             "|---|---|---|---|---|"]
    base = statistics.median(r["wall"] for r in runs[ENCODERS[0]])
    for enc in ENCODERS:
        wall = statistics.median(r["wall"] for r in runs[enc])
        embed = statistics.median(r["seconds"].get("embed", 0.0) for r in runs[enc])
        rest = statistics.median(r["seconds"].get("parse", 0.0) + r["seconds"].get("notes", 0.0) for r in runs[enc])
        lines.append(f"| {enc} | {wall / pages:.3f} | {embed / pages:.3f} | {rest / pages:.3f} | {wall / base:.2f}x |")
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "index_timing.jsonl", "w") as f:
        f.write(json.dumps(dict(pdfs=[p.name for p in pdfs], runs=runs)) + "\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("qasper", "mmlongbench", "hotpotqa", "index_timing"))
    p.add_argument("--questions", type=int, default=None, help="questions asked (default: all)")
    p.add_argument("--tokens", type=int, default=500, help="evidence token budget (default: 500, the reader's)")
    p.add_argument("--selectors", default=None, help="selectors (default: the reference and the default selector)")
    p.add_argument("--rounds", type=int, default=2, help="index_timing: interleaved builds per encoder")
    p.add_argument("--pdf", action="append", default=[], help="index_timing: PDFs indexed (repeatable)")
    args = p.parse_args(argv)
    if args.what == "index_timing":
        table = index_timing([pathlib.Path(p) for p in args.pdf], args.rounds)
    else:
        from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR

        selectors = args.selectors or f"{REFERENCE_SELECTOR},{DEFAULT_SELECTOR}"
        table = compare(args.what, args.questions, selectors, args.tokens)
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.what}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
