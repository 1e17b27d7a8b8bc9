r"""One point of the pool sweep: pool size in {1, 5, 10, 20} x distractors in
{random, similar}, on MMLongBench-Doc or QASPER.

The argument after ``:`` is ``<benchmark>,<pool size>,<distractors>``::

    python experiments/run_eval.py --config configs/pool_sweep.py:mmlongbench,10,similar \
        --config.cache_dir=runs/cache/mmlongbench

``experiments/pool_sweep.py`` runs every point (``POOL_SIZES`` x ``DISTRACTORS``) into
``runs/pool_sweep/<benchmark>_<size>_<distractors>`` and draws recall against pool
size. Pool size 1 goes through the same pool path (its pool is the question's own
document), so its records carry ``pool_documents`` and the pool metrics too.
"""

import ml_collections

from configs import common, mmlongbench_pool, qasper_pool


POOL_SIZES = (1, 5, 10, 20)
DISTRACTORS = ("random", "similar")
BASES = {"mmlongbench": mmlongbench_pool, "qasper": qasper_pool}


def get_config(arg=None) -> ml_collections.ConfigDict:
    """``arg``: ``<benchmark>,<pool size>,<distractors>`` (or by name); default ``mmlongbench,5,random``."""
    fields = common.parse_arg(arg, benchmark="mmlongbench", size=5, distractors="random")
    benchmark, size, distractors = fields.benchmark, fields.size, fields.distractors
    if benchmark not in BASES:
        raise ValueError(f"configs/pool_sweep.py: benchmark must be one of {sorted(BASES)}, got {benchmark!r}")
    config = BASES[benchmark].get_config()
    config.pool_size = size
    config.distractors = distractors
    config.output_dir = f"runs/pool_sweep/{benchmark}_{size}_{distractors}"
    return config
