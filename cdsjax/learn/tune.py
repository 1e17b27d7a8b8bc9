"""``cdsjax tune``: load benchmark questions, split them by document, fit the learned game, write the
parameter file with its provenance.

The config (``configs/tune/*.py``) names the benchmarks (``benchmarks = "qasper,mmlongbench"``) and per
benchmark the questions kept (``max_queries``), the recall budget (``budgets``) and an embedding / index
cache (``cache_dirs``; "" keeps it under the output's directory). ``fit`` holds
:class:`~cdsjax.learn.fit_config.FitConfig` fields. The split is by document: each benchmark's documents are
shuffled with ``seed`` and ``val_fraction`` of them (with all their questions) form the validation split.
"""

from __future__ import annotations

import datetime
import pathlib
from typing import Callable, Dict, List, Tuple

import ml_collections

from cdsjax.io.provenance import code_version, provenance as run_provenance
from cdsjax.learn.data import Example, balance, examples_of, split_by_document
from cdsjax.learn.fit import FitResult, fit
from cdsjax.learn.fit_config import FitConfig
from cdsjax.learn.params_io import save_params
from cdsjax.defaults import DEFAULT_BUDGET

def benchmark_names(config) -> List[str]:
    names = [b.strip() for b in str(config.benchmarks).split(",") if b.strip()]
    if not names:
        raise ValueError("config.benchmarks names no benchmark")
    return names


def _sub(config, name: str, key: str, default=None):
    group = config.get(key, None)
    if group is None:
        return default
    value = group.get(name, default) if hasattr(group, "get") else group
    return default if value in (None, "") else value


def cache_dir_for(config, name: str) -> pathlib.Path:
    given = _sub(config, name, "cache_dirs")
    return pathlib.Path(given) if given else pathlib.Path(config.output).parent / "cache" / name


def load_examples(config, name: str, embedder, load_problems: Callable, *, progress: bool = False,
                  log: Callable[[str], None] = print) -> List[Example]:
    """The examples (questions with gold) of one benchmark of the config, each with its budget.

    ``load_problems`` is the evaluation's loader (:func:`cdsjax.eval.load_problems`), handed in by the caller so
    that the fit does not depend on the evaluation package (the command layer wires the two together)."""
    values = config.to_dict()
    loader = _sub(config, name, "loaders")
    values.update(benchmark=name, max_queries=_sub(config, name, "max_queries"),
                  loader=loader.to_dict() if hasattr(loader, "to_dict") else dict(loader or {}))
    for key in ("max_queries", "cache_dirs", "budgets", "loaders"):  # per-benchmark groups, resolved above
        if key != "max_queries":
            values.pop(key, None)
    sub = ml_collections.ConfigDict(values)
    bench, kind, problems, _ = load_problems(sub, embedder, cache_dir=cache_dir_for(config, name), progress=progress,
                                             log=log)
    examples = examples_of(problems, getattr(bench, "corpora", None) or None)
    budget = int(_sub(config, name, "budgets", DEFAULT_BUDGET))
    for e in examples:
        e.budget = budget
        e.group = f"{name}:{e.group}"
    log(f"tune: {name}: {len(problems)} questions, {len(examples)} with gold, budget {budget}")
    return examples


def benchmark_of(example: Example) -> str:
    """The benchmark an example was loaded from (:func:`load_examples` prefixes its group with it)."""
    return example.group.split(":", 1)[0]


def split_examples(config, per_bench: Dict[str, List[Example]]) -> Tuple[list, list, dict]:
    """Each benchmark split by document with the config's seed; the splits are concatenated. With
    ``config.balance`` each benchmark weighs the same in the training and in the validation means."""
    train, val, docs = [], [], {}
    for name, examples in per_bench.items():
        tr, va, d = split_by_document(examples, float(config.val_fraction), int(config.seed))
        train += tr
        val += va
        docs[name] = d
    if config.get("balance", False):
        weights = {side: balance(examples, benchmark_of) if examples else {} for side, examples in
                   (("train", train), ("val", val))}
        for name in docs:
            docs[name]["weight"] = {side: w.get(name) for side, w in weights.items()}
    return train, val, docs


def provenance(config, per_bench, docs, result: FitResult, seconds: float) -> dict:
    """What the parameter file says about where it came from."""
    best = result.best or {}
    figures = lambda which: {k: best.get(f"{which}_{k}") for k in ("surrogate", "recall")}
    split_counts = {n: {"train_documents": len(d["train"]), "val_documents": len(d["val"])} for n, d in docs.items()}
    return {
        "data": {n: {"questions_with_gold": len(ex), "budget": ex[0].budget if ex else None,
                     "max_queries": _sub(config, n, "max_queries"), **split_counts[n]}
                 for n, ex in per_bench.items()},
        "split": {"by": "document", "val_fraction": float(config.val_fraction), "seed": int(config.seed),
                  "documents": {n: {k: v for k, v in d.items() if k != "weight"} for n, d in docs.items()}},
        "balance": ({"by": "benchmark", "weight_per_question": {n: d.get("weight") for n, d in docs.items()}}
                    if config.get("balance", False) else None),
        "seeds": {"split": int(config.seed), "fit": int(result_fit_seed(config))},
        "fit": FitConfig.from_mapping(config.fit).to_dict(),
        "figures": {"train": figures("train"), "val": figures("val"), "paper_theta0": result.reference,
                    "note": "surrogate = soft recall@B; recall = recall@B of the learned selection (fill rule), "
                            "mean over questions of the split"},
        "best": {k: best.get(k) for k in ("start", "step")},
        "grid": result.grid,
        "history": result.history,
        "fit_seconds": seconds,
        "code_version": code_version(),
        **{k: v for k, v in run_provenance(config).items() if k != "created"},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cross_validation": cross_validation(config),
    }


def result_fit_seed(config) -> int:
    return int(config.fit.get("seed", 0) or 0)


def cross_validation(config):
    """The cross-validated figures of ``config.cv_summary`` (the ``summary.json`` of
    ``experiments/learned_cv.py``) if given and readable: its means with intervals and the paired differences
    of learned CDS, rounded (not its per-fold rows or tuning); else where they are reported."""
    import json

    path = str(config.get("cv_summary", "") or "")
    if path and pathlib.Path(path).is_file():
        try:
            body = json.loads(pathlib.Path(path).read_text())
        except (OSError, ValueError):
            body = None
        if isinstance(body, dict) and "rows" in body:
            r4 = lambda v: round(v, 4) if isinstance(v, float) else v
            keep = lambda rows: [{k: r4(v) for k, v in row.items()} for row in rows or []]
            return {"source": "experiments/learned_cv.py summary.json", "rows": keep(body.get("rows")),
                    "paired": keep(body.get("paired"))}
        if body is not None:
            return body
    return "not part of this fit: see RESULTS.md, section 'Learned CDS, cross-validated' (cross-validated, transfer and pool tables)"


def tune(config, load_problems: Callable, *, progress: bool = False,
         log: Callable[[str], None] = print) -> Tuple[pathlib.Path, FitResult]:
    """Runs the tuning a config describes and writes ``config.output``; returns its path and the fit.

    ``load_problems(config, embedder, cache_dir=, progress=, log=)`` loads one benchmark's problems
    (:func:`cdsjax.eval.load_problems` in ``cdsjax tune``)."""
    import time

    from cdsjax.io.embed import Embedder

    start = time.perf_counter()
    names = benchmark_names(config)
    embedder = Embedder(config)
    per_bench = {n: load_examples(config, n, embedder, load_problems, progress=progress, log=log) for n in names}
    loaded = time.perf_counter() - start
    train, val, docs = split_examples(config, per_bench)
    log(f"tune: {len(train)} training and {len(val)} validation questions "
        f"({sum(len(d['train']) for d in docs.values())} / {sum(len(d['val']) for d in docs.values())} documents); "
        f"data loaded in {loaded:.0f} s")
    fit_config = FitConfig.from_mapping(config.fit)
    if not fit_config.checkpoint_dir:
        fit_config.checkpoint_dir = str(pathlib.Path(config.output).with_suffix(".ckpt"))
    fit_config.progress = progress and fit_config.progress
    result = fit(train, val, fit_config, log=log)
    if not result.finished:
        log(f"tune: stopped after stop_after={fit_config.stop_after} steps; rerun to resume from "
            f"{fit_config.checkpoint_dir}")
    prov = provenance(config, per_bench, docs, result, result.seconds)
    prov["load_seconds"] = loaded
    path = save_params(config.output, result.theta, prov)
    best = result.best or {}
    log(f"tune: wrote {path} (fit {result.seconds:.0f} s; validation recall {best.get('val_recall')}, "
        f"paper game {result.reference.get('val', {}).get('recall')})")
    return path, result
