"""VLM enrichment of notes through an OpenAI-compatible chat endpoint (vLLM, or any hosted API).

Three passes, each one request per note, sent concurrently (``config.enrich.concurrency``):

1. describe: the model sees the note's text (and its crop, for figures/tables/charts) and returns
   JSON ``{"summary", "keywords", "tags"}``;
2. verify links (``verify_links``): the model sees a note and its structural candidate links
   (:func:`cdsjax.io.notes.structural_links`) and returns the ids it considers related; unconfirmed
   candidates are dropped, caption<->visual links are always kept;
3. evolve (``evolution_rounds`` T): in each round every note sees its linked neighbours' current
   summaries and may rewrite its own summary/keywords/tags (all notes update from the same snapshot).

Requests go through :class:`VLMClient` (the one chat client, :mod:`cdsjax.io.reading.llm`, with its retries)
and replies are read by :func:`cdsjax.io.reading.replies.find_json`. A note whose describe request fails (HTTP
error, a reply that is not a JSON object) keeps its lite values and is marked ``enrichment="lite-fallback"`` (a described note is ``"vlm"``); the failures are
counted with their reasons in a :class:`VLMReport`, and failed notes take no part in the later passes.
After ``FAILURE_LIMIT`` failures in a row with no success at all the server is taken to be broken and the
remaining notes are not sent. An unreachable endpoint raises :class:`VLMError` with one line naming the URL.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from cdsjax.io.elements import Element
from cdsjax.io.reading.llm.client import ChatClient
from cdsjax.io.reading.llm.config import ReaderConfig
from cdsjax.io.reading.llm.errors import FATAL_KINDS, ReaderError
from cdsjax.io.reading.replies import find_json, read_bool

DESCRIBE_PROMPT = """\
[cdsjax:describe]
You write index cards for passages, figures and tables taken from a document, so that a search \
system can later find the right card for a question.
Reply with one JSON object and nothing else:
{"summary": "<2-4 sentences: what this element states or shows, with its key numbers, names and \
units>", "keywords": ["<5-10 short search terms>"], "tags": ["<1-4 coarse topic labels>"]}
Stay faithful to the element; do not add facts it does not contain."""

VERIFY_PROMPT = """\
[cdsjax:verify-links]
You check links between index cards of the same document. You get one anchor card and candidate \
cards, each with an id. A link is right when reading one card helps to understand or answer \
questions about the other (same topic, one explains or depicts the other, one refers to the other).
Reply with one JSON object and nothing else: {"related": [<ids of the candidates that should stay \
linked>]}"""

EVOLVE_PROMPT = """\
[cdsjax:evolve]
You maintain an index card of a document element. You get the card and the cards linked to it. \
If the neighbours make clear what the element is about (for example a caption naming the figure, \
or a passage explaining a table), improve the card; otherwise keep it.
Reply with one JSON object and nothing else:
{"update": true or false, "summary": "<the card's summary>", "keywords": ["..."], "tags": ["..."]}"""


FAILURE_LIMIT = 8  # describe failures in a row, before any success, that stop a document's requests


class VLMError(RuntimeError):
    """The enrichment endpoint cannot be used (one line naming the URL)."""


@dataclasses.dataclass
class VLMReport:
    """What VLM enrichment of one document did.

    Attributes:
      described: notes the VLM described (``enrichment == "vlm"``).
      failed: notes left with lite values (``"lite-fallback"``).
      reasons: failure reason -> count (e.g. ``"HTTP 500"``, ``"reply is not a JSON object"``).
      requests: requests sent.
      url: the endpoint.
    """

    described: int = 0
    failed: int = 0
    reasons: Dict[str, int] = dataclasses.field(default_factory=dict)
    requests: int = 0
    url: str = ""

    def reason_text(self) -> str:
        return ", ".join(f"{r} x{n}" for r, n in sorted(self.reasons.items(), key=lambda t: -t[1]))


def _str_list(value, limit: int) -> Optional[List[str]]:
    if not isinstance(value, list):
        return None
    out = [" ".join(str(v).split()) for v in value if isinstance(v, (str, int, float)) and str(v).strip()]
    return out[:limit]


class VLMClient(ChatClient):
    """The chat client (:class:`~cdsjax.io.reading.llm.client.ChatClient`: one retry policy for every model call) as the
    enrichment VLM: errors name "the VLM"; an empty ``enrich.vlm_api_key`` reads ``CDSJAX_VLM_API_KEY``,
    then ``OPENAI_API_KEY``."""

    env_prefix = "CDSJAX_VLM"
    key_fallbacks = ("OPENAI_API_KEY",)
    role = "VLM"

    @classmethod
    def from_config(cls, config) -> "VLMClient":
        """The client ``config.enrich`` describes (URL, model, key, timeout per call, retries, max_tokens)."""
        cfg = config.enrich
        return cls(ReaderConfig(base_url=str(cfg.vlm_url), model=str(cfg.vlm_model) or None,
                                api_key=str(cfg.vlm_api_key or "") or None, timeout=float(cfg.timeout),
                                max_retries=int(cfg.max_retries), backoff=0.5, max_backoff=8.0,
                                max_tokens=int(cfg.max_tokens), temperature=0.0,
                                concurrency=max(1, int(cfg.concurrency))))

    def ask(self, system: str, content) -> Tuple[Optional[str], str]:
        """``(reply text, "")``, or ``(None, reason)`` when the request failed for this note.

        Raises:
          VLMError: the endpoint cannot be used at all (unreachable, too slow, refused key, unknown model).
        """
        try:
            reply = self.chat([{"role": "system", "content": system}, {"role": "user", "content": content}])
        except ReaderError as err:
            if err.kind in FATAL_KINDS + ("timeout",):
                raise VLMError(str(err)) from None
            return None, f"HTTP {err.status}" if err.status else err.kind.replace("_", " ")
        return reply.content, ""


def _image_part(path: Optional[str], image_root: Optional[Path]):
    if not path:
        return None
    full = Path(path) if Path(path).is_absolute() or image_root is None else Path(image_root) / path
    try:
        data = full.read_bytes()
    except OSError:
        return None
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def _card(note, *, max_chars: int) -> str:
    lines = [f"kind: {note.kind}", f"page: {note.page + 1}"]
    if note.caption:
        lines.append(f"caption: {note.caption}")
    if note.footnote:
        lines.append(f"footnote: {note.footnote}")
    text = " ".join(note.text.split())[:max_chars]
    if text:
        lines.append(f"text: {text}")
    return "\n".join(lines)


def _summary_card(note, ident: int) -> str:
    kw = ", ".join(note.keywords[:8])
    return f"[{ident}] ({note.kind}, page {note.page + 1}) {note.summary}" + (f" keywords: {kw}" if kw else "")


def enrich_vlm(notes, elements: Sequence[Element], edges: Set[Tuple[int, int]], *, config,
               image_root: Optional[Path] = None):
    """Rewrites notes' summary/keywords/tags with a VLM, verifies links, runs the evolution rounds.

    Args:
      notes: one document's notes (lite-enriched; updated in place).
      elements: the matching elements.
      edges: candidate links ``(i, j)``, ``i < j``, indices into ``notes``.
      config: the full config (``config.enrich`` is read).
      image_root: directory that ``note.image_path`` is relative to.

    Returns:
      ``(notes, edges)`` with the verified edge set.
    """
    notes, edges, _ = enrich_vlm_report(notes, elements, edges, config=config, image_root=image_root)
    return notes, edges


def enrich_vlm_report(notes, elements: Sequence[Element], edges: Set[Tuple[int, int]], *, config,
                      image_root: Optional[Path] = None, only: Optional[Sequence[int]] = None):
    """:func:`enrich_vlm`, returning ``(notes, edges, VLMReport)``.

    Args:
      only: indices of the notes to (re)describe, e.g. the ``lite-fallback`` notes of an earlier run; the
        others keep their values and status. With ``only`` given, links are not re-verified and there are no
        evolution rounds (they already ran for the document).
    """
    cfg = config.enrich
    client = VLMClient.from_config(config)
    max_chars = int(cfg.max_text_chars)
    workers = max(1, int(cfg.concurrency))
    report = VLMReport(url=client.url)
    lock = threading.Lock()
    state = dict(ok=0, run=0)  # successes so far, failures in a row
    reasons = collections.Counter()

    def send(system, content):
        with lock:
            if state["ok"] == 0 and state["run"] >= FAILURE_LIMIT:
                return None, f"not sent after {FAILURE_LIMIT} failures in a row"
            report.requests += 1
        text, reason = client.ask(system, content)
        reply = find_json(text) if text is not None else None
        if text is not None and reply is None:
            reason = "reply is not a JSON object"
        with lock:
            if reply is None:
                state["run"] += 1
            else:
                state["ok"] += 1
                state["run"] = 0
        return reply, reason

    def describe(i: int):
        note = notes[i]
        parts = [{"type": "text", "text": _card(note, max_chars=max_chars)}]
        img = _image_part(note.image_path, image_root) if note.kind != "text" else None
        if img:
            parts.append(img)
        return send(DESCRIBE_PROMPT, parts)

    todo = list(range(len(notes))) if only is None else sorted(set(only))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, (reply, reason) in zip(todo, pool.map(describe, todo)):
            if reply is not None and _apply(notes[i], reply):
                notes[i].enrichment = "vlm"
            else:
                notes[i].enrichment = "lite-fallback"
                reasons[reason or "reply without summary, keywords or tags"] += 1
    report.described = sum(n.enrichment == "vlm" for n in notes)
    report.failed = sum(n.enrichment == "lite-fallback" for n in notes)
    report.reasons = dict(reasons)
    if only is not None or report.described == 0:
        return notes, edges, report
    failed = {i for i, n in enumerate(notes) if n.enrichment != "vlm"}

    if cfg.verify_links and edges:
        keep = {(min(i, j), max(i, j)) for i, j in edges if _structural_pair(elements, i, j)}
        anchors: Dict[int, List[int]] = {}
        for i, j in sorted(edges):
            anchors.setdefault(i, []).append(j)

        def verify(item):
            i, cands = item
            text = "anchor:\n" + _summary_card(notes[i], i) + "\n\ncandidates:\n" + "\n".join(
                _summary_card(notes[j], j) for j in cands)
            reply = send(VERIFY_PROMPT, text)[0]
            if reply is None or not isinstance(reply.get("related"), list):
                return i, list(cands)  # unreadable reply: keep the structural candidates
            said = {int(x) for x in reply["related"] if isinstance(x, (int, float, str)) and str(x).strip().lstrip("-").isdigit()}
            return i, [j for j in cands if j in said]

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for i, kept in pool.map(verify, sorted(anchors.items())):
                keep.update((i, j) for j in kept)
        edges = keep

    neighbours: Dict[int, List[int]] = {i: [] for i in range(len(notes))}
    for i, j in edges:
        neighbours[i].append(j)
        neighbours[j].append(i)
    for _ in range(int(cfg.evolution_rounds)):
        snapshot = [(n.summary, list(n.keywords)) for n in notes]

        def evolve(i: int):
            if not neighbours[i] or i in failed:
                return None
            own = notes[i]
            text = "card:\n" + _summary_card(own, i) + "\n\nlinked cards:\n" + "\n".join(
                f"[{j}] ({notes[j].kind}, page {notes[j].page + 1}) {snapshot[j][0]}" for j in sorted(neighbours[i]))
            return send(EVOLVE_PROMPT, text)[0]

        with ThreadPoolExecutor(max_workers=workers) as pool:
            replies = list(pool.map(evolve, range(len(notes))))
        for note, reply in zip(notes, replies):
            if reply and read_bool(reply.get("update"), threshold=None):
                _apply(note, reply)
    return notes, edges, report


def _apply(note, reply: Optional[dict]) -> bool:
    """Copies a reply's summary/keywords/tags onto the note; True if it carried any of them."""
    if not reply:
        return False
    applied = False
    summary = reply.get("summary")
    if isinstance(summary, str) and summary.strip():
        note.summary = " ".join(summary.split())
        applied = True
    keywords = _str_list(reply.get("keywords"), 12)
    if keywords:
        note.keywords = keywords
        applied = True
    tags = _str_list(reply.get("tags"), 6)
    if tags:
        note.tags = tags
        applied = True
    return applied


def _structural_pair(elements: Sequence[Element], i: int, j: int) -> bool:
    """Caption <-> the visual it describes: kept without asking."""
    a, b = elements[i], elements[j]
    return (a.role in ("caption", "footnote") and a.parent == b.reading_order) or (
        b.role in ("caption", "footnote") and b.parent == a.reading_order)
