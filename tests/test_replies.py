"""One reading of model replies (io/replies.py) and one chat client (io/llm.py) for reader, judge, VLM, planner.

The cases marked "differed" are where the old per-caller parsers disagreed: the reader's ``<think>``
regex was case-sensitive while the planner's was not; the VLM and the judge took the first JSON object in
the raw text (inside a thinking block too) and could not read curly quotes or trailing commas, which the
planner repaired.
"""

import dataclasses

import pytest

from cdsjax.agents import plan as P
from cdsjax.agents.trace import NodeResult
from cdsjax.agents.plan import PlanNode
from cdsjax.io.reading.judge import parse_verdict
from cdsjax.io.reading.llm.client import ChatClient
from cdsjax.io.reading.llm.config import ChatReply, ReaderConfig
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.replies import find_json, markers_only, parse_citations, strip_citations, strip_thinking
from cdsjax.io.util import one_line
from cdsjax.io.reading.vlm import VLMClient, VLMError
from tests.scripted_server import OpenAIServer, completion


@pytest.mark.parametrize("reply, text", [
    ("<think>plan</think> 42 [1]", "42 [1]"),
    ("<THINK>plan</THINK>42", "42"),  # differed: the reader kept an upper-case block
    ("<Think>a</think>x<think>b</Think>y", "xy"),
    ("reasoning without an opening tag</Think>\n 42", "42"),  # differed: a lone closing tag in another case
    ("a</think>b</think> c", "c"),
    ("no thinking here ", "no thinking here"),
    ("<think>cut off by max_tokens", "<think>cut off by max_tokens"),
])
def test_strip_thinking(reply, text):
    assert strip_thinking(reply) == text


@pytest.mark.parametrize("reply, value", [
    ('Sure! {"a": 1} trailing', {"a": 1}),
    ('```json\n{"summary": "x"}\n```', {"summary": "x"}),
    ('```JSON\n{"summary": "x"}\n``` and {"other": 2}', {"summary": "x"}),  # a fence wins over prose
    ('{broken {"ok": true}', {"ok": True}),
    ('{"outer": {"inner": 1}}', {"outer": {"inner": 1}}),  # the whole object, not the nested one
    ('[{"a": 1}]', {"a": 1}),  # a dict wanted: the one inside the list
    ("no json", None),
    ("[1, 2]", None),
    ("", None),
    (None, None),
    ('<think>{"summary": "draft"}</think>{"summary": "final"}', {"summary": "final"}),  # differed (VLM)
    ('<THINK>{"summary": "draft"}</THINK>{"summary": "final"}', {"summary": "final"}),  # differed (case)
    ("{\u201csummary\u201d: \u201ccurly\u201d}", {"summary": "curly"}),  # differed (VLM, judge)
    ('{"keywords": ["a", "b",],}', {"keywords": ["a", "b"]}),  # differed (VLM, judge)
])
def test_find_json(reply, value):
    assert find_json(reply) == value


def test_find_json_types_and_accept():
    assert find_json('x [1, 2] {"a": 1}', want=list) == [1, 2]
    assert find_json('x [1, 2] {"a": 1}', want=(dict, list)) == [1, 2]
    has_score = lambda v: "score" in v  # noqa: E731
    assert find_json('{"note": 1} then {"score": 0.5}', accept=has_score) == {"score": 0.5}
    assert find_json('{"note": 1}', accept=has_score) is None


@pytest.mark.parametrize("reply, expected", [
    ('<THINK>{"correct": true}</THINK>{"score": 0.25, "rationale": "partial"}', (False, 0.25, "partial")),
    ('{"rationale": "same", "correct": true, "score": 0.9,}', (True, 0.9, "same")),
    ("{\u201ccorrect\u201d: false, \u201crationale\u201d: \u201cwrong unit\u201d}", (False, 0.0, "wrong unit")),
])
def test_judge_reads_what_the_planner_reads(reply, expected):
    """differed: the judge could not read these replies before; now it reads JSON as the planner does."""
    assert parse_verdict(reply) == expected


def test_plan_reads_an_upper_case_thinking_block():
    plan, _ = P.parse_plan('<THINK>{"nodes": [{"id": "z", "question": "no"}]}</THINK>'
                           '{"nodes": [{"id": "a", "question": "x"}]}')
    assert list(plan.order) == ["a"]
    with pytest.raises(P.PlanError, match="expected a JSON object with 'sufficient', got list"):
        P.parse_sufficiency("[1, 2]")
    with pytest.raises(P.PlanError, match="no JSON object in the reply: '<think>{}</think>nothing'"):
        P.extract_json("<think>{}</think>nothing")


@pytest.mark.parametrize("text, cited, bare", [
    ("Heron [1].", (1,), "Heron."),
    ("A [2], B [1, 3] and C [2-4]", (2, 1, 3, 4), "A, B and C"),
    ("x [1; 4] y [ 5 ]", (1, 4), "x y"),
    ("in [2019] the rate [2–3]", (2, 3), "in the rate"),
])
def test_citations_are_read_and_removed_alike(text, cited, bare):
    assert parse_citations(text, 4) == cited
    assert strip_citations(text) == bare
    finding = NodeResult(PlanNode("q1", "?"), [], text, [], False).finding
    assert finding == bare


def test_one_line():
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("x" * 10, 5) == "xxxx…"


FAST = dict(model="test-model", max_retries=2, backoff=0.01, max_backoff=0.02, timeout=5.0)


def test_chat_returns_a_frozen_reply():
    with OpenAIServer(lambda req: "hello") as srv:
        with ChatClient(ReaderConfig(base_url=srv.base_url, **FAST)) as client:
            reply = client.chat([{"role": "user", "content": "hi"}], max_tokens=7)
        assert srv.requests[0]["max_tokens"] == 7
    assert isinstance(reply, ChatReply)
    assert (reply.content, reply.finish_reason, reply.model) == ("hello", "stop", "test-model")
    assert reply.usage["total_tokens"] == 2 and reply.latency_s > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        reply.content = "changed"


def _vlm_config(url, **enrich):
    import ml_collections

    cfg = dict(vlm_url=url, vlm_model="test-model", vlm_api_key="EMPTY", timeout=10.0, max_retries=1,
               max_tokens=64, concurrency=1)
    cfg.update(enrich)
    return ml_collections.ConfigDict(dict(enrich=cfg))


@pytest.mark.slow
def test_vlm_uses_the_shared_retry_policy():
    """The VLM retries like the reader: a failed request, then the answer (one policy for all callers)."""
    state = {"n": 0}

    def respond(req):
        state["n"] += 1
        return (503, {"error": {"message": "warming up"}}) if state["n"] == 1 else completion('{"summary": "s"}')

    with OpenAIServer(respond) as srv:
        client = VLMClient.from_config(_vlm_config(srv.base_url))
        assert client.ask("system", "user") == ('{"summary": "s"}', "")
        assert len(srv.requests) == 2 and srv.requests[1]["max_tokens"] == 64
        assert srv.requests[1]["temperature"] == 0

        state["n"] = -10  # every request fails from here on: a per-note failure, by HTTP status
        srv.responder = lambda req: (500, {"error": {"message": "crashed"}})
        assert client.ask("system", "user") == (None, "HTTP 500")


def test_vlm_errors_that_stop_enrichment_are_one_line():
    with OpenAIServer(lambda req: "x", models=("other-model",)) as srv:
        with pytest.raises(VLMError, match=r"model 'test-model' not found at .*other-model"):
            VLMClient.from_config(_vlm_config(srv.base_url)).ask("system", "user")
    with pytest.raises(ReaderError, match="no server URL configured"):
        VLMClient(ReaderConfig())


def test_yes_no_fields_and_leading_words_are_read_in_one_place():
    from cdsjax.io.reading.replies import find_field, leading_word, read_bool, read_float, starts_with

    assert read_bool(" Yes ") is True and read_bool("n") is False and read_bool("maybe") is None
    assert read_bool("correct") is None and read_bool("Correct", yes=("correct",)) is True
    assert read_bool(0.7) is True and read_bool(0.7, threshold=None) is None and read_bool(1, threshold=None) is True
    assert read_float("0.25") == 0.25 and read_float(True) is None and read_float(float("nan")) is None
    reply = "Correct: no\nscore = 0.2\nrationale: 'the year differs'"
    assert find_field(reply, "correct") == "no" and find_field(reply, "score") == "0.2"
    assert find_field(reply, "rationale", free_text=True) == "the year differs"
    assert find_field("incorrect: 1", "correct") is None  # a field name inside another word is not it
    assert leading_word("**Wrong.** It was 2019.", ("correct", "wrong")) == ("Wrong", ".** It was 2019.")
    assert starts_with("**Not answerable.**", "Not answerable") and not starts_with("It is answerable", "answerable")


@pytest.mark.parametrize("text, question, expected", [
    ("The baselines are [2] and [3].", "", True),  # the markers stand where the names should be
    ("The baselines they compared with are [2] and [3].", "What baselines did they compare with?", True),
    ("The answer is in [3].", "", True),
    ("The results are shown in [2].", "", True),
    ("The datasets used are: [1], [4].", "", True),
    ("[2]", "", True),
    ("<think>BERT [1]</think>The baselines are [1].", "", True),  # the thinking block is not the answer
    ("The baselines are BERT and ELMo [2][3].", "", False),  # content first, markers after
    ("They compare with BERT [1] and ELMo [2].", "", False),
    ("It was 2019 [2].", "", False),
    ("Yes, they do [2].", "Do they use attention?", False),  # yes is the content of a yes/no answer
    ("The model is described in [1], and uses attention.", "", False),  # content after the marker
    ("Table 2 [3]", "", False),
    ("Not answerable", "", False),  # cites nothing
    ("42", "", False),
    # a real reply of the local 1.5B model: the content comes first, a closing sentence points at the evidence
    ("Intent is annotated with a hierarchical scheme on both datasets. The evidence is [1].", "How is intent "
     "annotated?", False),
    ("See [2]. It is in [3].", "", True),  # every sentence gives markers only
])
def test_markers_only(text, question, expected):
    assert markers_only(text, question) is expected
