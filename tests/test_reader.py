"""The reader client against a real local HTTP server speaking the OpenAI API (tests/scripted_server.py)."""

import base64
import re
import time

import pytest
from PIL import Image

from cdsjax.io.reading.llm.config import ReaderConfig
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.reading.reader import Reader
from cdsjax.io.reading.replies import parse_citations
from cdsjax.io.reading.prompt import EvidenceItem, build_messages
from cdsjax.io.util import free_port
from tests.scripted_server import OpenAIServer, completion, message_images, message_text

FAST = dict(model="test-model", max_retries=2, backoff=0.01, max_backoff=0.02, timeout=5.0)


@pytest.fixture
def png(tmp_path):
    path = tmp_path / "figure3.png"
    Image.new("RGB", (8, 6), (200, 30, 30)).save(path)
    return path


@pytest.fixture
def evidence(png):
    return [
        EvidenceItem(note_id="n7", doc_id="paper.pdf", page=4, kind="text",
                     text="The model reaches 91.2% accuracy on the held-out split. " + "filler " * 400),
        {"note_id": "n9", "doc_id": "paper.pdf", "page": 5, "kind": "figure", "bbox": [10, 20, 300, 240],
         "caption": "Figure 3: Accuracy versus budget.", "summary": "A line plot rising to 91.2%.",
         "text": "surrounding words", "image_path": str(png), "score": 0.8, "rank": 2},
        {"note_id": "n2", "doc_id": "other.pdf", "page": 0, "kind": "table", "caption": "Table 1: Datasets.",
         "summary": "", "text": "Table 1 lists 5 datasets.", "image_path": None},
    ]


def closed_port_url():
    return f"http://127.0.0.1:{free_port()}/v1"


def test_build_messages_carries_question_text_and_images(evidence, png):
    messages = build_messages("What accuracy does Figure 3 show?", evidence, max_text_chars=1500)
    assert [m["role"] for m in messages] == ["system", "user"]
    parts = messages[1]["content"]
    texts = [p["text"] for p in parts if p["type"] == "text"]
    images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    joined = "\n".join(texts)
    # One image (the table has no crop), sent as the PNG file's bytes.
    assert len(images) == 1
    prefix, payload = images[0].split(",", 1)
    assert prefix == "data:image/png;base64"
    assert base64.b64decode(payload) == png.read_bytes()
    # The figure's header, caption and summary come right before its image; pages are shown 1-based.
    before_image = texts[parts.index(next(p for p in parts if p["type"] == "image_url")) - 1]
    assert "[2] figure | document: paper.pdf | page 6" in before_image
    assert before_image.rstrip().endswith("Summary: A line plot rising to 91.2%.")
    assert "Caption: Figure 3: Accuracy versus budget." in before_image
    # The table without an image falls back to its text; the question comes last.
    assert "[3] table | document: other.pdf | page 1" in joined and "Table 1 lists 5 datasets." in joined
    assert texts[-1].index("What accuracy does Figure 3 show?") > texts[-1].index("[3] table")
    # The long text note is cut to max_text_chars.
    block = joined.split("[1] text | document: paper.pdf | page 5\n", 1)[1].split("\n\n", 1)[0]
    assert block.startswith("The model reaches 91.2%") and len(block) == 1500


def test_build_messages_rejects_bad_input(evidence, tmp_path):
    with pytest.raises(ValueError, match="question"):
        build_messages("  ", evidence)
    with pytest.raises(ValueError, match=r"evidence\[1\]: kind"):
        build_messages("q", [evidence[0], dict(evidence[1], kind="picture")])
    with pytest.raises(ValueError, match=r"evidence\[0\]: missing key\(s\) page"):
        build_messages("q", [{"note_id": "a", "doc_id": "d"}])
    missing = tmp_path / "gone.png"
    with pytest.raises(FileNotFoundError, match="gone.png"):
        build_messages("q", [dict(evidence[1], image_path=str(missing))])
    not_image = tmp_path / "notes.png"
    not_image.write_text("hello")
    with pytest.raises(ValueError, match="notes.png"):
        build_messages("q", [dict(evidence[1], image_path=str(not_image))])


def test_parse_citations():
    assert parse_citations("It is 5 [2], see also [1, 3] and [2][4].", 4) == (2, 1, 3, 4)
    assert parse_citations("Rows [2-4] agree; in [2019] nothing [0].", 5) == (2, 3, 4)
    assert parse_citations("No markers here.", 3) == ()


def test_answer_end_to_end(evidence, png):
    def responder(req):
        text = message_text(req)
        # Answer only if the evidence really arrived, citing the notes it came from by their numbers in the
        # prompt, which lists them in reading order: other.pdf's table, then paper.pdf's page 5 and page 6
        figure = re.search(r"\[(\d)\] figure", text).group(1)
        passage = re.search(r"\[(\d)\] text", text).group(1)
        assert re.search(r"\[1\] table \| document: other.pdf", text) and (passage, figure) == ("2", "3")
        if "91.2%" in text and "Figure 3" in text and message_images(req):
            return f"<think>look at the plot</think>Accuracy is 91.2% [{figure}], on the held-out split [{passage}]."
        return "Not answerable"

    with OpenAIServer(responder) as srv:
        reader = Reader(base_url=srv.base_url, **FAST)
        out = reader.answer("What accuracy does Figure 3 show?", evidence)
        assert len(srv.requests) == 1
        req = srv.requests[0]
    # the answer's citations come back numbered as the evidence was passed (best first): the figure is 2nd
    assert out.text == "Accuracy is 91.2% [2], on the held-out split [1]."
    assert out.raw == "Accuracy is 91.2% [3], on the held-out split [2]."
    assert out.cited == (2, 1) and not out.abstained
    assert [e.doc_id for e in out.evidence] == ["other.pdf", "paper.pdf", "paper.pdf"]
    assert out.model == "test-model" and out.finish_reason == "stop"
    assert out.usage["total_tokens"] == 1 + out.usage["completion_tokens"] > 1 and out.latency_s > 0  # streamed
    assert req["model"] == "test-model" and req["temperature"] == 0 and req["max_tokens"] == 1024
    assert "What accuracy does Figure 3 show?" in message_text(req)
    assert "The model reaches 91.2% accuracy" in message_text(req)
    assert base64.b64decode(message_images(req)[0].split(",", 1)[1]) == png.read_bytes()


def test_abstention_and_model_autodetect(evidence):
    with OpenAIServer(lambda req: "Not answerable.", models=("only-model",)) as srv:
        reader = Reader(base_url=srv.base_url, backoff=0.01)  # no model given: the server's only one
        out = reader.answer("Who wrote it?", evidence[:1])
        assert srv.requests[0]["model"] == "only-model"
    assert out.abstained and out.cited == ()


def test_env_fallback(monkeypatch):
    monkeypatch.setenv("CDSJAX_READER_URL", "http://example.invalid:9/v1/")
    monkeypatch.setenv("CDSJAX_READER_MODEL", "env-model")
    monkeypatch.setenv("CDSJAX_READER_API_KEY", "env-key")
    cfg = Reader().config
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://example.invalid:9/v1", "env-model", "env-key")
    explicit = Reader(base_url="http://h/v1", model="m", api_key="k").config
    assert (explicit.base_url, explicit.model, explicit.api_key) == ("http://h/v1", "m", "k")
    monkeypatch.delenv("CDSJAX_READER_URL")
    monkeypatch.delenv("CDSJAX_READER_API_KEY")
    with pytest.raises(ReaderError, match="CDSJAX_READER_URL") as info:
        Reader()
    assert info.value.kind == "config"
    assert Reader(base_url="http://h/v1").config.api_key == "EMPTY"
    with pytest.raises(ValueError, match="ReaderConfig.concurrency"):
        ReaderConfig(concurrency=0)


def test_server_down_is_a_clear_error_after_retries(evidence):
    url = closed_port_url()
    reader = Reader(base_url=url, **FAST)
    with pytest.raises(ReaderError) as info:
        reader.answer("q", evidence[:1])
    err = info.value
    assert err.kind == "unreachable" and err.attempts == 3
    assert str(err).startswith(f"cannot reach the reader at {url}") and "\n" not in str(err)


def test_timeout_after_retries(evidence):
    # the timeout bounds the whole call: no second attempt once it has passed
    with OpenAIServer(lambda req: "late", delay=0.6) as srv:
        reader = Reader(base_url=srv.base_url, **dict(FAST, timeout=0.2, max_retries=1))
        with pytest.raises(ReaderError, match=r"did not answer within 0.2 s \(1 attempt\)") as info:
            reader.answer("q", evidence[:1])
        assert info.value.kind == "timeout"
        time.sleep(0.05)
        assert len(srv.requests) == 1


def test_http_500_after_retries(evidence):
    with OpenAIServer(lambda req: (500, {"error": {"message": "CUDA out of memory"}})) as srv:
        reader = Reader(base_url=srv.base_url, **FAST)
        with pytest.raises(ReaderError) as info:
            reader.answer("q", evidence[:1])
        assert len(srv.requests) == 3
    err = info.value
    assert err.kind == "server_error" and err.attempts == 3
    assert "HTTP 500 after 3 attempts: CUDA out of memory" in str(err)


def test_transient_errors_are_retried_until_success(evidence):
    calls = []

    def flaky(req):
        calls.append(1)
        return (503, {"error": {"message": "warming up"}}) if len(calls) < 3 else "fine [1]"

    with OpenAIServer(flaky) as srv:
        out = Reader(base_url=srv.base_url, **FAST).answer("q", evidence[:1])
    assert out.text == "fine [1]" and out.cited == (1,) and len(calls) == 3


def test_model_not_found_lists_served_models(evidence):
    with OpenAIServer(models=("qwen-a", "qwen-b")) as srv:
        reader = Reader(base_url=srv.base_url, **dict(FAST, model="nope"))
        with pytest.raises(ReaderError) as info:
            reader.answer("q", evidence[:1])
        assert len(srv.requests) == 1  # not retried
    assert info.value.kind == "model_not_found"
    assert str(info.value) == f"model 'nope' not found at {srv.base_url}; the server offers: qwen-a, qwen-b"


def test_check(evidence):
    with OpenAIServer(models=("qwen-a", "qwen-b")) as srv:
        assert Reader(base_url=srv.base_url, **dict(FAST, model="qwen-b")).check() == "qwen-b"
        with pytest.raises(ReaderError, match="the server offers: qwen-a, qwen-b") as info:
            Reader(base_url=srv.base_url, **FAST).check()
        assert info.value.kind == "model_not_found"
        with pytest.raises(ReaderError, match="offers qwen-a, qwen-b: pass model or set CDSJAX_READER_MODEL"):
            Reader(base_url=srv.base_url, backoff=0.01).answer("q", evidence[:1])
        assert srv.requests == []  # no chat request without a model


def test_context_too_long_is_not_retried(evidence):
    body = {"object": "error", "type": "BadRequestError", "code": 400,
            "message": "This model's maximum context length is 32768 tokens. However, you requested "
                       "40000 tokens (38976 in the messages, 1024 in the completion)."}
    with OpenAIServer(lambda req: (400, body)) as srv:
        with pytest.raises(ReaderError, match="too long for model 'test-model'.*maximum context length") as info:
            Reader(base_url=srv.base_url, **FAST).answer("q", evidence[:1])
        # never sent again as it is: once without its one note (the question alone), then given up
        assert len(srv.requests) == 2 and "Evidence: none" in message_text(srv.requests[1])
    assert info.value.kind == "context_too_long"


def test_max_model_len_comes_from_the_server_when_unset():
    with OpenAIServer() as srv:
        reader = Reader(base_url=srv.base_url, **FAST)
        assert reader.max_model_len() == 32768  # a server that reports none: the paper's default
        assert Reader(base_url=srv.base_url, **dict(FAST, max_model_len=4096)).max_model_len() == 4096


def test_evidence_budget_comes_from_the_window_a_vllm_server_reports():
    """vLLM lists ``max_model_len`` with each served model; with no budget configured the evidence may fill the
    window less the answer's tokens and the prompt's reserve."""
    windows = {"test-model": {"max_model_len": 24000, "root": "test-model"}, "other": {"max_model_len": 1000}}
    with OpenAIServer(models=("other", "test-model"), model_fields=windows) as srv:
        reader = Reader(base_url=srv.base_url, **dict(FAST, max_tokens=1000))
        assert reader.max_model_len() == 24000  # its own model's entry, not the first one listed
        assert reader.evidence_tokens() == 24000 - 1000 - 1500
        assert reader.evidence_tokens(ReadOptions(answer_tokens=500)) == 24000 - 500 - 1500
        assert reader.evidence_tokens(ReadOptions(evidence_tokens=300)) == 300
        assert reader.evidence_tokens(ReadOptions(evidence_tokens=0)) is None  # whole
    with OpenAIServer(models=("other", "test-model"), model_fields={"other": {"max_model_len": 1000}}) as srv:
        assert Reader(base_url=srv.base_url, **FAST).max_model_len() == 32768  # another model's window


def test_malformed_response_is_a_clear_error(evidence):
    body = completion("x")
    body["choices"][0]["message"]["content"] = None
    with OpenAIServer(lambda req: body) as srv:
        with pytest.raises(ReaderError, match="sent an empty reply") as info:
            Reader(base_url=srv.base_url, **FAST).answer("q", evidence[:1])
    assert info.value.kind == "bad_response"


def test_a_question_that_asks_for_a_number_asks_the_reader_for_it():
    """The request asks for a short answer; where the question asks for an amount it adds a line asking for the
    number in the first sentence, and only there (the rule reads the question's words)."""
    from cdsjax.io.reading.prompt import NUMBER_LINE, QUESTION_LINE, asks_for_number, build_messages

    item = {"note_id": "n0", "doc_id": "d.pdf", "page": 0, "text": "Accuracy rose from 60% to 67%."}
    for question, number in [("How much does step-back prompting improve on MMLU Physics?", True),
                             ("What percentage of seniors use the internet?", True),
                             ("In what year was the cooperative founded?", True),
                             ("How many layers does the encoder have?", True),
                             ("What is step-back prompting?", False),
                             ("Which baselines do they compare to?", False),
                             ("Who wrote the report?", False)]:
        assert asks_for_number(question) is number, question
        user = build_messages(question, [item])[1]["content"][-1]["text"]
        assert user.endswith(QUESTION_LINE + (f"\n{NUMBER_LINE}" if number else "")), question
    assert not asks_for_number("") and "at most two sentences" in QUESTION_LINE
