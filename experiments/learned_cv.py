r"""Does a learned CDS beat tuned baselines on documents it never saw? Cross-validation by document.

Usage (from the repository root)::

    python experiments/learned_cv.py --config configs/learned_cv.py \
        --config.cache_dirs.qasper=CACHE_Q --config.cache_dirs.mmlongbench=CACHE_M [--summary_copy FILE]

Tasks (each: training documents, validation documents, test documents):

* ``cv``: per benchmark, ``config.folds`` seeded folds over its documents (PDFs, papers);
* ``transfer``: fit on every document of one benchmark, test on every document of the other;
* ``both``: fold ``i`` of each benchmark tested after fitting on the training folds of both.

Each task runs in every ``config.pool_sizes`` setting: pool size 1 is the question's own document;
larger pools are drawn inside the test documents (test problems) or inside the training documents
(problems used to fit or tune). Every selector answers the same test problems:

* cosine, cosine-pages (best note of each page first), PPR, converged CDS at its defaults;
* MMR (lambda) and k-DPP (quality exponent) tuned on the task's training and validation documents by
  mean recall@B over their questions;
* learned CDS: ``cdsjax.learn.fit`` on the training documents, early-stopped on the validation share.

Every selector is scored by recall@B (gold pages or paragraphs) and by has-answer@B (the selected notes' text
holds a normalised gold answer, :mod:`cdsjax.eval.answers`; NaN on questions it does not cover), the tuned
baselines chosen by recall@B as before.

Outputs in ``config.output_dir``: ``records.jsonl`` (one line per task, selector, budget and
question, with ``recall`` and ``has_answer``; a rerun skips what is there), ``tuning.json`` (the chosen values per
task), ``folds.json`` (the document split), ``summary.json`` / ``summary.csv`` (means with bootstrap intervals per
metric, paired differences of learned CDS against each selector with win/tie/loss), ``learned_cv.png``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import importlib
import json
import pathlib
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from cdsjax.pipeline.catalog import LEARNED_SELECTOR, display  # noqa: E402
from cdsjax.core.registry import SPECS  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/learned_cv.py", lock_config=True)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars on stderr.")
_SUMMARY_COPY = flags.DEFINE_string("summary_copy", None, "Also write summary.json to this path.")
_SUMMARIZE_ONLY = flags.DEFINE_bool("summarize_only", False, "Only summarise the tasks already on disk.")
_MERGE = flags.DEFINE_list("merge", None, "Summarise the completed tasks of these output directories (e.g. one "
                           "run per benchmark) into config.output_dir, without loading any data.")

LEARNED = display(LEARNED_SELECTOR)


def learned_selector(config) -> str:
    """The registry name of the fitted game's selector: ``config.learned_selector`` (``cds_learned``, or
    ``cds_learned_pages``: its equilibrium read one note per page, fitted through that read-out: its
    ``SelectorSpec.readout``, unless ``config.learn.readout`` names another)."""
    return str(config.get("learned_selector", "") or LEARNED_SELECTOR)


def learned_label(config) -> str:
    """The fitted game's label in records, tuning and tables (its selector's display name)."""
    return display(learned_selector(config))


SHIPPED = " (shipped fit)"


def fixed_selectors(config) -> List[Tuple[str, str, dict]]:
    """``[(label, registry name, options)]`` of the selectors run with their default options. A learned game run
    this way plays the shipped fit (fitted on every dev question, these test questions included) and is labelled
    so, apart from the game this run fits."""
    names = [n for n in (s.strip() for s in config.fixed_selectors.split(",")) if n]
    return [(display(n) + (SHIPPED if SPECS[n].learned else ""), n, {}) for n in names]


@dataclasses.dataclass
class Task:
    """What one fit sees and what it is tested on.

    Attributes:
      name: ``cv``, ``transfer`` or ``both``.
      label: e.g. ``qasper/fold2`` or ``qasper->mmlongbench``.
      fold: fold index (-1 for transfer).
      pool_size: documents per question.
      train, val: problems to fit on and to stop on (pools drawn inside their own documents); the tuned
        baselines choose their knob on both.
      test: ``benchmark -> problems`` (pools drawn inside the test documents).
      fit_train, fit_val: the same documents' problems at ``config.fit_pool_size`` when the game is fitted
        at another pool size than the task's (None: ``train`` and ``val``).
    """

    name: str
    label: str
    fold: int
    pool_size: int
    train: List[Any]
    val: List[Any]
    test: Dict[str, List[Any]]
    fit_train: Optional[List[Any]] = None
    fit_val: Optional[List[Any]] = None


# ----------------------------------------------------------------------------- data


def _benchmark_config(name: str, config):
    cfg = importlib.import_module(f"configs.{config.benchmark_configs[name]}").get_config()
    cfg.data_root = config.data_root
    cfg.output_dir = str(pathlib.Path(config.output_dir) / "cache" / name)
    cfg.cache_dir = config.cache_dirs.get(name, "") or ""
    return cfg


@dataclasses.dataclass
class BenchmarkData:
    """A benchmark's questions with gold evidence, their embeddings and every document's notes."""

    name: str
    kind: str
    queries: List[Any]
    query_emb: np.ndarray
    notes: Dict[str, Any]
    buckets: Tuple[int, ...]


def load_data(name: str, config, log=print) -> BenchmarkData:
    """Loads, indexes (cached) and embeds a benchmark; keeps the questions that have gold evidence."""
    from cdsjax.eval.pools import document_notes
    from cdsjax.eval.problems import benchmark_kind, cached_encode, load_configured_benchmark
    from cdsjax.eval.settings import cache_dir_of
    from cdsjax.io.embed import Embedder

    cfg = _benchmark_config(name, config)
    bench = first_documents(load_configured_benchmark(cfg, all_queries=True), config.get("max_documents", None))
    kind = benchmark_kind(bench)
    embedder = Embedder(cfg)
    cache_dir = cache_dir_of(cfg)
    t0 = time.perf_counter()
    notes = document_notes(bench, cfg, embedder, cache_dir=cache_dir, progress=_PROGRESS.value)
    tag = bench.name if kind == "text" else bench.name.replace("/", "_")
    qemb = cached_encode(cache_dir, tag, embedder, [q.question for q in bench.queries], queries=True)
    keep = [i for i, q in enumerate(bench.queries) if has_gold(q, kind)]
    log(f"{name}: {len(bench.queries)} questions ({len(keep)} with gold evidence), {len(notes)} documents, "
        f"{sum(len(n.note_ids) for n in notes.values())} notes; loaded in {time.perf_counter() - t0:.0f} s")
    buckets = tuple(sorted(set(cfg.buckets) | {1024, 2048, 4096}))  # pools of 5 documents need the larger ones
    return BenchmarkData(name, kind, [bench.queries[i] for i in keep], np.asarray(qemb)[keep], notes, buckets)


def first_documents(bench, count: Optional[int]):
    """``bench`` cut to its first ``count`` documents (benchmark order) and their questions (all for None)."""
    if count is None:
        return bench
    docs = list(bench.corpora or bench.documents)[: int(count)]
    keep = set(docs)
    cut = {"queries": [q for q in bench.queries if set(q.doc_ids) <= keep]}
    if bench.corpora:
        cut["corpora"] = {d: bench.corpora[d] for d in docs}
    else:
        cut["documents"] = {d: bench.documents[d] for d in docs}
    return dataclasses.replace(bench, **cut)


def has_gold(q, kind: str) -> bool:
    """Whether a question has the gold the recall of its benchmark counts (pages or paragraphs)."""
    if kind == "text":
        return bool(q.gold_note_ids)
    return any(len(p) for p in q.gold_pages.values())


def recall(problem, selection, kind: str) -> float:
    """Recall of the selection: gold pages (PDF) or gold paragraphs (text) among the picked notes."""
    import cdsjax.eval.metrics as M

    idx = [int(i) for i in np.asarray(selection.indices)[np.asarray(selection.selected_valid, bool)]]
    if kind == "text":
        return M.paragraph_recall([problem.note_ids[i] for i in idx], problem.query.gold_note_ids)
    return M.page_recall([(problem.docs[i], problem.pages[i]) for i in idx], problem.query.gold_pages)


# ----------------------------------------------------------------------------- tasks


def _problems(data: BenchmarkData, docs, pool_size: int, seed: int):
    """The problems of the questions of ``docs``, pools drawn inside ``docs`` (a side with fewer documents
    than ``pool_size``, e.g. a small validation share, pools all of them)."""
    from cdsjax.eval.folds import split_problems

    return split_problems(data.name, data.queries, data.query_emb, data.notes, docs,
                          pool_size=min(int(pool_size), len(docs)), pool_seed=seed)


def make_tasks(datas: Dict[str, BenchmarkData], config) -> Tuple[List[Task], dict]:
    """Every task of the config, and the document split (for ``folds.json``)."""
    from cdsjax.eval.folds import document_folds, validation_split

    seed, k = int(config.seed), int(config.folds)
    folds = {b: document_folds(list(d.notes), k, seed=seed) for b, d in datas.items()}
    split = {b: [{"fold": f.index, "test": list(f.test)} for f in fs] for b, fs in folds.items()}
    tasks = []
    fit_pool = config.get("fit_pool_size", None)
    for size in config.pool_sizes:
        size = int(size)
        fit_size = int(fit_pool) if fit_pool else size
        # the game's fitting problems: the same documents, at fit_size documents per question
        fitting = (lambda data, fit_docs, val_docs: (None, None) if fit_size == size else
                   (_problems(data, fit_docs, fit_size, seed), _problems(data, val_docs, fit_size, seed)))
        joined = lambda i, j: None if fit_size == size else [p for b in datas for p in sides[(b, i)][j]]
        sides: Dict[Tuple[str, int], tuple] = {}
        for b, data in datas.items():
            for f in folds[b]:
                fit_docs, val_docs = validation_split(f.train, config.val_fraction, seed=seed + f.index)
                train, val = _problems(data, fit_docs, size, seed), _problems(data, val_docs, size, seed)
                sides[(b, f.index)] = (train, val, _problems(data, f.test, size, seed),
                                       *fitting(data, fit_docs, val_docs))
                tasks.append(Task("cv", f"{b}/fold{f.index}", f.index, size, train, val, {b: sides[(b, f.index)][2]},
                                  *sides[(b, f.index)][3:]))
        if config.both and len(datas) > 1:
            for i in range(k):
                tasks.append(Task("both", f"both/fold{i}", i, size,
                                  [p for b in datas for p in sides[(b, i)][0]],
                                  [p for b in datas for p in sides[(b, i)][1]],
                                  {b: sides[(b, i)][2] for b in datas}, joined(i, 3), joined(i, 4)))
        if config.transfer and len(datas) > 1:
            for src, data in datas.items():
                fit_docs, val_docs = validation_split(list(data.notes), config.val_fraction, seed=seed)
                train, val = _problems(data, fit_docs, size, seed), _problems(data, val_docs, size, seed)
                fit_train, fit_val = fitting(data, fit_docs, val_docs)
                for dst, other in datas.items():
                    if dst != src:
                        tasks.append(Task("transfer", f"{src}->{dst}", -1, size, train, val,
                                          {dst: _problems(other, list(other.notes), size, seed)}, fit_train, fit_val))
    order = {"cv": 0, "transfer": 1, "both": 2}  # cross-validation first: the later ones reuse its solves
    tasks.sort(key=lambda t: (order[t.name], t.pool_size))
    return tasks, split


# ----------------------------------------------------------------------------- running


METRICS = ("recall", "has_answer")


def has_answer_of(problem, selection) -> float:
    """has-answer of a selection (:func:`cdsjax.eval.scoring.answer_hit`): NaN where the question is not covered."""
    from cdsjax.eval.scoring import answer_hit

    idx = [int(i) for i in np.asarray(selection.indices)[np.asarray(selection.selected_valid, bool)]]
    return answer_hit(problem, idx)


class Runner:
    """Runs selectors over problems, remembering each (selector, budget, question, pool) recall and has-answer, so
    a problem shared by several tasks (single documents, the transfer targets) is solved once."""

    def __init__(self, datas: Dict[str, BenchmarkData], max_batch: int):
        self.datas = datas
        self.max_batch = max_batch
        self.kind_of = {}
        self.memo: Dict[tuple, Tuple[float, float]] = {}
        from cdsjax.eval.run import Executables, corpus_arrays_cache

        self.executables = Executables()  # the run's compiled calls, per selector and shape
        self.corpus = corpus_arrays_cache(self.executables)  # each corpus's bound and note block, per selector
        from cdsjax.learn import Objectives

        self.objectives = Objectives()  # the learned fits' compiled objectives, shared by the tasks' fits
        for b, d in datas.items():
            for q in d.queries:
                self.kind_of[q.qid] = (b, d.kind)

    @staticmethod
    def key(label: str, budget: int, problem) -> tuple:
        return (label, int(budget), problem.query.qid, tuple(dict.fromkeys(problem.docs)))

    def recalls(self, label: str, selector, budget: int, problems: Sequence[Any], *, memo: bool = True,
                metric: str = "recall") -> np.ndarray:
        """``[len(problems)]`` recall@budget (or ``metric="has_answer"``) of ``selector``: ``(spec, fn)``, a registry
        spec and its function."""
        from cdsjax.eval.run import run_selector

        spec, fn = selector
        todo = [p for p in problems if not memo or self.key(label, budget, p) not in self.memo]
        by_bench: Dict[str, list] = {}
        for p in todo:
            by_bench.setdefault(self.kind_of[p.query.qid][0], []).append(p)
        for b, ps in by_bench.items():
            kind = self.datas[b].kind
            sels = run_selector(fn, ps, buckets=self.datas[b].buckets, max_batch=self.max_batch, spec=spec,
                                corpus=self.corpus, executables=self.executables)
            for p, s in zip(ps, sels):
                self.memo[self.key(label, budget, p)] = (recall(p, s, kind), has_answer_of(p, s))
        j = METRICS.index(metric)
        return np.asarray([self.memo[self.key(label, budget, p)][j] for p in problems], np.float64)

    def scores(self, label: str, selector, budget: int, problems: Sequence[Any], *, memo: bool = True) -> tuple:
        """``(recall, has_answer)``, each ``[len(problems)]``, of one run of ``selector``."""
        rec = self.recalls(label, selector, budget, problems, memo=memo)  # (always stored: read back below)
        return rec, self.recalls(label, selector, budget, problems, metric="has_answer")


def prefetch(tasks: Sequence[Task], runner: Runner, config, log=print) -> None:
    """Runs every baseline once over the union of the problems the tasks need (test problems; for the
    tuned grids also the training and validation ones), so each selector compiles once per shape and a
    problem shared by several tasks is solved once; :func:`run_task` then reads the remembered recalls."""
    budgets = [int(b) for b in config.budgets]
    tests, tune = {}, {}
    for t in tasks:
        for ps in t.test.values():
            for p in ps:
                tests.setdefault(runner.key("", 0, p), p)
        for p in t.train + t.val:
            tune.setdefault(runner.key("", 0, p), p)
    test_list, both_list = list(tests.values()), list({**tests, **tune}.values())
    jobs = [(label, name, opts, b, test_list) for b in budgets for label, name, opts in fixed_selectors(config)]
    tune_budgets = budgets if config.tune_budget_each else sorted(set(budgets) | {int(config.fit_budget)})
    jobs += [(label, name, opts, b, both_list) for b in tune_budgets for grid in tuned_candidates(config).values()
             for label, name, opts in grid]
    bar = None
    if _PROGRESS.value:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="baselines", unit="selector")
    for label, name, opts, b, problems in jobs:
        t0 = time.perf_counter()
        runner.recalls(label, _registry_fn(name, b, opts), b, problems)
        log(f"  {label}@{b}: {len(problems)} problems, {time.perf_counter() - t0:.0f} s")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()


def _registry_fn(name: str, budget: int, options: dict):
    """``(spec, fn)`` of a registry selector (parameters resolved at the edge, memoised)."""
    from cdsjax.eval.run import cached_selector
    from cdsjax.pipeline.catalog import selector_spec

    return selector_spec(name), cached_selector(name, budget, options)


def tuned_candidates(config) -> Dict[str, List[Tuple[str, str, dict]]]:
    """``display name -> [(label, registry name, options)]`` of the tuned baselines' grids."""
    mmr, dpp = config.mmr_selector, config.dpp_selector
    shown = lambda name: display(name) if name in SPECS else name  # noqa: E731
    return {f"{shown(mmr)} (tuned)": [(f"{mmr}@lam={v:g}", mmr, {"lam": float(v)}) for v in config.mmr_lams],
            f"{shown(dpp)} (tuned)": [(f"{dpp}@theta={v:g}", dpp, {"theta": float(v)}) for v in config.dpp_thetas]}


def fit_example(problem):
    """The fitting example of a problem with the structure arrays the evaluation passes to the learned selector
    (:meth:`~cdsjax.eval.problems.Problem.structure` with ``pages_only``: printed pages; on text benchmarks
    each note is its own unit), so the game is fitted on what it is later asked to select from; None without
    gold."""
    from cdsjax.learn.data import Example, gold_units

    units, unit_valid = gold_units(problem)
    if units.shape[0] == 0:
        return None
    s = problem.structure(pages_only=True)
    return Example(qid=str(problem.query.qid), group="|".join(problem.query.doc_ids),
                   notes=np.asarray(problem.notes, np.float32), query=np.asarray(problem.query_emb, np.float32),
                   links=np.asarray(problem.links, bool), pages=s["pages"], doc_ids=s["doc_ids"], kinds=s["kinds"],
                   units=units, unit_valid=unit_valid)


def fit_learned(task: Task, config, log=print, benchmark_of=None, objectives=None):
    """``(theta, fit info)`` from ``cdsjax.learn.fit`` on the task's training and validation problems
    (``objectives``: the compiled objectives the tasks' fits share, :class:`cdsjax.learn.Objectives`).

    With ``config.balance`` a fit on several benchmarks (``both``) weighs each benchmark the same
    (``benchmark_of``: question id -> benchmark), as ``cdsjax tune`` does for the shipped fit.
    """
    from cdsjax.learn import fit
    from cdsjax.learn.data import balance

    # fitted through the read-out the selector is scored by (SelectorSpec.readout) unless config.learn says otherwise
    options = {"budget": int(config.fit_budget), "progress": False, "readout": SPECS[learned_selector(config)].readout,
               **{k: v for k, v in config.learn.to_dict().items() if v is not None}}
    fit_train = task.train if task.fit_train is None else task.fit_train
    fit_val = task.val if task.fit_val is None else task.fit_val
    train = [e for e in map(fit_example, fit_train) if e is not None]
    val = [e for e in map(fit_example, fit_val) if e is not None]
    if config.get("balance", False) and benchmark_of is not None:
        for side in (train, val):
            if side:
                balance(side, lambda e: benchmark_of(e.qid))
    t0 = time.perf_counter()
    result = fit(train, val, options, log=lambda line: log(f"    {line}"), objectives=objectives)
    info = {"seconds": float(getattr(result, "seconds", time.perf_counter() - t0)),
            "train_questions": len(train), "val_questions": len(val),
            "best": getattr(result, "best", None)}
    fit_pool = task.pool_size if task.fit_train is None else int(config.fit_pool_size)
    info["fit_pool_size"] = fit_pool
    log(f"  fitted {task.label} (pool {task.pool_size}; fitted on pools of {fit_pool}) on {len(fit_train)} "
        f"questions, stopped on {len(fit_val)}: {info['seconds']:.0f} s")
    return result.theta, info


def earlier_fit(task: Task, config, tuning: dict, log=print):
    """``(theta, info)`` of the fit a task with ``config.fit_pool_size`` shares with the task of that pool size
    (same label, so the same training and validation documents at the same pool size: the same fit, which is
    deterministic), found in this run's ``tuning`` or in ``config.fits_from`` (another run's ``tuning.json``);
    None when there is none, and the game is fitted."""
    if task.fit_train is None:
        return None
    key = f"{task.label}/pool{int(config.fit_pool_size)}"
    sources = [("this run", tuning)]
    path = str(config.get("fits_from", "") or "")
    if path and pathlib.Path(path).is_file():
        sources.append((path, json.loads(pathlib.Path(path).read_text())))
    for where, table in sources:
        entry = (table.get(key) or {}).get(learned_label(config)) if isinstance(table, dict) else None
        if entry and entry.get("theta") and (table.get(key) or {}).get("complete"):
            from cdsjax.core.games.learned import LearnedParams

            theta = LearnedParams.from_dict({k: float(v) for k, v in entry["theta"].items()})
            log(f"  {task.label} (pool {task.pool_size}): the game fitted for {key} ({where})")
            info = {k: v for k, v in entry.items() if k != "theta"}
            return theta, {**info, "fit_pool_size": int(config.fit_pool_size), "reused": key}
    return None


def run_task(task: Task, runner: Runner, config, out, tuning: dict, log=print) -> None:
    """Every selector on the task's test problems; tuned baselines chosen on its training side."""
    budgets = [int(b) for b in config.budgets]
    tune_on = task.train + task.val
    test = [(b, p) for b, ps in task.test.items() for p in ps]
    choice = tuning.setdefault(f"{task.label}/pool{task.pool_size}", {})

    def emit(selector: str, budget: int, values, chosen=None):
        for (b, p), v, a in zip(test, *values):
            out.write(json.dumps({"task": task.name, "label": task.label, "fold": task.fold,
                                  "pool_size": task.pool_size, "benchmark": b, "selector": selector,
                                  "budget": budget, "qid": p.query.qid,
                                  "recall": None if not np.isfinite(v) else float(v),
                                  "has_answer": None if not np.isfinite(a) else float(a),
                                  **({"chosen": chosen} if chosen else {})}) + "\n")
        out.flush()

    problems = [p for _, p in test]
    for budget in budgets:
        for label, name, opts in fixed_selectors(config):
            emit(label, budget, runner.scores(label, _registry_fn(name, budget, opts), budget, problems))
        for display, grid in tuned_candidates(config).items():
            tune_budget = budget if config.tune_budget_each else int(config.fit_budget)
            scores = [float(np.nanmean(runner.recalls(lab, _registry_fn(n, tune_budget, o), tune_budget, tune_on)))
                      for lab, n, o in grid]
            best = int(np.argmax(scores))  # ties: the first value of the grid
            lab, name, opts = grid[best]
            choice[f"{display}@{budget}"] = {"chosen": opts, "train_recall": dict(zip([g[0] for g in grid], scores))}
            emit(display, budget, runner.scores(lab, _registry_fn(name, budget, opts), budget, problems), chosen=opts)
    if config.learned:
        try:
            theta, info = earlier_fit(task, config, tuning, log=log) or fit_learned(
                task, config, log=log, benchmark_of=lambda qid: runner.kind_of[qid][0], objectives=runner.objectives)
        except ImportError as err:
            log(f"  learned CDS not available ({err}); no learned rows for {task.label}")
            theta = None
        if theta is not None:
            choice[learned_label(config)] = {**info, "theta": _theta_json(theta)}
            from cdsjax.core import make_selector
            from cdsjax.pipeline.catalog import selector_spec
            for budget in budgets:  # the registry's selector for this task's theta (not memoised: used once)
                name = learned_selector(config)
                fn = make_selector(name, budget=budget, params=theta)
                values = runner.scores(f"learned:{task.label}:{task.pool_size}", (selector_spec(name), fn),
                                       budget, problems, memo=False)
                runner.executables.release(fn, runner.corpus)  # this task's game is not solved again: free its executables
                emit(learned_label(config), budget, values)
    choice["complete"] = True


def _theta_json(theta) -> Any:
    import jax

    return jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), dataclasses.asdict(theta)
                                  if dataclasses.is_dataclass(theta) else theta)


# ----------------------------------------------------------------------------- summary


def summarize(records: List[dict], config) -> dict:
    """Means with bootstrap intervals per (task, pool size, benchmark, selector, budget, metric); paired
    differences of learned CDS against every other selector; per-fold means. Metrics: ``recall`` and
    ``has_answer`` (records written before has-answer was scored have none: their has-answer rows are absent)."""
    from cdsjax.eval.metrics import mean_ci, paired_difference

    R = int(config.num_resamples)
    groups: Dict[tuple, Dict[str, float]] = {}
    folds: Dict[tuple, list] = {}
    for r in records:
        for metric in METRICS:
            if metric not in r:
                continue
            v = np.nan if r[metric] is None else r[metric]
            key = (r["task"], r["pool_size"], r["benchmark"], r["budget"], r["selector"], metric)
            groups.setdefault(key, {})[f'{r["label"]}|{r["qid"]}'] = v
            folds.setdefault(key + (r["fold"],), []).append(v)
    rows, pairs = [], []
    for key, vals in groups.items():
        task, size, bench, budget, sel, metric = key
        mean, lo, hi, n = mean_ci(list(vals.values()), num_resamples=R)
        if not n:
            continue
        rows.append({"task": task, "pool_size": size, "benchmark": bench, "budget": budget, "selector": sel,
                     "metric": metric, "mean": mean, "ci_low": lo, "ci_high": hi, "n": n})
        learned = groups.get((task, size, bench, budget, learned_label(config), metric))
        if learned is None or sel == learned_label(config):
            continue
        ids = sorted(set(learned) & set(vals))
        d = paired_difference([learned[i] for i in ids], [vals[i] for i in ids], num_resamples=R)
        pairs.append({"task": task, "pool_size": size, "benchmark": bench, "budget": budget, "metric": metric,
                      "against": sel, **d})
    per_fold = [{"task": k[0], "pool_size": k[1], "benchmark": k[2], "budget": k[3], "selector": k[4],
                 "metric": k[5], "fold": k[6], "mean": float(np.nanmean(v)) if np.isfinite(v).any() else None,
                 "n": len(v)} for k, v in folds.items()]
    return {"rows": rows, "paired": pairs, "per_fold": per_fold, "learned": learned_label(config)}


def write_outputs(out_dir: pathlib.Path, summary: dict, copy: Optional[str], log=print) -> None:
    """``summary.json`` (with the provenance of its numbers), ``summary.csv``, ``paired.csv``, the figure and the
    printed tables."""
    from cdsjax.io.provenance import provenance

    summary = {**summary, "provenance": summary.get("provenance") or provenance()}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    for name, rows in (("summary.csv", summary["rows"]), ("paired.csv", summary["paired"])):
        if rows:
            with open(out_dir / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
    if copy:
        path = pathlib.Path(copy)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1))
    figure(summary, out_dir / "learned_cv.png")
    log(tables(summary))
    budgets = sorted({r["budget"] for r in summary["rows"]})
    sizes = sorted({r["pool_size"] for r in summary["rows"]})
    compact = [compact_table(summary, m, b, z) for m in METRICS for z in sizes for b in budgets[-1:]]
    (out_dir / "compact.md").write_text("\n\n".join(compact) + "\n")


def tables(summary: dict) -> str:
    """Markdown: recall@B and has-answer@B per selector (mean [95% CI], questions covered) and learned CDS minus
    each (win/tie/loss)."""
    lines = []
    metric_of = lambda r: r.get("metric", "recall")  # noqa: E731 (summaries written before has-answer)
    paired = {(p["task"], p["pool_size"], p["benchmark"], p["budget"], metric_of(p), p["against"]): p
              for p in summary["paired"]}
    rows = {(r["task"], r["pool_size"], r["benchmark"], r["budget"], metric_of(r), r["selector"]): r
            for r in summary["rows"]}
    keys = sorted({k[:4] for k in rows})
    learned = summary.get("learned", LEARNED)

    def cells(key):
        r, p = rows.get(key), paired.get(key)
        if r is None:
            return ["", "", "", ""]
        return [f'{r["mean"]:.3f} [{r["ci_low"]:.3f}, {r["ci_high"]:.3f}]', str(r["n"]),
                "" if p is None else f'{p["mean"]:+.3f} [{p["ci_low"]:+.3f}, {p["ci_high"]:+.3f}]',
                "" if p is None else f'{p["better"]} / {p["tie"]} / {p["worse"]}']

    for task, size, bench, budget in keys:
        lines += [f"\n#### {task}: {bench}, pool size {size}, recall@{budget} and has-answer@{budget}\n",
                  f"| selector | recall@{budget} | n | {learned} minus it [95% CI] | win / tie / loss "
                  f"| has-answer@{budget} | n | {learned} minus it [95% CI] | win / tie / loss |",
                  "|---|---|---|---|---|---|---|---|---|"]
        selectors = list(dict.fromkeys(k[5] for k in rows if k[:4] == (task, size, bench, budget)))
        for sel in selectors:
            row = cells((task, size, bench, budget, "recall", sel)) + cells((task, size, bench, budget,
                                                                              "has_answer", sel))
            lines.append(f"| {sel} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def compact_table(summary: dict, metric: str, budget: int, pool_size: int) -> str:
    """One markdown table of ``metric``@``budget`` at one pool size: a row per selector, a column per (task,
    benchmark), each cell the mean and the fitted game minus it [95% CI] (empty where not measured)."""
    learned = summary.get("learned", LEARNED)
    metric_of = lambda r: r.get("metric", "recall")  # noqa: E731
    rows = {(r["task"], r["benchmark"], r["selector"]): r for r in summary["rows"]
            if metric_of(r) == metric and r["budget"] == budget and r["pool_size"] == pool_size}
    paired = {(p["task"], p["benchmark"], p["against"]): p for p in summary["paired"]
              if metric_of(p) == metric and p["budget"] == budget and p["pool_size"] == pool_size}
    order = {"cv": 0, "both": 1, "transfer": 2}
    columns = sorted({k[:2] for k in rows}, key=lambda c: (order.get(c[0], 9), c[0], c[1]))
    selectors = list(dict.fromkeys(k[2] for k in rows))
    selectors = [s for s in selectors if s != learned] + [learned]
    n = {c: max((r["n"] for k, r in rows.items() if k[:2] == c), default=0) for c in columns}
    head = [f"{t}: {b} ({n[(t, b)]} q)" for t, b in columns]
    name = metric.replace("_", "-")
    lines = [f"| {name}@{budget}, pool {pool_size} | " + " | ".join(head) + " |",
             "|---|" + "---|" * len(columns)]
    for sel in selectors:
        cells = []
        for t, b in columns:
            r, p = rows.get((t, b, sel)), paired.get((t, b, sel))
            if r is None:
                cells.append("")
            elif p is None:
                cells.append(f'**{r["mean"]:.3f}**' if sel == learned else f'{r["mean"]:.3f}')
            else:
                cells.append(f'{r["mean"]:.3f} ({p["mean"]:+.3f} [{p["ci_low"]:+.3f}, {p["ci_high"]:+.3f}])')
        lines.append(f"| {sel} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(summary: dict, path: pathlib.Path) -> None:
    """Per-fold recall@10 (or the largest budget) of every selector, cross-validation tasks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cv = [r for r in summary["per_fold"] if r["task"] == "cv" and r["mean"] is not None
          and r.get("metric", "recall") == "recall"]
    if not cv:
        return
    budget = max(r["budget"] for r in cv)
    panels = sorted({(r["benchmark"], r["pool_size"]) for r in cv})
    selectors = list(dict.fromkeys(r["selector"] for r in cv))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (bench, size) in zip(axes[0], panels):
        for j, sel in enumerate(selectors):
            pts = sorted((r["fold"], r["mean"]) for r in cv if (r["benchmark"], r["pool_size"], r["selector"],
                                                                 r["budget"]) == (bench, size, sel, budget))
            if pts:
                ax.plot([j] * len(pts), [m for _, m in pts], "o", alpha=0.6, color=f"C{j}")
                ax.plot([j - 0.3, j + 0.3], [np.mean([m for _, m in pts])] * 2, "-", color=f"C{j}", lw=2)
        ax.set_xticks(range(len(selectors)))
        ax.set_xticklabels(selectors, rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{bench}, {'single document' if size == 1 else f'{size}-document pools'}", fontsize=9)
        ax.set_ylabel(f"recall@{budget} per test fold")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def _done_records(path: pathlib.Path) -> List[dict]:
    from cdsjax.eval.records import drop_torn_tail, read_records

    drop_torn_tail(path)
    return read_records(path)


def completed_records(out_dir: pathlib.Path) -> Tuple[List[dict], dict]:
    """The records and tuning of the tasks an output directory completed (a task cut short is left out)."""
    tuning_path = out_dir / "tuning.json"
    tuning = json.loads(tuning_path.read_text()) if tuning_path.is_file() else {}
    done = {k for k, v in tuning.items() if v.get("complete")}
    records = [r for r in _done_records(out_dir / "records.jsonl") if f'{r["label"]}/pool{r["pool_size"]}' in done]
    return records, {k: tuning[k] for k in done}


def merge(dirs: Sequence[str], config) -> None:
    """:func:`summarize` over the completed tasks of several output directories."""
    out_dir = pathlib.Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records, tuning = [], {}
    for d in dirs:
        r, t = completed_records(pathlib.Path(d))
        records += r
        tuning.update(t)
        print(f"{d}: {len(t)} completed tasks, {len(r)} records")
    summary = summarize(records, config)
    summary["tuning"] = tuning
    summary["config"] = json.loads(config.to_json())
    write_outputs(out_dir, summary, _SUMMARY_COPY.value)


MIN_MAP_COUNT = 262_144


def warn_map_count(path: str = "/proc/sys/vm/max_map_count", log=print) -> None:
    """One line when the kernel's limit on memory mappings is low: a whole run loads thousands of executables
    (a few mappings each) and, past Linux's default 65,530, LLVM fails with 'Cannot allocate memory' and the
    process dies (measured: ~45,000 mappings after the baselines alone). Runs resume after the last task."""
    try:
        limit = int(pathlib.Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if limit < MIN_MAP_COUNT:
        log(f"learned_cv: warning: vm.max_map_count is {limit}; a whole run may crash in LLVM ('Cannot allocate "
            f"memory') — raise it (sysctl -w vm.max_map_count={4 * MIN_MAP_COUNT}) or rerun, which resumes "
            "after the last completed task")


def main(argv):
    from experiments.cli import config_or_exit, exit_on_user_error

    config = config_or_exit(argv, _CONFIG.value, "configs/learned_cv.py")
    if _MERGE.value:
        merge(_MERGE.value, config)
        return
    out_dir = pathlib.Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from cdsjax.io.compilation_cache import enable_compilation_cache

    enable_compilation_cache(out_dir / "cache" / "jax-compilation")  # a rerun loads its executables
    warn_map_count()
    with exit_on_user_error("learned_cv"):
        names = [b.strip() for b in str(config.benchmarks).split(",") if b.strip()]
        datas = {b: load_data(b, config) for b in names}
        tasks, split = make_tasks(datas, config)
    (out_dir / "folds.json").write_text(json.dumps({"seed": int(config.seed), "folds": split}, indent=1))
    records_path = out_dir / "records.jsonl"
    tuning_path = out_dir / "tuning.json"
    tuning = json.loads(tuning_path.read_text()) if tuning_path.is_file() else {}
    done = {(t.label, t.pool_size) for t in tasks if tuning.get(f"{t.label}/pool{t.pool_size}", {}).get("complete")}
    runner = Runner(datas, int(config.max_batch))
    todo = [] if _SUMMARIZE_ONLY.value else [t for t in tasks if (t.label, t.pool_size) not in done]
    print(f"{len(tasks)} tasks ({len(tasks) - len(todo)} already on disk)")
    if todo or _SUMMARIZE_ONLY.value:  # a task interrupted half-way is redone whole: drop its partial rows
        keep = [r for r in _done_records(records_path) if (r["label"], r["pool_size"]) in done]
        records_path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    if todo:
        prefetch(todo, runner, config)
    bar = None
    if _PROGRESS.value and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="tasks", unit="task")
    with open(records_path, "a", encoding="utf-8") as f:
        for task in todo:
            t0 = time.perf_counter()
            run_task(task, runner, config, f, tuning, log=print)
            tuning_path.write_text(json.dumps(tuning, indent=1))
            print(f"{task.label} pool {task.pool_size}: {sum(len(v) for v in task.test.values())} test questions, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    summary = summarize(_done_records(records_path), config)
    summary["tuning"] = tuning
    summary["config"] = json.loads(config.to_json())
    write_outputs(out_dir, summary, _SUMMARY_COPY.value)


if __name__ == "__main__":
    from experiments.cli import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
