r"""A small fit of the learned CDS game (the default test run): QASPER, 20 questions, a few steps.

    cdsjax tune --config configs/tune/small.py
"""

import ml_collections

from cdsjax.io.index import default_config


def get_config() -> ml_collections.ConfigDict:
    config = default_config()
    config.benchmarks = "qasper"
    config.data_root = "../shared/data"
    config.output = "runs/tune/small/params.json"
    config.cache_dirs = ml_collections.ConfigDict({"qasper": "", "mmlongbench": ""})  # "" -> next to output
    config.max_queries = ml_collections.ConfigDict({"qasper": 20, "mmlongbench": 20})
    config.budgets = ml_collections.ConfigDict({"qasper": 5, "mmlongbench": 10})
    config.link_window = 1
    config.val_fraction = 0.25  # of each benchmark's documents
    config.seed = 0
    config.balance = True  # each benchmark weighs the same in the fit (not its question count)
    config.cv_summary = ""  # a JSON file of cross-validated figures to copy into the provenance
    config.fit = ml_collections.ConfigDict(dict(
        budget=5, steps=3, learning_rate=0.05, l2=1e-3, temperature=0.2, starts=[{"beta": 0.3}, {"beta": 1.0}],
        num_starts_fitted=1, patience=3, dtype="float32", tol=1e-6, buckets=[32, 64, 128, 256, 512], max_batch=32,
        checkpoint_dir="", seed=0,
        readout="top"))  # "pages": fit the game for cds-learned-pages (its equilibrium read one note per page)
    config.embedder.show_progress = False
    return config
