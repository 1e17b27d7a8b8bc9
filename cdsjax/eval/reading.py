"""The reader stage of the batch evaluation: the selected evidence of every (question, selector, budget, seed)
goes to a vision-language reader, and its answer is scored against the gold answer.

* Requests are built as ``cdsjax ask`` builds them (:func:`cdsjax.io.reading.prompt.build_messages`: text notes as
  text, figures/tables/charts with an image crop as ``image_url`` parts with their caption and summary) and
  sent through :class:`cdsjax.io.reading.llm.client.ChatClient` (retries, per-request timeout), ``config.reader.concurrency``
  at a time from a thread pool, with a progress bar.
* Every reply goes through the reader's :class:`~cdsjax.io.reading.reply_cache.ReplyCache` under ``<output_dir>/replies``,
  keyed by the model, the full request (instructions, question, evidence text, images) and the generation
  settings (max_tokens, temperature, seed): a rerun, a resumed run, or another selector whose evidence makes the
  same request sends nothing.
* Images (``config.reader.images``): ``auto`` sends visual notes as images until the server refuses one, then
  as caption, summary and text (one refusal per run, see :meth:`cdsjax.io.reading.llm.client.ChatClient.send_with_images`);
  ``on`` / ``off`` always / never. A request the server finds too long is sent again without its last notes
  (:func:`cdsjax.io.reading.reader.send_evidence`). The record's ``image_mode`` and ``dropped`` say what was sent.
* Scoring (:mod:`cdsjax.eval.answer_scoring`): MMLongBench-Doc by answer extraction (a second cached call) and
  its format rules; other benchmarks by the LLM judge (:mod:`cdsjax.io.reading.judge`, ``config.judge.*``, cached;
  ``config.judge.enabled = False`` runs none), plus the scores that need no judge, computed whatever the judge
  does: token F1 on QASPER's extractive answers (``answer_f1``) and exact match where a gold answer is yes, no
  or unanswerable (``exact_match``). ``markers_only`` marks an answer that gives citation markers in place of
  its content (:func:`cdsjax.io.reading.replies.markers_only`).
* Controls, run as selectors of the same harness: ``none`` (the question alone) and ``full`` (every note of the
  question's own documents, :func:`full_document_ids`, where its estimated length fits
  ``config.reader.max_context`` and its images ``config.reader.max_images``).

A failed request is recorded on its answer record as ``error`` (kind and message); its metrics are None (left
out of every mean) and ``reader_error`` is 1, summarised on its own. A failed judgement (no readable verdict, a
verdict cut at the token limit, a judge that cannot be reached) is recorded apart, as ``judge_error`` (kind and
message) with metric ``judge_error`` 1: the reply and its rule-based scores are kept, only ``accuracy`` is None.
Judged records name the judge (``judge_model``) and say whether it is the reader itself (``judge_is_reader``).
Answer records are written to ``<output_dir>/answers.jsonl`` (one per question, selector, budget and seed):
``qid``, ``selector``, ``evidence`` (the selected note ids, best first) and ``sent`` (those the token budget
kept, in prompt order), ``evidence_tokens`` and ``prompt_tokens``, ``answer`` (the answer taken; "" when the
reader gave none), ``reply`` (the last reply as written), ``retried`` / ``no_answer`` (why a reply was no
answer: :data:`cdsjax.io.reading.replies.NO_ANSWER`), ``extracted`` (MMLongBench-Doc) and ``metrics``.

Reading goes through :meth:`cdsjax.io.reading.reader.Reader.answer`, the path ``ask`` and ``serve`` use: the evidence
fitted to the reader's token budget (``config.reader.evidence_tokens``; the local reader's default, or the
server's window), the note that does not fit cut to its sentences nearest the question under the benchmark's
embedder, and a reply that is no answer asked again once; such an answer scores 0 where a judge is configured.
"""

from __future__ import annotations

import json
import pathlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from cdsjax.eval import answer_scoring as S
from cdsjax.eval.abstention import abstained_now
from cdsjax.eval.answer_evidence import (EvidenceSource, cites_gold, fits_reader, full_document_ids, gold_answers,
                                        judge_call, sent_has_answer, sentence_similarity)
from cdsjax.eval.reader_setup import clients, control_labels, evidence_tokens
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.reading.reply_cache import ReplyCache

ANSWERS_FILE = "answers.jsonl"
ANSWER_METRICS = ("accuracy", "answer_f1", "exact_match", "markers_only", "no_answer", "cites_gold", "reader_error",
                  "judge_error")


def read_answers(config, bench, kind: str, problems, records: Sequence[dict], out_dir: pathlib.Path, *,
                 embedder=None, cache_dir: Optional[pathlib.Path] = None, progress: bool = True,
                 log: Callable[[str], None] = print, connection=None) -> List[dict]:
    """Answers and scores every (question, selector, budget, seed) of ``records`` and the controls (module
    docstring); writes ``answers.jsonl`` and returns its records. ``connection``: how to reach the local server the
    run started (:class:`cdsjax.eval.reader_setup.Connection`); None: ``config.reader.url``, its key read from
    ``$CDSJAX_READER_API_KEY``."""
    from cdsjax.io.reading.llm.errors import ReaderError
    from cdsjax.io.reading.reader import ABSTAIN
    from cdsjax.io.reading.replies import markers_only
    from cdsjax.eval.settings import budgets_of

    r = config.reader
    seeds = [int(s) for s in (r.seeds if not isinstance(r.seeds, (int, str)) else str(r.seeds).split(","))]
    max_tokens, max_chars = int(r.max_tokens), int(r.max_text_chars)
    max_images = int(r.get("max_images", 0) or 0)
    by_qid = {p.query.qid: p for p in problems}
    indexes = None
    if kind != "text":
        from cdsjax.eval.problems import pdf_indexes

        docs = list(dict.fromkeys(d for p in problems for d in p.docs))
        indexes = pdf_indexes(bench, docs, config, embedder, cache_dir=cache_dir)
    source = EvidenceSource(problems, kind=kind, indexes=indexes)

    tasks = []
    for rec in records:
        if rec["qid"] in by_qid:
            tasks.append((rec["selector"], int(rec["budget"]), rec["qid"], list(rec["selected"]),
                          bool(r.get("abstain", True)) and abstained_now(rec)))
    controls = control_labels(config)
    skipped_full = 0
    for label in controls:
        for b in budgets_of(config):
            for p in problems:
                if label == "none":
                    tasks.append((label, b, p.query.qid, [], False))
                    continue
                ids = full_document_ids(p)
                if not fits_reader(source.items(ids), max_context=int(r.max_context), max_images=max_images,
                                   max_tokens=max_tokens, max_text_chars=max_chars):
                    skipped_full += 1
                    continue
                tasks.append((label, b, p.query.qid, ids, False))
    if "full" in controls:
        n_full = len(problems) * len(budgets_of(config))
        log(f"full-document control: {n_full - skipped_full} of {n_full} (question, budget) pairs fit "
            f"config.reader.max_context={int(r.max_context)} tokens"
            + (f" and config.reader.max_images={max_images}" if max_images else ""))
    cache = ReplyCache(out_dir / "replies")
    reader, judge = clients(config, cache, connection)
    tokens = evidence_tokens(config)  # the reads' evidence budget ("full" reads every note whole)
    similarity = sentence_similarity(embedder) if embedder is not None else None

    model = str(r.model) or reader.model
    mmlb = bench.name.startswith("mmlongbench")
    judge_label = {}
    if judge is not None and not mmlb:
        judge_label = {"judge_model": judge.config.model,
                       "judge_is_reader": judge.url == reader.url and judge.config.model == model}

    def one(task, seed):
        label, b, qid, ids, abstained = task
        p = by_qid[qid]
        q = p.query
        rec = {"benchmark": bench.name, "selector": label, "budget": b, "qid": qid, "seed": seed, "evidence": ids,
               "abstained": abstained,
               "metrics": {"accuracy": None, "answer_f1": None, "exact_match": None, "markers_only": None,
                           "no_answer": None, "cites_gold": None, "reader_error": 0.0, "judge_error": None}}
        try:
            # the one reading path (ask, serve and the pipeline read through it too): token budget, reply cache,
            # a reply that is no answer asked again once
            items = source.items(ids)
            options = ReadOptions(evidence_tokens=0 if label == "full" else tokens, answer_tokens=max_tokens,
                                  seed=seed, similarity=similarity)
            # judged too weak before reading (the selection record's ``abstained``): the reader is not asked and
            # the answer is the benchmark's "not answerable"
            out = abstained_answer(model) if abstained else reader.answer(q.question, items, options)
            text = out.text
            rec.update(answer=text, reply=out.raw, cached=out.cached, images=out.images, image_mode=out.image_mode, dropped=out.dropped,
                       sent=[i.note_id for i in out.evidence], evidence_tokens=out.evidence_tokens,
                       trimmed=out.trimmed, prompt_tokens=(out.usage or {}).get("prompt_tokens"),
                       no_answer=out.no_answer, retried=out.retried)
            if out.warnings:
                rec["warnings"] = list(out.warnings)
            rec["metrics"]["markers_only"] = float(markers_only(out.raw, q.question))
            rec["metrics"]["no_answer"] = float(out.no_answer is not None)
            rec["metrics"]["cites_gold"] = cites_gold(q, items, text)  # the answer's [n] are places in items
            rec["metrics"]["sent_has_answer"] = sent_has_answer(q, out.evidence, reader.config.max_text_chars)
            if mmlb:
                # the benchmark's short answer: by rule where the reply is one already, else by the model
                extracted, rec["extracted_by"] = S.extract_by_rule(text) or (None, "model")
                if extracted is None:
                    xm = S.extraction_messages(q.question, text or S.NOT_ANSWERABLE)
                    extracted = S.parse_extracted(reader.reply(xm, max_tokens=128)[0].content)
                fmt = (q.meta or {}).get("answer_format")
                rec["extracted"] = extracted
                rec["metrics"]["accuracy"] = S.score_mmlongbench(extracted, str(q.answer or ""), fmt)
                rec["answerable"] = bool((q.meta or {}).get("answerable", True)) and str(fmt) != "None"
                rec["declined"] = S.declines_mmlongbench(extracted)
        except ReaderError as err:
            return _failed(rec, {"kind": err.kind, "message": str(err)})
        except (OSError, ValueError) as err:  # an evidence image that cannot be read, a bad entry
            return _failed(rec, {"kind": "evidence", "message": str(err)})
        if mmlb:
            return rec
        golds = gold_answers(q)
        rec["answerable"] = any(g != ABSTAIN for g in golds) if golds else None
        if "extractive_spans" in (q.meta or {}):
            rec["metrics"]["answer_f1"] = S.qasper_answer_f1(text, q.meta["extractive_spans"])
        rec["metrics"]["exact_match"] = S.exact_match(text, golds)
        if out.no_answer is not None and golds and judge is not None:  # no answer (asked twice): wrong, unjudged
            rec["metrics"]["accuracy"] = 0.0
        elif judge is not None and golds:
            rec.update(judge_label)
            try:
                # correct against any gold answer; the judge is asked gold by gold until one agrees
                rec["metrics"]["accuracy"] = float(any(judge_call(judge, cache, q.question, g, text) for g in golds))
                rec["metrics"]["judge_error"] = 0.0
            except ReaderError as err:  # the answer and its rule-based scores stand; only the verdict is missing
                rec["judge_error"] = {"kind": err.kind, "message": str(err)}
                rec["metrics"]["judge_error"] = 1.0
        return rec

    # question by question (every selector of a question, then the next question), so that a run stopped midway
    # leaves complete, paired comparisons on the questions it finished
    order = {qid: i for i, qid in enumerate(by_qid)}
    tasks.sort(key=lambda t: (order[t[2]], t[1]))
    jobs = [(t, s) for t in tasks for s in seeds]
    out: List[Optional[dict]] = [None] * len(jobs)
    from tqdm.auto import tqdm

    with ThreadPoolExecutor(max_workers=max(1, int(r.concurrency)), thread_name_prefix="cdsjax-eval-reader") as pool, \
            tqdm(total=len(jobs), desc=f"read {bench.name}", unit="answer", disable=not progress) as bar:
        futures = {pool.submit(one, t, s): i for i, (t, s) in enumerate(jobs)}
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            bar.update()
    cache.close()
    reader.close()
    if judge is not None:
        judge.close()
    tmp = out_dir / (ANSWERS_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in out:
            f.write(json.dumps(rec, default=str) + "\n")
    tmp.replace(out_dir / ANSWERS_FILE)
    errors = sum(1 for rec in out if "error" in rec)
    cached = sum(1 for rec in out if rec.get("cached"))
    judge_errors = sum(1 for rec in out if "judge_error" in rec)
    as_text = sum(1 for rec in out if rec.get("image_mode") == "text")
    dropped = sum(1 for rec in out if rec.get("dropped"))
    log(f"reader: {len(out)} answers ({cached} from the reply cache), {errors} failed (reader_error)"
        + (f", {judge_errors} not judged (judge_error)" if judge_errors else "")
        + (f"; {as_text} sent their visual notes as text" if as_text else "")
        + (f"; {dropped} left their last notes out (beyond the evidence token budget, or too long for the "
           f"reader's context)" if dropped else ""))
    return out


def abstained_answer(model: str):
    """The reader's answer of a question abstained before reading: "Not answerable", nothing sent."""
    from cdsjax.io.reading.reader import ABSTAIN, ReaderAnswer

    return ReaderAnswer(text=ABSTAIN, cited=(), abstained=True, usage={"prompt_tokens": 0}, latency_s=0.0, model=model,
                        raw=ABSTAIN, cached=True)


def _failed(rec: dict, error: dict) -> dict:
    """``rec`` as a failed read: its error, every metric None but ``reader_error`` 1."""
    rec["error"] = error
    rec["metrics"] = {m: None for m in ANSWER_METRICS}
    rec["metrics"]["reader_error"] = 1.0
    return rec


def merged_answer_records(answers: Sequence[dict]) -> List[dict]:
    """One pseudo-record per (benchmark, selector, budget, question) whose ``metrics`` are the answer metrics
    averaged over seeds (failed seeds left out; ``reader_error`` the share that failed)."""
    groups: Dict[tuple, list] = {}
    for a in answers:
        groups.setdefault((a["benchmark"], a["selector"], a["budget"], a["qid"]), []).append(a)
    out = []
    for (bench, sel, b, qid), recs in groups.items():
        metrics = {}
        for m in ANSWER_METRICS:
            vals = [x["metrics"][m] for x in recs if x["metrics"].get(m) is not None]
            metrics[m] = float(np.mean(vals)) if vals else None
        out.append({"benchmark": bench, "selector": sel, "budget": b, "qid": qid, "metrics": metrics})
    return out


def with_answer_metrics(records: Sequence[dict], answers: Sequence[dict]) -> List[dict]:
    """``records`` with each one's answer metrics added to its ``metrics``, and a record per control question."""
    merged = {(m["benchmark"], m["selector"], m["budget"], m["qid"]): m for m in merged_answer_records(answers)}
    out = []
    for r in records:
        m = merged.pop((r["benchmark"], r["selector"], int(r["budget"]), r["qid"]), None)
        out.append(dict(r, metrics={**r["metrics"], **(m["metrics"] if m else {})}))
    return out + list(merged.values())


def answer_first(rows: Sequence[dict]) -> List[dict]:
    """``summary.csv`` rows with, within each budget, the answer metrics (accuracy, F1, their differences and
    spreads, reader errors) before the retrieval metrics; the order is otherwise kept."""
    answer = ("accuracy", "answer_f1", "generalized_f1", "exact_match", "markers_only", "cites_gold", "reader_error",
              "judge_error")
    budgets = list(dict.fromkeys(r["metric"].rpartition("@")[2] for r in rows))
    return sorted(rows, key=lambda r: (budgets.index(r["metric"].rpartition("@")[2]),
                                       0 if r["metric"].startswith(answer) else 1))


def answer_rows(answers: Sequence[dict], *, num_resamples: int = 10_000, reference: Optional[str] = None) -> List[dict]:
    """Extra ``summary.csv`` rows: paired accuracy and token-F1 differences to ``reference`` (None: the catalog's
    ``REFERENCE_SELECTOR``) and
    to ``none`` (the question alone): ``accuracy_vs_cosine@B``, ``answer_f1_vs_none@B``; mean difference over the
    questions both have a value for, with a 95% bootstrap interval, W/T/L and the smallest detectable difference
    (:func:`cdsjax.eval.report.paired_rows` gives the same for every other metric), MMLongBench-Doc's generalized F1 (``generalized_f1@B``, bootstrap
    over questions), and the mean and std over seeds of the per-seed mean accuracies (``accuracy_seed_mean@B``,
    ``accuracy_seed_std@B``; n = seeds, no interval)."""
    import cdsjax.eval.metrics as M
    from cdsjax.pipeline.catalog import REFERENCE_SELECTOR

    reference = reference or REFERENCE_SELECTOR
    rows = []
    merged = merged_answer_records(answers)
    values = {(m["benchmark"], m["selector"], m["budget"], m["qid"]): m["metrics"] for m in merged}
    groups = list(dict.fromkeys((m["benchmark"], m["selector"], m["budget"]) for m in merged))
    rng = np.random.default_rng(0)
    for bench, sel, b in groups:
        qids = [k[3] for k in values if k[:3] == (bench, sel, b)]
        for metric in ("accuracy", "answer_f1"):
            for ref in dict.fromkeys((reference, "none")):
                if ref == sel or (bench, ref, b) not in groups:
                    continue
                ours = [values[(bench, sel, b, q)].get(metric) for q in qids]
                theirs = [(values.get((bench, ref, b, q)) or {}).get(metric) for q in qids]
                if not any(x is not None and y is not None for x, y in zip(ours, theirs)):
                    continue  # no token F1 on this benchmark, no judge, or no question both answered
                d = M.paired_difference(ours, theirs, num_resamples=num_resamples)
                rows.append({"benchmark": bench, "selector": sel, "metric": f"{metric}_vs_{ref}@{b}",
                             "mean": d["mean"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"],
                             "wins": d["better"], "ties": d["tie"], "losses": d["worse"], "mde": d["mde"]})
        sub = [a for a in answers if (a["benchmark"], a["selector"], a["budget"]) == (bench, sel, b)
               and a["metrics"]["accuracy"] is not None]
        if sub and "declined" in sub[0]:  # MMLongBench-Doc: its generalized F1
            scores = np.asarray([a["metrics"]["accuracy"] for a in sub])
            ans = np.asarray([a["answerable"] for a in sub])
            dec = np.asarray([a["declined"] for a in sub])
            f1 = S.generalized_f1(scores, ans, dec)
            boot = []
            for _ in range(min(num_resamples, 2000)):
                i = rng.integers(0, len(sub), len(sub))
                boot.append(S.generalized_f1(scores[i], ans[i], dec[i]))
            boot = np.asarray([v for v in boot if np.isfinite(v)])
            lo, hi = (np.percentile(boot, [2.5, 97.5]) if boot.size else (float("nan"), float("nan")))
            rows.append({"benchmark": bench, "selector": sel, "metric": f"generalized_f1@{b}", "mean": f1,
                         "ci_low": float(lo), "ci_high": float(hi), "n": len(sub)})
        per_seed: Dict[int, list] = {}
        for a in sub:
            per_seed.setdefault(a["seed"], []).append(a["metrics"]["accuracy"])
        means = [float(np.mean(v)) for v in per_seed.values()]
        if means:
            nan = float("nan")
            std = float(np.std(means, ddof=1)) if len(means) > 1 else 0.0
            for name, value in (("accuracy_seed_mean", float(np.mean(means))), ("accuracy_seed_std", std)):
                rows.append({"benchmark": bench, "selector": sel, "metric": f"{name}@{b}", "mean": value,
                             "ci_low": nan, "ci_high": nan, "n": len(means)})
    return rows
