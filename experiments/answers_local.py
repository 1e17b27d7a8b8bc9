r"""Answer accuracy with a real reader on this machine: the local llama.cpp reader (cdsjax.io.reading.local.reader, the
default preset: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, a small *text* model) reads each selector's evidence at
budget 5 on the development data, and the answers are scored.

    python experiments/answers_local.py qasper          # 100 questions: cosine, mmr, the default, cds-paper, none
    python experiments/answers_local.py mmlongbench     # 60 questions, text-only: cosine, cosine-pages, default, none
    python experiments/answers_local.py table           # the tables of both, from what is on disk

Each run is the batch evaluation (``cdsjax.eval.evaluate``, as ``experiments/run_eval.py`` runs it) with
``config.reader.local=default`` into ``results/answers/<benchmark>/``; every reply (reader, judge, extraction)
goes to the reply cache there (``replies/replies.jsonl``, appended as replies arrive), so an interrupted run
resumes where it stopped and a finished one is rerun from the cache in seconds. Run one reader job at a time:
llama.cpp keeps both cores of a 2-core machine busy and slows down several times beside other work.

QASPER answers are scored by token F1 against the extractive spans, exact match for yes/no/unanswerable gold, and
accuracy by an LLM judge — the same local model (``judge_is_reader`` in the records), a weak judge. MMLongBench-Doc
answers are scored by the benchmark's rules after answer extraction by the same model. Both also report
``cites_gold`` (the answer cites a gold note: a gold paragraph, or a note on a gold page) and ``markers_only``
(the answer gives citation markers in place of content). Each run appends its wall time and how many answers it
asked the reader for to ``runs.jsonl``, for the time per 100 questions. ``experiments/answer_tables.py DIR`` prints
the deciding tables from a run's per-question records (paired intervals, the detectable difference, answerable and
unanswerable apart, extraction counts).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "answers"
BENCHMARKS = ("qasper", "mmlongbench")


def build_config(bench: str, questions: int, threads: int, slots: int, variant: str = "", tokens=None,
                 chosen: str = "", judge: bool = True):
    from configs import answers

    config = answers.get_config(bench)
    if os.environ.get("CDSJAX_DATA"):
        config.data_root = os.environ["CDSJAX_DATA"]
    # run from the repository root, as the configs are
    config.output_dir = str((OUT / (f"{bench}-{variant}" if variant else bench)).relative_to(ROOT))
    config.reader.evidence_tokens = tokens
    if chosen:
        config.selectors = chosen
    config.judge.enabled = judge
    config.max_queries = questions
    config.reader.local_threads = threads
    config.reader.local_slots = slots
    return config


def cached_only(config, bench: str, variant: str = ""):
    """``config`` changed to answer from the reply cache of the full run alone, into ``runs/answers-cached/<bench>``:
    no server is started and none is reachable, so a reply not in the cache is a reader (or judge) error. For
    the figures of a run still in progress, on its first questions."""
    import shutil

    from cdsjax.io.reading.local.model import DEFAULT_PRESET

    name = f"{bench}-{variant}" if variant else bench
    out = pathlib.Path("runs") / "answers-cached" / name
    (out / "replies").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(OUT / name / "replies" / "replies.jsonl", out / "replies" / "replies.jsonl")
    config.output_dir = str(out)
    config.reader.local = ""
    config.reader.url = "http://127.0.0.1:9/v1"  # the discard port: nothing answers
    config.reader.model = DEFAULT_PRESET  # the name the cache keys carry
    config.reader.max_retries = 0
    config.judge.max_retries = 0
    if config.reader.evidence_tokens is None:  # the budget the local reader's run had
        from cdsjax.defaults import LOCAL_EVIDENCE_TOKENS

        config.reader.evidence_tokens = LOCAL_EVIDENCE_TOKENS
    return config


def selectors(bench: str) -> list:
    from configs import answers

    return answers.SELECTORS[bench].split(",")


def run(bench: str, questions: int, threads: int, slots: int, from_cache: bool = False, **variant) -> None:
    os.chdir(ROOT)
    from cdsjax.commands.eval import locate_data
    from cdsjax.eval import evaluate
    from cdsjax.eval.settings import cache_dir_of
    from cdsjax.io.compilation_cache import enable_compilation_cache

    config = build_config(bench, questions, threads, slots, **variant)
    if from_cache:
        config = cached_only(config, bench, variant.get("variant", ""))
    locate_data(config, prog="answers_local")
    enable_compilation_cache(cache_dir_of(config) / "jax-compilation")
    out = pathlib.Path(config.output_dir)
    cache = out / "replies" / "replies.jsonl"
    before = _lines(cache)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    evaluate(config, progress=sys.stderr.isatty())  # its run.json holds the provenance in full
    wall = time.perf_counter() - t0
    entry = dict(benchmark=bench, questions=questions, selectors=str(config.selectors).split(","), wall_s=round(wall, 1),
                 evidence_tokens=(-1 if config.reader.evidence_tokens is None else int(config.reader.evidence_tokens)),
                 judge=bool(config.judge.enabled),
                 new_replies=_lines(cache) - before, load_at_start=round(load, 2), threads=threads, slots=slots,
                 commit=_commit(), versions=library_versions(),
                 finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if from_cache:
        print(table(bench, out))
        return
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(json.dumps(entry))
    print(table(bench, out))


def _lines(path: pathlib.Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def library_versions() -> dict:
    from cdsjax.io.provenance import library_versions as versions

    return versions()


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _summary(bench: str, out: pathlib.Path = None) -> dict:
    path = (out or OUT / bench) / "summary.csv"
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rows[(r["selector"], r["metric"].rpartition("@")[0])] = r
    return rows


def _cell(rows, selector, metric, signed=False) -> str:
    r = rows.get((selector, metric))
    if r is None or r["mean"] in ("", "nan"):
        return "–"
    fmt = "{:+.2f}" if signed else "{:.2f}"
    mean, lo, hi = (float(r[k]) if r[k] not in ("", "nan") else float("nan") for k in ("mean", "ci_low", "ci_high"))
    if lo != lo:  # no interval
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def table(bench: str, out: pathlib.Path = None) -> str:
    """The markdown table of one benchmark's answer metrics (means with 95% bootstrap intervals)."""
    from cdsjax.pipeline.catalog import display
    from cdsjax.core.registry import SPECS

    rows = _summary(bench, out)
    first = "accuracy" if bench == "mmlongbench" else "accuracy (judge)"
    head = ["selector", first, "token F1", "vs cosine (acc)", "vs none (acc)", "cites gold", "markers only",
            "reader errors", "n"]
    if bench == "mmlongbench":
        head[2] = "generalized F1"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    present = {sel for sel, _ in rows}
    for sel in [s for s in selectors(bench) if s in present] + sorted(present - set(selectors(bench))):
        n = rows.get((sel, "accuracy"), {}).get("n", "–")
        second = "generalized_f1" if bench == "mmlongbench" else "answer_f1"
        lines.append("| " + " | ".join([
            display(sel) if sel in SPECS else f"{sel} (question only)", _cell(rows, sel, "accuracy"),
            _cell(rows, sel, second), _cell(rows, sel, "accuracy_vs_cosine", True),
            _cell(rows, sel, "accuracy_vs_none", True), _cell(rows, sel, "cites_gold"),
            _cell(rows, sel, "markers_only"), _cell(rows, sel, "reader_error"), str(n)]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("qasper", "mmlongbench", "table"))
    p.add_argument("--questions", type=int, default=None, help="questions (default: 100 QASPER, 60 MMLongBench-Doc)")
    p.add_argument("--threads", type=int, default=0, help="reader threads (default: every core)")
    p.add_argument("--slots", type=int, default=2, help="reader slots, requests in flight (default: 2)")
    p.add_argument("--variant", default="", help="a run beside the main one: results/answers/<bench>-<variant>")
    p.add_argument("--tokens", type=int, default=None, help="the reader's evidence tokens (default: the local reader's "
                   "default, cdsjax.defaults.LOCAL_EVIDENCE_TOKENS; 0: every note whole, as before token budgets)")
    p.add_argument("--selectors", default="", help="selectors (default: the config's)")
    p.add_argument("--no-judge", action="store_true", help="no LLM judge: the rule-based scores alone")
    p.add_argument("--from-cache", action="store_true",
                   help="answer from the run's reply cache alone (no server; a missing reply is an error), into "
                   "runs/answers-cached/: the figures of a run in progress, on its first --questions")
    args = p.parse_args(argv)
    if args.what == "table":
        for bench in BENCHMARKS:
            if (OUT / bench / "summary.csv").is_file():
                print(f"\n{bench}\n\n{table(bench)}")
        return 0
    from configs import answers

    run(args.what, args.questions or answers.QUESTIONS[args.what], args.threads, args.slots, args.from_cache,
        variant=args.variant, tokens=args.tokens, chosen=args.selectors, judge=not args.no_judge)
    return 0


if __name__ == "__main__":
    sys.exit(main())
