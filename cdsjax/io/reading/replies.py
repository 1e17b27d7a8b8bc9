"""Model replies as text, JSON and citations: the one place that reads what a chat model wrote.

The reader, the judge, VLM enrichment and the planning agent all go through these functions, so a reply
is read the same way everywhere:

    strip_thinking("<THINK>plan</think> 42 [2]")      # "42 [2]"
    parse_citations("91.2% [3], see [1-2]", 5)        # (3, 1, 2)
    strip_citations("Heron [1].")                     # "Heron."
    find_json('Sure: ```json\\n{"a": 1,}\\n```')       # {"a": 1}
    read_bool("Yes"), read_bool("correct", yes=("correct",))   # True, True
    find_field("correct: no\\nscore: 0.2", "score")     # "0.2"
    markers_only("The baselines are [2] and [3].")    # True: markers where the content should be

Nothing here talks to a server (:mod:`cdsjax.io.reading.llm` does) or imports more than the standard library.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Optional, Tuple, Union

# A reasoning model's thinking block; tags in any case (some templates write <Think>).
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_END = re.compile(r"</think>", re.IGNORECASE)

# An evidence citation: [2], [1, 3], [1; 4], [2-4], [2–4].
_CITATION = re.compile(r"\[\s*(\d+(?:\s*[,;\-–]\s*\d+)*)\s*\]")
_CITATION_MARK = re.compile(r"\s*" + _CITATION.pattern)

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})

# Words every yes/no field accepts; callers add their own (the judge "correct", the checker "sufficient").
YES_WORDS = ("true", "yes", "y", "1")
NO_WORDS = ("false", "no", "n", "0")
# A "name: value" field of a reply without JSON: one word or number, or (free text) the rest of the line.
_FIELD = r'(?<![A-Za-z])["\']?{name}["\']?\s*[:=]\s*["\']?([A-Za-z]+|[-+]?\d+(?:\.\d+)?)'
_TEXT_FIELD = r'["\']?{name}["\']?\s*[:=]\s*["\']?([^"\'\n]*)'


def strip_thinking(text: str) -> str:
    """The reply without a reasoning model's ``<think>...</think>`` blocks (tags in any case), and without
    everything before a lone closing tag (templates that open the block in the prompt); stripped."""
    text = _THINK.sub("", text)
    return _THINK_END.split(text)[-1].strip()


def parse_citations(text: str, n_evidence: int) -> tuple:
    """Evidence numbers cited as ``[2]``, ``[1, 3]``, ``[1][4]`` or ``[2-4]``, in order of first citation.

    Numbers outside 1..n_evidence (years in brackets, say) are ignored.
    """
    seen: list = []
    for match in _CITATION.finditer(text):
        for k in _mark_numbers(match.group(1), n_evidence):
            if 1 <= k <= n_evidence and k not in seen:
                seen.append(k)
    return tuple(seen)


def _mark_numbers(inner: str, limit: int) -> list:
    """The numbers of one citation mark's inside (``2``, ``1, 3``, ``2-4``), ranges within ``limit`` expanded."""
    out: list = []
    for piece in re.split(r"\s*[,;]\s*", inner):
        bounds = [int(b) for b in re.split(r"\s*[-–]\s*", piece)]
        lo, hi = bounds[0], bounds[-1]
        out.extend(range(lo, hi + 1) if lo <= hi and hi - lo < limit else (lo, hi) if lo != hi else (lo,))
    return out


def renumber_citations(text: str, numbers: Mapping[int, int]) -> str:
    """``text`` with its evidence numbers rewritten by ``numbers`` (the prompt's number -> the caller's), a mark
    with several written as ``[a, b]``; a mark holding a number ``numbers`` lacks (a year in brackets) stays."""

    def one(match) -> str:
        found = _mark_numbers(match.group(1), max(len(numbers), 1))
        if not found or any(k not in numbers for k in found):
            return match.group(0)
        return "[" + ", ".join(str(numbers[k]) for k in dict.fromkeys(found)) + "]"

    return _CITATION.sub(one, text)


class CitationStream:
    """Renumbers the citations of a streamed reply (:func:`renumber_citations`) before ``show`` gets it: a piece
    ending inside a mark (``"... [1"``) is held back until the mark closes; :meth:`flush` at the end."""

    HOLD = 12  # an open bracket further back than this is text, not a mark being written

    def __init__(self, show: Callable[[str], None], numbers: Mapping[int, int]):
        self.show = show
        self.numbers = numbers
        self.pending = ""

    def __call__(self, piece: str) -> None:
        text, self.pending = self.pending + piece, ""
        start = text.rfind("[")
        if start != -1 and "]" not in text[start:] and len(text) - start <= self.HOLD:
            text, self.pending = text[:start], text[start:]
        if text:
            self.show(renumber_citations(text, self.numbers))

    def flush(self) -> None:
        if self.pending:
            text, self.pending = self.pending, ""
            self.show(renumber_citations(text, self.numbers))


def strip_citations(text: str) -> str:
    """``text`` without its citation marks (and the spaces before them); the marks :func:`parse_citations`
    reads, whatever numbers they hold."""
    return _CITATION_MARK.sub("", text)


def find_json(text: Any, *, want: Union[type, Tuple[type, ...]] = dict,
              accept: Optional[Callable[[Any], bool]] = None) -> Any:
    """The first JSON value of type ``want`` (for which ``accept`` holds) in a model reply, or None.

    Thinking blocks are dropped first (:func:`strip_thinking`). Code fences are searched before the rest
    of the reply; prose around the JSON is skipped, and curly quotes and trailing commas are repaired.
    Within a piece of text the value that starts first wins, so a whole object beats one nested in it.

    Args:
      text: the reply; anything but a string gives None.
      want: the type (or types) of value wanted, e.g. ``dict`` or ``(dict, list)``.
      accept: an extra test a candidate value must pass (e.g. "has a 'score' key").
    """
    if not isinstance(text, str):
        return None
    body = strip_thinking(text)
    for chunk in [m.group(1) for m in _FENCE.finditer(body)] + [body]:
        repaired = _TRAILING_COMMA.sub(r"\1", chunk.translate(_QUOTES))
        found = [f for f in (_first_json(v, want, accept) for v in (chunk, repaired)) if f is not None]
        if found:
            return min(found, key=lambda f: f[0])[1]
    return None


def _first_json(text: str, want, accept) -> Optional[Tuple[int, Any]]:
    """(start, value) of the first decodable JSON value in ``text`` of type ``want`` passing ``accept``."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[{\[]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, want) and (accept is None or accept(value)):
            return match.start(), value
    return None


def read_bool(value: Any, *, yes: Tuple[str, ...] = (), no: Tuple[str, ...] = (),
              threshold: Optional[float] = 0.5) -> Optional[bool]:
    """A yes/no a model wrote, or None when it cannot be read.

    Args:
      value: a bool; a number (yes when ``>= threshold``; with ``threshold=None`` only 0 and 1 are read);
        or a word of :data:`YES_WORDS` / :data:`NO_WORDS` or of ``yes`` / ``no`` (any case, outer spaces).
      yes, no: the caller's own words for yes and no (e.g. ``("correct",)`` / ``("incorrect", "wrong")``).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if threshold is not None:
            return value >= threshold
        return bool(value) if value in (0, 1) else None
    word = str(value).strip().lower()
    if word in YES_WORDS + tuple(yes):
        return True
    if word in NO_WORDS + tuple(no):
        return False
    return None


def read_float(value: Any) -> Optional[float]:
    """A number a model wrote (a number or a numeric string), or None (also for a bool or NaN)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out else None


def find_field(text: str, name: str, *, free_text: bool = False) -> Optional[str]:
    """The value of a ``name: value`` (or ``"name" = value``) field in a reply that holds no JSON, or None.

    The value is one word or number; with ``free_text`` it is the rest of the line (quotes dropped).
    """
    pattern = (_TEXT_FIELD if free_text else _FIELD).format(name=re.escape(name))
    match = re.search(pattern, text, re.IGNORECASE)
    return match.group(1) if match else None


def leading_word(text: str, words: Tuple[str, ...]) -> Optional[Tuple[str, str]]:
    """``(word, rest of the reply)`` when the reply starts (after punctuation) with one of ``words``."""
    match = re.match(r"\W*(" + "|".join(map(re.escape, words)) + r")\b", text, re.IGNORECASE)
    return (match.group(1), text[match.end():]) if match else None


def starts_with(text: str, phrase: str) -> bool:
    """True when the reply, read as lowercase letters and spaces only, starts with ``phrase`` (so
    "**Not answerable.**" starts with "not answerable")."""
    return re.sub(r"[^a-z ]", "", text.lower()).strip().startswith(phrase.lower())


# Words that carry no answer: articles, pronouns, auxiliaries, prepositions and the words replies use to point
# at evidence ("the answer is given in ...").
_FILLER = frozenset("""
a an the this that these those it its they them their there here he she his her we our you your i
is are was were be been being am do does did has have had can could may might will would shall should must
and or but so as than then also both either neither
of in on at by for from with to into onto about per via within without between among through over under
which who whom whose what where when why how all any each every some such other another
answer answers answered evidence evidences document documents source sources item items piece pieces note notes
reference references passage passages context information according based shown show shows given listed
mentioned described stated provided found see seen following above below respectively cited
""".split())
# Words after which a citation stands where content should be ("are [2]", "and [3]", "in [1]").
_LINKING = frozenset("""
is are was were be been am and or nor as of in on at by from with to than between include includes
included including namely like e.g. i.e. cf see such
""".split())
_WORD = re.compile(r"[^\W_]+(?:[.'][^\W_]+)*\.?|:")


def _stem(word: str) -> str:
    word = word.lower().rstrip(".")
    for suffix in ("ing", "ed", "es", "s", "d"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def markers_only(text: str, question: str = "") -> bool:
    """True when an answer gives citation markers in place of its content ("The baselines are [2] and [3].").

    The reply (thinking removed) must cite, and no sentence of it may carry content of its own. A sentence
    carries none when (1) nothing substantive remains once its markers, filler words (articles, auxiliaries,
    prepositions, "answer", "evidence", "shown", ...) and the words of ``question`` are removed, or (2) every run
    of markers in it follows a linking word ("are", "is", "and", "in", "by", "include", ":", ...) and nothing
    substantive follows the last run: the markers stand where the content should be. So "The baselines are [2]
    and [3]." is markers only, while "BERT and ELMo. The evidence is [1]." is not. A declining answer ("Not
    answerable") cites nothing and is not markers only.
    """
    body = strip_thinking(text)
    if not re.search(_CITATION.pattern, body):
        return False
    return not has_content(body, question)


def has_content(text: str, question: str = "") -> bool:
    """Whether some sentence of ``text`` carries content of its own (what :func:`markers_only` asks of a
    reply; a reply without any citation may still carry none)."""
    asked = {_stem(w) for w in _WORD.findall(question.lower())}

    def substantive(piece: str) -> list:
        return [w for w in _WORD.findall(piece.lower())
                if w != ":" and w.rstrip(".") not in _FILLER and _stem(w) not in asked]

    def holds_content(sentence: str) -> bool:
        runs = list(re.finditer(r"(?:\s*" + _CITATION.pattern + r")+", sentence))
        if not substantive(strip_citations(sentence)):
            return False
        if not runs:
            return True
        for run in runs:
            before = _WORD.findall(strip_citations(sentence[: run.start()]).lower())
            if not before or before[-1].rstrip(".") not in _LINKING and before[-1] != ":":
                return True
        return bool(substantive(sentence[runs[-1].end():]))

    # sentences end at . ! ? or a line break, a citation run staying with the sentence it closes
    sentences = re.split(r"(?<=[.!?])\s+(?![\[])|\n+", strip_thinking(text))
    return any(holds_content(s) for s in sentences if s.strip())


# ---------------------------------------------------------------------------------------------------------------
# Replies that are no answer

# The evidence headers the reader's prompt writes ("[2] table | document: report.pdf | page 12"), or its opening
# line, found in a reply: the model echoed its evidence instead of answering.
_ECHOED = re.compile(r"\[\s*\d+\s*\]\s*(?:text|figure|table|chart)\s*\|\s*document\s*:|\|\s*document\s*:[^|\n]{0,200}\|\s*page\s+\d+"
                     r"|^\s*Evidence\s*\(\d+\s+items?\)\s*:", re.IGNORECASE | re.MULTILINE)
NO_ANSWER = {
    "markers_only": "it gave citation markers in place of an answer",
    "echoed_evidence": "it copied the evidence headers instead of answering",
    "loop": "it repeated itself",
    "empty": "it wrote nothing",
}


def describe_no_answer(reason: str) -> str:
    """The one line that says a reader gave no answer, asked twice (``reason``: a key of :data:`NO_ANSWER`; any
    other value is said as it is), for warnings, errors and the terminal alike."""
    return f"the reader gave no answer: {NO_ANSWER.get(reason, reason)} (asked twice)"


def echoes_evidence(text: str) -> bool:
    """Whether ``text`` copies the evidence headers of the reader's prompt."""
    return bool(_ECHOED.search(text))


def looping(text: str, *, min_span: int = 60, min_repeats: int = 3, max_period: int = 300) -> bool:
    """Whether ``text`` ends in a loop: one piece of 1 to ``max_period`` characters repeated at least
    ``min_repeats`` times back to back over at least ``min_span`` characters, or a line of 10+ characters that
    occurs ``min_repeats`` times."""
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 10]
    if lines and max(lines.count(line) for line in set(lines)) >= min_repeats:
        return True
    tail = text.rstrip()
    for period in range(1, min(max_period, len(tail) // min_repeats) + 1):
        unit = tail[-period:]
        repeats, end = 1, len(tail) - period
        while end >= period and tail[end - period:end] == unit:
            repeats, end = repeats + 1, end - period
        if repeats >= min_repeats and repeats * period >= min_span:
            return True
    return False


def no_answer(text: str, *, finish_reason: Optional[str] = None) -> Optional[str]:
    """Why a reply is no answer (a key of :data:`NO_ANSWER`), or None for an answer: nothing written, the
    evidence headers echoed, a loop (to the token cap, or cut off while streaming), or citation markers in place
    of the content (:func:`markers_only`). A declining reply ("Not answerable") is an answer."""
    body = strip_thinking(text).strip()
    if not strip_citations(body).strip(" .,;:-*"):
        return "markers_only" if _CITATION.search(body) else "empty"
    if echoes_evidence(body):
        return "echoed_evidence"
    if looping(body) or (finish_reason == "length" and looping(body, min_span=30)):
        return "loop"
    # the question's own words count as content here: "BERT is better than ELMo [1]." answers "Is BERT better
    # than ELMo?" (the metric markers_only(text, question) is stricter)
    if markers_only(body):
        return "markers_only"
    return None


class ReplyGuard:
    """Shows a streamed reply only once it is an answer: the ``on_token`` of :meth:`ChatClient.chat` that holds
    the reply back while it has no content of its own (markers, an evidence header being written), passes it
    to ``show`` from then on, and stops the stream (returns True) as soon as it echoes the evidence or loops.

    Attributes:
      text: the reply so far.
      shown: how many of its characters went to ``show``.
      problem: why the stream was stopped (a key of :data:`NO_ANSWER`), or None.
    """

    CHECK_EVERY = 8  # pieces between loop checks (a check scans the reply's tail)

    def __init__(self, show: Callable[[str], None]):
        self.show = show
        self.text = ""
        self.shown = 0
        self.problem: Optional[str] = None
        self._pieces = 0

    def __call__(self, piece: str) -> bool:
        self.text += piece
        self._pieces += 1
        if echoes_evidence(self.text):
            self.problem = "echoed_evidence"
            return True
        if self._pieces % self.CHECK_EVERY == 0 and looping(self.text):
            self.problem = "loop"
            return True
        if not self.shown:
            whole_words = self.text[: max(self.text.rfind(" "), self.text.rfind("\n"), 0)]
            if not has_content(whole_words):
                return False
        self.show(self.text[self.shown:])
        self.shown = len(self.text)
        return False

    def release(self) -> None:
        """Shows what was held back (the reply turned out to be an answer)."""
        if self.shown < len(self.text):
            self.show(self.text[self.shown:])
            self.shown = len(self.text)
