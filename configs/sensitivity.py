r"""Differentiable sensitivity study of CDS retrieval on beta (diversification) and tau
(query sparsification), and gradient tuning of (beta, tau) with optax.

Run from the repository root::

    python experiments/sensitivity.py --config configs/sensitivity.py
    python experiments/sensitivity.py --config configs/sensitivity.py \
        --config.benchmarks=hotpotqa --config.max_queries.hotpotqa=20 --config.tune.steps=5

Derivatives are implicit (KKT on the support, ``cdsjax.core.cds_equilibrium``) at
converged InImDyn equilibria in float64; tau is differentiated in soft mode
(hard tau is piecewise constant). Outputs go to ``output_dir/<benchmark>/``:
``curves.csv``, ``tuning.csv``, ``summary.json`` and PNG plots.
"""

import ml_collections

from cdsjax.io.index import default_config
from configs import common


def get_config(arg=None) -> ml_collections.ConfigDict:
    common.parse_arg(arg)  # takes no argument
    config = default_config()
    config.data_root = "../shared/data"
    config.output_dir = "results/sensitivity"
    config.cache_dir = ""  # embeddings; "" -> <output_dir>/cache
    config.benchmarks = "hotpotqa,qasper,mmlongbench"
    # Questions kept per benchmark (file order; questions without gold are dropped first).
    config.max_queries = ml_collections.ConfigDict({"hotpotqa": 100, "qasper": 100, "mmlongbench": 100})
    config.budget = ml_collections.ConfigDict({"hotpotqa": 2, "qasper": 5, "mmlongbench": 10})
    # MMLongBench notes: each page's text layer split into chunks (no layout analysis).
    config.mmlongbench = ml_collections.ConfigDict()
    config.mmlongbench.chunk_size = 1000
    config.mmlongbench.chunk_overlap = 100
    config.mmlongbench.max_pages = 40  # documents with more pages are skipped (cost)
    config.embedder.show_progress = False
    config.progress = True  # tqdm bars over the grid points and the Adam steps (on stderr)

    # The problem.
    config.solver = "inimdyn"  # converged mode: implicit derivatives need equilibria
    config.tol = 1e-10
    config.max_iter = 200_000
    config.tau_temperature = 0.05  # T_tau of the soft tau gate
    config.buckets = (16, 64, 128, 256, 512)
    config.max_batch = 32

    # The surrogate: soft recall@B on the extended equilibrium scores.
    config.surrogate = ml_collections.ConfigDict()
    config.surrogate.temperature = 0.2  # relative to the spread of the top-2B scores
    config.surrogate.slack_weight = 1.0

    # Curves (soft tau): beta at tau = tau_for_beta, tau at beta = beta_for_tau.
    config.curves = ml_collections.ConfigDict()
    config.curves.betas = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
    config.curves.taus = (-0.1, 0.0, 0.1, 0.2, 0.3, 0.4)
    config.curves.tau_for_beta = 0.0
    config.curves.beta_for_tau = 1.0
    config.curves.fd_step = 1e-4  # central differences of the mean surrogate at the defaults

    # Tuning on one half of the questions, evaluation on the other half.
    config.tune = ml_collections.ConfigDict()
    config.tune.steps = 30
    config.tune.learning_rate = 0.05
    config.tune.seed = 0
    config.tune.init_beta = 1.0
    config.tune.init_tau = 0.0
    config.num_resamples = 10_000
    return config
