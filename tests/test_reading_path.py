"""The one reading path (issue 68): evidence fitted to a token budget, replies that are no answer caught and asked
again, answers streamed to the terminal after the evidence, and ``--json`` saying what happened."""

import json
import re
import subprocess
import sys
import time

import pytest

from cdsjax.cli import main
from cdsjax.io.reading.evidence_fit import (CHARS_PER_TOKEN, estimate_tokens, fit_evidence, nearest_sentences,
                                    split_sentences, word_overlap)
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.reading.reader import Reader, fit_items
from cdsjax.io.reading.prompt import EvidenceItem
from cdsjax.io.reading.replies import ReplyGuard, echoes_evidence, looping, no_answer
from tests.scripted_server import OpenAIServer, message_text

FAST = dict(model="test-model", max_retries=0, backoff=0.01, max_backoff=0.02, timeout=10.0)
LONG = ("The survey covers twelve farms. Apples peak in September at 4.2 tonnes a day. The cooperative was founded "
        "in 1987. Pears ripen later, in October. Prices fell by 8% in 2021 because of a wet spring. The report "
        "ends with a list of members.")


def note(i, text, **kw):
    return EvidenceItem(note_id=f"n{i}", doc_id="d.pdf", page=i, text=text, rank=i + 1, **kw)


# ------------------------------------------------------------------ fitting


def test_sentences_nearest_the_question_keep_their_reading_order():
    q = "When do apples peak and how much?"
    assert split_sentences(LONG)[1] == "Apples peak in September at 4.2 tonnes a day."
    scores = word_overlap(q, split_sentences(LONG))
    assert max(range(len(scores)), key=scores.__getitem__) == 1
    kept = nearest_sentences(q, LONG, max_tokens=estimate_tokens(split_sentences(LONG)[1]) + 1)
    assert kept == "Apples peak in September at 4.2 tonnes a day."
    # two sentences apart are joined by an ellipsis, in reading order, whatever their scores' order
    sim = lambda q, s: [1.0 if "Prices" in x else 0.9 if "Apples" in x else 0.0 for x in s]  # noqa: E731
    pair = [x for x in split_sentences(LONG) if "Prices" in x or "Apples" in x]
    two = nearest_sentences(q, LONG, max_tokens=sum(estimate_tokens(x) + 1 for x in pair), similarity=sim)
    assert two == "Apples peak in September at 4.2 tonnes a day. … Prices fell by 8% in 2021 because of a wet spring."
    assert nearest_sentences(q, LONG, max_tokens=3) == ""  # even the best sentence does not fit


def test_fit_fills_the_budget_in_rank_order_and_trims_the_first_that_does_not_fit():
    items = [note(0, "Short first note about pears."), note(1, LONG), note(2, "A third note, never reached.")]
    whole = [estimate_tokens(i.text) for i in items]
    out = fit_items("When do apples peak?", items, whole[0] + 30, max_text_chars=1500)
    assert [i.note_id for i in out.items] == ["n0", "n1"] and out.trimmed == 1 and out.left_out == 1
    assert out.items[0] == items[0] and "Apples peak in September" in out.items[1].text
    assert len(out.items[1].text) < len(LONG) and out.tokens <= whole[0] + 30
    everything = fit_items("q", items, sum(whole) + 10, max_text_chars=1500)
    assert everything.items == items and everything.trimmed == 0 and everything.left_out == 0
    assert fit_items("q", items, None, max_text_chars=1500).items == items  # no budget: every note whole
    tiny = fit_items("q", items, whole[0] + 5, max_text_chars=1500)  # too little room left to trim into
    assert [i.note_id for i in tiny.items] == ["n0"] and tiny.trimmed == 0 and tiny.left_out == 2
    with pytest.raises(ValueError, match="token budget"):
        fit_evidence("q", items, 0, render=lambda i: i.text, shorten=lambda *a: None)
    assert CHARS_PER_TOKEN > 3  # the estimate is per character, measured on the default reader's tokenizer


def test_the_reader_sends_the_fitted_evidence():
    items = [note(0, LONG), note(1, "The second note says the cooperative has 40 members.")]
    with OpenAIServer(lambda req: "In September [1].") as srv:
        reader = Reader(base_url=srv.base_url, **FAST)
        out = reader.answer("When do apples peak?", items, ReadOptions(evidence_tokens=30))
        sent = message_text(srv.requests[0])
        whole = reader.answer("When do apples peak?", items, ReadOptions(evidence_tokens=0))
        assert "40 members" in message_text(srv.requests[1]) and "founded in 1987" in message_text(srv.requests[1])
    assert "Apples peak in September" in sent and "40 members" not in sent and "founded in 1987" not in sent
    assert out.trimmed == 1 and out.dropped == 1 and 0 < out.evidence_tokens <= 30 and out.text == "In September [1]."
    assert whole.trimmed == 0 and whole.dropped == 0 and whole.evidence_tokens > 30


def test_read_options_are_checked_in_one_line():
    for bad, kind in (({"evidence_tokens": -1}, ValueError), ({"evidence_tokens": 1.5}, TypeError),
                      ({"answer_tokens": 0}, ValueError), ({"seed": "1"}, TypeError)):
        with pytest.raises(kind, match="ReadOptions"):
            ReadOptions(**bad)
    base = ReadOptions(evidence_tokens=500, seed=3)
    assert base.updated(evidence_tokens=None) == base  # a request that names nothing keeps the edge's default
    assert base.updated(evidence_tokens=0) == ReadOptions(evidence_tokens=0, seed=3)


# ------------------------------------------------------------------ replies that are no answer


@pytest.mark.parametrize("reply, reason", [
    ("[1] [2]", "markers_only"),
    ("The baselines are [2] and [3].", "markers_only"),
    ("[2] table | document: form.pdf | page 12\n[3] text | document: form.pdf | page 4", "echoed_evidence"),
    ("Evidence (3 items):\n[1] ...", "echoed_evidence"),
    ("4.2, " * 40, "loop"),
    ("", "empty"),
    ("BERT and ELMo [2][3].", None),
    ("BERT is better than ELMo [1].", None),  # the question's own words answer a yes/no question
    ("Not answerable", None),
    ("Revenue rose 8% to 4.2 million euros [1].", None),
])
def test_no_answer(reply, reason):
    assert no_answer(reply) == reason  # the question: "Is BERT better than ELMo?"


def test_loops_and_echoes():
    assert looping("The answer is 12. " * 5) and not looping("The answer is 12 [1].")
    assert looping("line one of the reply\nline one of the reply\nline one of the reply")
    assert echoes_evidence("see [4] chart | document: a.pdf | page 2") and not echoes_evidence("Table 2 [1]")


def test_guard_holds_back_markers_and_stops_an_echo_or_a_loop():
    shown = []
    guard = ReplyGuard(shown.append)
    for piece in ["[1]", " [2]", " The", " yield", " is", " 4.2", " t", " [1]."]:
        assert guard(piece) is False
    assert "".join(shown) == "[1] [2] The yield is 4.2 t [1]." and shown[0].startswith("[1] [2] The yield")
    echo = ReplyGuard(shown.append)
    assert not echo("[2] table ") and echo("| document: a.pdf | page 3") and echo.problem == "echoed_evidence"
    loop = ReplyGuard(shown.append)
    stopped = [loop("and again ") for _ in range(16)]
    assert any(stopped) and loop.problem == "loop"


def test_a_reply_that_is_no_answer_is_asked_again_once_then_reported():
    replies = iter(["[1] [2]", "Apples peak in September [1]."])
    with OpenAIServer(lambda req: next(replies)) as srv:
        shown, retried = [], []
        out = Reader(base_url=srv.base_url, **FAST).answer("When?", [note(0, LONG)], on_token=shown.append,
                                                          on_retry=retried.append)
        second = message_text(srv.requests[1])
    assert out.text == "Apples peak in September [1]." and out.retried == "markers_only" and out.no_answer is None
    assert retried == ["markers_only"] and "".join(shown) == out.text  # the markers were never shown
    assert "Do not copy the evidence" in second and "Do not copy" not in message_text(srv.requests[0])
    with OpenAIServer(lambda req: "[1]") as srv:
        out = Reader(base_url=srv.base_url, **FAST).answer("When?", [note(0, LONG)], on_token=shown.append)
        assert len(srv.requests) == 2
    assert out.text == "" and out.no_answer == "markers_only" and out.raw == "[1]"


def test_the_guard_runs_when_the_caller_shows_nothing():
    """No ``on_token``: the reply is streamed through the guard all the same, so an echo of the evidence ends
    the stream and is asked again, as for a caller that displays it."""
    echo = "[1] | document: a.pdf | page 3 | " + "Apples peak in September. " * 40
    replies = iter([echo, "Apples peak in September [1]."])
    with OpenAIServer(lambda req: next(replies)) as srv:
        out = Reader(base_url=srv.base_url, **FAST).answer("When?", [note(0, LONG)])
        assert all(r.get("stream") for r in srv.requests)
    assert out.retried == "echoed_evidence" and out.text == "Apples peak in September [1]."


# ------------------------------------------------------------------ ask: evidence first, then the answer as it comes


@pytest.fixture(scope="module")
def index(tmp_path_factory, data_root):
    out = tmp_path_factory.mktemp("reading") / "index"
    assert main(["index", str(data_root / "pdfs" / "multicolumn.pdf"), "--out", str(out)]) == 0
    return out


def test_ask_shows_the_evidence_then_streams_the_answer(index, tmp_path):
    """Run as a person would (a pipe, not --json): the evidence table is on stdout before the first piece of the
    answer arrives, and the answer comes in several pieces over time."""
    with OpenAIServer(lambda req: "The sample shows a multi column layout [1].", stream_pause=0.3) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "ask", str(index), "What is the sample about?",
                                 "--budget", "3", "--selector", "cosine", "--reader-url", srv.base_url,
                                 "--reader-model", "test-model"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        arrivals, buffer = [], b""
        while True:
            chunk = proc.stdout.read1(4096)
            if not chunk:
                break
            buffer += chunk
            arrivals.append((time.perf_counter(), buffer.decode(errors="replace")))
        assert proc.wait(60) == 0, proc.stderr.read().decode()[-2000:]
    final = arrivals[-1][1]
    # the reader cited the first note of its prompt (reading order); the answer shows it by its rank in the table
    cited = re.search(r"multi column layout \[(\d)\]\.", final)
    assert "Evidence for: What is the sample about?" in final and cited
    evidence_at = next(t for t, text in arrivals if "Evidence for" in text and "pages are shown" in text)
    first_word_at = next(t for t, text in arrivals if "The sample" in text)
    whole_at = next(t for t, text in arrivals if cited.group(0) in text)
    assert evidence_at <= first_word_at < whole_at and whole_at - first_word_at > 0.5  # streamed, not at once
    assert f"cited: [{cited.group(1)}] multicolumn.pdf" in final
    # one clock: the evidence, the first token and the end, in that order, in seconds from the command's start
    clock = re.search(r"evidence at ([\d.]+)s, first token at ([\d.]+)s, done at ([\d.]+)s", " ".join(final.split()))
    assert clock and float(clock.group(1)) <= float(clock.group(2)) <= float(clock.group(3)), final[-600:]


def test_ask_json_says_when_the_reader_gave_no_answer(index, capsys):
    with OpenAIServer(lambda req: "[1] [2]") as srv:
        rc = main(["ask", str(index), "What is the sample about?", "--json", "--budget", "2", "--reader-url",
                   srv.base_url, "--reader-model", "test-model"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and obj["answer"] is None and obj["reader"]["no_answer"] == "markers_only"
    assert obj["reader"]["reply"] == "[1] [2]" and any("gave no answer" in w for w in obj["warnings"])
    t = obj["timings"]
    assert 0 < t["evidence"] <= t["first_token"] <= t["total"] and t["read"] <= t["total"]
    with OpenAIServer(lambda req: "[1] [2]") as srv:
        rc = main(["ask", str(index), "What is the sample about?", "--budget", "2", "--reader-url", srv.base_url,
                   "--reader-model", "test-model"])
    out = capsys.readouterr().out
    assert rc == 0 and "No answer" in out and "[1] [2]" not in out.split("No answer")[0].split("Answer:")[-1]


def test_ask_marks_the_notes_the_reader_got(index, capsys):
    """With a token budget that holds some notes: --json says per note whether the reader got it whole, in part or
    not at all, as it was sent (the reader's prompt holds exactly the notes marked read), and the table says so."""
    with OpenAIServer(lambda req: "It is a sample [1].") as srv:
        rc = main(["ask", str(index), "What is the sample about?", "--json", "--budget", "6", "--selector", "cosine",
                   "--reader-url", srv.base_url, "--reader-model", "test-model", "--evidence-tokens", "150"])
        prompt = message_text(srv.requests[-1])
    obj = json.loads(capsys.readouterr().out)
    marks = [e["read"] for e in obj["evidence"]]
    assert rc == 0 and set(marks) <= {"whole", "part", "left out"} and "left out" in marks and marks[0] != "left out"
    # read notes come first (rank order), then the left-out ones; the prompt holds as many notes as were read
    got = sum(m != "left out" for m in marks)
    assert marks == sorted(marks, key=lambda m: m == "left out")
    assert obj["reader"]["dropped"] == len(marks) - got and f"[{got}] " in prompt
    assert not re.search(rf"\[{got + 1}\] \w+ \| document:", prompt)
    with OpenAIServer(lambda req: "It is a sample [1].") as srv:
        rc = main(["ask", str(index), "What is the sample about?", "--budget", "6", "--selector", "cosine",
                   "--reader-url", srv.base_url, "--reader-model", "test-model", "--evidence-tokens", "150"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and "read: yes = the reader gets the note" in out and "left out (past the token budget)" in out
    assert re.search(rf"\[{got + 1}\](-\[\d+\])? left out", out)


def test_ctrl_c_closes_the_reader_request(index):
    """Ctrl-C while the answer streams: ask exits 130 at once with one line, and the reader's request is closed
    (the server sees the client hang up, so it stops generating)."""
    import signal

    words = " ".join(f"word{i}" for i in range(200))
    with OpenAIServer(lambda req: words, stream_pause=0.05) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "cdsjax.cli", "ask", str(index), "What is the sample about?",
                                 "--budget", "2", "--selector", "cosine", "--reader-url", srv.base_url,
                                 "--reader-model", "test-model"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        text = b""
        while b"word3" not in text:
            chunk = proc.stdout.read1(4096)
            assert chunk, proc.stderr.read().decode()[-2000:]
            text += chunk
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        elapsed = time.perf_counter() - t0
        err = proc.stderr.read().decode()
        deadline = time.perf_counter() + 5
        while srv.hung_up == 0 and time.perf_counter() < deadline:
            time.sleep(0.05)
        assert srv.hung_up == 1
    assert code == 130 and "interrupted" in err and "Traceback" not in err and elapsed < 5


def test_a_crop_that_does_not_fit_goes_as_text_and_the_next_notes_still_come(tmp_path):
    png = tmp_path / "fig.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    figure = EvidenceItem(note_id="f", doc_id="d.pdf", page=0, kind="figure", caption="Figure 2: screenshot keys.",
                          image_path=str(png), rank=1)
    bare = EvidenceItem(note_id="b", doc_id="d.pdf", page=1, kind="figure", image_path=str(png), rank=2)
    text = note(2, "Press the power and volume down keys together to take a screenshot.")
    out = fit_items("How do I take a screenshot?", [figure, bare, text], 200, max_text_chars=1500)
    assert [i.note_id for i in out.items] == ["f", "n2"] and out.items[0].image_path is None
    assert out.trimmed == 0 and out.left_out == 1 and out.tokens < 200  # the crop-only note cannot go as text
    with_room = fit_items("q", [figure, text], 5000, max_text_chars=1500)
    assert with_room.items[0].image_path == str(png)  # with room for it, the crop goes


def test_ask_does_not_show_a_cut_stream_as_an_answer(index, capsys):
    with OpenAIServer(lambda req: "The sample shows a multi column", cut_stream=True) as srv:
        rc = main(["ask", str(index), "What is the sample about?", "--json", "--budget", "2", "--reader-url",
                   srv.base_url, "--reader-model", "test-model"])
    captured = capsys.readouterr()
    obj = json.loads(captured.out)
    assert rc != 0 and obj["answer"] is None and obj["evidence"], captured.err[-2000:]
    assert obj["error"]["kind"] == "bad_response" and "end marker" in obj["error"]["message"]
