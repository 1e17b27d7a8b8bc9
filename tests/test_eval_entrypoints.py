"""`cdsjax eval` and experiments/run_eval.py find the data the same way, say where, and fail in one line."""

import os
import subprocess
import sys

import pytest

from tests.conftest import DATA, ROOT

CONFIG = str(ROOT / "configs" / "hotpotqa.py")


def run(argv, cwd, **env):
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    environ.pop("CDSJAX_DATA", None)
    environ.update(env)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=environ, timeout=300)


def cdsjax_eval(*args):
    return ["-m", "cdsjax.cli", "eval", "--config", CONFIG, "--no-progress", *args]


def run_eval(*args):
    return [str(ROOT / "experiments" / "run_eval.py"), "--config", CONFIG, "--noprogress", *args]


@pytest.mark.needs_data
def test_both_entry_points_find_the_data_the_same_way(tmp_path):
    # from a directory where ../shared/data does not exist, both fall back to the repository root;
    # an unknown selector stops them right after the data line
    a = run(cdsjax_eval("--config.selectors=bogus"), cwd=tmp_path)
    b = run(run_eval("--config.selectors=bogus"), cwd=tmp_path)
    expect = f"benchmark data from {os.path.normpath(ROOT / '..' / 'shared' / 'data')} (data_root '../shared/data')"
    for proc in (a, b):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(lines) == 2 and lines[0].endswith(expect) and "bogus" in lines[1]
    # $CDSJAX_DATA is the last place looked
    c = run(cdsjax_eval("--config.data_root=not/here", "--config.selectors=bogus"), cwd=tmp_path,
            CDSJAX_DATA=str(DATA))
    assert f"benchmark data from {os.path.normpath(DATA)}" in c.stderr.splitlines()[0]


def test_missing_data_is_one_line_naming_where_it_looked(tmp_path):
    a = run(cdsjax_eval("--config.data_root=../no-such-data"), cwd=tmp_path)
    b = run(run_eval("--config.data_root=../no-such-data"), cwd=tmp_path)
    for proc in (a, b):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr
        assert "benchmark data not found" in lines[0] and str(tmp_path.parent / "no-such-data") in lines[0]
        assert str(ROOT.parent / "no-such-data") in lines[0] and "CDSJAX_DATA" in lines[0]
        assert lines[0].count(str(tmp_path.parent / "no-such-data")) == 1  # each place named once


@pytest.mark.parametrize("text, word", [(None, "No such file"), ("def get_config(:\n", "SyntaxError"),
                                        ("def get_config():\n    return undefined_name\n", "NameError")])
def test_run_eval_bad_config_is_one_line(tmp_path, text, word):
    path = tmp_path / "cfg.py"
    if text is not None:
        path.write_text(text)
    proc = run([str(ROOT / "experiments" / "run_eval.py"), "--config", str(path)], cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert word in lines[0]


API_KEY_LINE = ("--config.reader.api_key: no such config field; API keys come from the environment only "
                "(CDSJAX_READER_API_KEY, CDSJAX_JUDGE_API_KEY)")


@pytest.mark.parametrize("override, says", [
    ("--config.reader.api_key=sk-x", API_KEY_LINE),
    ("--config.reader.modl=x", '--config.reader.modl: no such config field (did you mean "model"?)'),
])
def test_an_unknown_field_is_one_line_naming_it(capsys, override, says):
    from cdsjax import cli

    assert cli.main(["eval", "--config", str(ROOT / "configs" / "qasper.py"), override]) == 2
    assert capsys.readouterr().err.strip() == f"cdsjax eval: error: {says}"


@pytest.mark.slow
def test_run_eval_refuses_an_api_key_in_the_config(tmp_path):
    proc = run([str(ROOT / "experiments" / "run_eval.py"), "--config", str(ROOT / "configs" / "qasper.py"),
                "--config.reader.api_key=sk-x"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == f"run_eval.py: error: {API_KEY_LINE}", proc.stderr
