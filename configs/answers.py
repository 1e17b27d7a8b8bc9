r"""Answer accuracy with the local reader on the development data (``experiments/answers_local.py``): the
QASPER and MMLongBench-Doc evaluation configs with ``reader.local = "default"`` (llama.cpp with the 1.5B preset),
budget 5, and the selectors the answer tables compare.

    python experiments/answers_local.py qasper        # = run_eval.py --config configs/answers.py:qasper
    python experiments/run_eval.py --config configs/answers.py:mmlongbench
"""

import ml_collections

from configs import common, mmlongbench, qasper

BASES = {"qasper": qasper, "mmlongbench": mmlongbench}
# cosine, MMR, the default and the paper's replicator dynamics on text; on PDFs the page rule instead of MMR and
# the paper mode; "none" (the question alone) on both
SELECTORS = {"qasper": "cosine,mmr,cds_learned_pages,cds,none",
             "mmlongbench": "cosine,cosine_pages,cds_learned_pages,none"}
QUESTIONS = {"qasper": 100, "mmlongbench": 60}
BUDGET = 5


def get_config(arg=None) -> ml_collections.ConfigDict:
    bench = common.parse_arg(arg, benchmark="qasper").benchmark
    if bench not in BASES:
        raise ValueError(f"configs/answers.py: expected one of {sorted(BASES)}, got {bench!r}")
    config = BASES[bench].get_config()
    config.output_dir = f"results/answers/{bench}"
    config.max_queries = QUESTIONS[bench]
    config.selectors = SELECTORS[bench]
    config.compare = "cosine"  # the reference of the summaries' paired differences (a label of selectors)
    config.budget = BUDGET
    config.budgets = (BUDGET,)
    config.reader.local = "default"
    config.reader.max_tokens = 256  # a short answer is asked for; this bounds a runaway one
    # a verdict (one or two sentences, correct, score) takes 60-100 tokens; the small model sometimes loops
    # instead, and at ~7 tokens/s a 1,024-token loop costs two minutes: cut at 256, it is recorded as judge_error
    config.judge.max_tokens = 256
    config.judge.rationale = False  # the verdict alone: ~15 tokens instead of ~80 a call (the same rules)
    return config
