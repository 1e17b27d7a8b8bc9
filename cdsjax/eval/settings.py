"""What an evaluation config asks for: the selectors under their labels, the budgets, the float type, and
the settings that identify a run (records are resumed only into a run with the same identity)."""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import List, Tuple

DTYPES = ("float32", "float64")


def selector_specs(config) -> List[Tuple[str, str, dict]]:
    """``(label, registry name, options)`` per entry of ``config.selectors``.

    ``config.selectors`` is a list (or comma-separated string) of labels;
    ``config.selector_options[label]`` holds that selector's options, and its
    optional ``selector`` key names the registry entry (default: the label), so
    one selector can appear under several labels with different options. Options of
    labels that are not selected are ignored (so a config can keep them all). ``-`` and ``_`` are
    interchangeable in names and in the keys of ``selector_options`` (``cds-learned-pages`` = ``cds_learned_pages``).
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
        opts = dict(next((all_opts[k] for k in (label, label.replace("-", "_"), label.replace("_", "-"))
                          if k in all_opts), {}))
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


# Config fields that decide no record: where outputs and caches go, how many questions are asked (a record is per
# question), which budgets (a record is per budget), how the summary is computed, what is shown while running, and
# the selector fields (each record's own selector and options are put back by :func:`record_identity`).
NOT_DECIDING = ("output_dir", "cache_dir", "max_queries", "budget", "budgets", "num_resamples", "compare",
                "progress", "selectors", "selector_options", "params")
NOT_DECIDING_NESTED = {"embedder": ("show_progress",), "index": ("cache_dir",)}


def record_identity(config, name: str, options: dict) -> dict:
    """Everything that decides the records of one selector of a run, as plain values: the registry ``name`` and
    its full ``options`` (a learned game's parameters by their content, so a refit file at the same path counts as
    another selector), the code version (:func:`cdsjax.io.provenance.code_version`), and every field of the
    resolved config except :data:`NOT_DECIDING` ones (data, loader, relevance, embedder and encoder settings,
    evidence and reader settings, dtype, batching, and any field added later).

    A record on disk is resumed only when the :func:`identity_digest` it carries equals this one's; records made
    with other settings, or by another commit of the code, are computed again (the reader's replies come from its
    cache, so a rerun at a new commit costs the selection only).
    """
    from cdsjax.io.datasets import resolve_data_root
    from cdsjax.io.provenance import code_version, plain
    from cdsjax.pipeline.selection import resolve_options, selector_key

    settings = {k: v for k, v in plain(config).items() if k not in NOT_DECIDING}
    for group, fields in NOT_DECIDING_NESTED.items():
        if isinstance(settings.get(group), dict):
            settings[group] = {k: v for k, v in settings[group].items() if k not in fields}
    if "data_root" in settings:
        settings["data_root"] = str(resolve_data_root(settings["data_root"]))
    resolved = selector_key(name, 0, resolve_options(name, options))[2]
    return {"selector": name, "options": plain(dict(resolved)), "code": code_version(), "config": settings}


def identity_digest(identity: dict) -> str:
    """A short content hash of a :func:`record_identity`."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity_changes(before: dict, after: dict) -> List[str]:
    """The fields in which two :func:`record_identity` values differ, named as config fields
    (``selector_options``, ``params``, ``code``, ``reader.evidence_tokens``, ...)."""
    out = []
    if before.get("selector") != after.get("selector"):
        out.append("selectors")
    b_opts, a_opts = dict(before.get("options") or {}), dict(after.get("options") or {})
    if b_opts.pop("params", None) != a_opts.pop("params", None):
        out.append("params")
    if b_opts != a_opts:
        out.append("selector_options")
    if before.get("code") != after.get("code"):
        out.append("code")
    bc, ac = before.get("config") or {}, after.get("config") or {}
    for k in sorted(set(bc) | set(ac)):
        if bc.get(k) == ac.get(k):
            continue
        if isinstance(bc.get(k), dict) and isinstance(ac.get(k), dict):
            out += [f"{k}.{f}" for f in sorted(set(bc[k]) | set(ac[k])) if bc[k].get(f) != ac[k].get(f)]
        else:
            out.append(k)
    return out


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
