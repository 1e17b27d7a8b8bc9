"""Evaluating the planning agent on a benchmark: retrieval metrics of its evidence, and answers.

For each question the agent runs against the question's own notes (the same problems the selector
harness builds, :mod:`cdsjax.eval.problems`) and is scored four ways with the harness's metrics:

* ``final``: the evidence the reasoner read (the deduplicated union of the probe and the last round's
  sub-question evidence, at most ``max_final_evidence`` notes);
* ``explored``: every distinct note retrieved in any round;
* ``probe``: the single selection for the question itself (the selector alone, ``budget`` notes);
* ``cosine_matched``: cosine top-k with k = the size of ``final`` (a control: how much of the gain is
  just reading more notes).

With a judge configured, the agent's answer is also graded (``accuracy``). Records go to
``<output_dir>/planning_records.jsonl`` (one line per variant and question); the summary (mean with a
95% bootstrap interval) to ``planning_summary.csv`` / ``.md``. ``experiments/eval_planning.py`` is the
command-line entry point.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

VIEWS = ("final", "explored", "probe", "cosine_matched")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One configuration of the agent's retrieval.

    Attributes:
      label: its name in records and tables.
      selector: registry selector name.
      options: selector options.
      combined: None, "single" or "peel".
    """

    label: str
    selector: str
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    combined: Optional[str] = None


def parse_variants(spec: str) -> List[Variant]:
    """Variants from ``"cosine,subgraph,cds,cds+single,cds+peel"`` (``selector[+combined]``)."""
    out = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        selector, _, combined = part.partition("+")
        if combined not in ("", "single", "peel"):
            raise ValueError(f"variant {part!r}: the combined mode must be 'single' or 'peel', got {combined!r}")
        out.append(Variant(part, selector, {}, combined or None))
    if not out:
        raise ValueError("no variants given")
    if len({v.label for v in out}) != len(out):
        raise ValueError(f"duplicate variants in {spec!r}")
    return out


def problem_notes(bench, problem, kind: str, config, cache_dir: pathlib.Path) -> List[dict]:
    """The note dicts (ids, documents, pages, text) of one problem, in the problem's note order."""
    if kind == "text":
        corpus = bench.corpora[problem.query.doc_ids[0]]
        return [dict(note_id=i, doc_id=corpus.corpus_id, page=0, kind="text", text=t, summary="")
                for i, t in zip(corpus.note_ids, corpus.texts)]
    from cdsjax.io.index import index_pdf

    notes = []
    for d in problem.query.doc_ids:  # cached by pdf_problems already: this only loads
        idx = index_pdf(bench.documents[d], config=config, cache_dir=cache_dir / "indexes")
        for note in idx.notes:
            notes.append(dict(note, note_id=f"{d}#{note['reading_order']}", doc_id=d))
    if [n["note_id"] for n in notes] != list(problem.note_ids):
        raise ValueError(f"query {problem.query.qid}: the index notes do not match the problem's notes")
    return notes


class CachedQueryEncoder:
    """Wraps an embedder so each distinct question or sub-question is encoded once per run (variants
    share their probes and many sub-questions)."""

    def __init__(self, embedder, known: Optional[Dict[str, np.ndarray]] = None):
        self.embedder = embedder
        self.cache: Dict[str, np.ndarray] = dict(known or {})

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            self.cache.update(zip(todo, np.asarray(self.embedder.encode_queries(todo), np.float32)))
        return np.stack([self.cache[t] for t in texts])


def _selection(indices: Sequence[int]):
    idx = np.asarray(list(indices), np.int64)
    return SimpleNamespace(indices=idx, selected_valid=np.ones(len(idx), bool))


def evaluate_planning(config, reader, variants: Sequence[Variant], *, budget: int, tau_max: int = 3,
                      max_final_evidence: int = 20, judge=None, output_dir=None,
                      log: Callable[[str], None] = print, progress: bool = False):
    """Runs the planning agent for every variant and question of the configured benchmark.

    Args:
      config: a selector-harness config (``configs/*.py``): benchmark, data_root, max_queries, loader,
        embedder, link_window, cache_dir.
      reader: ReaderConfig or Reader of the agent's model (a real server, or a scripted one).
      variants: retrieval configurations (see :func:`parse_variants`).
      budget: notes per sub-question (and of the probe).
      tau_max, max_final_evidence: agent options.
      judge: an optional :class:`~cdsjax.io.reading.judge.Judge` to grade answers against the gold answers.
      output_dir: where records and summaries go (default ``config.output_dir``).

    Returns:
      ``(records, summary rows)``.
    """
    from cdsjax.agents.agent import PlanningAgent
    from cdsjax.agents.retrieval import make_retriever
    from cdsjax.eval import metrics as M
    from cdsjax.eval import problems as P
    from cdsjax.eval import report, scoring
    from cdsjax.io.embed import Embedder

    out_dir = pathlib.Path(output_dir or config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bench = P.load_configured_benchmark(config)
    if not bench.queries:
        raise ValueError(f"benchmark {config.benchmark!r} has no queries")
    kind = P.benchmark_kind(bench)
    cache_dir = pathlib.Path(config.get("cache_dir", "") or out_dir / "cache")
    embedder = Embedder(config)
    if kind == "text":
        problems = P.text_problems(bench, embedder, cache_dir=cache_dir,
                                   link_window=int(config.get("link_window", 1)))
    else:
        problems = P.pdf_problems(bench, config, embedder, cache_dir=cache_dir)
    notes_of = [problem_notes(bench, p, kind, config, cache_dir) for p in problems]
    encoder = CachedQueryEncoder(embedder, {p.query.question: np.asarray(p.query_emb, np.float32) for p in problems})

    records = []
    path = out_dir / "planning_records.jsonl"
    iterator = [(v, k) for v in variants for k in range(len(problems))]
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc=f"planning {bench.name}", unit="query")
    compiled: Dict[str, dict] = {}
    with open(path, "w", encoding="utf-8") as f:
        for variant, k in iterator:
            p, notes = problems[k], notes_of[k]
            retrieve = make_retriever(p.notes, p.links, notes, encoder, selector=variant.selector, budget=budget,
                                      options=variant.options, compiled=compiled.setdefault(variant.label, {}))
            agent = PlanningAgent(reader, retrieve, combined=variant.combined, tau_max=tau_max,
                                  max_final_evidence=max_final_evidence)
            result = agent.run(p.query.question)
            position = {nid: i for i, nid in enumerate(p.note_ids)}
            final = [position[e.note_id] for e in result.evidence]
            explored = [position[e.note_id] for e in result.explored]
            probe = [position[e.note_id] for e in result.probe]
            rel = np.asarray(p.notes, np.float64) @ np.asarray(p.query_emb, np.float64)
            matched = list(np.argsort(-rel, kind="stable")[: len(final)])
            metrics = {view: scoring.score_problem(p, _selection(idx), kind=kind)
                       for view, idx in zip(VIEWS, (final, explored, probe, matched))}
            rec = {
                "benchmark": bench.name, "variant": variant.label, "budget": budget, "qid": p.query.qid,
                "metrics": metrics, "rounds": len(result.rounds), "llm_calls": result.llm_calls,
                "stop_reason": result.stop_reason, "answer": result.answer,
                "plans": [r.plan.to_dict() for r in result.rounds],
            }
            if judge is not None and p.query.answer:
                verdict = judge.judge(p.query.question, p.query.answer, result.answer)
                rec["accuracy"] = float(verdict.correct)
            f.write(json.dumps(rec, default=float) + "\n")
            f.flush()
            records.append(rec)

    metric_names = list(scoring.metric_names(kind)) + ["num_selected"]
    flat = []
    for r in records:
        for view in VIEWS:
            row = {"benchmark": r["benchmark"], "selector": f"{r['variant']}/{view}"}
            row.update({m: r["metrics"][view].get(m) for m in metric_names})
            if view == "final":
                row.update(rounds=r["rounds"], llm_calls=r["llm_calls"], accuracy=r.get("accuracy"))
            flat.append(row)
    names = metric_names + ["rounds", "llm_calls", "accuracy"]
    rows = [row for row in M.summarize(flat, names, num_resamples=int(config.get("num_resamples", 10_000)))
            if row["n"] > 0]
    report.write_summary_csv(rows, out_dir / "planning_summary.csv")
    table = report.markdown_table([dict(row, metric=f"{row['metric']}@{budget}") for row in rows])
    (out_dir / "planning_summary.md").write_text(table)
    log(table)
    return records, rows
