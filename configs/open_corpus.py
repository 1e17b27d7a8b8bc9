r"""Open-corpus retrieval: every document of the benchmark is the candidate pool. A
first stage keeps each question's top-K notes by exact cosine over the whole
collection (one ``jnp`` matmul and ``lax.top_k``); every selector then works on those K.

The argument after ``:`` is ``<benchmark>,<K>``::

    python experiments/run_eval.py --config configs/open_corpus.py:mmlongbench,300 \
        --config.cache_dir=runs/cache/mmlongbench

The log line ``open corpus: ...`` and ``timings.jsonl`` give the first stage's time;
``pool_documents`` lists the documents the K candidates come from.
"""

import ml_collections

from configs import common, mmlongbench_pool, qasper_pool


BASES = {"mmlongbench": mmlongbench_pool, "qasper": qasper_pool}


def get_config(arg=None) -> ml_collections.ConfigDict:
    """``arg``: ``<benchmark>,<K>`` (or ``benchmark=...,k=...``); default ``mmlongbench,300``."""
    fields = common.parse_arg(arg, benchmark="mmlongbench", k=300)
    benchmark, k = fields.benchmark, fields.k
    if benchmark not in BASES:
        raise ValueError(f"configs/open_corpus.py: benchmark must be one of {sorted(BASES)}, got {benchmark!r}")
    config = BASES[benchmark].get_config()
    config.candidate_pool = "corpus"
    config.pool_size = 1  # not used by the open corpus
    config.first_stage_k = k
    config.output_dir = f"runs/eval/{benchmark}_corpus_k{k}"
    return config
