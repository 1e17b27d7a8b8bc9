"""Paired differences in every summary: each selector against the reference on the same questions, with
interval, W/T/L and the smallest detectable difference, and the per-question oracle."""

import math

import numpy as np
import pytest

from cdsjax.eval.metrics import paired_difference
from cdsjax.eval.report import ORACLE, markdown_table, paired_rows, summary_rows


def _rec(sel, qid, recall, redundancy=0.5):
    return {"benchmark": "b", "selector": sel, "budget": 2, "qid": qid,
            "metrics": {"recall": recall, "redundancy": redundancy}}


def test_paired_rows_by_hand():
    a = [1.0, 1.0, 0.5, 0.0, None]
    c = [0.0, 1.0, 0.0, 0.5, 1.0]
    records = [_rec("cosine", f"q{i}", v) for i, v in enumerate(c)]
    records += [_rec("cds", f"q{i}", v) for i, v in enumerate(a)]
    rows = {(r["selector"], r["metric"]): r for r in paired_rows(records, ("recall", "redundancy"), "cosine",
                                                                   num_resamples=300)}
    d = rows[("cds", "recall_vs_cosine@2")]
    assert d["n"] == 4 and d["mean"] == pytest.approx((1 + 0 + 0.5 - 0.5) / 4)
    assert (d["wins"], d["ties"], d["losses"]) == (2, 1, 1)
    diffs = np.array([1.0, 0.0, 0.5, -0.5])
    assert d["mde"] == pytest.approx(2.801585 * diffs.std(ddof=1) / 2.0, rel=1e-5)
    assert ("cosine", "recall_vs_cosine@2") not in rows
    oracle = rows[(ORACLE, "recall@2")]  # per question the best of cds and cosine: 1, 1, .5, .5, 1
    assert oracle["mean"] == pytest.approx(0.8) and oracle["n"] == 5
    gain = rows[(ORACLE, "recall_vs_cosine@2")]
    assert gain["losses"] == 0 and gain["mean"] == pytest.approx(0.3)
    assert (ORACLE, "redundancy@2") not in rows  # lower is better there: no oracle
    table = markdown_table(summary_rows(records, ("recall",), num_resamples=100) + list(rows.values()))
    assert "Paired difference to cosine" in table and "W/T/L 2/1/1" in table and "mde" in table


def test_paired_difference_mde_needs_two_pairs():
    assert math.isnan(paired_difference([1.0], [0.0])["mde"])
    assert paired_rows([_rec("cds", "q0", 1.0)], ("recall",), "cosine") == []
