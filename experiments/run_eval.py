r"""Batch retrieval evaluation of selectors on a benchmark.

Usage (from the repository root)::

    python experiments/run_eval.py --config configs/hotpotqa.py
    python experiments/run_eval.py --config configs/mmlongbench.py --config.max_queries=20 \
        --config.output_dir=runs/eval/mmlb20 --config.selectors=cosine,cds_converged

For every selector and budget it writes one JSONL record per query to
``<output_dir>/records.jsonl`` (selected notes, metrics, solver diagnostics),
resumes from that file when rerun, and prints and writes the summary:
``summary.csv`` (benchmark, selector, metric, mean, ci_low, ci_high, n; 95%
percentile-bootstrap intervals) and ``summary.md``. The batch axis is sharded over
all local devices (``jax.devices()``); on CPU, try
``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
"""

import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_CONFIG = config_flags.DEFINE_config_file("config", None, "Evaluation config file (configs/*.py).",
                                          lock_config=True)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars on stderr.")
_AGENT = flags.DEFINE_enum("agent", None, ["planning"],
                           "Evaluate the planning agent's evidence, retrieving with each of config.selectors "
                           "(also 'cds+single' / 'cds+peel') at config.budget, with the model at "
                           "CDSJAX_READER_URL or a rule-based stand-in (see experiments/eval_planning.py).")


def main(argv):
    from experiments.cli import config_or_exit, exit_on_user_error

    config = config_or_exit(argv, _CONFIG.value, "configs/hotpotqa.py")
    from cdsjax.commands.eval import locate_data
    from cdsjax.eval.runner import evaluate

    with exit_on_user_error("run_eval"):
        locate_data(config, prog="run_eval")

    if _AGENT.value == "planning":
        import os

        from experiments.eval_planning import run

        selectors = config.selectors if isinstance(config.selectors, str) else ",".join(config.selectors)
        with exit_on_user_error("run_eval"):
            run(config, variants=selectors, budget=int(config.budget),
                reader_url=os.environ.get("CDSJAX_READER_URL"), reader_model=os.environ.get("CDSJAX_READER_MODEL"),
                judge=bool(os.environ.get("CDSJAX_JUDGE_URL")), progress=_PROGRESS.value)
        return
    with exit_on_user_error("run_eval"):
        evaluate(config, progress=_PROGRESS.value)


if __name__ == "__main__":
    from experiments.cli import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
