"""cdsjax.agents.evaluate.evaluate_planning on real HotpotQA questions: the planning agent through a local
OpenAI-compatible server scripted per role (planner, workers, checker, reasoner, judge), its four evidence views
scored with the harness's metrics, checked here against float64 rankings of the problems' own embeddings."""

import csv
import json

import numpy as np
import pytest

from cdsjax.agents.evaluate import VIEWS, evaluate_planning, parse_variants
from cdsjax.io.reading.judge import Judge
from cdsjax.io.reading.llm.config import ReaderConfig
from tests.scripted_server import OpenAIServer, message_text
from tests.test_planning import SUFFICIENT, plan_json, role
from tests.test_run_eval import _config

BUDGET = 2
PLAN = plan_json(("a", "Which person or place does the question name first?", ()),
                 ("b", "What is known about it?", ("a",)))


def _recall(picked, gold):
    return len(set(picked) & set(gold)) / len(gold)


def test_evaluate_planning_scores_the_views_and_judges_answers(data_root, tmp_path):
    from cdsjax.eval import load_problems
    from cdsjax.io.embed import Embedder

    config = _config("hotpotqa", tmp_path / "out", tmp_path / "cache", data_root=str(data_root), max_queries=2,
                     num_resamples=100)
    questions = []

    def respond(req):
        if "You grade answers" in req["messages"][0]["content"]:  # the judge: the first question is answered
            return json.dumps({"rationale": "-", "correct": questions[0] in message_text(req), "score": 1.0})
        r = role(req)
        return {"decompose": PLAN, "check": SUFFICIENT, "reason": "Yes [1].", "work": "Not answerable"}.get(r, PLAN)

    with OpenAIServer(respond) as srv:
        problems = load_problems(config, Embedder(config), cache_dir=tmp_path / "cache", log=lambda s: None)[2]
        questions += [p.query.question for p in problems]
        judge = Judge(ReaderConfig(base_url=srv.base_url, model="test-model", max_retries=0))
        records, rows = evaluate_planning(config, ReaderConfig(base_url=srv.base_url, model="test-model", max_retries=0),
                                          parse_variants("cosine,cds"), budget=BUDGET, judge=judge,
                                          log=lambda s: None)
        calls = [req for req in srv.requests if "You grade answers" not in req["messages"][0]["content"]]

    assert [(r["variant"], r["qid"]) for r in records] == [(v, p.query.qid) for v in ("cosine", "cds") for p in problems]
    assert sum(r["llm_calls"] for r in records) == len(calls)  # decompose, 2 workers, check, reason per question
    assert all(r["llm_calls"] == 5 and r["rounds"] == 1 and r["stop_reason"] == "sufficient" for r in records)
    assert [r["accuracy"] for r in records] == [1.0, 0.0, 1.0, 0.0]
    for r in records:
        p = problems[[q.query.qid for q in problems].index(r["qid"])]
        m = {view: r["metrics"][view] for view in VIEWS}
        rel = np.asarray(p.notes, np.float64) @ np.asarray(p.query_emb, np.float64)
        ranked = [p.note_ids[i] for i in np.argsort(-rel, kind="stable")]
        gold = p.query.gold_note_ids
        k = int(m["final"]["num_selected"])
        assert m["probe"]["num_selected"] == BUDGET and BUDGET <= k <= 20
        assert m["explored"]["num_selected"] >= k
        assert m["cosine_matched"]["num_selected"] == k
        assert m["cosine_matched"]["paragraph_recall"] == pytest.approx(_recall(ranked[:k], gold))
        if r["variant"] == "cosine":
            assert m["probe"]["paragraph_recall"] == pytest.approx(_recall(ranked[:BUDGET], gold))
        # the reasoner reads the probe and more; everything read was explored
        assert m["probe"]["paragraph_recall"] <= m["final"]["paragraph_recall"] <= m["explored"]["paragraph_recall"]

    table = {(row["selector"], row["metric"]): row for row in rows}
    for variant in ("cosine", "cds"):
        for view in VIEWS:
            values = [r["metrics"][view]["paragraph_recall"] for r in records if r["variant"] == variant]
            assert table[(f"{variant}/{view}", "paragraph_recall")]["mean"] == pytest.approx(np.mean(values))
        assert table[(f"{variant}/final", "accuracy")]["mean"] == pytest.approx(0.5)
    with open(tmp_path / "out" / "planning_summary.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    written = [json.loads(line) for line in (tmp_path / "out" / "planning_records.jsonl").read_text().splitlines()]
    assert written == json.loads(json.dumps(records, default=float))
