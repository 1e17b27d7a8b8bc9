"""Candidate pools (gold + distractors) and the open corpus: pools are a function of the
question alone (same in every run, process and sharded run), pool problems keep links
within documents, pool metrics, and the exact-cosine first stage."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from cdsjax.eval import metrics as M
from cdsjax.eval import evaluate
from cdsjax.eval.pools import (DocumentNotes, PoolSpec, corpus_problems, first_stage, pool_problem,
                               pool_spec)
from cdsjax.eval.scoring import score_problem
from cdsjax.io import datasets as D

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [f"doc{i}" for i in range(12)]


# --------------------------------------------------------------------------- drawing pools


def test_draw_pool_is_seeded_per_question_and_holds_the_gold_document():
    pools = {f"q{i}": D.draw_pool("bench", f"q{i}", ["doc3"], DOCS, pool_size=5) for i in range(40)}
    for qid, pool in pools.items():
        assert len(pool) == 5 and len(set(pool)) == 5 and "doc3" in pool and set(pool) <= set(DOCS)
        assert D.draw_pool("bench", qid, ["doc3"], list(reversed(DOCS)), pool_size=5) == pool
    # Different questions get different distractors and the gold document is not always first.
    assert len({frozenset(p) for p in pools.values()}) > 20
    assert len({p.index("doc3") for p in pools.values()}) == 5
    assert D.draw_pool("bench", "q0", ["doc3"], DOCS, pool_size=5, seed=1) != pools["q0"]
    assert D.draw_pool("bench", "q0", ["doc3"], DOCS, pool_size=1) == ("doc3",)


def test_draw_pool_same_in_a_process_with_another_hash_seed():
    code = ("import json, sys; from cdsjax.io import datasets as D; "
            "print(json.dumps([D.draw_pool('bench', f'q{i}', ['doc3'], "
            "[f'doc{j}' for j in range(12)], pool_size=5) for i in range(20)]))")
    outs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(json.loads(proc.stdout))
    here = [list(D.draw_pool("bench", f"q{i}", ["doc3"], DOCS, pool_size=5)) for i in range(20)]
    assert outs[0] == outs[1] == here


def test_similar_distractors_are_the_closest_documents():
    rng = np.random.default_rng(0)
    vectors = {d: rng.normal(size=6) for d in DOCS}
    gold = vectors["doc0"]
    cos = {d: float(v @ gold / np.linalg.norm(v) / np.linalg.norm(gold)) for d, v in vectors.items()}
    expected = sorted((d for d in DOCS if d != "doc0"), key=lambda d: -cos[d])[:3]
    pool = D.draw_pool("b", "q", ["doc0"], DOCS, pool_size=4, distractors="similar", doc_vectors=vectors)
    assert set(pool) == {"doc0", *expected}
    with pytest.raises(ValueError, match="no document vector"):
        D.draw_pool("b", "q", ["doc0"], DOCS, pool_size=4, distractors="similar", doc_vectors={})


def test_pool_errors_name_the_problem():
    with pytest.raises(ValueError, match="only 11 other documents"):
        D.draw_pool("b", "q", ["doc0"], DOCS, pool_size=13)
    with pytest.raises(ValueError, match="distractors must be one of"):
        D.draw_pool("b", "q", ["doc0"], DOCS, pool_size=3, distractors="hard")
    with pytest.raises(ValueError, match="pool_size must be >= 1"):
        D.draw_pool("b", "q", ["doc0"], DOCS, pool_size=0)
    bench = D.Benchmark("visdom/x", [D.Query("q", "?", None, ("a", "b"))], documents={"a": None, "b": None})
    with pytest.raises(ValueError, match="VisDoM"):
        D.with_pools(bench, 2)


def test_with_pools_on_qasper(data_root):
    bench = D.load_qasper(data_root, max_papers=30)
    pooled = D.with_pools(bench, 5)
    assert [q.qid for q in pooled.queries] == [q.qid for q in bench.queries]
    for q, orig in zip(pooled.queries, bench.queries):
        assert len(q.doc_ids) == 5 and q.meta["gold_docs"] == list(orig.doc_ids)
        assert orig.doc_ids[0] in q.doc_ids and set(q.doc_ids) <= set(bench.corpora)
        assert q.gold_note_ids == orig.gold_note_ids
    assert len({q.doc_ids.index(q.meta["gold_docs"][0]) for q in pooled.queries}) == 5
    assert [q.doc_ids for q in D.with_pools(bench, 5).queries] == [q.doc_ids for q in pooled.queries]


# --------------------------------------------------------------------------- problems and metrics


def _doc_notes(rng, docs, n, d=8):
    out = {}
    for doc in docs:
        z = rng.normal(size=(n, d)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        links = np.triu(rng.random((n, n)) < 0.4, 1)
        out[doc] = DocumentNotes(z, links | links.T, [f"{doc}#{j}" for j in range(n)],
                                   pages=[j % 3 for j in range(n)],
                                   boxes=[(0.0, j, 1.0, j + 1.0) for j in range(n)])
    return out


def test_pool_problem_concatenates_documents_and_keeps_links_inside_them():
    rng = np.random.default_rng(1)
    notes = _doc_notes(rng, ["a", "b", "c"], 4)
    q = D.Query("q", "?", None, ("b",), gold_pages={"b": frozenset({1})})
    qe = notes["b"].embeddings[1]
    p = pool_problem(q, qe, ("c", "b"), notes, ("b",))
    assert p.docs == ["c"] * 4 + ["b"] * 4 and p.pool == ("c", "b") and p.gold_docs == ("b",)
    np.testing.assert_array_equal(p.notes[4:], notes["b"].embeddings)
    np.testing.assert_array_equal(p.links[:4, :4], notes["c"].links)
    np.testing.assert_array_equal(p.links[4:, 4:], notes["b"].links)
    assert not p.links[:4, 4:].any()
    class Sel:
        indices = np.array([4, 5, 0, 1])
        selected_valid = np.array([True, True, True, False])
        scores = np.zeros(4)

    m = score_problem(p, Sel(), kind="pdf")
    assert m["gold_doc_share"] == pytest.approx(2 / 3)
    assert m["gold_doc_hit"] == 1.0 and m["distinct_docs"] == 2.0
    assert m["page_recall"] == 1.0  # note 5 of b is on page 1


def test_pool_metrics_and_paired_difference():
    assert M.gold_doc_share(["a", "b", "a", "c"], {"a"}) == 0.5
    assert np.isnan(M.gold_doc_share([], {"a"})) and np.isnan(M.gold_doc_hit(["a"], set()))
    assert M.gold_doc_hit(["b", "c"], {"a"}) == 0.0 and M.distinct_docs(["a", "b", "a"]) == 2
    a = [1.0, 0.5, 0.0, None, 0.25, 1.0]
    b = [0.5, 0.5, 0.5, 1.0, 0.0, float("nan")]
    r = M.paired_difference(a, b, num_resamples=2000, seed=3)
    d = np.array([0.5, 0.0, -0.5, 0.25])
    assert r["n"] == 4 and r["mean"] == pytest.approx(d.mean())
    assert (r["better"], r["tie"], r["worse"]) == (2, 1, 1)
    assert r["ci_low"] <= r["mean"] <= r["ci_high"]
    assert r["ci_low"] >= d.min() and r["ci_high"] <= d.max()


def test_first_stage_and_corpus_problems_match_numpy():
    rng = np.random.default_rng(2)
    notes = _doc_notes(rng, ["a", "b", "c"], 10)
    z = np.concatenate([notes[d].embeddings for d in notes])
    qs = z[[3, 17, 25]] + 0.1 * rng.normal(size=(3, 8)).astype(np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    top = first_stage(qs, z, 7, chunk=2)
    np.testing.assert_array_equal(top, np.argsort(-(qs @ z.T), axis=1, kind="stable")[:, :7])
    assert first_stage(qs, z, 100).shape == (3, 30)
    queries = [D.Query(f"q{i}", "?", None, ("a",)) for i in range(3)]
    problems, seconds = corpus_problems(queries, qs, notes, 7)
    assert seconds >= 0
    ids = [i for d in notes for i in notes[d].note_ids]
    for p, t in zip(problems, top):
        assert p.note_ids == [ids[i] for i in t] and p.gold_docs == ("a",)
        assert p.pool == tuple(dict.fromkeys(p.docs))
        for i in range(7):
            for j in range(7):
                di, li = p.note_ids[i].split("#")
                dj, lj = p.note_ids[j].split("#")
                want = di == dj and notes[di].links[int(li), int(lj)]
                assert p.links[i, j] == want


def test_pool_spec_from_config():
    import ml_collections

    c = ml_collections.ConfigDict({"benchmark": "qasper"})
    assert pool_spec(c) is None
    c.pool_size = 5
    assert pool_spec(c) == PoolSpec(pool_size=5)
    c.candidate_pool = "web"
    with pytest.raises(ValueError, match="candidate_pool"):
        pool_spec(c)


# --------------------------------------------------------------------------- end to end


def _tiny_pool_benchmark(root):
    """Four small PDFs (two pages each) and one question per PDF, MMLongBench layout."""
    import pymupdf

    topics = {
        "apples.pdf": ["Apples grow in the northern valley orchards.", "Apple sales earned 4 million euros."],
        "trains.pdf": ["The night train leaves the station at ten.", "Train tickets cost 30 euros."],
        "whales.pdf": ["Blue whales migrate along the coast each spring.", "Whale songs travel far."],
        "bridges.pdf": ["The suspension bridge spans the river.", "Steel cables carry the bridge deck."],
    }
    docs = root / "mmlongbench" / "documents"
    docs.mkdir(parents=True)
    samples, ann = [], []
    for name, pages in topics.items():
        pdf = pymupdf.open()
        for text in pages:
            pdf.new_page().insert_textbox(pymupdf.Rect(72, 100, 540, 300), (text + " ") * 4, fontsize=11)
        pdf.save(docs / name)
        q = f"What does page two of {name[:-4]} say? {pages[1]}"
        samples.append({"doc_id": name, "doc_type": "Report", "question": q, "answer": "x",
                        "evidence_pages": "[2]", "evidence_sources": "['Pure-text']", "answer_format": "Str"})
        ann.append({"doc_name": name, "questions": [{"Q": q, "A": "x", "page_id": [1], "type": "[]",
                                                     "layout_mapping": []}]})
    (root / "mmlongbench" / "samples.json").write_text(json.dumps(samples))
    (root / "mmlongbench" / "mmdocir_annotations.jsonl").write_text("\n".join(map(json.dumps, ann)) + "\n")


RUN_SCRIPT = """
import json, sys
import jax
sys.path.insert(0, sys.argv[1])
from cdsjax.eval import evaluate
from tests.test_pools import pool_config
assert len(jax.devices()) == int(sys.argv[5]), jax.devices()
config = pool_config(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[6])
records, _ = evaluate(config, progress=False, log=lambda s: None)
print(json.dumps({f"{r['selector']}|{r['qid']}": [r["pool_documents"], r["selected"]] for r in records}))
"""


def pool_config(data, out, cache, distractors, pool_size=3):
    from tests.test_run_eval import _config

    return _config("mmlongbench_pool", out, cache, data_root=str(data), pool_size=int(pool_size),
                   distractors=distractors, selectors="cosine,cds_converged", budgets=(3,), max_batch=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("pooldata")
    _tiny_pool_benchmark(root)
    return root


def _run_in_subprocess(tmp_path, data, out, cache, distractors, devices, hash_seed):
    script = tmp_path / "run_pool.py"
    script.write_text(RUN_SCRIPT)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONHASHSEED=hash_seed,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = subprocess.run([sys.executable, str(script), str(ROOT), str(data), str(out), str(cache),
                           str(devices), distractors],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("distractors", ["random", "similar"])
def test_pools_identical_across_runs_processes_and_a_sharded_run(tiny, tmp_path, distractors):
    cache = tmp_path.parent / "pool_cache"  # shared by the parametrised runs: PDFs indexed once
    config = pool_config(tiny, tmp_path / "a", cache, distractors)
    records, rows = evaluate(config, progress=False, log=lambda s: None)
    here = {f"{r['selector']}|{r['qid']}": [r["pool_documents"], r["selected"]] for r in records}
    assert len(here) == 8
    bench = D.load_mmlongbench(tiny)
    own = {q.qid: q.doc_ids[0] for q in bench.queries}
    for r in records:
        pool = r["pool_documents"]
        assert len(pool) == 3 and own[r["qid"]] in pool
        picked_docs = [s.split("#")[0] for s in r["selected"]]
        assert set(picked_docs) <= set(pool)
        assert r["metrics"]["gold_doc_share"] == pytest.approx(
            sum(d == own[r["qid"]] for d in picked_docs) / len(picked_docs))
        assert r["metrics"]["distinct_docs"] == len(set(picked_docs))
    assert {m["metric"] for m in rows} >= {"gold_doc_share@3", "gold_doc_hit@3", "distinct_docs@3"}
    # The same pools and picks in a second run in this process, in another process with
    # another hash seed, and in a run sharded over two host devices.
    again, _ = evaluate(pool_config(tiny, tmp_path / "b", cache, distractors), progress=False,
                          log=lambda s: None)
    assert {f"{r['selector']}|{r['qid']}": [r["pool_documents"], r["selected"]] for r in again} == here
    sharded = _run_in_subprocess(tmp_path, tiny, tmp_path / "c", cache, distractors, 2, "7")
    assert sharded == here
    # Keeping fewer questions does not change the pools of those kept.
    config = pool_config(tiny, tmp_path / "d", cache, distractors)
    config.max_queries = 2
    few, _ = evaluate(config, progress=False, log=lambda s: None)
    assert len(few) == 4
    for r in few:
        assert [r["pool_documents"], r["selected"]] == here[f"{r['selector']}|{r['qid']}"]


def test_pool_size_one_selects_as_the_plain_run(tiny, tmp_path):
    from tests.test_run_eval import _config

    cache = tmp_path / "cache"
    sweep = tmp_path / "sweep"
    pooled, _ = evaluate(pool_config(tiny, sweep / "mmlongbench_1_random", cache, "random", pool_size=1),
                           progress=False, log=lambda s: None)
    plain, _ = evaluate(_config("mmlongbench", tmp_path / "q", cache, data_root=str(tiny),
                                  selectors="cosine,cds_converged", budgets=(3,)),
                          progress=False, log=lambda s: None)
    key = lambda r: (r["selector"], r["qid"])  # noqa: E731
    plain = {key(r): r for r in plain}
    own = {q.qid: q.doc_ids[0] for q in D.load_mmlongbench(tiny).queries}
    for r in pooled:
        assert r["pool_documents"] == [own[r["qid"]]]
        assert r["selected"] == plain[key(r)]["selected"]
        assert r["metrics"]["page_recall"] == plain[key(r)]["metrics"]["page_recall"]
        assert r["metrics"]["gold_doc_share"] == 1.0
        assert "pool_documents" not in plain[key(r)]

    # The report and the pool-size figure read these runs.
    evaluate(pool_config(tiny, sweep / "mmlongbench_3_similar", cache, "similar"), progress=False,
               log=lambda s: None)
    sys.path.insert(0, str(ROOT))
    from experiments import pool_report

    table = pool_report.run_table("three", sweep / "mmlongbench_3_similar", "mmlongbench", num_resamples=50)
    assert "| cds_converged |" in table and "4 questions" in table
    points, counts = pool_report.pool_size_points(sweep, "mmlongbench", "page_recall")
    assert counts == {"similar": 4} and [s for s, _ in points["similar"]["cosine"]] == [1, 3]
    cos1 = np.mean([r["metrics"]["page_recall"] for r in pooled if r["selector"] == "cosine"])
    assert points["similar"]["cosine"][0][1] == pytest.approx(cos1)
    out = pool_report.main(["--benchmark", "mmlongbench", "--sweep", str(sweep),
                            "--figure", str(tmp_path / "pool.png")])
    assert out is None and (tmp_path / "pool.png").stat().st_size > 1000


@pytest.mark.slow
def test_pool_config_with_a_reader_then_from_the_reply_cache(tiny, tmp_path):
    """A pool config runs the reader stage like a plain one: every (question, selector) answered and scored,
    accuracy per selector including ``none`` in the summary, and a rerun without the server from the cache."""
    import csv

    from cdsjax.eval.answer_scoring import EXTRACT_PROMPT
    from cdsjax.io.reading.prompt import SYSTEM_PROMPT
    from tests.scripted_server import OpenAIServer, message_text

    def respond(req):
        text = message_text(req)
        if req["messages"][0]["content"] == EXTRACT_PROMPT:
            return "Extracted answer: " + text.split("Reply: ", 1)[1].split(" [")[0]
        return "Not answerable" if "Evidence: none" in text else "x [1]"

    cache, out = tmp_path / "cache", tmp_path / "pool_reader"

    def run(url):
        config = pool_config(tiny, out, cache, "random")
        config.selectors = "cosine,none"
        config.reader.update(dict(url=url, model="test-model", max_retries=0))
        evaluate(config, progress=False, log=lambda s: None)
        answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
        with open(out / "summary.csv") as f:
            rows = {(r["selector"], r["metric"]): r for r in csv.DictReader(f)}
        return answers, rows

    with OpenAIServer(respond) as srv:
        answers, rows = run(srv.base_url)
        sent = [r for r in srv.requests if r["messages"][0]["content"] == SYSTEM_PROMPT]
    assert len(answers) == 4 * 2 and not any("error" in a for a in answers)
    assert 0 < len(sent) <= 8
    by = {(a["selector"], a["qid"]): a for a in answers}
    assert all(by[("cosine", q)]["metrics"]["accuracy"] == 1.0 for _, q in by if _ == "cosine")
    assert all(by[("none", q)]["metrics"]["accuracy"] == 0.0 for _, q in by if _ == "none")
    assert float(rows[("cosine", "accuracy@3")]["mean"]) == 1.0 and ("none", "accuracy@3") in rows
    assert ("cosine", "gold_doc_share@3") in rows
    again, rows_again = run("http://127.0.0.1:9/v1")
    assert all(a["cached"] for a in again) and [a["metrics"] for a in again] == [a["metrics"] for a in answers]
    assert rows_again[("none", "accuracy@3")]["mean"] == rows[("none", "accuracy@3")]["mean"]
