"""Evaluation: retrieval metrics and their summaries (pure NumPy).

- :mod:`cdsjax.eval.metrics` — page / box / paragraph recall at a budget, redundancy,
  distinct pages, and mean with a 95% bootstrap interval.
"""
