"""The LLM judge client against a real local HTTP server speaking the OpenAI API."""

import json

import pytest

from cdsjax.io.reading.judge import Judge, JudgeVerdict, parse_verdict
from cdsjax.io.reading.llm.errors import ReaderError
from tests.scripted_server import OpenAIServer, message_text

FAST = dict(model="test-model", max_retries=1, backoff=0.01, max_backoff=0.02, timeout=5.0)


def grading_responder(req):
    """Grades like a (very literal) judge: correct iff the reference answer appears in the candidate."""
    text = message_text(req)
    gold = text.split("Reference answer: ")[1].split("\n")[0]
    candidate = text.split("Candidate answer: ")[1]
    ok = gold.lower() in candidate.lower()
    verdict = {"rationale": f"candidate {'contains' if ok else 'lacks'} {gold}", "correct": ok,
               "score": 1.0 if ok else 0.0}
    return "```json\n" + json.dumps(verdict) + "\n```"


def test_judge_end_to_end():
    with OpenAIServer(grading_responder) as srv:
        judge = Judge(base_url=srv.base_url, **FAST)
        good = judge.judge("Which year was the dataset released?", "2019", "It was released in 2019 [3].")
        bad = judge.judge("Which year was the dataset released?", "2019", "In 2021 [1].")
        req = srv.requests[0]
    assert good.correct and good.score == 1.0 and good.rationale == "candidate contains 2019"
    assert not bad.correct and bad.score == 0.0 and bad.model == "test-model"
    assert req["temperature"] == 0 and req["messages"][0]["role"] == "system"
    text = message_text(req)
    assert "Which year was the dataset released?" in text and "It was released in 2019 [3]." in text


def test_empty_prediction_needs_no_request():
    with OpenAIServer(grading_responder) as srv:
        verdict = Judge(base_url=srv.base_url, **FAST).judge("q", "42", "  ")
        assert srv.requests == []
    assert verdict == JudgeVerdict(correct=False, score=0.0, rationale="empty prediction")


@pytest.mark.parametrize("reply, expected", [
    ('{"rationale": "same value", "correct": true, "score": 0.9}', (True, 0.9, "same value")),
    ('Sure.\n```json\n{"correct": "no", "rationale": "wrong unit"}\n```', (False, 0.0, "wrong unit")),
    ('<think>{"correct": true}</think>{"score": "0.25", "rationale": "partial"}', (False, 0.25, "partial")),
    ('{"Correct": 1, "Score": 7}', (True, 1.0, "")),
    ("correct: yes\nscore: 0.8\nrationale: matches the table", (True, 0.8, "matches the table")),
    ("Incorrect. The candidate gives 12, not 21.", (False, 0.0, "The candidate gives 12, not 21")),
    ("The answer is incorrect: false", None),
    ("I cannot decide.", None),
])
def test_parse_verdict(reply, expected):
    if expected is None:
        with pytest.raises(ValueError, match="no readable verdict"):
            parse_verdict(reply)
    else:
        assert parse_verdict(reply) == expected


def test_unreadable_verdict_is_a_clear_error():
    with OpenAIServer(lambda req: "Hmm, hard to say.") as srv:
        with pytest.raises(ReaderError, match="no readable verdict: 'Hmm, hard to say.'") as info:
            Judge(base_url=srv.base_url, **FAST).judge("q", "a", "b")
    assert info.value.kind == "bad_response"


def test_judge_errors_and_env(monkeypatch):
    monkeypatch.delenv("CDSJAX_JUDGE_URL", raising=False)
    monkeypatch.delenv("CDSJAX_JUDGE_API_KEY", raising=False)
    with pytest.raises(ReaderError, match="CDSJAX_JUDGE_URL"):
        Judge()
    monkeypatch.setenv("CDSJAX_JUDGE_URL", "http://judge.invalid/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    assert Judge().config.api_key == "sk-fallback"
    with OpenAIServer(lambda req: (502, {"error": {"message": "bad gateway"}})) as srv:
        with pytest.raises(ReaderError, match=r"judge at .* HTTP 502 after 2 attempts: bad gateway"):
            Judge(base_url=srv.base_url, **FAST).judge("q", "a", "b")
        assert len(srv.requests) == 2
    with pytest.raises(ValueError, match="gold_answer"):
        Judge(base_url="http://h/v1", **FAST).judge("q", "", "b")


def test_a_verdict_only_judge_asks_for_the_verdict_alone():
    from cdsjax.io.reading.judge import JUDGE_PROMPT, VERDICT_ONLY_PROMPT, Judge
    from tests.scripted_server import OpenAIServer

    with OpenAIServer(lambda req: '{"correct": true, "score": 1}', models=("j",)) as srv:
        verdict = Judge(base_url=srv.base_url, model="j", rationale=False).judge("Q?", "BERT", "BERT [1]")
        system = srv.requests[0]["messages"][0]["content"]
    assert verdict.correct and verdict.score == 1.0
    assert system == VERDICT_ONLY_PROMPT and "rationale" not in system
    assert VERDICT_ONLY_PROMPT.split("Reply with")[0] == JUDGE_PROMPT.split("Reply with")[0]  # the same rules
