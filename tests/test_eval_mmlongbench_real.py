"""The harness end to end on a real MMLongBench-Doc subset: one 10-page PDF and its questions.

The test writes a data root whose layout matches ../shared/data, holding only that document (a
symlink to the shared PDF) and its rows of samples.json / mmdocir_annotations.jsonl.
"""

import json

import pytest

DOC = "2310.07609v1.pdf"


@pytest.fixture
def one_doc_root(data_root, tmp_path):
    src = data_root / "mmlongbench"
    if not (src / "documents" / DOC).is_file():
        pytest.skip(f"{DOC} not in the shared data")
    dst = tmp_path / "data" / "mmlongbench"
    (dst / "documents").mkdir(parents=True)
    (dst / "documents" / DOC).symlink_to(src / "documents" / DOC)
    samples = [s for s in json.loads((src / "samples.json").read_text()) if s["doc_id"] == DOC]
    (dst / "samples.json").write_text(json.dumps(samples))
    lines = [ln for ln in (src / "mmdocir_annotations.jsonl").read_text().splitlines()
             if ln.strip() and json.loads(ln)["doc_name"] == DOC]
    (dst / "mmdocir_annotations.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "data", len(samples)


def test_harness_on_a_real_mmlongbench_document(one_doc_root, tmp_path):
    from cdsjax.eval import evaluate
    from tests.conftest import ROOT
    from cdsjax.commands.eval import load_config

    root, n_samples = one_doc_root
    config = load_config(str(ROOT / "configs" / "mmlongbench.py"))
    config.data_root = str(root)
    config.output_dir = str(tmp_path / "out")
    config.cache_dir = str(tmp_path / "cache")
    config.max_queries = 4
    config.selectors = "cosine,cds"
    config.budgets = (5,)
    config.num_resamples = 200
    records, rows = evaluate(config, progress=False, log=lambda *a: None)
    assert n_samples >= 4 and len(records) == 8
    for r in records:
        assert r["selector"] in ("cosine", "cds") and len(r["pages"]) <= 5
        assert all(doc == DOC and page >= 0 for doc, page in r["pages"])
    metrics = {(r["selector"], r["metric"]) for r in rows}
    assert ("cosine", "page_recall@5") in metrics and ("cds", "page_recall@5") in metrics
    cds = [r for r in records if r["selector"] == "cds"]
    assert all("converged" in json.dumps(r) for r in cds)
