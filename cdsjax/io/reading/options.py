"""What one read asks of the reader (:class:`ReadOptions`), apart from how the reader is reached.

A :class:`~cdsjax.io.reading.reader.Reader` is a client of a server and is shared by threads (``serve`` answers
several requests with one); what a single answer may use — how much evidence, how long an answer, which seed —
belongs to the request. Each edge builds its options once: ``serve`` from the request body, ``ask`` / ``demo``
from the command's flags, the evaluation from its config; all pass them to
:meth:`~cdsjax.io.reading.reader.Reader.answer`.

``None`` is the one sentinel, in every field: "the reader's default" (for the evidence budget, what the server's
window leaves, :meth:`~cdsjax.io.reading.reader.Reader.evidence_tokens`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

# The most evidence tokens one request may ask for (the largest context windows served are ~256k tokens).
MAX_EVIDENCE_TOKENS = 262144


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """One read's settings.

    Attributes:
      evidence_tokens: the evidence's budget in estimated tokens (:mod:`cdsjax.io.reading.evidence_fit`): the
        notes fill it in rank order, the one that does not fit whole keeps its sentences nearest the question;
        0 sends every note whole; None: the reader's default (derived from the server's window).
      answer_tokens: new tokens the answer may take; None: the reader config's ``max_tokens``.
      seed: the sampling seed sent to the server; None sends none.
      similarity: ``similarity(question, sentences)`` -> scores, which sentences a trimmed note keeps; None: word
        overlap.
    """

    evidence_tokens: Optional[int] = None
    answer_tokens: Optional[int] = None
    seed: Optional[int] = None
    similarity: Optional[Callable[[str, Sequence[str]], Sequence[float]]] = dataclasses.field(
        default=None, compare=False, repr=False)

    def __post_init__(self):
        for name, low, high in (("evidence_tokens", 0, MAX_EVIDENCE_TOKENS), ("answer_tokens", 1, None)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ReadOptions.{name} must be an int or None, got {value!r}")
            if value < low or (high is not None and value > high):
                raise ValueError(f"ReadOptions.{name} is out of range: {value!r} (allowed: {low}.."
                                 f"{high if high is not None else ''})")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"ReadOptions.seed must be an int or None, got {self.seed!r}")

    def updated(self, **changes) -> "ReadOptions":
        """A copy with ``changes``; a change to None keeps this object's value (so a request that names nothing
        keeps the edge's default)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
