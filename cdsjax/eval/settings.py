"""What an evaluation config asks for: the selectors under their labels, the budgets, the float type, and
the settings that identify a run (records are resumed only into a run with the same identity)."""

from __future__ import annotations

import pathlib
from typing import List, Tuple

DTYPES = ("float32", "float64")


def selector_specs(config) -> List[Tuple[str, str, dict]]:
    """``(label, registry name, options)`` per entry of ``config.selectors``.

    ``config.selectors`` is a list (or comma-separated string) of labels;
    ``config.selector_options[label]`` holds that selector's options, and its
    optional ``selector`` key names the registry entry (default: the label), so
    one selector can appear under several labels with different options. Options of
    labels that are not selected are ignored (so a config can keep them all).
    """
    from cdsjax.pipeline.catalog import selector_names, selector_spec

    labels = config.selectors
    if isinstance(labels, str):
        labels = [s.strip() for s in labels.split(",") if s.strip()]
    labels = list(labels)
    if not labels:
        raise ValueError("config.selectors is empty")
    if len(set(labels)) != len(labels):
        raise ValueError(f"config.selectors has duplicates: {labels}")
    all_opts = config.get("selector_options", None) or {}
    if hasattr(all_opts, "to_dict"):
        all_opts = all_opts.to_dict()
    specs = []
    for label in labels:
        if label in ("none", "full"):  # reader controls (cdsjax.eval.reading), not registry selectors
            continue
        opts = dict(all_opts.get(label, {}))
        name = opts.pop("selector", label)
        try:
            spec = selector_spec(name)  # a display form (cds-paper) names its registry entry
        except ValueError:
            raise ValueError(f"config.selectors: unknown selector {name!r} (label {label!r}); "
                             f"known: {list(selector_names())}") from None
        name = spec.name
        if spec.learned and params_file(config) and "params" not in opts:
            opts["params"] = params_file(config)
        specs.append((label, name, opts))
    return specs


def params_file(config) -> str:
    """``config.params``: the learned game's parameter file for the ``cds_learned`` selector ("" or absent: the
    fit shipped with the package). A selector's own ``params`` option wins over it."""
    value = config.get("params", None)
    return str(value) if value else ""


def check_params(config) -> None:
    """Reads ``config.params`` now, so a missing or malformed file is one line before any data is loaded."""
    if params_file(config):
        from cdsjax.learn.params_io import load_params

        load_params(params_file(config))


def budgets_of(config) -> List[int]:
    """The budgets to run, ascending without repeats: ``config.budgets``, else ``[config.budget]``."""
    budgets = list(config.get("budgets", None) or []) or [config.budget]
    for b in budgets:
        if int(b) < 1:
            raise ValueError(f"budgets must be >= 1, got {b}")
    return sorted(dict.fromkeys(int(b) for b in budgets))


def run_identity(config) -> dict:
    """What must match for records in ``output_dir`` to be resumed."""
    keep = ("benchmark", "data_root", "loader", "ingest", "enrich", "embedder", "link_window", "dtype",
            "pool_size", "distractors", "pool_seed", "candidate_pool", "first_stage_k", "relevance")
    out = {}
    for k in keep:
        if k in config:
            v = config[k]
            out[k] = v.to_dict() if hasattr(v, "to_dict") else v
    from cdsjax.io.datasets import resolve_data_root

    out["data_root"] = str(resolve_data_root(config.data_root))
    if params_file(config):  # records of another fit are not resumed (the parameters' content, not the path)
        from cdsjax.learn.params_io import params_hash, resolve_params

        out["params"] = params_hash(resolve_params(params_file(config)))
    return out


def relevance_settings(config):
    """``config.relevance`` (mode, lexical_weight, context) as a ConfigDict, checked
    (:func:`cdsjax.io.relevance.settings_of`)."""
    import ml_collections

    from cdsjax.io.relevance import settings_of

    return ml_collections.ConfigDict(settings_of(config))


def cache_dir_of(config) -> pathlib.Path:
    """Where a run keeps its indexes, question vectors and compiled selectors: ``config.cache_dir``, else
    ``<output_dir>/cache``."""
    return pathlib.Path(config.get("cache_dir", "") or pathlib.Path(config.output_dir) / "cache")


def eval_dtype(config) -> str:
    """``config.dtype`` (default ``"float32"``), checked.

    ``"float64"`` needs ``jax_enable_x64``, a process-wide JAX setting that only entry points change
    (``experiments/run_eval.py`` and ``cdsjax eval`` turn it on for such a config).

    Raises:
      ValueError: an unknown dtype, or float64 while x64 is off (one line).
    """
    dtype = str(config.get("dtype", "float32"))
    if dtype not in DTYPES:
        raise ValueError(f"config.dtype must be 'float32' or 'float64', got {dtype!r}")
    if dtype == "float64":
        import jax

        if not jax.config.jax_enable_x64:
            raise ValueError("config.dtype='float64' needs jax_enable_x64, which is off: enable it in the "
                             "entry point (jax.config.update('jax_enable_x64', True)) before evaluating")
    return dtype
