r"""Open-corpus retrieval: every document of the benchmark is the candidate pool. A
first stage keeps each question's top-K notes by exact cosine over the whole
collection (one ``jnp`` matmul and ``lax.top_k``); every selector then works on those K.

The argument after ``:`` is ``<benchmark>,<K>``::

    python experiments/run_eval.py --config configs/open_corpus.py:mmlongbench,300 \
        --config.cache_dir=runs/cache/mmlongbench

The log line ``open corpus: ...`` and ``timings.jsonl`` give the first stage's time;
``pool_documents`` lists the documents the K candidates come from.
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


BASES = {"mmlongbench": "mmlongbench_pool", "qasper": "qasper_pool"}


def get_config(arg: str = "mmlongbench,300") -> ml_collections.ConfigDict:
    try:
        benchmark, k = (s.strip() for s in arg.split(","))
        k = int(k)
    except ValueError:
        raise ValueError(f"configs/open_corpus.py: expected '<benchmark>,<K>', got {arg!r}") from None
    if benchmark not in BASES:
        raise ValueError(f"configs/open_corpus.py: benchmark must be one of {sorted(BASES)}, got {benchmark!r}")
    config = _sibling(BASES[benchmark]).get_config()
    config.candidate_pool = "corpus"
    config.pool_size = 1  # not used by the open corpus
    config.first_stage_k = k
    config.output_dir = f"runs/eval/{benchmark}_corpus_k{k}"
    return config
