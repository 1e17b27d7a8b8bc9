"""Fitting the learned CDS game (:mod:`cdsjax.core.games.learned`) to questions with gold evidence.

* :func:`fit` / :class:`FitResult` — Adam through implicit derivatives (:mod:`cdsjax.learn.fit`); :class:`FitConfig`
  — its options (:mod:`cdsjax.learn.fit_config`); :class:`Objectives` — compiled objectives several fits share
  (:mod:`cdsjax.learn.objective`); a fit's checkpoint: :mod:`cdsjax.learn.checkpoint`.
* :func:`save_params` / :func:`load_params` — the parameter file with its provenance (the only code that
  reads or writes one); the package ships one per read-out (:data:`DEFAULT_PARAMS_FILES`, read once per
  process by :func:`default_params`): the defaults of ``cds-learned`` and ``cds-learned-pages``;
  :func:`resolve_params` turns a path, a value or nothing into a value, :func:`params_hash` names it by content.
* :mod:`cdsjax.learn.data` — gold units, structure codes, padded batches, the split by document.
"""

from cdsjax.learn.data import Example, examples_of, gold_units, make_batches, split_by_document
from cdsjax.learn.fit import FitResult, fit
from cdsjax.learn.fit_config import FitConfig
from cdsjax.learn.objective import Objectives
from cdsjax.learn.params_io import (DEFAULT_PARAMS, DEFAULT_PARAMS_FILES, default_params, load_params, params_hash,
                                    resolve_params, save_params)

__all__ = ["DEFAULT_PARAMS", "DEFAULT_PARAMS_FILES", "Example", "FitConfig", "FitResult", "Objectives", "default_params",
           "examples_of", "fit", "gold_units", "load_params", "make_batches", "params_hash", "resolve_params",
           "save_params", "split_by_document"]
