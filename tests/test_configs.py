"""configs/ as a package: one argument helper (configs/common.py), siblings imported through the package."""

import subprocess
import sys
from pathlib import Path

import pytest

from configs import common

ROOT = Path(__file__).resolve().parents[1]


def test_parse_arg_positional_named_and_typed():
    spec = dict(benchmark="mmlongbench", size=5, distractors="random")
    assert common.parse_arg(None, **spec).to_dict() == spec
    assert common.parse_arg("", **spec).to_dict() == spec
    assert common.parse_arg("qasper,10,similar", **spec).to_dict() == dict(benchmark="qasper", size=10,
                                                                            distractors="similar")
    assert common.parse_arg("qasper, size=20", **spec).to_dict() == dict(benchmark="qasper", size=20,
                                                                          distractors="random")
    assert common.parse_arg("on=no", on=True).on is False


@pytest.mark.parametrize("arg, message", [("a,5,b,c", "at most 3 values"), ("size=x", "expected int"),
                                          ("pages=3", "unknown field 'pages'"), ("size=3,qasper", "positional"),
                                          ("size=3,size=4", "given twice")])
def test_parse_arg_bad_arguments_say_what_is_wrong(arg, message):
    with pytest.raises(ValueError, match=message):
        common.parse_arg(arg, benchmark="mmlongbench", size=5, distractors="random")


def test_a_config_without_argument_refuses_one():
    from configs import qasper

    with pytest.raises(ValueError, match="at most 0 values"):
        qasper.get_config("anything")


def test_a_config_package_outside_the_repository_imports_its_siblings(tmp_path):
    """`cdsjax eval --config FILE` makes FILE's package importable, wherever it lives (the working directory
    and PYTHONPATH need not hold it)."""
    pkg = tmp_path / "myconfigs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("import ml_collections\n\ndef get_config(arg=None):\n"
                                 "    return ml_collections.ConfigDict(dict(size=1, name='base'))\n")
    (pkg / "child.py").write_text("from myconfigs import base\n\ndef get_config(arg=None):\n"
                                  "    config = base.get_config()\n"
                                  "    config.size = int(arg or 2)\n    return config\n")
    code = ("from cdsjax.commands.eval import load_config; "
            f"c = load_config({str(pkg / 'child.py') + ':7'!r}); print(c.name, c.size)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=elsewhere, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["base", "7"], out.stderr


def test_visdom_config_names_its_subset():
    from configs import visdom

    config = visdom.get_config("subset=slidevqa")
    assert (config.benchmark, config.loader.subset, config.output_dir) == ("visdom", "slidevqa",
                                                                         "runs/eval/visdom_slidevqa")
    assert visdom.get_config().loader.subset == "feta_tab" and "url" in config.reader and "url" in config.judge
    with pytest.raises(ValueError, match="unknown field 'pages'"):
        visdom.get_config("pages=3")
