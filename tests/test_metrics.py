"""Retrieval metrics on hand-computed cases; the bootstrap interval against theory and SciPy."""

import math

import numpy as np
import pytest

from cdsjax.eval import metrics as M
from tests.conftest import require_module


def test_page_recall_counts_gold_pairs_once_and_ignores_other_docs():
    gold = {"a.pdf": {3, 7}, "b.pdf": {0}}
    sel = [("a.pdf", 3), ("a.pdf", 3), ("b.pdf", 7), ("a.pdf", 8)]
    assert M.page_recall(sel, gold) == pytest.approx(1 / 3)
    assert M.page_recall(sel + [("b.pdf", 0), ("a.pdf", 7)], gold) == 1.0
    assert M.page_recall([], gold) == 0.0
    assert math.isnan(M.page_recall(sel, {}))
    assert math.isnan(M.page_recall(sel, {"a.pdf": set()}))


def test_doc_recall():
    assert M.doc_recall(["x", "x", "z"], ["x", "y"]) == 0.5
    assert math.isnan(M.doc_recall(["x"], []))


def test_box_overlap_hand_computed():
    # [0,0,2,2] vs [1,1,3,3]: intersection 1, union 7; 1/4 of the gold box inside.
    iou, inside = M.box_overlap([0, 0, 2, 2], [1, 1, 3, 3])
    assert iou == pytest.approx(1 / 7)
    assert inside == pytest.approx(0.25)
    # A small gold box fully inside a large element: IoU tiny, containment 1.
    iou, inside = M.box_overlap([0, 0, 100, 100], [10, 10, 20, 20])
    assert iou == pytest.approx(100 / 10000)
    assert inside == 1.0
    assert M.box_overlap([0, 0, 1, 1], [2, 2, 3, 3]) == (0.0, 0.0)
    # Zero-area gold box: inside test.
    assert M.box_overlap([0, 0, 5, 5], [1, 1, 1, 4])[1] == 1.0
    assert M.box_overlap([0, 0, 5, 5], [6, 1, 6, 4])[1] == 0.0


def test_box_hit_thresholds():
    # Element [0,0,10,10], gold [6,0,16,10]: inter 40, union 160 -> IoU 0.25, inside 0.4.
    assert not M.box_hit([0, 0, 10, 10], [6, 0, 16, 10])
    # Gold [5,0,15,10]: inter 50, union 150 -> IoU 1/3 >= 0.3 (and inside 0.5).
    assert M.box_hit([0, 0, 10, 10], [5, 0, 15, 10])
    # Gold [4,0,24,10] against element [0,0,10,10]: inter 60, union 240 (IoU .25),
    # inside 60/200 = 0.3: no hit; with containment 0.3 it is a hit.
    assert not M.box_hit([0, 0, 10, 10], [4, 0, 24, 10])
    assert M.box_hit([0, 0, 10, 10], [4, 0, 24, 10], containment=0.3)
    # Big gold box with a small element: containment small, IoU small -> miss.
    assert not M.box_hit([0, 0, 10, 10], [0, 0, 100, 100])


def test_box_recall_requires_same_doc_and_page():
    gold = [("a", 1, (0, 0, 10, 10)), ("a", 2, (0, 0, 10, 10)), ("b", 1, (50, 50, 60, 60))]
    sel = [("a", 1, (0, 0, 10, 12)),          # covers gold 0
           ("a", 3, (0, 0, 10, 10)),          # right box, wrong page
           ("a", 1, (50, 50, 60, 60))]        # right box, wrong doc
    assert M.box_recall(sel, gold) == pytest.approx(1 / 3)
    assert M.box_recall(sel + [("b", 1, (0, 0, 100, 100))], gold) == pytest.approx(2 / 3)
    assert math.isnan(M.box_recall(sel, []))
    assert M.box_recall([], gold) == 0.0


def test_paragraph_recall_and_variants():
    assert M.paragraph_recall(["p1", "p2", "p9"], {"p1", "p3"}) == 0.5
    assert math.isnan(M.paragraph_recall(["p1"], set()))
    assert M.best_annotator_recall(["p1", "p2"], [["p1", "p3"], ["p2"], []]) == 1.0
    assert M.best_annotator_recall(["p4"], [["p1", "p3"], ["p2"]]) == 0.0
    assert math.isnan(M.best_annotator_recall(["p4"], [[], []]))
    assert M.all_found(1.0) == 1.0 and M.all_found(0.5) == 0.0
    assert math.isnan(M.all_found(float("nan")))


def test_redundancy_hand_computed_and_reference():
    z = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    # cosines: (1,2) 0, (1,3) 1/sqrt2, (2,3) 1/sqrt2 -> mean sqrt(2)/3.
    assert M.redundancy(z) == pytest.approx(math.sqrt(2) / 3, abs=1e-12)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 5))
    ref = np.mean([x[i] @ x[j] / np.linalg.norm(x[i]) / np.linalg.norm(x[j])
                   for i in range(7) for j in range(i + 1, 7)])
    np.testing.assert_allclose(M.redundancy(x), ref, rtol=0, atol=1e-12)
    assert M.redundancy(np.ones((4, 3))) == pytest.approx(1.0)
    assert math.isnan(M.redundancy(np.ones((1, 3))))
    assert math.isnan(M.redundancy(np.zeros((0, 3))))
    # A zero row is cosine 0 with everything (no NaN).
    assert M.redundancy(np.array([[1.0, 0.0], [0.0, 0.0]])) == 0.0
    with pytest.raises(ValueError, match="embeddings"):
        M.redundancy(np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        M.redundancy(np.array([[1.0, np.nan], [0.0, 1.0]]))


def test_distinct_pages():
    assert M.distinct_pages([("a", 1), ("a", 1), ("b", 1), ("a", 2)]) == 3
    assert M.distinct_pages([]) == 0


def test_mean_ci_edge_cases():
    mean, lo, hi, n = M.mean_ci([])
    assert n == 0 and all(math.isnan(v) for v in (mean, lo, hi))
    assert M.mean_ci([float("nan"), 0.5]) == (0.5, 0.5, 0.5, 1)
    assert M.mean_ci([1.0, 1.0, np.nan]) == (1.0, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="confidence"):
        M.mean_ci([1.0, 2.0], confidence=1.5)


@pytest.mark.slow
def test_mean_ci_matches_normal_theory_and_scipy():
    rng = np.random.default_rng(0)
    x = rng.binomial(1, 0.6, size=400).astype(float)
    mean, lo, hi, n = M.mean_ci(x, num_resamples=20_000, seed=1)
    assert n == 400 and mean == pytest.approx(x.mean())
    # Percentile bootstrap of a mean ~ normal interval mean +- 1.96 * sd / sqrt(n).
    half = 1.959964 * x.std(ddof=0) / math.sqrt(n)
    assert lo == pytest.approx(mean - half, abs=0.006)
    assert hi == pytest.approx(mean + half, abs=0.006)
    scipy_stats = require_module("scipy.stats")
    ref = scipy_stats.bootstrap((x,), np.mean, n_resamples=20_000, method="percentile",
                                random_state=np.random.default_rng(2)).confidence_interval
    assert lo == pytest.approx(ref.low, abs=0.006)
    assert hi == pytest.approx(ref.high, abs=0.006)
    # Deterministic given the seed.
    assert M.mean_ci(x, num_resamples=20_000, seed=1) == (mean, lo, hi, n)


def test_summarize_groups_and_skips_missing():
    recs = [
        {"benchmark": "b", "selector": "cos", "r": 1.0, "d": 3},
        {"benchmark": "b", "selector": "cos", "r": 0.0, "d": None},
        {"benchmark": "b", "selector": "cds", "r": float("nan"), "d": 5},
    ]
    rows = M.summarize(recs, ["r", "d"], num_resamples=200)
    assert [(r["selector"], r["metric"], r["n"]) for r in rows] == [
        ("cos", "r", 2), ("cos", "d", 1), ("cds", "r", 0), ("cds", "d", 1)]
    assert rows[0]["mean"] == 0.5 and 0.0 <= rows[0]["ci_low"] <= 0.5 <= rows[0]["ci_high"] <= 1.0
    assert rows[1]["mean"] == 3 and rows[3]["mean"] == 5
    assert math.isnan(rows[2]["mean"])
