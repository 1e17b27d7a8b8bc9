"""VisDoMBench: questions over sets of PDFs, one CSV per subset."""

from __future__ import annotations

import ast
import csv
import pathlib
from typing import Dict, List, Optional, Sequence, Tuple

from cdsjax.io.datasets.common import VISDOM_DIR, Query, Benchmark, resolve_data_root, parse_list, page_count, take


# Column names accepted for each field (first present wins). The VisDoM release
# uses q_id, question, answer, documents (a Python list literal of PDF names) and,
# for the gold document, doc_path.
VISDOM_COLUMNS = {
    "qid": ("q_id", "qid", "id", "question_id"),
    "question": ("question", "query", "q"),
    "answer": ("answer", "answers", "gt_answer", "gold_answer"),
    "documents": ("documents", "docs", "candidate_documents", "candidates", "doc_pool"),
    "gold_doc": ("doc_path", "gold_doc", "gold_document", "gold_documents", "source_doc",
                 "source_filename", "evidence_doc"),
    "gold_pages": ("gold_pages", "evidence_pages", "gold_page", "page", "page_num",
                   "pdf_page_number"),
}


def _pick_column(header: Sequence[str], field: str) -> Optional[str]:
    lower = {h.strip().lower(): h for h in header}
    for name in VISDOM_COLUMNS[field]:
        if name in lower:
            return lower[name]
    return None


def _visdom_doc_key(name: str, docs_dir: pathlib.Path) -> Tuple[str, pathlib.Path]:
    """Maps a document name as written in the CSV to ``(doc_id, pdf path)``."""
    base = pathlib.PurePath(str(name).strip()).name
    stem = base[:-4] if base.lower().endswith(".pdf") else base
    for cand in (docs_dir / base, docs_dir / f"{stem}.pdf", docs_dir / f"{stem}.PDF"):
        if cand.is_file():
            return stem, cand
    raise FileNotFoundError(f"VisDoM document {name!r} not found in {docs_dir}")


def _visdom_csv(subset_dir: pathlib.Path) -> pathlib.Path:
    named = subset_dir / f"{subset_dir.name}.csv"
    if named.is_file():
        return named
    csvs = sorted(subset_dir.glob("*.csv"))
    if len(csvs) != 1:
        raise FileNotFoundError(f"expected {named} (or exactly one CSV) in {subset_dir}, "
                                f"found {[c.name for c in csvs]}")
    return csvs[0]


def load_visdom(data_root=None, subset: Optional[str] = None, max_queries: Optional[int] = None,
                *, page_base: int = 1) -> Benchmark:
    """One VisDoMBench subset from its question CSV and PDF folder.

    Expected layout: ``<data_root>/visdom/<subset>/<subset>.csv`` (or the only CSV
    in that folder) and ``<data_root>/visdom/<subset>/docs/*.pdf``; ``data_root`` may
    also be the ``visdom`` folder itself, or the subset folder when ``subset`` is None.
    Columns (case-insensitive; the first present name of each group is used):

      * question id: ``q_id`` | ``qid`` | ``id`` | ``question_id`` (else the row number);
      * question: ``question`` | ``query`` (required);
      * answer: ``answer`` | ``answers`` | ``gt_answer`` (a list literal is joined by "; ");
      * candidate pool: ``documents`` | ``docs`` | ``candidate_documents`` — a Python
        or JSON list literal, or a ``;``/``|``/``,``-separated string, of PDF names
        with or without ``.pdf`` (required);
      * gold document(s): ``doc_path`` | ``gold_doc`` | ``gold_document`` |
        ``source_filename`` — a path or name, or a list of them (optional);
      * gold pages: ``gold_pages`` | ``evidence_pages`` | ``page`` — numbers in
        ``page_base`` (default 1-based), or a list (optional; applies to the gold
        documents).

    A gold document without gold pages makes every page of it gold (document-level
    gold, as the VisDoM paper scores most subsets); the harness can then report
    document recall through ``gold_pages``' keys.

    Args:
      data_root: see above (default ``../shared/data``).
      subset: subset folder name, e.g. ``"feta_tab"``; None when ``data_root`` is the
        subset folder.
      max_queries: keep the first rows; None keeps all.
      page_base: the numbering of the gold page column (1 or 0).
    """
    if page_base not in (0, 1):
        raise ValueError(f"page_base must be 0 or 1, got {page_base!r}")
    root = resolve_data_root(data_root)
    if subset is None:
        subset_dir = root
    else:
        candidates = [root / VISDOM_DIR / subset, root / subset]
        subset_dir = next((c for c in candidates if c.is_dir()), None)
        if subset_dir is None:
            raise FileNotFoundError(f"VisDoM subset {subset!r} not found under {root} "
                                    f"(tried {', '.join(str(c) for c in candidates)})")
    csv_path = _visdom_csv(subset_dir)
    docs_dir = subset_dir / "docs"
    if not docs_dir.is_dir():
        raise FileNotFoundError(f"VisDoM PDF folder not found: {docs_dir}")
    with open(csv_path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        rows = list(reader)
    cols = {field: _pick_column(header, field) for field in VISDOM_COLUMNS}
    for required in ("question", "documents"):
        if cols[required] is None:
            raise ValueError(f"{csv_path}: no {required} column (accepted names: "
                             f"{', '.join(VISDOM_COLUMNS[required])}; found {header})")

    documents: Dict[str, pathlib.Path] = {}
    page_counts: Dict[str, int] = {}
    queries: List[Query] = []
    seen_ids = set()
    for r, row in take(list(enumerate(rows)), max_queries):
        where = f"{csv_path} row {r + 2}"
        qid = (row.get(cols["qid"]) or "").strip() if cols["qid"] else ""
        qid = qid or f"row{r}"
        if qid in seen_ids:
            raise ValueError(f"{where}: duplicate question id {qid!r}")
        seen_ids.add(qid)
        question = (row.get(cols["question"]) or "").strip()
        if not question:
            raise ValueError(f"{where}: empty question")
        names = parse_list(row.get(cols["documents"]), field="documents", where=where)
        if not names:
            raise ValueError(f"{where}: empty document list")
        doc_ids = []
        for name in names:
            doc_id, pdf = _visdom_doc_key(str(name), docs_dir)
            documents.setdefault(doc_id, pdf)
            if doc_id not in doc_ids:
                doc_ids.append(doc_id)

        answer = None
        if cols["answer"] and (row.get(cols["answer"]) or "").strip():
            raw = row[cols["answer"]].strip()
            try:
                parsed = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                parsed = raw
            answer = "; ".join(map(str, parsed)) if isinstance(parsed, (list, tuple)) else str(parsed)

        gold_pages: Dict[str, frozenset] = {}
        gold_docs: List[str] = []
        if cols["gold_doc"]:
            for name in parse_list(row.get(cols["gold_doc"]), field="gold document", where=where):
                doc_id, pdf = _visdom_doc_key(str(name), docs_dir)
                documents.setdefault(doc_id, pdf)
                if doc_id not in doc_ids:
                    raise ValueError(f"{where}: gold document {name!r} is not in the "
                                     "candidate documents")
                gold_docs.append(doc_id)
        pages = []
        if cols["gold_pages"]:
            pages = [int(float(p)) - page_base for p in parse_list(
                row.get(cols["gold_pages"]), field="gold pages", where=where)]
        if pages and not gold_docs:
            if len(doc_ids) != 1:
                raise ValueError(f"{where}: gold pages given without a gold document "
                                 "and several candidate documents")
            gold_docs = list(doc_ids)
        for doc_id in gold_docs:
            if doc_id not in page_counts:
                page_counts[doc_id] = page_count(documents[doc_id])
            n = page_counts[doc_id]
            chosen = [p for p in pages if 0 <= p < n] if pages else range(n)
            gold_pages[doc_id] = frozenset(gold_pages.get(doc_id, frozenset()) | set(chosen))
        queries.append(Query(
            qid=qid, question=question, answer=answer, doc_ids=tuple(doc_ids),
            gold_pages={d: p for d, p in gold_pages.items() if p},
            meta={"gold_docs": gold_docs, "page_level": bool(pages), "subset": subset_dir.name},
        ))
    return Benchmark(f"visdom/{subset_dir.name}", queries, documents=documents)
