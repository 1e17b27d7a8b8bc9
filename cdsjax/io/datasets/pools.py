"""Candidate pools: a question's gold documents plus seeded distractors (the paper's protocol)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import List, Sequence, Tuple

from cdsjax.io.datasets.common import Benchmark


DISTRACTORS = ("random", "similar")


def pool_seed(benchmark: str, qid: str, seed: int = 0) -> int:
    """A 63-bit seed from the sha256 of ``benchmark``, ``qid`` and ``seed``.

    Python's ``hash()`` of a string changes with ``PYTHONHASHSEED``; this does not, so
    a question draws the same pool in every run, process and shard.
    """
    digest = hashlib.sha256(f"{benchmark}\x1f{qid}\x1f{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _similar_documents(gold: Sequence[str], candidates: Sequence[str], doc_vectors, k: int) -> List[str]:
    """The ``k`` candidates whose vector has the highest cosine with the mean gold vector
    (ties broken by document id, so the choice does not depend on dictionary order)."""
    import numpy as np

    missing = [d for d in list(gold) + list(candidates) if d not in doc_vectors]
    if missing:
        raise ValueError(f"similar distractors: no document vector for {missing[:3]}")
    g = np.mean([np.asarray(doc_vectors[d], np.float64) for d in gold], axis=0)
    g = g / max(float(np.linalg.norm(g)), 1e-12)
    sims = []
    for d in candidates:
        v = np.asarray(doc_vectors[d], np.float64)
        sims.append((-float(v @ g) / max(float(np.linalg.norm(v)), 1e-12), d))
    return [d for _, d in sorted(sims)[:k]]


def draw_pool(benchmark: str, qid: str, gold: Sequence[str], documents: Sequence[str], *,
              pool_size: int, distractors: str = "random", doc_vectors=None,
              seed: int = 0) -> Tuple[str, ...]:
    """The candidate documents of one question: its gold documents plus distractors, shuffled.

    Args:
      benchmark, qid: name the question; with ``seed`` they seed its generator
        (:func:`pool_seed`), so the pool is a function of the question alone.
      gold: the question's own documents (kept, whatever ``pool_size``).
      documents: every document distractors may come from (order does not matter).
      pool_size: documents in the pool, gold included (``>= len(gold)``).
      distractors: ``"random"`` (drawn uniformly without replacement) or
        ``"similar"`` (the documents whose ``doc_vectors`` entry is closest in cosine
        to the gold documents' mean: harder distractors).
      doc_vectors: ``doc -> [d]`` vector (mean note embedding); needed for ``"similar"``.
      seed: run seed (another seed draws other random pools).

    Returns:
      ``pool_size`` document ids in a seeded random order.
    """
    import numpy as np

    if distractors not in DISTRACTORS:
        raise ValueError(f"distractors must be one of {DISTRACTORS}, got {distractors!r}")
    gold = list(dict.fromkeys(gold))
    if int(pool_size) < max(1, len(gold)):
        raise ValueError(f"pool_size must be >= {max(1, len(gold))} (question {qid} has "
                         f"{len(gold)} gold documents), got {pool_size}")
    candidates = sorted(set(documents) - set(gold))
    k = int(pool_size) - len(gold)
    if k > len(candidates):
        raise ValueError(f"pool_size {pool_size} needs {k} distractors for question {qid}, but "
                         f"{benchmark} has only {len(candidates)} other documents")
    rng = np.random.default_rng(pool_seed(benchmark, qid, seed))
    if k == 0:
        chosen = []
    elif distractors == "random":
        chosen = [candidates[i] for i in rng.choice(len(candidates), size=k, replace=False)]
    else:
        chosen = _similar_documents(gold, candidates, doc_vectors, k)
    pool = gold + chosen
    return tuple(pool[i] for i in rng.permutation(len(pool)))


def with_pools(bench: Benchmark, pool_size: int, distractors: str = "random", *,
               doc_vectors=None, seed: int = 0) -> Benchmark:
    """A copy of ``bench`` in which every question searches a pool of documents.

    Each query's ``doc_ids`` becomes :func:`draw_pool`'s pool (drawn from all the
    benchmark's documents or corpora) and ``meta["gold_docs"]`` keeps its own
    documents. Load the benchmark without ``max_queries`` first and cut afterwards,
    so a question's pool does not depend on how many questions are kept.

    Raises:
      ValueError: for VisDoM (its CSV names the pools) or a pool larger than the
        benchmark.
    """
    if bench.name.startswith("visdom"):
        raise ValueError(f"{bench.name}: VisDoM questions come with their candidate pools; "
                         "pool_size does not apply")
    documents = list(bench.documents or bench.corpora)
    queries = []
    for q in bench.queries:
        pool = draw_pool(bench.name, q.qid, q.doc_ids, documents, pool_size=pool_size,
                         distractors=distractors, doc_vectors=doc_vectors, seed=seed)
        queries.append(dataclasses.replace(q, doc_ids=pool, meta={**q.meta, "gold_docs": list(q.doc_ids)}))
    return dataclasses.replace(bench, queries=queries)
