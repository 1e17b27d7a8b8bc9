"""The reader: answer a question from selected evidence through an OpenAI-compatible chat API.

Retrieve-then-read ends here: the selected notes become one chat request (:mod:`cdsjax.io.reading.prompt`: in one
reading order, text notes as text, visual notes as base64 ``image_url`` parts with their caption), the server (usually ``vllm serve``, see
``experiments/serve_reader.sh``) answers with greedy decoding, and the answer comes back with the evidence
numbers it cites.

Two things a small local server (llama.cpp) needs, handled by :func:`send_evidence` for ``cdsjax ask``,
``serve`` and the batch evaluation alike:

* **No images**: ``ReaderConfig.images`` (``auto`` by default) sends a visual note as its caption, summary and
  surrounding text to a server that refused an image (learned once per client, see
  :meth:`ChatClient.send_with_images`); the answer's ``image_mode`` says how the visual notes went.
* **A short context**: a request the server finds too long (``context_too_long``) is never sent again as it
  is: the lowest-ranked notes (the last ones) are left out, as many as the server's token counts say, and the
  shorter request is sent; the answer's ``dropped`` and a warning say how many were left out.

    reader = Reader(base_url="http://localhost:8000/v1", model="Qwen/Qwen3-VL-32B-Instruct")
    out = reader.answer("What accuracy does Table 2 report?", evidence, ReadOptions(evidence_tokens=700))
    out.text, out.cited   # "91.2% [3]", (3,)

The reader is a client (how to reach the server, :class:`ReaderConfig`) shared by threads; what one answer may
use (its evidence budget, answer tokens, seed) is that call's :class:`~cdsjax.io.reading.options.ReadOptions`.

Configuration falls back to environment variables for fields left unset:

    CDSJAX_READER_URL       base URL of the server, e.g. http://localhost:8000/v1
    CDSJAX_READER_MODEL     model name; when unset too, the server's only model is used (vLLM serves one)
    CDSJAX_READER_API_KEY   API key; when unset, "EMPTY" (what a vLLM server without --api-key accepts)

The judge (:mod:`cdsjax.io.reading.judge`) reads ``CDSJAX_JUDGE_URL`` / ``CDSJAX_JUDGE_MODEL`` /
``CDSJAX_JUDGE_API_KEY`` the same way, with ``OPENAI_API_KEY`` as a further key fallback.

Every failure to get an answer is a :class:`ReaderError` with a one-line message and a ``kind``:
``config``, ``unreachable``, ``timeout``, ``server_error``, ``rate_limited``, ``model_not_found``,
``context_too_long``, ``auth``, ``bad_request`` or ``bad_response``. The client and its retries are
:class:`cdsjax.io.reading.llm.client.ChatClient` (one retry policy for reader, judge, VLM enrichment and planner): transient
failures (connection errors, timeouts, HTTP 408/409/429/5xx, and replies that are malformed, empty or carry
no message) are retried with exponential backoff (tenacity) before they are raised; ``timeout`` bounds the
whole call, retries included. Replies are read by :mod:`cdsjax.io.reading.replies`.
:meth:`ChatClient.probe` is a quick reachability check to run before slow work, and :func:`error_dict`
is the ``"error"`` object of ``cdsjax ask --json`` when reading fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, Union

# The client lives in llm, the reply parsing in replies.
from cdsjax.io.reading.llm.client import ChatClient
from cdsjax.io.reading.llm.config import ChatReply, ReaderConfig
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.llm.transport import count_images
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.reading.evidence_fit import CHARS_PER_TOKEN, TOKENS_PER_IMAGE, Fitted, estimate_tokens, fit_evidence, nearest_sentences
from cdsjax.io.reading.prompt import EvidenceItem, as_evidence, build_messages, note_text, reading_order
from cdsjax.io.reading.replies import (CitationStream, ReplyGuard, no_answer, parse_citations, renumber_citations,
                               starts_with, strip_thinking)
from cdsjax.io.reading.reply_cache import content_hash, reply_key

ABSTAIN = "Not answerable"
DEFAULT_MAX_MODEL_LEN = 32768  # the paper's Qwen3-VL window, used when neither config nor server says

# Room in the window besides the evidence: the instructions, the question and the headers (a remote server's
# evidence budget is its window less this and the answer's tokens), and the least evidence budget derived so.
PROMPT_RESERVE_TOKENS = 1500
MIN_EVIDENCE_TOKENS = 256


@dataclasses.dataclass(frozen=True)
class ReaderAnswer:
    """The reader's answer.

    Attributes:
      text: the answer (any ``<think>`` block removed).
      cited: the notes the answer cites, in order of first citation, as 1-based places in the evidence passed to
        :meth:`Reader.answer` (its rank): the prompt numbers its notes in :func:`reading_order`, and the answer's
        ``[n]`` marks are renumbered back to the caller's order (``raw`` keeps the prompt's numbers).
      abstained: True when the reader said the evidence does not answer the question.
      usage: the server's token counts (prompt_tokens, completion_tokens, total_tokens), or None.
      latency_s: wall time of the call, retries included.
      model: the model that answered.
      finish_reason: "stop", or "length" when the answer hit max_tokens.
      warnings: one-line notes on what was sent (an image file that was missing and went as text, visual
        notes sent as text to a server that takes no images, notes left out of a request too long).
      images: image parts sent.
      image_mode: how the visual notes went: "images" (as image parts), "text" (as caption, summary and text:
        ``images`` is ``off`` or the server takes none) or "none" (the evidence had no image to send).
      dropped: the lowest-ranked notes left out: beyond the token budget, or because the request was too long
        for the server (0 when none).
      no_answer: why the reader gave no answer (a key of :data:`cdsjax.io.reading.replies.NO_ANSWER`: markers only,
        echoed evidence headers, a loop), after one retry with a stricter instruction; ``text`` is then "".
      retried: why the first reply was asked again (a key of ``NO_ANSWER``), None when it was an answer.
      first_token_s: seconds from the (last) request to the first streamed piece; None when not streamed.
      evidence_tokens: the evidence's estimated tokens as sent (:mod:`cdsjax.io.reading.evidence_fit`).
      trimmed: notes sent as their sentences nearest the question (0 or 1).
      cached: the reply came from the reply cache.
      raw: the reply as written (thinking removed), also when it was no answer.
      evidence: the evidence items as sent, in prompt order (:func:`reading_order`; a trimmed note with its kept
        sentences).
    """

    text: str
    cited: tuple
    abstained: bool
    usage: Optional[dict]
    latency_s: float
    model: str
    finish_reason: Optional[str] = None
    warnings: tuple = ()
    images: int = 0
    image_mode: str = "none"
    dropped: int = 0
    no_answer: Optional[str] = None
    retried: Optional[str] = None
    first_token_s: Optional[float] = None
    evidence_tokens: int = 0
    trimmed: int = 0
    cached: bool = False
    raw: str = ""
    evidence: tuple = ()


def error_dict(err: "ReaderError") -> dict:
    """The ``"error"`` object of ``cdsjax ask --json``: kind, message and server of a failed read."""
    return {"kind": err.kind, "message": str(err), "server": err.url}


@dataclasses.dataclass(frozen=True)
class Sent:
    """One request as :func:`send_evidence` sent it.

    Attributes:
      result: what ``send`` returned.
      messages: the chat messages sent.
      evidence: the evidence items sent, in prompt order (:func:`reading_order`; the input less ``dropped``
        items at its end).
      image_mode: "images", "text" or "none" (see :class:`ReaderAnswer`).
      images: the image parts sent.
      dropped: items left out because the request was too long.
      warnings: one-line notes (a missing image file, visual notes sent as text, items left out).
    """

    result: Any
    messages: list
    evidence: list
    image_mode: str
    images: int
    dropped: int
    warnings: tuple


def prompt_numbers(items: Sequence[EvidenceItem], ordered: Sequence[EvidenceItem]) -> dict:
    """Each prompt number of ``ordered`` (1-based) -> the 1-based place of that note in ``items``."""
    place = {}
    for k, item in enumerate(items, 1):
        place.setdefault(item.note_id, k)
    return {k: place[item.note_id] for k, item in enumerate(ordered, 1)}


def send_evidence(client: ChatClient, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
                  send, *, max_text_chars: Optional[int] = 1500, known=None, strict: bool = False) -> Sent:
    """Builds and sends the request of ``question`` over ``evidence`` (best first) as ``client.config.images``
    allows, in :func:`reading_order`, and sends a shorter one, the last-ranked notes left out, while the server
    finds it too long (module docstring).

    Args:
      client: the chat client (its images mode and what it learned of its server).
      send: ``send(messages, items)`` -> a result (``client.chat``, or a cached call around it); ``items``
        are the evidence items those messages hold, in prompt order.
      max_text_chars: longest text per note (None keeps everything).
      known: ``known(messages, items)`` is True where ``send`` needs no server (a reply cache), see
        :meth:`ChatClient.send_with_images`.
      strict: the stricter instruction of a second request (:func:`build_messages`).

    Raises:
      ReaderError: what ``send`` raises, and ``context_too_long`` when even the question alone is too long.
      ValueError / TypeError / FileNotFoundError: a bad question or evidence entry (:func:`build_messages`).
    """
    items = as_evidence(evidence)
    total, dropped, missing = len(items), 0, []
    while True:
        def build(images: bool, kept=items) -> list:
            missing.clear()
            return build_messages(question, reading_order(kept), max_text_chars=max_text_chars,
                                  missing_images=missing, images=images, strict=strict)

        ordered = reading_order(items)
        check = None if known is None else (lambda m, kept=ordered: known(m, kept))
        try:
            result, messages = client.send_with_images(build, lambda m, kept=ordered: send(m, kept), known=check)
            break
        except ReaderError as err:
            if err.kind != "context_too_long" or not items:
                raise
            n = notes_to_drop(items, err.overflow, max_text_chars)
            items, dropped = items[: len(items) - n], dropped + n
    images = count_images(messages)
    crops = sum(1 for i in items if i.is_visual and i.image_path is not None)
    mode = "images" if images else ("text" if crops else "none")
    warnings = list(missing)
    if crops and not images and client.config.images == "auto" and client.takes_images is False:
        warnings.append(f"the reader at {client.url} takes no images: {crops} visual note"
                        f"{'s' if crops != 1 else ''} sent as caption, summary and text")
    if dropped:
        warnings.append(f"the request was too long for the reader's context: the last {dropped} of {total} "
                        f"evidence notes were left out")
    return Sent(result=result, messages=messages, evidence=ordered, image_mode=mode, images=images, dropped=dropped,
                warnings=tuple(warnings))


def notes_to_drop(items: Sequence[EvidenceItem], overflow: Optional[tuple], max_text_chars: Optional[int]) -> int:
    """How many notes to leave out at the end of ``items`` after a ``context_too_long`` refusal: one when the
    server gave no token counts, else the fewest last notes whose estimated tokens (:data:`CHARS_PER_TOKEN`
    characters a token, :data:`TOKENS_PER_IMAGE` an image) cover the excess ``prompt tokens - context tokens``
    (at least one; a second refusal drops more)."""
    if not items:
        return 0
    if overflow is None:
        return 1
    excess = max(1, int(overflow[0]) - int(overflow[1]) + 1)
    n, freed = 0, 0.0
    for item in reversed(items):
        n += 1
        freed += estimate_tokens(note_text(item, max_text_chars)) + (TOKENS_PER_IMAGE if item.image_path else 0)
        if freed >= excess:
            break
    return n


def is_abstention(text: str) -> bool:
    """True when the answer declines (starts with :data:`ABSTAIN`, whatever the markup around it)."""
    return starts_with(text, ABSTAIN)


class Reader(ChatClient):
    """Answers questions from evidence through an OpenAI-compatible server (vLLM, llama.cpp, OpenAI, ...): the
    one reading path of ``ask``, ``serve``, the pipeline, the integrations, the demo and the batch evaluation.

    ``Reader(config)`` or ``Reader(base_url=..., model=..., timeout=...)`` (keyword overrides of
    :class:`ReaderConfig`). Creating one sends nothing; the first call does.

    Args (besides the config):
      cache: a :class:`cdsjax.io.reading.reply_cache.ReplyCache`: a request sent before (same model, messages and
        generation settings) is answered from it and sends nothing (the batch evaluation's resumable runs).
      local: what a local server that answers is (:meth:`cdsjax.io.reading.local.reader.LocalReader.describe`), for
        ``ask --json``'s ``reader.local``; None for a remote server.

    A new backend needs nothing of its own when it speaks the OpenAI chat-completions API with streaming
    (``stream: true`` server-sent events; vLLM, llama.cpp, Ollama and OpenAI do): point ``base_url`` at it.
    Anything else implements :meth:`ChatClient.chat` (one completion, ``on_token`` for streaming) and, where it
    knows its window, :meth:`ChatClient.context_size`.
    """

    def __init__(self, config: Optional[ReaderConfig] = None, *, cache=None, local=None, **overrides: Any):
        super().__init__(config, **overrides)
        self.cache = cache
        self.local = local

    def evidence_tokens(self, options: Optional[ReadOptions] = None) -> Optional[int]:
        """The evidence's token budget of a read: ``options.evidence_tokens`` when set (0: no budget, every note
        whole: None is returned), else what the server's window leaves once the answer, the instructions and the
        question have room (:meth:`max_model_len` minus the answer's tokens minus :data:`PROMPT_RESERVE_TOKENS`),
        at least :data:`MIN_EVIDENCE_TOKENS`."""
        options = options or ReadOptions()
        if options.evidence_tokens is not None:
            return int(options.evidence_tokens) or None
        answer = int(options.answer_tokens or self.config.max_tokens)
        return max(MIN_EVIDENCE_TOKENS, self.max_model_len() - answer - PROMPT_RESERVE_TOKENS)

    def max_model_len(self) -> int:
        """The context window: ``config.max_model_len``, else the server's (:meth:`ChatClient.context_size`:
        llama.cpp's ``/props``, vLLM's ``/v1/models``), else 32768."""
        if self.config.max_model_len is not None:
            return self.config.max_model_len
        return self.context_size() or DEFAULT_MAX_MODEL_LEN

    def fit(self, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
            options: Optional[ReadOptions] = None) -> Fitted:
        """The evidence as it will be sent: filled into :meth:`evidence_tokens` in rank order, the note that
        does not fit whole cut to its sentences nearest the question (``options.similarity``;
        :func:`cdsjax.io.reading.evidence_fit.fit_evidence`)."""
        options = options or ReadOptions()
        items = as_evidence(evidence)
        return fit_items(question, items, self.evidence_tokens(options), max_text_chars=self.config.max_text_chars,
                         images=self.takes_images is not False and self.config.images != "off",
                         similarity=options.similarity)

    def answer(self, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
               options: Optional[ReadOptions] = None, *, on_token: Optional[Callable[[str], None]] = None,
               on_retry: Optional[Callable[[str], None]] = None) -> ReaderAnswer:
        """Answers ``question`` from ``evidence`` (best first).

        The evidence is fitted to the token budget in rank order (:meth:`fit`), then numbered [1].. in the prompt
        in :func:`reading_order` (the answer's citations come back numbered as ``evidence``), visual notes
        as images or as text (``config.images``); the last notes are left out where the server still finds
        the request too long (:func:`send_evidence`). A reply that is no answer (citation markers only, the
        evidence headers echoed, a loop: :func:`cdsjax.io.reading.replies.no_answer`) is asked again once with a
        stricter instruction; failing that, the answer's ``no_answer`` says why and its ``text`` is "".

        The reply is always streamed through :class:`cdsjax.io.reading.replies.ReplyGuard`, whatever the caller
        displays: the guard holds back markers and echoed headers, and ends a stream that echoes the evidence or
        loops at once.

        Args:
          options: this read's evidence budget, answer tokens, seed and sentence similarity
            (:class:`~cdsjax.io.reading.options.ReadOptions`; None: the reader's defaults).
          on_token: called with each piece of the answer as it is written, once it is an answer; None shows
            nothing (the reply is guarded all the same).
          on_retry: called with the reason (a key of :data:`cdsjax.io.reading.replies.NO_ANSWER`) before the second
            request, so a display can drop what it showed of the first.

        Raises:
          ReaderError: the server could not give a reply (after retries where retrying makes sense).
        """
        options = options or ReadOptions()
        max_tokens, seed = options.answer_tokens, options.seed
        show = on_token if on_token is not None else (lambda _piece: None)
        items = as_evidence(evidence)
        fitted = self.fit(question, items, options)
        problem, retried, first, sent, reply, cached = None, None, None, None, None, False
        for strict in (False, True):
            shown: dict = {}  # the guard and the citation renumbering of the request last sent

            def send(messages, kept):
                # the answer as written, its citations numbered as the caller's evidence
                shown["stream"] = CitationStream(show, prompt_numbers(items, kept))
                shown["guard"] = guard = ReplyGuard(shown["stream"])
                return self.reply(messages, max_tokens=max_tokens, seed=seed, on_token=guard)

            sent = send_evidence(self, question, fitted.items, send, max_text_chars=self.config.max_text_chars,
                                 strict=strict, known=self._known(max_tokens, seed))
            reply, cached = sent.result
            first = reply.first_token_s if first is None else first
            guard = shown["guard"]
            problem = guard.problem or no_answer(reply.content, finish_reason=reply.finish_reason)
            if problem is None:
                guard.release()
                shown["stream"].flush()
                break
            if not strict:
                retried = problem
                if on_retry is not None:
                    on_retry(problem)
        raw = strip_thinking(reply.content)
        numbers = prompt_numbers(items, sent.evidence)
        text = "" if problem is not None else renumber_citations(raw.strip(), numbers)
        image_mode = sent.image_mode
        crops = {i.note_id for i in items if i.is_visual and i.image_path}
        if image_mode == "none" and any(i.note_id in crops for i in fitted.items):
            image_mode = "text"  # a crop did not fit the token budget: its note went as text
        return ReaderAnswer(
            text=text, cited=tuple(numbers[k] for k in parse_citations(raw, len(sent.evidence))) if text else (),
            abstained=is_abstention(text),
            usage=reply.usage, latency_s=reply.latency_s, model=reply.model, finish_reason=reply.finish_reason,
            warnings=sent.warnings, images=sent.images, image_mode=image_mode, dropped=sent.dropped + fitted.left_out,
            no_answer=problem, retried=retried,
            first_token_s=first, evidence_tokens=fitted.tokens, trimmed=fitted.trimmed, cached=cached,
            raw=raw, evidence=tuple(sent.evidence))

    def reply(self, messages: list, *, max_tokens: Optional[int] = None, seed: Optional[int] = None,
              on_token: Optional[Callable[[str], Optional[bool]]] = None) -> Tuple[ChatReply, bool]:
        """One request through the reply cache (when there is one): ``(reply, from_cache)``. A cached reply is
        handed to ``on_token`` whole."""
        if self.cache is None:
            return self._send(messages, max_tokens, seed, on_token), False
        key = self.reply_key(messages, max_tokens, seed)

        def fetch() -> dict:
            return dataclasses.asdict(self._send(messages, max_tokens, seed, on_token))

        value, cached = self.cache.get_or_fetch(key, fetch)
        fields = {f.name for f in dataclasses.fields(ChatReply)}
        reply = ChatReply(**{k: v for k, v in value.items() if k in fields})
        if cached and on_token is not None:
            on_token(reply.content)
        return reply, cached

    def reply_key(self, messages: list, max_tokens: Optional[int], seed: Optional[int]) -> str:
        """The reply cache's key of a request: the model, the messages and the generation settings."""
        return reply_key(kind="reader", model=self.model, request=content_hash(messages),
                         max_tokens=int(max_tokens or self.config.max_tokens),
                         temperature=float(self.config.temperature), seed=seed)

    def _known(self, max_tokens, seed):
        if self.cache is None:
            return None
        return lambda messages, _items: self.reply_key(messages, max_tokens, seed) in self.cache

    def _send(self, messages, max_tokens, seed, on_token) -> ChatReply:
        return self.chat(messages, max_tokens=max_tokens, seed=seed, on_token=on_token)


def fit_items(question: str, items: Sequence[EvidenceItem], token_budget: Optional[int], *,
              max_text_chars: Optional[int], images: bool = True, similarity=None) -> Fitted:
    """:func:`cdsjax.io.reading.evidence_fit.fit_evidence` for reader evidence: a note's text as
    :func:`build_messages` writes it (``max_text_chars`` per note), a crop counted as an image when ``images``."""

    def shorten(item: EvidenceItem, room: int, q: str) -> Optional[EvidenceItem]:
        if item.is_visual:  # as text, cut to the room left (a table's last rows go first)
            short = dataclasses.replace(item, image_path=None, max_chars=int(room * CHARS_PER_TOKEN))
            return short if note_text(short, max_text_chars) else None
        kept = nearest_sentences(q, item.text or item.summary, room, similarity)
        return dataclasses.replace(item, text=kept, summary="") if kept else None

    return fit_evidence(question, items, token_budget, render=lambda item: note_text(item, max_text_chars),
                        shorten=shorten, images=lambda item: int(images and item.is_visual and
                                                                  item.image_path is not None),
                        without_image=lambda item: dataclasses.replace(item, image_path=None))

