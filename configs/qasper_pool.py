r"""QASPER under the paper's protocol: each question searches the paragraphs and
captions of five papers (its own and four distractors); links stay within a paper.

Run from the repository root::

    python experiments/run_eval.py --config configs/qasper_pool.py --config.cache_dir=runs/cache/qasper
    python experiments/run_eval.py --config configs/qasper_pool.py \
        --config.distractors=similar --config.output_dir=runs/eval/qasper_pool_similar

See ``configs/mmlongbench_pool.py`` for the pool fields. All papers of the file are
embedded (once, cached), since any of them may be a distractor.
"""

import ml_collections

from configs import common, qasper


def get_config(arg=None) -> ml_collections.ConfigDict:
    common.parse_arg(arg)  # takes no argument
    config = qasper.get_config()
    config.output_dir = "runs/eval/qasper_pool"
    config.pool_size = 5
    config.distractors = "random"  # "random" | "similar"
    config.pool_seed = 0
    config.candidate_pool = "documents"  # "documents" | "corpus"
    config.first_stage_k = 300
    config.buckets = (64, 128, 256, 512, 1024, 2048)
    config.max_batch = 32
    return config
