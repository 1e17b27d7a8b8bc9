"""The evaluation of a config (:func:`evaluate`) and its problems (:func:`load_problems`): problems -> sharded
selection -> records -> summary (the parts: :mod:`cdsjax.eval`)."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Callable

import numpy as np

import cdsjax.eval.distributed as D
import cdsjax.eval.reader_setup as reader_setup
import cdsjax.eval.reading as reading
from cdsjax.eval.pools import pool_spec, pooled_problems
from cdsjax.eval.problems import (benchmark_kind, load_configured_benchmark, pdf_problems, text_problems,
                                  with_relevance)
from cdsjax.eval.records import (RECORDS_FILE, clear_run, drop_stale_records, drop_torn_tail, is_current,
                                 read_records, record_key, selection_record, start_run)
from cdsjax.eval.report import (SUMMARY_CSV, SUMMARY_MD, markdown_table, paired_rows, summary_rows,
                                write_summary_csv, write_timings)
from cdsjax.eval.run import (Executables, batch_chunk, cached_selector, corpus_arrays_cache, jax_local_devices, make_mesh,
                             run_selector)
from cdsjax.eval.scoring import metric_names
from cdsjax.eval.abstention import abstention_table
from cdsjax.io.relevance import settings_of
from cdsjax.eval.settings import (budgets_of, cache_dir_of, eval_dtype, identity_digest, record_identity,
                                  run_identity, selector_specs)


def load_problems(config, embedder, *, cache_dir: pathlib.Path, progress: bool = False,
                  log: Callable[[str], None] = print):
    """``(benchmark, kind, problems, timings)`` of a config: one document per question,
    or pools / the open corpus when the config sets :data:`cdsjax.eval.pools.POOL_FIELDS`; each problem carries
    its question's relevance rows under ``config.relevance`` (:func:`cdsjax.eval.problems.with_relevance`)."""
    relevance = settings_of(config)
    spec = pool_spec(config)
    if spec is not None:
        bench, kind, problems, timings = pooled_problems(config, spec, embedder, cache_dir=cache_dir,
                                                         progress=progress, log=log)
    else:
        bench, timings = load_configured_benchmark(config), {}
        kind = benchmark_kind(bench)
        if kind == "text":
            problems = text_problems(bench, embedder, cache_dir=cache_dir,
                                     link_window=int(config.get("link_window", 1)), progress=progress,
                                     context=relevance["context"])
        elif bench.queries:
            problems = pdf_problems(bench, config, embedder, cache_dir=cache_dir, progress=progress)
        else:
            problems = []
    if not bench.queries:
        raise ValueError(f"benchmark {config.benchmark!r} has no queries "
                         f"(max_queries={config.get('max_queries', None)})")
    return bench, kind, with_relevance(problems, relevance["mode"], relevance["lexical_weight"],
                                       relevance["context"]), timings


def config_evidence(config, embedder) -> tuple:
    """``(problems, source)`` of an evaluation config: its problems (:func:`load_problems`, from
    the run's caches) and the :class:`~cdsjax.eval.answer_evidence.EvidenceSource` of their notes (a PDF benchmark's from its cached indexes), what
    a script that scores the evaluation's selections as the reader gets them starts from."""
    from cdsjax.eval.answer_evidence import EvidenceSource
    from cdsjax.eval.problems import pdf_indexes

    bench, kind, problems, _ = load_problems(config, embedder, cache_dir=cache_dir_of(config))
    indexes = None
    if kind != "text":
        docs = list(dict.fromkeys(d for q in problems for d in q.docs))
        indexes = pdf_indexes(bench, docs, config, embedder, cache_dir=cache_dir_of(config))
    return problems, EvidenceSource(problems, kind=kind, indexes=indexes)


def evaluate(config, *, progress: bool = True, log: Callable[[str], None] = print, process=None,
             fresh: bool = False):
    """Runs every configured selector at every budget on the configured benchmark.

    Writes into ``config.output_dir``: ``records.jsonl`` (one line per selector,
    budget and query, appended as results come, so an interrupted run resumes where
    it stopped), ``summary.csv`` (benchmark, selector, metric, mean, ci_low, ci_high,
    n; metrics are named ``metric@B``), ``summary.md`` and ``run.json`` (the run's identity, commit, library
    versions, device and resolved config).

    Resuming is by identity: a record on disk is reused only when everything that decided it matches
    (:func:`cdsjax.eval.settings.record_identity`: selector and full options, parameter file content, every
    deciding config field, code version); other records of this run's selectors are computed again, with one
    line naming what changed. A different benchmark, data or embedder is refused in one line naming the field;
    ``fresh`` starts ``output_dir`` over (its caches stay).

    ``config.dtype = "float64"`` needs ``jax_enable_x64`` turned on by the entry point beforehand
    (this function changes no JAX setting).

    With ``process`` (a :class:`cdsjax.eval.distributed.Process`, one of several joined by
    ``jax.distributed``), this process answers its share of the questions (whole compiled chunks,
    :func:`cdsjax.eval.distributed.split_problems`) and appends to its own shard; process 0
    merges the shards and writes the summary (the others return empty lists).

    Returns:
      ``(records, summary rows)`` for the queries and selectors of this config.
    """
    from cdsjax.core.batching import DEFAULT_BUCKETS
    from cdsjax.io.embed import Embedder
    from cdsjax.pipeline.catalog import selector_spec

    if process is not None:
        process = process.join()  # before anything starts JAX's backend

    dtype = np.dtype(eval_dtype(config))
    specs = selector_specs(config)
    budgets = budgets_of(config)
    out_dir = pathlib.Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lead = process is None or process.index == 0
    identities = {label: record_identity(config, name, opts) for label, name, opts in specs}
    digests = {label: identity_digest(i) for label, i in identities.items()}
    if lead:
        from cdsjax.io.provenance import provenance

        if fresh:
            clear_run(out_dir, D.shard_files(out_dir))
        previous = start_run(out_dir, run_identity(config), selectors=identities, provenance=provenance(config))
        drop_stale_records([out_dir / RECORDS_FILE, *D.shard_files(out_dir)], identities, previous, log=log)
        reader_setup.enabled(config)  # a control without a reader, or a reader without a model: one line, now

    cache_dir = cache_dir_of(config)
    embedder = Embedder(config)
    if not lead:  # process 0 fills the caches (indexes, question vectors) first; the others read them
        process.barrier("prepared")
    bench, kind, problems, timings = load_problems(config, embedder, cache_dir=cache_dir,
                                                   progress=progress, log=log)
    if process is not None and lead:
        process.barrier("prepared")
    pooled = any(p.gold_docs is not None for p in problems)

    records_path = out_dir / RECORDS_FILE
    if process is not None:
        records_path = D.shard_path(out_dir, process.index, process.count)
    drop_torn_tail(records_path)
    done = {record_key(r) for path in [out_dir / RECORDS_FILE, *D.shard_files(out_dir)]
            for r in read_records(path) if is_current(r, digests)}
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
    executables = Executables()  # the run's compiled calls: each selector and shape compiled once
    corpus = corpus_arrays_cache(executables)  # each corpus's bound and note block once, for every selector
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

                def write(positions, sels, batch=batch, label=label, b=b):
                    for pos, sel in zip(positions, sels):
                        f.write(json.dumps(selection_record(bench.name, label, b, batch[pos], sel, kind=kind,
                                                            identity=digests[label]))
                                + "\n")
                    f.flush()
                    if bar is not None:
                        bar.update(len(positions))

                t0 = time.perf_counter()
                fn = cached_selector(name, b, opts)
                run_selector(fn, batch, buckets=buckets, max_batch=max_batch,
                             chunk=batch_chunk(fn), mesh=mesh, on_chunk=write, dtype=dtype,
                             spec=selector_spec(name), corpus=corpus, executables=executables)
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
                               merge=process is not None, digests=digests)
    names, answer_rows, answers = metric_names(kind, pooled), [], None
    selections = records
    if reader_setup.enabled(config):  # the reader stage: answers of every selection and control, scored
        with reader_setup.local_reader(config, log) as (read_config, connection):  # a local llama.cpp server, if asked
            answers = reading.read_answers(read_config, bench, kind, problems, records, out_dir, embedder=embedder,
                                           cache_dir=cache_dir, progress=progress, log=log, connection=connection)
        records = reading.with_answer_metrics(records, answers)
        names = tuple(reading.ANSWER_METRICS) + names
        answer_rows = reading.answer_rows(answers, num_resamples=int(config.get("num_resamples", 10_000)),
                                          reference=compare_label(config, specs) or None)
    resamples = int(config.get("num_resamples", 10_000))
    rows = summary_rows(records, names, num_resamples=resamples)
    reference = compare_label(config, specs)
    if reference:
        have = {(r["benchmark"], r["selector"], r["metric"]) for r in answer_rows}
        rows += [r for r in paired_rows(records, names, reference, num_resamples=resamples)
                 if (r["benchmark"], r["selector"], r["metric"]) not in have]
    if answer_rows or reference:
        rows = reading.answer_first(rows + answer_rows)
    write_summary_csv(rows, out_dir / SUMMARY_CSV)
    table = markdown_table(rows)
    abstained = abstention_table(selections, problems, answers)
    if abstained:  # answerable and unanswerable questions apart: what abstaining before reading did
        table += ("\nAbstained before reading (cdsjax.pipeline.abstain; A answerable, U unanswerable):\n\n"
                  + abstained)
    from cdsjax.io.provenance import provenance_line

    table += "\n" + provenance_line(run_provenance(out_dir))
    (out_dir / SUMMARY_MD).write_text(table)
    log(table)
    return records, rows


def compare_label(config, specs) -> str:
    """The reference selector of the paired differences: ``config.compare`` (default cosine) when it is one of
    the run's labels (or a reader control), else "" (no paired rows)."""
    from cdsjax.pipeline.catalog import REFERENCE_SELECTOR

    label = str(config.get("compare", REFERENCE_SELECTOR) or "")
    labels = [s[0] for s in specs] + list(reader_setup.control_labels(config))
    return label if label in labels else ""


def run_provenance(out_dir: pathlib.Path) -> dict:
    """The provenance ``run.json`` in ``out_dir`` records (empty if none)."""
    from cdsjax.eval.records import RUN_FILE

    path = out_dir / RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else {}
