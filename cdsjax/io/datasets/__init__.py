"""Benchmark loaders: questions, gold evidence, and the documents or notes to search.

Every loader returns a :class:`Benchmark`: a list of :class:`Query` objects plus
what the harness needs to build indexes. PDF benchmarks (MMLongBench-Doc,
VisDoMBench) name PDF files in ``documents``; the harness parses and embeds them.
Text benchmarks (QASPER, HotpotQA) carry ready-made notes in ``corpora`` as plain
text, so the harness embeds them with the shared embedder; nothing is embedded here.

Conventions:
  * pages are 0-based everywhere (MMLongBench's 1-based ``evidence_pages`` are
    converted on load);
  * bounding boxes are ``(x0, y0, x1, y1)`` in PDF points, origin top-left;
  * a query without gold evidence (unanswerable, or gold that could not be mapped)
    keeps empty gold; recall metrics return NaN for it and summaries skip it.

Layout under ``data_root`` (the same as ``../shared/data``; see its README)::

  mmlongbench/samples.json, mmlongbench/mmdocir_annotations.jsonl,
  mmlongbench/documents/*.pdf
  qasper/qasper-test-v0.3.json
  hotpotqa/hotpotqa_100.json
  visdom/<subset>/<subset>.csv, visdom/<subset>/docs/*.pdf
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from cdsjax.io.datasets.common import (
    DEFAULT_DATA_ROOT,
    REPO_ROOT,
    MMLONGBENCH_SAMPLES,
    MMLONGBENCH_MMDOCIR,
    MMLONGBENCH_DOCS,
    QASPER_FILE,
    HOTPOTQA_FILE,
    VISDOM_DIR,
    FLOAT_PREFIX,
    PAGE_SOURCES,
    GoldBox,
    Query,
    TextCorpus,
    Benchmark,
    resolve_data_root,
    require_file,
    read_json,
    read_json_file,
    norm_text,
    parse_list,
    page_count,
    take,
)
from cdsjax.io.datasets.hotpotqa import load_hotpotqa
from cdsjax.io.datasets.mmlongbench import load_mmlongbench
from cdsjax.io.datasets.pools import DISTRACTORS, draw_pool, pool_seed, with_pools
from cdsjax.io.datasets.qasper import load_qasper
from cdsjax.io.datasets.visdom import load_visdom

LOADERS: Dict[str, Callable[..., Benchmark]] = {
    "mmlongbench": load_mmlongbench,
    "qasper": load_qasper,
    "hotpotqa": load_hotpotqa,
    "visdom": load_visdom,
}


def load_benchmark(name: str, data_root=None, max_queries: Optional[int] = None,
                   **options) -> Benchmark:
    """Dispatches to the loader called ``name`` (see ``LOADERS``)."""
    if name not in LOADERS:
        raise ValueError(f"benchmark must be one of {sorted(LOADERS)}, got {name!r}")
    return LOADERS[name](data_root, max_queries=max_queries, **options)
