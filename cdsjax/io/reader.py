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
:class:`cdsjax.io.llm.client.ChatClient` (one retry policy for reader, judge, VLM enrichment and planner): transient
failures (connection errors, timeouts, HTTP 408/409/429/5xx, and replies that are malformed, empty or carry
no message) are retried with exponential backoff (tenacity) before they are raised; ``timeout`` bounds the
whole call, retries included. Replies are read by :mod:`cdsjax.io.replies`.
:meth:`ChatClient.probe` is a quick reachability check to run before slow work, and :func:`error_dict`
is the ``"error"`` object of ``cdsjax ask --json`` when reading fails.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

# The client lives in llm, the reply parsing in replies.
from cdsjax.io.llm.client import ChatClient
from cdsjax.io.llm.config import ChatReply, ReaderConfig
from cdsjax.io.llm.errors import ReaderError
from cdsjax.io.llm.transport import count_images
from cdsjax.io.evidence_fit import CHARS_PER_TOKEN, TOKENS_PER_IMAGE, Fitted, estimate_tokens, fit_evidence, nearest_sentences
from cdsjax.io.replies import (CitationStream, ReplyGuard, no_answer, parse_citations, renumber_citations,
                               starts_with, strip_thinking)
from cdsjax.io.reply_cache import content_hash, reply_key

TEXT_KINDS = ("text",)
VISUAL_KINDS = ("figure", "table", "chart")
KINDS = TEXT_KINDS + VISUAL_KINDS

ABSTAIN = "Not answerable"
DEFAULT_MAX_MODEL_LEN = 32768  # the paper's Qwen3-VL window, used when neither config nor server says

# Room in the window besides the evidence: the instructions, the question and the headers (a remote server's
# evidence budget is its window less this and the answer's tokens), and the least evidence budget derived so.
PROMPT_RESERVE_TOKENS = 1500
MIN_EVIDENCE_TOKENS = 256


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
      max_chars: the most characters of its text the prompt holds, when it was cut to fit the reader's token
        budget (:func:`fit_items`); None: ``max_text_chars`` alone.
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
    max_chars: Optional[int] = None
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
      no_answer: why the reader gave no answer (a key of :data:`cdsjax.io.replies.NO_ANSWER`: markers only,
        echoed evidence headers, a loop), after one retry with a stricter instruction; ``text`` is then "".
      retried: why the first reply was asked again (a key of ``NO_ANSWER``), None when it was an answer.
      first_token_s: seconds from the (last) request to the first streamed piece; None when not streamed.
      evidence_tokens: the evidence's estimated tokens as sent (:mod:`cdsjax.io.evidence_fit`).
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
# The second request after a reply that was no answer (markers only, echoed headers, a loop)
STRICT_LINE = ("Your reply must start with the answer itself, written out in words or numbers (a value, a name, a "
               "short phrase or \"Not answerable\"). Do not copy the evidence, its numbers or its headers; do not "
               "repeat yourself; write at most two sentences, then the [n] of the evidence you used.")


def reading_order(items: Sequence[EvidenceItem]) -> list:
    """The order of the evidence in every request: by document (its id), then page, then the note's place in its
    document (its id's numbers in natural order: ``doc#12`` after ``doc#9``; a PDF note's id ends in its reading
    order). Whatever order a selector ranked them in, the same notes make the same request; the rank decides
    only what fits the token budget (:meth:`Reader.fit`) and what goes first when a request is too long."""

    def key(item: EvidenceItem) -> tuple:
        pieces = re.split(r"(\d+)", item.note_id)  # text at even places, digits at odd ones
        return item.doc_id, item.page, tuple(int(p) if i % 2 else p for i, p in enumerate(pieces))

    return sorted(items, key=key)


def build_messages(
    question: str,
    evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]],
    *,
    max_text_chars: Optional[int] = 1500,
    missing_images: Optional[list] = None,
    images: bool = True,
    strict: bool = False,
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
      strict: ask again after a reply that was no answer: :data:`STRICT_LINE` after the question.

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
            body = note_text(item, max_text_chars)
            lines.append(header + ("\n" + body if body else ""))
            if item.image_path is not None:
                parts.append({"type": "text", "text": "\n\n".join(lines)})
                parts.append({"type": "image_url", "image_url": {"url": _data_url(item.image_path, i)}})
                lines = []
        else:
            lines.append(header + "\n" + note_text(item, max_text_chars))
    lines.append(f"Question: {question.strip()}\n\n{QUESTION_LINE}" + (f"\n{STRICT_LINE}" if strict else ""))
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
      cache: a :class:`cdsjax.io.reply_cache.ReplyCache`: a request sent before (same model, messages and
        generation settings) is answered from it and sends nothing (the batch evaluation's resumable runs).
      on_use: called before and after every request (a warm local server's keep-alive lease).
      local: what a local server that answers is (:meth:`cdsjax.io.local_reader.LocalReader.describe`), for
        ``ask --json``'s ``reader.local``; None for a remote server.

    A new backend needs nothing of its own when it speaks the OpenAI chat-completions API with streaming
    (``stream: true`` server-sent events; vLLM, llama.cpp, Ollama and OpenAI do): point ``base_url`` at it.
    Anything else implements :meth:`ChatClient.chat` (one completion, ``on_token`` for streaming) and, where it
    knows its window, :meth:`ChatClient.context_size`.
    """

    def __init__(self, config: Optional[ReaderConfig] = None, *, cache=None, on_use=None, local=None,
                 **overrides: Any):
        super().__init__(config, **overrides)
        self.cache = cache
        self.on_use = on_use
        self.local = local

    def evidence_tokens(self) -> Optional[int]:
        """The evidence's token budget: ``config.evidence_tokens`` when set (the local reader's is set by
        whoever starts it; 0: no budget, every note whole), else what the server's window leaves once the
        answer, the instructions and the question have room (:meth:`max_model_len` minus ``config.max_tokens``
        minus :data:`PROMPT_RESERVE_TOKENS`), at least :data:`MIN_EVIDENCE_TOKENS`."""
        if self.config.evidence_tokens is not None:
            return int(self.config.evidence_tokens) or None
        return max(MIN_EVIDENCE_TOKENS, self.max_model_len() - int(self.config.max_tokens) - PROMPT_RESERVE_TOKENS)

    def max_model_len(self) -> int:
        """The context window: ``config.max_model_len``, else the server's (:meth:`ChatClient.context_size`:
        llama.cpp's ``/props``, vLLM's ``/v1/models``), else 32768."""
        if self.config.max_model_len is not None:
            return self.config.max_model_len
        return self.context_size() or DEFAULT_MAX_MODEL_LEN

    def fit(self, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]], *,
            whole: bool = False, similarity=None) -> Fitted:
        """The evidence as it will be sent: filled into :meth:`evidence_tokens` in rank order, the note that
        does not fit whole cut to its sentences nearest the question
        (:func:`cdsjax.io.evidence_fit.fit_evidence`); ``whole`` sends every note whole."""
        items = as_evidence(evidence)
        budget = None if whole else self.evidence_tokens()
        return fit_items(question, items, budget, max_text_chars=self.config.max_text_chars,
                         images=self.takes_images is not False and self.config.images != "off",
                         similarity=similarity)

    def answer(self, question: str, evidence: Sequence[Union[EvidenceItem, Mapping[str, Any]]], *,
               max_tokens: Optional[int] = None, on_token: Optional[Callable[[str], None]] = None,
               on_retry: Optional[Callable[[str], None]] = None, seed: Optional[int] = None,
               whole: bool = False, similarity=None) -> ReaderAnswer:
        """Answers ``question`` from ``evidence`` (best first).

        The evidence is fitted to the token budget in rank order (:meth:`fit`), then numbered [1].. in the prompt
        in :func:`reading_order` (the answer's citations come back numbered as ``evidence``), visual notes
        as images or as text (``config.images``); the last notes are left out where the server still finds
        the request too long (:func:`send_evidence`). A reply that is no answer (citation markers only, the
        evidence headers echoed, a loop: :func:`cdsjax.io.replies.no_answer`) is asked again once with a
        stricter instruction; failing that, the answer's ``no_answer`` says why and its ``text`` is "".

        Args:
          max_tokens: new-token limit for this call (default ``config.max_tokens``).
          on_token: streams the answer: called with each piece of text as it is written, once it is an
            answer (:class:`cdsjax.io.replies.ReplyGuard` holds back markers and echoed headers, and ends a
            stream that echoes the evidence or loops at once); None sends one request without streaming.
          on_retry: called with the reason (a key of :data:`cdsjax.io.replies.NO_ANSWER`) before the second
            request, so a display can drop what it showed of the first.
          seed: the sampling seed sent to the server; None sends none.
          whole: send every note whole, whatever the token budget (the evaluation's ``full`` control).
          similarity: ``similarity(question, sentences)`` -> scores, for trimming (default: word overlap).

        Raises:
          ReaderError: the server could not give a reply (after retries where retrying makes sense).
        """
        items = as_evidence(evidence)
        fitted = self.fit(question, items, whole=whole, similarity=similarity)
        problem, retried, first, sent, reply, cached = None, None, None, None, None, False
        for strict in (False, True):
            shown: dict = {}  # the guard and the citation renumbering of the request last sent

            def send(messages, kept):
                guard = None
                if on_token is not None:  # the answer as written, its citations numbered as the caller's evidence
                    shown["stream"] = CitationStream(on_token, prompt_numbers(items, kept))
                    shown["guard"] = guard = ReplyGuard(shown["stream"])
                return self.reply(messages, max_tokens=max_tokens, seed=seed, on_token=guard)

            sent = send_evidence(self, question, fitted.items, send, max_text_chars=self.config.max_text_chars,
                                 strict=strict, known=self._known(max_tokens, seed))
            reply, cached = sent.result
            first = reply.first_token_s if first is None else first
            guard = shown.get("guard")
            problem = (guard.problem if guard is not None else None) or \
                no_answer(reply.content, finish_reason=reply.finish_reason)
            if problem is None:
                if guard is not None:
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
        handed to ``on_token`` whole. ``on_use`` is called before and after a request that reaches the server."""
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
        if self.on_use is not None:
            self.on_use()
        try:
            return self.chat(messages, max_tokens=max_tokens, seed=seed, on_token=on_token)
        finally:
            if self.on_use is not None:
                self.on_use()


def fit_items(question: str, items: Sequence[EvidenceItem], token_budget: Optional[int], *,
              max_text_chars: Optional[int], images: bool = True, similarity=None) -> Fitted:
    """:func:`cdsjax.io.evidence_fit.fit_evidence` for reader evidence: a note's text as
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


def note_text(item: EvidenceItem, max_text_chars: Optional[int]) -> str:
    """A note's text as the reader's prompt holds it: at most ``max_text_chars`` characters, or the note's own
    ``max_chars`` where it was cut to fit the token budget."""
    if item.max_chars is not None:
        max_text_chars = item.max_chars if max_text_chars is None else min(max_text_chars, item.max_chars)
    return _visual_text(item, max_text_chars) if item.is_visual else _cut(item.text or item.summary, max_text_chars)
