"""Batch evaluation of selectors on a benchmark: problems -> sharded selection -> records.

The pieces, each usable alone:

* :class:`Problem` — one query's padded-free inputs: note embeddings, the query
  embedding, the note-link graph, and what each note is (id, document, page, box).
* :func:`run_selector` — pads problems into buckets, runs a selector ``jit(vmap)``
  per bucket with the batch axis sharded over a 1-D device mesh, and returns one
  NumPy :class:`~cdsjax.core.Selection` per problem.
* :func:`score_problem` — the retrieval metrics of one selection.
* :func:`evaluate` — everything for a config: load the benchmark, build or load
  indexes/embeddings, run every selector at every budget, append one JSONL record
  per (selector, budget, query) and resume from them, and summarise.

``experiments/run_eval.py`` is the command-line entry point.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import pathlib
import re
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from cdsjax.eval.records import drop_torn_tail, read_records, record_key
from cdsjax.eval import metrics as M

RECORDS_FILE = "records.jsonl"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
RUN_FILE = "run.json"
TIMINGS_FILE = "timings.jsonl"
SUMMARY_COLUMNS = ("benchmark", "selector", "metric", "mean", "ci_low", "ci_high", "n")

# Metric order in tables; a benchmark reports the ones its gold supports.
METRICS_PDF = ("page_recall", "box_recall", "all_pages_found", "distinct_pages", "redundancy")
METRICS_TEXT = ("paragraph_recall", "all_found", "best_annotator_recall", "redundancy")
METRICS_VISDOM = ("page_recall", "doc_recall", "distinct_pages", "redundancy")
# Scored when a question searches several documents (pools, the open corpus, VisDoM).
METRICS_POOL = ("gold_doc_share", "gold_doc_hit", "distinct_docs")
DIAGNOSTICS = ("num_iters", "converged", "kkt_residual", "objective", "support_size", "step")
# Diagnostics summarised next to the metrics (support_size: notes only; whole_support: the
# share of questions whose support is every note; num_filled: picks from outside the support).
SUMMARY_DIAGNOSTICS = ("converged", "kkt_residual", "num_iters", "support_size", "whole_support", "num_filled")


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
        (:data:`METRICS_POOL`) are scored.
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

    def __post_init__(self):
        n = self.notes.shape[0]
        if self.notes.ndim != 2 or n == 0:
            raise ValueError(f"query {self.query.qid}: notes must be [n>0, d], got {self.notes.shape}")
        if self.query_emb.shape != self.notes.shape[1:]:
            raise ValueError(f"query {self.query.qid}: query_emb shape {self.query_emb.shape} "
                             f"does not match notes {self.notes.shape}")
        if self.links.shape != (n, n):
            raise ValueError(f"query {self.query.qid}: links must be [{n}, {n}], got {self.links.shape}")
        for name in ("note_ids", "docs", "pages", "boxes"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"query {self.query.qid}: {name} has {len(v)} entries for {n} notes")


# --------------------------------------------------------------------------- selection


def jax_local_devices():
    """This process's devices (all of them unless several processes joined through jax.distributed)."""
    import jax

    return jax.local_devices()


def make_mesh(devices: Optional[Sequence[Any]] = None):
    """A 1-D mesh with axis ``"batch"`` over ``devices`` (default: all devices)."""
    import jax
    from jax.sharding import Mesh

    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.asarray(devices), ("batch",))


def _round_up(k: int, multiple: int) -> int:
    return -(-k // multiple) * multiple


_BATCHED: Dict[Any, Any] = {}


def _batched(fn, sharded: bool, chunk=None):
    """The jitted batch call, kept per function so repeated runs reuse compilations.

    Sharded over several devices: ``jit(vmap(fn))`` (each device solves its slice).
    On one device: :func:`cdsjax.core.batched` with ``chunk``, the selector's
    ``SelectorSpec.batch_chunk`` (paper-mode CDS: cache-sized chunks on a CPU, one
    ``vmap`` on an accelerator).
    """
    from cdsjax import core

    key = (fn, sharded, chunk)
    if key not in _BATCHED:
        _BATCHED[key] = core.batched(fn, chunk=None if sharded else chunk)
    return _BATCHED[key]


_SELECTOR_FNS: Dict[str, Any] = {}


def cached_selector(name: str, budget: int, options: Mapping[str, Any]):
    """:func:`cdsjax.core.make_selector`, memoised on (name, budget, options), so a
    second :func:`evaluate` in the same process does not compile again."""
    from cdsjax.core import make_selector

    key = json.dumps([name, int(budget), dict(options)], sort_keys=True, default=repr)
    if key not in _SELECTOR_FNS:
        _SELECTOR_FNS[key] = make_selector(name, budget=budget, **options)
    return _SELECTOR_FNS[key]


def run_selector(
    fn: Callable[..., Any],
    problems: Sequence[Problem],
    *,
    buckets: Sequence[int],
    max_batch: int = 64,
    mesh=None,
    keys: Optional[Sequence[Any]] = None,
    on_chunk: Optional[Callable[[List[int], List[Any]], None]] = None,
    dtype: Any = np.float32,
    chunk: Optional[Any] = None,
) -> List[Any]:
    """Runs a registry selector over ragged problems, batched and sharded.

    Problems are padded (trailing) into note-count buckets; each bucket is cut into
    chunks of at most ``max_batch`` problems, and a chunk's batch axis is padded to a
    power of two that the mesh size divides (repeating its first problem), so a run
    compiles once per (bucket, chunk size). Inputs are placed with
    ``NamedSharding(mesh, P("batch"))``: each device solves its slice of the batch.

    Args:
      fn: ``fn(notes [n, d], query [d], valid [n], links [n, n], key) -> Selection``
        (see :func:`cdsjax.core.make_selector`).
      problems: the problems, any note counts.
      buckets: allowed padded note counts.
      max_batch: most problems per compiled call (memory bound: CDS holds an
        ``[n+1, n+1]`` matrix per problem).
      mesh: a 1-D mesh from :func:`make_mesh` (default: all devices).
      keys: one PRNG key per problem (default: derived from each query id).
      on_chunk: called with (problem positions, their selections) after each chunk,
        e.g. to write records as they come.
      dtype: float type of the embeddings fed to the selector (float64 needs
        ``jax_enable_x64``; it lets converged-mode solvers go below float32's KKT floor).
      chunk: the selector's ``SelectorSpec.batch_chunk`` (how a one-device batch is cut).

    Returns:
      One Selection with NumPy leaves per problem, in input order.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from cdsjax import core

    if not problems:
        return []
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    dtype = np.dtype(dtype)
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        raise ValueError("dtype float64 needs jax_enable_x64 (config.dtype='float64' sets it)")
    mesh = make_mesh() if mesh is None else mesh
    ndev = int(mesh.devices.size)
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    if keys is None:
        keys = [core.key_from_query_id(p.query.qid) for p in problems]
    keys = jnp.stack(list(keys))

    groups = core.make_buckets(
        [np.asarray(p.notes, dtype) for p in problems],
        [np.asarray(p.query_emb, dtype) for p in problems],
        buckets=buckets, extras={"links": [np.asarray(p.links, bool) for p in problems]},
        pad_batch=False)
    call = _batched(fn, sharded=ndev > 1, chunk=chunk)
    out: List[Any] = [None] * len(problems)
    for g in groups:
        for start in range(0, len(g.positions), max_batch):
            rows = np.arange(start, min(start + max_batch, len(g.positions)))
            k = len(rows)
            size = _round_up(max(1 << (k - 1).bit_length(), 1), ndev)
            padded = np.concatenate([rows, np.full(size - k, rows[0])])
            args = [g.notes[padded], g.queries[padded], g.valid[padded],
                    g.extras["links"][padded]]
            args = [jax.device_put(a, sharding) for a in args]
            key_batch = jax.device_put(keys[g.positions[padded]], sharding)
            sel = jax.device_get(call(*args, key_batch))
            positions = [int(g.positions[r]) for r in rows]
            chunk = [jax.tree_util.tree_map(lambda a, i=i: np.asarray(a[i]), sel)
                     for i in range(k)]
            for pos, s in zip(positions, chunk):
                out[pos] = s
            if on_chunk is not None:
                on_chunk(positions, chunk)
    return out


# --------------------------------------------------------------------------- scoring


def _finite_or_none(v: float) -> Optional[float]:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def score_problem(problem: Problem, selection: Any, *, kind: str) -> Dict[str, Optional[float]]:
    """The retrieval metrics of one selection.

    Args:
      problem: the problem that was solved.
      selection: its Selection (NumPy leaves).
      kind: ``"pdf"`` (page / box metrics), ``"visdom"`` (page / document metrics) or
        ``"text"`` (paragraph metrics).

    Returns:
      ``metric -> value``; None where the query has no gold for that metric.
    """
    idx = np.asarray(selection.indices)[np.asarray(selection.selected_valid, bool)]
    idx = [int(i) for i in idx]
    q = problem.query
    out: Dict[str, Optional[float]] = {"num_selected": float(len(idx))}
    if kind in ("pdf", "visdom"):
        pages = [(problem.docs[i], problem.pages[i]) for i in idx]
        pr = M.page_recall(pages, q.gold_pages)
        out["page_recall"] = pr
        out["distinct_pages"] = float(M.distinct_pages(pages))
        if kind == "pdf":
            out["all_pages_found"] = M.all_found(pr)
            regions = [(problem.docs[i], problem.pages[i], problem.boxes[i]) for i in idx]
            out["box_recall"] = M.box_recall(regions, q.gold_boxes)
        else:
            out["doc_recall"] = M.doc_recall([problem.docs[i] for i in idx], q.gold_pages.keys())
    elif kind == "text":
        chosen = [problem.note_ids[i] for i in idx]
        rec = M.paragraph_recall(chosen, q.gold_note_ids)
        out["paragraph_recall"] = rec
        out["all_found"] = M.all_found(rec)
        if "gold_per_annotator" in q.meta:
            out["best_annotator_recall"] = M.best_annotator_recall(
                chosen, q.meta["gold_per_annotator"])
    else:
        raise ValueError(f"kind must be 'pdf', 'visdom' or 'text', got {kind!r}")
    out["redundancy"] = M.redundancy(np.asarray(problem.notes)[idx]) if idx else float("nan")
    if problem.gold_docs is not None:
        out.update(score_pool(problem, idx))
    return {k: _finite_or_none(v) for k, v in out.items()}


def score_pool(problem: Problem, idx: Sequence[int]) -> Dict[str, float]:
    """The pool metrics of selected note positions ``idx``: share of selected notes from
    a gold document, whether any is, and how many documents the selection spans."""
    docs = [problem.docs[i] for i in idx]
    gold = problem.gold_docs or ()
    return {"gold_doc_share": M.gold_doc_share(docs, gold), "gold_doc_hit": M.gold_doc_hit(docs, gold),
            "distinct_docs": float(M.distinct_docs(docs))}


def diagnostics(selection: Any, num_notes: Optional[int] = None) -> Dict[str, Any]:
    """Solver diagnostics of a CDS selection as plain numbers ({} for baselines).

    ``support_size`` counts notes (not the query) with equilibrium weight above the
    support threshold; ``num_filled`` / ``fill_reason`` say how many picks came from
    outside the support and why (:mod:`cdsjax.core.ranking`); ``beta`` is the
    note-block strength used. With ``num_notes`` (the problem's real note count),
    ``whole_support`` says whether the support was every note.
    """
    from cdsjax.core.types import FILL_REASONS

    res = getattr(selection, "result", None)
    if res is None:
        return {}
    out = {}
    for name in DIAGNOSTICS:
        if name == "support_size":
            continue  # the solver's count includes the query vertex; the notes-only one is below
        v = np.asarray(getattr(res, name))
        out[name] = bool(v) if v.dtype == bool else (int(v) if v.dtype.kind in "iu" else float(v))
    if getattr(selection, "support_size", None) is not None:
        out["support_size"] = int(np.asarray(selection.support_size))
        out["num_filled"] = int(np.asarray(selection.num_filled))
        out["fill_reason"] = FILL_REASONS[int(np.asarray(selection.fill_reason))]
        if num_notes is not None:
            out["whole_support"] = bool(out["support_size"] >= int(num_notes))
    if getattr(selection, "beta", None) is not None:
        out["beta"] = float(np.asarray(selection.beta))
    return out


# --------------------------------------------------------------------------- records & summaries


def summary_rows(records: Iterable[Mapping[str, Any]], metric_names: Sequence[str], *,
                 num_resamples: int = 10_000, seed: int = 0) -> List[dict]:
    """Rows of ``summary.csv``: per (benchmark, selector) and metric ``name@B``, the mean
    over queries with a 95% percentile-bootstrap interval (NaN/None skipped)."""
    flat = []
    for r in records:
        row = {"benchmark": r["benchmark"], "selector": r["selector"]}
        for m in metric_names:
            row[f"{m}@{r['budget']}"] = r["metrics"].get(m)
        for d in SUMMARY_DIAGNOSTICS:
            if d in r.get("diagnostics", {}):
                row[f"{d}@{r['budget']}"] = float(r["diagnostics"][d])
        flat.append(row)
    names = []
    for row in flat:
        for k in row:
            if k not in ("benchmark", "selector") and k not in names:
                names.append(k)
    names.sort(key=lambda k: (int(k.rsplit("@", 1)[1]), _metric_rank(k.rsplit("@", 1)[0], metric_names)))
    rows = M.summarize(flat, names, num_resamples=num_resamples, seed=seed)
    return [r for r in rows if r["n"] > 0]


def _metric_rank(name: str, metric_names: Sequence[str]) -> int:
    order = list(metric_names) + list(SUMMARY_DIAGNOSTICS)
    return order.index(name) if name in order else len(order)


def write_summary_csv(rows: Sequence[Mapping[str, Any]], path: pathlib.Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(SUMMARY_COLUMNS))
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in SUMMARY_COLUMNS})


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One table per benchmark and budget: selectors as rows, metrics as columns, cells
    ``mean [ci_low, ci_high]`` (``n`` in the header when the whole column shares it)."""
    out = []
    groups: Dict[Tuple[str, str], list] = {}
    for r in rows:
        metric, _, budget = r["metric"].rpartition("@")
        groups.setdefault((r["benchmark"], budget), []).append(dict(r, metric=metric))
    for (bench, budget), sub in groups.items():
        metrics = list(dict.fromkeys(r["metric"] for r in sub))
        selectors = list(dict.fromkeys(r["selector"] for r in sub))
        cell = {(r["selector"], r["metric"]): r for r in sub}
        header = []
        for m in metrics:
            ns = {cell[(s, m)]["n"] for s in selectors if (s, m) in cell}
            header.append(f"{m} (n={ns.pop()})" if len(ns) == 1 else m)
        buf = io.StringIO()
        buf.write(f"### {bench}, budget {budget}\n\n| selector | " + " | ".join(header) + " |\n")
        buf.write("|---|" + "---|" * len(metrics) + "\n")
        for s in selectors:
            cells = ["" if (s, m) not in cell else _fmt_cell(cell[(s, m)]) for m in metrics]
            buf.write(f"| {s} | " + " | ".join(cells) + " |\n")
        out.append(buf.getvalue())
    return "\n".join(out)


def _fmt_cell(r: Mapping[str, Any]) -> str:
    m, lo, hi = r["mean"], r["ci_low"], r["ci_high"]
    if abs(m) >= 100 or (abs(m) < 1e-3 and m != 0):
        return f"{m:.3g} [{lo:.3g}, {hi:.3g}]"
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def write_timings(out_dir: pathlib.Path, seconds: Mapping[str, float], counts: Mapping[str, int]) -> None:
    """Appends this invocation's wall times to ``timings.jsonl``: seconds per
    ``selector@B`` (compilation included) with the number of questions it solved, and
    the open-corpus first stage."""
    entry = {"seconds": {k: round(float(v), 4) for k, v in seconds.items()},
             "questions": {k: int(v) for k, v in counts.items() if v}}
    with open(out_dir / TIMINGS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def fingerprint(obj: Any) -> str:
    """Short stable hash of a JSON-serialisable object."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- problems


def _benchmark_kind(bench) -> str:
    if bench.corpora:
        return "text"
    return "visdom" if bench.name.startswith("visdom") else "pdf"


def metric_names(kind: str, pooled: bool = False) -> Tuple[str, ...]:
    names = {"pdf": METRICS_PDF, "visdom": METRICS_VISDOM, "text": METRICS_TEXT}[kind]
    return names + METRICS_POOL if pooled else names


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


def _cached_encode(cache_dir: pathlib.Path, tag: str, embedder, texts: Sequence[str], *,
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


def text_problems(bench, embedder, *, cache_dir: pathlib.Path, link_window: int = 1,
                  progress: bool = False) -> List[Problem]:
    """Problems of a text benchmark: each query searches its corpus's notes."""
    from cdsjax import core

    corpus_ids = list(dict.fromkeys(q.doc_ids[0] for q in bench.queries))
    texts = [t for c in corpus_ids for t in bench.corpora[c].texts]
    note_emb = _cached_encode(cache_dir, bench.name, embedder, texts, queries=False, progress=progress)
    query_emb = _cached_encode(cache_dir, bench.name, embedder,
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
        core.validate_embeddings(note_emb[lo:hi], qe)
        corpus = bench.corpora[c]
        problems.append(Problem(q, note_emb[lo:hi], qe, links[c], list(corpus.note_ids),
                                [c] * len(corpus)))
    return problems


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
    from cdsjax import core

    needed = list(dict.fromkeys(d for q in bench.queries for d in q.doc_ids))
    indexes = pdf_indexes(bench, needed, config, embedder, cache_dir=cache_dir, progress=progress)
    query_emb = _cached_encode(cache_dir, bench.name.replace("/", "_"), embedder,
                               [q.question for q in bench.queries], queries=True)
    problems = []
    for q, qe in zip(bench.queries, query_emb):
        parts = [indexes[d] for d in q.doc_ids]
        notes = np.concatenate([p.embeddings for p in parts]).astype(np.float32)
        n = notes.shape[0]
        links = np.zeros((n, n), bool)
        start = 0
        for p in parts:  # documents are not linked to each other
            links[start:start + len(p), start:start + len(p)] = p.links
            start += len(p)
        core.validate_embeddings(notes, qe)
        meta = [(d, note) for d, p in zip(q.doc_ids, parts) for note in p.notes]
        problems.append(Problem(
            q, notes, qe, links,
            note_ids=[f"{d}#{note['reading_order']}" for d, note in meta],
            docs=[d for d, _ in meta],
            pages=[int(note["page"]) for _, note in meta],
            boxes=[tuple(float(v) for v in note["bbox"]) for _, note in meta]))
    return problems


# --------------------------------------------------------------------------- pools and the open corpus

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
    """

    embeddings: np.ndarray
    links: np.ndarray
    note_ids: List[str]
    pages: Optional[List[int]] = None
    boxes: Optional[List[Tuple[float, float, float, float]]] = None


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
        emb = _cached_encode(cache_dir, bench.name, embedder, texts, queries=False, progress=progress)
        start = 0
        window = int(config.get("link_window", 1))
        for c in ids:
            corpus = bench.corpora[c]
            out[c] = DocumentNotes(emb[start:start + len(corpus)], text_links(corpus, window=window),
                                   list(corpus.note_ids))
            start += len(corpus)
        return out
    for d, idx in pdf_indexes(bench, list(bench.documents), config, embedder, cache_dir=cache_dir,
                              progress=progress).items():
        out[d] = DocumentNotes(
            np.asarray(idx.embeddings, np.float32), np.asarray(idx.links, bool),
            [f"{d}#{note['reading_order']}" for note in idx.notes],
            [int(note["page"]) for note in idx.notes],
            [tuple(float(v) for v in note["bbox"]) for note in idx.notes])
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
    from cdsjax import core

    parts = [notes[d] for d in doc_ids]
    emb = np.concatenate([p.embeddings for p in parts]).astype(np.float32)
    n = emb.shape[0]
    links = np.zeros((n, n), bool)
    start = 0
    for p in parts:
        m = len(p.note_ids)
        links[start:start + m, start:start + m] = p.links
        start += m
    core.validate_embeddings(emb, query_emb)
    pdf = parts[0].pages is not None
    return Problem(
        query, emb, np.asarray(query_emb, np.float32), links,
        note_ids=[i for p in parts for i in p.note_ids],
        docs=[d for d, p in zip(doc_ids, parts) for _ in p.note_ids],
        pages=[g for p in parts for g in p.pages] if pdf else None,
        boxes=[b for p in parts for b in p.boxes] if pdf else None,
        pool=tuple(doc_ids), gold_docs=tuple(gold_docs))


_TOP_K: Dict[str, Any] = {}


def _top_k_notes():
    """``jit((q [b, d], z [N, d], k) -> [b, k] top positions of q @ z.T)``, compiled once
    per shape (built lazily: this module imports JAX only when it computes)."""
    if "fn" not in _TOP_K:
        import jax

        _TOP_K["fn"] = jax.jit(lambda q, z, k: jax.lax.top_k(q @ z.T, k)[1], static_argnums=2)
    return _TOP_K["fn"]


def first_stage(query_emb: np.ndarray, notes: np.ndarray, k: int, *, chunk: int = 256) -> np.ndarray:
    """Top-``k`` notes by exact cosine for each query: a ``jnp`` matmul and ``lax.top_k``.

    Args:
      query_emb: ``[b, d]`` L2-normalised queries.
      notes: ``[N, d]`` L2-normalised notes of the whole collection.
      k: notes kept per query (at most ``N``).
      chunk: queries per compiled call (bounds the ``[chunk, N]`` score matrix).

    Returns:
      ``[b, min(k, N)]`` int note positions, best first.
    """
    import jax.numpy as jnp

    k = min(int(k), notes.shape[0])
    z = jnp.asarray(notes, jnp.float32)
    fn = _top_k_notes()
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
    import time

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
            pool=tuple(dict.fromkeys(doc_list[di] for di in docs_idx)),
            gold_docs=tuple(q.meta.get("gold_docs", q.doc_ids))))
    return problems, seconds


def _first_queries(bench, max_queries: Optional[int]):
    if max_queries is None:
        return bench
    return dataclasses.replace(bench, queries=list(bench.queries[: int(max_queries)]))


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
    kind = _benchmark_kind(full)
    timings: Dict[str, float] = {}
    if kind == "visdom":
        if spec.pool_size != 1 or spec.candidate_pool != "documents":
            raise ValueError(f"{full.name}: VisDoM questions come with their candidate pools; "
                             "set neither pool_size nor candidate_pool")
        bench = _first_queries(full, config.get("max_queries", None))
        problems = pdf_problems(bench, config, embedder, cache_dir=cache_dir, progress=progress)
        for p in problems:
            p.pool = tuple(p.query.doc_ids)
            p.gold_docs = tuple(p.query.meta.get("gold_docs") or ()) or None
        return bench, kind, problems, timings
    notes = document_notes(full, config, embedder, cache_dir=cache_dir, progress=progress)
    tag = full.name if kind == "text" else full.name.replace("/", "_")
    qemb = _cached_encode(cache_dir, tag, embedder, [q.question for q in full.queries], queries=True)
    m = config.get("max_queries", None)
    keep = len(full.queries) if m is None else min(int(m), len(full.queries))
    if spec.candidate_pool == "corpus":
        bench = _first_queries(full, keep)
        problems, seconds = corpus_problems(bench.queries, qemb[:keep], notes, spec.first_stage_k)
        timings["first_stage"] = seconds
        log(f"open corpus: {sum(len(n.note_ids) for n in notes.values())} notes in {len(notes)} documents; "
            f"first stage (top {spec.first_stage_k}, exact cosine) for {keep} questions: {seconds:.3f} s")
        return bench, kind, problems, timings
    vectors = document_vectors(notes) if spec.distractors == "similar" else None
    pooled = with_pools(full, spec.pool_size, spec.distractors, doc_vectors=vectors, seed=spec.pool_seed)
    bench = _first_queries(pooled, keep)
    problems = [pool_problem(q, qe, q.doc_ids, notes, q.meta["gold_docs"])
                for q, qe in zip(bench.queries, qemb[:keep])]
    return bench, kind, problems, timings


def load_problems(config, embedder, *, cache_dir: pathlib.Path, progress: bool = False,
                  log: Callable[[str], None] = print):
    """``(benchmark, kind, problems, timings)`` of a config: one document per question,
    or pools / the open corpus when the config sets :data:`POOL_FIELDS`."""
    spec = pool_spec(config)
    if spec is not None:
        bench, kind, problems, timings = pooled_problems(config, spec, embedder, cache_dir=cache_dir,
                                                         progress=progress, log=log)
    else:
        bench, timings = load_configured_benchmark(config), {}
        kind = _benchmark_kind(bench)
        if kind == "text":
            problems = text_problems(bench, embedder, cache_dir=cache_dir,
                                     link_window=int(config.get("link_window", 1)), progress=progress)
        elif bench.queries:
            problems = pdf_problems(bench, config, embedder, cache_dir=cache_dir, progress=progress)
        else:
            problems = []
    if not bench.queries:
        raise ValueError(f"benchmark {config.benchmark!r} has no queries "
                         f"(max_queries={config.get('max_queries', None)})")
    return bench, kind, problems, timings


def pool_fields(problem: Problem) -> Dict[str, Any]:
    """What a record says about the problem's candidates (``pool_documents``)."""
    return {} if problem.pool is None else {"pool_documents": list(problem.pool)}


# --------------------------------------------------------------------------- the run


def selector_specs(config) -> List[Tuple[str, str, dict]]:
    """``(label, registry name, options)`` per entry of ``config.selectors``.

    ``config.selectors`` is a list (or comma-separated string) of labels;
    ``config.selector_options[label]`` holds that selector's options, and its
    optional ``selector`` key names the registry entry (default: the label), so
    one selector can appear under several labels with different options. Options of
    labels that are not selected are ignored (so a config can keep them all).
    """
    from cdsjax.core import selector_names, selector_spec

    labels = config.selectors
    if isinstance(labels, str):
        labels = [s.strip() for s in labels.split(",") if s.strip()]
    labels = list(labels)
    if not labels:
        raise ValueError("config.selectors is empty")
    if len(set(labels)) != len(labels):
        raise ValueError(f"config.selectors has duplicates: {labels}")
    all_opts = config.get("selector_options", None) or {}
    if hasattr(all_opts, "to_dict"):
        all_opts = all_opts.to_dict()
    specs = []
    for label in labels:
        opts = dict(all_opts.get(label, {}))
        name = opts.pop("selector", label)
        try:
            name = selector_spec(name).name  # an alias (cds-paper) names its registry entry
        except ValueError:
            raise ValueError(f"config.selectors: unknown selector {name!r} (label {label!r}); "
                             f"known: {list(selector_names())}") from None
        specs.append((label, name, opts))
    return specs


def budgets_of(config) -> List[int]:
    budgets = list(config.get("budgets", None) or []) or [config.budget]
    for b in budgets:
        if int(b) < 1:
            raise ValueError(f"budgets must be >= 1, got {b}")
    return sorted(dict.fromkeys(int(b) for b in budgets))


def _run_identity(config) -> dict:
    """What must match for records in ``output_dir`` to be resumed."""
    keep = ("benchmark", "data_root", "loader", "ingest", "enrich", "embedder", "link_window", "dtype",
            "pool_size", "distractors", "pool_seed", "candidate_pool", "first_stage_k")
    out = {}
    for k in keep:
        if k in config:
            v = config[k]
            out[k] = v.to_dict() if hasattr(v, "to_dict") else v
    from cdsjax.io.datasets import resolve_data_root

    out["data_root"] = str(resolve_data_root(config.data_root))
    return out


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


def evaluate(config, *, progress: bool = True, log: Callable[[str], None] = print, process=None):
    """Runs every configured selector at every budget on the configured benchmark.

    Writes into ``config.output_dir``: ``records.jsonl`` (one line per selector,
    budget and query, appended as results come, so an interrupted run resumes where
    it stopped), ``summary.csv`` (benchmark, selector, metric, mean, ci_low, ci_high,
    n; metrics are named ``metric@B``), ``summary.md`` and ``run.json``.

    With ``process`` (a :class:`cdsjax.eval.distributed.Process`, one of several joined by
    ``jax.distributed``), this process answers its share of the questions (whole compiled chunks,
    :func:`cdsjax.eval.distributed.split_problems`) and appends to its own shard; process 0 merges the shards and writes the
    summary (the others return empty lists).

    Returns:
      ``(records, summary rows)`` for the queries and selectors of this config.
    """
    from cdsjax.core import DEFAULT_BUCKETS, selector_spec
    from cdsjax.io.embed import Embedder

    if process is not None:
        process = process.join()  # before anything starts JAX's backend

    dtype = str(config.get("dtype", "float32"))
    if dtype not in ("float32", "float64"):
        raise ValueError(f"config.dtype must be 'float32' or 'float64', got {dtype!r}")
    if dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    specs = selector_specs(config)
    budgets = budgets_of(config)
    out_dir = pathlib.Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    identity = _run_identity(config)
    run_file = out_dir / RUN_FILE
    records_path = out_dir / RECORDS_FILE
    lead = process is None or process.index == 0
    if lead and run_file.is_file() and records_path.is_file():
        previous = json.loads(run_file.read_text())
        if previous.get("identity") != identity:
            changed = sorted(k for k in set(previous.get("identity", {})) | set(identity)
                             if previous.get("identity", {}).get(k) != identity.get(k))
            raise ValueError(f"{out_dir} holds records of a different run (changed: {changed}); "
                             "use another output_dir or delete it")
    if lead:
        run_file.write_text(json.dumps({"identity": identity}, indent=1, default=str))

    cache_dir = pathlib.Path(config.get("cache_dir", "") or out_dir / "cache")
    embedder = Embedder(config)
    if not lead:  # process 0 fills the caches (indexes, question vectors) first; the others read them
        process.barrier("prepared")
    bench, kind, problems, timings = load_problems(config, embedder, cache_dir=cache_dir,
                                                   progress=progress, log=log)
    if process is not None and lead:
        process.barrier("prepared")
    pooled = any(p.gold_docs is not None for p in problems)

    from cdsjax.eval import distributed as D

    if process is not None:
        records_path = D.shard_path(out_dir, process.index, process.count)
    drop_torn_tail(records_path)
    done = {record_key(r) for path in [out_dir / RECORDS_FILE, *D.shard_files(out_dir)]
            for r in read_records(path)}
    buckets = tuple(config.get("buckets", None) or DEFAULT_BUCKETS)
    max_batch = int(config.get("max_batch", 64))
    if process is None:
        mine = problems
    else:
        split = D.split_problems([p.notes.shape[0] for p in problems], process.count, buckets=buckets,
                                 max_batch=max_batch)
        mine = [problems[i] for i in split[process.index]]
    todo = {(label, b): [p for p in mine if (bench.name, label, b, p.query.qid) not in done]
            for label, _, _ in specs for b in budgets}
    total = sum(len(v) for v in todo.values())
    if len(done):
        log(f"resuming: {len(mine) * len(specs) * len(budgets) - total} of "
            f"{len(mine) * len(specs) * len(budgets)} (selector, budget, query) results on disk")
    mesh = make_mesh(jax_local_devices())
    bar = None
    if progress and total:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"select {bench.name}", unit="query")
    with open(records_path, "a", encoding="utf-8") as f:
        for label, name, opts in specs:
            for b in budgets:
                batch = todo[(label, b)]
                if not batch:
                    continue
                fn = cached_selector(name, b, opts)

                def write(positions, sels, batch=batch, label=label, b=b):
                    for pos, sel in zip(positions, sels):
                        p = batch[pos]
                        mask = np.asarray(sel.selected_valid, bool)
                        idx = [int(i) for i in np.asarray(sel.indices)[mask]]
                        rec = {
                            "benchmark": bench.name, "selector": label, "budget": b,
                            "qid": p.query.qid, "num_notes": int(p.notes.shape[0]),
                            "selected": [p.note_ids[i] for i in idx],
                            "scores": [float(s) for s in np.asarray(sel.scores)[mask]],
                            "metrics": score_problem(p, sel, kind=kind),
                            "diagnostics": diagnostics(sel, num_notes=int(p.notes.shape[0])),
                        }
                        if p.pages is not None:
                            rec["pages"] = [[p.docs[i], p.pages[i]] for i in idx]
                        rec.update(pool_fields(p))
                        f.write(json.dumps(rec) + "\n")
                    f.flush()
                    if bar is not None:
                        bar.update(len(positions))

                t0 = time.perf_counter()
                run_selector(fn, batch, buckets=buckets, max_batch=max_batch, chunk=selector_spec(name).batch_chunk,
                             mesh=mesh, on_chunk=write, dtype=np.dtype(dtype))
                timings[f"{label}@{b}"] = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    write_timings(out_dir, timings, {f"{label}@{b}": len(todo[(label, b)]) for label, _, _ in specs
                                     for b in budgets})  # one line per process (appended whole)
    if process is not None:
        process.barrier("selected")
        if not lead:
            return [], []

    records = D.merged_records(out_dir, RECORDS_FILE, bench.name, specs, budgets, problems,
                               merge=process is not None)
    rows = summary_rows(records, metric_names(kind, pooled),
                        num_resamples=int(config.get("num_resamples", 10_000)))
    write_summary_csv(rows, out_dir / SUMMARY_CSV)
    table = markdown_table(rows)
    (out_dir / SUMMARY_MD).write_text(table)
    log(table)
    return records, rows
