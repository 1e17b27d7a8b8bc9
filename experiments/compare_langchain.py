r"""The LangChain compressor with CDS against LangChain's own redundancy filter and MMR, on the same candidates.

For every question a first stage ranks the question's notes by cosine and keeps the top ``--k`` (as a
LangChain vector-store retriever would); each method then keeps ``B`` of those same candidates:

* ``cosine`` — the first ``B`` candidates (no diversification);
* ``redundant-filter@t`` — LangChain's ``EmbeddingsRedundantFilter(similarity_threshold=t)`` (0.95 is its
  default), then the first ``B`` survivors (as a ``DocumentCompressorPipeline`` would);
* ``mmr`` — ``langchain_core.vectorstores.utils.maximal_marginal_relevance`` with ``lambda_mult=0.5`` (the
  LangChain default) and ``k=B``;
* ``cds`` — :class:`cdsjax.integrations.langchain.CDSCompressor` with the default selector (the registry's ``DEFAULT_SELECTOR``, learned CDS).

Every method sees the notes' stored embeddings (no re-embedding). Scored: the demo report's facts covered and
restatements (:mod:`cdsjax.demo`), MMLongBench-Doc page recall, QASPER paragraph recall. The adapter's
overhead per query is the time of ``CDSCompressor.compress_documents`` minus the time of the same jitted
selector called directly on the padded arrays (median over the questions, after a warm-up).

    python experiments/compare_langchain.py --mmlb-cache DIR --mmlb-queries 60 --qasper-queries 60 \
        --out runs/compare_langchain

Needs ``cdsjax[langchain]`` and ``langchain-community`` (where ``EmbeddingsRedundantFilter`` lives:
``pip install langchain-community``).

``--mmlb-cache`` is an evaluation cache of MMLongBench-Doc indexes (``run_eval.py --config.cache_dir``);
only questions whose documents are all in it are used, so nothing is indexed here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time
from typing import Dict, List, Sequence

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

THRESHOLDS = (0.95, 0.85)


class FixedQuery:
    """LangChain Embeddings that answer one known query vector (the benchmark's cached question embedding)."""

    def __new__(cls, vector):
        from langchain_core.embeddings import Embeddings

        class _Fixed(Embeddings):
            def embed_documents(self, texts):
                raise ValueError("every candidate carries its embedding")

            def embed_query(self, text):
                return list(map(float, vector))

        return _Fixed()


def candidates(notes: np.ndarray, query: np.ndarray, k: int, ids: Sequence[str]):
    """The first stage: the top-k notes by cosine, as LangChain Documents with their embeddings."""
    from langchain_core.documents import Document

    order = np.argsort(-(notes @ query), kind="stable")[:k]
    return [Document(page_content="", metadata=dict(note_id=str(ids[i]), row=int(i),
                                                    embedding=notes[i].tolist())) for i in order]


def run_methods(docs, query: np.ndarray, question: str, budget: int, compressor) -> Dict[str, list]:
    """Rows (positions in the notes) each method keeps, best first; also times CDS (adapter vs raw)."""
    from langchain_community.document_transformers.embeddings_redundant_filter import (
        EmbeddingsRedundantFilter, get_stateful_documents)
    from langchain_core.vectorstores.utils import maximal_marginal_relevance

    embeddings = FixedQuery(query)
    out = {"cosine": [d.metadata["row"] for d in docs[:budget]]}
    for t in THRESHOLDS:
        stateful = get_stateful_documents(docs)
        for d in stateful:
            d.state["embedded_doc"] = d.metadata["embedding"]
        kept = EmbeddingsRedundantFilter(embeddings=embeddings, similarity_threshold=t).transform_documents(stateful)
        out[f"redundant-filter@{t}"] = [d.metadata["row"] for d in kept[:budget]]
    vectors = np.asarray([d.metadata["embedding"] for d in docs], np.float32)
    picked = maximal_marginal_relevance(query, vectors, lambda_mult=0.5, k=budget)
    out["mmr"] = [docs[i].metadata["row"] for i in picked]
    compressor.embeddings = embeddings
    t0 = time.perf_counter()
    kept = compressor.compress_documents(docs, question)
    adapter_s = time.perf_counter() - t0
    out["cds"] = [d.metadata["row"] for d in kept]
    raw_s = raw_select_seconds(compressor, vectors, query, question)
    return out, adapter_s, raw_s


def raw_select_seconds(compressor, vectors, query, question) -> float:
    """Seconds of the compressor's jitted selector called directly on padded arrays (what the adapter wraps)."""
    import jax
    import jax.numpy as jnp

    from cdsjax.core.baselines import key_from_query_id
    from cdsjax.core.batching import bucket_size

    chooser = compressor._chooser
    size = bucket_size(max(len(vectors), chooser.budget))
    padded = np.zeros((size, vectors.shape[1]), np.float32)
    padded[: len(vectors)] = vectors
    args = (jnp.asarray(padded), jnp.asarray(query), jnp.asarray(np.arange(size) < len(vectors)), None,
            key_from_query_id(question))
    t0 = time.perf_counter()
    jax.block_until_ready(chooser._jitted(*args))
    return time.perf_counter() - t0


def demo_rows(budget: int, work: pathlib.Path, compressor) -> List[dict]:
    from cdsjax import demo
    from cdsjax.integrations._common import Encoder
    from cdsjax.io.index import index_pdf

    pdf = demo.write_report(work / "harbour_island_report.pdf")
    idx = index_pdf(pdf, cache_dir=work / "cache")

    query = Encoder(idx.embedder).queries([demo.QUESTION])[0]
    notes = np.asarray(idx.embeddings, np.float32)
    docs = candidates(notes, query, len(notes), [n["note_id"] for n in idx.notes])
    chosen, _, _ = run_methods(docs, query, demo.QUESTION, budget, compressor)
    rows = []
    for method, picked in chosen.items():
        cov = demo.coverage([idx.notes[i]["page"] for i in picked])
        rows.append(dict(benchmark="demo", method=method, facts=len(cov["covered"]), of=len(demo.FACTS),
                         restatements=cov["restatements"], covered=cov["covered"]))
    return rows


def cached_doc_ids(cache: pathlib.Path) -> set:
    return {json.loads(p.read_text())["doc_id"] for p in (cache / "indexes" / "docs").glob("*/*/entry.json")}


def benchmark_rows(name: str, problems, budget: int, k: int, compressor, timings: list) -> List[dict]:
    from cdsjax.eval import metrics as M

    per: Dict[str, list] = {}
    for j, p in enumerate(problems):
        docs = candidates(p.notes, p.query_emb, k, p.note_ids)
        chosen, adapter_s, raw_s = run_methods(docs, p.query_emb, p.query.question, budget, compressor)
        if j > 0:  # the first call compiles the selector
            timings.append((adapter_s, raw_s, len(docs)))
        for method, picked in chosen.items():
            if p.pages is not None:
                score = M.page_recall([(p.docs[i], p.pages[i]) for i in picked], p.query.gold_pages)
            else:
                score = M.paragraph_recall([p.note_ids[i] for i in picked], p.query.gold_note_ids)
            per.setdefault(method, []).append(score)
    rows = []
    for method, scores in per.items():
        vs = M.paired_difference(per["cds"], scores)  # CDS minus this method, paired over questions
        kept = [s for s in scores if s == s]  # NaN: no gold evidence
        rows.append(dict(benchmark=name, method=method, recall=float(np.mean(kept)), questions=len(kept),
                         cds_minus_this=None if method == "cds" else vs, scores=scores))
    return rows


def mmlb_problems(cache: pathlib.Path, max_queries: int):
    import importlib

    from cdsjax.eval.problems import load_configured_benchmark, pdf_problems
    from cdsjax.io.embed import Embedder

    config = importlib.import_module("configs.mmlongbench").get_config()
    config.data_root = str(ROOT.parent / "shared" / "data")
    bench = load_configured_benchmark(config, all_queries=True)
    cached = cached_doc_ids(cache)
    queries = [q for q in bench.queries if q.doc_ids and set(q.doc_ids) <= cached][:max_queries]
    bench = dataclasses.replace(bench, queries=queries)
    return pdf_problems(bench, config, Embedder(config), cache_dir=cache)


def qasper_problems(cache: pathlib.Path, max_queries: int):
    import importlib

    from cdsjax.eval.problems import load_configured_benchmark, text_problems
    from cdsjax.io.embed import Embedder

    config = importlib.import_module("configs.qasper").get_config()
    config.data_root = str(ROOT.parent / "shared" / "data")
    config.max_queries = max_queries
    bench = load_configured_benchmark(config)
    return text_problems(bench, Embedder(config), cache_dir=cache)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mmlb-cache", type=pathlib.Path, default=None, help="MMLongBench-Doc evaluation cache")
    p.add_argument("--mmlb-queries", type=int, default=60)
    p.add_argument("--qasper-cache", type=pathlib.Path, default=None, help="where QASPER embeddings are cached")
    p.add_argument("--qasper-queries", type=int, default=60)
    p.add_argument("--k", type=int, default=40, help="first-stage candidates per question (default: 40)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/compare_langchain"))
    args = p.parse_args(argv)

    from cdsjax.integrations.langchain import CDSCompressor

    args.out.mkdir(parents=True, exist_ok=True)
    rows, timings = [], []
    demo_budget = 4
    rows += demo_rows(demo_budget, args.out, CDSCompressor(embeddings=None, budget=demo_budget))
    if args.mmlb_cache is not None:
        problems = mmlb_problems(args.mmlb_cache, args.mmlb_queries)
        rows += benchmark_rows("mmlongbench", problems, 10, args.k, CDSCompressor(budget=10), timings)
        print(len(problems), "MMLongBench-Doc questions over", len({d for p in problems for d in p.query.doc_ids}),
              "PDFs", flush=True)
    qasper_cache = args.qasper_cache or args.out / "qasper-cache"
    if args.qasper_queries > 0:
        problems = qasper_problems(qasper_cache, args.qasper_queries)
        rows += benchmark_rows("qasper", problems, 5, args.k, CDSCompressor(budget=5), timings)
        print(len(problems), "QASPER questions over", len({p.query.doc_ids[0] for p in problems}), "papers",
              flush=True)
    warm = timings
    overhead = dict(
        queries=len(warm),
        adapter_ms_median=1000 * statistics.median(t[0] for t in warm) if warm else None,
        raw_select_ms_median=1000 * statistics.median(t[1] for t in warm) if warm else None,
        overhead_ms_median=1000 * statistics.median(t[0] - t[1] for t in warm) if warm else None,
        overhead_ms_p90=1000 * float(np.percentile([t[0] - t[1] for t in warm], 90)) if warm else None,
        candidates=sorted({t[2] for t in warm}),
    )
    from cdsjax.io.provenance import provenance

    result = dict(rows=rows, overhead=overhead, k=args.k, thresholds=list(THRESHOLDS), provenance=provenance(vars(args)))
    (args.out / "compare_langchain.json").write_text(json.dumps(result, indent=1))
    for r in rows:
        print({k: v for k, v in r.items() if k != "scores"})
    print(overhead)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
