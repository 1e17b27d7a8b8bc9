"""Scoring one selection: the retrieval metrics a benchmark's gold supports, as plain numbers (what each record
holds beside the solver's diagnostics, :func:`cdsjax.core.diagnostics.diagnostics`)."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

import cdsjax.eval.metrics as M
from cdsjax.eval.answers import has_answer
from cdsjax.eval.problems import Problem

# Metric order in tables; a benchmark reports the ones its gold supports.
# has_answer (cdsjax.eval.answers): the selected notes' text holds a gold answer; scored where the problem has note
# texts and the question an answer the metric covers (None otherwise, so its n says how many questions it covers)
METRICS_PDF = ("page_recall", "has_answer", "box_recall", "all_pages_found", "distinct_pages", "redundancy")
METRICS_TEXT = ("paragraph_recall", "has_answer", "all_found", "best_annotator_recall", "redundancy")
METRICS_VISDOM = ("page_recall", "has_answer", "doc_recall", "distinct_pages", "redundancy")
# Scored when a question searches several documents (pools, the open corpus, VisDoM).
METRICS_POOL = ("gold_doc_share", "gold_doc_hit", "distinct_docs")
DIAGNOSTICS = ("num_iters", "converged", "kkt_residual", "objective", "support_size", "step")
# Diagnostics summarised next to the metrics (support_size: notes only; whole_support: the
# share of questions whose support is every note; num_filled: picks from outside the support).
SUMMARY_DIAGNOSTICS = ("converged", "kkt_residual", "num_iters", "support_size", "whole_support", "num_filled")


def metric_names(kind: str, pooled: bool = False) -> Tuple[str, ...]:
    """The metrics of a benchmark kind (``"pdf"``, ``"visdom"``, ``"text"``), with the pool metrics when
    questions search several documents."""
    names = {"pdf": METRICS_PDF, "visdom": METRICS_VISDOM, "text": METRICS_TEXT}[kind]
    return names + METRICS_POOL if pooled else names


def _finite_or_none(v: float) -> Optional[float]:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def score_problem(problem: Problem, selection: Any, *, kind: str) -> Dict[str, Optional[float]]:
    """The retrieval metrics of one selection.

    Args:
      problem: the problem that was solved.
      selection: its Selection (NumPy leaves).
      kind: ``"pdf"`` (page / box metrics), ``"visdom"`` (page / document metrics) or
        ``"text"`` (paragraph metrics).

    Returns:
      ``metric -> value``; None where the query has no gold for that metric.
    """
    idx = np.asarray(selection.indices)[np.asarray(selection.selected_valid, bool)]
    idx = [int(i) for i in idx]
    q = problem.query
    out: Dict[str, Optional[float]] = {"num_selected": float(len(idx))}
    if kind in ("pdf", "visdom"):
        pages = [(problem.docs[i], problem.pages[i]) for i in idx]
        pr = M.page_recall(pages, q.gold_pages)
        out["page_recall"] = pr
        out["distinct_pages"] = float(M.distinct_pages(pages))
        if kind == "pdf":
            out["all_pages_found"] = M.all_found(pr)
            regions = [(problem.docs[i], problem.pages[i], problem.boxes[i]) for i in idx]
            out["box_recall"] = M.box_recall(regions, q.gold_boxes)
        else:
            out["doc_recall"] = M.doc_recall([problem.docs[i] for i in idx], q.gold_pages.keys())
    elif kind == "text":
        chosen = [problem.note_ids[i] for i in idx]
        rec = M.paragraph_recall(chosen, q.gold_note_ids)
        out["paragraph_recall"] = rec
        out["all_found"] = M.all_found(rec)
        if "gold_per_annotator" in q.meta:
            out["best_annotator_recall"] = M.best_annotator_recall(
                chosen, q.meta["gold_per_annotator"])
    else:
        raise ValueError(f"kind must be 'pdf', 'visdom' or 'text', got {kind!r}")
    out["has_answer"] = answer_hit(problem, idx)
    out["redundancy"] = M.redundancy(np.asarray(problem.notes)[idx]) if idx else float("nan")
    if problem.gold_docs is not None:
        out.update(score_pool(problem, idx))
    return {k: _finite_or_none(v) for k, v in out.items()}


def answer_hit(problem: Problem, idx: Sequence[int]) -> float:
    """has-answer of the selected note positions ``idx`` (:func:`cdsjax.eval.answers.has_answer`): 1.0 when their
    text holds one of the problem's covered gold answers (:meth:`Problem.answer_targets`), 0.0 when not, NaN when
    the question is not covered."""
    targets = problem.answer_targets()
    if targets is None:
        return float("nan")
    return has_answer([problem.texts[i] for i in idx], targets)


def score_pool(problem: Problem, idx: Sequence[int]) -> Dict[str, float]:
    """The pool metrics of selected note positions ``idx``: share of selected notes from
    a gold document, whether any is, and how many documents the selection spans."""
    docs = [problem.docs[i] for i in idx]
    gold = problem.gold_docs or ()
    return {"gold_doc_share": M.gold_doc_share(docs, gold), "gold_doc_hit": M.gold_doc_hit(docs, gold),
            "distinct_docs": float(M.distinct_docs(docs))}


