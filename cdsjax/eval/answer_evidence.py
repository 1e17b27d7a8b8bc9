"""What the reader stage needs of a question besides the reader: each note as the reader sees it
(:class:`EvidenceSource`), the ``full`` control's notes and whether they fit, the gold answers, the judge's
cached verdict, and the scores read off the evidence (:func:`cites_gold`, :func:`sent_has_answer`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from cdsjax.io.reading.reply_cache import ReplyCache, content_hash, reply_key

JUDGE_PROMPT_VERSION = "judge-1"


def _item_from_index_note(note: dict, note_id: str, rank: int):
    from cdsjax.io.reading.prompt import KINDS, EvidenceItem

    kind = note.get("kind", "text")
    if kind not in KINDS:
        kind = "figure" if note.get("image_path") else "text"
    bbox = note.get("bbox")
    return EvidenceItem(note_id=note_id, doc_id=str(note.get("doc_id") or note_id.split("#")[0]),
                        page=int(note.get("page", 0)), kind=kind, text=note.get("text") or "",
                        summary=note.get("summary") or "", caption=note.get("caption") or "",
                        bbox=tuple(float(v) for v in bbox) if bbox is not None else None,
                        image_path=note.get("image_path"), rank=rank, ocr_text=note.get("ocr_text") or "")


class EvidenceSource:
    """The reader's view of each note of the problems (:class:`~cdsjax.io.reading.prompt.EvidenceItem` by note id): a
    text benchmark's paragraphs, or a PDF's index notes with their image crops."""

    def __init__(self, problems, *, kind: str, indexes: Optional[Dict[str, Any]] = None):
        self.kind = kind
        self.notes: Dict[str, dict] = {}
        if indexes is not None:
            for doc_id, idx in indexes.items():
                for note in idx.notes:
                    self.notes[f"{doc_id}#{note['reading_order']}"] = dict(note, doc_id=doc_id)
        else:
            for p in problems:
                for nid, doc, text in zip(p.note_ids, p.docs, p.texts or [""] * len(p.note_ids)):
                    self.notes.setdefault(nid, {"doc_id": doc, "page": 0, "kind": "text", "text": text})

    def items(self, note_ids: Sequence[str]) -> list:
        return [_item_from_index_note(self.notes[n], n, r) for r, n in enumerate(note_ids, 1)]


def _estimated_tokens(items, max_text_chars: int) -> int:
    from cdsjax.io.reading.evidence_fit import TOKENS_PER_IMAGE, estimate_tokens
    from cdsjax.io.reading.reader import PROMPT_RESERVE_TOKENS
    from cdsjax.io.reading.prompt import note_text

    images = sum(1 for i in items if i.is_visual and i.image_path)
    return sum(estimate_tokens(note_text(i, max_text_chars)) for i in items) + TOKENS_PER_IMAGE * images \
        + PROMPT_RESERVE_TOKENS


def fits_reader(items, *, max_context: int, max_images: int, max_tokens: int, max_text_chars: int) -> bool:
    """Whether a request with evidence ``items`` fits the reader: its estimated prompt (3 characters a token,
    a fixed cost per image and for the prompt) plus ``max_tokens`` within ``max_context`` tokens, and at most
    ``max_images`` images (0: any number)."""
    images = sum(1 for i in items if i.is_visual and i.image_path)
    if max_images and images > max_images:
        return False
    return _estimated_tokens(items, max_text_chars) + max_tokens <= max_context


def full_document_ids(problem) -> List[str]:
    """The notes the ``full`` control sends: every note of the question's own documents in the problem's order
    (a pool's distractor documents left out), or every note of the problem where it names no own documents."""
    own = set(problem.gold_docs or ())
    if not own:
        return list(problem.note_ids)
    return [n for n, d in zip(problem.note_ids, problem.docs) if d in own]


def judge_call(judge, cache: ReplyCache, question: str, gold: str, predicted: str) -> float:
    from cdsjax.io.reading.judge import parse_verdict
    from cdsjax.io.reading.llm.errors import ReaderError

    key = reply_key(kind="judge", model=judge.config.model, prompt=JUDGE_PROMPT_VERSION,
                    prompt_hash=content_hash(judge.prompt), question=question, gold=gold, predicted=predicted)

    def fetch():
        verdict = judge.judge(question, gold, predicted)
        return {"correct": bool(verdict.correct), "score": float(verdict.score), "raw": verdict.raw}

    hit, _ = cache.get_or_fetch(key, fetch)
    try:
        parse_verdict(hit["raw"]) if hit.get("raw") else None
    except ValueError as err:  # a cached reply the current parser cannot read
        raise ReaderError(f"judge reply unreadable: {err}", kind="bad_response") from None
    return float(hit["correct"])


def cites_gold(query, evidence: Sequence[Any], text: str) -> Optional[float]:
    """1.0 when the answer cites (``[n]``) a gold note — a gold paragraph on text benchmarks, a note on a gold
    page on PDF benchmarks — 0.0 when it cites none (or nothing), None without evidence or without gold."""
    from cdsjax.io.reading.replies import parse_citations

    if not evidence or not (query.gold_note_ids or query.gold_pages):
        return None

    def gold(item) -> bool:
        if item.note_id in query.gold_note_ids:
            return True
        return item.page in query.gold_pages.get(item.doc_id, ())

    cited = parse_citations(text, len(evidence))
    return float(any(gold(evidence[n - 1]) for n in cited))


def sent_has_answer(query, sent: Sequence[Any], max_text_chars: Optional[int]) -> Optional[float]:
    """1.0 when the evidence as the reader got it (``sent``: its text as the prompt held it, a cut note's kept
    sentences) holds the gold answer's text (:func:`cdsjax.eval.answers.has_answer`), 0.0 when not; None where
    the question has no answer text to look for (unanswerable, or a gold answer not found in its documents'
    words) or nothing was sent."""
    from cdsjax.eval.answers import answer_targets, has_answer
    from cdsjax.io.reading.prompt import note_text

    targets = answer_targets(query)
    if not targets or not sent:
        return None
    return has_answer([note_text(i, max_text_chars) for i in sent], targets)


def gold_answers(query) -> List[str]:
    from cdsjax.io.reading.reader import ABSTAIN

    meta = query.meta or {}
    answers = list(meta.get("answers") or ([query.answer] if query.answer is not None else []))
    out = [ABSTAIN if a.strip().lower() in ("unanswerable", "not answerable") else a for a in answers if a]
    return list(dict.fromkeys(out))


def sentence_similarity(embedder):
    """``similarity(question, sentences)`` under ``embedder`` (cosine): what trimming a note to the reader's token
    budget keeps, as ``ask`` does with the index's embedder."""
    def similarity(question: str, sentences) -> list:
        vectors = np.asarray(embedder.encode_queries([question, *sentences]), dtype=np.float64)
        return (vectors[1:] @ vectors[0]).tolist()

    return similarity
