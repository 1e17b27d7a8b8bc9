r"""MMLongBench-Doc under the paper's protocol: each question searches a pool of five
documents (its own and four distractors), whose notes form one graph (links stay
within each document).

Run from the repository root::

    python experiments/run_eval.py --config configs/mmlongbench_pool.py \
        --config.cache_dir=runs/cache/mmlongbench
    python experiments/run_eval.py --config configs/mmlongbench_pool.py \
        --config.distractors=similar --config.output_dir=runs/eval/mmlongbench_pool_similar

Distractors are ``random`` (drawn with a generator seeded by the question id and
``pool_seed``) or ``similar`` (the documents whose mean note embedding is closest to
the gold document's). Every record lists its pool in ``pool_documents``; the summary
adds the pool metrics (share of selected notes from the gold document, gold-document
hit, distinct documents).
"""

import ml_collections

from configs import common, mmlongbench


def get_config(arg=None) -> ml_collections.ConfigDict:
    common.parse_arg(arg)  # takes no argument
    config = mmlongbench.get_config()
    config.output_dir = "runs/eval/mmlongbench_pool"
    config.pool_size = 5  # the gold document + 4 distractors (1 = the question's own document only)
    config.distractors = "random"  # "random" | "similar"
    config.pool_seed = 0
    config.candidate_pool = "documents"  # "documents" (the pool) | "corpus" (every document, see open_corpus.py)
    config.first_stage_k = 300  # open corpus only: notes passed from the cosine first stage to the selectors
    return config
