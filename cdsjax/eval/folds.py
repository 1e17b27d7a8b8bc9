"""Cross-validation by document: folds over a benchmark's documents, and the problems of a fold.

A question belongs to the fold of its document; its candidate pool is drawn only from documents of
the same side of the split (the fold's test documents, or its training documents), so no note of a
test document is ever seen while fitting or tuning, not even as a distractor.

* :func:`document_folds` — ``k`` seeded folds over the documents.
* :func:`validation_split` — a seeded share of the training documents held out for early stopping.
* :func:`split_problems` — the problems of the questions of some documents, pools drawn inside them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from cdsjax.eval.pools import DocumentNotes, pool_problem
from cdsjax.eval.problems import Problem


@dataclasses.dataclass(frozen=True)
class Fold:
    """One fold: its test documents and the rest (training documents), both sorted."""

    index: int
    test: Tuple[str, ...]
    train: Tuple[str, ...]


def document_folds(documents: Sequence[str], k: int, *, seed: int = 0) -> List[Fold]:
    """``k`` folds over ``documents``: a seeded permutation cut into ``k`` near-equal parts.

    Every document is a test document of exactly one fold; a fold's training documents are all the
    others. Raises ValueError when there are fewer documents than folds.
    """
    docs = sorted(set(documents))
    if int(k) < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    if len(docs) < int(k):
        raise ValueError(f"{len(docs)} documents cannot make {k} folds")
    order = np.random.default_rng(int(seed)).permutation(len(docs))
    parts = np.array_split(order, int(k))
    folds = []
    for i, part in enumerate(parts):
        test = tuple(sorted(docs[j] for j in part))
        folds.append(Fold(i, test, tuple(d for d in docs if d not in set(test))))
    return folds


def validation_split(documents: Sequence[str], fraction: float, *, seed: int = 0) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """``(fit documents, validation documents)``: a seeded ``fraction`` of ``documents`` (at least
    one, and at least one left to fit on) held out."""
    docs = sorted(set(documents))
    if len(docs) < 2:
        raise ValueError(f"a validation split needs at least 2 documents, got {len(docs)}")
    k = min(len(docs) - 1, max(1, int(round(float(fraction) * len(docs)))))
    held = set(docs[j] for j in np.random.default_rng(int(seed)).permutation(len(docs))[:k])
    return tuple(d for d in docs if d not in held), tuple(sorted(held))


def split_problems(benchmark: str, queries: Sequence, query_emb: np.ndarray, notes: Mapping[str, DocumentNotes],
                   documents: Sequence[str], *, pool_size: int = 1, pool_seed: int = 0,
                   keep: Optional[Sequence[bool]] = None) -> List[Problem]:
    """The problems of the questions whose documents are all in ``documents``.

    Args:
      benchmark: the benchmark's name (seeds the pools, as :func:`cdsjax.io.datasets.draw_pool`).
      queries, query_emb: every question of the benchmark and its ``[d]`` embedding, aligned.
      notes: ``doc -> DocumentNotes`` of at least ``documents``.
      documents: this side of the split; questions of other documents are left out.
      pool_size: documents per question, its own included; distractors are drawn (seeded per
        question) from ``documents`` only.
      pool_seed: run seed of the draws.
      keep: optional per-question mask (e.g. questions with gold evidence).

    Returns:
      One :class:`Problem` per kept question, in the order of ``queries``; ``gold_docs`` is set only
      for pools (``pool_size > 1``), as in :func:`cdsjax.eval.pools.pooled_problems`.
    """
    from cdsjax.io.datasets import draw_pool

    inside = set(documents)
    out = []
    for i, (q, qe) in enumerate(zip(queries, query_emb)):
        if keep is not None and not keep[i]:
            continue
        if not set(q.doc_ids) <= inside:
            continue
        if int(pool_size) == 1:
            pool = tuple(q.doc_ids)
        else:
            pool = draw_pool(benchmark, q.qid, q.doc_ids, sorted(inside), pool_size=int(pool_size), seed=pool_seed)
        p = pool_problem(q, qe, pool, notes, q.doc_ids)
        if int(pool_size) == 1:
            p.pool, p.gold_docs = None, None
        out.append(p)
    return out


def questions_per_document(queries: Sequence) -> Dict[str, int]:
    """``doc -> number of questions`` (a question with several documents counts for each)."""
    counts: Dict[str, int] = {}
    for q in queries:
        for d in q.doc_ids:
            counts[d] = counts.get(d, 0) + 1
    return counts
