"""Relevance: the query--note scores every selector ranks by, dense alone or fused with a lexical match.

``dense`` is the cosine of the question's and the note's embeddings (what the core computes from the vectors
when it is given nothing else). ``hybrid`` adds a BM25 match of the question's words in the note's text (the
numbers, names and acronyms an embedding of a small model blurs): a :class:`LexicalIndex` (``bm25s``: English
stop words removed, Snowball stems, numbers such as ``83.2`` kept whole) scores the notes, and :func:`fuse`
mixes the two on the cosine's scale,

    s_i = (1 - w) * cos_i + w * top_cos * bm25_i / max_j bm25_j,

so the best lexical match counts as much as the best dense one and the scores stay where the games' thresholds
(tau) and the read-outs expect a cosine. A question with no word in any note (all stop words, or words the notes
lack) is dense alone. The fused rows reach the core as :attr:`cdsjax.core.CDSProblem.query_scores`: CDS's query
edges, cosine's and the page rule's ranking, MMR's and k-DPP's relevance, PPR's teleport all read them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, List, Optional, Sequence

if TYPE_CHECKING:
    import numpy as np

from cdsjax.defaults import DEFAULT_LEXICAL_WEIGHT, DEFAULT_NOTE_CONTEXT, DEFAULT_RELEVANCE

RELEVANCE_MODES = ("dense", "hybrid")
# Words: runs of letters and digits, with inner dots and commas kept (83.2, 1,024, v1.5); single characters too.
TOKEN_PATTERN = r"(?u)\b\w+(?:[.,]\w+)*\b"
# A note's text is cut to this many characters before tokenising (a 100,000-character note costs no more).
MAX_NOTE_CHARS = 20_000


def check_relevance(mode: str) -> str:
    """``mode`` if it names a relevance (``dense`` or ``hybrid``), else ``ValueError`` in one line."""
    if mode not in RELEVANCE_MODES:
        raise ValueError(f"relevance must be one of {', '.join(RELEVANCE_MODES)}, got {mode!r}")
    return mode


def check_weight(weight) -> float:
    """The lexical weight as a float in [0, 1], else ``ValueError`` in one line."""
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"lexical weight must be a number in [0, 1], got {weight!r}") from None
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"lexical weight must be in [0, 1], got {weight!r}")
    return w


def _bm25s():
    """The ``bm25s`` module, its logger kept at WARNING: it sets its own to DEBUG, and any handler on the root logger
    would print "Building index from tokens" under every question's evidence."""
    import logging

    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _stemmer():
    try:
        import Stemmer  # PyStemmer

        return Stemmer.Stemmer("english").stemWords
    except ImportError:  # stems are a refinement: plain words still match
        return None


def tokenize(texts: Sequence[str]) -> List[List[str]]:
    """Each text's words as BM25 reads them: lower case, English stop words out, stemmed."""
    bm25s = _bm25s()

    texts = [str(t or "")[:MAX_NOTE_CHARS] for t in texts]
    return bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(), token_pattern=TOKEN_PATTERN,
                          return_ids=False, show_progress=False)


@dataclasses.dataclass
class LexicalIndex:
    """BM25 over a list of note texts (``bm25s``), built once per corpus and asked once per question."""

    retriever: object
    size: int
    vocabulary: frozenset

    @classmethod
    def build(cls, texts: Sequence[str]) -> "LexicalIndex":
        """The index of ``texts`` (one per note; empty ones score 0)."""
        bm25s = _bm25s()

        tokens = tokenize(texts)
        retriever = bm25s.BM25()
        vocabulary = frozenset(t for row in tokens for t in row)
        if vocabulary:
            retriever.index(tokens, show_progress=False)
        return cls(retriever=retriever, size=len(tokens), vocabulary=vocabulary)

    def scores(self, question: str) -> "np.ndarray":
        """``[n]`` float32 BM25 score of each note for ``question`` (all 0 when none of its words is in a note)."""
        import numpy as np

        words = [w for w in tokenize([question])[0] if w in self.vocabulary]
        if not words:
            return np.zeros(self.size, np.float32)
        return np.asarray(self.retriever.get_scores(words), np.float32).reshape(self.size)


def fuse(dense: "np.ndarray", lexical: "np.ndarray", weight: float = DEFAULT_LEXICAL_WEIGHT,
         valid: Optional["np.ndarray"] = None) -> "np.ndarray":
    """``[n]`` the hybrid relevance of one question (module docstring): ``dense`` cosines mixed with ``lexical``
    BM25 scores rescaled to the best cosine; dense alone where no note matches a word. ``valid`` (``[n]`` bool)
    leaves padding out of the maxima. The result has ``dense``'s precision (float32 at least)."""
    import numpy as np

    dense = np.asarray(dense)
    dense = dense.astype(np.result_type(dense.dtype, np.float32))
    lexical = np.asarray(lexical, dense.dtype)
    valid = np.ones(dense.shape, bool) if valid is None else np.asarray(valid, bool)
    w = check_weight(weight)
    top_lex = float(np.max(np.where(valid, lexical, 0.0), initial=0.0))
    if w == 0.0 or top_lex <= 0.0:
        return dense
    top_cos = max(float(np.max(np.where(valid, dense, -np.inf), initial=0.0)), 0.0)
    mixed = (1.0 - w) * dense + w * top_cos * (lexical / top_lex)
    return np.where(valid, mixed, dense).astype(dense.dtype)


def settings_of(config) -> dict:
    """``config.relevance`` (``mode``, ``lexical_weight``, ``context``) checked, one line on a bad value; a config
    without it (or None) gives the defaults; ``mode`` may be given alone as a string (``config.relevance =
    "dense"``)."""
    given = None if config is None else (config.get("relevance", None) if hasattr(config, "get") else None)
    if isinstance(given, str):
        given = {"mode": given}
    given = given.to_dict() if hasattr(given, "to_dict") else dict(given or {})
    unknown = sorted(set(given) - {"mode", "lexical_weight", "context"})
    if unknown:
        raise ValueError(f"relevance has no field {unknown[0]!r} (mode, lexical_weight, context)")
    return {"mode": check_relevance(str(given.get("mode", DEFAULT_RELEVANCE))),
            "lexical_weight": check_weight(given.get("lexical_weight", DEFAULT_LEXICAL_WEIGHT)),
            "context": bool(given.get("context", DEFAULT_NOTE_CONTEXT))}


def lexical_text(note, context: bool = DEFAULT_NOTE_CONTEXT) -> str:
    """The words BM25 matches in an index note: its text, caption, summary, OCR text and keywords (each once),
    and with ``context`` the section heading above it (:mod:`cdsjax.io.placement`)."""
    get = note.get if isinstance(note, dict) else lambda k, d=None: getattr(note, k, d)
    fields = ("section",) * bool(context) + ("text", "caption", "summary", "ocr_text")
    parts = [str(get(k) or "").strip() for k in fields]
    keywords = get("keywords") or []
    parts.append(", ".join(str(k) for k in keywords))
    return "\n".join(dict.fromkeys(p for p in parts if p))


class Relevance:
    """The relevance of one corpus: ``mode`` (``dense`` / ``hybrid``) with its lexical ``weight``, the BM25 index
    of the notes' ``texts`` built on the first question. :meth:`scores` gives the ``[n]`` row a question's problem
    carries (None for ``dense``: the core computes the cosine itself)."""

    def __init__(self, texts: Sequence[str], mode: str = DEFAULT_RELEVANCE, weight: float = DEFAULT_LEXICAL_WEIGHT):
        self.mode = check_relevance(mode)
        self.weight = check_weight(weight)
        self._texts = list(texts)
        self._index: Optional[LexicalIndex] = None

    @property
    def index(self) -> LexicalIndex:
        if self._index is None:
            self._index = LexicalIndex.build(self._texts)
        return self._index

    def describe(self) -> dict:
        """What ranked the notes, for ``--json`` and the evaluation's records."""
        return {"mode": self.mode, **({"lexical_weight": self.weight} if self.mode == "hybrid" else {})}

    def scores(self, question: str, dense: "np.ndarray") -> Optional["np.ndarray"]:
        """``[n]`` float32 fused scores of ``question`` given its ``dense`` cosines ``[n]``; None for ``dense``."""
        if self.mode == "dense":
            return None
        return fuse(dense, self.index.scores(question), self.weight)
