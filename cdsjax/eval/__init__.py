"""Batch evaluation of selectors on a benchmark: problems -> sharded selection -> records -> summary.

The parts, each usable alone:

* :mod:`cdsjax.eval.problems` — :class:`~cdsjax.eval.problems.Problem` (one query's notes, query
  vector, note links) and the problems of a text or PDF benchmark; :mod:`cdsjax.eval.pools` — candidate
  pools and the open corpus.
* :mod:`cdsjax.eval.run` — :func:`~cdsjax.eval.run.run_selector`: problems padded into buckets, a
  selector ``jit(vmap)`` per bucket with the batch axis sharded over a 1-D device mesh.
* :mod:`cdsjax.eval.scoring` — the retrieval metrics and solver diagnostics of one selection
  (:mod:`cdsjax.eval.metrics`: the metrics themselves, pure NumPy).
* :mod:`cdsjax.eval.records` — one JSONL record per (selector, budget, query), resumed from;
  :mod:`cdsjax.eval.report` — ``summary.csv``, markdown tables, timings.
* :mod:`cdsjax.eval.settings` — what a config asks for (selectors, budgets, dtype, run identity).
* :mod:`cdsjax.eval.evaluate` — :func:`evaluate`, all of it for a config. ``experiments/run_eval.py`` and ``cdsjax eval`` are the
  command-line entry points.
"""

from cdsjax.eval.evaluate import evaluate, load_problems

__all__ = ["evaluate", "load_problems"]
