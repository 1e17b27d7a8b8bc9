"""The evaluation's reader stage, continued: the full-document control (own documents, context and image limits,
the count it logs), the summary with failed requests, seed spread and paired differences on hand-made answers,
the API key from the environment only, the per-request timeout, the progress bar, and a killed run that keeps
every finished reply."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

from cdsjax.eval import answer_evidence, reader_setup, reading
from cdsjax.eval.problems import Problem
from cdsjax.eval.report import markdown_table, summary_rows
from cdsjax.io.reading.reply_cache import ReplyCache
from cdsjax.io import datasets as D
from cdsjax.io.reading.judge import JUDGE_PROMPT
from cdsjax.io.reading.prompt import SYSTEM_PROMPT, EvidenceItem
from tests.scripted_server import OpenAIServer
from tests.conftest import ROOT
from tests.test_eval_reader import _config, _problems, _responder

BENCH = types.SimpleNamespace(name="synthetic")


def _ok_problems(n, n_notes=4):
    """``_problems`` without the questions the failing responder fails."""
    out = _problems(n, n_notes)
    for p in out:
        p.query = D.Query(qid=p.query.qid, question=p.query.question.replace("fail", ""), answer=p.query.answer,
                          doc_ids=("c",))
    return out


# ---- the full-document control -------------------------------------------------------------------------------

def _pool_problem(qid, own_chars, other_chars):
    """A pool of two documents: the question's own (``own``, 3 notes) and a distractor (``other``, 2 notes)."""
    z = np.eye(5, 8, dtype=np.float32)
    q = D.Query(qid=qid, question=f"What is in {qid}?", answer="x", doc_ids=("own",))
    docs = ["other", "own", "own", "other", "own"]
    texts = [("o" if d == "other" else "w") * (other_chars if d == "other" else own_chars) for d in docs]
    return Problem(q, z, z[0].copy(), np.zeros((5, 5), bool), [f"{d}#{qid}{i}" for i, d in enumerate(docs)], docs,
                   texts=texts, pool=("own", "other"), gold_docs=("own",))


def test_full_control_sends_the_own_documents_where_they_fit(tmp_path):
    small, big = _pool_problem("small", 100, 3000), _pool_problem("big", 1400, 100)
    assert answer_evidence.full_document_ids(small) == ["own#small1", "own#small2", "own#small4"]
    single = _problems(1)[0]  # no own documents named: every note of the problem
    assert answer_evidence.full_document_ids(single) == single.note_ids
    logs = []
    with OpenAIServer(_responder()) as srv:
        # big: 3 own notes of 1400 characters (1400 tokens) + prompt 1500 + max_tokens 64 exceed 2500; small's own
        # notes fit (1664 tokens), its distractor notes (2000 tokens more) would not
        config = _config(srv.base_url, tmp_path, max_context=2500, max_tokens=64)
        config.selectors = "full"
        answers = reading.read_answers(config, BENCH, "text", [small, big], [], tmp_path, progress=False,
                                       log=logs.append)
    assert [a["qid"] for a in answers] == ["small"] and answers[0]["evidence"] == ["own#small1", "own#small2", "own#small4"]
    assert any("full-document control: 1 of 2 (question, budget) pairs fit config.reader.max_context=2500"
               in line for line in logs), logs


def test_fits_reader_counts_tokens_and_images(tmp_path):
    png = tmp_path / "crop.png"
    png.write_bytes(b"png")
    text = [EvidenceItem(note_id=f"d#{i}", doc_id="d", page=0, text="x" * 350) for i in range(3)]  # 100 tokens each
    figs = [EvidenceItem(note_id=f"d#f{i}", doc_id="d", page=0, kind="figure", image_path=str(png))
            for i in range(3)]
    kw = dict(max_tokens=100, max_text_chars=1500)
    # 3 x 100 + 1500 (prompt) + 100 = 1900 tokens
    assert answer_evidence.fits_reader(text, max_context=1900, max_images=0, **kw)
    assert not answer_evidence.fits_reader(text, max_context=1899, max_images=0, **kw)
    # a figure with a crop costs 1500 tokens; more images than max_images never fits
    assert answer_evidence.fits_reader(figs, max_context=100_000, max_images=3, **kw)
    assert not answer_evidence.fits_reader(figs, max_context=100_000, max_images=2, **kw)
    assert not answer_evidence.fits_reader(figs, max_context=1500 * 3 + 1500 + 99, max_images=0, **kw)


# ---- summaries: failures apart, seeds, paired differences ----------------------------------------------------

@pytest.mark.slow
def test_summary_leaves_failures_out_of_accuracy_and_reports_them(tmp_path):
    problems = _problems()  # questions 1, 3, 5 fail on the server
    records = [{"benchmark": "synthetic", "selector": "cosine", "budget": 2, "qid": p.query.qid,
                "selected": p.note_ids[:2], "metrics": {"num_selected": 2.0}} for p in problems]
    with OpenAIServer(_responder(fail_on="fail")) as srv:
        answers = reading.read_answers(_config(srv.base_url, tmp_path), BENCH, "text", problems, records,
                                       tmp_path, progress=False, log=lambda s: None)
    merged = reading.with_answer_metrics(records, answers)
    rows = {(r["selector"], r["metric"]): r for r in summary_rows(merged, reading.ANSWER_METRICS,
                                                                    num_resamples=200)}
    acc, err = rows[("cosine", "accuracy@2")], rows[("cosine", "reader_error@2")]
    assert acc["n"] == 3 and acc["mean"] == 1.0  # the three answered, all right; the failures are not zeros
    assert err["n"] == 6 and err["mean"] == 0.5
    assert rows[("none", "accuracy@2")]["n"] == 3 and rows[("none", "reader_error@2")]["mean"] == 0.5


def _answer(sel, qid, seed, acc):
    return {"benchmark": "b", "selector": sel, "budget": 3, "qid": qid, "seed": seed,
            "metrics": {"accuracy": acc, "answer_f1": None, "reader_error": 0.0 if acc is not None else 1.0}}


def test_seed_spread_and_paired_differences_on_hand_made_answers():
    answers = []
    for seed, right in ((0, (1, 1, 0, 0)), (1, (1, 0, 0, 0))):
        answers += [_answer("cds", f"q{i}", seed, float(v)) for i, v in enumerate(right)]
        answers += [_answer("cosine", f"q{i}", seed, 0.0) for i in range(4)]
        answers += [_answer("none", f"q{i}", seed, 0.0 if i else 1.0) for i in range(4)]
    answers.append(_answer("cds", "q4", 0, None))  # a failed request: in no mean, in no difference
    rows = {(r["selector"], r["metric"]): r for r in reading.answer_rows(answers, num_resamples=500)}
    mean, std = rows[("cds", "accuracy_seed_mean@3")], rows[("cds", "accuracy_seed_std@3")]
    assert mean["mean"] == pytest.approx(0.375) and mean["n"] == 2
    assert std["mean"] == pytest.approx(np.std([0.5, 0.25], ddof=1))
    vs_cos, vs_none = rows[("cds", "accuracy_vs_cosine@3")], rows[("cds", "accuracy_vs_none@3")]
    # per question, cds averages over seeds to (1, .5, 0, 0); cosine is 0; none is (1, 0, 0, 0)
    assert vs_cos["n"] == 4 and vs_cos["mean"] == pytest.approx(0.375)
    assert vs_none["n"] == 4 and vs_none["mean"] == pytest.approx(0.125)
    assert (vs_cos["wins"], vs_cos["ties"], vs_cos["losses"]) == (2, 2, 0)  # reader mode has W/T/L too
    assert (vs_none["wins"], vs_none["ties"], vs_none["losses"]) == (1, 3, 0)
    for r in (vs_cos, vs_none):
        assert r["ci_low"] <= r["mean"] <= r["ci_high"] and r["ci_low"] < r["ci_high"]
    assert ("cosine", "accuracy_vs_cosine@3") not in rows and ("none", "accuracy_vs_none@3") not in rows
    assert rows[("none", "accuracy_vs_cosine@3")]["mean"] == pytest.approx(0.25)
    table = markdown_table(list(rows.values()))  # the spread over seeds has no interval: the number alone
    assert "| 0.375 | 0.177 |" in table and "nan" not in table, table


def test_selectors_that_agree_share_one_request_even_at_once(tmp_path):
    problems = _ok_problems(4)
    records = [{"benchmark": "synthetic", "selector": sel, "budget": 2, "qid": p.query.qid,
                "selected": p.note_ids[:2], "metrics": {}} for sel in ("cosine", "cds", "mmr") for p in problems]
    with OpenAIServer(_responder(), delay=0.2) as srv:  # all twelve are in flight together
        config = _config(srv.base_url, tmp_path, concurrency=12)
        config.selectors = "cosine,cds,mmr"
        answers = reading.read_answers(config, BENCH, "text", problems, records, tmp_path, progress=False,
                                       log=lambda s: None)
        reader = [r for r in srv.requests if r["messages"][0]["content"] == SYSTEM_PROMPT]
        judge = [r for r in srv.requests if r["messages"][0]["content"] == JUDGE_PROMPT]
    assert len(answers) == 12 and not any("error" in a for a in answers)
    assert len(reader) == 4 and len(judge) == 4  # one per question, not one per selector
    assert sum(not a["cached"] for a in answers) == 4


def test_get_or_fetch_after_a_failed_fetch_fetches_again(tmp_path):
    cache, calls, started = ReplyCache(tmp_path), [], threading.Event()

    def failing():
        calls.append("fail")
        started.set()
        time.sleep(0.2)
        raise RuntimeError("server down")

    def second():
        started.wait(5)
        out["second"] = cache.get_or_fetch("k", lambda: calls.append("ok") or {"text": "x"})

    out = {}
    waiter = threading.Thread(target=second)
    waiter.start()
    with pytest.raises(RuntimeError, match="server down"):
        cache.get_or_fetch("k", failing)
    waiter.join(5)
    assert calls == ["fail", "ok"] and out["second"] == ({"text": "x"}, False)
    assert cache.get_or_fetch("k", failing) == ({"text": "x"}, True)


# ---- key, timeout, progress ----------------------------------------------------------------------------------

def test_api_key_comes_from_the_environment_only(tmp_path, monkeypatch):
    assert not any("key" in name for name in reader_setup.reader_settings())
    assert not any("key" in name for name in reader_setup.judge_settings())
    monkeypatch.setenv("CDSJAX_READER_API_KEY", "sk-from-env-123")
    with OpenAIServer(_responder()) as srv:
        config = _config(srv.base_url, tmp_path)
        reading.read_answers(config, BENCH, "text", _ok_problems(2), [], tmp_path, progress=False,
                             log=lambda s: None)
        auth = {h.get("authorization") for h in srv.headers}
    assert auth == {"Bearer sk-from-env-123"}  # the reader's and the judge's requests
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert "sk-from-env-123" not in path.read_text(errors="replace"), path


def test_a_slow_reply_times_out_and_is_recorded(tmp_path):
    with OpenAIServer(_responder(), delay=2.0) as srv:
        config = _config(srv.base_url, tmp_path, timeout=0.3)
        config.selectors = "none"
        t0 = time.perf_counter()
        answers = reading.read_answers(config, BENCH, "text", _ok_problems(2), [], tmp_path, progress=False,
                                       log=lambda s: None)
        elapsed = time.perf_counter() - t0
    assert elapsed < 1.5, elapsed
    assert [a["error"]["kind"] for a in answers] == ["timeout", "timeout"]
    assert all(a["metrics"]["accuracy"] is None for a in answers)


def test_progress_bar_shows_the_answers(tmp_path, capsys):
    with OpenAIServer(_responder()) as srv:
        config = _config(srv.base_url, tmp_path)
        config.selectors = "none"
        reading.read_answers(config, BENCH, "text", _ok_problems(3), [], tmp_path, progress=True,
                             log=lambda s: None)
        assert "read synthetic" in capsys.readouterr().err
        reading.read_answers(config, BENCH, "text", _ok_problems(3), [], tmp_path, progress=False,
                             log=lambda s: None)
        assert "read synthetic" not in capsys.readouterr().err


# ---- a killed run ----------------------------------------------------------------------------------------------

CHILD = """
import pathlib, sys, types
from cdsjax.eval import answer_evidence, reader_setup, reading
from tests.test_eval_reader_controls import _ok_problems
from tests.test_eval_reader import _config
out = pathlib.Path(sys.argv[2])
config = _config(sys.argv[1], out, concurrency=1)
config.selectors = "none"
reading.read_answers(config, types.SimpleNamespace(name="synthetic"), "text", _ok_problems(4), [], out,
                     progress=False, log=print)
"""


@pytest.mark.slow
def test_a_killed_run_keeps_every_finished_reply(tmp_path):
    release = threading.Event()
    inner = _responder()

    def respond(req):  # two questions (reader + judge each) are answered, then the server hangs
        if len(srv.requests) > 4:
            release.wait(30)
        return inner(req)

    with OpenAIServer(respond) as srv:
        env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
        child = subprocess.Popen([sys.executable, "-c", CHILD, srv.base_url, str(tmp_path)], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while len(srv.requests) < 5 and time.time() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert len(srv.requests) == 5, child.stderr.read().decode()[-2000:] if child.poll() is not None else ""
        time.sleep(0.2)  # the fourth reply's line is written before the fifth request goes out
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert not (tmp_path / reading.ANSWERS_FILE).exists()  # the run did not finish
        assert len(ReplyCache(tmp_path / "replies")) == 4
        release.set()
        sent = len(srv.requests)
        config = _config(srv.base_url, tmp_path)
        config.selectors = "none"
        answers = reading.read_answers(config, BENCH, "text", _ok_problems(4), [], tmp_path, progress=False,
                                       log=lambda s: None)
        assert len(srv.requests) - sent == 4  # only the two unfinished questions are asked (and judged)
    assert [a["cached"] for a in answers] == [True, True, False, False]


# ---- a pool config end to end ------------------------------------------------------------------------------------

@pytest.mark.slow  # embeds three papers: about 20 s
def test_qasper_pool_with_a_reader(data_root, tmp_path):
    import importlib

    from cdsjax.eval import evaluate
    from tests.test_eval_reader import _answers, _summary

    config = importlib.import_module("configs.qasper_pool").get_config()
    config.update(dict(data_root=str(data_root), output_dir=str(tmp_path / "pool"), cache_dir=str(tmp_path / "c"),
                       selectors="cosine,none,full", budgets=(3,), max_queries=2, pool_size=2, num_resamples=200))
    config.loader.max_papers = 3
    config.reader.update(dict(model="test-model", max_retries=0, max_context=200_000))
    with OpenAIServer(_responder()) as srv:
        config.reader.url = srv.base_url
        evaluate(config, progress=False, log=lambda s: None)
    answers = _answers(tmp_path / "pool")
    assert len(answers) == 2 * 3 and not any("error" in a for a in answers)
    assert all(a["metrics"]["accuracy"] in (0.0, 1.0) for a in answers)
    records = {r["qid"]: r for r in map(json.loads, (tmp_path / "pool" / "records.jsonl").read_text().splitlines())}
    full = [a for a in answers if a["selector"] == "full"]
    assert len(full) == 2
    for a in full:  # the question's own paper only, not the pool's distractor
        rec = records[a["qid"]]
        docs = {e.split("/")[0] for e in a["evidence"]}
        assert len(rec["pool_documents"]) == 2 and len(docs) == 1 and docs <= set(rec["pool_documents"])
        assert len(a["evidence"]) < rec["num_notes"]
    rows = _summary(tmp_path / "pool")
    for sel in ("cosine", "none", "full"):
        assert (sel, "accuracy@3") in rows
    assert ("cosine", "gold_doc_hit@3") in rows and ("full", "accuracy_vs_none@3") in rows


@pytest.mark.slow  # parses two PDFs: about 30 s
def test_visdom_config_with_a_reader(tmp_path):
    """configs/visdom.py on a two-document subset: judged accuracy per selector, ``full`` sending both of the
    question's documents (VisDoM gives each question its set), images of visual notes sent."""
    import csv
    import importlib
    import shutil

    from cdsjax.eval import evaluate
    from tests.scripted_server import message_images
    from tests.conftest import DATA
    from tests.test_eval_reader import _answers, _summary, _tiny_mmlongbench

    _tiny_mmlongbench(tmp_path / "src")
    sub = tmp_path / "data" / "visdom" / "tiny"
    (sub / "docs").mkdir(parents=True)
    shutil.copy(tmp_path / "src" / "mmlongbench" / "documents" / "orchard.pdf", sub / "docs" / "orchard.pdf")
    shutil.copy(DATA / "pdfs" / "multicolumn.pdf", sub / "docs" / "multi.pdf")
    rows = [{"q_id": "q1", "question": "How much did apple sales earn in 2019?", "answer": "4.2 million euros",
             "documents": "['orchard.pdf', 'multi.pdf']", "doc_path": "docs/orchard.pdf"},
            {"q_id": "q2", "question": "Who is the cooperative's CEO?", "answer": "Anna Berg",
             "documents": "['orchard.pdf', 'multi.pdf']", "doc_path": "orchard.pdf"}]
    with open(sub / "tiny.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    config = importlib.import_module("configs.visdom").get_config("tiny")
    config.update(dict(data_root=str(tmp_path / "data"), output_dir=str(tmp_path / "out"),
                       cache_dir=str(tmp_path / "cache"), selectors="cosine,none,full", budgets=(2,),
                       num_resamples=200))
    config.reader.update(dict(model="test-model", max_retries=0, max_context=100_000))
    with OpenAIServer(_responder()) as srv:
        config.reader.url = srv.base_url
        evaluate(config, progress=False, log=lambda s: None)
        sent = list(srv.requests)
    answers = {(a["selector"], a["qid"]): a for a in _answers(tmp_path / "out")}
    assert len(answers) == 6 and not any("error" in a for a in answers.values())
    assert answers[("cosine", "q1")]["metrics"]["accuracy"] == 1.0  # the judge: "4.2 million euros" is in it
    assert answers[("none", "q1")]["metrics"]["accuracy"] == 0.0
    assert {e.split("#")[0] for e in answers[("full", "q2")]["evidence"]} == {"orchard", "multi"}
    assert answers[("full", "q2")]["images"] >= 1 and any(message_images(r) for r in sent)
    summary = _summary(tmp_path / "out")
    assert summary[("cosine", "accuracy@2")]["n"] == "2" and ("none", "accuracy@2") in summary
    assert ("cosine", "page_recall@2") in summary and ("full", "accuracy_vs_none@2") in summary
