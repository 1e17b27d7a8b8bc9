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

import importlib.util
import pathlib

import ml_collections


def _sibling(name: str):
    """Loads ``configs/<name>.py`` by path (configs/ is not a package)."""
    path = pathlib.Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"cdsjax_config_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


POOL_SIZES = (1, 5, 10, 20)
DISTRACTORS = ("random", "similar")
BASES = {"mmlongbench": "mmlongbench_pool", "qasper": "qasper_pool"}


def get_config(arg: str = "mmlongbench,5,random") -> ml_collections.ConfigDict:
    try:
        benchmark, size, distractors = (s.strip() for s in arg.split(","))
        size = int(size)
    except ValueError:
        raise ValueError(f"configs/pool_sweep.py: expected '<benchmark>,<pool size>,<distractors>', "
                         f"got {arg!r}") from None
    if benchmark not in BASES:
        raise ValueError(f"configs/pool_sweep.py: benchmark must be one of {sorted(BASES)}, got {benchmark!r}")
    config = _sibling(BASES[benchmark]).get_config()
    config.pool_size = size
    config.distractors = distractors
    config.output_dir = f"runs/pool_sweep/{benchmark}_{size}_{distractors}"
    return config
