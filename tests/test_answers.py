"""has-answer: normalisation of numbers, units and lists, which questions are covered, and the metric in records."""

import math
import types

import numpy as np
import pytest

from cdsjax.eval import answers as A


@pytest.mark.parametrize("text, item, expected", [
    # number formats: thousands separators, trailing zeros, decimals
    ("a corpus of 3,044 sentences in 100 dialogs", "3044 sentences", True),
    ("the score was 73 points", "73.0", True),
    ("total 30,216,492 shares", "30216492.00", True),
    ("ratio 0.450", "0.45", True),
    ("grew 18.29 % last year", "18.29%", True),
    ("grew 18.3% last year", "18.29%", False),
    ("about 15.5 million", "15", False),
    ("item 1510 of the list", "15", False),
    ("1510", "151", False),
    # percentages and currencies are read by value, scale words multiply
    ("the share was 51 percent", "51%", True),
    ("revenue of $1,500,000 in 2019", "1.5 million", True),
    ("1.5 million users", "1500000", True),
    ("cost 1500 dollars", "$1,500", True),
    ("reached 2.1 billion", "2100000000", True),
    ("reached 2.1 billion", "2.1", True),
    ("a −3.5 change", "-3.5", True),
    # other units must appear as written
    ("the site is 12km away", "12 km", True),
    ("the site is 12 km away", "12km", True),
    ("the site is 12 miles away", "12 km", False),
    ("we use 4G networks", "4G", True),
    ("4 items", "4G", False),
    # text: case, punctuation, articles, quotes, dashes
    ("Visit THE Eiffel Tower, Paris.", "Eiffel Tower", True),
    ("the 2015–2016 season", "2015-2016", True),
    ("from 2015 to 2016", "2015-2016", False),
    ("highest paid person’s opinion (HiPPO)", "highest paid person's opinion", True),
    ("a whole-word match only", "word match", True),
    ("a whole-word match only", "hole", False),
    ("", "anything", False),
])
def test_contains(text, item, expected):
    assert A.contains(text, item) is expected


def test_normalize_text_and_numbers():
    assert A.normalize_text("The 3,044 Sentences, 73.0% and 17.50!") == "3044 sentences 73 and 17.5"
    assert A.parse_number("$1.5 million") == (1.5, 1500000.0)
    assert A.parse_number("18.29%") == (18.29,)
    assert A.parse_number("12 km") is None and A.parse_number("2015-2016") is None and A.parse_number("4G") is None
    assert sorted(A.numbers_in("1,500 and 2.5 million")) == [2.5, 1500.0, 2500000.0]


def _mmlb(answer, fmt, answerable=True):
    return types.SimpleNamespace(answer=answer, meta={"answer_format": fmt, "answerable": answerable})


def test_mmlongbench_targets_cover_strings_numbers_and_short_lists():
    assert A.answer_targets(_mmlb("Eiffel Tower", "Str")) == (("Eiffel Tower",),)
    assert A.answer_targets(_mmlb("18.29%", "Float")) == (("18.29%",),)
    assert A.answer_targets(_mmlb("538", "Int")) == (("538",),)
    assert A.answer_targets(_mmlb("['White', '10%']", "List")) == (("White", "10%"),)
    assert A.answer_targets(_mmlb("[1500, 8000]", "List")) == (("1500", "8000"),)
    # a string that holds a list literal is a list
    assert A.answer_targets(_mmlb("['combshj@unk.edu']", "Str")) == (("combshj@unk.edu",),)


@pytest.mark.parametrize("answer, fmt", [
    ("Not answerable", "None"),  # unanswerable
    ("Yes", "Str"), ("no", "Str"),  # yes/no
    ("3", "Int"), ("0.0", "Float"),  # single-digit counts: in almost any text
    ("['3', '4']", "List"),  # only single-digit items
    ("['a', 'b', 'c', 'd', 'e', 'f']", "List"),  # not a short list
])
def test_mmlongbench_targets_leave_out(answer, fmt):
    assert A.answer_targets(_mmlb(answer, fmt)) is None


def test_trivial_items_are_dropped_from_lists_but_not_percentages():
    assert A.answer_targets(_mmlb("['3', 'Fortune']", "List")) == (("Fortune",),)
    assert A.answer_targets(_mmlb("4%", "Float")) == (("4%",),)
    assert A.answer_targets(_mmlb("10", "Int")) == (("10",),)


def test_qasper_targets_are_extractive_alternatives():
    q = types.SimpleNamespace(answer="x", meta={"extractive_spans": [["TransferTransfo", " Hybrid"], [], ["MISSA"]]})
    assert A.answer_targets(q) == (("TransferTransfo", "Hybrid"), ("MISSA",))
    # free-form / yes-no / unanswerable annotators have no spans: not covered
    assert A.answer_targets(types.SimpleNamespace(answer="Yes", meta={"extractive_spans": [[], []]})) is None
    texts = ["we compare TransferTransfo", "and a hybrid model"]
    assert A.has_answer(texts, A.answer_targets(q)) == 1.0  # both spans of the first annotator, in two notes
    assert A.has_answer(texts[:1], A.answer_targets(q)) == 0.0
    assert A.has_answer(["MISSA wins"], A.answer_targets(q)) == 1.0  # the second annotator's answer


def test_other_benchmarks_use_the_answer_string():
    assert A.answer_targets(types.SimpleNamespace(answer="Arthur's Magazine", meta={})) == (("Arthur's Magazine",),)
    assert A.answer_targets(types.SimpleNamespace(answer="yes", meta={})) is None
    assert A.answer_targets(types.SimpleNamespace(answer=None, meta={})) is None


def test_has_answer_lists_need_every_item_and_coverage_drops_unfindable():
    targets = (("White", "10%"),)
    assert A.has_answer(["White voters", "rose to 10 %"], targets) == 1.0
    assert A.has_answer(["White voters", "rose to 11 %"], targets) == 0.0
    assert math.isnan(A.has_answer(["anything"], None))
    assert A.answer_coverage(["White voters", "10% of"], targets) == targets
    assert A.answer_coverage(["White voters only"], targets) is None


def test_scored_in_records_with_its_coverage():
    """score_problem gives has_answer where the problem has texts and a covered answer, None elsewhere."""
    from cdsjax.core import Selection
    from cdsjax.eval.problems import Problem
    from cdsjax.eval.scoring import score_problem

    def problem(answer, texts):
        q = types.SimpleNamespace(qid="q", answer=answer, doc_ids=("d",), gold_pages={"d": frozenset({1})},
                                  gold_boxes=(), meta={"answer_format": "Str", "answerable": True})
        n = len(texts)
        rng = np.random.default_rng(0)
        z = rng.normal(size=(n, 4)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        return Problem(q, z, z[0], np.zeros((n, n), bool), [f"d#{i}" for i in range(n)], ["d"] * n,
                       pages=list(range(n)), boxes=[(0, 0, 1, 1)] * n, texts=texts)

    def pick(*idx):
        return Selection(indices=np.asarray(idx, np.int32), selected_valid=np.ones(len(idx), bool),
                         scores=np.zeros(len(idx), np.float32))

    p = problem("Pier 45", ["Fisherman's Wharf", "Pier 45 at the end", "menu"])
    assert score_problem(p, pick(1), kind="pdf")["has_answer"] == 1.0
    assert score_problem(p, pick(0, 2), kind="pdf")["has_answer"] == 0.0
    assert score_problem(problem("Pier 99", ["Pier 45"]), pick(0), kind="pdf")["has_answer"] is None
    assert score_problem(problem("Yes", ["yes"]), pick(0), kind="pdf")["has_answer"] is None
