"""``cdsjax tune --config FILE``: fit the learned CDS game (selector ``cds-learned``) on benchmark questions.

    cdsjax tune --config configs/tune/small.py
    cdsjax tune --config configs/tune/dev.py --config.cache_dirs.mmlongbench=DIR --config.output=params.json

Loads the config's benchmarks, splits their questions by document (``val_fraction``, ``seed``), fits the
parameters by Adam through the implicit derivatives of the equilibrium (:mod:`cdsjax.learn.fit`) and writes
``config.output``: the parameters and their provenance (data, split, seeds, train/validation figures, the
learning curves, code version). Pass it to ``ask``/``serve``/``eval`` with ``--params FILE``. An
interrupted fit resumes from ``<output>.ckpt`` when run again.
"""

from __future__ import annotations

import sys

from cdsjax.commands import CLIError, enable_float64
from cdsjax.commands.eval import CONFIG_FLAG, load_config, locate_data


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, metavar="FILE[:ARG]", help="a tune config (configs/tune/*.py)")
    p.add_argument("--output", default=None, help="the parameter file to write (default: config.output)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(extra_prefix=f"--{CONFIG_FLAG}.")


def run(args) -> int:
    config = load_config(args.config, args.extra)
    if args.output is not None:
        config.output = args.output
    if config.fit.get("dtype", "float64") == "float64":
        enable_float64()
    from cdsjax.eval import load_problems
    from cdsjax.learn.tune import tune

    try:
        locate_data(config, prog="cdsjax tune")
        tune(config, load_problems, progress=not args.no_progress and sys.stderr.isatty(),
             log=lambda s: print(s, file=sys.stderr))
    except (ValueError, FileNotFoundError, KeyError) as err:
        raise CLIError(str(err).strip("'\""), 1) from None
    return 0
