"""The harness end to end on a real MMLongBench-Doc subset: one 10-page PDF and its questions.

The test writes a data root whose layout matches ../shared/data, holding only that document (a
symlink to the shared PDF) and its rows of samples.json / mmdocir_annotations.jsonl. Every metric of
every record is recomputed here from the raw benchmark rows and the problems' embeddings in float64
(not with :mod:`cdsjax.eval.metrics`), the cosine picks are checked against a float64 ranking and the
CDS picks against the same selector run in float64, and the summary means against the records.
"""

import ast
import csv
import itertools
import json

import jax
import numpy as np
import pytest

from cdsjax.core.types import CONVERGED

DOC = "2310.07609v1.pdf"
BUDGET = 5


@pytest.fixture
def one_doc_root(data_root, tmp_path):
    src = data_root / "mmlongbench"
    if not (src / "documents" / DOC).is_file():
        pytest.skip(f"{DOC} not in the shared data")
    dst = tmp_path / "data" / "mmlongbench"
    (dst / "documents").mkdir(parents=True)
    (dst / "documents" / DOC).symlink_to(src / "documents" / DOC)
    samples = [s for s in json.loads((src / "samples.json").read_text()) if s["doc_id"] == DOC]
    (dst / "samples.json").write_text(json.dumps(samples))
    lines = [ln for ln in (src / "mmdocir_annotations.jsonl").read_text().splitlines()
             if ln.strip() and json.loads(ln)["doc_name"] == DOC]
    (dst / "mmdocir_annotations.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "data", samples


def _box_hit(box, gold):
    """IoU >= 0.3, or at least half of the gold box inside ``box`` (the benchmark's box rule)."""
    (a0, b0, a1, b1), (g0, h0, g1, h1) = np.asarray(box, float), np.asarray(gold, float)
    inter = max(0.0, min(a1, g1) - max(a0, g0)) * max(0.0, min(b1, h1) - max(b0, h0))
    area_box, area_gold = (a1 - a0) * (b1 - b0), (g1 - g0) * (h1 - h0)
    iou = inter / (area_box + area_gold - inter) if area_box + area_gold - inter > 0 else 0.0
    inside = inter / area_gold if area_gold > 0 else float(a0 <= g0 and g1 <= a1 and b0 <= h0 and h1 <= b1)
    return iou >= 0.3 or inside >= 0.5


def _expected_metrics(problem, positions, gold_pages):
    """The record's metrics, recomputed from the selected positions, the raw gold pages and float64 vectors."""
    pages = {(problem.docs[i], problem.pages[i]) for i in positions}
    gold = {(DOC, p) for p in gold_pages}
    page_recall = len(gold & pages) / len(gold) if gold else None
    boxes = problem.query.gold_boxes
    hits = sum(any(_box_hit(problem.boxes[i], g_box) for i in positions
                   if (problem.docs[i], problem.pages[i]) == (doc, page)) for doc, page, g_box in boxes)
    z = np.asarray(problem.notes, np.float64)[positions]
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    pairs = [z[i] @ z[j] for i, j in itertools.combinations(range(len(positions)), 2)]
    # has_answer: the metric itself is tested on hand-made cases in test_answers.py; here, that the record scores
    # the selected notes' own text against the question's gold answer (None where the answer is not covered)
    from cdsjax.eval.answers import has_answer
    targets = problem.answer_targets()
    answer = None if targets is None else has_answer([problem.texts[i] for i in positions], targets)
    return {"num_selected": float(len(positions)), "page_recall": page_recall, "has_answer": answer,
            "box_recall": hits / len(boxes) if boxes else None,
            "all_pages_found": None if page_recall is None else float(page_recall == 1.0),
            "distinct_pages": float(len(pages)), "redundancy": float(np.mean(pairs)) if pairs else None}


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_harness_on_a_real_mmlongbench_document(one_doc_root, tmp_path):
    from cdsjax.commands.eval import load_config
    from cdsjax.core import make_selector
    from tests.conftest import on_arrays
    from cdsjax.eval import evaluate, load_problems
    from cdsjax.io.embed import Embedder
    from tests.conftest import ROOT

    root, samples = one_doc_root
    config = load_config(str(ROOT / "configs" / "mmlongbench.py"))
    config.data_root = str(root)
    config.output_dir = str(tmp_path / "out")
    config.cache_dir = str(tmp_path / "cache")
    config.max_queries = 4
    config.selectors = "cosine,cds"
    config.relevance.mode = "dense"  # the scores are checked against the embeddings' cosine, recomputed here
    config.budgets = (BUDGET,)
    config.num_resamples = 200
    records, rows = evaluate(config, progress=False, log=lambda *a: None)
    assert len(samples) >= 4 and len(records) == 8
    # the same problems, from the cache the run filled (nothing is parsed or embedded again)
    _, _, problems, _ = load_problems(config, Embedder(config), cache_dir=tmp_path / "cache", log=lambda *a: None)
    by_qid = {p.query.qid: p for p in problems}
    gold_pages = [{int(p) - 1 for p in ast.literal_eval(s["evidence_pages"])} for s in samples[:4]]
    assert [p.query.question for p in problems] == [s["question"] for s in samples[:4]]
    assert sum(bool(p.query.gold_boxes) for p in problems) >= 1, "box recall is scored on some question"

    with jax.enable_x64(True):
        cds64 = jax.jit(on_arrays(make_selector("cds", budget=BUDGET)))
        for r in records:
            p = by_qid[r["qid"]]
            k = problems.index(p)
            notes, query = np.asarray(p.notes, np.float64), np.asarray(p.query_emb, np.float64)
            if r["selector"] == "cosine":
                rel = notes @ query
                want = list(np.argsort(-rel, kind="stable")[:BUDGET])
                assert rel[want[-1]] - np.delete(rel, want).max() > 1e-5, "no near tie at the cut"
                assert r["scores"] == pytest.approx(rel[want], abs=1e-5)
            else:
                sel = cds64(notes, query, np.ones(len(notes), bool), np.asarray(p.links))
                want = [int(i) for i in np.asarray(sel.indices)[np.asarray(sel.selected_valid)]]
                assert r["diagnostics"]["converged"] == (int(sel.result.status) == CONVERGED)
                assert r["diagnostics"]["support_size"] == int(sel.support_size)
            assert r["selected"] == [p.note_ids[i] for i in want], (r["selector"], r["qid"])
            assert r["pages"] == [[p.docs[i], p.pages[i]] for i in want]
            expected = _expected_metrics(p, want, gold_pages[k])
            assert r["metrics"].keys() == expected.keys()
            for name, value in expected.items():
                assert r["metrics"][name] == (None if value is None else pytest.approx(value, abs=1e-6)), name

    # the summary's means are the means over the records, per selector and metric
    with open(tmp_path / "out" / "summary.csv") as f:
        table = {(row["selector"], row["metric"]): row for row in csv.DictReader(f)}
    for sel in ("cosine", "cds"):
        for name in ("page_recall", "box_recall", "redundancy"):
            values = [r["metrics"][name] for r in records if r["selector"] == sel and r["metrics"][name] is not None]
            row = table[(sel, f"{name}@{BUDGET}")]
            assert int(row["n"]) == len(values) and float(row["mean"]) == pytest.approx(np.mean(values), abs=1e-12)
    assert table[("cds", f"converged@{BUDGET}")]["mean"] != ""
