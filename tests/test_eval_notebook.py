"""Executes notebooks/evaluation.ipynb on a tiny harness run (3 HotpotQA questions,
cosine and CDS plus a labelled beta variant, budgets 2 and 3) and checks what it
printed and drew against the run's own records; also checks the figure helpers and
that every ablation config builds valid labelled selectors."""

import pathlib

import numpy as np
import pytest

from tests.conftest import require_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "evaluation.ipynb"


def _tiny_config(tmp_path):
    from cdsjax.commands.eval import load_config

    config = load_config(str(ROOT / "configs" / "hotpotqa.py"))
    config.max_queries = 3
    config.selectors = "cosine,cds,cds_beta=2p0"
    config.selector_options = {"cds_beta=2p0": {"selector": "cds", "beta": 2.0}}
    config.budget = 2
    config.budgets = (2, 3)
    config.num_resamples = 200
    config.output_dir = str(tmp_path / "runs" / "tiny")
    config.cache_dir = str(tmp_path / "cache")
    return config


def test_evaluation_notebook_runs_tiny(data_root, tmp_path, monkeypatch):
    nbformat = require_module("nbformat")
    nbclient = require_module("nbclient")
    import sys

    sys.path.insert(0, str(ROOT))
    from cdsjax.eval import figures as F
    from cdsjax.eval import evaluate
    from experiments.make_figures import pca_case

    config = _tiny_config(tmp_path)
    records, _ = evaluate(config, progress=False, log=lambda s: None)
    assert len(records) == 3 * 3 * 2
    case = pca_case(config, selectors=("cosine", "cds"))
    F.save_case(tmp_path / "runs" / "figures" / "pca_case.npz", **case)

    monkeypatch.setenv("CDSJAX_EVAL_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("CDSJAX_EVAL_FIGURES", str(tmp_path / "figs"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()

    for name in ("sweep_beta.png", "budget_hotpotqa.png", f"pca_{case['qid']}.png"):
        assert (tmp_path / "figs" / name).stat().st_size > 0, name
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3
    text = "".join(o.get("text", "") for o in outputs)

    # The printed means are the records' own means (recomputed here from the JSONL).
    for label in ("cosine", "cds_beta=2p0"):
        for b in (2, 3):
            vals = [r["metrics"]["paragraph_recall"] for r in records
                    if r["selector"] == label and r["budget"] == b]
            line = next(ln for ln in text.splitlines()
                        if f" {label} " in ln and f"B={b} " in ln and "paragraph_recall=" in ln)
            shown = float(line.split("paragraph_recall=")[1].split()[0])
            assert shown == pytest.approx(np.mean(vals), abs=5e-4), line

    # The win/tie/loss shares match a count over the records.
    cos = {(r["budget"], r["qid"]): r["metrics"]["paragraph_recall"] for r in records if r["selector"] == "cosine"}
    cds = {(r["budget"], r["qid"]): r["metrics"]["paragraph_recall"] for r in records if r["selector"] == "cds"}
    wins = [cds[k] > cos[k] + 1e-9 for k in cos if k[0] == 2]
    losses = [cds[k] < cos[k] - 1e-9 for k in cos if k[0] == 2]
    line = next(ln for ln in text.splitlines() if ln.startswith("hotpotqa B=2: cds - cosine"))
    assert f"W/T/L {sum(wins)}/{len(wins) - sum(wins) - sum(losses)}/{sum(losses)}" in line, line
    assert any(ln.startswith("hotpotqa B=2: cds_beta=2p0 - cosine") for ln in text.splitlines())  # every selector

    # The PCA case: gold and picks as the selectors chose them.
    saved = F.load_case(tmp_path / "runs" / "figures" / "pca_case.npz")
    assert saved["picks"] == {k: list(v) for k, v in case["picks"].items()}
    assert len(saved["picks"]["cosine"]) == 2 and saved["gold"]
    assert f"gold: {saved['gold']}" in text


def test_parse_label_and_sweep_points():
    from cdsjax.eval import figures as F

    assert F.parse_label("cds_tau=0p3") == ("cds", "tau", 0.3)
    assert F.parse_label("cds_prior=softmax_T0p05") == ("cds", "prior", "softmax_T0.05")
    assert F.parse_label("mmr_lam=0p9") == ("mmr", "lam", 0.9)
    assert F.parse_label("cds_converged") is None and F.parse_label("cosine") is None
    rows = [{"benchmark": "b", "selector": s, "metric": "paragraph_recall", "budget": 4, "mean": m,
             "ci_low": m - 0.1, "ci_high": m + 0.1, "n": 10, "run": "r"}
            for s, m in (("cosine", 0.5), ("cds_beta=2p0", 0.7), ("cds_beta=0p5", 0.6))]
    pts = F.sweep_points(rows, "beta", "paragraph_recall")
    assert list(pts) == [("b", "cds")]
    np.testing.assert_allclose(pts[("b", "cds")], [(2.0, 0.7, 0.6, 0.8), (0.5, 0.6, 0.5, 0.7)], atol=1e-12)
    assert F.baseline(rows, "b", "cosine", "paragraph_recall") == 0.5


def test_pca_2d_matches_numpy_reference():
    from cdsjax.eval import figures as F

    rng = np.random.default_rng(0)
    notes = rng.normal(size=(12, 6)) * np.array([5.0, 2.0, 1.0, 0.5, 0.2, 0.1])
    query = rng.normal(size=6)
    xy, q, explained = F.pca_2d(notes, query)
    # Reference: eigenvectors of the covariance, up to sign.
    c = notes - notes.mean(0)
    w, v = np.linalg.eigh(c.T @ c)
    top = v[:, ::-1][:, :2]
    ref = c @ top
    signs = np.sign(np.sum(xy * ref, axis=0))
    np.testing.assert_allclose(xy * signs, ref, atol=1e-9)
    np.testing.assert_allclose(q * signs, (query - notes.mean(0)) @ top, atol=1e-9)
    np.testing.assert_allclose(explained, w[::-1][:2] / w.sum(), atol=1e-12)
    with pytest.raises(ValueError, match="query"):
        F.pca_2d(notes, query[:3])


@pytest.mark.parametrize("benchmark", ["hotpotqa", "qasper", "mmlongbench"])
def test_ablation_configs_build_valid_labelled_selectors(benchmark):
    import importlib

    from cdsjax.eval import figures as F
    from cdsjax.eval.settings import budgets_of, selector_specs

    module = importlib.import_module(f"configs.ablations.{benchmark}")
    main = module.sweeps.base_config(benchmark)
    expected = {"mmr": ("lam", [0.3, 0.5, 0.7, 0.9]), "tau": ("tau", [0.0, 0.3, 0.5, 0.6]),
                "beta": ("beta", [0.5, 1.0, 2.0, 5.0]), "coupling": ("coupling", ["dissimilarity", "similarity", "none"]),
                "prior": ("prior", ["uniform", "softmax_T0.05", "softmax_T0.1", "softmax_T0.2", "diffusion"]),
                "tau_converged": ("tau", [0.0, 0.3, 0.5, 0.6]), "beta_converged": ("beta", [0.5, 1.0, 2.0, 5.0])}
    for sweep, (param, values) in expected.items():
        config = module.get_config(sweep)
        specs = selector_specs(config)
        assert specs[0] == ("cosine", "cosine", {})
        parsed = [F.parse_label(label) for label, _, _ in specs[1:]]
        assert [p[1] for p in parsed] == [param] * len(values) and [p[2] for p in parsed] == values, sweep
        for (label, name, opts), p in zip(specs[1:], parsed):
            assert name == p[0] == ("cds_converged" if sweep.endswith("converged") else "mmr" if sweep == "mmr" else "cds")
            if param in ("tau", "beta", "lam", "coupling"):
                assert opts == {param: p[2]}, label
        assert budgets_of(config) == [int(main.budget)]
        assert config.output_dir == f"runs/ablations/{benchmark}_{sweep}"
    # "all" holds the five paper-mode sweeps; "budget" runs plain selectors at several budgets.
    assert len(selector_specs(module.get_config())) == 1 + 4 + 5 + 3 + 4 + 4
    budget = module.get_config("budget")
    assert [s[0] for s in selector_specs(budget)] == ["cosine", "mmr", "cds"] and len(budgets_of(budget)) == 5
    with pytest.raises(ValueError, match="sweep must be one of"):
        module.get_config("nope")


def test_plot_equilibrium_draws_weights_gold_threshold_and_picks():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_rgba

    from cdsjax.eval.figures import plot_equilibrium

    w = np.array([0.5, 0.0, 0.3, 0.2])
    fig = plot_equilibrium(w, gold=[2], picks=[0, 2, 3], threshold=1e-6)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights[0] == 0.5 and heights[2] == 0.3 and heights[1] < 1e-6  # a zero weight under the threshold
    assert ax.patches[2].get_facecolor() == to_rgba("goldenrod") and ax.patches[0].get_facecolor() != to_rgba("goldenrod")
    assert [t.get_text() for t in ax.texts] == ["1", "2", "3"]
    assert any(line.get_ydata()[0] == 1e-6 for line in ax.lines)  # the support threshold
    assert "support 3 of 4" in ax.get_title()
