"""Selection problems of a benchmark: one query's notes, query vector, note links and what each note is.

* :class:`Problem` — the inputs of one query's selection and what is needed to score it.
* :func:`text_problems` / :func:`pdf_problems` — one problem per question over its own corpus or
  documents (PDFs indexed once, embeddings cached by content under ``cache_dir``).
* :func:`load_configured_benchmark` and :func:`benchmark_kind` — the config's benchmark and how it is
  scored. Pools and the open corpus: :mod:`cdsjax.eval.pools`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclasses.dataclass
class Problem:
    """One query's selection problem and what is needed to score it.

    Attributes:
      query: the benchmark :class:`~cdsjax.io.datasets.Query`.
      notes: ``[n, d]`` float32 L2-normalised note embeddings.
      query_emb: ``[d]`` float32 L2-normalised query embedding.
      links: ``[n, n]`` bool note-link adjacency (symmetric, False diagonal).
      note_ids: ``[n]`` note ids (corpus note ids for text benchmarks).
      docs: ``[n]`` document of each note.
      pages: ``[n]`` 0-based page of each note, or None (text benchmarks).
      boxes: ``[n]`` ``(x0, y0, x1, y1)`` of each note, or None.
      pool: the candidate documents the notes come from (pool and open-corpus runs;
        recorded as ``pool_documents``), or None.
      gold_docs: the question's own documents; when set, the pool metrics
        (:data:`cdsjax.eval.scoring.METRICS_POOL`) are scored.
      kinds: ``[n]`` kind of each note, one of :data:`NOTE_KINDS`, or None (unknown).
      sections: ``[n]`` paragraph group of each note on text benchmarks (consecutive paragraphs
        of one section; each caption alone), the text analogue of a page, or None.
      texts: ``[n]`` the text of each note (:func:`note_text`; what the answer metric searches), or None.
      describes: ``[n]`` the note id of the figure, table or chart each note describes (a caption's; ``""`` for
        none; :func:`cdsjax.pipeline.selection.described_notes`), or None (no note describes another).
      query_scores: ``[n]`` float32 the question's relevance of each note where it is not the embeddings' cosine
        (a hybrid relevance, :func:`with_relevance`), or None (dense: the core computes the cosine).
      context: ``[n]`` the text that placed each note when it was embedded and matched (document title, section;
        :func:`text_context`), or None (the note's own text).
    """

    query: Any
    notes: np.ndarray
    query_emb: np.ndarray
    links: np.ndarray
    note_ids: List[str]
    docs: List[str]
    pages: Optional[List[int]] = None
    boxes: Optional[List[Tuple[float, float, float, float]]] = None
    pool: Optional[Tuple[str, ...]] = None
    gold_docs: Optional[Tuple[str, ...]] = None
    kinds: Optional[List[str]] = None
    sections: Optional[List[int]] = None
    texts: Optional[List[str]] = None
    describes: Optional[List[str]] = None
    query_scores: Optional[np.ndarray] = None
    context: Optional[List[str]] = None

    def __post_init__(self):
        n = self.notes.shape[0]
        if self.notes.ndim != 2 or n == 0:
            raise ValueError(f"query {self.query.qid}: notes must be [n>0, d], got {self.notes.shape}")
        if self.query_emb.shape != self.notes.shape[1:]:
            raise ValueError(f"query {self.query.qid}: query_emb shape {self.query_emb.shape} "
                             f"does not match notes {self.notes.shape}")
        if self.links.shape != (n, n):
            raise ValueError(f"query {self.query.qid}: links must be [{n}, {n}], got {self.links.shape}")
        for name in ("note_ids", "docs", "pages", "boxes", "kinds", "sections", "texts", "describes",
                     "query_scores", "context"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"query {self.query.qid}: {name} has {len(v)} entries for {n} notes")


    def structure(self, pages_only: bool = False) -> Dict[str, np.ndarray]:
        """The structure arrays selectors take as keyword arguments, all ``[n]`` int32.

        ``doc_ids``: the position of each note's document among this problem's documents (first
        appearance order); ``pages``: the page (PDFs), else the paragraph group (:attr:`sections`),
        else each note its own unit; ``kinds``: the index into :data:`NOTE_KINDS` (``"other"`` when
        unknown); ``describes``: the position of the note each note describes (:attr:`describes`; -1 for none,
        and where that note is not among this problem's). Units of several documents are told apart by
        ``doc_ids`` with ``pages``.
        ``pages_only``: no paragraph groups — a text problem's notes are each their own unit (what the
        learned game reads: ``SelectorSpec.pages_only``).
        """
        n = self.notes.shape[0]
        order = {d: i for i, d in enumerate(dict.fromkeys(self.docs))}
        doc_ids = np.asarray([order[d] for d in self.docs], np.int32)
        if self.pages is not None:
            pages = np.asarray(self.pages, np.int32)
        elif self.sections is not None and not pages_only:
            pages = np.asarray(self.sections, np.int32)
        else:
            pages = np.arange(n, dtype=np.int32)
        other = NOTE_KINDS.index("other")
        kinds = (np.full(n, other, np.int32) if self.kinds is None else
                 np.asarray([NOTE_KINDS.index(k) if k in NOTE_KINDS else other for k in self.kinds], np.int32))
        position = {note_id: i for i, note_id in enumerate(self.note_ids)}
        describes = np.asarray([position.get(d, -1) if d else -1 for d in (self.describes or [""] * n)], np.int32)
        return {"doc_ids": doc_ids, "pages": pages, "kinds": kinds, "describes": describes}

    def answer_targets(self):
        """The gold answers the answer metric checks on this problem (:mod:`cdsjax.eval.answers`): those of its
        question that some note of the question's own documents contains, or None (not covered: no eligible
        answer, no note texts, or an answer in no note). Computed once per problem."""
        if "_answer_targets" not in self.__dict__:
            from cdsjax.eval.answers import answer_coverage, answer_targets

            targets = None if self.texts is None else answer_targets(self.query)
            if targets is not None:
                own = set(self.gold_docs or self.query.doc_ids)
                targets = answer_coverage([t for t, d in zip(self.texts, self.docs) if d in own], targets)
            self.__dict__["_answer_targets"] = targets
        return self.__dict__["_answer_targets"]


# The kinds a note may have, in the order of their integer codes (Problem.structure()["kinds"]).
NOTE_KINDS = ("text", "figure", "table", "chart", "page-image", "other")


def index_note_kind(note: Dict[str, Any]) -> str:
    """The :data:`NOTE_KINDS` entry of an index note: its ``kind``, or ``"page-image"`` for a
    full-page picture (role ``page-image``)."""
    if note.get("role") == "page-image":
        return "page-image"
    kind = note.get("kind")
    return kind if kind in NOTE_KINDS else "other"


def note_text(note: Dict[str, Any]) -> str:
    """The text of an index note that the answer metric searches: its text, caption, footnote and summary (each
    once; a figure's summary is what describes it to the reader)."""
    parts = [str(note.get(k) or "").strip() for k in ("text", "caption", "footnote", "summary")]
    return "\n".join(dict.fromkeys(p for p in parts if p))


def text_kinds(corpus) -> List[str]:
    """The :data:`NOTE_KINDS` of a text corpus's notes: paragraphs are ``"text"``; a caption is a
    ``"table"`` when it starts with "Table", else a ``"figure"``."""
    out = []
    for kind, text in zip(corpus.kinds, corpus.texts):
        if kind == "caption":
            out.append("table" if text.lstrip().lower().startswith("table") else "figure")
        else:
            out.append("text" if kind == "paragraph" else "other")
    return out


def text_sections(corpus) -> List[int]:
    """Paragraph groups of a text corpus, the text analogue of a page: consecutive paragraphs under
    the same section name share a group, and every caption (or a corpus without section names,
    e.g. HotpotQA, every paragraph) is a group of its own. Returns ``[n]`` group numbers from 0."""
    names = corpus.meta.get("sections") if corpus.meta else None
    out, group, last = [], -1, object()
    for i, kind in enumerate(corpus.kinds):
        name = names[i] if names is not None and i < len(names) else None
        if kind != "paragraph" or name is None or name != last:
            group += 1
        last = name if kind == "paragraph" else object()
        out.append(group)
    return out


def benchmark_kind(bench) -> str:
    """How a benchmark is scored: ``"text"`` (corpora of paragraphs), ``"visdom"`` or ``"pdf"``."""
    if bench.corpora:
        return "text"
    return "visdom" if bench.name.startswith("visdom") else "pdf"


def load_configured_benchmark(config, *, all_queries: bool = False):
    """The config's benchmark (its first ``config.max_queries`` questions unless
    ``all_queries``)."""
    from cdsjax.io.datasets import load_benchmark

    options = config.get("loader", None) or {}
    if hasattr(options, "to_dict"):
        options = options.to_dict()
    options = {k: v for k, v in options.items() if v is not None}
    max_queries = None if all_queries else config.get("max_queries", None)
    return load_benchmark(config.benchmark, config.data_root, max_queries, **options)


def first_queries(bench, max_queries: Optional[int]):
    """``bench`` with only its first ``max_queries`` questions (all of them for None)."""
    if max_queries is None:
        return bench
    return dataclasses.replace(bench, queries=list(bench.queries[: int(max_queries)]))


def fingerprint(obj: Any) -> str:
    """Short stable hash of a JSON-serialisable object."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


_FLOAT_LABEL = re.compile(r"^\s*(fig(?:ure)?\.?|table)\s*(\d+)", re.IGNORECASE)


def text_links(corpus, *, window: int = 1) -> np.ndarray:
    """Structural links of a text corpus: paragraphs within ``window`` of each other in
    reading order, and a caption ``"Figure N"``/``"Table N"`` with every paragraph that
    names it. Returns ``[n, n]`` bool, symmetric, False diagonal."""
    n = len(corpus)
    links = np.zeros((n, n), bool)
    par = [i for i, k in enumerate(corpus.kinds) if k == "paragraph"]
    for a, i in enumerate(par):
        for j in par[a + 1: a + 1 + max(0, window)]:
            links[i, j] = links[j, i] = True
    for i, kind in enumerate(corpus.kinds):
        if kind != "caption":
            continue
        m = _FLOAT_LABEL.match(corpus.texts[i])
        if not m:
            continue
        word = "fig" if m.group(1).lower().startswith("fig") else "table"
        pattern = (re.compile(rf"\b(?:fig(?:ure)?\.?|figs?\.)\s*{m.group(2)}\b", re.IGNORECASE)
                   if word == "fig" else re.compile(rf"\btables?\s*{m.group(2)}\b", re.IGNORECASE))
        for j in par:
            if pattern.search(corpus.texts[j]):
                links[i, j] = links[j, i] = True
    return links


def cached_encode(cache_dir: pathlib.Path, tag: str, embedder, texts: Sequence[str], *,
                   queries: bool, progress: bool = False) -> np.ndarray:
    """Embeds ``texts`` once per (embedder, texts); later runs load the ``.npy``."""
    info = {k: v for k, v in embedder.info().items() if k != "dim"}
    key = fingerprint({"info": info, "queries": queries, "texts": list(texts)})
    path = cache_dir / f"{tag}-{'q' if queries else 'd'}-{key}.npy"
    if path.is_file():
        arr = np.load(path)
        if arr.shape[0] == len(texts):
            return arr
    if queries:
        arr = embedder.encode_queries(list(texts), show_progress=progress)
    else:
        arr = embedder.encode_documents(list(texts), show_progress=progress)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")  # one per process: several may fill a cold cache
    np.save(tmp, arr)
    tmp.replace(path)  # atomic: a crash leaves no half-written cache
    return arr


def text_context(corpus) -> List[str]:
    """Each note of a text corpus with the words that place it: the document's title and, for a paragraph, its
    section's name (``"<text> (in: <title> / <section>)"``, :func:`cdsjax.io.placement.placed_text`); a note
    without either is its text alone. HotpotQA's
    paragraphs already begin with their page's title, and their corpora carry no other."""
    from cdsjax.io.placement import placed_text

    meta = corpus.meta or {}
    title = str(meta.get("title") or "").strip()
    names = meta.get("sections") or []
    out = []
    for i, (kind, text) in enumerate(zip(corpus.kinds, corpus.texts)):
        section = str(names[i] or "").strip() if kind == "paragraph" and i < len(names) else ""
        out.append(placed_text(text, title, section))
    return out


def text_problems(bench, embedder, *, cache_dir: pathlib.Path, link_window: int = 1,
                  progress: bool = False, context: bool = True) -> List[Problem]:
    """Problems of a text benchmark: each query searches its corpus's notes, embedded with their context
    (:func:`text_context`; ``context=False``: their own text alone)."""
    from cdsjax.core.validation import validate_embeddings

    corpus_ids = list(dict.fromkeys(q.doc_ids[0] for q in bench.queries))
    placed = {c: (text_context(bench.corpora[c]) if context else list(bench.corpora[c].texts)) for c in corpus_ids}
    texts = [t for c in corpus_ids for t in placed[c]]
    note_emb = cached_encode(cache_dir, bench.name, embedder, texts, queries=False, progress=progress)
    query_emb = cached_encode(cache_dir, bench.name, embedder,
                              [q.question for q in bench.queries], queries=True)
    offsets, start = {}, 0
    for c in corpus_ids:
        offsets[c] = (start, start + len(bench.corpora[c]))
        start += len(bench.corpora[c])
    links = {c: text_links(bench.corpora[c], window=link_window) for c in corpus_ids}
    problems = []
    for q, qe in zip(bench.queries, query_emb):
        if len(q.doc_ids) != 1:
            raise ValueError(f"text query {q.qid} must name exactly one corpus, got {q.doc_ids}")
        c = q.doc_ids[0]
        lo, hi = offsets[c]
        validate_embeddings(note_emb[lo:hi], qe)
        corpus = bench.corpora[c]
        problems.append(Problem(q, note_emb[lo:hi], qe, links[c], list(corpus.note_ids),
                                [c] * len(corpus), kinds=text_kinds(corpus),
                                sections=text_sections(corpus), texts=list(corpus.texts), context=placed[c]))
    return problems


def with_relevance(problems: Sequence[Problem], mode: str, weight: float, context: bool = False) -> List[Problem]:
    """``problems`` carrying each question's relevance row (:attr:`Problem.query_scores`) under ``mode``
    (:mod:`cdsjax.io.relevance`: ``dense`` leaves them as they are; ``hybrid`` fuses a BM25 match of the question
    in each note's text with the cosine; ``context``: its placed text, :attr:`Problem.context`). One BM25 index per
    corpus (the same notes), built once."""
    from cdsjax.io.relevance import LexicalIndex, check_relevance, fuse

    if check_relevance(mode) == "dense":
        return list(problems)
    indexes: Dict[tuple, Any] = {}
    out = []
    for p in problems:
        texts = p.context if context and p.context is not None else p.texts
        if texts is None:
            raise ValueError(f"query {p.query.qid}: hybrid relevance needs the notes' texts")
        key = tuple(p.note_ids)
        if key not in indexes:
            indexes[key] = LexicalIndex.build(texts)
        # in float64: a float64 evaluation computes its relevance with the digits a float32 one cannot hold
        dense = np.asarray(p.notes, np.float64) @ np.asarray(p.query_emb, np.float64)
        out.append(dataclasses.replace(p, query_scores=fuse(dense, indexes[key].scores(p.query.question), weight)))
    return out


def block_links(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """The note links of several documents' notes concatenated in order: each ``[n_i, n_i]`` block on
    the diagonal, documents not linked to each other. Returns ``[sum n_i, sum n_i]`` bool."""
    n = sum(len(b) for b in blocks)
    links = np.zeros((n, n), bool)
    start = 0
    for b in blocks:
        links[start:start + len(b), start:start + len(b)] = b
        start += len(b)
    return links


def pdf_indexes(bench, doc_ids: Sequence[str], config, embedder, *, cache_dir: pathlib.Path,
                progress: bool = False) -> Dict[str, Any]:
    """``doc -> index`` of the PDFs ``doc_ids`` of a PDF benchmark, each indexed once
    (cached by content and settings under ``cache_dir / "indexes"``), checked to be
    embedded by ``embedder``'s model."""
    from cdsjax.io.index import index_pdf, prebuild_documents

    want = {k: v for k, v in embedder.info().items() if k != "dim"}
    indexes = {}
    docs_iter = list(doc_ids)
    # the documents not yet in the cache are built in a process pool (as `cdsjax index --workers`)
    prebuild_documents([bench.documents[d] for d in docs_iter], config=config, cache_dir=cache_dir / "indexes",
                       workers=config.get("index_workers", None), progress=progress)
    if progress:
        from tqdm.auto import tqdm

        docs_iter = tqdm(docs_iter, desc=f"index {bench.name}", unit="doc")
    for doc_id in docs_iter:
        idx = index_pdf(bench.documents[doc_id], config=config, cache_dir=cache_dir / "indexes")
        got = {k: v for k, v in idx.embedder.items() if k != "dim"}
        if got != want:
            raise ValueError(f"index of {doc_id} was embedded with {got}, but questions would be "
                             f"encoded with {want}")
        indexes[doc_id] = idx
    return indexes


def pdf_problems(bench, config, embedder, *, cache_dir: pathlib.Path,
                 progress: bool = False) -> List[Problem]:
    """Problems of a PDF benchmark: each document is indexed once (cached by content
    and settings under ``cache_dir``); a query searches the notes of its documents."""
    from cdsjax.core.validation import validate_embeddings

    from cdsjax.io.placement import placed_text

    needed = list(dict.fromkeys(d for q in bench.queries for d in q.doc_ids))
    indexes = pdf_indexes(bench, needed, config, embedder, cache_dir=cache_dir, progress=progress)
    query_emb = cached_encode(cache_dir, bench.name.replace("/", "_"), embedder,
                              [q.question for q in bench.queries], queries=True)
    problems = []
    for q, qe in zip(bench.queries, query_emb):
        parts = [indexes[d] for d in q.doc_ids]
        notes = np.concatenate([p.embeddings for p in parts]).astype(np.float32)
        links = block_links([p.links for p in parts])
        validate_embeddings(notes, qe)
        meta = [(d, note) for d, p in zip(q.doc_ids, parts) for note in p.notes]
        problems.append(Problem(
            q, notes, qe, links,
            note_ids=[f"{d}#{note['reading_order']}" for d, note in meta],
            docs=[d for d, _ in meta],
            pages=[int(note["page"]) for _, note in meta],
            boxes=[tuple(float(v) for v in note["bbox"]) for _, note in meta],
            kinds=[index_note_kind(note) for _, note in meta],
            texts=[note_text(note) for _, note in meta],
            context=[placed_text(note_text(note), note.get("title"), note.get("section")) for _, note in meta],
            describes=[i for d, p in zip(q.doc_ids, parts) for i in described_ids(d, p.notes)]))
    return problems


def described_ids(doc_id: str, notes: Sequence[Dict[str, Any]]) -> List[str]:
    """The note id (``doc#reading_order``, as :func:`pdf_problems` names notes) of the visual each of one document's
    index notes describes (a caption's ``describes``, :func:`cdsjax.pipeline.selection.described_notes`), ``""``
    for none."""
    from cdsjax.pipeline.selection import described_notes

    return [f"{doc_id}#{notes[j]['reading_order']}" if j >= 0 else "" for j in described_notes(notes)]
