"""The result of one question (:class:`Answer`), the warnings it carries, and its reading.

* :class:`Answer` — question, answer text, evidence, selector, diagnostics, timings, reader fields, warnings:
  what ``cdsjax ask --json`` prints;
* :func:`convergence_warning` and :func:`scanned_warning` — the one-line warnings of an unconverged CDS solve and
  of evidence from pages without a text layer;
* :func:`read_answer` — the reader's answer filled into an :class:`Answer` (through
  :meth:`cdsjax.io.reading.reader.Reader.answer`, the one reading path), and :func:`reader_fields`, its ``reader`` object.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence

from cdsjax import core
from cdsjax.pipeline import catalog
from cdsjax.pipeline.catalog import DEFAULT_SELECTOR
from cdsjax.pipeline.corpus import Corpus


@dataclasses.dataclass
class Answer:
    """The result of one question.

    Attributes:
      question: the question.
      answer: the reader's answer text, or None when no reader is configured.
      evidence: the selected notes, best first: dicts with rank (1-based), score,
        document, page (0-based), bbox, kind, text (text or caption, cut to
        1500 chars), note_id, image_path; after reading (and in ``ask`` before it, as planned), ``read``: what
        the reader got of the note (:func:`mark_read`).
      selector: selector name as users write it (``cds-converged``, ``cds-paper``,
        ``cosine``, ...); budget: the evidence budget.
      diagnostics: solver diagnostics for CDS (solver, mode "paper" | "converged",
        num_iters, converged, status = how the solve ended ("converged" | "max_steps" |
        "nonfinite" | "singular"), kkt_residual, objective, support_size = notes with
        weight > 1e-6, alpha, query_weight), else {}.
      timings: seconds, on one clock: stage durations (``encode``, ``select``, ``read``; ``load`` in ``ask``) and
        points in time from the start (the selection's, or the command's in ``ask``): ``evidence`` (``ask``),
        ``first_token`` (the first piece of the answer shown) and ``total``; ``first_token <= total`` always.
      reader: model, cited evidence ranks, abstained, latency — or None.
      error: when reading failed, {"kind", "message", "server"} (``answer`` is then None), else None.
      warnings: one-line warnings (e.g. a CDS solve that ended unconverged).
      relevance: what ranked the notes (:meth:`cdsjax.io.relevance.Relevance.describe`): ``mode`` (``dense`` |
        ``hybrid``) and, for hybrid, ``lexical_weight``.
      abstained: True when the selection was judged, before reading, not to answer the question
        (:mod:`cdsjax.pipeline.abstain`): the reader is not asked and the answer says so.
      abstention: the judgement (:meth:`cdsjax.pipeline.abstain.Judgement.to_dict`: abstained, score, feature,
        threshold, enabled), or None when none was made.
    """

    question: str
    answer: Optional[str]
    evidence: List[dict]
    selector: str
    budget: int
    diagnostics: Dict[str, Any]
    timings: Dict[str, float]
    reader: Optional[Dict[str, Any]] = None
    error: Optional[Dict[str, Any]] = None
    warnings: List[str] = dataclasses.field(default_factory=list)
    relevance: Dict[str, Any] = dataclasses.field(default_factory=dict)
    abstained: bool = False
    abstention: Optional[Dict[str, Any]] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def reader_fields(result, local: Optional[dict] = None) -> Dict[str, Any]:
    """The ``reader`` object of ``ask --json`` from a :class:`cdsjax.io.reading.reader.ReaderAnswer`."""
    out = dict(model=result.model, cited=list(result.cited), abstained=result.abstained, latency_s=result.latency_s,
               first_token_s=result.first_token_s, usage=result.usage, warnings=list(result.warnings),
               image_mode=result.image_mode, dropped=result.dropped, evidence_tokens=result.evidence_tokens,
               trimmed=result.trimmed, no_answer=result.no_answer, retried=result.retried,
               finish_reason=result.finish_reason)
    if result.no_answer is not None:
        out["reply"] = result.raw  # what the reader wrote instead of an answer
    if local is not None:  # a local server: which runtime, threads, slots, and whether it was already warm
        out["local"] = dict(local)
    return out


def convergence_warning(diagnostics: Dict[str, Any]) -> Optional[str]:
    """One line when a CDS solve ended unconverged (how it ended, the residual and the way out), else None."""
    if not diagnostics or diagnostics.get("converged", True):
        return None
    ended = {"nonfinite": "ended on non-finite weights (NaN or inf)",
             "singular": "stopped on a singular Newton system"}.get(diagnostics.get("status"), "stopped unconverged")
    head = (f"CDS {diagnostics['mode']} mode {ended} after {diagnostics['num_iters']} steps "
            f"(KKT residual {diagnostics['kkt_residual']:.1e}); its evidence may be near-arbitrary")
    reference = catalog.display(catalog.REFERENCE_SELECTOR)
    if core.ran_paper_mode(diagnostics):
        return (head + f" — use --selector {catalog.display(DEFAULT_SELECTOR)} (the default) for the equilibrium, "
                f"or {reference}")
    default_solver = core.SPECS[DEFAULT_SELECTOR].solver
    other = next(catalog.display(s.name) for s in core.SPECS.values()
                 if s.converged_mode and s.solver != default_solver)
    return head + f" — try --selector {other} or {reference}"


def scanned_warning(evidence: List[dict], corpus: Corpus) -> Optional[str]:
    """One line when evidence comes from pages without a text layer (scanned pages: their text is OCR output, or
    there is only the page image); None otherwise. ``load_index`` sets the ``corpus`` notes' ``no_text_layer``
    and ``ocr`` fields."""
    scanned = []
    for e in evidence:
        note = corpus.notes[corpus.note_index(e["note_id"])]
        if note.get("no_text_layer"):
            scanned.append((e["rank"], e["document"], e["page"], note.get("ocr")))
    if not scanned:
        return None
    states = sorted({s or "unknown" for *_, s in scanned})
    where = ", ".join(f"[{r}] {d} p.{p + 1}" for r, d, p, _ in scanned[:6]) + (" ..." if len(scanned) > 6 else "")
    how = ("their text was read by OCR and may hold errors" if states == ["done"] else
           "they were indexed as page images without text (install tesseract-ocr and index again)")
    return (f"{len(scanned)} of {len(evidence)} evidence notes come from pages without a text layer "
            f"({where}; OCR: {'/'.join(states)}): {how}")


# What the reader got of a selected note (an evidence dict's "read"): all of it, part of it (its sentences nearest
# the question, or a visual's text cut, to fit the token budget), or nothing (left out: past the token budget, or
# the request was too long for the server).
READ_WHOLE, READ_PART, READ_LEFT_OUT = "whole", "part", "left out"


def mark_read(evidence: List[dict], items: Sequence[Any], sent: Sequence[Any]) -> None:
    """Sets each evidence dict's ``read`` (:data:`READ_WHOLE`, :data:`READ_PART` or :data:`READ_LEFT_OUT`), in
    place, from the reader items of the evidence (``items``, in its order) and the items the reader was sent
    (``sent``: :attr:`cdsjax.io.reading.reader.ReaderAnswer.evidence`, or :attr:`cdsjax.io.reading.evidence_fit.Fitted.items` as
    planned). A visual sent as its text without its crop counts as whole: its text was not cut."""
    by_id = {str(i.note_id): i for i in sent}
    for e, item in zip(evidence, items):
        got = by_id.get(str(item.note_id))
        if got is None:
            e["read"] = READ_LEFT_OUT
        elif (got.text, got.summary, got.max_chars) != (item.text, item.summary, item.max_chars):
            e["read"] = READ_PART
        else:
            e["read"] = READ_WHOLE


def read_answer(reader, answer: Answer, items: Sequence[Any], options=None, *, on_token=None,
                on_retry=None, started: Optional[float] = None) -> Answer:
    """Has ``reader`` (a :class:`cdsjax.io.reading.reader.Reader`) answer ``answer.question`` from ``items`` (the
    reader's :class:`~cdsjax.io.reading.reader.EvidenceItem` of ``answer.evidence``), in place, through the one reading
    path (:meth:`cdsjax.io.reading.reader.Reader.answer`): the evidence fitted to the read's token budget
    (``options``, a :class:`cdsjax.io.reading.options.ReadOptions`), the note that does not fit cut to its
    sentences nearest the question (``options.similarity``), the answer
    streamed to ``on_token`` as it is written, and a reply that is no answer asked again once.

    A failed read does not lose the selection: ``answer.answer`` stays None and ``answer.error`` says why; a reply
    that stays no answer leaves ``answer.answer`` None and ``answer.reader["no_answer"]`` says why. Each evidence
    dict's ``read`` says what the reader got of it (:func:`mark_read`; removed when the read failed).

    Timings are on one clock (:class:`Answer`): ``started`` is its origin (a ``time.perf_counter()`` value; None:
    the selection's start, ``answer.timings["total"]`` before now); ``read`` is this call's duration, ``total`` and
    ``first_token`` (the first piece passed to ``on_token``, the one a person sees; else the reader's own) are
    measured from the origin, so ``first_token <= total``.
    """
    from cdsjax.io.reading.llm.errors import ReaderError
    from cdsjax.io.reading.reader import error_dict

    if answer.abstained:  # judged before reading: the reader is not asked
        answer.answer = abstained_reply(answer.abstention or {})
        if on_token is not None:
            on_token(answer.answer)
        return answer
    t0 = time.perf_counter()
    origin = started if started is not None else t0 - answer.timings.get("total", 0.0)
    seen: list = []

    def token(piece):
        if not seen:
            seen.append(time.perf_counter())
        on_token(piece)

    def retry(reason):
        seen.clear()  # what was shown of a reply that was no answer is dropped; the answer's first piece counts
        if on_retry is not None:
            on_retry(reason)

    try:
        result = reader.answer(answer.question, items, options, on_token=token if on_token is not None else None,
                               on_retry=retry)
    except ReaderError as err:  # the selection is kept: answer stays None and ``error`` says why
        result = None
        answer.error = error_dict(err)
    end = time.perf_counter()
    answer.timings["read"] = end - t0
    answer.timings["total"] = end - origin
    if result is None:
        for e in answer.evidence:
            e.pop("read", None)
    else:
        mark_read(answer.evidence, items, result.evidence)
        if seen:
            answer.timings["first_token"] = seen[0] - origin
        elif result.first_token_s is not None:
            answer.timings["first_token"] = min(t0 - origin + result.first_token_s, answer.timings["total"])
        answer.answer = result.text if result.no_answer is None else None
        answer.reader = reader_fields(result, getattr(reader, "local", None))
        answer.warnings.extend(result.warnings)  # e.g. a missing crop sent as text
        if result.no_answer is not None:
            from cdsjax.io.reading.replies import describe_no_answer

            answer.warnings.append(describe_no_answer(result.no_answer))
    return answer


def abstained_reply(abstention: Dict[str, Any]) -> str:
    """The reply of an abstained question: the documents do not answer it, the score that decided it."""
    from cdsjax.pipeline.abstain import NOT_IN_DOCUMENTS

    score, threshold = abstention.get("score"), abstention.get("threshold")
    if score is None or threshold is None:
        return NOT_IN_DOCUMENTS
    return (f"{NOT_IN_DOCUMENTS} (the evidence is weak: {abstention.get('feature')} {score:.3f} < {threshold:.3f}; "
            "the notes above were not read; --no-abstain reads them)")
