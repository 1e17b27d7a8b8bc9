r"""Retrieval evaluation on QASPER: gold-paragraph recall (evidence paragraphs and
figure/table captions as notes), for every selector.

Run from the repository root::

    python experiments/run_eval.py --config configs/qasper.py
    python experiments/run_eval.py --config configs/qasper.py --config.max_queries=100

Notes are the paper's paragraphs and captions, embedded with ``config.embedder``
(cached under ``cache_dir``); links join reading-order neighbours (``link_window``)
and a caption with the paragraphs that cite its figure or table.
"""

import ml_collections

from cdsjax.eval import reader_setup
from cdsjax.io.index import default_config
from configs import common


def get_config(arg=None) -> ml_collections.ConfigDict:
    common.parse_arg(arg)  # takes no argument
    config = default_config()
    config.benchmark = "qasper"
    config.data_root = "../shared/data"
    config.output_dir = "runs/eval/qasper"
    config.cache_dir = ""  # note and question embeddings; "" -> <output_dir>/cache
    config.max_queries = ml_collections.config_dict.placeholder(int)

    config.selectors = "cosine,random,mmr,dpp,ppr,cds,cds_converged,cds_learned"
    config.compare = "cosine"  # the reference of the summaries' paired differences (a label of selectors)
    config.selector_options = ml_collections.ConfigDict({"mmr": {"lam": 0.5}})
    # the parameter file of the cds_learned selector (cdsjax tune); "" -> the fit shipped with the package
    config.params = ""
    config.budget = 5
    config.budgets = (5,)
    config.loader = ml_collections.ConfigDict()
    config.loader.max_papers = ml_collections.config_dict.placeholder(int)  # None: all papers
    config.link_window = 1

    config.buckets = (32, 64, 128, 256, 512)
    config.max_batch = 64
    config.num_resamples = 10_000
    config.dtype = "float32"  # "float64" lets converged-mode solvers go below float32's KKT floor
    config.embedder.show_progress = False
    # the reader stage (cdsjax.eval.reading): url "" = retrieval metrics only; "none" / "full" in selectors
    # are its controls (question alone / whole document); reader.images "auto" sends figures as text to a
    # text-only server; judge.enabled False keeps token F1 and exact match and runs no judge
    config.reader = reader_setup.reader_settings()
    config.judge = reader_setup.judge_settings()
    return config
