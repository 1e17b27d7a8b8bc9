"""`cdsjax eval`: config loading through config_flags (FILE:ARG, --config.FIELD=VALUE), one-line errors,
float64 only with x64 on, and tiny end-to-end runs."""

import csv
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from cdsjax import cli
from cdsjax.eval import evaluate
from tests.conftest import ROOT

CONFIG = str(ROOT / "configs" / "hotpotqa.py")


@pytest.mark.slow
def test_eval_cli_tiny_run(data_root, tmp_path, capsys):
    out_dir = tmp_path / "ev"
    code = cli.main(["eval", "--config", CONFIG, "--max-queries", "3", "--output-dir", str(out_dir),
                     "--config.selectors=cosine,cds", "--config.budgets=(2,)", f"--config.data_root={data_root}",
                     f"--config.cache_dir={tmp_path / 'cache'}", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open(out_dir / "summary.csv")))
    assert {r["selector"] for r in rows} == {"cosine", "cds", "oracle"}  # oracle: the best selector per question
    assert all(r["n"] == "3" for r in rows if r["metric"].startswith("paragraph_recall"))
    assert {r["selector"] for r in rows if r["metric"].startswith("paragraph_recall_vs_cosine")} == {"cds", "oracle"}
    assert (out_dir / "records.jsonl").read_text().count("\n") == 6


@pytest.mark.slow
def test_eval_cli_picks_an_ablation_sweep(data_root, tmp_path, capsys):
    # FILE:ARG reaches get_config(ARG): the tau sweep's labels, not the default "all" sweep's
    out_dir = tmp_path / "tau"
    code = cli.main(["eval", "--config", str(ROOT / "configs" / "ablations" / "hotpotqa.py") + ":tau",
                     "--max-queries", "2", "--output-dir", str(out_dir), "--config.budgets=(2,)",
                     f"--config.data_root={data_root}", f"--config.cache_dir={tmp_path / 'cache'}",
                     "--config.num_resamples=100", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open(out_dir / "summary.csv")))
    assert {r["selector"] for r in rows} == {"cosine", "cds_tau=0p0", "cds_tau=0p3", "cds_tau=0p5", "cds_tau=0p6",
                                             "oracle"}
    assert {r["metric"].rpartition("@")[2] for r in rows} == {"2"}
    assert (out_dir / "records.jsonl").read_text().count("\n") == 5 * 2


@pytest.mark.parametrize("argv, word", [
    (["eval", "--config", "configs/nope.py"], "no such config file"),
    (["eval", "--config", CONFIG + ":x"], "cannot load config"),  # hotpotqa.py's get_config takes no argument
    (["eval", "--config", str(ROOT / "configs" / "ablations" / "hotpotqa.py") + ":nosuch"], "sweep must be one of"),
    (["eval", "--config", CONFIG, "--config.no_such_field=1"], "--config.no_such_field: no such config field"),
    (["eval", "--config", CONFIG, "--config.budget=x"], "--config.budget=x"),
])
def test_eval_cli_bad_config_is_one_line(capsys, argv, word):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and word in err and len(err.strip().splitlines()) == 1, err


def test_eval_cli_rejects_other_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["eval", "--config", CONFIG, "--set", "selectors=cosine"])
    assert exit_.value.code == 2 and "unrecognized arguments: --set selectors=cosine" in capsys.readouterr().err


def test_float64_without_x64_is_a_one_line_error(tmp_path):
    from tests.test_run_eval import _config

    config = _config("hotpotqa", tmp_path / "out", tmp_path / "cache", dtype="float64")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ValueError, match="jax_enable_x64") as err:
            evaluate(config, progress=False)
    finally:
        jax.config.update("jax_enable_x64", before)
    assert "\n" not in str(err.value) and "float64" in str(err.value)
    assert not (tmp_path / "out").exists()  # stops before it writes anything


def test_cdsjax_eval_turns_x64_on_for_a_float64_config(data_root, tmp_path, capsys):
    # in this process (x64 off, as the suite runs; tests/conftest.py turns it back off afterwards): the command,
    # not evaluate, switches it on, and the run computes in float64
    out_dir = tmp_path / "f64"
    assert not jax.config.jax_enable_x64
    code = cli.main(["eval", "--config", CONFIG, "--max-queries", "2", "--output-dir", str(out_dir), "--no-progress",
                     "--config.dtype=float64", "--config.selectors=cosine,cds", "--config.budgets=(2,)",
                     f"--config.data_root={data_root}", f"--config.cache_dir={tmp_path / 'cache'}",
                     "--config.num_resamples=100"])
    assert code == 0, capsys.readouterr().err
    assert jax.config.jax_enable_x64
    assert json.loads((out_dir / "run.json").read_text())["identity"]["dtype"] == "float64"
    records = [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4
    # computed in float64: the scores and CDS objectives carry more digits than a float32 can hold
    values = [s for r in records for s in r["scores"]] + [r["diagnostics"]["objective"] for r in records
                                                           if r["selector"] == "cds"]
    assert len(values) == 2 * (2 + 2 + 1) and all(float(np.float32(v)) != v for v in values), values


@pytest.mark.parametrize("entry", [pytest.param("cdsjax eval", marks=pytest.mark.slow), "run_eval.py"])
def test_entry_points_turn_x64_on_for_a_float64_config(data_root, tmp_path, entry):
    # a fresh process (x64 off, no conftest): the entry point, not evaluate, switches it on
    out_dir = tmp_path / "f64"
    fields = ["--config.dtype=float64", "--config.selectors=cosine", "--config.budgets=(2,)",
              f"--config.data_root={data_root}", f"--config.cache_dir={tmp_path / 'cache'}",
              "--config.num_resamples=100", f"--config.output_dir={out_dir}", "--config.max_queries=2"]
    if entry == "cdsjax eval":
        argv = ["-m", "cdsjax.cli", "eval", "--config", CONFIG, "--no-progress", *fields]
    else:
        argv = [str(ROOT / "experiments" / "run_eval.py"), "--config", CONFIG, "--noprogress", *fields]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_ENABLE_X64="0")
    env.pop("CDSJAX_JAX_CACHE", None)  # the run's own cache directory, as users get it
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out_dir / "run.json").read_text())["identity"]["dtype"] == "float64"
    assert (out_dir / "records.jsonl").read_text().count("\n") == 2
    # the compiled selectors went to the run's cache directory, for the next run to load
    assert any((tmp_path / "cache" / "jax-compilation").iterdir())
    # CDSJAX_JAX_CACHE=0: nothing is cached
    off = tmp_path / "off"
    argv = [a.replace(str(tmp_path / "cache"), str(off / "cache")).replace(str(out_dir), str(off / "out")) for a in argv]
    env["CDSJAX_JAX_CACHE"] = "0"
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (off / "out" / "records.jsonl").read_text() == (out_dir / "records.jsonl").read_text()
    assert not (off / "cache" / "jax-compilation").exists()
