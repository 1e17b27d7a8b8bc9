"""Scoring a reader's answer against a benchmark's gold answer (pure Python: no model, no JAX).

* **MMLongBench-Doc** (:func:`score_mmlongbench`): the reader's free-text reply is first reduced to a short
  answer by a second model call (:data:`EXTRACT_PROMPT`, read back by :func:`parse_extracted`), which is then
  compared by the gold answer's format:

  - ``Int``: the first number of the extracted answer equals the gold integer (thousands separators,
    currency signs, ``%`` and trailing units ignored);
  - ``Float``: the first number is within :data:`FLOAT_REL_TOL` (relative) of the gold value; a gold
    fraction written as a percentage, or the reverse (``0.25`` against ``25%``), also matches;
  - ``Str``: normalised exact match, else the normalised Levenshtein similarity is at least
    :data:`STR_SIMILARITY` (an answer that differs by a typo or a plural still counts);
  - ``List``: both sides read as lists, equal length, and after sorting every item matches its partner by
    the number rule (when both are numbers) or the string rule;
  - ``None`` (unanswerable): correct only when the extracted answer declines (:func:`declines`).

  :func:`generalized_f1` is the benchmark's F1 over a set of questions: recall is the accuracy over the
  answerable questions, precision the accuracy over the questions the reader did not decline.

* **QASPER** (:func:`token_f1`, :func:`qasper_answer_f1`): SQuAD-style token F1 of the reply against each
  annotator's answer, the best annotator kept; defined where some annotator gave an extractive answer.
* **VisDoM and QASPER accuracy**: an LLM judge (:mod:`cdsjax.io.judge`), called by :mod:`cdsjax.eval.reading`.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from typing import Iterable, List, Optional, Sequence, Tuple

from cdsjax.eval.answers import normalize_text

FLOAT_REL_TOL = 0.01
STR_SIMILARITY = 0.8
DECLINE_PATTERNS = re.compile(
    r"^\s*(not answerable|unanswerable|cannot be answered|can ?not answer|fail(?:ed)? to answer|"
    r"no answer|none of the evidence|the evidence does not)", re.IGNORECASE)

EXTRACT_PROMPT = """\
You turn a long answer into a short one. You get a question and a reply someone wrote to it. Write the \
reply's final answer in its shortest complete form, with no explanation and no citation marks:

- a number without thousands separators (keep a percent sign or a unit the question asks for);
- a list as a Python list of strings, e.g. ['red', 'blue'];
- a name or a phrase as it is;
- if the reply says the question cannot be answered, write exactly: Not answerable

Reply with one line of the form
Extracted answer: <the short answer>"""
EXTRACT_PROMPT_VERSION = "extract-1"


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


_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+−]?\.\d+")


def first_number(text: str) -> Optional[Tuple[float, bool]]:
    """``(value, is_percent)`` of the first number in ``text`` (a ``%`` or "percent" right after it sets the
    flag), or None."""
    m = _NUMBER.search(str(text))
    if m is None:
        return None
    value = float(m.group(0).replace(",", "").replace("−", "-"))
    rest = str(text)[m.end():].lstrip().lower()
    return value, rest.startswith("%") or rest.startswith("percent")


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def numbers_match(pred: str, gold: str, *, integer: bool = False, rel: float = FLOAT_REL_TOL) -> bool:
    """Whether the first numbers of ``pred`` and ``gold`` agree: exactly (after rounding the prediction) for
    ``integer``, else within ``rel``, a percentage also matching its fraction."""
    p, g = first_number(pred), first_number(gold)
    if p is None or g is None:
        return False
    if integer:
        return round(p[0]) == round(g[0]) and abs(p[0] - round(p[0])) < 1e-6
    candidates = {p[0]}
    if p[1] != g[1]:
        candidates |= {p[0] / 100.0, p[0] * 100.0}
    return any(_close(c, g[0], rel) for c in candidates)


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


def string_similarity(a: str, b: str) -> float:
    """1 - edit distance / longer length, on the normalised strings (1.0 for two empty strings)."""
    x, y = normalize_text(a), normalize_text(b)
    if not x and not y:
        return 1.0
    return 1.0 - levenshtein(x, y) / max(len(x), len(y))


def strings_match(pred: str, gold: str, *, threshold: float = STR_SIMILARITY) -> bool:
    """Normalised equality, or a similarity of at least ``threshold`` (:func:`string_similarity`)."""
    return string_similarity(pred, gold) >= threshold


def as_list(text: str) -> List[str]:
    """A list answer's items: a Python/JSON list literal, else the text split at commas, semicolons and " and "."""
    s = str(text).strip()
    if s.startswith("[") and s.endswith("]"):
        try:
            value = ast.literal_eval(s)
            if isinstance(value, (list, tuple)):
                return [str(v).strip() for v in value if str(v).strip()]
        except (ValueError, SyntaxError):
            s = s[1:-1]
    parts = re.split(r"\s*(?:;|,(?!\d{3})|\band\b)\s*", s)
    return [p.strip(" '\"") for p in parts if p.strip(" '\"")]


def _item_match(pred: str, gold: str) -> bool:
    if first_number(gold) is not None and re.fullmatch(r"[^a-zA-Z]*", gold.replace("%", "")):
        return numbers_match(pred, gold)
    return strings_match(pred, gold)


def lists_match(pred: str, gold: str) -> bool:
    """Same number of items and, both sorted by their normalised text, each item matches its partner."""
    p = sorted(as_list(pred), key=normalize_text)
    g = sorted(as_list(gold), key=normalize_text)
    return len(p) == len(g) and len(g) > 0 and all(_item_match(a, b) for a, b in zip(p, g))


def score_mmlongbench(extracted: str, gold: str, answer_format: Optional[str]) -> float:
    """1.0 when the extracted answer matches the gold answer by the rule of its format (module docstring), else
    0.0. ``answer_format`` ``None``/``"None"`` (or a gold ``Not answerable``) is the unanswerable case."""
    fmt = str(answer_format or "None")
    if fmt == "None" or declines(gold):
        return float(declines(extracted))
    if declines(extracted):
        return 0.0
    if fmt == "Int":
        return float(numbers_match(extracted, gold, integer=True))
    if fmt == "Float":
        return float(numbers_match(extracted, gold))
    if fmt == "List":
        return float(lists_match(extracted, gold))
    if fmt == "Str":
        return float(strings_match(extracted, gold))
    raise ValueError(f"unknown MMLongBench-Doc answer format {answer_format!r}")


def generalized_f1(scores: Sequence[float], answerable: Sequence[bool], declined: Sequence[bool]) -> float:
    """MMLongBench-Doc's F1 over questions: recall = mean score over answerable questions, precision = mean
    score over questions the reader answered (did not decline); NaN when either set is empty, 0 when both
    are 0."""
    rec = [s for s, a in zip(scores, answerable) if a]
    pre = [s for s, d in zip(scores, declined) if not d]
    if not rec or not pre:
        return float("nan")
    r, p = sum(rec) / len(rec), sum(pre) / len(pre)
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
    pred = strip_citations(pred)
    return max(token_f1(pred, g) for g in golds)


def strip_citations(text: str) -> str:
    """``text`` without evidence citation marks such as ``[2]`` or ``[1][4]``."""
    return re.sub(r"\[\d+(?:\s*,\s*\d+)*\]", " ", str(text))
