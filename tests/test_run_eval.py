"""The evaluation harness: batched/sharded selection equals per-query calls, scoring,
records and resume, summaries, and end-to-end runs on tiny subsets of each benchmark."""

import csv
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id
from cdsjax.eval import evaluate
from cdsjax.eval.problems import Problem, text_links
from cdsjax.eval.records import RECORDS_FILE, drop_torn_tail, read_records, record_key
from cdsjax.eval.report import (SUMMARY_COLUMNS, SUMMARY_CSV, SUMMARY_MD, markdown_table, summary_rows,
                                write_summary_csv)
from cdsjax.eval.run import batch_chunk, make_mesh, run_selector
from cdsjax.eval.scoring import score_problem
from cdsjax.io import datasets as D

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _synthetic_problems(sizes, d=8, seed=0):
    rng = np.random.default_rng(seed)
    problems = []
    for i, n in enumerate(sizes):
        z = rng.normal(size=(n, d)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        q = (z[0] + 0.5 * rng.normal(size=d)).astype(np.float32)
        q /= np.linalg.norm(q)
        links = rng.random((n, n)) < 0.2
        links = np.triu(links, 1)
        links = links | links.T
        query = D.Query(qid=f"q{i}", question="?", answer=None, doc_ids=("doc",),
                        gold_pages={"doc": frozenset({0, 1})})
        problems.append(Problem(query, z, q, links, [f"n{j}" for j in range(n)], ["doc"] * n,
                                  pages=[j % 4 for j in range(n)],
                                  boxes=[(0.0, 10.0 * j, 100.0, 10.0 * j + 9) for j in range(n)]))
    return problems


SELECTORS = [("cosine", {}), ("ppr", {}), ("random", {}), ("cds", {"max_iter": 300})]


@pytest.mark.slow
@pytest.mark.parametrize("name,options", SELECTORS)
def test_run_selector_equals_per_query_calls(name, options):
    problems = _synthetic_problems([5, 20, 3], seed=1)
    fn = core.make_selector(name, budget=4, **options)
    seen = []
    out = run_selector(fn, problems, buckets=(8, 32), max_batch=2, chunk=batch_chunk(fn),
                         on_chunk=lambda pos, sels: seen.extend(pos))
    assert sorted(seen) == list(range(len(problems)))
    single = jax.jit(fn)
    for p, sel in zip(problems, out):
        ref = single(core.CDSProblem.create(p.notes, p.query_emb, np.ones(len(p.notes), bool), links=p.links),
                     key_from_query_id(p.query.qid))
        np.testing.assert_array_equal(sel.selected_valid, np.asarray(ref.selected_valid))
        v = np.asarray(ref.selected_valid)
        np.testing.assert_array_equal(sel.indices[v], np.asarray(ref.indices)[v])
        np.testing.assert_allclose(sel.scores[v], np.asarray(ref.scores)[v], rtol=1e-4, atol=1e-6)
        assert (sel.indices[v] < len(p.notes)).all()


@pytest.mark.slow
def test_run_selector_pads_large_chunks_tightly():
    """Twelve problems of ~600 notes pad to a batch of 12 (a slot of 1024 notes costs a quarter of a
    compilation), not 16, and give the same selections as per-query calls."""
    from cdsjax.eval import run as R

    problems = _synthetic_problems([590 + i for i in range(12)], d=4, seed=3)
    fn = core.make_selector("cosine", budget=5)
    executables = R.Executables()
    out = run_selector(fn, problems, buckets=(1024,), max_batch=16, executables=executables)
    shapes = {leaves[0][0] for (_, _, leaves) in set(executables.compiled)}
    assert shapes == {(12, 1024, 4)}
    single = jax.jit(fn)
    for p, sel in zip(problems, out):
        ref = single(core.CDSProblem.create(p.notes, p.query_emb, np.ones(len(p.notes), bool), links=p.links),
                     key_from_query_id(p.query.qid))
        np.testing.assert_array_equal(sel.indices, np.asarray(ref.indices))


SHARD_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    from cdsjax import core
    from cdsjax.eval.run import batch_chunk, make_mesh, run_selector
    from tests.test_run_eval import _synthetic_problems, SELECTORS
    assert len(jax.devices()) == 4, jax.devices()
    problems = _synthetic_problems([5, 7, 20, 3, 9], seed=2)
    full, one = make_mesh(), make_mesh(jax.devices()[:1])
    report = {}
    for name, options in SELECTORS:
        if name == "ppr":
            continue  # same batching path as cosine; keeps the subprocess short
        fn = core.make_selector(name, budget=4, **options)
        chunk = batch_chunk(fn)
        a = run_selector(fn, problems, buckets=(8, 32), max_batch=4, mesh=full, chunk=chunk)
        b = run_selector(fn, problems, buckets=(8, 32), max_batch=4, mesh=one, chunk=chunk)
        report[name] = dict(
            same_indices=all(np.array_equal(x.indices[x.selected_valid], y.indices[y.selected_valid])
                             and np.array_equal(x.selected_valid, y.selected_valid)
                             for x, y in zip(a, b)),
            max_score_diff=max(float(np.max(np.abs(x.scores - y.scores))) for x, y in zip(a, b)),
            picked=sum(int(x.selected_valid.sum()) for x in a))
    print(json.dumps(report))
""")


@pytest.mark.slow
def test_sharded_over_four_host_devices_equals_unsharded(tmp_path):
    script = tmp_path / "shard.py"
    script.write_text(SHARD_SCRIPT)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script), str(ROOT)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == {name for name, _ in SELECTORS} - {"ppr"}
    for name, r in report.items():
        assert r["same_indices"], (name, r)
        assert r["max_score_diff"] <= 1e-5, (name, r)
        assert r["picked"] > 0


def test_score_problem_pdf_and_text():
    p = _synthetic_problems([6])[0]
    p.query = D.Query(qid="x", question="?", answer=None, doc_ids=("doc",),
                      gold_pages={"doc": frozenset({1, 3})},
                      gold_boxes=(D.GoldBox("doc", 1, (0.0, 10.0, 100.0, 19.0)),
                                  D.GoldBox("doc", 2, (0.0, 0.0, 5.0, 5.0))))
    sel = core.Selection(indices=np.array([1, 5, 0, 0]), selected_valid=np.array([1, 1, 0, 0], bool),
                         scores=np.zeros(4))
    m = score_problem(p, sel, kind="pdf")
    # notes 1 and 5 sit on pages 1 and 1 (j % 4): gold pages {1, 3} -> 1/2.
    assert m["page_recall"] == 0.5 and m["all_pages_found"] == 0.0
    assert m["distinct_pages"] == 1.0 and m["num_selected"] == 2.0
    # note 1's box (0, 10, 100, 19) equals gold box 0; gold box 1 is on page 2.
    assert m["box_recall"] == 0.5
    z = p.notes
    assert m["redundancy"] == pytest.approx(float(z[1] @ z[5]), abs=1e-6)
    p.query = D.Query(qid="y", question="?", answer=None, doc_ids=("doc",),
                      gold_note_ids=frozenset({"n1", "n2"}),
                      meta={"gold_per_annotator": [["n1"], ["n2", "n3"]]})
    m = score_problem(p, sel, kind="text")
    assert m["paragraph_recall"] == 0.5 and m["all_found"] == 0.0
    assert m["best_annotator_recall"] == 1.0
    one = core.Selection(indices=np.array([2, 0]), selected_valid=np.array([1, 0], bool),
                         scores=np.zeros(2))
    assert score_problem(p, one, kind="text")["redundancy"] is None  # NaN -> None in records


def test_text_links_window_and_figure_references():
    corpus = D.TextCorpus("c", ("p0", "p1", "p2", "f0", "f1"),
                      ("Intro.", "As Fig. 2 shows, ...", "See Table 1 and figure 12.",
                       "Figure 2: A plot.", "Table 1: Numbers."),
                      ("paragraph",) * 3 + ("caption",) * 2)
    L = text_links(corpus, window=1)
    expected = {(0, 1), (1, 2), (1, 3), (2, 4)}
    got = {(i, j) for i, j in zip(*np.nonzero(L)) if i < j}
    assert got == expected and (L == L.T).all() and not L.diagonal().any()
    assert not text_links(corpus, window=0)[0, 1]


def test_summary_rows_markdown_and_csv(tmp_path):
    recs = []
    for sel, vals in [("cosine", [1.0, 0.0, 1.0]), ("cds", [0.5, 0.5, None])]:
        for i, v in enumerate(vals):
            recs.append({"benchmark": "b", "selector": sel, "budget": 5, "qid": f"q{i}",
                         "metrics": {"page_recall": v, "redundancy": 0.25},
                         "diagnostics": {"converged": True} if sel == "cds" else {}})
    rows = summary_rows(recs, ("page_recall", "redundancy"), num_resamples=500)
    got = {(r["selector"], r["metric"]): (round(r["mean"], 6), r["n"]) for r in rows}
    assert got == {("cosine", "page_recall@5"): (0.666667, 3), ("cosine", "redundancy@5"): (0.25, 3),
                   ("cds", "page_recall@5"): (0.5, 2), ("cds", "redundancy@5"): (0.25, 3),
                   ("cds", "converged@5"): (1.0, 3)}
    write_summary_csv(rows, tmp_path / "s.csv")
    with open(tmp_path / "s.csv") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(SUMMARY_COLUMNS) and len(table) == len(rows)
    md = markdown_table(rows)
    assert "### b, budget 5" in md
    assert "| cosine | 0.667 [" in md and "page_recall (n=" not in md  # n differs by selector
    assert "redundancy (n=3)" in md


# --------------------------------------------------------------------------- end to end


def _config(benchmark, out_dir, cache_dir, **fields):
    import importlib

    config = importlib.import_module(f"configs.{benchmark}").get_config()
    config.output_dir = str(out_dir)
    config.cache_dir = str(cache_dir)
    config.num_resamples = 500
    for k, v in fields.items():
        config[k] = v
    return config


def _records(out_dir):
    return [json.loads(line) for line in (out_dir / RECORDS_FILE).read_text().splitlines()]


def _summary(out_dir):
    with open(out_dir / SUMMARY_CSV) as f:
        return list(csv.DictReader(f))


def test_end_to_end_hotpotqa_and_resume(data_root, tmp_path, cache_dir):
    out = tmp_path / "hotpot"
    config = _config("hotpotqa", out, cache_dir, data_root=str(data_root), max_queries=3,
                     selectors="cosine,cds_paper", budgets=(2, 3),
                     selector_options={"cds_paper": {"selector": "cds", "max_iter": 500}})
    records, rows = evaluate(config, progress=False, log=lambda s: None)
    assert len(records) == 3 * 2 * 2
    bench = D.load_hotpotqa(data_root, max_queries=3)
    gold = {q.qid: q.gold_note_ids for q in bench.queries}
    for r in records:
        assert r["selector"] in ("cosine", "cds_paper") and len(r["selected"]) <= r["budget"]
        assert r["num_notes"] == 10
        found = len(gold[r["qid"]] & set(r["selected"])) / len(gold[r["qid"]])
        assert r["metrics"]["paragraph_recall"] == pytest.approx(found)
        assert r["metrics"]["all_found"] == float(found == 1.0)
        assert ("kkt_residual" in r["diagnostics"]) == (r["selector"] == "cds_paper")
        if r["selector"] == "cds_paper":  # how the solve ended, by name, agreeing with ``converged``
            d = r["diagnostics"]
            assert d["status"] in ("converged", "max_steps")
            assert (d["status"] == "converged") == d["converged"]
    table = _summary(out)
    assert list(table[0]) == list(SUMMARY_COLUMNS)
    means = {(t["selector"], t["metric"]): float(t["mean"]) for t in table}
    for sel in ("cosine", "cds_paper"):
        for b in (2, 3):
            vals = [r["metrics"]["paragraph_recall"] for r in records
                    if r["selector"] == sel and r["budget"] == b]
            assert means[(sel, f"paragraph_recall@{b}")] == pytest.approx(np.mean(vals))
    assert ("cds_paper", "converged@2") in means and ("cosine", "converged@2") not in means
    assert (out / SUMMARY_MD).read_text().startswith("### hotpotqa, budget 2")

    # Resume: nothing is recomputed; a torn last line and a missing record are redone.
    lines = (out / RECORDS_FILE).read_text().splitlines()
    (out / RECORDS_FILE).write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    records2, rows2 = evaluate(config, progress=False, log=lambda s: None)
    assert len(_records_clean(out)) == len(lines)
    assert sorted(map(record_key, records2)) == sorted(map(record_key, records))
    assert evaluate(config, progress=False, log=lambda s: None)[1] == rows2
    assert len(_records_clean(out)) == len(lines)
    # A different run into the same directory is refused.
    other = _config("hotpotqa", out, cache_dir, data_root=str(data_root), max_queries=3,
                    selectors="cosine", link_window=2)
    with pytest.raises(ValueError, match="link_window"):
        evaluate(other, progress=False, log=lambda s: None)


def _records_clean(out_dir):
    return read_records(out_dir / RECORDS_FILE)


@pytest.mark.slow
def test_end_to_end_qasper(data_root, tmp_path, cache_dir):
    out = tmp_path / "qasper"
    config = _config("qasper", out, cache_dir, data_root=str(data_root), max_queries=4,
                     selectors="cosine,mmr", budgets=(3,))
    config.relevance.mode = "dense"  # the scores are checked against the embeddings' cosine, recomputed here
    records, rows = evaluate(config, progress=False, log=lambda s: None)
    bench = D.load_qasper(data_root, max_queries=4)
    by_id = {q.qid: q for q in bench.queries}
    assert len(records) == 8
    for r in records:
        q = by_id[r["qid"]]
        corpus = bench.corpora[q.doc_ids[0]]
        assert r["num_notes"] == len(corpus) and set(r["selected"]) <= set(corpus.note_ids)
        if q.gold_note_ids:
            assert r["metrics"]["paragraph_recall"] == pytest.approx(
                len(q.gold_note_ids & set(r["selected"])) / len(q.gold_note_ids))
        else:
            assert r["metrics"]["paragraph_recall"] is None
        # has-answer: scored exactly where an annotator gave extractive spans that some paragraph holds; a hit
        # means every span of one annotator is in a selected paragraph
        texts = dict(zip(corpus.note_ids, corpus.texts))
        from cdsjax.eval.answers import MAX_LIST_ITEMS

        spans = [s for s in q.meta["extractive_spans"] if s and len(s) <= MAX_LIST_ITEMS]
        findable = [s for s in spans if all(any(x.lower() in t.lower() for t in corpus.texts) for x in s)]
        hit = r["metrics"]["has_answer"]
        if not spans:
            assert hit is None
        elif hit == 1.0:
            assert any(all(any(x.lower() in texts[i].lower() for i in r["selected"]) for x in s) for s in spans)
        elif hit is None:
            assert not findable
    assert any(r["metrics"]["has_answer"] is not None for r in records)
    # Both selections against a float64 reference on the run's own embeddings (read back from its cache):
    # cosine is the top 3 by relevance, MMR (lam 0.5) the greedy relevance-minus-redundancy picks.
    from cdsjax.eval import load_problems
    from cdsjax.io.embed import Embedder

    _, _, problems, _ = load_problems(config, Embedder(config), cache_dir=cache_dir, log=lambda s: None)
    by_qid = {p.query.qid: p for p in problems}
    for r in records:
        p = by_qid[r["qid"]]
        z, rel = np.asarray(p.notes, np.float64), np.asarray(p.notes, np.float64) @ np.asarray(p.query_emb, np.float64)
        picks, scores = [], []
        for t in range(3):
            gain = rel if (r["selector"] == "cosine" or t == 0) else 0.5 * rel - 0.5 * (z @ z[picks].T).max(axis=1)
            gain = np.where(np.isin(np.arange(len(rel)), picks), -np.inf, gain)
            order = np.argsort(-gain, kind="stable")
            assert gain[order[0]] - gain[order[1]] > 1e-5, "no near tie"
            picks.append(int(order[0]))
            scores.append(gain[order[0]])
        assert r["selected"] == [p.note_ids[i] for i in picks], (r["selector"], r["qid"])
        assert r["scores"] == pytest.approx(scores, abs=1e-5)
    cos = {r["qid"]: r["selected"] for r in records if r["selector"] == "cosine"}
    mmr = {r["qid"]: r["selected"] for r in records if r["selector"] == "mmr"}
    assert any(cos[q] != mmr[q] for q in cos), "on these questions MMR trades relevance for diversity at least once"
    assert {m["metric"] for m in rows} >= {"paragraph_recall@3", "has_answer@3", "best_annotator_recall@3",
                                           "redundancy@3"}


def _tiny_mmlongbench(root):
    import pymupdf

    (root / "mmlongbench" / "documents").mkdir(parents=True)
    texts = ["Orchard report. Apples grow in the northern valley; the harvest runs from September "
             "to October. " * 3,
             "Revenue. In 2019 the cooperative earned 4.2 million euros from apple sales, up from "
             "3.1 million in 2018. " * 3,
             "Outlook. The board plans to plant pear trees next year and to build a cold store. " * 3]
    doc = pymupdf.open()
    for t in texts:
        doc.new_page().insert_textbox(pymupdf.Rect(72, 100, 540, 300), t, fontsize=11)
    doc.save(root / "mmlongbench" / "documents" / "orchard.pdf")
    samples = [
        {"doc_id": "orchard.pdf", "doc_type": "Report", "question": "How much did apple sales earn in 2019?",
         "answer": "4.2 million euros", "evidence_pages": "[2]", "evidence_sources": "['Pure-text']",
         "answer_format": "Str"},
        {"doc_id": "orchard.pdf", "doc_type": "Report", "question": "Who is the cooperative's CEO?",
         "answer": "Not answerable", "evidence_pages": "[]", "evidence_sources": "[]",
         "answer_format": "None"},
    ]
    (root / "mmlongbench" / "samples.json").write_text(json.dumps(samples))
    ann = {"doc_name": "orchard.pdf", "questions": [
        {"Q": samples[0]["question"], "A": samples[0]["answer"], "page_id": [1], "type": "['Pure-text']",
         "layout_mapping": [{"page": 1, "page_size": [612.0, 792.0], "bbox": [72, 100, 540, 170]}]}]}
    (root / "mmlongbench" / "mmdocir_annotations.jsonl").write_text(json.dumps(ann) + "\n")


@pytest.mark.slow  # test_eval_mmlongbench_real runs the harness on a real MMLongBench-Doc document by default
def test_end_to_end_mmlongbench_layout_via_script(tmp_path, cache_dir):
    data = tmp_path / "data"
    _tiny_mmlongbench(data)
    out = tmp_path / "mmlb"
    cmd = [sys.executable, str(ROOT / "experiments" / "run_eval.py"),
           "--config", str(ROOT / "configs" / "mmlongbench.py"), "--progress=false",
           f"--config.data_root={data}", f"--config.output_dir={out}",
           f"--config.cache_dir={cache_dir}", "--config.selectors=cosine,cds",
           "--config.budgets=(1,)", "--config.num_resamples=200"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "### mmlongbench, budget 1" in proc.stdout + proc.stderr
    records = {(r["selector"], r["qid"]): r for r in _records(out)}
    assert len(records) == 4
    answerable = records[("cosine", "mmlongbench-0000")]
    # The revenue question's best note is the revenue text on page index 1, whose box
    # covers the gold box.
    assert answerable["pages"] == [["orchard.pdf", 1]]
    assert answerable["metrics"]["page_recall"] == 1.0
    assert answerable["metrics"]["box_recall"] == 1.0
    assert answerable["metrics"]["has_answer"] == 1.0  # "4.2 million euros" is in the revenue note
    unanswerable = records[("cosine", "mmlongbench-0001")]
    assert unanswerable["metrics"]["page_recall"] is None
    assert unanswerable["metrics"]["box_recall"] is None
    assert unanswerable["metrics"]["has_answer"] is None
    rows = {(r["selector"], r["metric"]): r for r in _summary(out)}
    assert rows[("cosine", "page_recall@1")]["n"] == "1"
    assert rows[("cds", "distinct_pages@1")]["n"] == "2"


def test_drop_torn_tail(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a"')
    drop_torn_tail(p)
    assert p.read_text() == '{"a": 1}\n{"a": 2}\n'
    drop_torn_tail(p)
    assert p.read_text() == '{"a": 1}\n{"a": 2}\n'
    p.write_text('{"a"')
    drop_torn_tail(p)
    assert p.read_text() == ""


@pytest.mark.slow
@pytest.mark.x64
def test_run_selector_float64():
    problems = _synthetic_problems([5, 9], seed=3)
    fn = core.make_selector("cosine", budget=3)
    out = run_selector(fn, problems, buckets=(16,), dtype=np.float64)  # the x64 marker enables float64
    for p, sel in zip(problems, out):
        assert sel.scores.dtype == np.float64
        ref = np.sort(p.notes.astype(np.float64) @ p.query_emb.astype(np.float64))[::-1][:3]
        np.testing.assert_allclose(sel.scores, ref, rtol=0, atol=1e-12)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_release_drops_a_selectors_executables():
    from cdsjax.core.games.learned import LearnedParams
    from cdsjax.eval import run as R

    problems = _synthetic_problems([5, 9], seed=3)
    fn = core.make_selector("cds_learned", budget=2, params=LearnedParams(beta=0.2, w_page=-0.5))
    spec = core.SPECS["cds_learned"]
    ex = R.Executables()
    first = run_selector(fn, problems, buckets=(16,), max_batch=2, spec=spec, executables=ex)
    held = lambda: sum(1 for k in ex.compiled if any(k[0] is v for v in ex.batch_calls.values()))
    before = held()
    assert ex.release(fn) >= 2  # its batched call and at least one executable
    assert held() < before and not [k for k in ex.batch_calls if k[0] is fn]
    again = run_selector(fn, problems, buckets=(16,), max_batch=2, spec=spec, executables=ex)  # compiles again
    assert [list(np.asarray(s.indices)) for s in again] == [list(np.asarray(s.indices)) for s in first]


@pytest.mark.slow
def test_release_all_frees_the_mappings_of_loaded_executables():
    from cdsjax.eval import run as R
    from cdsjax.eval.run import memory_maps as _memory_maps

    problems = _synthetic_problems([5, 9], seed=4)
    R.clear_jax_caches()
    base = _memory_maps()
    ex = R.Executables()
    fns = [core.make_selector("cosine", budget=b) for b in range(1, 9)]
    for fn in fns:
        run_selector(fn, problems, buckets=(16,), max_batch=2, executables=ex)
    loaded = _memory_maps()
    assert loaded > base and ex.compiled and ex.batch_calls
    assert ex.release_all() >= len(fns)
    assert not ex.compiled and not ex.batch_calls
    assert _memory_maps() < loaded  # the executables' code and buffers are unmapped, not only forgotten
    again = run_selector(fns[2], problems, buckets=(16,), max_batch=2, executables=ex)  # compiles again
    assert [len(np.asarray(s.indices)) for s in again] == [3, 3]


def test_compiling_near_the_memory_map_limit_drops_the_kept_executables_first(monkeypatch):
    """Past MAP_SHARE of vm.max_map_count (checked every MAP_CHECK_EVERY new executables) the evaluation drops
    what it keeps before compiling another, so a long-lived process does not reach the limit, where XLA
    crashes; below it, nothing is dropped."""
    from cdsjax.eval import run as R

    problems = _synthetic_problems([5, 9], seed=5)
    ex = R.Executables()
    monkeypatch.setattr(R, "MAP_CHECK_EVERY", 1)
    monkeypatch.setattr(R, "memory_map_limit", lambda: 10 ** 9)  # far from the limit: everything is kept
    for b in (1, 2, 3):
        run_selector(core.make_selector("cosine", budget=b), problems, buckets=(16,), max_batch=2, executables=ex)
    kept = len(ex.compiled)
    assert kept >= 3
    monkeypatch.setattr(R, "memory_map_limit", lambda: int(R.memory_maps() / R.MAP_SHARE) - 10)  # just past it
    out = run_selector(core.make_selector("cosine", budget=4), problems, buckets=(16,), max_batch=2, executables=ex)
    assert len(ex.compiled) == 1  # the others were dropped before this one compiled
    assert [len(np.asarray(s.indices)) for s in out] == [4, 4]


@pytest.mark.slow
def test_run_selector_solves_on_the_note_block_as_the_pipeline_does():
    """The evaluation gives each question its corpus's bound and note block from a CorpusArrays (once per corpus),
    so a selector that serves on the block is evaluated with the solver it serves with: the picks of one
    question equal the pipeline's (the pipeline's problem with its block, solved one question at a time)."""
    from cdsjax.eval import run as R
    from cdsjax.pipeline.selection import Candidates, CorpusArrays, resolve_selector

    problems = _synthetic_problems([20, 20, 27], d=16, seed=3)
    spec, fn = resolve_selector("cds_learned_pages", 4)
    assert spec.solver == core.SERVING_SOLVER and spec.solver_label == "pdas"
    roles = []

    def counting(f, role):
        inner = R.OneCoreJit.of(f, role)

        def call(problem):
            out = inner(problem)
            roles.append((role, out is not None))
            return out

        return call

    corpus = CorpusArrays(wrap=counting)
    out = run_selector(fn, problems, buckets=(32,), max_batch=4, spec=spec, corpus=corpus)
    # three corpora (each problem its own notes): each bound and each block computed once
    assert roles.count(("bound", True)) == 3 and roles.count(("block", True)) == 3
    for k in (0, 2):
        p = problems[k]
        cand = Candidates.pad(p.notes, links=p.links, structure=p.structure(pages_only=spec.pages_only))
        problem = CorpusArrays().attach(fn, cand.problem(p.query_emb, spec))
        assert isinstance(problem, core.BlockProblem)
        ref = jax.jit(fn)(problem, key_from_query_id(p.query.qid))
        v = np.asarray(ref.selected_valid)
        np.testing.assert_array_equal(out[k].selected_valid, v)
        np.testing.assert_array_equal(out[k].indices[v], np.asarray(ref.indices)[v])
