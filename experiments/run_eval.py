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

Several processes (joined by ``jax.distributed``; questions split by process index, one records shard
each, merged by process 0; see ``cdsjax/eval/distributed.py``)::

    python experiments/run_eval.py --config configs/hotpotqa.py --processes 2        # on this machine
    python experiments/run_eval.py --config ... --coordinator HOST:PORT --num_processes N --process_id I
                                                                                     # once per host
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
_FRESH = flags.DEFINE_bool("fresh", False, "Start the output directory over (its records and run.json; caches stay).")
_AGENT = flags.DEFINE_enum("agent", None, ["planning"],
                           "Evaluate the planning agent's evidence, retrieving with each of config.selectors "
                           "(also 'cds+single' / 'cds+peel') at config.budget, with the model at "
                           "CDSJAX_READER_URL or a rule-based stand-in (see experiments/eval_planning.py).")


_PARAMS = flags.DEFINE_string("params", None, "The learned game's parameter file (cdsjax tune) for the cds_learned "
                              "selector; the same as --config.params=FILE (default: the fit shipped with cdsjax).")
_PROCESSES = flags.DEFINE_integer("processes", 1, "Local processes to run the evaluation in, joined through "
                                  "jax.distributed (coordinator on 127.0.0.1, one CPU device each).")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "On a cluster: HOST:PORT of process 0's coordinator "
                                   "(or JAX_COORDINATOR_ADDRESS).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "On a cluster: how many processes (hosts) in all "
                                      "(or JAX_NUM_PROCESSES).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "On a cluster: this process's id, 0..num_processes-1 "
                                   "(or JAX_PROCESS_ID).")


def _without_processes_flag(argv):
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--processes", "-processes"):
            skip = True
            continue
        if a.startswith(("--processes=", "-processes=")):
            continue
        out.append(a)
    return out


def main(argv):
    from experiments.cli import config_or_exit, exit_on_user_error

    config = config_or_exit(argv, _CONFIG.value, "configs/hotpotqa.py")
    if _PARAMS.value is not None:
        with config.unlocked():
            config.params = _PARAMS.value
    if config.get("dtype", None) == "float64":  # a process-wide setting: entry points change it, evaluate checks it
        import jax

        jax.config.update("jax_enable_x64", True)
    from cdsjax.commands.eval import locate_data
    from cdsjax.eval import evaluate
    from cdsjax.eval.settings import check_params

    from cdsjax.eval import distributed

    with exit_on_user_error("run_eval"):
        check_params(config)
        locate_data(config, prog="run_eval")
        cluster = distributed.settings(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
        if _PROCESSES.value < 1:
            raise ValueError(f"--processes must be >= 1, got {_PROCESSES.value}")
        if (_PROCESSES.value > 1 or cluster) and _AGENT.value:
            raise ValueError("--agent runs in one process (no --processes or cluster flags)")
    if _PROCESSES.value > 1 and cluster is None:
        sys.exit(distributed.launch_local(str(pathlib.Path(__file__).resolve()),
                                          _without_processes_flag(sys.argv[1:]), _PROCESSES.value,
                                          output_dir=str(config.output_dir)))

    if _AGENT.value == "planning":
        import os

        from experiments.eval_planning import run

        selectors = config.selectors if isinstance(config.selectors, str) else ",".join(config.selectors)
        from cdsjax.eval.reader_setup import local_reader

        with exit_on_user_error("run_eval"), local_reader(config) as (config, connection):  # config.reader.local
            url = str(config.reader.get("url", "") or "") or os.environ.get("CDSJAX_READER_URL")
            model = str(config.reader.get("model", "") or "") or os.environ.get("CDSJAX_READER_MODEL")
            run(config, variants=selectors, budget=int(config.budget), reader_url=url, reader_model=model,
                connection=connection, judge=bool(os.environ.get("CDSJAX_JUDGE_URL")), progress=_PROGRESS.value)
        return
    process = distributed.initialize(*cluster) if cluster else None
    from cdsjax.eval.settings import cache_dir_of
    from cdsjax.io.compilation_cache import enable_compilation_cache

    enable_compilation_cache(cache_dir_of(config) / "jax-compilation")  # a rerun loads its executables
    with exit_on_user_error("run_eval"):
        evaluate(config, progress=_PROGRESS.value, process=process, fresh=_FRESH.value)


if __name__ == "__main__":
    from experiments.cli import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
