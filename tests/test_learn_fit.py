"""Fitting the learned game: the fit improves its surrogate, an interrupted fit resumes to the same
parameters, the parameter file round-trips and rejects bad files with one line, the split is by document."""

import json

import numpy as np
import pytest

from cdsjax.core.games.learned import LearnedParams
from cdsjax.learn import FitConfig, Objectives, fit, load_params, save_params, split_by_document
from cdsjax.learn.data import Example, make_batches


def synthetic(seed, n=12, d=8, group=None):
    """A question whose gold notes are near the query but also near each other (a redundant cluster)."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=d)
    q /= np.linalg.norm(q)
    z = rng.normal(size=(n, d))
    z[:4] = q + 0.6 * rng.normal(size=(4, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    units = np.zeros((2, n), bool)
    units[0, [0, 1]] = True
    units[1, [2]] = True
    pages = np.arange(n) // 2
    return Example(qid=f"q{seed}", group=group or f"doc{seed % 4}", notes=z.astype(np.float32),
                   query=q.astype(np.float32), links=np.zeros((n, n), bool), pages=pages.astype(np.int32),
                   doc_ids=np.zeros(n, np.int32), kinds=np.zeros(n, np.int32), units=units,
                   unit_valid=np.ones(2, bool))


CFG = dict(budget=2, steps=4, learning_rate=0.1, starts=[{"beta": 0.3}, {"beta": 1.0}], num_starts_fitted=1,
           patience=10, dtype="float32", buckets=[16], progress=False, tol=1e-6)
OBJECTIVES = Objectives()  # the fits here share their compiled objectives, as the folds of a cross-validation do


def test_fit_records_history_and_resumes_to_the_same_parameters(tmp_path):
    train = [synthetic(s) for s in range(6)]
    val = [synthetic(s) for s in range(6, 9)]
    lines = []
    full = fit(train, val, CFG, log=lines.append, objectives=OBJECTIVES)
    assert full.finished and len(full.history) == 4
    steps = [line for line in lines if " step " in line]  # no bar (progress off): the Adam steps in the log
    assert len(steps) == 4 and "step 4 of 4" in steps[-1] and "validation surrogate" in steps[-1], lines
    assert {"train_surrogate", "val_surrogate", "val_recall", "theta"} <= set(full.history[0])
    assert len(full.grid) == 2 and full.seconds > 0
    assert full.theta.to_dict() != LearnedParams.paper().to_dict()

    ckpt = str(tmp_path / "ckpt")
    part = fit(train, val, {**CFG, "checkpoint_dir": ckpt, "stop_after": 2}, log=lambda s: None, objectives=OBJECTIVES)
    assert not part.finished and len(part.history) == 2
    rest = fit(train, val, {**CFG, "checkpoint_dir": ckpt}, log=lambda s: None, objectives=OBJECTIVES)
    assert rest.finished and len(rest.history) == 4
    assert rest.theta.to_dict() == full.theta.to_dict()
    assert [h["train_surrogate"] for h in rest.history] == [h["train_surrogate"] for h in full.history]
    with pytest.raises(ValueError, match="other data or settings"):
        fit(train[:-1], val, {**CFG, "checkpoint_dir": ckpt}, log=lambda s: None, objectives=OBJECTIVES)
    # one compiled objective per setting in the Objectives the fits were given, none kept beyond it
    cfg = FitConfig.from_mapping(CFG)
    assert OBJECTIVES(cfg) is OBJECTIVES(FitConfig.from_mapping({**CFG, "checkpoint_dir": ckpt, "steps": 9}))
    assert Objectives()(cfg) is not OBJECTIVES(cfg)
    assert OBJECTIVES(cfg) is not OBJECTIVES(FitConfig.from_mapping({**CFG, "budget": 3}))


def test_fit_config_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown fit option"):
        FitConfig.from_mapping({"stepz": 3})
    with pytest.raises(ValueError, match="unknown learned parameter"):
        FitConfig.from_mapping({"starts": [{"gamma": 1.0}]})


def test_params_file_round_trip_and_bad_files(tmp_path):
    theta = LearnedParams(beta=0.25, w_page=-0.1)
    path = save_params(tmp_path / "p.json", theta, {"data": "synthetic"})
    got, prov = load_params(path)
    assert got.to_dict() == theta.to_dict() and prov == {"data": "synthetic"}
    with pytest.raises(ValueError, match="does not exist"):
        load_params(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_params(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"beta": 1}))
    with pytest.raises(ValueError, match="not a learned parameter file"):
        load_params(tmp_path / "other.json")
    body = json.loads(path.read_text())
    body["theta"]["beta"] = "high"
    (tmp_path / "badval.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match="finite number"):
        load_params(tmp_path / "badval.json")


def test_shipped_params_load():
    theta, prov = load_params()
    assert isinstance(theta, LearnedParams) and "data" in prov


def test_split_is_by_document_and_batches_pad():
    examples = [synthetic(s, group=f"doc{s // 3}") for s in range(12)]
    train, val, docs = split_by_document(examples, 0.25, seed=0)
    assert not set(docs["train"]) & set(docs["val"]) and len(docs["val"]) == 1
    assert {e.group for e in val} == set(docs["val"]) and len(train) + len(val) == 12
    assert split_by_document(examples, 0.25, seed=0)[2] == docs
    batches = make_batches(train, buckets=[16], max_batch=4)
    assert sum(b.count for b in batches) == len(train)
    b = batches[-1]
    assert b.arrays["notes"].shape[1] == 16 and not b.arrays["valid"][:, 12:].any()
    assert b.weight.sum() == b.count


def test_balance_gives_each_benchmark_the_same_weight_in_the_fit_means():
    """Balanced, a group of 1 question weighs as much as a group of 3: the fit's means are the mean of the group
    means (checked on the surrogate the fit reports)."""
    from cdsjax.learn.data import balance
    from cdsjax.learn.objective import Objective

    a = [synthetic(0, group="A:x")]
    b = [synthetic(s, group="B:y") for s in (1, 2, 3)]
    weights = balance(a + b, lambda e: e.group.split(":")[0])
    assert weights == pytest.approx({"A": 2.0, "B": 2.0 / 3.0})
    assert np.mean([e.weight for e in a + b]) == pytest.approx(1.0)
    cfg = FitConfig.from_mapping(CFG)
    objective = Objective(cfg)
    theta = LearnedParams(beta=0.3)
    whole, _ = objective.measure(theta, make_batches(a + b, buckets=[16]), with_grad=False)
    per = [objective.measure(theta, make_batches([e], buckets=[16]), with_grad=False)[0]["surrogate"] for e in a + b]
    assert whole["surrogate"] == pytest.approx(0.5 * per[0] + 0.5 * np.mean(per[1:]), rel=1e-5)
    for e in a + b:
        e.weight = 1.0
    plain, _ = objective.measure(theta, make_batches(a + b, buckets=[16]), with_grad=False)
    assert plain["surrogate"] == pytest.approx(np.mean(per), rel=1e-5)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_page_readout_scores_give_the_page_recall_of_the_one_note_per_page_readout():
    """The top-B of ``page_readout_scores`` are the pages the one-note-per-page read-out picks: their hard recall
    equals the page recall of ``structured_readout`` (k = 1) on the same ranking, padding included."""
    import jax.numpy as jnp

    from cdsjax.core.surrogates import hard_recall, page_readout_scores
    from cdsjax.core.readouts import structured_readout

    rng = np.random.default_rng(0)
    for trial in range(20):
        n, pad, budget = int(rng.integers(12, 30)), 5, int(rng.integers(1, 6))
        docs = rng.integers(0, 2, n)
        pages = rng.integers(0, 8, n)
        scores = rng.normal(size=n)
        gold = sorted({(int(d), int(p)) for d, p in zip(docs[:3], pages[:3])} | {(1, 9)})  # (1, 9): a page without notes
        units = np.array([(docs == d) & (pages == p) for d, p in gold])
        # padded: -inf scores and unknown pages at the end
        s_pad = np.concatenate([scores, np.full(pad, -np.inf)])
        pages_pad = np.concatenate([pages, np.full(pad, -1)])
        docs_pad = np.concatenate([docs, np.full(pad, -1)])
        units_pad = np.concatenate([units, np.zeros((len(gold), pad), bool)], axis=1)
        got = float(hard_recall(page_readout_scores(jnp.asarray(s_pad), pages_pad, docs_pad), units_pad,
                                budget=budget, threshold=-jnp.inf, unit_valid=np.ones(len(gold), bool)))
        rank = np.argsort(np.argsort(-scores))
        valid = np.ones(n, bool)
        idx, ok = structured_readout(jnp.asarray(rank), jnp.asarray(valid), jnp.asarray(pages), budget=budget, k=1,
                                     doc_ids=jnp.asarray(docs))
        picked = {(int(docs[i]), int(pages[i])) for i, o in zip(np.asarray(idx), np.asarray(ok)) if o}
        want = sum(g in picked for g in gold) / len(gold)
        assert got == pytest.approx(want), (trial, got, want)


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
def test_page_readout_surrogate_is_finite_on_documents_of_at_most_b_pages():
    """A document with no more pages than the budget: the read-out reads every page, so the surrogate is the hard
    recall (each gold page with a note covered) and neither it nor its gradient is NaN (the fit's first run on
    the dev PDFs gave a NaN surrogate at every grid point: the soft cut was -inf and its scale infinite)."""
    import jax
    import jax.numpy as jnp

    from cdsjax.core.surrogates import hard_recall, page_readout_scores, soft_recall

    scores = jnp.asarray([0.3, 0.1, 0.5, 0.2, 0.05, 0.4, -jnp.inf, -jnp.inf])
    pages = np.array([0, 0, 1, 1, 2, 2, -1, -1])
    units = np.array([pages == 1, pages == 4])  # page 4 holds no note: a gold page no selection can cover
    valid = np.ones(2, bool)

    def surrogate(s):
        return soft_recall(page_readout_scores(s, pages), units, budget=5, threshold=-jnp.inf, unit_valid=valid)

    value, grad = jax.value_and_grad(surrogate)(scores)
    hard = hard_recall(page_readout_scores(scores, pages), units, budget=5, threshold=-jnp.inf, unit_valid=valid)
    assert float(value) == pytest.approx(float(hard)) == 0.5
    assert np.all(np.isfinite(np.asarray(grad)[:6]))
    # with a cut (more pages than B) the surrogate stays strictly between the misses and the hits
    assert 0.0 < float(soft_recall(page_readout_scores(scores, pages), units, budget=2, threshold=-jnp.inf,
                                   unit_valid=valid)) < 0.5


@pytest.mark.slow  # duplicate coverage; `make test-all` runs it
@pytest.mark.x64
def test_page_readout_surrogate_gradient_matches_finite_differences():
    """The fit's surrogate for the page read-out is differentiable through the equilibrium: its gradient in
    every parameter matches central finite differences (float64)."""
    import jax.numpy as jnp

    from cdsjax.learn.objective import Objective

    cfg = FitConfig.from_mapping({**CFG, "dtype": "float64", "readout": "pages", "tol": 1e-12})
    objective = Objective(cfg)
    (batch,) = make_batches([synthetic(s, n=14) for s in range(3)], buckets=[16])
    arrays = {k: (jnp.asarray(v, jnp.float64) if np.asarray(v).dtype == np.float32 else v)
              for k, v in batch.arrays.items()}
    theta = LearnedParams(beta=0.4, alpha_factor=1.2, tau=0.1, gate=0.4, log_gate_temperature=np.log(0.1),
                          sharpness=1.5, rel_repulsion=0.5, w_page=-0.3, w_doc=0.05, w_link=0.1, w_same_kind=-0.05,
                          w_text_visual=0.08).astype(jnp.float64)  # every parameter inside its bounds
    (value, _), grad = objective.value_and_grad(theta, arrays, batch.weight, 2)
    h = 1e-6
    moved = 0
    for name in LearnedParams.names():
        plus, _ = objective.value(theta.replace(**{name: getattr(theta, name) + h}), arrays, batch.weight, 2)
        minus, _ = objective.value(theta.replace(**{name: getattr(theta, name) - h}), arrays, batch.weight, 2)
        fd = float(plus - minus) / (2 * h)
        g = float(getattr(grad, name))
        assert abs(g - fd) <= 1e-5 + 1e-3 * abs(fd), (name, g, fd)
        moved += abs(g) > 1e-4
    assert np.isfinite(float(value)) and moved  # not vacuous: the surrogate moves with some parameter


@pytest.mark.slow
def test_fit_through_the_page_readout_runs_and_rejects_unknown_readouts():
    train = [synthetic(s) for s in range(6)]
    val = [synthetic(s) for s in range(6, 9)]
    result = fit(train, val, {**CFG, "readout": "pages"}, log=lambda s: None, objectives=OBJECTIVES)
    assert result.finished and len(result.history) == 4
    top = fit(train, val, CFG, log=lambda s: None, objectives=OBJECTIVES)
    assert result.grid[0]["train_surrogate"] != top.grid[0]["train_surrogate"]  # another objective
    with pytest.raises(ValueError, match="readout must be one of"):
        FitConfig.from_mapping({"readout": "page"})


def test_frozen_parameters_stay_at_the_paper_value():
    """``frozen``: the parameter never moves (zero gradient for Adam) and the grid skips starts that set it, so a
    fit can keep the note block question-free (rel_repulsion 0: a served corpus shares one block)."""
    train = [synthetic(s) for s in range(6)]
    val = [synthetic(s) for s in range(6, 9)]
    starts = [{"beta": 0.3}, {"beta": 0.3, "rel_repulsion": 1.0}, {"beta": 1.0}]
    free = fit(train, val, {**CFG, "starts": starts, "num_starts_fitted": 2}, log=lambda s: None, objectives=OBJECTIVES)
    held = fit(train, val, {**CFG, "starts": starts, "num_starts_fitted": 2, "frozen": ["rel_repulsion"]},
               log=lambda s: None, objectives=OBJECTIVES)
    assert [g["start"] for g in held.grid] == [0, 2] and len(free.grid) == 3
    assert all(h["theta"]["rel_repulsion"] == 0.0 for h in held.history) and len(held.history) > 1
    assert any(h["theta"]["rel_repulsion"] != 0.0 for h in free.history)  # not vacuous: free, it moves
    assert float(held.theta.rel_repulsion) == 0.0
    with pytest.raises(ValueError, match="unknown parameter"):
        FitConfig.from_mapping({"frozen": ["rel_repulsoin"]})
    with pytest.raises(ValueError, match="every grid start"):
        FitConfig.from_mapping({"frozen": ["beta"], "starts": [{"beta": 0.3}]})

