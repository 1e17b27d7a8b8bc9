"""Reader failures that say so (issue 13, failure 4), against a misbehaving local server on 127.0.0.1.

Malformed and empty replies are retried and then named in one line with the server; ``timeout`` bounds the
whole call; a dead reader is found before encoding; ``ask`` prints the selected evidence and an ``error``
object and exits non-zero; a missing crop is sent as text with a warning.
"""

import json
import os
import time

import pytest

from cdsjax.cli import main
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.reader import Reader
from tests.scripted_server import OpenAIServer, completion, message_images
from tests.conftest import DATA

FIG = DATA / "pdfs" / "pdflatex-image.pdf"  # one page with a figure (a crop PNG in the index)
FAST = dict(model="test-model", backoff=0.0, max_backoff=0.0)
EVIDENCE = [dict(note_id="d#0", doc_id="d", page=0, kind="text", text="The answer is 42.")]


def test_malformed_json_reply_is_retried_then_succeeds():
    calls = []

    def respond(req):
        calls.append(1)
        return b'{"id": "x", "choices": [{"message": {"content": "unterminated' if len(calls) < 3 else "42 [1]"

    with OpenAIServer(respond) as srv:
        out = Reader(base_url=srv.base_url, **dict(FAST, max_retries=3)).answer("q?", EVIDENCE)
    assert out.text == "42 [1]" and len(calls) == 3


@pytest.mark.parametrize("body, reason", [
    (b'{"id": "x", "choices": [{"message": {"content": "unterminated', "malformed reply (not valid JSON"),
    (b"", "malformed reply (not valid JSON"),
    (completion("   "), "empty reply"),
    ({"id": "x", "object": "chat.completion", "choices": []}, "reply without choices"),
])
def test_bad_replies_end_in_one_line_naming_the_server(body, reason):
    """A reply read whole (the judge, the planner, VLM enrichment: ``chat`` without streaming)."""
    with OpenAIServer(lambda req: body) as srv:
        with pytest.raises(ReaderError) as info:
            Reader(base_url=srv.base_url, **dict(FAST, max_retries=2)).chat([{"role": "user", "content": "q?"}])
        assert len(srv.requests) == 3, "retried"
    msg = str(info.value)
    assert info.value.kind == "bad_response" and srv.base_url in msg and reason in msg and "\n" not in msg
    assert "3 attempts" in msg


@pytest.mark.parametrize("cut", [True, False])
def test_a_stream_cut_before_its_end_marker_is_an_error_not_an_answer(cut):
    shown = []
    with OpenAIServer(lambda req: "The answer is 42 [1] and", cut_stream=cut) as srv:
        reader = Reader(base_url=srv.base_url, **dict(FAST, max_retries=2))
        if not cut:  # a whole stream is an answer
            out = reader.answer("q?", EVIDENCE, on_token=shown.append)
            assert out.text == "The answer is 42 [1] and" == "".join(shown)
            return
        with pytest.raises(ReaderError) as info:
            reader.answer("q?", EVIDENCE, on_token=shown.append)
        assert len(srv.requests) == 1, "text was shown: not sent again"
    msg = str(info.value)
    assert info.value.kind == "bad_response" and "end marker" in msg and srv.base_url in msg and "\n" not in msg
    assert "".join(shown).startswith("The answer")


@pytest.mark.slow
def test_timeout_is_a_total_deadline():
    with OpenAIServer(lambda req: (503, {"error": {"message": "busy"}}), delay=0.3) as srv:
        reader = Reader(base_url=srv.base_url, **dict(FAST, timeout=1.0, max_retries=10, backoff=0.2))
        t0 = time.perf_counter()
        with pytest.raises(ReaderError):
            reader.answer("q?", EVIDENCE)
        elapsed = time.perf_counter() - t0
    assert elapsed < 1.6, f"gave up after {elapsed:.1f}s with timeout 1.0"
    assert 1 <= len(srv.requests) < 11


def test_probe_finds_a_dead_server_at_once():
    t0 = time.perf_counter()
    err = Reader(base_url="http://127.0.0.1:9/v1", **FAST).probe()
    assert err is not None and err.kind == "unreachable" and "127.0.0.1:9" in str(err)
    assert time.perf_counter() - t0 < 5
    with OpenAIServer() as srv:
        assert Reader(base_url=srv.base_url, **FAST).probe() is None
        wrong = Reader(base_url=srv.base_url, model="other", backoff=0.0).probe()
        assert wrong.kind == "model_not_found" and "test-model" in str(wrong)


@pytest.fixture(scope="module")
def fig_index(tmp_path_factory, data_root):
    """An index of a shared one-page PDF with a figure (the tests above need no data; these skip without it)."""
    out = tmp_path_factory.mktemp("ask") / "index"
    os.environ.setdefault("CDSJAX_CACHE", str(tmp_path_factory.mktemp("cache")))
    assert main(["index", str(FIG), "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.slow
def test_ask_json_on_reader_failure_prints_evidence_and_error(fig_index, capsys):
    body = b'{"choices": [{"message": {"content": "cut'
    with OpenAIServer(lambda req: body) as srv:
        rc = main(["ask", str(fig_index), "what does the figure show?", "--json", "--reader-url", srv.base_url,
                   "--reader-model", "test-model", "--retries", "1"])
    o, e = capsys.readouterr()
    assert rc == 1 and "Traceback" not in e
    obj = json.loads(o)
    assert obj["answer"] is None and obj["evidence"]
    assert set(obj["error"]) == {"kind", "message", "server"}
    assert obj["error"]["kind"] == "bad_response" and obj["error"]["server"] == srv.base_url
    lines = [x for x in e.splitlines() if x.strip()]
    assert lines == [f"cdsjax ask: error: reader: {obj['error']['message']}"]


def test_ask_with_a_dead_reader_fails_fast_and_keeps_the_evidence(fig_index, capsys):
    t0 = time.perf_counter()
    rc = main(["ask", str(fig_index), "what does the figure show?", "--json", "--reader-url",
               "http://127.0.0.1:9/v1", "--reader-model", "m", "--timeout", "60"])
    elapsed = time.perf_counter() - t0
    o, e = capsys.readouterr()
    obj = json.loads(o)
    assert rc == 1 and obj["answer"] is None and obj["evidence"] and obj["error"]["kind"] == "unreachable"
    assert elapsed < 30, "no retries with backoff against a server that is not there"
    rc = main(["ask", str(fig_index), "what does the figure show?", "--reader-url", "http://127.0.0.1:9/v1",
               "--reader-model", "m"])
    o, e = capsys.readouterr()
    assert rc == 1 and "No answer" in o and "Evidence for" in o and "cannot reach the reader" in e


def test_missing_crop_is_sent_as_text_with_a_warning(fig_index, tmp_path, capsys):
    import shutil

    work = tmp_path / "index"
    shutil.copytree(fig_index, work)
    crops = sorted((work / "crops").rglob("*.png"))
    assert crops
    for c in crops:
        c.unlink()
    with OpenAIServer(lambda req: "a figure [1]") as srv:
        rc = main(["ask", str(work), "what does the figure show?", "--json", "--budget", "2", "--reader-url",
                   srv.base_url, "--reader-model", "test-model"])
        requests = list(srv.requests)
    o, e = capsys.readouterr()
    assert rc == 0 and "Traceback" not in e and json.loads(o)["answer"] == "a figure [1]"
    assert "image file not found" in e and "sent as text instead" in e and str(crops[0]) in e
    assert not message_images(requests[-1])


def test_ask_with_a_text_only_reader_sends_the_figure_as_text(fig_index, capsys):
    refusal = (500, {"error": {"code": 500, "message": "image input is not supported"}})
    with OpenAIServer(lambda req: refusal if message_images(req) else "a figure [1]") as srv:
        rc = main(["ask", str(fig_index), "what does the figure show?", "--json", "--budget", "2", "--reader-url",
                   srv.base_url, "--reader-model", "test-model", "--retries", "3"])
        requests = list(srv.requests)
    o, e = capsys.readouterr()
    obj = json.loads(o)
    assert rc == 0 and obj["answer"] == "a figure [1]" and obj["reader"]["image_mode"] == "text"
    assert [bool(message_images(r)) for r in requests] == [True, False]  # refused once, not retried as is
    assert "takes no images" in e
