"""experiments/structured_cv.py: a knob and read-out are chosen on the other folds only (never on the test fold),
and the transfer / fit-on-both merge scores one benchmark with a choice made on the other (or on both)."""

import importlib
import json
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ex():
    sys.argv = sys.argv[:1]
    return importlib.import_module("experiments.structured_cv")


def _values(qfold, good_on, budgets=(10,)):
    """Two MMR settings: ``lam=0.9`` is perfect on the folds ``good_on``, ``lam=0.3`` on the others; cosine 0.5."""
    v = {}
    n = len(qfold)
    for b in budgets:
        for k in (0, 1, 2):
            v[("cosine top-B", k, b, "recall")] = np.full(n, 0.5)
            v[("cosine top-B", k, b, "has_answer")] = np.where(np.arange(n) % 2 == 0, 1.0, np.nan)
            for lab, good in (("mmr lam=0.9", np.isin(qfold, good_on)), ("mmr lam=0.3", ~np.isin(qfold, good_on))):
                v[(lab, k, b, "recall")] = np.where(good, 1.0, 0.0) + 0.01 * k
                v[(lab, k, b, "has_answer")] = np.where(good, 1.0, 0.0)
    return v


def test_cv_never_chooses_on_the_test_fold(ex):
    qfold = np.repeat(np.arange(5), 4)
    values = _values(qfold, good_on=(0, 1, 2, 3))  # lam=0.9 wins every training side; it fails on fold 4
    fams = {"cosine ranking": ["cosine top-B"], "mmr ranking": ["mmr lam=0.9", "mmr lam=0.3"]}
    rows, chosen = ex.cv_rows(values, qfold, fams, [10])
    assert chosen["mmr ranking|none|10"] == ["mmr lam=0.9 k=0"] * 5
    assert chosen["mmr ranking|cv|10"] == ["mmr lam=0.9 k=2"] * 5  # the read-out chosen by the same CV
    assert chosen["cosine ranking|read|10"] == ["cosine top-B k=1"] * 5  # cosine-pages
    rec = rows[("mmr ranking", "none", 10)]["recall"]
    assert (rec[qfold < 4] == 1.0).all() and (rec[qfold == 4] == 0.0).all()
    summary = ex.summarize(rows, {"benchmark": "x", "questions": 20, "covered": 10, "documents": 5}, 100)
    row = next(r for r in summary["rows"] if (r["family"], r["readout"]) == ("mmr ranking", "none"))
    assert row["recall"][0] == pytest.approx(0.8) and row["has_answer"][3] == 20
    assert row["recall - page rule"]["better"] == 16 and row["recall - page rule"]["worse"] == 4
    assert "pools" not in ex.tables(summary) and "single document" in ex.tables(summary)


def test_merge_transfers_the_choice_of_the_other_benchmark(ex, tmp_path, monkeypatch):
    qa, qb = np.repeat(np.arange(5), 2), np.repeat(np.arange(5), 3)
    runs = []
    for name, qfold, good in (("a", qa, (0, 1, 2, 3, 4)), ("b", qb, ())):  # a: lam=0.9 best; b: lam=0.3 best
        d = tmp_path / name
        d.mkdir()
        v = _values(qfold, good)
        np.savez(d / "values.npz", **{"|".join(map(str, k)): x for k, x in v.items()}, **{"meta|qfold": qfold})
        (d / "summary.json").write_text(json.dumps({"benchmark": name, "pool_size": 1, "questions": len(qfold),
                                                    "covered": len(qfold) // 2, "documents": 5}))
        runs.append(str(d))
    monkeypatch.setattr(ex, "settings", lambda grid="full": [
        ("cosine ranking", "cosine top-B", "rank_cosine", None), ("mmr ranking", "mmr lam=0.9", "rank_mmr", 0.9),
        ("mmr ranking", "mmr lam=0.3", "rank_mmr", 0.3)])
    ex.merge(runs, str(tmp_path / "merged"), 50)
    a_to_b = json.loads((tmp_path / "merged" / "transfer-a-to-b" / "summary.json").read_text())
    row = next(r for r in a_to_b["rows"] if (r["family"], r["readout"]) == ("mmr ranking", "none"))
    assert row["recall"][0] == pytest.approx(0.0)  # a's choice (lam=0.9) fails on every question of b
    both = json.loads((tmp_path / "merged" / "both-b" / "summary.json").read_text())
    row = next(r for r in both["rows"] if (r["family"], r["readout"]) == ("mmr ranking", "none"))
    assert row["recall"][0] in (pytest.approx(0.0), pytest.approx(1.0))  # one choice on both, each weighed the same
    assert (tmp_path / "merged" / "transfer-b-to-a" / "tables.md").is_file()
