r"""The answer tables that decide, from the per-question records of an answer run (``answers.jsonl`` of
``experiments/answers_local.py``): each selector's primary score with its 95% bootstrap interval, the paired
difference of the default against cosine and against ``none`` (the question alone) with its interval, and the
smallest paired difference the run could detect; answerable and unanswerable questions apart; the score on the
questions whose evidence, as the reader got it, held the answer's text; how the short answers were extracted;
and how many questions two selectors sent the same notes for.

    python experiments/answer_tables.py results/answers/qasper-order            # token F1 (QASPER)
    python experiments/answer_tables.py results/answers/mmlongbench-order       # accuracy (MMLongBench-Doc)
    python experiments/answer_tables.py DIR --before results/answers/qasper-tokens   # what the order changed

Only questions every listed selector answered (no reader error) are compared, so every row is over the same
questions. The detectable difference is the one a two-sided test at 5% finds with 80% power:
``(1.96 + 0.84) * sd(paired differences) / sqrt(n)``. ``--before`` names a run of the same questions made
before requests listed their notes in one order: it counts the questions where the default and cosine sent the
same notes in a different order then (different requests), and how their scores differed on those.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, REFERENCE_SELECTOR  # noqa: E402

PRIMARY = {"qasper": "answer_f1", "mmlongbench": "accuracy"}
NONE = "none"  # the control: the question alone (cdsjax.eval.reader_setup.CONTROLS)
POWER_Z = 1.96 + 0.84  # two-sided 5%, 80% power


def load(path: pathlib.Path) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def by_question(records: list, selectors: list) -> dict:
    """``{qid: {selector: record}}`` over the questions every selector answered without a reader error."""
    out: dict = collections.defaultdict(dict)
    for r in records:
        if r["selector"] in selectors and r.get("seed", 0) == 0:
            out[r["qid"]][r["selector"]] = r
    return {q: v for q, v in out.items()
            if all(s in v and not v[s]["metrics"].get("reader_error") for s in selectors)}


def mean_ci(values) -> str:
    from cdsjax.eval.metrics import mean_ci as ci

    m, lo, hi, n = ci([v for v in values if v is not None], num_resamples=5000)
    return "–" if n == 0 else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def paired(a, b) -> tuple:
    """(``mean [lo, hi]`` of a - b, wins/ties/losses, detectable difference) over pairs defined in both."""
    from cdsjax.eval.metrics import paired_difference

    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(pairs) < 2:
        return "–", "–", "–"
    d = paired_difference([x for x, _ in pairs], [y for _, y in pairs], num_resamples=5000)
    sd = float(np.std([x - y for x, y in pairs], ddof=1))
    mde = POWER_Z * sd / math.sqrt(len(pairs))
    return (f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]", f"{d['better']}/{d['tie']}/{d['worse']}",
            f"{mde:.3f}")


def metric(rec: dict, name: str):
    v = rec["metrics"].get(name)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def table(questions: dict, selectors: list, name: str, *, default: str, keep=lambda r: True) -> list:
    """Markdown rows: per selector the mean of ``name`` [95% CI] and n; the default's paired differences."""
    qids = [q for q, v in questions.items() if keep(v[default])]
    rows = ["| selector | mean [95% CI] | n | vs cosine (W/T/L) | detectable | vs none (W/T/L) | detectable |",
            "|---|---|---|---|---|---|---|"]
    for sel in selectors:
        vals = [metric(questions[q][sel], name) for q in qids]
        cells = [sel, mean_ci(vals), str(sum(v is not None for v in vals))]
        for other in (REFERENCE_SELECTOR, NONE):
            if sel == other or other not in selectors:
                cells += ["", ""]
                continue
            diff, wtl, mde = paired(vals, [metric(questions[q][other], name) for q in qids])
            cells += [f"{diff} ({wtl})", mde]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def same_notes(questions: dict, a: str, b: str) -> tuple:
    """Questions where ``a`` and ``b`` sent the same notes (as a set), and of those, how many got the same
    reply (the same request asks once)."""
    same = [v for v in questions.values() if v[a].get("sent") and set(v[a]["sent"]) == set(v[b].get("sent") or ())]
    return len(same), sum(1 for v in same if v[a].get("reply") == v[b].get("reply"))


def before_after(before: list, default: str, name: str) -> list:
    """What one order changes: in a run made before it, the questions where the default and cosine sent the same
    notes in another order, and how often their scores differed there."""
    ref = REFERENCE_SELECTOR
    q = by_question(before, [default, ref])
    reordered = [v for v in q.values() if v[default].get("sent") and set(v[default]["sent"]) == set(v[ref].get("sent") or ())
                 and list(v[default].get("sent") or ()) != list(v[ref].get("sent") or ())]
    differ = [v for v in reordered if metric(v[default], name) != metric(v[ref], name)]
    gain = sum((metric(v[default], name) or 0) - (metric(v[ref], name) or 0) for v in reordered)
    return [f"- before one order ({len(q)} questions): the default and cosine sent the same notes in another order "
            f"on {len(reordered)}; their {name} differed on {len(differ)} of those (summed difference "
            f"{gain:+.2f}); with one order those requests are byte-identical and score alike."]


def report(out_dir: pathlib.Path, before: pathlib.Path = None) -> str:
    records = load(out_dir / "answers.jsonl")
    bench = "mmlongbench" if records[0]["benchmark"].startswith("mmlongbench") else records[0]["benchmark"]
    name = PRIMARY.get(bench, "accuracy")
    present = list(dict.fromkeys(r["selector"] for r in records))
    first = (DEFAULT_SELECTOR, REFERENCE_SELECTOR, NONE)
    selectors = [s for s in first if s in present] + [s for s in present if s not in first]
    questions = by_question(records, selectors)
    lines = [f"## {bench}: {name}, {len(questions)} questions answered by every selector "
             f"({', '.join(selectors)})", ""]
    lines += table(questions, selectors, name, default=selectors[0])
    answerable = lambda r: r.get("answerable") is not False  # noqa: E731
    for label, keep in (("answerable", answerable), ("unanswerable", lambda r: r.get("answerable") is False)):
        n = sum(1 for v in questions.values() if keep(v[selectors[0]]))
        if n:
            shown = name if label == "answerable" or bench != "qasper" else "exact_match"
            lines += ["", f"### {label} questions ({n}): {shown}", ""]
            lines += table(questions, selectors, shown, default=selectors[0], keep=keep)
    if bench == "qasper":
        lines += ["", "### yes/no/unanswerable gold: exact_match", ""]
        lines += table(questions, selectors, "exact_match", default=selectors[0])
    if bench == "mmlongbench":
        from cdsjax.eval.answer_scoring import generalized_f1

        lines += ["", "generalized F1 (the benchmark's): " + ", ".join(
            f"{s} {generalized_f1([metric(v[s], name) or 0.0 for v in questions.values()], [v[s].get('answerable', True) for v in questions.values()], [bool(v[s].get('declined')) for v in questions.values()]):.3f}"
            for s in selectors)]
    lines += ["", f"### {name} on the questions whose evidence, as sent, held the answer's text (per selector; "
              "not paired: each selector's own questions)", ""]
    lines += ["| selector | held the answer | " + name + " there | " + name + " elsewhere |", "|---|---|---|---|"]
    for sel in selectors:
        held = [v[sel] for v in questions.values() if metric(v[sel], "sent_has_answer") == 1.0]
        missed = [v[sel] for v in questions.values() if metric(v[sel], "sent_has_answer") == 0.0]
        if held or missed:
            lines.append(f"| {sel} | {len(held)} of {len(held) + len(missed)} | "
                         f"{mean_ci([metric(r, name) for r in held])} | {mean_ci([metric(r, name) for r in missed])} |")
    ways = collections.Counter((v[s].get("extracted_by"), s) for v in questions.values() for s in selectors
                               if v[s].get("extracted_by"))
    if ways:
        lines += ["", "extraction: " + "; ".join(
            f"{s}: " + ", ".join(f"{w} {ways[(w, s)]}" for w in sorted({w for w, t in ways if t == s}))
            for s in selectors)]
    if REFERENCE_SELECTOR in selectors and selectors[0] != REFERENCE_SELECTOR:
        n, alike = same_notes(questions, selectors[0], REFERENCE_SELECTOR)
        lines += ["", f"- the default and cosine sent the same notes on {n} of {len(questions)} questions; "
                  f"the same reply on {alike} of those"]
    nr = collections.Counter(r.get("no_answer") for r in records if r["selector"] in selectors)
    lines.append(f"- no answer after the retry: {sum(v for k, v in nr.items() if k)} of {sum(nr.values())} replies"
                 f"; retried: {sum(1 for r in records if r.get('retried'))}")
    tokens = [r.get("prompt_tokens") for r in records if r.get("prompt_tokens")]
    if tokens:
        lines.append(f"- prompt tokens: median {int(np.median(tokens))}, max {max(tokens)}")
    if before is not None:
        lines += before_after(load(before / "answers.jsonl"), selectors[0], name)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=pathlib.Path, help="an answer run's directory (holding answers.jsonl)")
    p.add_argument("--before", type=pathlib.Path, default=None,
                   help="a run of the same questions before one evidence order, to count what it changed")
    args = p.parse_args(argv)
    print(report(args.run, args.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
