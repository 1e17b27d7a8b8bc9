r"""Ablation sweeps on hotpotqa: one labelled selector per swept setting (see sweeps.py).

Run from the repository root, one sweep per run (mmr, prior, coupling, tau, beta,
tau_converged, beta_converged, budget, or all = mmr+prior+coupling+tau+beta)::

    python experiments/run_eval.py --config configs/ablations/hotpotqa.py:tau
    python experiments/run_eval.py --config configs/ablations/hotpotqa.py:budget

or, with the CLI (same FILE:ARG form; without ARG the sweep is "all")::

    cdsjax eval --config configs/ablations/hotpotqa.py:tau

Records go to runs/ablations/hotpotqa_<sweep>/. HotpotQA questions have 10 paragraphs each, so the budget sweep uses B in {2, ..., 6} instead of {3, 5, 10, 15, 20}; all 100 questions.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "cdsjax_ablation_sweeps", pathlib.Path(__file__).with_name("sweeps.py"))
sweeps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweeps)


def get_config(sweep: str = "all"):
    return sweeps.ablation_config("hotpotqa", sweep or "all", budgets=(2, 3, 4, 5, 6), max_queries=None)
