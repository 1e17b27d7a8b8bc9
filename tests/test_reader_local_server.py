"""What a small local server (llama.cpp) needs of the reader, against the scripted server on loopback: a text-only
server refuses images once and gets text from then on, its context size is read from /props, and its overflow
message is ``context_too_long`` with the request trimmed rather than sent again as it is (issue 62, item 3)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from cdsjax.io.reading.llm.client import ChatClient
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.reader import Reader, notes_to_drop
from cdsjax.io.reading.prompt import EvidenceItem
from tests.scripted_server import OpenAIServer, message_images, message_text

FAST = dict(model="test-model", max_retries=3, backoff=0.0, max_backoff=0.0, timeout=10.0)
# llama.cpp's answers, as its server sends them
NO_IMAGES = (500, {"error": {"code": 500, "type": "server_error", "message": "image input is not supported - hint: "
                             "if this is unexpected, you may need to provide the mmproj"}})


def _overflow(n_prompt, n_ctx):
    return (400, {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt,
                            "n_ctx": n_ctx, "message": f"request ({n_prompt} tokens) exceeds the available "
                                                       f"context size ({n_ctx} tokens), try increasing it"}})


@pytest.fixture
def evidence(tmp_path):
    png = tmp_path / "fig.png"
    Image.new("RGB", (8, 6), (200, 30, 30)).save(png)
    return [
        EvidenceItem(note_id="t1", doc_id="d", page=0, text="Revenue was 4.2 million euros in 2019."),
        EvidenceItem(note_id="f1", doc_id="d", page=1, kind="figure", caption="Figure 1: Harvest per month.",
                     summary="Apples peak in September.", text="The chart below shows the harvest.",
                     image_path=str(png)),
        EvidenceItem(note_id="t2", doc_id="d", page=2, text="The cooperative has 40 members. " * 20),
    ]


def _text_only(req):
    return NO_IMAGES if message_images(req) else "4.2 million euros [1]"


def test_text_only_server_refuses_once_then_gets_text(evidence):
    with OpenAIServer(_text_only) as srv:
        reader = Reader(base_url=srv.base_url, **FAST)  # images="auto", retries on: a refusal is not retried
        first = reader.answer("How much?", evidence)
        later = [reader.answer("How much?", evidence) for _ in range(3)]
        sent = list(srv.requests)
    assert [bool(message_images(r)) for r in sent] == [True, False, False, False, False]  # one 500 in all
    assert first.text == "4.2 million euros [1]" and first.image_mode == "text"
    assert all(a.image_mode == "text" for a in later) and reader.takes_images is False
    text = message_text(sent[1])  # the figure as its caption, summary and surrounding text
    assert "Caption: Figure 1: Harvest per month." in text and "Summary: Apples peak in September." in text
    assert "Text: The chart below shows the harvest." in text
    assert any("takes no images" in w for w in first.warnings)


def test_concurrent_requests_to_a_text_only_server_meet_one_refusal(evidence):
    with OpenAIServer(_text_only, delay=0.05) as srv:
        reader = Reader(base_url=srv.base_url, **dict(FAST, concurrency=4))
        with ThreadPoolExecutor(4) as pool:
            out = list(pool.map(lambda _: reader.answer("How much?", evidence), range(6)))
        refused = sum(1 for r in srv.requests if message_images(r))
    assert refused == 1 and all(a.image_mode == "text" for a in out)


def test_images_on_and_off(evidence):
    with OpenAIServer(_text_only) as srv:
        with pytest.raises(ReaderError, match="takes no images") as info:
            Reader(base_url=srv.base_url, **dict(FAST, images="on")).answer("How much?", evidence)
        assert info.value.kind == "images_unsupported" and len(srv.requests) == 1  # not retried
        off = Reader(base_url=srv.base_url, **dict(FAST, images="off")).answer("How much?", evidence)
        assert off.image_mode == "text" and not message_images(srv.requests[-1]) and len(srv.requests) == 2
        assert not any("takes no images" in w for w in off.warnings)  # asked for, not learned
    with OpenAIServer(lambda req: "ok [2]") as srv:  # a vision server: images go, and stay on
        reader = Reader(base_url=srv.base_url, **FAST)
        assert reader.answer("q", evidence).image_mode == "images" and reader.takes_images is True
        assert reader.answer("q", evidence[:1]).image_mode == "none"
    with pytest.raises(ValueError, match="images must be one of auto, on, off"):
        Reader(base_url="http://127.0.0.1:9/v1", images="maybe")


def test_context_size_from_props_then_models():
    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2}
    with OpenAIServer(props=props) as srv:
        assert Reader(base_url=srv.base_url, **FAST).max_model_len() == 4096
    with OpenAIServer(props={"n_ctx": 2048}) as srv:  # an older llama.cpp: top level
        assert ChatClient(base_url=srv.base_url, **FAST).context_size() == 2048
    with OpenAIServer(model_fields={"test-model": {"max_model_len": 8192}}) as srv:  # vLLM: no /props
        assert Reader(base_url=srv.base_url, **FAST).max_model_len() == 8192
    with OpenAIServer() as srv:
        assert Reader(base_url=srv.base_url, **FAST).max_model_len() == 32768
        assert Reader(base_url=srv.base_url, **dict(FAST, max_model_len=1000)).max_model_len() == 1000


def test_llama_overflow_is_context_too_long_and_trims_the_last_notes(evidence):
    def respond(req):  # fits without the long last note (~183 tokens)
        return _overflow(690, 512) if "40 members" in message_text(req) else "4.2 million euros [1]"

    with OpenAIServer(respond) as srv:
        out = Reader(base_url=srv.base_url, **dict(FAST, images="off")).answer("How much?", evidence)
        sent = list(srv.requests)
    assert len(sent) == 2 and "40 members" not in message_text(sent[1]) and "Harvest" in message_text(sent[1])
    assert out.dropped == 1 and out.cited == (1,)
    assert any("the last 1 of 3 evidence notes were left out" in w for w in out.warnings)
    # with nothing left to leave out, the overflow is the error (and every request had fewer notes)
    with OpenAIServer(lambda req: _overflow(9000, 512)) as srv:
        with pytest.raises(ReaderError, match="exceeds the available context size") as info:
            Reader(base_url=srv.base_url, **dict(FAST, images="off")).answer("How much?", evidence)
        counts = [message_text(r).count("| document: d |") for r in srv.requests]
    assert info.value.kind == "context_too_long" and info.value.overflow == (9000, 512)
    assert counts == sorted(set(counts), reverse=True) and counts[-1] == 0  # never the same request twice


def test_overflow_phrasings_and_how_many_notes_go(evidence):
    older = (500, {"error": {"code": 500, "message": "the request exceeds the available context size, try "
                                                     "increasing it"}})
    with OpenAIServer(lambda req: older) as srv:
        with pytest.raises(ReaderError) as info:
            ChatClient(base_url=srv.base_url, **FAST).chat([{"role": "user", "content": "q"}])
        assert info.value.kind == "context_too_long" and len(srv.requests) == 1  # a 500, yet not retried
    assert notes_to_drop(evidence, None, 1500) == 1  # no counts: one at a time
    assert notes_to_drop(evidence, (520, 512), 1500) == 1  # the last note holds ~183 tokens
    assert notes_to_drop(evidence, (800, 512), 1500) == 2  # with the figure's image estimate
    assert notes_to_drop(evidence, (99999, 512), 1500) == 3


def test_a_failure_while_learning_leaves_it_unlearned(evidence):
    calls = []
    lock = threading.Lock()

    def respond(req):
        with lock:
            calls.append(bool(message_images(req)))
            first = len(calls) == 1
        return (400, {"error": {"message": "bad"}}) if first else "ok"

    with OpenAIServer(respond) as srv:
        reader = Reader(base_url=srv.base_url, **FAST)
        with pytest.raises(ReaderError):
            reader.answer("q", evidence)
        assert reader.takes_images is None
        assert reader.answer("q", evidence).image_mode == "images" and reader.takes_images is True
