r"""The shipped fits of the learned CDS game (one per read-out): all dev questions of MMLongBench-Doc and QASPER.

    cdsjax tune --config configs/tune/dev.py --config.cache_dirs.mmlongbench=DIR --config.cache_dirs.qasper=DIR \
        --config.output=cdsjax/learn/default_params.json
    cdsjax tune --config configs/tune/dev.py --config.cache_dirs.mmlongbench=DIR --config.cache_dirs.qasper=DIR \
        --config.fit.readout=pages --config.fit.frozen=rel_repulsion \
        --config.output=cdsjax/learn/default_params_pages.json

The first is the fit of ``cds-learned`` (scored by its top-B), the second of ``cds-learned-pages`` (its
equilibrium read one note per printed page: the surrogate's soft top-B over pages, each by its best note), with
the relevance-weighted repulsion held at 0 so the note block does not read the question: a served corpus shares
one block across questions (the first fit ended there by itself).

Validation: a fifth of each benchmark's documents (split by document, seed 0), and recall@10 on both, as in
the cross-validation (experiments/learned_cv.py). The grid of starts is
the fit's default (``cdsjax.learn.fit_config.DEFAULT_STARTS``): beta (the knob the sensitivity study found far from
1) with and without relevance-weighted repulsion, and a negative same-page weight (documents restate a
finding on one page); Adam runs from the two best grid points.
"""

import ml_collections

from configs.tune import small
from cdsjax.learn.fit_config import DEFAULT_STARTS


def get_config() -> ml_collections.ConfigDict:
    config = small.get_config()  # the same layout; here every question of both benchmarks, the full fit
    config.benchmarks = "mmlongbench,qasper"
    config.output = "runs/tune/dev/params.json"
    every = ml_collections.config_dict.placeholder  # None: every question (one placeholder per field)
    config.max_queries = ml_collections.ConfigDict({"qasper": every(int), "mmlongbench": every(int)})
    config.budgets = ml_collections.ConfigDict({"qasper": 10, "mmlongbench": 10})  # as the cross-validation fits
    config.val_fraction = 0.2  # of each benchmark's documents, as in the cross-validation
    config.fit = ml_collections.ConfigDict(dict(
        budget=10, steps=25, learning_rate=0.03, l2=1e-3, temperature=0.2,
        starts=[dict(s) for s in DEFAULT_STARTS],
        num_starts_fitted=2, eval_every=1, patience=5, dtype="float32", tol=1e-6,
        buckets=[32, 64, 128, 256, 512, 1024, 2048], max_batch=16, checkpoint_dir="", seed=0, readout="top",
        frozen=""))
    return config
