"""Scoring a reader's answer against a benchmark's gold answer (pure Python: no model, no JAX).

* **MMLongBench-Doc** (:func:`score_mmlongbench`): the reader's free-text reply is first reduced to a short
  answer by a second model call (:data:`EXTRACT_PROMPT`, read back by :func:`parse_extracted`), which is then
  scored by the gold answer's format with the rules of the benchmark's published evaluation
  (``eval/eval_score.py`` of its repository), so that accuracies compare with the figures reported on it:

  - both sides are cleaned first (:func:`clean_answer`: lower case, a parenthesised part, surrounding quotes,
    a leading ``$`` and a trailing ``%`` removed);
  - ``Int``: the gold integer equals the prediction read as a number and truncated (``"12.5"`` is 12); a
    prediction that is not a plain number (``"1,500"``, ``"12 people"``) scores 0;
  - ``Float``: the cleaned prediction read as a number is within 1% (relative) of the gold value, of a
    hundredth of it or of a hundred times it (a percentage against its fraction), or equal to one of them
    after rounding to the shorter of the two precisions (at least 2 decimals); a prediction that is not a plain
    number scores 0;
  - ``Str`` and ``None`` (unanswerable; gold ``Not answerable``): exact equality where the gold answer is of a
    kind that must match exactly (:func:`exact_kind`: a URL, a file name, a page, a phone number, a time, a
    date, an e-mail address), else ANLS (:func:`anls`: one minus the normalised edit distance, 0 at or below
    0.5), so a near miss earns partial credit;
  - ``List``: both sides read as lists (a one-item list where they are not); different lengths score 0; the
    cleaned items are sorted, and numeric (or exact-kind) lists must be equal, other lists score the smallest
    ANLS of their item pairs.

  :func:`generalized_f1` is the benchmark's F1 over a set of questions: recall is the summed score of the
  answerable questions over their number, precision the same sum over the number of questions whose
  extracted answer is not ``Not answerable`` (:func:`declines_mmlongbench`); 0 where either is undefined.

* **QASPER** (:func:`token_f1`, :func:`qasper_answer_f1`): SQuAD-style token F1 of the reply against each
  annotator's answer, the best annotator kept; defined where some annotator gave an extractive answer.
* **Yes / no / unanswerable** (:func:`exact_match`, QASPER, VisDoM, HotpotQA): where some gold answer is "Yes",
  "No" or unanswerable, 1 when the reply starts with that word or declines (:func:`reply_class`).
* **VisDoM and QASPER accuracy**: an LLM judge (:mod:`cdsjax.io.reading.judge`), called by :mod:`cdsjax.eval.reading`.

None of these rule-based scores needs the judge: the evaluation computes them whatever the judge does.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from typing import Any, Iterable, List, Optional, Sequence

from cdsjax.eval.answers import normalize_text
from cdsjax.io.reading.replies import strip_citations

DECLINE_PATTERNS = re.compile(
    r"^\s*(not answerable|unanswerable|cannot be answered|can ?not answer|fail(?:ed)? to answer|"
    r"no answer|none of the evidence|the evidence does not)", re.IGNORECASE)

EXTRACT_PROMPT = """\
You turn a long answer into a short one. You get a question and a reply someone wrote to it. Write the \
reply's final answer in its shortest complete form, with no explanation and no citation marks:

- a number as digits only: no thousands separators, no currency sign, no unit or scale word (a percent sign \
may stay);
- a list as a Python list of strings, e.g. ['red', 'blue'];
- a name or a phrase as it is;
- if the reply says the question cannot be answered, write exactly: Not answerable

Reply with one line of the form
Extracted answer: <the short answer>"""
EXTRACT_PROMPT_VERSION = "extract-2"


def declines(text: Optional[str]) -> bool:
    """True when ``text`` says the question cannot be answered (or is empty)."""
    if text is None or not str(text).strip():
        return True
    return DECLINE_PATTERNS.match(str(text).strip().strip("\"'*`")) is not None


def extraction_messages(question: str, reply: str) -> list:
    """The chat messages of the extraction call (system prompt, then question and reply)."""
    return [{"role": "system", "content": EXTRACT_PROMPT},
            {"role": "user", "content": f"Question: {question.strip()}\n\nReply: {reply.strip()}"}]


def parse_extracted(text: str) -> str:
    """The short answer of an extraction reply: what follows ``Extracted answer:`` (the whole reply, stripped,
    when the marker is missing)."""
    m = re.search(r"extracted answer\s*:\s*(.+)", text, re.IGNORECASE | re.DOTALL)
    body = (m.group(1) if m else text).strip()
    return body.splitlines()[0].strip() if body else ""


# What a rule reads as a reply's short answer, without a model: a reply that is the answer alone.
_NUMBER_ANSWER = re.compile(r"^[$€£]?\s*(-?\d{1,3}(?:,\d{3})+|-?\d+)(\.\d+)?\s*(%|percent)?$", re.IGNORECASE)
_YES_NO = re.compile(r"^(yes|no)\b", re.IGNORECASE)
SHORT_ANSWER_WORDS = 4
EXTRACTION_RULES = ("decline", "yes_no", "number", "short", "final")
# a reply that ends on its answer: "..., so the answer is: 38%." / "Final answer: 12"
_FINAL_ANSWER = re.compile(r"(?:^|[\s.,;:*_])(?:so |thus |therefore,? |hence )?(?:the )?(?:final |short )?answer"
                           r"(?:\s+is\s*:?|\s*:)\s*([^\n]+?)\s*$", re.IGNORECASE)


def extract_by_rule(reply: Optional[str]) -> Optional[tuple]:
    """``(short answer, rule)`` where the reply already is its short answer, so that no model need extract it;
    None where no rule applies (the model's extraction is used). The rules, in order, on the reply without its
    citation marks, emphasis and final full stop:

    - ``decline``: it declines or is empty (:func:`declines`) -> ``Not answerable``;
    - ``yes_no``: it starts with the word yes or no -> ``Yes`` / ``No``;
    - ``number``: it is a number alone (an optional currency sign, thousands separators, an optional per cent
      sign) -> the number without sign or separators, ``%`` kept;
    - ``short``: it is one line of at most :data:`SHORT_ANSWER_WORDS` words -> the line;
    - ``final``: its last line ends on "the answer is: X" (or "Final answer: X") where X is a number alone or at
      most :data:`SHORT_ANSWER_WORDS` words -> X, read by the number rule where it is a number.
    """
    if declines(reply):
        return NOT_ANSWERABLE, "decline"
    body = strip_citations(str(reply)).strip()
    for _ in range(2):  # "**Figure 3**." and "**Figure 3.**"
        body = body.strip("*_`\"' ").rstrip(".").strip()
    if not body:
        return NOT_ANSWERABLE, "decline"
    m = _YES_NO.match(body)
    if m:
        return m.group(1).capitalize(), "yes_no"
    m = _NUMBER_ANSWER.match(body)
    if m:
        return m.group(1).replace(",", "") + (m.group(2) or "") + ("%" if m.group(3) else ""), "number"
    if "\n" not in body and len(body.split()) <= SHORT_ANSWER_WORDS:
        return body, "short"
    m = _FINAL_ANSWER.search(body.splitlines()[-1].strip())
    if m:
        final = m.group(1)
        for _ in range(2):
            final = final.strip("*_`\"' ").rstrip(".").strip()
        number = _NUMBER_ANSWER.match(final)
        if number:
            return number.group(1).replace(",", "") + (number.group(2) or "") + ("%" if number.group(3) else ""), "final"
        if final and len(final.split()) <= SHORT_ANSWER_WORDS and not declines(final):
            return final, "final"
    return None


ANLS_THRESHOLD = 0.5
NOT_ANSWERABLE = "Not answerable"


def declines_mmlongbench(extracted: Optional[str]) -> bool:
    """Whether an extracted MMLongBench-Doc answer is the benchmark's decline, ``Not answerable`` (what its F1
    counts as not answered)."""
    return str(extracted or "").strip() == NOT_ANSWERABLE


def clean_answer(text: Any) -> str:
    """An answer as the benchmark compares it: lower case, stripped, without a parenthesised part, without one
    quote at either end, without leading ``$`` and trailing ``%`` signs."""
    s = str(text).lower().strip()
    s = re.sub(r"\s*\([^)]*\)", "", s).strip()
    s = re.sub(r"^['\"]|['\"]$", "", s).strip()
    return s.lstrip("$").strip().rstrip("%").strip()


_EXACT_PATTERNS = (re.compile(r"\b\d+(-\d+|\s\d+)?\b"),  # a phone number (or any plain number)
                   re.compile(r"\b\d{4}[-\s]\d{2}[-\s]\d{2}\b"),  # YYYY-MM-DD
                   re.compile(r"\b\d{4}[-\s]\d{2}\b"),  # YYYY-MM
                   re.compile(r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}"))  # an e-mail address


def exact_kind(cleaned: str) -> bool:
    """Whether a cleaned gold answer is of a kind that only an exact match gets right: a URL, a ``.py`` /
    ``ipynb`` file, a page reference, a phone number, a time (a.m./p.m.), a date (YYYY-MM-DD or YYYY-MM) or an
    e-mail address."""
    s = cleaned
    return ("https://" in s or s.endswith(".py") or s.endswith("ipynb") or s.startswith("page")
            or "a.m." in s or "p.m." in s or any(p.fullmatch(s) for p in _EXACT_PATTERNS))


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions) between two strings."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def anls(gold: str, pred: str, threshold: float = ANLS_THRESHOLD) -> float:
    """One minus the edit distance over the longer length (1.0 for two empty strings), 0.0 at or below
    ``threshold``."""
    length = max(len(gold), len(pred))
    value = 1.0 - (levenshtein(gold, pred) / length if length else 0.0)
    return value if value > threshold else 0.0


def _number(text: Any) -> Optional[float]:
    """``text`` read as a finite number (Python's float syntax), or None."""
    try:
        value = float(str(text).strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _decimals(value: float) -> int:
    text = str(value)
    return len(text.split(".")[-1]) if "." in text else 3


def floats_match(gold: float, pred: float) -> bool:
    """The benchmark's float rule: ``pred`` within 1% (relative) of ``gold``, ``gold / 100`` or ``gold * 100``,
    or equal to one of them rounded to the shorter precision of the two (at least 2 decimals)."""
    for target in (gold / 100, gold, gold * 100):
        if math.isclose(target, pred, rel_tol=0.01):
            return True
        digits = max(min(_decimals(pred), _decimals(target)), 2)
        if round(pred, digits) == round(target, digits):
            return True
    return False


def as_list(value: Any) -> list:
    """A list answer's items: a Python list literal read as a list; anything else a one-item list."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, (list, tuple)):
            return list(parsed)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def score_mmlongbench(extracted: str, gold: str, answer_format: Optional[str]) -> float:
    """The score in [0, 1] of an extracted answer against the gold answer by the rule of its format (module
    docstring); ``answer_format`` ``None``/``"None"`` is the unanswerable case, scored as a string.

    Raises:
      ValueError: an answer format the benchmark does not have.
    """
    fmt = str(answer_format or "None")
    if fmt == "Int":
        g, p = _number(gold), _number(extracted)
        return float(g is not None and p is not None and g == int(g) and int(g) == int(p))
    if fmt == "Float":
        g, p = _number(clean_answer(gold)), _number(clean_answer(extracted))
        return float(g is not None and p is not None and floats_match(g, p))
    if fmt in ("Str", "None"):
        g, p = clean_answer(gold), clean_answer(extracted)
        return float(g == p) if exact_kind(g) else anls(g, p)
    if fmt == "List":
        g, p = as_list(gold), as_list(extracted)
        if len(g) != len(p):
            return 0.0
        g, p = sorted(clean_answer(x) for x in g), sorted(clean_answer(x) for x in p)
        if not g:
            return 1.0
        if _number(g[0]) is not None or exact_kind(g[0]):
            return float("-".join(g) == "-".join(p))
        return min(anls(a, b) for a, b in zip(g, p))
    raise ValueError(f"unknown MMLongBench-Doc answer format {answer_format!r}")


def generalized_f1(scores: Sequence[float], answerable: Sequence[bool], declined: Sequence[bool]) -> float:
    """MMLongBench-Doc's F1 over questions: with ``S`` the summed score of the answerable questions, recall is
    ``S`` over their number and precision ``S`` over the number of questions not declined
    (:func:`declines_mmlongbench`); 0.0 where either is undefined or both are 0, as the benchmark reports it."""
    right = sum(float(s) for s, a in zip(scores, answerable) if a)
    n_answerable = sum(1 for a in answerable if a)
    n_answered = sum(1 for d in declined if not d)
    if not n_answerable or not n_answered:
        return 0.0
    r, p = right / n_answerable, right / n_answered
    return 0.0 if r + p == 0 else 2 * p * r / (p + r)


def _tokens(text: str) -> List[str]:
    return normalize_text(text).split()


def token_f1(pred: str, gold: str) -> float:
    """Token-overlap F1 of two answers after :func:`cdsjax.eval.answers.normalize_text` (1.0 when both are
    empty, 0.0 when one is)."""
    p, g = _tokens(pred), _tokens(gold)
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def qasper_answer_f1(pred: str, spans_per_annotator: Iterable[Sequence[str]]) -> Optional[float]:
    """The best token F1 of ``pred`` over the annotators who gave extractive spans (their spans joined); None
    when no annotator did. A declining prediction scores 0."""
    golds = [" ".join(s) for s in spans_per_annotator if s]
    if not golds:
        return None
    if declines(pred):
        return 0.0
    pred = strip_citations(str(pred))
    return max(token_f1(pred, g) for g in golds)


CLASSES = ("yes", "no", "unanswerable")


def reply_class(text: Optional[str]) -> Optional[str]:
    """``"unanswerable"`` when ``text`` declines (:func:`declines`), ``"yes"`` / ``"no"`` when it starts with
    that word (markup and citation marks aside), else None."""
    if declines(text):
        return "unanswerable"
    words = normalize_text(strip_citations(str(text))).split()
    return words[0] if words and words[0] in ("yes", "no") else None


def exact_match(pred: Optional[str], golds: Iterable[str]) -> Optional[float]:
    """1.0 when the reply's class (:func:`reply_class`) is that of one of the gold answers that are "Yes", "No"
    or unanswerable ("Unanswerable", "Not answerable"), else 0.0; None when no gold answer is one of those (a
    gold "No, they do not" is not: only the word alone is)."""
    wanted = {"unanswerable" if declines(g) else normalize_text(g) for g in golds if g is not None}
    wanted &= set(CLASSES)
    if not wanted:
        return None
    return float(reply_class(pred) in wanted)
