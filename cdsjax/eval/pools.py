"""Candidate pools and the open corpus: questions that search several documents.

* :class:`PoolSpec` / :func:`pool_spec` — how a config gathers each question's candidates
  (:data:`POOL_FIELDS`).
* :func:`pool_problem` — a question over the notes of a pool of documents.
* :func:`first_stage` / :func:`corpus_problems` — the open corpus: the top-k notes of the whole
  collection by exact cosine.
* :func:`pooled_problems` — the benchmark and problems of a pool or open-corpus run.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from cdsjax.eval.problems import (Problem, benchmark_kind, block_links, cached_encode, described_ids, first_queries,
                                  index_note_kind, load_configured_benchmark, note_text, pdf_indexes,
                                  pdf_problems, text_kinds, text_links, text_sections)

CANDIDATE_POOLS = ("documents", "corpus")
POOL_FIELDS = ("pool_size", "distractors", "pool_seed", "candidate_pool", "first_stage_k")


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """How each question's candidate notes are gathered (config fields of the same names).

    Attributes:
      pool_size: documents per question, the question's own included (1 = its own
        document only).
      distractors: ``"random"`` (seeded per question) or ``"similar"`` (the documents
        whose mean note embedding is closest to the gold document's).
      pool_seed: run seed of the random draws and the shuffle.
      candidate_pool: ``"documents"`` (the pool above) or ``"corpus"`` (every document
        of the benchmark; a first stage keeps the top ``first_stage_k`` notes by cosine).
      first_stage_k: notes the open-corpus first stage passes to the selectors.
    """

    pool_size: int = 1
    distractors: str = "random"
    pool_seed: int = 0
    candidate_pool: str = "documents"
    first_stage_k: int = 300

    def __post_init__(self):
        from cdsjax.io.datasets import DISTRACTORS

        if int(self.pool_size) < 1:
            raise ValueError(f"config.pool_size must be >= 1, got {self.pool_size}")
        if self.distractors not in DISTRACTORS:
            raise ValueError(f"config.distractors must be one of {DISTRACTORS}, got {self.distractors!r}")
        if self.candidate_pool not in CANDIDATE_POOLS:
            raise ValueError(f"config.candidate_pool must be one of {CANDIDATE_POOLS}, "
                             f"got {self.candidate_pool!r}")
        if int(self.first_stage_k) < 1:
            raise ValueError(f"config.first_stage_k must be >= 1, got {self.first_stage_k}")


def pool_spec(config) -> Optional[PoolSpec]:
    """The config's :class:`PoolSpec`, or None when it sets none of :data:`POOL_FIELDS`
    (the plain one-document-per-question run, without pool metrics)."""
    given = {k: config[k] for k in POOL_FIELDS if k in config and config[k] is not None}
    if not given:
        return None
    for k in ("pool_size", "pool_seed", "first_stage_k"):
        if k in given:
            given[k] = int(given[k])
    return PoolSpec(**given)


@dataclasses.dataclass
class DocumentNotes:
    """The notes of one document (a PDF's index, or a text corpus).

    Attributes:
      embeddings: ``[n, d]`` float32 L2-normalised.
      links: ``[n, n]`` bool, symmetric, False diagonal.
      note_ids: ``[n]`` ids, unique across the benchmark.
      pages, boxes: ``[n]`` page and box of each note (PDFs), or None (text).
      kinds: ``[n]`` :data:`~cdsjax.eval.problems.NOTE_KINDS` of each note, or None.
      sections: ``[n]`` paragraph group of each note (text), or None.
      texts: ``[n]`` the text of each note (what the answer metric searches), or None.
      describes: ``[n]`` the note id of the visual each note describes (``""`` for none), or None.
    """

    embeddings: np.ndarray
    links: np.ndarray
    note_ids: List[str]
    pages: Optional[List[int]] = None
    boxes: Optional[List[Tuple[float, float, float, float]]] = None
    kinds: Optional[List[str]] = None
    sections: Optional[List[int]] = None
    texts: Optional[List[str]] = None
    describes: Optional[List[str]] = None


def document_notes(bench, config, embedder, *, cache_dir: pathlib.Path,
                   progress: bool = False) -> Dict[str, DocumentNotes]:
    """:class:`DocumentNotes` of every document or corpus of ``bench``, in its order.

    PDFs are indexed as :func:`pdf_problems` does (same cache); a text benchmark's
    corpora are embedded in one call over all of them (same cache entry as a full
    one-document-per-question run when every corpus has questions).
    """
    out: Dict[str, DocumentNotes] = {}
    if bench.corpora:
        ids = list(bench.corpora)
        texts = [t for c in ids for t in bench.corpora[c].texts]
        emb = cached_encode(cache_dir, bench.name, embedder, texts, queries=False, progress=progress)
        start = 0
        window = int(config.get("link_window", 1))
        for c in ids:
            corpus = bench.corpora[c]
            out[c] = DocumentNotes(emb[start:start + len(corpus)], text_links(corpus, window=window),
                                   list(corpus.note_ids), kinds=text_kinds(corpus),
                                   sections=text_sections(corpus), texts=list(corpus.texts))
            start += len(corpus)
        return out
    for d, idx in pdf_indexes(bench, list(bench.documents), config, embedder, cache_dir=cache_dir,
                              progress=progress).items():
        out[d] = DocumentNotes(
            np.asarray(idx.embeddings, np.float32), np.asarray(idx.links, bool),
            [f"{d}#{note['reading_order']}" for note in idx.notes],
            [int(note["page"]) for note in idx.notes],
            [tuple(float(v) for v in note["bbox"]) for note in idx.notes],
            kinds=[index_note_kind(note) for note in idx.notes],
            texts=[note_text(note) for note in idx.notes],
            describes=described_ids(d, idx.notes))
    return out


def document_vectors(notes: Mapping[str, DocumentNotes]) -> Dict[str, np.ndarray]:
    """``doc -> [d]`` mean note embedding, L2-normalised (what ``"similar"`` compares)."""
    out = {}
    for d, dn in notes.items():
        v = np.asarray(dn.embeddings, np.float64).mean(axis=0)
        out[d] = v / max(float(np.linalg.norm(v)), 1e-12)
    return out


def pool_problem(query, query_emb: np.ndarray, doc_ids: Sequence[str], notes: Mapping[str, DocumentNotes],
                 gold_docs: Sequence[str]) -> Problem:
    """One question's problem over the notes of ``doc_ids``, concatenated in that order;
    links stay within each document."""
    from cdsjax.core.validation import validate_embeddings

    parts = [notes[d] for d in doc_ids]
    emb = np.concatenate([p.embeddings for p in parts]).astype(np.float32)
    links = block_links([p.links for p in parts])
    validate_embeddings(emb, query_emb)
    pdf = parts[0].pages is not None
    return Problem(
        query, emb, np.asarray(query_emb, np.float32), links,
        note_ids=[i for p in parts for i in p.note_ids],
        docs=[d for d, p in zip(doc_ids, parts) for _ in p.note_ids],
        pages=[g for p in parts for g in p.pages] if pdf else None,
        boxes=[b for p in parts for b in p.boxes] if pdf else None,
        pool=tuple(doc_ids), gold_docs=tuple(gold_docs),
        kinds=_joined(parts, "kinds"), sections=_joined(parts, "sections"), texts=_joined(parts, "texts"),
        describes=_joined(parts, "describes"))


def _joined(parts: Sequence[DocumentNotes], field: str) -> Optional[list]:
    """``field`` of several documents' notes concatenated, or None when one of them lacks it."""
    values = [getattr(p, field) for p in parts]
    return None if any(v is None for v in values) else [x for v in values for x in v]


def top_k_notes():
    """A new ``jit((q [b, d], z [N, d], k) -> [b, k] top positions of q @ z.T)``, compiled once per shape by the
    object returned (a caller that searches more than once keeps it: :func:`first_stage`'s ``top_k``)."""
    import jax

    return jax.jit(lambda q, z, k: jax.lax.top_k(q @ z.T, k)[1], static_argnums=2)


def first_stage(query_emb: np.ndarray, notes: np.ndarray, k: int, *, chunk: int = 256,
                top_k: Optional[Callable] = None) -> np.ndarray:
    """Top-``k`` notes by exact cosine for each query: a ``jnp`` matmul and ``lax.top_k``.

    Args:
      query_emb: ``[b, d]`` L2-normalised queries.
      notes: ``[N, d]`` L2-normalised notes of the whole collection.
      k: notes kept per query (at most ``N``).
      chunk: queries per compiled call (bounds the ``[chunk, N]`` score matrix).
      top_k: the compiled search (:func:`top_k_notes`) of a caller that searches again; None: a new one.

    Returns:
      ``[b, min(k, N)]`` int note positions, best first.
    """
    import jax.numpy as jnp

    k = min(int(k), notes.shape[0])
    z = jnp.asarray(notes, jnp.float32)
    fn = top_k_notes() if top_k is None else top_k
    out = []
    for start in range(0, query_emb.shape[0], chunk):
        q = np.asarray(query_emb[start:start + chunk], np.float32)
        rows = q.shape[0]
        if rows < chunk and query_emb.shape[0] > chunk:  # one compiled shape for every chunk
            q = np.concatenate([q, np.repeat(q[:1], chunk - rows, axis=0)])
        out.append(np.asarray(fn(jnp.asarray(q), z, k))[:rows])
    return np.concatenate(out) if out else np.zeros((0, k), np.int64)


def corpus_problems(queries: Sequence[Any], query_emb: np.ndarray, notes: Mapping[str, DocumentNotes],
                    k: int) -> Tuple[List[Problem], float]:
    """Open-corpus problems: each question's candidates are the top-``k`` notes of the
    whole collection by cosine (:func:`first_stage`); links stay within a document.

    Returns:
      ``(problems, seconds the first stage took)``; a problem's ``pool`` lists the
      documents its candidates come from, in rank order of their best note.
    """
    doc_list = list(notes)
    emb = np.concatenate([notes[d].embeddings for d in doc_list]).astype(np.float32)
    doc_of = np.concatenate([np.full(len(notes[d].note_ids), i) for i, d in enumerate(doc_list)])
    local = np.concatenate([np.arange(len(notes[d].note_ids)) for d in doc_list])
    t0 = time.perf_counter()
    top = first_stage(query_emb, emb, k)
    seconds = time.perf_counter() - t0
    pdf = notes[doc_list[0]].pages is not None
    problems = []
    for q, qe, cand in zip(queries, query_emb, top):
        docs_idx, loc = doc_of[cand], local[cand]
        links = np.zeros((len(cand), len(cand)), bool)
        for di in np.unique(docs_idx):
            pos = np.flatnonzero(docs_idx == di)
            links[np.ix_(pos, pos)] = notes[doc_list[di]].links[np.ix_(loc[pos], loc[pos])]
        dn = [notes[doc_list[di]] for di in docs_idx]
        problems.append(Problem(
            q, emb[cand], np.asarray(qe, np.float32), links,
            note_ids=[n.note_ids[j] for n, j in zip(dn, loc)],
            docs=[doc_list[di] for di in docs_idx],
            pages=[n.pages[j] for n, j in zip(dn, loc)] if pdf else None,
            boxes=[n.boxes[j] for n, j in zip(dn, loc)] if pdf else None,
            kinds=None if any(n.kinds is None for n in dn) else [n.kinds[j] for n, j in zip(dn, loc)],
            sections=None if any(n.sections is None for n in dn) else [n.sections[j] for n, j in zip(dn, loc)],
            texts=None if any(n.texts is None for n in dn) else [n.texts[j] for n, j in zip(dn, loc)],
            describes=None if any(n.describes is None for n in dn) else [n.describes[j] for n, j in zip(dn, loc)],
            pool=tuple(dict.fromkeys(doc_list[di] for di in docs_idx)),
            gold_docs=tuple(q.meta.get("gold_docs", q.doc_ids))))
    return problems, seconds


def pooled_problems(config, spec: PoolSpec, embedder, *, cache_dir: pathlib.Path, progress: bool = False,
                    log: Callable[[str], None] = print):
    """The benchmark and problems of a pool or open-corpus run.

    The benchmark is loaded whole, pools are drawn over all its documents, and only
    then are the first ``config.max_queries`` questions kept, so a question's pool does
    not depend on how many are kept (nor on the process, shard or run).

    Returns:
      ``(benchmark, kind, problems, timings)``; ``timings`` holds the open-corpus
      first stage's seconds.
    """
    from cdsjax.io.datasets import with_pools

    full = load_configured_benchmark(config, all_queries=True)
    kind = benchmark_kind(full)
    timings: Dict[str, float] = {}
    if kind == "visdom":
        if spec.pool_size != 1 or spec.candidate_pool != "documents":
            raise ValueError(f"{full.name}: VisDoM questions come with their candidate pools; "
                             "set neither pool_size nor candidate_pool")
        bench = first_queries(full, config.get("max_queries", None))
        problems = pdf_problems(bench, config, embedder, cache_dir=cache_dir, progress=progress)
        for p in problems:
            p.pool = tuple(p.query.doc_ids)
            p.gold_docs = tuple(p.query.meta.get("gold_docs") or ()) or None
        return bench, kind, problems, timings
    notes = document_notes(full, config, embedder, cache_dir=cache_dir, progress=progress)
    tag = full.name if kind == "text" else full.name.replace("/", "_")
    qemb = cached_encode(cache_dir, tag, embedder, [q.question for q in full.queries], queries=True)
    m = config.get("max_queries", None)
    keep = len(full.queries) if m is None else min(int(m), len(full.queries))
    if spec.candidate_pool == "corpus":
        bench = first_queries(full, keep)
        problems, seconds = corpus_problems(bench.queries, qemb[:keep], notes, spec.first_stage_k)
        timings["first_stage"] = seconds
        log(f"open corpus: {sum(len(n.note_ids) for n in notes.values())} notes in {len(notes)} documents; "
            f"first stage (top {spec.first_stage_k}, exact cosine) for {keep} questions: {seconds:.3f} s")
        return bench, kind, problems, timings
    vectors = document_vectors(notes) if spec.distractors == "similar" else None
    pooled = with_pools(full, spec.pool_size, spec.distractors, doc_vectors=vectors, seed=spec.pool_seed)
    bench = first_queries(pooled, keep)
    problems = [pool_problem(q, qe, q.doc_ids, notes, q.meta["gold_docs"])
                for q, qe in zip(bench.queries, qemb[:keep])]
    return bench, kind, problems, timings
