r"""How often the reader's reply is no answer — citation markers in place of the content, the evidence headers
echoed, a loop — before and after the reading path caught them (:func:`cdsjax.io.reading.replies.no_answer`), and how the
answers compare question by question.

    python experiments/no_answer_rates.py BEFORE/answers.jsonl AFTER/answers.jsonl [--metric answer_f1]

``BEFORE`` is an answer run of the old path (every reply taken as the answer; its replies are classified here by
the same rules), ``AFTER`` one of the new path (a reply that is no answer asked again once with a stricter
instruction; ``retried`` and ``no_answer`` on its records). Prints, per selector: answers, how many replies
were no answer and of which kind (before: as they stood; after: at the first request and after the retry),
and the paired difference of ``--metric`` on the questions both runs answered, with a bootstrap interval.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def load(path: pathlib.Path) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    from cdsjax.io.reading.replies import no_answer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=pathlib.Path)
    p.add_argument("after", type=pathlib.Path)
    p.add_argument("--metric", default="answer_f1")
    args = p.parse_args(argv)
    before, after = load(args.before), load(args.after)
    print("| selector | run | answers | no answer (first reply) | markers only | echoed headers | loop | "
          "no answer after retry |")
    print("|---|---|---|---|---|---|---|---|")
    for selector in sorted({r["selector"] for r in after}):
        old = [r for r in before if r["selector"] == selector and "reply" in r]
        new = [r for r in after if r["selector"] == selector and "error" not in r]
        kinds_old = collections.Counter(no_answer(r["reply"]) for r in old)
        kinds_new = collections.Counter(r.get("retried") or r.get("no_answer") for r in new)
        final = sum(1 for r in new if r.get("no_answer"))
        for label, rows, kinds, last in (("before", old, kinds_old, "–"), ("after", new, kinds_new, final)):
            bad = sum(v for k, v in kinds.items() if k)
            print(f"| {selector} | {label} | {len(rows)} | {bad} | {kinds['markers_only']} | "
                  f"{kinds['echoed_evidence']} | {kinds['loop']} | {last} |")
    print(f"\npaired {args.metric} (after − before) on the questions both answered:")
    for selector in sorted({r["selector"] for r in after}):
        old = {r["qid"]: r["metrics"].get(args.metric) for r in before if r["selector"] == selector}
        pairs = [(old[r["qid"]], r["metrics"].get(args.metric)) for r in after
                 if r["selector"] == selector and r["qid"] in old]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not pairs:
            continue
        d = np.array([b - a for a, b in pairs])
        rng = np.random.default_rng(0)
        means = d[rng.integers(0, len(d), size=(10_000, len(d)))].mean(axis=1)
        lo, hi = np.quantile(means, [0.025, 0.975])
        print(f"- {selector}: n = {len(d)}, before {np.mean([a for a, _ in pairs]):.3f}, after "
              f"{np.mean([b for _, b in pairs]):.3f}, difference {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
