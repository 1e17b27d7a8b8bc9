"""What abstaining before reading (:mod:`cdsjax.pipeline.abstain`) did in an evaluation: per selector, answerable
and unanswerable questions apart, how many were abstained, how many answerable ones had evidence that held the
answer (reader-free ``has_answer``) and were abstained all the same, and with a reader the accuracy on each side.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np


def abstained_now(rec: dict) -> bool:
    """Whether the shipped rules abstain on a selection record (judged again from its ``strength``, so a record
    resumed from before a refit follows the rules of now; its stored ``abstained`` where it has no scores)."""
    from cdsjax.pipeline.abstain import judge

    if rec.get("strength"):
        return judge(rec["selector"], rec["strength"]).abstained
    return bool(rec.get("abstained"))


def abstention_table(records: Sequence[dict], problems: Sequence, answers: Optional[Sequence[dict]] = None) -> str:
    """A markdown table: per selector and budget, answerable (A) and unanswerable (U) questions, how many of
    each were abstained, the answerable ones whose selected evidence held the answer but were abstained, and
    (``answers``, seed-averaged) accuracy on A and U. Empty when no record could abstain."""
    answerable = {p.query.qid: bool((p.query.meta or {}).get("answerable", True)) for p in problems}
    acc: Dict[tuple, List[float]] = {}
    for a in answers or ():
        value = (a.get("metrics") or {}).get("accuracy")
        if value is not None:
            acc.setdefault((a["selector"], int(a["budget"]), a["qid"]), []).append(float(value))
    groups: Dict[tuple, list] = {}
    for r in records:
        if "strength" in r or "abstained" in r:
            groups.setdefault((r["selector"], int(r["budget"])), []).append(r)
    if not groups:
        return ""
    lines = ["| selector | B | A | U | abstained A | abstained U | abstained A with the answer in the evidence | "
             "accuracy A | accuracy U |", "|---|---|---|---|---|---|---|---|---|"]
    for (selector, budget), recs in sorted(groups.items()):
        is_a = np.array([answerable.get(r["qid"], True) for r in recs])
        ab = np.array([abstained_now(r) for r in recs])
        held = np.array([(r.get("metrics") or {}).get("has_answer") == 1.0 for r in recs])

        def mean_acc(mask):
            vals = [np.mean(acc[(selector, budget, r["qid"])]) for r, m in zip(recs, mask)
                    if m and (selector, budget, r["qid"]) in acc]
            return f"{np.mean(vals):.3f} (n={len(vals)})" if vals else "–"

        lines.append(f"| {selector} | {budget} | {is_a.sum()} | {(~is_a).sum()} | {(ab & is_a).sum()} | "
                     f"{(ab & ~is_a).sum()} | {(ab & is_a & held).sum()} of {(is_a & held).sum()} | "
                     f"{mean_acc(is_a)} | {mean_acc(~is_a)} |")
    return "\n".join(lines) + "\n"
