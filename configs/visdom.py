r"""Evaluation on one VisDoMBench subset (the paper's Table 3): each question searches the PDFs the benchmark
gives it; retrieval metrics (page and document recall), and with a reader the judged answer accuracy.

Run from the repository root, one subset per run (``ARG`` names it; the benchmark has feta_tab, paper_tab,
scigraphqa, slidevqa and spiqa)::

    python experiments/run_eval.py --config configs/visdom.py:feta_tab
    python experiments/run_eval.py --config configs/visdom.py:subset=slidevqa \
        --config.reader.url=http://localhost:8000/v1 --config.reader.model=Qwen/Qwen3-VL-32B-Instruct \
        --config.selectors=cosine,cds_learned_pages,none --config.reader.seeds="(0, 1, 2)"

The data is ``<data_root>/visdom/<subset>/<subset>.csv`` with the PDFs in ``<subset>/docs/``
(:func:`cdsjax.io.datasets.load_visdom`); each PDF is parsed, enriched and embedded once (cached under
``cache_dir``) with the ingestion settings of ``configs/default.py``. Answers are judged by an LLM
(``config.judge``; the reader's server and model when ``config.judge.url`` is empty; none with
``config.judge.enabled=False``, which leaves the rule-based scores: exact match on yes/no/unanswerable answers).
"""

import ml_collections

from cdsjax.eval import reader_setup
from cdsjax.io.index import default_config
from configs import common

def get_config(arg=None) -> ml_collections.ConfigDict:
    args = common.parse_arg(arg, subset="feta_tab")
    config = default_config()
    config.benchmark = "visdom"
    config.data_root = "../shared/data"
    config.output_dir = f"runs/eval/visdom_{args.subset}"
    config.cache_dir = ""  # indexes and question embeddings; "" -> <output_dir>/cache
    config.max_queries = ml_collections.config_dict.placeholder(int)  # None: all questions

    config.selectors = "cosine,random,mmr,dpp,ppr,cds,cds_converged,cds_learned"
    config.compare = "cosine"  # the reference of the summaries' paired differences (a label of selectors)
    config.selector_options = ml_collections.ConfigDict({"mmr": {"lam": 0.5}})
    config.params = ""
    config.budget = 5
    config.budgets = (5,)
    config.loader = ml_collections.ConfigDict({"subset": args.subset})

    config.buckets = (64, 128, 256, 512, 1024, 2048, 4096)
    config.max_batch = 32
    config.num_resamples = 10_000
    config.dtype = "float32"
    config.embedder.show_progress = False
    config.reader = reader_setup.reader_settings()
    config.judge = reader_setup.judge_settings()
    return config
