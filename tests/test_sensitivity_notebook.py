"""Executes notebooks/sensitivity.ipynb on a tiny run (6 HotpotQA questions, 2 grid points per axis,
2 Adam steps) and checks what it wrote."""

import json
import pathlib

import pytest

from tests.conftest import require_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "sensitivity.ipynb"


@pytest.mark.slow  # executes the whole notebook (23 s); test_eval_notebook runs the evaluation notebook by default
def test_sensitivity_notebook_runs_tiny(data_root, tmp_path, monkeypatch):
    nbformat = require_module("nbformat")
    nbclient = require_module("nbclient")
    monkeypatch.setenv("CDSJAX_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("CDSJAX_NOTEBOOK_OUT", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()

    out = tmp_path / "hotpotqa"
    for name in ("curves.png", "tuning.png", "curves.csv", "tuning.csv", "held_out.csv"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["questions"] == 6 and summary["train"] == 3 and summary["test"] == 3
    prov = summary["provenance"]  # where the numbers came from
    assert prov["code"] and prov["versions"]["jax"] and prov["device"] and prov["config"]["solver"]
    assert len(summary["curves"]) == 4
    assert 1 <= len(summary["tuning"]) <= 2 and all(len(t) == 3 for t in summary["tuning"].values())
    assert summary["derivative_check"]["max_abs_diff"] < 1e-5
    texts = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    jac_line = next(t for t in texts if "max |jacfwd - jacrev|" in t)
    diffs = [float(line.split(":")[1]) for line in jac_line.strip().splitlines()]
    assert max(diffs) < 1e-6, jac_line
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # the path along beta, plot_equilibrium, the curves, the tuning
