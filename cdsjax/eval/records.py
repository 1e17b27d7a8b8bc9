"""Evaluation records: one JSON line per (benchmark, selector, budget, question), written as results come
and read back for resuming and merging (shared by :func:`cdsjax.eval.evaluate` and the multi-process
merge), and ``run.json``, the identity a resumed run must match."""

from __future__ import annotations

import json
import pathlib
from typing import Any, List, Mapping, Tuple

import numpy as np

from cdsjax.eval.problems import Problem
from cdsjax.core.diagnostics import diagnostics
from cdsjax.eval.scoring import score_problem
from cdsjax.pipeline.abstain import judge, note_relevance, strength_features

RECORDS_FILE = "records.jsonl"
RUN_FILE = "run.json"


def read_records(path: pathlib.Path) -> List[dict]:
    """Reads a JSONL records file, skipping a torn last line (an interrupted write)."""
    if not path.is_file():
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not valid JSON") from None
    return records


def drop_torn_tail(path: pathlib.Path) -> None:
    """Cuts an unterminated last line (a write interrupted mid-record) so appends start
    on a fresh line."""
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        f.seek(0, 2)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def record_key(r: Mapping[str, Any]) -> Tuple[str, str, int, str]:
    return (r["benchmark"], r["selector"], int(r["budget"]), r["qid"])


def selection_record(benchmark: str, label: str, budget: int, problem: Problem, selection: Any, *,
                     kind: str) -> dict:
    """The record of one solved problem: the selected notes and scores, the metrics
    (:func:`cdsjax.eval.scoring.score_problem`), the solver diagnostics, pages and the candidate pool, and whether
    the product would abstain (:mod:`cdsjax.pipeline.abstain`): ``abstained``, ``abstain_score`` (the score that
    decided it) and ``strength`` (every score a rule may use)."""
    mask = np.asarray(selection.selected_valid, bool)
    idx = [int(i) for i in np.asarray(selection.indices)[mask]]
    rec = {
        "benchmark": benchmark, "selector": label, "budget": budget,
        "qid": problem.query.qid, "num_notes": int(problem.notes.shape[0]),
        "selected": [problem.note_ids[i] for i in idx],
        "scores": [float(s) for s in np.asarray(selection.scores)[mask]],
        "metrics": score_problem(problem, selection, kind=kind),
        "diagnostics": diagnostics(selection, num_notes=int(problem.notes.shape[0])),
    }
    # the relevance the selector ranked by: the problem's hybrid row, else the cosine
    relevance = problem.query_scores if problem.query_scores is not None else note_relevance(problem.notes,
                                                                                              problem.query_emb)
    strength = strength_features(selection, relevance)
    verdict = judge(label, strength)
    rec.update(abstained=verdict.abstained, abstain_score=verdict.score, strength=strength)
    if problem.pages is not None:
        rec["pages"] = [[problem.docs[i], problem.pages[i]] for i in idx]
    if problem.pool is not None:
        rec["pool_documents"] = list(problem.pool)
    return rec


def start_run(out_dir: pathlib.Path, identity: Mapping[str, Any]) -> None:
    """Writes ``run.json`` with the run's identity, after checking that records already in ``out_dir``
    (if any) come from a run with the same identity, so they can be resumed.

    Raises:
      ValueError: ``out_dir`` holds records of a different run (naming the settings that changed).
    """
    run_file = out_dir / RUN_FILE
    if run_file.is_file() and (out_dir / RECORDS_FILE).is_file():
        previous = json.loads(run_file.read_text()).get("identity", {})
        if previous != identity:
            changed = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
            raise ValueError(f"{out_dir} holds records of a different run (changed: {changed}); "
                             "use another output_dir or delete it")
    run_file.write_text(json.dumps({"identity": identity}, indent=1, default=str))
