r"""Retrieval evaluation on MMLongBench-Doc: gold-page recall, and gold-box recall with
MMDocIR's boxes, for every selector.

Run from the repository root::

    python experiments/run_eval.py --config configs/mmlongbench.py
    python experiments/run_eval.py --config configs/mmlongbench.py \
        --config.max_queries=40 --config.selectors=cosine,cds,cds_converged \
        --config.budgets="(5, 10)"

Each PDF is parsed, enriched and embedded once (cached under ``cache_dir``) with
the ingestion settings of ``configs/default.py``, which this config extends.
"""

import ml_collections

from cdsjax.eval import reader_setup
from cdsjax.io.index import default_config
from configs import common


def get_config(arg=None) -> ml_collections.ConfigDict:
    common.parse_arg(arg)  # takes no argument
    config = default_config()
    config.benchmark = "mmlongbench"
    config.data_root = "../shared/data"  # same layout as ../shared/data
    config.output_dir = "runs/eval/mmlongbench"
    config.cache_dir = ""  # indexes and question embeddings; "" -> <output_dir>/cache
    config.max_queries = ml_collections.config_dict.placeholder(int)  # None: all questions

    # Labels of selectors to run; selector_options[label] holds their options and may
    # name the registry entry with "selector" (so one selector can run with several settings).
    config.selectors = "cosine,random,mmr,dpp,ppr,cds,cds_converged,cds_learned"
    config.compare = "cosine"  # the reference of the summaries' paired differences (a label of selectors)
    config.selector_options = ml_collections.ConfigDict({"mmr": {"lam": 0.5}})
    # the parameter file of the cds_learned selector (cdsjax tune); "" -> the fit shipped with the package
    config.params = ""
    config.budget = 10
    config.budgets = (10,)  # every budget is a separate run; metrics are reported as metric@B

    # page_source: "mmlongbench" (the benchmark's evidence pages) | "mmdocir" (MMDocIR's).
    config.loader = ml_collections.ConfigDict({"page_source": "mmlongbench", "with_boxes": True})

    config.buckets = (64, 128, 256, 512, 1024, 2048, 4096)  # padded note counts
    config.max_batch = 32  # problems per compiled call
    config.num_resamples = 10_000  # bootstrap resamples for the 95% intervals
    config.dtype = "float32"  # "float64" lets converged-mode solvers go below float32's KKT floor
    config.embedder.show_progress = False
    # the reader stage (cdsjax.eval.reading): url "" = retrieval metrics only; "none" / "full" in selectors
    # are its controls (question alone / whole document)
    config.reader = reader_setup.reader_settings()
    config.judge = reader_setup.judge_settings()
    return config
