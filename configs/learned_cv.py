r"""Learned CDS against tuned baselines, cross-validated by document (experiments/learned_cv.py).

Run from the repository root::

    python experiments/learned_cv.py --config configs/learned_cv.py \
        --config.cache_dirs.qasper=CACHE_Q --config.cache_dirs.mmlongbench=CACHE_M
    python experiments/learned_cv.py --config configs/learned_cv.py --config.benchmarks=qasper \
        --config.transfer=False --config.both=False

Every split is by document (PDF or paper), never by question: ``folds`` seeded folds per benchmark;
pools are drawn inside one side of a split. MMR's lambda and the k-DPP quality exponent are tuned on
the same training documents as learned CDS (mean recall@B over the training questions).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.benchmarks = "qasper,mmlongbench"
    # the evaluation config of each benchmark (configs/<name>.py): notes, links, embedder, buckets
    config.benchmark_configs = ml_collections.ConfigDict({"qasper": "qasper", "mmlongbench": "mmlongbench"})
    # where each benchmark's indexes and embeddings are cached ("" -> <output_dir>/cache/<benchmark>)
    config.cache_dirs = ml_collections.ConfigDict({"qasper": "", "mmlongbench": ""})
    config.data_root = "../shared/data"
    config.output_dir = "runs/learned_cv"

    config.max_documents = ml_collections.config_dict.placeholder(int)  # None: every document (smaller: smoke runs)
    config.folds = 5
    config.seed = 0  # folds, validation split and pools
    config.pool_sizes = (1, 5)  # single document, and 5-document pools drawn inside one side of the split
    config.budgets = (5, 10)
    config.tune_budget_each = True  # baselines tuned by recall@B at each budget B
    # selectors run with their default options, and the two whose knob is tuned on the training documents
    config.fixed_selectors = "cosine,cosine_pages,ppr,cds_converged"
    config.mmr_selector = "mmr"
    config.dpp_selector = "dpp"
    config.mmr_lams = (0.3, 0.5, 0.7, 0.9)
    config.dpp_thetas = (1.0, 3.0, 10.0)
    config.transfer = True  # fit on one benchmark, test on the other
    config.both = True  # fit on the training folds of both benchmarks at once

    # learned CDS: cdsjax.learn.fit on each training side, early-stopped on val_fraction of its documents
    config.learned = True
    # the fitted game's selector: cds_learned (its top-B), or cds_learned_pages (its equilibrium read one note per
    # page), each fitted through its own read-out (SelectorSpec.readout; learn.readout overrides it). A learned
    # selector among fixed_selectors plays its shipped fit and is labelled "(shipped fit)"
    config.learned_selector = "cds_learned"
    config.val_fraction = 0.2
    config.balance = True  # a fit on both benchmarks weighs each the same (as cdsjax tune's shipped fit)
    # pool size of the problems the game is fitted on (None: the task's own); 1 fits every task's game on the
    # training documents one at a time (a 5-document fit costs ~25x a single-document one on 2 cores)
    config.fit_pool_size = ml_collections.config_dict.placeholder(int)
    config.fits_from = ""  # another run's tuning.json whose fits at fit_pool_size are reused (same folds and settings)
    config.fit_budget = 10  # the budget of the fitted surrogate (one fit serves every evaluated budget)
    # passed to cdsjax.learn.fit (cdsjax.learn.fit_config.FitConfig); None keeps its default
    config.learn = ml_collections.ConfigDict({k: ml_collections.config_dict.placeholder(t) for k, t in (
        ("steps", int), ("num_starts_fitted", int), ("patience", int), ("learning_rate", float), ("l2", float),
        ("dtype", str), ("max_batch", int), ("readout", str), ("frozen", str))})  # frozen: comma-separated names

    config.num_resamples = 10_000
    config.max_batch = 32
    return config
