"""Retrieval metrics for one query, and summaries over queries. Pure NumPy.

Each per-query metric takes what a selector picked (already cut to the budget ``B``:
pass only the valid selections, in rank order) and the query's gold evidence. A
query without gold evidence gets ``NaN`` from every recall metric, and the
summaries skip ``NaN``, so unanswerable questions never count as hits or misses.

Boxes are ``(x0, y0, x1, y1)`` with ``x0 <= x1`` and ``y0 <= y1``, in one coordinate
system per page (PDF points, origin top-left, in this project).
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Sequence, Tuple

import numpy as np

BOX_IOU = 0.3
BOX_CONTAINMENT = 0.5

Region = Tuple[str, int, Sequence[float]]  # (doc, page, bbox)


def _recall(found: int, total: int) -> float:
    return float("nan") if total == 0 else found / total


def page_recall(selected_pages: Iterable[Tuple[str, int]],
                gold_pages: Mapping[str, Iterable[int]]) -> float:
    """Fraction of gold ``(doc, page)`` pairs that appear among the selected notes' pages.

    Args:
      selected_pages: ``(doc, page)`` of each selected note (repeats allowed).
      gold_pages: ``doc -> 0-based gold pages``.

    Returns:
      ``|gold ∩ selected| / |gold|``, NaN when there is no gold page.
    """
    gold = {(d, int(p)) for d, pages in gold_pages.items() for p in pages}
    chosen = {(d, int(p)) for d, p in selected_pages}
    return _recall(len(gold & chosen), len(gold))


def doc_recall(selected_docs: Iterable[str], gold_docs: Iterable[str]) -> float:
    """Fraction of gold documents with at least one selected note; NaN without gold."""
    gold = set(gold_docs)
    return _recall(len(gold & set(selected_docs)), len(gold))


def box_overlap(box: Sequence[float], gold: Sequence[float]) -> Tuple[float, float]:
    """``(IoU, fraction of the gold box inside box)`` of two axis-aligned boxes.

    Degenerate (zero-area) gold boxes give containment 1 if the gold box lies in
    ``box`` (its area is taken as 0/0 -> inside test) and IoU 0.
    """
    ax0, ay0, ax1, ay1 = (float(v) for v in box)
    gx0, gy0, gx1, gy1 = (float(v) for v in gold)
    iw = max(0.0, min(ax1, gx1) - max(ax0, gx0))
    ih = max(0.0, min(ay1, gy1) - max(ay0, gy0))
    inter = iw * ih
    area_a = max(0.0, ax1 - ax0) * max(0.0, ay1 - ay0)
    area_g = max(0.0, gx1 - gx0) * max(0.0, gy1 - gy0)
    union = area_a + area_g - inter
    iou = inter / union if union > 0 else 0.0
    if area_g > 0:
        contained = inter / area_g
    else:
        contained = float(ax0 <= gx0 and gx1 <= ax1 and ay0 <= gy0 and gy1 <= ay1)
    return iou, contained


def box_hit(box: Sequence[float], gold: Sequence[float], *, iou: float = BOX_IOU,
            containment: float = BOX_CONTAINMENT) -> bool:
    """True if ``box`` covers ``gold``: IoU >= ``iou`` or >= ``containment`` of the gold
    box's area lies inside ``box``."""
    o, c = box_overlap(box, gold)
    return o >= iou or c >= containment


def box_recall(selected: Iterable[Region], gold_boxes: Iterable[Region], *,
               iou: float = BOX_IOU, containment: float = BOX_CONTAINMENT) -> float:
    """Fraction of gold boxes covered by some selected element on the same doc and page.

    Args:
      selected: ``(doc, page, bbox)`` of each selected element.
      gold_boxes: ``(doc, page, bbox)`` gold regions.
      iou, containment: thresholds of :func:`box_hit`.

    Returns:
      The covered fraction of gold boxes; NaN when there is none.
    """
    by_page: Dict[Tuple[str, int], list] = {}
    for doc, page, bbox in selected:
        by_page.setdefault((doc, int(page)), []).append(bbox)
    gold = list(gold_boxes)
    hits = sum(
        any(box_hit(b, g_box, iou=iou, containment=containment)
            for b in by_page.get((doc, int(page)), ()))
        for doc, page, g_box in gold)
    return _recall(hits, len(gold))


def paragraph_recall(selected_ids: Iterable, gold_ids: Iterable) -> float:
    """Fraction of gold note ids (paragraphs, supporting facts) among the selected ids."""
    gold = set(gold_ids)
    return _recall(len(gold & set(selected_ids)), len(gold))


def best_annotator_recall(selected_ids: Iterable, gold_per_annotator: Iterable[Iterable]) -> float:
    """Max over annotators of :func:`paragraph_recall` (QASPER-style multi-reference);
    annotators with no gold are skipped; NaN if none has gold."""
    chosen = set(selected_ids)
    values = [paragraph_recall(chosen, g) for g in gold_per_annotator]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else float("nan")


def all_found(recall: float) -> float:
    """1.0 if every gold item was found (``recall == 1``), 0.0 if not, NaN without gold."""
    return recall if math.isnan(recall) else float(recall >= 1.0 - 1e-12)


def redundancy(embeddings: np.ndarray) -> float:
    r"""Mean pairwise cosine similarity of the selected notes.

    Args:
      embeddings: ``[k, d]`` float, one row per selected note (rows need not be
        normalised; they are L2-normalised here, and an all-zero row counts as
        cosine 0 with everything).

    Returns:
      :math:`\frac{2}{k(k-1)}\sum_{i<j}\cos(z_i, z_j)`, NaN when ``k < 2``.
    """
    z = np.asarray(embeddings, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"embeddings must be [k, d], got shape {z.shape}")
    k = z.shape[0]
    if k < 2:
        return float("nan")
    if not np.all(np.isfinite(z)):
        raise ValueError("embeddings contain NaN or inf")
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    z = np.divide(z, norms, out=np.zeros_like(z), where=norms > 0)
    sim = z @ z.T
    iu = np.triu_indices(k, 1)
    return float(sim[iu].mean())


def distinct_pages(selected_pages: Iterable[Tuple[str, int]]) -> int:
    """Number of distinct ``(doc, page)`` among the selected notes."""
    return len({(d, int(p)) for d, p in selected_pages})


def mean_ci(values: Iterable[float], *, confidence: float = 0.95, num_resamples: int = 10_000,
            seed: int = 0) -> Tuple[float, float, float, int]:
    """Mean and percentile-bootstrap confidence interval, skipping NaN.

    The interval is the ``(1-confidence)/2`` and ``(1+confidence)/2`` quantiles of the
    means of ``num_resamples`` resamples (with replacement, same size) drawn with
    ``numpy.random.default_rng(seed)``, so a summary is reproducible.

    Returns:
      ``(mean, ci_low, ci_high, n)`` over the finite values; all NaN with ``n = 0``
      when there are none, and ``ci_low = ci_high = mean`` when ``n = 1``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    x = np.asarray(list(values), dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    mean = float(x.mean())
    if n == 1 or np.all(x == x[0]):
        return mean, mean, mean, n
    rng = np.random.default_rng(seed)
    # Resample in blocks so memory stays at ~num_resamples * min(n, block) floats.
    means = np.empty(num_resamples)
    block = max(1, 4_000_000 // n)
    for start in range(0, num_resamples, block):
        stop = min(num_resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = x[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return mean, float(lo), float(hi), n


def summarize(records: Iterable[Mapping[str, object]], metrics: Sequence[str], *,
              group_by: Sequence[str] = ("benchmark", "selector"),
              confidence: float = 0.95, num_resamples: int = 10_000, seed: int = 0) -> list:
    """Per-group :func:`mean_ci` of each metric over per-query records.

    Args:
      records: dicts holding the ``group_by`` keys and numeric metric values
        (missing or None values count as NaN and are skipped).
      metrics: metric names to summarise, in output order.

    Returns:
      A list of dicts with the ``group_by`` keys plus ``metric``, ``mean``,
      ``ci_low``, ``ci_high``, ``n``, ordered by first appearance of each group.
    """
    groups: Dict[tuple, list] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in group_by), []).append(r)
    rows = []
    for key, recs in groups.items():
        for m in metrics:
            vals = [np.nan if r.get(m) is None else float(r[m]) for r in recs]
            mean, lo, hi, n = mean_ci(vals, confidence=confidence,
                                      num_resamples=num_resamples, seed=seed)
            rows.append({**dict(zip(group_by, key)), "metric": m, "mean": mean,
                         "ci_low": lo, "ci_high": hi, "n": n})
    return rows


def gold_doc_share(selected_docs: Sequence[str], gold_docs: Iterable[str]) -> float:
    """Share of the selected notes that come from a gold document (NaN if none was
    selected or there is no gold document)."""
    gold = set(gold_docs)
    docs = list(selected_docs)
    if not gold or not docs:
        return float("nan")
    return sum(d in gold for d in docs) / len(docs)


def gold_doc_hit(selected_docs: Iterable[str], gold_docs: Iterable[str]) -> float:
    """1.0 if some selected note comes from a gold document, else 0.0; NaN without gold."""
    gold = set(gold_docs)
    if not gold:
        return float("nan")
    return float(bool(gold & set(selected_docs)))


def distinct_docs(selected_docs: Iterable[str]) -> int:
    """Number of distinct documents among the selected notes."""
    return len(set(selected_docs))


DETECT_Z = 1.959964 + 0.841621  # z of a two-sided 5% test plus z of 80% power


def paired_difference(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                      num_resamples: int = 10_000, seed: int = 0, tie: float = 1e-9) -> dict:
    """Paired comparison of two selectors on the same questions: ``a - b``.

    Args:
      a, b: per-question values, aligned (NaN or None in either drops the pair).
      confidence, num_resamples, seed: of the bootstrap interval (:func:`mean_ci`).
      tie: differences with ``|a - b| <= tie`` count as ties.

    Returns:
      ``{"mean", "ci_low", "ci_high", "n", "better", "tie", "worse", "mde"}``: the mean
      difference with its percentile-bootstrap interval over questions, how many
      questions ``a`` is above, equal to and below ``b`` (W/T/L), and the smallest mean
      difference these questions could detect, ``mde`` = (z₀.₉₇₅ + z₀.₈) · sd(a − b) / √n
      (a two-sided 5% test with 80% power; NaN below two pairs).

    Paired beats marginal: two selectors' own intervals can overlap while the interval of
    their per-question difference excludes 0, because the questions' difficulty cancels::

        d = paired_difference(cds_recall, cosine_recall)
        print(f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] "
              f"W/T/L {d['better']}/{d['tie']}/{d['worse']}")
    """
    x = np.asarray([np.nan if v is None else float(v) for v in a], np.float64)
    y = np.asarray([np.nan if v is None else float(v) for v in b], np.float64)
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length, got {x.size} and {y.size}")
    d = (x - y)[np.isfinite(x) & np.isfinite(y)]
    mean, lo, hi, n = mean_ci(d, confidence=confidence, num_resamples=num_resamples, seed=seed)
    return {"mean": mean, "ci_low": lo, "ci_high": hi, "n": n, "better": int(np.sum(d > tie)),
            "tie": int(np.sum(np.abs(d) <= tie)), "worse": int(np.sum(d < -tie)),
            "mde": float(DETECT_Z * np.std(d, ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")}
