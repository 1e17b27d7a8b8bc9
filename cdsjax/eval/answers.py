r"""A reader-free answer metric: does the selected evidence contain the gold answer?

``has_answer@B`` is the retrieval accuracy of open-domain QA: 1 when the text of the selected notes contains a
normalised gold answer, 0 when it does not. It judges evidence by the answer rather than by page-level gold, so
a selector cannot win it by spreading over pages alone. Pure Python (no model, no JAX).

Which questions it covers (:func:`answer_targets`; ``None`` = not covered, the record holds no value):

* **MMLongBench-Doc**: answers whose format is a string, an integer, a float or a list of at most
  :data:`MAX_LIST_ITEMS` items. Unanswerable questions (format ``None``) and yes/no answers are left out, and so
  are single-digit integers ("3", "0.0"): a count of things on a page is in almost any ten notes' text, so it
  says nothing about the evidence (list items of that kind are dropped from the list, the rest kept).
* **QASPER**: the extractive answers, one alternative per annotator who gave extractive spans (all of that
  annotator's spans, at most :data:`MAX_LIST_ITEMS`); free-form, yes/no and unanswerable answers are left out.
* **HotpotQA** (and any benchmark with an answer string): that string, yes/no left out.

A question is then covered only where some note of its own document(s) contains the answer
(:func:`answer_coverage`): an answer that is in no note's text (read off a chart, or computed) cannot be hit by
any selector, and would only dilute the means.

Matching (:func:`contains`): text and answer are normalised alike (:func:`normalize_text`: Unicode NFKC, lower
case, thousands separators removed, numbers written canonically — ``73.0`` is ``73``, ``17.50`` is ``17.5`` —
punctuation dropped, the articles *a*, *an*, *the* dropped) and an item matches when its tokens appear
contiguously in one note. A numeric item also matches by value (:func:`parse_number`): a currency sign and a
percentage or currency unit are ignored and a scale word multiplies (``1.5 million`` matches ``1,500,000``), so
``$1,500`` matches ``1500 dollars``; other units must appear as written (``12 km`` matches ``12km``, not
``12 miles``). A list matches when each of its items is in some selected
note; a question matches when one of its alternatives does.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from typing import Iterable, List, Optional, Sequence, Tuple

# A list answer with more items than this is not a "short list" (left out).
MAX_LIST_ITEMS = 5
_ARTICLES = frozenset({"a", "an", "the"})
_YES_NO = frozenset({"yes", "no"})
_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "mn": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9, "b": 1e9,
           "trillion": 1e12, "tn": 1e12}
# a number: sign, digits with optional thousands separators, decimals
_NUM = r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+−]?\.\d+"
_NUMBER_ONLY = re.compile(
    rf"^\s*(?:[$€£¥]|usd|eur|rs\.?|inr)?\s*(?P<num>{_NUM})\s*(?P<scale>thousand|million|billion|trillion|mn|bn|tn|k|m|b)?"
    r"\b\s*(?P<unit>%|percent|per cent|[a-z°/²³.]{0,12}(?:\s[a-z]{1,12})?)?\s*$", re.IGNORECASE)
_NUMBER_IN_TEXT = re.compile(
    rf"(?<![\w.])(?P<num>{_NUM})(?:\s*(?P<scale>thousand|million|billion|trillion|mn|bn|tn|k|m|b)\b)?",
    re.IGNORECASE)
# units a numeric answer may carry and still be matched by value: percentages and currencies
_VALUE_UNITS = frozenset({"", "%", "percent", "per cent", "dollars", "dollar", "usd", "euros", "euro", "eur",
                          "pounds", "gbp", "yuan", "rmb", "yen", "rupees", "inr"})
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W_]+")
_QUOTES = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "−": "-"})

Item = str
Alternative = Tuple[Item, ...]


def _canonical_number(token: str) -> str:
    """``"73.0"`` -> ``"73"``, ``"17.50"`` -> ``"17.5"``, ``"007"`` -> ``"007"`` (leading zeros kept: codes)."""
    if "." in token:
        token = token.rstrip("0").rstrip(".")
    return token


def normalize_text(text: str) -> str:
    """Lower-case tokens joined by single spaces (module docstring): the form both sides are compared in."""
    s = unicodedata.normalize("NFKC", str(text)).translate(_QUOTES).lower()
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)  # 3,044 -> 3044 (repeatedly, by the lookarounds)
    tokens = [_canonical_number(t) if t[0].isdigit() else t for t in _TOKEN.findall(s)]
    return " ".join(t for t in tokens if t not in _ARTICLES)


def _float(num: str) -> float:
    return float(num.replace(",", "").replace("−", "-"))


def parse_number(item: str) -> Optional[Tuple[float, ...]]:
    """The values a numeric answer item may appear as, or None when it is not a number: an optional currency sign,
    the number, an optional scale word and an optional unit that is a percentage or a currency
    (``"$1.5 million"`` -> ``(1.5, 1500000.0)``, ``"18.29%"`` -> ``(18.29,)``, ``"1,500 dollars"`` -> ``(1500.0,)``).
    Other units (``"12 km"``, ``"4G"``) are not read as numbers: they match as written (:func:`contains`)."""
    m = _NUMBER_ONLY.match(unicodedata.normalize("NFKC", str(item)).translate(_QUOTES))
    if m is None:
        return None
    unit = (m.group("unit") or "").strip().lower().rstrip(".")
    if unit not in _VALUE_UNITS:
        return None
    value = _float(m.group("num"))
    scale = m.group("scale")
    values = {value}
    if scale:
        values.add(value * _SCALES[scale.lower()])
    return tuple(sorted(values))


def numbers_in(text: str) -> List[float]:
    """Every number in ``text`` with its scaled value when a scale word follows (``"2.1 billion"`` gives 2.1 and
    2.1e9); thousands separators are read (``"1,500"`` is 1500)."""
    s = unicodedata.normalize("NFKC", str(text)).translate(_QUOTES)
    out = []
    for m in _NUMBER_IN_TEXT.finditer(s):
        try:
            value = _float(m.group("num"))
        except ValueError:
            continue
        out.append(value)
        if m.group("scale"):
            out.append(value * _SCALES[m.group("scale").lower()])
    return out


def _same_number(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def contains(text: str, item: str, *, normalized: Optional[str] = None, numbers: Optional[Sequence[float]] = None
             ) -> bool:
    """Whether one note's ``text`` contains the answer ``item`` (module docstring). ``normalized`` and ``numbers``
    may pass the text's :func:`normalize_text` and :func:`numbers_in` when several items are tested."""
    want = normalize_text(item)
    if not want:
        return False
    norm = normalize_text(text) if normalized is None else normalized
    if f" {want} " in f" {norm} ":
        return True
    values = parse_number(item)
    if values is None:
        return False
    found = numbers_in(text) if numbers is None else numbers
    return any(_same_number(v, f) for v in values for f in found)


def _trivial(item: str) -> bool:
    """A single-digit whole number without a unit (``"3"``, ``"0.0"``; not ``"3%"`` or ``"4G"``): a count like that
    is in almost any ten notes' text, so finding it says nothing about the evidence."""
    return "%" not in item and re.fullmatch(r"\d", normalize_text(item)) is not None


def _items(raw: str) -> Optional[List[str]]:
    """The items of a list answer written as a Python/JSON list literal, or None when ``raw`` is not one."""
    text = str(raw).strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(value, (list, tuple)):
        return None
    return [str(v).strip() for v in value if str(v).strip()]


def _alternative(items: Iterable[str]) -> Optional[Alternative]:
    """The required items of one answer, or None when it is not covered (too long a list, yes/no, only trivial
    items)."""
    items = [i.strip() for i in items if i and i.strip()]
    if not items or len(items) > MAX_LIST_ITEMS:
        return None
    if len(items) == 1 and normalize_text(items[0]) in _YES_NO:
        return None
    kept = tuple(dict.fromkeys(i for i in items if not _trivial(i) and normalize_text(i)))
    return kept or None


def answer_targets(query) -> Optional[Tuple[Alternative, ...]]:
    """The gold answers of ``query`` that has-answer checks, as alternatives (one must match, every item of it), or
    None when the question is not covered (module docstring).

    The rule follows what the loader recorded: QASPER's ``meta["extractive_spans"]``, MMLongBench-Doc's
    ``meta["answer_format"]``; any other benchmark with an answer string (HotpotQA) uses that string.

    Args:
      query: a :class:`~cdsjax.io.datasets.Query` (``answer`` and ``meta``).
    """
    meta = getattr(query, "meta", {}) or {}
    if "extractive_spans" in meta:  # QASPER: one alternative per annotator with extractive spans
        alts = [_alternative(s) for s in meta["extractive_spans"] if s]
        alts = [a for a in alts if a is not None]
        return tuple(dict.fromkeys(alts)) or None
    answer = getattr(query, "answer", None)
    if answer is None:
        return None
    if "answer_format" in meta:  # MMLongBench-Doc
        fmt = str(meta.get("answer_format") or "")
        if fmt not in ("Str", "Int", "Float", "List") or not meta.get("answerable", True):
            return None
        items = _items(answer) if fmt in ("List", "Str") else None
        alt = _alternative(items if items is not None else [answer])
        return None if alt is None else (alt,)
    alt = _alternative([answer])
    return None if alt is None else (alt,)


def has_answer(texts: Sequence[str], targets: Optional[Sequence[Alternative]]) -> float:
    """1.0 when some alternative of ``targets`` has each of its items in one of ``texts`` (the selected notes),
    else 0.0; NaN when ``targets`` is None (not covered)."""
    if not targets:
        return float("nan")
    prepared = [(t, normalize_text(t), None) for t in texts]
    cache = {}

    def found(item):
        if item not in cache:
            cache[item] = any(contains(t, item, normalized=n, numbers=nums) for t, n, nums in prepared)
        return cache[item]

    return float(any(all(found(i) for i in alt) for alt in targets))


def answer_coverage(texts: Sequence[str], targets: Optional[Sequence[Alternative]]) -> Optional[Tuple[Alternative, ...]]:
    """The alternatives of ``targets`` that the notes ``texts`` (a question's own documents) can match at all, or
    None when none can: the question is then not covered."""
    if not targets:
        return None
    prepared = [(t, normalize_text(t)) for t in texts]
    keep = tuple(alt for alt in targets
                 if all(any(contains(t, i, normalized=n) for t, n in prepared) for i in alt))
    return keep or None
