"""Training data for the learned game: gold units of a problem, its structure codes, padded batches,
and the split by document.

A gold *unit* is what recall counts: a gold page ``(document, page)`` for PDF benchmarks (its notes are the
notes on that page; a gold page without notes stays a unit, counted as missed, as ``page_recall`` does) or a
gold paragraph for text benchmarks (one note; a gold id missing from the corpus is a missed unit).
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from cdsjax.core.batching import DEFAULT_BUCKETS, bucket_size
from cdsjax.core.games.learned import kind_codes
from cdsjax.core.types import NOTE_KINDS

_CAPTION = re.compile(r"^\s*(?:FLOAT SELECTED:\s*)?(fig(?:ure)?\.?|table)", re.IGNORECASE)


def gold_units(problem) -> Tuple[np.ndarray, np.ndarray]:
    """``([g, n] bool notes of each gold unit, [g] bool real units)`` of a :class:`~cdsjax.eval.problems.Problem`.

    ``g`` is 0 for a question without gold.
    """
    q = problem.query
    n = problem.notes.shape[0]
    rows = []
    if q.gold_pages and problem.pages is not None:
        docs = np.asarray(problem.docs, dtype=object)
        pages = np.asarray(problem.pages)
        for doc, gp in sorted(q.gold_pages.items()):
            for p in sorted(int(v) for v in gp):
                rows.append((docs == doc) & (pages == p))
    elif q.gold_note_ids:
        ids = np.asarray(problem.note_ids, dtype=object)
        for gid in sorted(q.gold_note_ids):
            rows.append(ids == gid)
    units = np.asarray(rows, bool).reshape(len(rows), n)
    return units, np.ones(len(rows), bool)


def note_kinds(problem, corpus=None) -> Optional[List[int]]:
    """:data:`~cdsjax.core.games.learned.NOTE_KINDS` codes of a problem's notes, or None when unknown.

    A problem that carries ``kinds`` (names or codes) uses them; a text problem reads its corpus's kinds
    (``paragraph`` is text; a caption is a figure or a table by its label, else ``other``).
    """
    kinds = getattr(problem, "kinds", None)
    if kinds is not None:
        kinds = list(kinds)
        return [int(k) for k in kinds] if kinds and isinstance(kinds[0], (int, np.integer)) else kind_codes(kinds)
    if corpus is None:
        return None
    out = []
    for kind, text in zip(corpus.kinds, corpus.texts):
        if kind == "caption":
            m = _CAPTION.match(text)
            kind = ("figure" if m.group(1).lower().startswith("fig") else "table") if m else "other"
        out.append(kind)
    return kind_codes(out)


@dataclasses.dataclass
class Example:
    """One question's arrays for fitting (unpadded).

    Attributes:
      qid: the question id.
      group: the document key the split uses (the question's documents joined).
      notes, query: ``[n, d]``, ``[d]`` float32.
      links: ``[n, n]`` bool; pages, doc_ids, kinds: ``[n]`` int32 (-1 unknown).
      units, unit_valid: ``[g, n]`` bool, ``[g]`` bool.
      budget: the recall budget B this question is fitted at (None: the fit's default).
      weight: the question's weight in the fit's means (1; :func:`balance` sets it).
    """

    qid: str
    group: str
    notes: np.ndarray
    query: np.ndarray
    links: np.ndarray
    pages: np.ndarray
    doc_ids: np.ndarray
    kinds: np.ndarray
    units: np.ndarray
    unit_valid: np.ndarray
    budget: Optional[int] = None
    weight: float = 1.0

    @property
    def size(self) -> int:
        return int(self.notes.shape[0])


def example_of(problem, corpus=None) -> Optional[Example]:
    """The :class:`Example` of a problem, or None when it has no gold unit."""
    units, unit_valid = gold_units(problem)
    if units.shape[0] == 0:
        return None
    n = problem.notes.shape[0]
    doc_codes = {d: i for i, d in enumerate(dict.fromkeys(problem.docs))}
    kinds = note_kinds(problem, corpus)
    return Example(
        qid=str(problem.query.qid), group="|".join(problem.query.doc_ids), notes=np.asarray(problem.notes, np.float32),
        query=np.asarray(problem.query_emb, np.float32), links=np.asarray(problem.links, bool),
        pages=np.asarray(problem.pages if problem.pages is not None else [-1] * n, np.int32),
        doc_ids=np.asarray([doc_codes[d] for d in problem.docs], np.int32),
        kinds=np.asarray(kinds if kinds is not None else [-1] * n, np.int32), units=units, unit_valid=unit_valid)


def examples_of(problems: Sequence, corpora: Optional[Dict[str, object]] = None) -> List[Example]:
    """The :class:`Example` of every problem with gold (``corpora``: a text benchmark's corpora by id)."""
    out = []
    for p in problems:
        corpus = corpora.get(p.query.doc_ids[0]) if corpora else None
        ex = example_of(p, corpus)
        if ex is not None:
            out.append(ex)
    return out


def split_by_document(examples: Sequence[Example], val_fraction: float, seed: int) -> Tuple[list, list, dict]:
    """Splits by document group (never by question): ``(train, val, {"train": docs, "val": docs})``.

    The groups are shuffled with ``seed`` and the first ``ceil(val_fraction * groups)`` go to validation
    (at least one when there are two groups or more).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    groups = sorted({e.group for e in examples})
    random.Random(seed).shuffle(groups)
    k = int(np.ceil(val_fraction * len(groups))) if len(groups) > 1 else 0
    k = min(max(k, 1 if val_fraction > 0 and len(groups) > 1 else 0), len(groups) - 1) if groups else 0
    val_groups = set(groups[:k])
    train = [e for e in examples if e.group not in val_groups]
    val = [e for e in examples if e.group in val_groups]
    return train, val, {"train": sorted(set(groups) - val_groups), "val": sorted(val_groups)}


def balance(examples: Sequence[Example], key) -> Dict[str, float]:
    """Weights the examples so that every ``key(example)`` group (e.g. a benchmark) carries the same total weight,
    the weights averaging 1; returns ``group -> weight``. Without it a fit on two benchmarks is mostly a fit
    on the one with more questions."""
    groups: Dict[str, int] = {}
    for e in examples:
        groups[key(e)] = groups.get(key(e), 0) + 1
    weights = {g: len(examples) / (len(groups) * count) for g, count in groups.items()}
    for e in examples:
        e.weight = weights[key(e)]
    return weights


@dataclasses.dataclass
class Batch:
    """Examples padded to one note count ``n``, one unit count ``g`` and a batch size (padding slots repeat the
    first example with ``weight`` 0)."""

    arrays: Dict[str, np.ndarray]
    weight: np.ndarray  # [b] each real example's weight (1 unless balanced), 0 for padding slots
    count: int
    budget: Optional[int] = None
    total: Optional[float] = None  # the sum of the weights (None: count)


def make_batches(examples: Sequence[Example], *, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 max_batch: int = 32) -> List[Batch]:
    """Groups examples by padded note count and budget and pads notes, structure and gold units (trailing)."""
    by_size: Dict[tuple, List[Example]] = {}
    for e in examples:
        by_size.setdefault((bucket_size(e.size, buckets), e.budget or 0), []).append(e)
    out = []
    for (n, budget), group in sorted(by_size.items()):
        for start in range(0, len(group), max_batch):
            chunk = group[start:start + max_batch]
            g = max(e.units.shape[0] for e in chunk)
            b = 1 << max(0, (len(chunk) - 1).bit_length())
            rows = [_pad(e, n, g) for e in chunk] + [_pad(chunk[0], n, g)] * (b - len(chunk))
            arrays = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
            weight = np.array([float(e.weight) for e in chunk] + [0.0] * (b - len(chunk)), np.float32)
            out.append(Batch(arrays=arrays, weight=weight, count=len(chunk), budget=budget or None,
                             total=float(sum(float(e.weight) for e in chunk))))
    return out


def _pad(e: Example, n: int, g: int) -> Dict[str, np.ndarray]:
    k = e.size
    links = np.zeros((n, n), bool)
    links[:k, :k] = e.links
    units = np.zeros((g, n), bool)
    units[:e.units.shape[0], :k] = e.units
    unit_valid = np.zeros(g, bool)
    unit_valid[:e.units.shape[0]] = e.unit_valid
    grow = lambda a, v: np.concatenate([a, np.full((n - k,) + a.shape[1:], v, a.dtype)])
    return dict(notes=grow(e.notes, 0.0), query=e.query, valid=np.arange(n) < k, links=links,
                pages=grow(e.pages, -1), doc_ids=grow(e.doc_ids, -1), kinds=grow(e.kinds, -1), units=units,
                unit_valid=unit_valid)


__all__ = ["Batch", "Example", "NOTE_KINDS", "balance", "example_of", "examples_of", "gold_units", "make_batches",
           "note_kinds", "split_by_document"]
