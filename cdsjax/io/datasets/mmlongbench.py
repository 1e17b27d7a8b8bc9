"""MMLongBench-Doc: questions over PDFs, gold pages, and gold boxes from MMDocIR."""

from __future__ import annotations

import json
import pathlib
from typing import Dict, List, Optional, Tuple

from cdsjax.io.datasets.common import (
    MMLONGBENCH_SAMPLES,
    MMLONGBENCH_MMDOCIR,
    MMLONGBENCH_DOCS,
    PAGE_SOURCES,
    GoldBox,
    Query,
    Benchmark,
    resolve_data_root,
    require_file,
    read_json_file,
    norm_text,
    parse_list,
    page_count,
    take,
)


def _mmdocir_index(path: pathlib.Path) -> Dict[Tuple[str, str], dict]:
    index: Dict[Tuple[str, str], dict] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            for q in doc.get("questions", []):
                index[(doc["doc_name"], norm_text(q["Q"]))] = q
    return index


def load_mmlongbench(data_root=None, max_queries: Optional[int] = None, *,
                     page_source: str = "mmlongbench", with_boxes: bool = True) -> Benchmark:
    """MMLongBench-Doc questions on the shipped PDFs, joined with MMDocIR gold boxes.

    Args:
      data_root: directory with ``mmlongbench/`` (default ``../shared/data``).
      max_queries: keep the first ``max_queries`` questions (file order); None keeps all.
      page_source: where gold pages come from. ``"mmlongbench"`` (default): the
        benchmark's ``evidence_pages`` (1-based, converted to 0-based).
        ``"mmdocir"``: MMDocIR's re-annotated 0-based ``page_id`` where the question
        is in MMDocIR (it fixes offsets such as pages numbered from a whole book on
        an excerpted PDF), else the benchmark's pages.
      with_boxes: join MMDocIR gold boxes (matched by document and question text).

    Returns:
      A Benchmark whose ``documents`` maps each ``doc_id`` to its PDF. Pages outside
      the PDF are dropped (listed in ``meta["dropped_pages"]``). ``meta`` also holds
      ``answerable`` (False where ``evidence_pages`` is ``"[]"``), ``evidence_sources``,
      ``answer_format``, ``doc_type``, ``mmdocir_pages`` (None when not in MMDocIR)
      and ``pages_agree`` (MMDocIR's pages equal the benchmark's).
    """
    if page_source not in PAGE_SOURCES:
        raise ValueError(f"page_source must be one of {PAGE_SOURCES}, got {page_source!r}")
    root = resolve_data_root(data_root)
    samples_path = root / MMLONGBENCH_SAMPLES
    samples = read_json_file(samples_path, "MMLongBench samples", list, "list of questions")
    mmdocir = {}
    if with_boxes or page_source == "mmdocir":
        mmdocir = _mmdocir_index(require_file(root / MMLONGBENCH_MMDOCIR, "MMDocIR annotations"))

    doc_dir = root / MMLONGBENCH_DOCS
    documents: Dict[str, pathlib.Path] = {}
    page_counts: Dict[str, int] = {}
    queries: List[Query] = []
    for i, s in take(list(enumerate(samples)), max_queries):
        where = f"{samples_path} item {i}"
        try:
            doc_id, question = s["doc_id"], s["question"]
        except KeyError as e:
            raise ValueError(f"{where}: missing field {e}") from None
        if doc_id not in documents:
            documents[doc_id] = require_file(doc_dir / doc_id, "MMLongBench PDF")
            page_counts[doc_id] = page_count(documents[doc_id])
        n_pages = page_counts[doc_id]

        raw_pages = [int(p) for p in parse_list(s.get("evidence_pages"), field="evidence_pages",
                                                 where=where)]
        answerable = bool(raw_pages)
        bench_pages = [p - 1 for p in raw_pages]
        ir = mmdocir.get((doc_id, norm_text(question)))
        ir_pages = None if ir is None else sorted(int(p) for p in ir.get("page_id", []))
        pages = bench_pages
        if page_source == "mmdocir" and ir_pages is not None:
            pages = ir_pages
        kept = sorted({p for p in pages if 0 <= p < n_pages})
        dropped = sorted({p for p in pages if not 0 <= p < n_pages})

        boxes: Tuple[GoldBox, ...] = ()
        if with_boxes and ir is not None:
            boxes = tuple(
                GoldBox(doc_id, int(b["page"]), tuple(float(v) for v in b["bbox"]))
                for b in ir.get("layout_mapping", []) if 0 <= int(b["page"]) < n_pages)

        queries.append(Query(
            qid=f"mmlongbench-{i:04d}",
            question=question,
            answer=None if s.get("answer") is None else str(s["answer"]),
            doc_ids=(doc_id,),
            gold_pages={doc_id: frozenset(kept)} if kept else {},
            gold_boxes=boxes,
            meta={
                "answerable": answerable,
                "evidence_sources": [str(x) for x in parse_list(
                    s.get("evidence_sources"), field="evidence_sources", where=where)],
                "answer_format": s.get("answer_format"),
                "doc_type": s.get("doc_type"),
                "benchmark_pages": sorted(set(bench_pages)),
                "mmdocir_pages": ir_pages,
                "pages_agree": None if ir_pages is None else sorted(set(bench_pages)) == ir_pages,
                "dropped_pages": dropped,
                "num_pages": n_pages,
            },
        ))
    return Benchmark("mmlongbench", queries, documents=documents)
