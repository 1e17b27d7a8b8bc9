"""One evidence order (issue 69): whatever order a selector ranks its notes in, the same notes make the same
request, listed by document, page and reading order; the answer's citations come back numbered as the caller's
evidence (its rank), also while streaming; and MMLongBench-Doc's short answers are read by rule where they can be."""

import json

import pytest

from cdsjax.eval.answer_scoring import extract_by_rule
from cdsjax.io.reading.reader import Reader
from cdsjax.io.reading.prompt import EvidenceItem, reading_order
from cdsjax.io.reading.replies import CitationStream, renumber_citations
from tests.scripted_server import OpenAIServer, message_text

FAST = dict(model="test-model", max_retries=0, backoff=0.01, max_backoff=0.02, timeout=10.0)


def note(nid, doc="a.pdf", page=0, text=None):
    return EvidenceItem(note_id=f"{doc}#{nid}", doc_id=doc, page=page, text=text or f"Note {nid} of {doc}.")


def test_reading_order_is_document_then_page_then_the_notes_place():
    items = [note(10, page=2), note(9, page=2), note(3, doc="b.pdf"), note(1, page=0), note(2, page=1)]
    assert [i.note_id for i in reading_order(items)] == ["a.pdf#1", "a.pdf#2", "a.pdf#9", "a.pdf#10", "b.pdf#3"]
    paragraphs = [EvidenceItem(note_id=f"1911.1/p{k}", doc_id="1911.1", page=0) for k in (53, 3, 7)]
    assert [i.note_id for i in reading_order(paragraphs)] == ["1911.1/p3", "1911.1/p7", "1911.1/p53"]


def test_two_selectors_that_pick_the_same_notes_send_byte_identical_requests():
    notes = [note(4, page=1), note(1), note(7, doc="b.pdf"), note(2)]
    by_one, by_other = [notes[2], notes[0], notes[3], notes[1]], [notes[1], notes[3], notes[0], notes[2]]
    with OpenAIServer(lambda req: "Four [1].") as srv:
        reader = Reader(base_url=srv.base_url, **FAST)
        first = reader.answer("What is there?", by_one)
        second = reader.answer("What is there?", by_other)
        a, b = (json.dumps(r, sort_keys=True).encode() for r in srv.requests)
        prompt = message_text(srv.requests[0])
    assert a == b
    assert prompt.index("[1] text | document: a.pdf | page 1") < prompt.index("[3] text | document: a.pdf | page 2")
    assert prompt.index("Note 4 of a.pdf") < prompt.index("[4] text | document: b.pdf")
    # the prompt's [1] is a.pdf#1: 4th in the first ranking, 1st in the second
    assert (first.text, first.cited) == ("Four [4].", (4,)) and (second.text, second.cited) == ("Four [1].", (1,))
    assert first.raw == second.raw == "Four [1]."
    assert [e.note_id for e in first.evidence] == [e.note_id for e in second.evidence]


def test_streamed_citations_are_renumbered_as_they_are_written():
    notes = [note(3), note(1), note(2)]  # reading order 1, 2, 3: prompt [1] is rank 2, [3] is rank 1
    with OpenAIServer(lambda req: "Apples [1] and pears [3], grown in rows [1-3] since [2019].", stream_pause=0.01) as srv:
        shown = []
        out = Reader(base_url=srv.base_url, **FAST).answer("Which?", notes, on_token=shown.append)
    assert len(shown) > 1 and "".join(shown) == out.text == "Apples [2] and pears [1], grown in rows [2, 3, 1] since [2019]."
    assert out.cited == (2, 1, 3)


@pytest.mark.parametrize("pieces", [["Yes [", "1", "] and [1", "2]."], ["Yes [1] and [12]."], ["Y", "es [1]", " and [12]."]])
def test_citation_stream_holds_a_mark_until_it_closes(pieces):
    shown = []
    stream = CitationStream(shown.append, {1: 5, 12: 2})
    for piece in pieces:
        stream(piece)
    stream.flush()
    assert "".join(shown) == "Yes [5] and [2]."
    assert renumber_citations("see [3] and [1, 12]", {1: 5, 12: 2}) == "see [3] and [5, 2]"  # [3]: not a prompt number
    unfinished = []
    tail = CitationStream(unfinished.append, {1: 2})
    tail("a bracket at the end [1")
    tail.flush()
    assert "".join(unfinished) == "a bracket at the end [1"


@pytest.mark.parametrize("reply, expected", [
    ("Not answerable", ("Not answerable", "decline")),
    ("", ("Not answerable", "decline")),
    ("Yes, the model does [2].", ("Yes", "yes_no")),
    ("no.", ("No", "yes_no")),
    ("1,500 [2]", ("1500", "number")),
    ("$12.5", ("12.5", "number")),
    ("45 percent [1]", ("45%", "number")),
    ("**Figure 3** [1].", ("Figure 3", "short")),
    ("The revenue grew by 12% in 2020, as Table 2 shows [1].", None),
    ("Nothing in 2019 [1].", ("Nothing in 2019", "short")),
    ("12 people\nand two dogs", None),
    # a reply that ends on its answer is read there; "answer" without "is" or ":" is not such an ending
    ("Step-back prompting first asks a broader question.\nTherefore, the answer is: 7%.", ("7%", "final")),
    ("It grew over the years.\n**Final answer:** 1,234", ("1234", "final")),
    ("The pilot was extended to two more islands.\nSo the answer is: Pelican Rock [2]", ("Pelican Rock", "final")),
    ("A long reply comes first here.\nThis would answer 5 questions", None),
    ("A long reply comes first here.\nThe answer is that the evidence never names the supplier.", None),
])
def test_short_answers_are_read_by_rule_where_the_reply_is_one(reply, expected):
    assert extract_by_rule(reply) == expected
