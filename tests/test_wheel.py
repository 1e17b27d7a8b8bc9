"""The package installs like one: a wheel built from this tree, installed (not editable) into a fresh virtual
environment, runs ``cdsjax index`` and ``cdsjax ask`` on a small PDF from a directory outside the repository.

Nothing is downloaded: the wheel is built without build isolation (setuptools from this environment), and the
fresh environment sees the dependencies already installed here through a ``.pth`` file that lists this
environment's site-packages. A path line in a ``.pth`` file only extends ``sys.path``; the ``.pth`` files inside
that directory (among them the ``__editable__`` finder of an editable cdsjax) are not processed, so the only
cdsjax the fresh environment can import is the one from the wheel, which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests import ingest_pdfs as gen
from tests.scripted_server import OpenAIServer, message_text
from tests.conftest import require_module

ROOT = Path(__file__).resolve().parents[1]
# Source-tree entries a wheel build never needs (large, or written by runs and builds).
SKIP = (".git", ".venv", "build", "dist", "results", "runs", "notebooks", "experiments", "tests",
        "__pycache__", "*.egg-info", ".pytest_cache", ".ipynb_checkpoints", "shared")
ANSWER = "Constrained dominant sets trade relevance against redundancy [1]."


def _run(cmd, *, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _clean_env(**extra) -> dict:
    """This process's environment without what would make the repository or this venv importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv's python, its ``cdsjax`` script, a working directory outside the repository, the
    environment to run them in)."""
    require_module("setuptools")  # building the wheel without isolation needs it
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP), symlinks=True)
    wheels = tmp / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", wheels, src], cwd=tmp, env=_clean_env())
    (wheel,) = wheels.glob("cdsjax-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.startswith(("tests/", "configs/", "experiments/"))], names
    # Everything the package holds (modules and any data files it reads) is in the wheel.
    package = {p.relative_to(src).as_posix() for p in (src / "cdsjax").rglob("*") if p.is_file()}
    assert "cdsjax/config.py" in package and package <= set(names), sorted(package - set(names))

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp, env=_clean_env())
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
         cwd=tmp, env=_clean_env())
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        cwd=tmp, env=_clean_env()).stdout.strip())
    here = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    (purelib / "zz_shared_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(here)))

    work = tmp / "work"
    work.mkdir()
    env = _clean_env(CDSJAX_CACHE=str(tmp / "cache"))
    where = _run([python, "-c", "import cdsjax; print(cdsjax.__file__)"], cwd=work, env=env).stdout.strip()
    assert Path(where).resolve().is_relative_to(purelib.resolve()), where
    script = venv / "bin" / "cdsjax"
    assert script.exists(), "the wheel installs the cdsjax console script"
    return python, script, work, env


@pytest.mark.slow
def test_installed_package_has_its_default_config(installed):
    python, _, work, env = installed
    out = _run([python, "-c", "from cdsjax.io.index import default_config; c = default_config(); "
                "print(c.ingest.parser, c.embedder.model)"], cwd=work, env=env).stdout.split()
    assert out == ["pymupdf", "all-MiniLM-L6-v2"]


@pytest.mark.slow
def test_installed_cli_indexes_and_answers(installed):
    _, cdsjax, work, env = installed
    gen.make_synthetic_pdf(work / "study.pdf")
    proc = _run([cdsjax, "index", "study.pdf", "--out", "idx", "--no-progress"], cwd=work, env=env)
    assert "documents 1 (1 added); 1 processed" in proc.stdout, proc.stdout
    assert (work / "idx" / "manifest.json").is_file()

    question = "What do constrained dominant sets trade off?"
    with OpenAIServer(lambda req: ANSWER, models=("wheel-test",)) as srv:
        proc = _run([cdsjax, "ask", "idx", question, "--json", "--budget", "4",
                     "--reader-url", srv.base_url, "--reader-model", "wheel-test"], cwd=work, env=env)
        requests = list(srv.requests)
    result = json.loads(proc.stdout)
    # the answer cites the prompt's first note (reading order), shown by its rank in the evidence
    k = result["reader"]["cited"][0]
    assert result["answer"] == ANSWER.replace("[1]", f"[{k}]") and result["error"] is None
    first = min(result["evidence"], key=lambda e: (e["page"], int(e["note_id"].rsplit("#", 1)[-1])))
    assert result["evidence"][k - 1]["note_id"] == first["note_id"]
    assert result["selector"] == "cds-learned-pages" and result["diagnostics"]["converged"] is True  # the default
    assert len(result["evidence"]) == 4
    assert {e["document"] for e in result["evidence"]} == {"study.pdf"}
    assert any("Constrained dominant sets" in e["text"] for e in result["evidence"])
    assert len(requests) == 1 and question in message_text(requests[0])
