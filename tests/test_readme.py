"""README.md runs: every ```bash and ```python block, as written.

The blocks run in order in a scratch directory holding ``docs/`` (a small real PDF from the shared data),
with ``cdsjax`` and ``python`` on PATH meaning this checkout, so the README's first command builds the one
tiny index every later block uses. ``make`` lines are checked against the Makefile instead of run (they
create a virtual environment and run this very suite); ``cdsjax demo`` and the evaluation block take a
minute or more each and run with the slow tests.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display
from tests.conftest import ROOT
from tests.scripted_server import OpenAIServer

README = ROOT / "README.md"
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)
SLOW_MARKERS = ("cdsjax demo", "cdsjax eval", "run_eval.py")


def blocks():
    """(language, code, kind) for every runnable block, in README order; kind: make | slow | fast."""
    out = []
    for lang, code in BLOCK.findall(README.read_text()):
        lines = [line for line in code.splitlines() if line.strip()]
        if lang == "bash" and lines and all(line.startswith("make ") for line in lines):
            kind = "make"
        elif lang == "bash" and any(m in code for m in SLOW_MARKERS):
            kind = "slow"
        else:
            kind = "fast"
        out.append((lang, code, kind))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, data_root):
    pdf = data_root / "pdfs" / "multicolumn.pdf"
    work = tmp_path_factory.mktemp("readme")
    (work / "docs").mkdir()
    (work / "docs" / pdf.name).symlink_to(pdf)
    for name in ("configs", "experiments"):
        (work / name).symlink_to(ROOT / name)
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    # shims, not symlinks: a symlinked venv interpreter would not find its pyvenv.cfg
    for name, command in (("python", f'"{sys.executable}"'), ("cdsjax", f'"{sys.executable}" -m cdsjax.cli')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT),
               CDSJAX_CACHE=str(work / ".cache"))
    for var in ("CDSJAX_READER_URL", "CDSJAX_READER_MODEL", "CDSJAX_DATA"):
        env.pop(var, None)
    return work, env


def run_block(lang, code, work, env, timeout=300):
    argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"README {lang} block failed:\n{code}\n--- stderr:\n{proc.stderr[-3000:]}"
    return proc


def test_readme_has_the_blocks_this_test_knows():
    kinds = [(lang, kind) for lang, _, kind in blocks()]
    assert kinds.count(("bash", "make")) == 1 and kinds.count(("python", "fast")) == 4
    assert kinds.count(("bash", "slow")) == 4 and kinds.count(("bash", "fast")) == 2  # + cdsjax tune


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for lang, code, kind in blocks():
        if kind == "make":
            for line in code.splitlines():
                if line.strip():
                    target = line.split()[1]
                    assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target


@pytest.mark.slow
def test_readme_commands_and_snippets_run(workdir):
    work, env = workdir
    with OpenAIServer(lambda req: "It is a sample document laid out in columns [1].", models=("m",)) as srv:
        for lang, code, kind in blocks():
            if kind != "fast":
                continue
            block_env = dict(env)
            if lang == "python" and "Pipeline" in code:  # the retrieve-then-read snippet reads from a server
                block_env.update(CDSJAX_READER_URL=srv.base_url, CDSJAX_READER_MODEL="m")
            proc = run_block(lang, code, work, block_env)
            if lang == "python" and "Pipeline" in code:
                assert "It is a sample document" in proc.stdout and "converged" in proc.stdout
            if "cdsjax.integrations" in code:  # the notes of runs/my-index, by id
                assert "multicolumn.pdf#" in proc.stdout, proc.stdout
        assert len(srv.requests) == 1  # the first pipe.ask read; the second had read=False
    assert (work / "runs" / "my-index" / "manifest.json").is_file()
    for name in ("answer.json", "served.json"):
        result = json.loads((work / name).read_text())
        assert result["evidence"] and result["evidence"][0]["document"] == "multicolumn.pdf"
        assert result["selector"] == display(DEFAULT_SELECTOR) and result["diagnostics"]["mode"] == "converged"


@pytest.mark.slow
def test_readme_demo_and_evaluation_blocks_run(workdir):
    work, env = workdir
    for lang, code, kind in blocks():
        if kind == "slow":
            run_block(lang, code, work, env, timeout=1800)
    assert (work / "runs" / "eval-demo" / "summary.csv").is_file()
    assert (work / "runs" / "eval-demo-2" / "summary.csv").is_file()
    assert (work / "runs" / "eval-demo-3" / "summary.csv").is_file()  # the two-process evaluation
