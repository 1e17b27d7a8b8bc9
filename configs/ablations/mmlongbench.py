r"""Ablation sweeps on mmlongbench: one labelled selector per swept setting (see sweeps.py).

Run from the repository root, one sweep per run (mmr, prior, coupling, tau, beta,
tau_converged, beta_converged, budget, or all = mmr+prior+coupling+tau+beta)::

    python experiments/run_eval.py --config configs/ablations/mmlongbench.py:tau
    python experiments/run_eval.py --config configs/ablations/mmlongbench.py:budget

or, with the CLI (same FILE:ARG form; without ARG the sweep is "all")::

    cdsjax eval --config configs/ablations/mmlongbench.py:tau

Records go to runs/ablations/mmlongbench_<sweep>/. MMLongBench-Doc ablations keep the first 81 questions (12 PDFs), the subset whose PDF indexes are built.
"""

from configs import common
from configs.ablations import sweeps


def get_config(arg=None):
    """``arg``: the sweep (default ``all``)."""
    sweep = common.parse_arg(arg, sweep="all").sweep
    return sweeps.ablation_config("mmlongbench", sweep, budgets=None, max_queries=81)
