"""Evaluation records: one JSON line per (benchmark, selector, budget, question), written as results come
and read back for resuming and merging (shared by :func:`cdsjax.eval.evaluate` and the multi-process
merge), and ``run.json``: the identity a resumed run must match, the settings each selector's records were
made with, and the run's provenance.

Each record carries ``identity``, the digest of what decided it (:func:`cdsjax.eval.settings.record_identity`:
selector and full options, parameter file content, every deciding config field, code version). A record is
resumed only when its digest is the current one for its selector; others are dropped and computed again
(:func:`drop_stale_records`), with one line naming the fields that changed."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

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
                     kind: str, identity: Optional[str] = None) -> dict:
    """The record of one solved problem: the selected notes and scores, the metrics
    (:func:`cdsjax.eval.scoring.score_problem`), the solver diagnostics, pages and the candidate pool, whether
    the product would abstain (:mod:`cdsjax.pipeline.abstain`): ``abstained``, ``abstain_score`` (the score that
    decided it) and ``strength`` (every score a rule may use), and ``identity``, the digest of the settings that
    decided it (:func:`cdsjax.eval.settings.identity_digest`)."""
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
    if identity is not None:
        rec["identity"] = identity
    if problem.pages is not None:
        rec["pages"] = [[problem.docs[i], problem.pages[i]] for i in idx]
    if problem.pool is not None:
        rec["pool_documents"] = list(problem.pool)
    return rec


def is_current(record: Mapping[str, Any], digests: Mapping[str, str]) -> bool:
    """Whether ``record`` may be used by a run whose selectors' records have ``digests`` (label -> digest): its
    selector is not part of the run, or its ``identity`` is that selector's digest."""
    label = record.get("selector")
    return label not in digests or record.get("identity") == digests[label]


def start_run(out_dir: pathlib.Path, identity: Mapping[str, Any], *,
              selectors: Optional[Mapping[str, Mapping[str, Any]]] = None,
              provenance: Optional[Mapping[str, Any]] = None) -> Dict[str, dict]:
    """Writes ``run.json`` with the run's identity, after checking that records already in ``out_dir``
    (if any) come from a run with the same identity, so they can be resumed.

    Args:
      identity: the data-level settings (:func:`cdsjax.eval.settings.run_identity`); records of another
        benchmark, data, embedder or pool are refused, naming the setting.
      selectors: label -> :func:`cdsjax.eval.settings.record_identity` of each selector of this run.
      provenance: :func:`cdsjax.io.provenance.provenance` of the run (commit, versions, device, resolved config).

    Returns:
      The previous run's record identities per label (empty when there was none), to name what changed.

    Raises:
      ValueError: ``out_dir`` holds records of a different run (naming the settings that changed).
    """
    from cdsjax.eval.settings import identity_digest

    run_file = out_dir / RUN_FILE
    previous: Dict[str, dict] = {}
    if run_file.is_file() and (out_dir / RECORDS_FILE).is_file():
        body = json.loads(run_file.read_text())
        before = body.get("identity", {})
        if before != identity:
            changed = sorted(k for k in set(before) | set(identity) if before.get(k) != identity.get(k))
            raise ValueError(f"{out_dir} holds records of a different run (changed: {changed}); "
                             "use another output_dir, or --fresh to start over")
        settings = body.get("record_settings", {})
        previous = {label: dict({k: v for k, v in r.items() if k != "digest"}, config=settings)
                    for label, r in (body.get("records") or {}).items()}
    selectors = dict(selectors or {})
    body = {"identity": dict(identity), **dict(provenance or {})}
    body["records"] = {label: dict({k: v for k, v in i.items() if k != "config"}, digest=identity_digest(i))
                       for label, i in selectors.items()}
    body["record_settings"] = next(iter(selectors.values()))["config"] if selectors else {}
    run_file.write_text(json.dumps(body, indent=1, default=str))
    return previous


def drop_stale_records(paths: Sequence[pathlib.Path], identities: Mapping[str, Mapping[str, Any]],
                       previous: Mapping[str, Mapping[str, Any]], *, log: Callable[[str], None] = print) -> int:
    """Removes from the record files ``paths`` every record of a selector of this run (label -> its
    :func:`~cdsjax.eval.settings.record_identity` in ``identities``) that was made with other settings, so it is
    computed again; logs one line per such selector naming what changed (from ``previous``, the identities of
    the run that wrote them). Returns how many records were dropped."""
    from cdsjax.eval.settings import identity_changes, identity_digest

    digests = {label: identity_digest(i) for label, i in identities.items()}
    stale: Dict[str, int] = {}
    for path in paths:
        records = read_records(path)
        keep = [r for r in records if is_current(r, digests)]
        if len(keep) == len(records):
            continue
        for r in records:
            if not is_current(r, digests):
                stale[r["selector"]] = stale.get(r["selector"], 0) + 1
        tmp = path.with_name(f".{path.name}.stale")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in keep)
        tmp.replace(path)
    for label, n in stale.items():
        changed = identity_changes(previous[label], identities[label]) if label in previous else []
        why = ", ".join(changed) if changed else "settings not recorded with them"
        log(f"{label}: {n} records on disk were made with other settings ({why}); computing them again")
    return sum(stale.values())


def clear_run(out_dir: pathlib.Path, shards: Sequence[pathlib.Path] = ()) -> None:
    """Starts ``out_dir`` over (``--fresh``): removes its records, shards and ``run.json`` (caches stay)."""
    for path in [out_dir / RECORDS_FILE, out_dir / RUN_FILE, *shards]:
        if path.is_file():
            path.unlink()
