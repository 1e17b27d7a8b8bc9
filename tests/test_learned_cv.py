"""experiments/learned_cv.py: tasks split by document (no test document seen in fitting or tuning),
and the paired summary."""

import importlib
import sys

import ml_collections
import numpy as np
import pytest

from cdsjax.eval.pools import DocumentNotes
from cdsjax.io.datasets import Query


@pytest.fixture(scope="module")
def cv():
    sys.argv = sys.argv[:1]
    return importlib.import_module("experiments.learned_cv")


def _data(cv, name, num_docs, kind="pdf"):
    rng = np.random.default_rng(len(name))
    notes, queries = {}, []
    for i in range(num_docs):
        d = f"{name}-d{i}"
        z = rng.normal(size=(5, 4)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        notes[d] = DocumentNotes(z, np.zeros((5, 5), bool), [f"{d}#{j}" for j in range(5)], pages=[0, 0, 1, 1, 2],
                                 boxes=[(0, 0, 1, 1)] * 5, kinds=["text"] * 5)
        for k in range(2):
            queries.append(Query(f"{d}/q{k}", "?", None, (d,), gold_pages={d: frozenset({k})}))
    qemb = np.stack([notes[q.doc_ids[0]].embeddings[0] for q in queries])
    return cv.BenchmarkData(name, kind, queries, qemb, notes, (8, 16, 32))


def _config(**kw):
    c = ml_collections.ConfigDict(dict(folds=3, seed=0, pool_sizes=(1, 3), val_fraction=0.25, transfer=True,
                                       both=True))
    c.update(kw)
    return c


def test_tasks_never_show_a_test_document_to_fitting_or_tuning(cv):
    datas = {"a": _data(cv, "a", 12), "b": _data(cv, "b", 9)}
    tasks, split = cv.make_tasks(datas, _config())
    assert [t.name for t in tasks][:12] == ["cv"] * 12  # cross-validation first
    assert {t.name for t in tasks} == {"cv", "transfer", "both"}
    for t in tasks:
        test_docs = {d for ps in t.test.values() for p in ps for d in p.docs}
        seen = {d for p in t.train + t.val for d in p.docs}
        assert test_docs and seen and not test_docs & seen, t.label
        assert not {d for p in t.train for d in p.docs} & {d for p in t.val for d in p.docs}
        for ps in t.test.values():
            assert all(len(set(p.docs)) == t.pool_size for p in ps)
    # every question of a benchmark is tested exactly once per pool size in cross-validation
    for b, data in datas.items():
        tested = [p.query.qid for t in tasks if t.name == "cv" and t.pool_size == 1 for p in t.test.get(b, [])]
        assert sorted(tested) == sorted(q.qid for q in data.queries)
    assert sorted(d for f in split["a"] for d in f["test"]) == sorted(datas["a"].notes)


def test_summary_pairs_learned_with_each_selector(cv):
    recs = []
    for i in range(20):
        for sel, v, a in (("cosine", 0.5, 0.0), ("cds-learned", 0.5 + 0.25 * (i % 2), float(i % 4 == 0)),
                          ("mmr (tuned)", 1.0, 1.0)):
            recs.append(dict(task="cv", label="x/fold0", fold=i % 2, pool_size=1, benchmark="x", selector=sel,
                             budget=10, qid=f"q{i}", recall=v, has_answer=None if i >= 16 else a))
    summary = cv.summarize(recs, ml_collections.ConfigDict({"num_resamples": 200}))
    pairs = {p["against"]: p for p in summary["paired"] if p["metric"] == "recall"}
    assert pairs["cosine"]["better"] == 10 and pairs["cosine"]["tie"] == 10 and pairs["cosine"]["worse"] == 0
    assert pairs["cosine"]["mean"] == pytest.approx(0.125)
    assert pairs["mmr (tuned)"]["worse"] == 20 and pairs["mmr (tuned)"]["ci_high"] < 0
    assert "cds-learned" not in pairs
    folds = {(r["selector"], r["fold"]): r["mean"] for r in summary["per_fold"] if r["metric"] == "recall"}
    assert folds[("cds-learned", 1)] == pytest.approx(0.75) and folds[("cds-learned", 0)] == pytest.approx(0.5)
    # has-answer: only the 16 covered questions count (None is not covered); q0, q4, q8, q12 hold the answer
    answers = {p["against"]: p for p in summary["paired"] if p["metric"] == "has_answer"}
    rows = {(r["selector"], r["metric"]): r for r in summary["rows"]}
    assert rows[("cds-learned", "has_answer")]["n"] == 16 and rows[("cds-learned", "recall")]["n"] == 20
    assert rows[("cds-learned", "has_answer")]["mean"] == pytest.approx(0.25)
    assert answers["cosine"]["better"] == 4 and answers["cosine"]["tie"] == 12
    assert answers["mmr (tuned)"]["worse"] == 12 and answers["mmr (tuned)"]["mean"] == pytest.approx(-0.75)
    table = cv.tables(summary)
    assert "+0.125" in table and "10 / 10 / 0" in table and "has-answer@10" in table and "4 / 12 / 0" in table
    # records of a run before has-answer was scored still summarise (recall only)
    old = cv.summarize([{k: v for k, v in r.items() if k != "has_answer"} for r in recs],
                       ml_collections.ConfigDict({"num_resamples": 50}))
    assert {r["metric"] for r in old["rows"]} == {"recall"} and "+0.125" in cv.tables(old)


def test_runner_scores_recall_and_has_answer(cv):
    import types

    data = _data(cv, "a", 3)
    problems = cv._problems(data, list(data.notes), 1, 0)
    runner = cv.Runner({"a": data}, 8)
    sel = (None, None)
    calls = []

    def fake_run(fn, ps, **kw):
        calls.append(len(ps))
        return [types.SimpleNamespace(indices=np.asarray([0, 1]), selected_valid=np.asarray([True, False]))
                for _ in ps]

    import cdsjax.eval.run as run_module

    real = run_module.run_selector
    run_module.run_selector = fake_run
    try:
        rec, ans = runner.scores("x", sel, 2, problems)
        again = runner.recalls("x", sel, 2, problems, metric="has_answer")
    finally:
        run_module.run_selector = real
    assert calls == [len(problems)]  # solved once, both metrics remembered
    # note 0 is on page 0: the q0 questions (gold page 0) are found, the q1 ones are not
    assert rec.tolist() == [1.0 - (p.query.qid.endswith("q1")) for p in problems]
    assert np.isnan(ans).all() and np.isnan(again).all()  # no gold answers: not covered


def test_low_map_count_is_one_warning_line(tmp_path):
    from experiments.learned_cv import MIN_MAP_COUNT, warn_map_count

    lines = []
    (tmp_path / "low").write_text("65530\n")
    warn_map_count(str(tmp_path / "low"), log=lines.append)
    assert len(lines) == 1 and "vm.max_map_count is 65530" in lines[0]
    (tmp_path / "high").write_text(f"{MIN_MAP_COUNT}\n")
    warn_map_count(str(tmp_path / "high"), log=lines.append)
    warn_map_count(str(tmp_path / "missing"), log=lines.append)
    assert len(lines) == 1


def test_fit_pool_size_fits_on_the_same_training_documents_one_at_a_time(cv):
    datas = {"a": _data(cv, "a", 12), "b": _data(cv, "b", 9)}
    tasks, _ = cv.make_tasks(datas, _config(pool_sizes=(3,), fit_pool_size=1))
    for t in tasks:
        assert t.pool_size == 3 and t.fit_train is not None and t.fit_val is not None
        assert all(len(set(p.docs)) == 1 for p in t.fit_train + t.fit_val)
        assert {d for p in t.fit_train for d in p.docs} == {d for p in t.train for d in p.docs}, t.label
        assert {d for p in t.fit_val for d in p.docs} == {d for p in t.val for d in p.docs}, t.label
        test_docs = {d for ps in t.test.values() for p in ps for d in p.docs}
        assert not test_docs & {d for p in t.fit_train + t.fit_val for d in p.docs}
    same, _ = cv.make_tasks(datas, _config(pool_sizes=(3,)))
    assert all(t.fit_train is None and t.fit_val is None for t in same)


def test_a_pool_task_reuses_the_fit_of_its_fit_pool_size(cv, tmp_path):
    import json

    datas = {"a": _data(cv, "a", 12)}
    config = _config(pool_sizes=(3,), fit_pool_size=1, transfer=False, both=False, fits_from="")
    task = cv.make_tasks(datas, config)[0][0]
    assert cv.earlier_fit(task, config, {}, log=lambda s: None) is None
    entry = {cv.LEARNED: {"seconds": 3.0, "theta": {"beta": 0.2, "w_page": -1.0}}, "complete": True}
    theta, info = cv.earlier_fit(task, config, {f"{task.label}/pool1": entry}, log=lambda s: None)
    assert float(theta.beta) == 0.2 and float(theta.w_page) == -1.0 and info["reused"] == f"{task.label}/pool1"
    (tmp_path / "tuning.json").write_text(json.dumps({f"{task.label}/pool1": entry}))
    config.fits_from = str(tmp_path / "tuning.json")
    assert cv.earlier_fit(task, config, {}, log=lambda s: None)[1]["fit_pool_size"] == 1
    # an unfinished entry is not reused
    assert cv.earlier_fit(task, _config(pool_sizes=(3,), fit_pool_size=1, fits_from=""),
                          {f"{task.label}/pool1": {**entry, "complete": False}}, log=lambda s: None) is None


def test_the_game_fitted_through_the_page_readout_is_scored_as_its_own_selector(cv, monkeypatch):
    """``learned_selector="cds_learned_pages"`` with ``learn.readout="pages"``: the fit scores the read-out's
    pages, and the fitted game is tested and recorded as ``cds-learned-pages`` (the differences too)."""
    import io
    import json

    import cdsjax.learn as learn
    from configs.learned_cv import get_config

    seen = []
    real_fit = learn.fit

    def spy(train, val, options, log=print, objectives=None):
        seen.append(dict(options, objectives=objectives))
        return real_fit(train, val, options, log=log, objectives=objectives)

    monkeypatch.setattr(learn, "fit", spy)
    config = get_config()
    config.update(dict(folds=3, pool_sizes=(1,), transfer=False, both=False, budgets=(2,), fit_budget=2,
                       fixed_selectors="cosine_pages", mmr_lams=(0.5,), dpp_thetas=(1.0,), mmr_selector="mmr_pages",
                       dpp_selector="dpp_pages", learned_selector="cds_learned_pages", num_resamples=50))
    config.learn.update(dict(steps=1, num_starts_fitted=1, readout="pages", dtype="float32"))
    datas = {"a": _data(cv, "a", 9)}
    task = cv.make_tasks(datas, config)[0][0]
    out, tuning = io.StringIO(), {}
    runner = cv.Runner(datas, 8)
    cv.run_task(task, runner, config, out, tuning, log=lambda s: None)
    assert seen and seen[0]["readout"] == "pages"
    assert seen[0]["objectives"] is runner.objectives  # the tasks' fits share the runner's compiled objectives
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {r["selector"] for r in records} == {"cosine-pages", "mmr-pages (tuned)", "dpp-pages (tuned)",
                                                "cds-learned-pages"}
    assert "theta" in tuning[f"{task.label}/pool1"]["cds-learned-pages"]
    summary = cv.summarize(records, config)
    assert summary["learned"] == "cds-learned-pages"
    assert {p["against"] for p in summary["paired"]} == {"cosine-pages", "mmr-pages (tuned)", "dpp-pages (tuned)"}
    assert "cds-learned-pages minus it" in cv.tables(summary)
    table = cv.compact_table(summary, "recall", 2, 1).splitlines()
    assert table[0].startswith("| recall@2, pool 1 | cv: a (") and table[-1].startswith("| cds-learned-pages | **")
    assert len(table) == 2 + 4 and all(row.count("|") == table[0].count("|") for row in table)
