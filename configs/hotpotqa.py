r"""Retrieval evaluation on HotpotQA (distractor setting): supporting-paragraph recall
and the share of questions with every supporting paragraph selected.

Run from the repository root::

    python experiments/run_eval.py --config configs/hotpotqa.py
    python experiments/run_eval.py --config configs/hotpotqa.py --config.budgets="(2, 4)"

Each question's 10 context paragraphs are its notes ("<title>\n<text>"), embedded with
``config.embedder``; they are separate articles, so there are no links (PPR then ranks
by its teleport distribution alone).
"""

import ml_collections

from cdsjax.eval import reader_setup
from cdsjax.io.index import default_config
from configs import common


def get_config(arg=None) -> ml_collections.ConfigDict:
    common.parse_arg(arg)  # takes no argument
    config = default_config()
    config.benchmark = "hotpotqa"
    config.data_root = "../shared/data"
    config.output_dir = "runs/eval/hotpotqa"
    config.cache_dir = ""
    config.max_queries = ml_collections.config_dict.placeholder(int)

    config.selectors = "cosine,random,mmr,dpp,ppr,cds,cds_converged,cds_learned"
    config.compare = "cosine"  # the reference of the summaries' paired differences (a label of selectors)
    config.selector_options = ml_collections.ConfigDict({"mmr": {"lam": 0.5}})
    # the parameter file of the cds_learned selector (cdsjax tune); "" -> the fit shipped with the package
    config.params = ""
    config.budget = 4
    config.budgets = (2, 4)
    config.loader = ml_collections.ConfigDict()
    config.link_window = 0

    config.buckets = (16,)
    config.max_batch = 128
    config.num_resamples = 10_000
    config.dtype = "float32"  # "float64" lets converged-mode solvers go below float32's KKT floor
    config.embedder.show_progress = False
    # the reader stage (cdsjax.eval.reading): url "" = retrieval metrics only; "none" / "full" in selectors
    # are its controls (question alone / whole document)
    config.reader = reader_setup.reader_settings()
    config.judge = reader_setup.judge_settings()
    return config
