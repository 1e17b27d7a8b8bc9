r"""Ablation sweeps on hotpotqa: one labelled selector per swept setting (see sweeps.py).

Run from the repository root, one sweep per run (mmr, prior, coupling, tau, beta,
tau_converged, beta_converged, budget, or all = mmr+prior+coupling+tau+beta)::

    python experiments/run_eval.py --config configs/ablations/hotpotqa.py:tau
    python experiments/run_eval.py --config configs/ablations/hotpotqa.py:budget

or, with the CLI (same FILE:ARG form; without ARG the sweep is "all")::

    cdsjax eval --config configs/ablations/hotpotqa.py:tau

Records go to runs/ablations/hotpotqa_<sweep>/. HotpotQA questions have 10 paragraphs each, so the budget sweep uses B in {2, ..., 6} instead of {3, 5, 10, 15, 20}; all 100 questions.
"""

from configs import common
from configs.ablations import sweeps


def get_config(arg=None):
    """``arg``: the sweep (default ``all``)."""
    sweep = common.parse_arg(arg, sweep="all").sweep
    return sweeps.ablation_config("hotpotqa", sweep, budgets=(2, 3, 4, 5, 6), max_queries=None)
