"""Evidence sized for the reader in tokens: the selected notes fill a token budget in rank order, and the note
that does not fit whole keeps the sentences nearest the question.

A reader pays for every prompt token before it writes a word: on two CPU cores a 1.5B model reads ~50 prompt
tokens a second, so ten whole notes (~5,000 tokens) cost ~100 s. :func:`fit_evidence` takes the notes best
first; each note that fits what is left of ``token_budget`` goes whole (a visual note whose crop does not fit
goes as its text); the first that does not is cut to its sentences nearest the question that fit (kept in
their reading order, joined by " … "), and the notes after it are left out. A note whose best sentence alone
does not fit what is left is left out too (so is what follows).

Tokens are estimated, not counted: :data:`CHARS_PER_TOKEN` characters a token, set from the default local
reader's tokenizer on development text (RESULTS, "Evidence sized for the reader"), and
:data:`TOKENS_PER_IMAGE` for an image part. The estimate never calls the server, so it is the same for every
reader and costs nothing.

"Nearest the question" is ``similarity(question, sentences)`` -> one score per sentence: the pipeline passes
the cosine of the index's embedder; without one, the share of the question's content words a sentence holds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, List, Optional, Sequence

from cdsjax.io.notes import SENTENCE_END

# Characters a token with the default reader's tokenizer (Qwen2.5, llama.cpp's /tokenize): 4.7 on QASPER paragraphs
# (300 sampled, pooled), 3.3 on text extracted from a PDF with formulas; 3.5 errs towards a shorter prompt on
# prose: a note counted long is trimmed a little early, and rarely sent longer than the budget says.
CHARS_PER_TOKEN = 3.5
TOKENS_PER_IMAGE = 1500  # an image part (a crop) as a vision-language reader's processor sizes it, roughly
MIN_PIECE_TOKENS = 24  # less room than this is left empty: a sentence fragment helps no reader

Similarity = Callable[[str, Sequence[str]], Sequence[float]]

_WORD = re.compile(r"[^\W_]{3,}")
_STOP = frozenset("""the and for with from that this what which who whom whose when where why how are was were
does did has have had into onto over under than then there their them they its his her our your you
not but can could would should will shall may might must been being about between each other more most
such only also very much many any all some one two per via""".split())


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text`` for the reader (:data:`CHARS_PER_TOKEN` characters a token, rounded up)."""
    return int(math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0


def split_sentences(text: str) -> List[str]:
    """``text``'s sentences (the split the note builder uses), whitespace collapsed, empty ones dropped."""
    return [s for s in (" ".join(p.split()) for p in SENTENCE_END.split(text)) if s]


def word_overlap(question: str, sentences: Sequence[str]) -> List[float]:
    """For each sentence, the share of the question's content words (3+ letters, not a stop word; lower case,
    a trailing "s" dropped) it holds: the fallback similarity when no embedder is at hand."""
    def words(text: str) -> set:
        return {w.lower().rstrip("s") for w in _WORD.findall(text) if w.lower() not in _STOP}

    wanted = words(question)
    if not wanted:
        return [0.0] * len(sentences)
    return [len(wanted & words(s)) / len(wanted) for s in sentences]


def nearest_sentences(question: str, text: str, max_tokens: int, similarity: Optional[Similarity] = None) -> str:
    """The sentences of ``text`` nearest ``question`` that fit ``max_tokens`` (estimated), best first until
    the next does not fit, then put back in reading order and joined by " … "; "" when even the best one
    does not fit."""
    sentences = split_sentences(text)
    if not sentences:
        return ""
    scores = list((similarity or word_overlap)(question, sentences))
    order = sorted(range(len(sentences)), key=lambda i: (-float(scores[i]), i))
    kept, used = [], 0
    for i in order:
        cost = estimate_tokens(sentences[i]) + 1  # the joint
        if used + cost > max_tokens:
            break
        kept.append(i)
        used += cost
    if not kept:
        return ""
    kept.sort()
    pieces, last = [], None
    for i in kept:
        if last is not None and i != last + 1:
            pieces.append("…")
        pieces.append(sentences[i])
        last = i
    return " ".join(pieces)


@dataclasses.dataclass(frozen=True)
class Fitted:
    """What :func:`fit_evidence` kept.

    Attributes:
      items: the notes to send, best first (a trimmed note carries only its kept sentences).
      tokens: their estimated prompt tokens (text as it will be sent, plus images).
      trimmed: how many notes went as their nearest sentences (0 or 1).
      left_out: how many of the last notes were left out.
    """

    items: list
    tokens: int
    trimmed: int
    left_out: int


def fit_evidence(question: str, items: Sequence, token_budget: Optional[int], *,
                 render: Callable[[object], str], shorten: Callable[[object, int, str], Optional[object]],
                 images: Callable[[object], int] = lambda item: 0,
                 without_image: Optional[Callable[[object], object]] = None) -> Fitted:
    """Fills ``token_budget`` with ``items`` in rank order (module docstring).

    Args:
      items: the notes, best first.
      token_budget: estimated tokens the evidence may take; None keeps every item whole.
      render: ``render(item)`` -> the text the reader will see of the item.
      shorten: ``shorten(item, max_tokens, question)`` -> the item cut to fit ``max_tokens``, or None when
        nothing of it fits.
      images: ``images(item)`` -> image parts the item sends.
      without_image: ``without_image(item)`` -> the item as text alone: a visual note whose crop does not fit
        what is left goes as its text (whole when that fits; an image with no text is left out).

    Raises:
      ValueError: a budget below 1.
    """
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"the evidence token budget must be >= 1, got {token_budget}")
    kept, used, trimmed, skipped = [], 0, 0, 0
    for n, item in enumerate(items):
        cost = estimate_tokens(render(item)) + TOKENS_PER_IMAGE * images(item)
        if token_budget is None or used + cost <= token_budget:
            kept.append(item)
            used += cost
            continue
        if images(item) and without_image is not None:  # a crop too big for what is left: its text may fit
            plain = without_image(item)
            plain_cost = estimate_tokens(render(plain))
            if not plain_cost:  # an image and nothing else: it cannot go as text
                skipped += 1
                continue
            if used + plain_cost <= token_budget:
                kept.append(plain)
                used += plain_cost
                continue
            item = plain
        room = token_budget - used
        short = shorten(item, room, question) if room >= MIN_PIECE_TOKENS else None
        if short is not None:
            kept.append(short)
            used += estimate_tokens(render(short)) + TOKENS_PER_IMAGE * images(short)
            trimmed = 1
        return Fitted(items=kept, tokens=used, trimmed=trimmed, left_out=len(items) - len(kept))
    return Fitted(items=kept, tokens=used, trimmed=0, left_out=skipped)

