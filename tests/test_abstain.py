""""Not in the document": a selection judged too weak before reading (cdsjax.pipeline.abstain), in the pipeline,
`ask`, `serve`'s request and the evaluation's reader stage."""

import json

import numpy as np
import pytest

from cdsjax.core.types import Selection
from cdsjax.pipeline import abstain as A

DIM = 8


def selection(indices, scores, valid=None):
    indices = np.asarray(indices, np.int32)
    return Selection(indices=indices, selected_valid=np.ones(len(indices), bool) if valid is None
                     else np.asarray(valid), scores=np.asarray(scores, np.float32))


def rules(tmp_path, table):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": table, "provenance": {}}))
    return path


def test_features_read_the_selected_notes_relevance_and_the_first_score():
    rel = np.array([0.1, 0.7, 0.3, 0.9], np.float32)
    f = A.strength_features(selection([2, 1, 0], [5.0, 4.0, 3.0]), rel)
    assert f["best_relevance"] == pytest.approx(0.7)  # note 3 (0.9) was not selected
    assert f["margin"] == pytest.approx(0.7 - 0.5)  # above the mean relevance of every note
    assert f["top_score"] == pytest.approx(5.0)
    assert "payoff" not in f and "support" not in f  # a baseline: no equilibrium
    empty = A.strength_features(selection([0, 0], [0.0, 0.0], valid=[False, False]), rel)
    assert empty["best_relevance"] == -1.0 and np.isfinite(empty["top_score"])


def test_judge_compares_the_rules_score_with_its_threshold_and_falls_back(tmp_path):
    table = A.load_rules(rules(tmp_path, {"*": {"feature": "best_relevance", "threshold": 0.5},
                                          "cds_learned": {"feature": "payoff", "threshold": 0.2}}))
    weak, strong = {"best_relevance": 0.4, "top_score": 9.0}, {"best_relevance": 0.6, "top_score": 0.0}
    assert A.judge("cosine", weak, rules=table).abstained
    assert not A.judge("cosine", strong, rules=table).abstained
    off = A.judge("cosine", weak, rules=table, enabled=False)
    assert not off.abstained and off.score == pytest.approx(0.4) and not off.enabled  # the score still said
    cds = A.judge("cds-learned", {"best_relevance": 0.9, "payoff": 0.1}, rules=table)  # "-" or "_"
    assert cds.abstained and cds.feature == "payoff" and cds.threshold == pytest.approx(0.2)
    # a CDS rule on a selection without an equilibrium: the "*" rule
    assert A.judge("cds_learned", weak, rules=table).feature == "best_relevance"
    assert A.judge("cds_learned", weak, rules=table).to_dict()["abstained"] is True


def test_a_malformed_rules_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="'\\*' rule"):
        A.load_rules(rules(tmp_path, {"cosine": {"feature": "best_relevance", "threshold": 0.1}}))
    with pytest.raises(ValueError, match="feature"):
        A.load_rules(rules(tmp_path / "..", {"*": {"feature": "magic", "threshold": 0.1}}))


def test_the_shipped_rules_name_their_provenance():
    data = A.load_rules()
    assert set(data["rules"]) >= {"*"}
    prov = data["provenance"]
    assert "abstain_fit.py" in prov.get("command", "") and prov.get("commit") and prov.get("data")


def pipeline():
    from cdsjax.pipeline import Corpus, Pipeline

    z = np.eye(DIM, dtype=np.float32)[:6]
    notes = [dict(note_id=f"d#{i}", doc_id="d", page=i, kind="text", text=f"note {i}") for i in range(6)]

    class Encoder:
        def encode_queries(self, texts):
            return np.stack([np.eye(DIM, dtype=np.float32)[7 if "away" in t else 0] for t in texts])

    return Pipeline(Corpus(embeddings=z, links=np.zeros((6, 6), bool), notes=notes,
                           embedder={"model": "all-MiniLM-L6-v2"}, roots=[]), embedder=Encoder())


class Reader:
    def __init__(self):
        self.calls = 0

    def answer(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("the reader was asked")


def test_the_pipeline_abstains_before_reading_and_shows_the_evidence(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "RULES_FILE", rules(tmp_path, {"*": {"feature": "best_relevance", "threshold": 0.5}}))
    pipe = pipeline()
    pipe.reader = Reader()
    far = pipe.retrieve("far away question", selector="cosine", budget=3)  # orthogonal to every note
    assert far.abstained and far.abstention["score"] == pytest.approx(0.0) and len(far.evidence) == 3
    streamed = []
    pipe.read(far, on_token=streamed.append)
    assert pipe.reader.calls == 0 and far.answer.startswith(A.NOT_IN_DOCUMENTS) and streamed == [far.answer]
    assert far.to_dict()["abstained"] is True and far.to_dict()["abstention"]["threshold"] == pytest.approx(0.5)
    near = pipe.retrieve("near question", selector="cosine", budget=3)  # note 0 is the question
    assert not near.abstained and near.abstention["score"] == pytest.approx(1.0)
    kept = pipe.retrieve("far away question", selector="cosine", budget=3, abstain=False)
    assert not kept.abstained and kept.abstention["enabled"] is False
    with pytest.raises(AssertionError, match="asked"):  # --no-abstain: the reader reads it
        pipe.read(kept)


def test_ask_and_serve_take_the_switch():
    from cdsjax.commands.server import Question
    from pydantic import ValidationError

    from cdsjax import cli

    parser = cli.build_parser()
    assert parser.parse_args(["ask", "x", "q", "--no-abstain"]).no_abstain
    assert not parser.parse_args(["ask", "x", "q"]).no_abstain
    assert Question(question="q", abstain=False).abstain is False and Question(question="q").abstain is True
    with pytest.raises(ValidationError):
        Question(question="q", abstain="no")


def test_the_evaluation_reader_is_not_asked_on_an_abstained_record(tmp_path, monkeypatch):
    from cdsjax.eval.abstention import abstained_now
    from cdsjax.eval.reading import abstained_answer
    from cdsjax.io.reading.reader import ABSTAIN

    monkeypatch.setattr(A, "RULES_FILE", rules(tmp_path, {"*": {"feature": "best_relevance", "threshold": 0.5}}))
    assert abstained_now({"selector": "cosine", "strength": {"best_relevance": 0.2}})
    assert not abstained_now({"selector": "cosine", "strength": {"best_relevance": 0.8}, "abstained": True})
    assert abstained_now({"selector": "cosine", "abstained": True})  # a record without scores keeps its flag
    out = abstained_answer("m")
    assert out.text == ABSTAIN and out.abstained and out.usage == {"prompt_tokens": 0} and out.evidence == ()


def test_an_evaluation_record_carries_the_decision():
    from cdsjax.eval.records import selection_record
    from cdsjax.eval.problems import Problem
    from cdsjax.io.datasets import Query

    z = np.eye(DIM, dtype=np.float32)[:4]
    q = Query(qid="q0", question="?", answer="a", doc_ids=("d",))
    problem = Problem(query=q, notes=z, query_emb=z[1], links=np.zeros((4, 4), bool),
                      note_ids=[f"d#{i}" for i in range(4)], docs=["d"] * 4)
    rec = selection_record("b", "cosine", 2, problem, selection([1, 2], [1.0, 0.0]), kind="text")
    assert rec["strength"]["best_relevance"] == pytest.approx(1.0)
    assert rec["abstain_score"] == pytest.approx(1.0) and rec["abstained"] is False


def test_the_evaluation_reports_answerable_and_unanswerable_apart(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from cdsjax.eval.abstention import abstention_table

    monkeypatch.setattr(A, "RULES_FILE", rules(tmp_path, {"*": {"feature": "best_relevance", "threshold": 0.5}}))
    problems = [SimpleNamespace(query=SimpleNamespace(qid=q, meta={"answerable": q != "u"})) for q in ("a", "b", "u")]
    recs = [dict(selector="cosine", budget=5, qid="a", strength={"best_relevance": 0.2}, metrics={"has_answer": 1.0}),
            dict(selector="cosine", budget=5, qid="b", strength={"best_relevance": 0.9}, metrics={"has_answer": 1.0}),
            dict(selector="cosine", budget=5, qid="u", strength={"best_relevance": 0.1}, metrics={"has_answer": None})]
    answers = [dict(selector="cosine", budget=5, qid="a", metrics={"accuracy": 0.0}),
               dict(selector="cosine", budget=5, qid="b", metrics={"accuracy": 1.0}),
               dict(selector="cosine", budget=5, qid="u", metrics={"accuracy": 1.0})]
    row = abstention_table(recs, problems, answers).splitlines()[2]
    assert row == "| cosine | 5 | 2 | 1 | 1 | 1 | 1 of 2 | 0.500 (n=2) | 1.000 (n=1) |"
    assert abstention_table([dict(selector="none", budget=5, qid="a", metrics={})], problems) == ""
