r"""Ablation sweeps on qasper: one labelled selector per swept setting (see sweeps.py).

Run from the repository root, one sweep per run (mmr, prior, coupling, tau, beta,
tau_converged, beta_converged, budget, or all = mmr+prior+coupling+tau+beta)::

    python experiments/run_eval.py --config configs/ablations/qasper.py:tau
    python experiments/run_eval.py --config configs/ablations/qasper.py:budget

or, with the CLI (same FILE:ARG form; without ARG the sweep is "all")::

    cdsjax eval --config configs/ablations/qasper.py:tau

Records go to runs/ablations/qasper_<sweep>/. QASPER ablations use all 753 questions (the runs resume per question, so a capped run extends).
"""

from configs import common
from configs.ablations import sweeps


def get_config(arg=None):
    """``arg``: the sweep (default ``all``)."""
    sweep = common.parse_arg(arg, sweep="all").sweep
    return sweeps.ablation_config("qasper", sweep, budgets=None, max_queries=None)
