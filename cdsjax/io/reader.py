"""The reader: answer a question from selected evidence through an OpenAI-compatible chat API.

Retrieve-then-read ends here: the selected notes become one chat request (text notes as text, visual notes
as base64 ``image_url`` parts with their caption and summary), the server (usually ``vllm serve``, see
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
    out = reader.answer("What accuracy does Table 2 report?", evidence)
    out.text, out.cited   # "91.2% [3]", (3,)

Configuration falls back to environment variables for fields left unset:

    CDSJAX_READER_URL       base URL of the server, e.g. http://localhost:8000/v1
    CDSJAX_READER_MODEL     model name; when unset too, the server's only model is used (vLLM serves one)
    CDSJAX_READER_API_KEY   API key; when unset, "EMPTY" (what a vLLM server without --api-key accepts)

The judge (:mod:`cdsjax.io.judge`) reads ``CDSJAX_JUDGE_URL`` / ``CDSJAX_JUDGE_MODEL`` /
``CDSJAX_JUDGE_API_KEY`` the same way, with ``OPENAI_API_KEY`` as a further key fallback.

Every failure to get an answer is a :class:`ReaderError` with a one-line message and a ``kind``:
``config``, ``unreachable``, ``timeout``, ``server_error``, ``rate_limited``, ``model_not_found``,
``context_too_long``, ``auth``, ``bad_request`` or ``bad_response``. The client and its retries are
:class:`cdsjax.io.llm.ChatClient` (one retry policy for reader, judge, VLM enrichment and planner): transient
failures (connection errors, timeouts, HTTP 408/409/429/5xx, and replies that are malformed, empty or carry
no message) are retried with exponential backoff (tenacity) before they are raised; ``timeout`` bounds the
whole call, retries included. Replies are read by :mod:`cdsjax.io.replies`.
:meth:`ChatClient.probe` is a quick reachability check to run before slow work, and :func:`error_dict`
is the ``"error"`` object of ``cdsjax ask --json`` when reading fails.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import random
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

# The client and the reply parsing live in llm / replies; the names stay importable from here.
from cdsjax.io.llm import FATAL_KINDS, ChatClient, ChatReply, ReaderConfig, ReaderError, count_images  # noqa: F401
from cdsjax.io.replies import markers_only, parse_citations, starts_with, strip_thinking  # noqa: F401

TEXT_KINDS = ("text",)
VISUAL_KINDS = ("figure", "table", "chart")
KINDS = TEXT_KINDS + VISUAL_KINDS

ABSTAIN = "Not answerable"
DEFAULT_MAX_MODEL_LEN = 32768  # the paper's Qwen3-VL window, used when neither config nor server says

# Token estimate of the no-retrieval control (paper App. B.6): ~3 characters per text token, a flat
# allowance per image and for the prompt scaffolding, output between 256 and 8192 tokens.
CHARS_PER_TOKEN = 3
TOKENS_PER_IMAGE = 1500
PROMPT_RESERVE_TOKENS = 1500
MIN_OUTPUT_TOKENS = 256
MAX_OUTPUT_TOKENS = 8192


@dataclasses.dataclass(frozen=True)
class EvidenceItem:
    """One selected note as the reader sees it (the pipeline fills these from the index).

    Attributes:
      note_id: the note's id in the index.
      doc_id: the document it comes from.
      page: 0-based page number (shown to the model 1-based, as people number pages).
      kind: "text", "figure", "table" or "chart".
      text: the note's text (a chunk, or a visual element's surrounding text).
      summary: the note's summary.
      caption: a visual element's caption.
      bbox: (x0, y0, x1, y1) in PDF points, origin top-left, or None.
      image_path: a PNG/JPEG crop of a visual element, or None (then only its text is sent).
      score: the selector's score, or None.
      rank: 1-based position in the selection, or None.
      ocr_text: a figure's, chart's or page image's text read from its image by OCR at index time ("" when none),
        shown as "Text read from the image".
    """

    note_id: str
    doc_id: str
    page: int
    kind: str = "text"
    text: str = ""
    summary: str = ""
    caption: str = ""
    bbox: Optional[tuple] = None
    image_path: Optional[str] = None
    score: Optional[float] = None
    rank: Optional[int] = None
    ocr_text: str = ""

    @property
    def is_visual(self) -> bool:
        return self.kind in VISUAL_KINDS

    @classmethod
    def from_any(cls, item: Union["EvidenceItem", Mapping[str, Any]], where: str = "evidence") -> "EvidenceItem":
        """Accepts an EvidenceItem, or a dict / dataclass (an ingestion ``Element``, say) with the same keys;
        extra keys are ignored."""
        if dataclasses.is_dataclass(item) and not isinstance(item, (type, cls)):
            item = dataclasses.asdict(item)
        if isinstance(item, cls):
            out = item
        elif isinstance(item, Mapping):
            missing = [k for k in ("note_id", "doc_id", "page") if k not in item]
            if missing:
                raise ValueError(f"{where}: missing key(s) {', '.join(missing)}")
            names = {f.name for f in dataclasses.fields(cls)}
            values = {k: v for k, v in item.items() if k in names}
            for key in ("text", "summary", "caption", "ocr_text"):
                if values.get(key) is None:
                    values[key] = ""
            values["note_id"] = str(values["note_id"])
            values["doc_id"] = str(values["doc_id"])
            if values.get("image_path") is not None:
                values["image_path"] = str(values["image_path"])
            if values.get("bbox") is not None:
                values["bbox"] = tuple(float(v) for v in values["bbox"])
            out = cls(**values)
        else:
            raise TypeError(f"{where}: expected an EvidenceItem or a dict, got {type(item).__name__}")
        if out.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {out.kind!r}")
        if not isinstance(out.page, int) or isinstance(out.page, bool) or out.page < 0:
            raise ValueError(f"{where}: page must be a 0-based int, got {out.page!r}")
        return out


def as_evidence(evidence: Iterable[Union[EvidenceItem, Mapping[str, Any]]]) -> list:
    """Converts a sequence of EvidenceItems or dicts to a list of EvidenceItems, naming a bad entry."""
    if isinstance(evidence, (str, bytes, Mapping)):
        raise TypeError("evidence must be a sequence of EvidenceItems or dicts")
    return [EvidenceItem.from_any(e, where=f"evidence[{i}]") for i, e in enumerate(evidence)]


@dataclasses.dataclass(frozen=True)
class ReaderAnswer:
    """The reader's answer.

    Attributes:
      text: the answer (any ``<think>`` block removed).
      cited: evidence numbers (1-based, as in the prompt) the answer cites, in order of first citation.
      abstained: True when the reader said the evidence does not answer the question.
      usage: the server's token counts (prompt_tokens, completion_tokens, total_tokens), or None.
      latency_s: wall time of the call, retries included.
      model: the model that answered.
      finish_reason: "stop", or "length" when the answer hit max_tokens.
      warnings: one-line notes on what was sent (an image file that was missing and went as text, visual
        notes sent as text to a server that takes no images, notes left out of a request too long).
      image_mode: how the visual notes went: "images" (as image parts), "text" (as caption, summary and text:
        ``images`` is ``off`` or the server takes none) or "none" (the evidence had no image to send).
      dropped: the lowest-ranked notes left out because the request was too long for the server (0 when none).
    """

    text: str
    cited: tuple
    abstained: bool
    usage: Optional[dict]
    latency_s: float
    model: str
    finish_reason: Optional[str] = None
    warnings: tuple = ()
    image_mode: str = "none"
    dropped: int = 0


def error_dict(err: "ReaderError") -> dict:
    """The ``"error"`` object of ``cdsjax ask --json``: kind, message and server of a failed read."""
    return {"kind": err.kind, "message": str(err), "server": err.url}


SYSTEM_PROMPT = """\
You answer questions about documents. The user gives you numbered pieces of evidence taken from the \
documents (text passages, and figures, tables and charts as images or as their captions and text), \
followed by a question.

- Base the answer on the evidence alone: no outside knowledge, no guessing.
- Answer with the content itself first: the value, name, list or short phrase the question asks for, \
written out. Never answer with evidence numbers alone: "The baselines are [2] and [3]." is not an answer; \
"The baselines are BERT and ELMo [2][3]." is.
- Then cite the evidence you used by its number in square brackets, right after the statement it \
supports, for example [2] or [1][4].
- Keep numbers, units, names and figure or table identifiers (such as "Figure 3" or "Table 2") exactly as \
the evidence writes them; read values off images carefully.
- If the evidence does not answer the question, reply with exactly: Not answerable
- Be brief: the answer first, then at most two sentences of justification."""
QUESTION_LINE = "Answer with the content itself, then cite the evidence you used as [n]."


def build_messages(
    question: str,
    evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
    *,
    max_text_chars: Optional[int] = 1500,
    missing_images: Optional[list] = None,
    images: bool = True,
) -> list:
    """Builds the chat messages for one question (reads image files, sends nothing).

    Args:
      question: the user's question.
      evidence: the selected notes, in the order the reader should see them; they are numbered [1], [2], ...
      max_text_chars: longest text kept per note (None keeps everything); a visual note's fields share this
        budget. A table goes as its caption and its rows (header kept, rows cut whole at the end with "… N more
        rows"); a figure or chart as its caption, summary and the text read from its image.
      missing_images: None raises on an evidence image that does not exist; a list makes such a note go as
        text (caption, summary and its text) and receives one warning line per missing image.
      images: False sends every visual note as text (caption, summary and its text), for a server that
        takes no images; no image file is read.

    Returns:
      ``[system message, user message]``; the user message's content is a list of ``text`` and
      ``image_url`` parts (images as base64 data URLs).

    Raises:
      ValueError / TypeError: a bad question or evidence entry, naming it.
      FileNotFoundError: an evidence image that does not exist.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    items = as_evidence(evidence)
    parts: list = []
    lines = [f"Evidence ({len(items)} item{'s' if len(items) != 1 else ''}):" if items else
             "Evidence: none was found for this question."]
    for i, item in enumerate(items, start=1):
        header = f"[{i}] {item.kind} | document: {item.doc_id} | page {item.page + 1}"
        if not images and item.image_path is not None:
            item = dataclasses.replace(item, image_path=None)
        if item.is_visual and item.image_path is not None and missing_images is not None \
                and not Path(item.image_path).is_file():
            missing_images.append(f"evidence [{i}]: image file not found: {item.image_path}; sent as text instead")
            item = dataclasses.replace(item, image_path=None)
        if item.is_visual:
            body = _visual_text(item, max_text_chars)
            lines.append(header + ("\n" + body if body else ""))
            if item.image_path is not None:
                parts.append({"type": "text", "text": "\n\n".join(lines)})
                parts.append({"type": "image_url", "image_url": {"url": _data_url(item.image_path, i)}})
                lines = []
        else:
            lines.append(header + "\n" + _cut(item.text or item.summary, max_text_chars))
    lines.append(f"Question: {question.strip()}\n\n{QUESTION_LINE}")
    parts.append({"type": "text", "text": "\n\n".join(lines)})
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]


OCR_LABEL = "Text read from the image"
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")  # markdown's |---|---| line


def _visual_text(item: EvidenceItem, max_chars: Optional[int]) -> str:
    """A visual note's text: a table's caption and rows (not its summary, the same cells flattened); a figure's
    or chart's caption, summary (when it is more than the caption), its own text when no image goes with it,
    and :data:`OCR_LABEL`. The fields share ``max_chars``, in that order."""
    caption = item.caption.strip()
    if item.kind == "table" and item.text.strip():
        head = _cut(caption, max_chars) if caption else ""
        budget = None if max_chars is None else max(0, max_chars - len(head))
        rows = _table_rows(item.text, budget)
        return "\n".join(([f"Caption: {head}"] if head else []) + [f"Rows:\n{rows}"])
    fields = [("Caption", caption), ("Summary", item.summary.strip())]
    if fields[1][1] == fields[0][1]:
        fields = fields[:1]  # the lite summary of a figure is often its caption
    if item.image_path is None or not any(v for _, v in fields):
        fields.append(("Text", item.text.strip()))
    fields.append((OCR_LABEL, item.ocr_text.strip()))
    out = []
    budget = max_chars
    for name, value in fields:
        if not value:
            continue
        if budget is not None and budget <= 0:
            break
        cut = _cut(value, budget)
        out.append(f"{name}: {cut}")
        if budget is not None:
            budget -= len(cut)
    return "\n".join(out)


def _table_rows(text: str, max_chars: Optional[int]) -> str:
    """A table's rows within ``max_chars``: its header (the lines down to markdown's rule, else the first line)
    always, then whole rows from the top while they fit, and "… N more rows" for those left out."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    rule = next((i for i, line in enumerate(lines[:4]) if _TABLE_RULE.match(line)), None)
    n_head = 1 if rule is None else rule + 1
    head, rows = lines[:n_head], lines[n_head:]
    length = sum(len(line) + 1 for line in lines)
    if max_chars is None or length <= max_chars:
        return "\n".join(lines)
    room = max_chars - sum(len(line) + 1 for line in head) - len(f"… {len(rows)} more rows")
    kept = 0
    for row in rows:
        if len(row) + 1 > room:
            break
        room -= len(row) + 1
        kept += 1
    left = len(rows) - kept
    return "\n".join(head + rows[:kept] + [f"… {left} more row{'s' if left != 1 else ''}"])


def _cut(text: str, max_chars: Optional[int]) -> str:
    text = text.strip()
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[: max_chars - 1].rstrip() + "…"


_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                (b"GIF8", "image/gif"), (b"RIFF", "image/webp"))


def _data_url(path: str, number: int) -> str:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"evidence [{number}]: image file not found: {path}")
    data = file.read_bytes()
    mime = next((m for magic, m in _IMAGE_MAGIC if data.startswith(magic)), None)
    if mime is None:
        raise ValueError(f"evidence [{number}]: not a PNG/JPEG/GIF/WebP image: {path}")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


@dataclasses.dataclass(frozen=True)
class Sent:
    """One request as :func:`send_evidence` sent it.

    Attributes:
      result: what ``send`` returned.
      messages: the chat messages sent.
      evidence: the evidence items sent (the input, less ``dropped`` items at its end).
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


def send_evidence(client: ChatClient, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
                  send, *, max_text_chars: Optional[int] = 1500, known=None) -> Sent:
    """Builds and sends the request of ``question`` over ``evidence`` as ``client.config.images`` allows, and
    sends a shorter one while the server finds it too long (module docstring).

    Args:
      client: the chat client (its images mode and what it learned of its server).
      send: ``send(messages, items)`` -> a result (``client.chat``, or a cached call around it); ``items``
        are the evidence items those messages hold.
      max_text_chars: longest text per note (None keeps everything).
      known: ``known(messages, items)`` is True where ``send`` needs no server (a reply cache), see
        :meth:`ChatClient.send_with_images`.

    Raises:
      ReaderError: what ``send`` raises, and ``context_too_long`` when even the question alone is too long.
      ValueError / TypeError / FileNotFoundError: a bad question or evidence entry (:func:`build_messages`).
    """
    items = as_evidence(evidence)
    total, dropped, missing = len(items), 0, []
    while True:
        def build(images: bool, kept=items) -> list:
            missing.clear()
            return build_messages(question, kept, max_text_chars=max_text_chars, missing_images=missing,
                                  images=images)

        check = None if known is None else (lambda m, kept=items: known(m, kept))
        try:
            result, messages = client.send_with_images(build, lambda m, kept=items: send(m, kept), known=check)
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
    return Sent(result=result, messages=messages, evidence=items, image_mode=mode, images=images, dropped=dropped,
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
        text = _visual_text(item, max_text_chars) if item.is_visual else _cut(item.text or item.summary,
                                                                                max_text_chars)
        freed += len(text) / CHARS_PER_TOKEN + (TOKENS_PER_IMAGE if item.image_path else 0)
        if freed >= excess:
            break
    return n


def is_abstention(text: str) -> bool:
    """True when the answer declines (starts with :data:`ABSTAIN`, whatever the markup around it)."""
    return starts_with(text, ABSTAIN)


class Reader(ChatClient):
    """Answers questions from evidence through an OpenAI-compatible server (vLLM, OpenAI, ...).

    ``Reader(config)`` or ``Reader(base_url=..., model=..., timeout=...)`` (keyword overrides of
    :class:`ReaderConfig`). Creating one sends nothing; the first call does.
    """

    def answer(self, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]], *,
               max_tokens: Optional[int] = None) -> ReaderAnswer:
        """Answers ``question`` from ``evidence`` (numbered [1].. in the prompt, text cut to
        ``config.max_text_chars`` per note), visual notes as images or as text (``config.images``), the last
        notes left out where the server finds the request too long (:func:`send_evidence`).

        Args:
          max_tokens: new-token limit for this call (default ``config.max_tokens``).

        Raises:
          ReaderError: the server could not give an answer (after retries where retrying makes sense).
        """
        sent = send_evidence(self, question, evidence,
                             lambda messages, _: self.chat(messages, max_tokens=max_tokens),
                             max_text_chars=self.config.max_text_chars)
        return self._answer(sent)

    def _answer(self, sent: Sent) -> ReaderAnswer:
        reply: ChatReply = sent.result
        text = strip_thinking(reply.content)
        return ReaderAnswer(text=text, cited=parse_citations(text, len(sent.evidence)), abstained=is_abstention(text),
                            usage=reply.usage, latency_s=reply.latency_s, model=reply.model,
                            finish_reason=reply.finish_reason, warnings=sent.warnings, image_mode=sent.image_mode,
                            dropped=sent.dropped)

    def answer_many(self, items: Iterable[Any], *, progress: bool = True, errors: str = "raise") -> list:
        """Answers many questions, ``config.concurrency`` at a time, in input order.

        Args:
          items: ``(question, evidence)`` pairs or dicts with ``question``, ``evidence`` and optionally
            ``max_tokens``.
          progress: show a progress bar.
          errors: "raise" stops at the first failure; "return" puts a failed item's exception in its place
            (a server that is down or lacks the model still stops the batch).
        """
        def one(item):
            if isinstance(item, Mapping):
                return self.answer(item["question"], item["evidence"], max_tokens=item.get("max_tokens"))
            question, evidence = item
            return self.answer(question, evidence)

        return self.map(one, items, desc="reader", progress=progress, errors=errors)

    def max_model_len(self) -> int:
        """The context window: ``config.max_model_len``, else the server's (:meth:`ChatClient.context_size`:
        llama.cpp's ``/props``, vLLM's ``/v1/models``), else 32768."""
        if self.config.max_model_len is not None:
            return self.config.max_model_len
        return self.context_size() or DEFAULT_MAX_MODEL_LEN

    def answer_without_retrieval(self, question: str, elements: Sequence[Any], qid: str, *, seed: int = 42,
                                 k_text: int = 10, k_visual: int = 10,
                                 image_root: Optional[Union[str, Path]] = None) -> ReaderAnswer:
        """The no-retrieval control (paper App. B.6): sampled document content instead of selected evidence.

        Samples ``k_text`` text chunks and ``k_visual`` visual elements of ``elements`` with
        :func:`no_retrieval_evidence` (relative image paths resolved against ``image_root``), passes the
        chunks whole (the control concatenates full chunks), and clamps the output length to the server
        window with :func:`clamp_output_tokens`.
        """
        evidence = no_retrieval_evidence(elements, qid, seed=seed, k_text=k_text, k_visual=k_visual,
                                         image_root=image_root)

        def send(messages, _):
            return self.chat(messages, max_tokens=clamp_output_tokens(_text_chars(messages), count_images(messages),
                                                                      self.max_model_len()))

        sent = send_evidence(self, question, evidence, send, max_text_chars=None)
        return self._answer(sent)


def _text_chars(messages: list) -> int:
    total = 0
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            total += len(content)
        else:
            total += sum(len(p["text"]) for p in content if p.get("type") == "text")
    return total


def no_retrieval_evidence(elements: Sequence[Any], qid: str, *, seed: int = 42, k_text: int = 10,
                          k_visual: int = 10, image_root: Optional[Union[str, Path]] = None) -> list:
    r"""Deterministically samples the no-retrieval control's evidence (paper App. B.6).

    Draws ``min(k_text, #text)`` text chunks and ``min(k_visual, #visual)`` visual elements uniformly without
    replacement, with a generator seeded by the integer value of ``md5(f"{seed}:{qid}")`` (text first, then
    visual, from the same generator), so a (seed, query) pair always gets the same sample.

    Args:
      elements: the candidate documents' elements: EvidenceItems, ingestion ``Element``s or dicts. Text
        elements whose ``role`` is "caption" are not chunks and are skipped (their visual carries them).
        Without a ``note_id``, an element is named ``"{doc_id}:{reading_order}"`` (or its position).
      qid: the query id.
      seed: the run seed (the paper reports seeds 42, 43, 44).
      image_root: the directory relative image paths start from (the index directory).

    Returns:
      EvidenceItems: the sampled text chunks in their input order, then the sampled visual elements in their
      input order, with ``rank`` 1.. and ``score`` None.
    """
    if k_text < 0 or k_visual < 0:
        raise ValueError(f"k_text and k_visual must be >= 0, got {k_text} and {k_visual}")
    items, roles = [], []
    for i, element in enumerate(elements):
        raw = dataclasses.asdict(element) if dataclasses.is_dataclass(element) and not isinstance(
            element, EvidenceItem) else element
        if isinstance(raw, Mapping):
            raw = dict(raw)
            if "note_id" not in raw and "doc_id" in raw:
                order = raw.get("reading_order")
                raw["note_id"] = f"{raw['doc_id']}:{order if isinstance(order, int) and order >= 0 else i}"
            path = raw.get("image_path")
            if path is not None and image_root is not None and not Path(path).is_absolute():
                raw["image_path"] = str(Path(image_root) / path)
            roles.append(raw.get("role"))
        else:
            roles.append(None)
        items.append(EvidenceItem.from_any(raw, where=f"elements[{i}]"))
    rng = random.Random(int(hashlib.md5(f"{seed}:{qid}".encode()).hexdigest(), 16))
    text = [i for i, e in enumerate(items) if not e.is_visual and roles[i] != "caption"]
    visual = [i for i, e in enumerate(items) if e.is_visual]
    chosen = sorted(rng.sample(text, min(k_text, len(text)))) + sorted(rng.sample(visual, min(k_visual, len(visual))))
    return [dataclasses.replace(items[i], rank=r, score=None) for r, i in enumerate(chosen, start=1)]


def clamp_output_tokens(context_chars: int, n_images: int, max_model_len: int) -> int:
    r"""Output-token budget of the no-retrieval control (paper App. B.6, Eq. 16).

    .. math:: T_{out} = \max(256, \min(8192, L_{max} - |c|/3 - 1500\,n_{img} - 1500))

    with ~3 characters per text token and 1500 tokens per image; the result is rounded down.
    """
    if context_chars < 0 or n_images < 0 or max_model_len < 1:
        raise ValueError(f"need context_chars >= 0, n_images >= 0, max_model_len >= 1; got "
                         f"{context_chars}, {n_images}, {max_model_len}")
    room = max_model_len - context_chars / CHARS_PER_TOKEN - TOKENS_PER_IMAGE * n_images - PROMPT_RESERVE_TOKENS
    return int(max(MIN_OUTPUT_TOKENS, min(MAX_OUTPUT_TOKENS, math.floor(room))))
