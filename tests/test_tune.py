"""`cdsjax tune` on the small config, and the cds-learned selector in the registry, the Pipeline and the CLI
(the shipped parameter file, --params, and one clear line for a missing or malformed file)."""

import json
import pathlib

import jax
import numpy as np
import pytest

from cdsjax import core
from cdsjax.cli import main
from cdsjax.core.games.learned import LearnedParams
from cdsjax.learn import default_params, load_params, resolve_params, save_params
from cdsjax.pipeline.catalog import display, selector_spec
from cdsjax.pipeline.selection import resolve_options, resolve_selector, selector_key


def cds_learned(z, q, valid, theta, budget, **structure):
    """The learned game through the one entry point (what the cds-learned selector runs)."""
    problem = core.CDSProblem.create(z, q, valid, **structure)
    return core.cds(problem, core.Single(), theta, core.SolveOptions(solver=core.ActiveSet()), budget=budget)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tune_small_config_writes_a_params_file(data_root, tmp_path, capsys):
    out = tmp_path / "params.json"
    rc = main(["tune", "--config", str(ROOT / "configs/tune/small.py"), f"--config.output={out}",
               f"--config.cache_dirs.qasper={tmp_path / 'cache'}", "--config.fit.steps=2", "--no-progress",
               f"--config.data_root={data_root}"])
    assert rc == 0
    theta, prov = load_params(out)
    assert isinstance(theta, LearnedParams)
    docs = prov["split"]["documents"]["qasper"]
    assert docs["train"] and docs["val"] and not set(docs["train"]) & set(docs["val"])
    assert prov["split"]["by"] == "document" and len(prov["history"]) == 2
    assert {"train", "val", "paper_theta0"} <= set(prov["figures"]) and prov["figures"]["val"]["recall"] is not None
    assert prov["code_version"] and prov["fit_seconds"] > 0 and prov["data"]["qasper"]["questions_with_gold"] > 0
    # a second run finds the finished checkpoint and writes the same parameters
    rc = main(["tune", "--config", str(ROOT / "configs/tune/small.py"), f"--config.output={out}",
               f"--config.cache_dirs.qasper={tmp_path / 'cache'}", "--config.fit.steps=2", "--no-progress",
               f"--config.data_root={data_root}"])
    assert rc == 0 and load_params(out)[0].to_dict() == theta.to_dict()
    assert "already finished" in capsys.readouterr().err


def test_tune_bad_config_is_one_line(tmp_path, capsys):
    rc = main(["tune", "--config", str(tmp_path / "nope.py")])
    assert rc == 2 and "no such config file" in capsys.readouterr().err


def problem(n=20, d=8, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    q = z[0] + 0.3 * rng.normal(size=d)
    return z.astype(np.float32), (q / np.linalg.norm(q)).astype(np.float32)


@pytest.mark.slow
def test_registry_cds_learned_at_theta0_is_converged_cds_and_files_are_read_at_the_edge(tmp_path):
    z, q = problem()
    valid = np.ones(len(z), bool)
    prob = core.CDSProblem.create(z, q, valid)
    learned = core.make_selector("cds_learned", budget=5, params=LearnedParams.paper())
    converged = core.make_selector("cds_converged", budget=5)
    a, b = jax.jit(learned)(prob), jax.jit(converged)(prob)
    np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
    assert selector_spec("cds-learned").name == "cds_learned" and display("cds_learned") == "cds-learned"
    spec, shipped = resolve_selector("cds_learned", 5)  # the edge supplies the packaged fit
    assert spec.learned and spec.structure and spec.pages_only
    assert np.asarray(shipped(prob).selected_valid).all()
    assert default_params() is default_params() is resolve_params(None)  # read once per process
    theta = LearnedParams(beta=0.2, w_page=-0.3)
    path = save_params(tmp_path / "p.json", theta, {"data": "test"})
    pages = np.arange(len(z)) // 2
    _, fn = resolve_selector("cds_learned", 5, {"params": str(path)})
    got = fn(core.CDSProblem.create(z, q, valid, pages=pages))
    want = cds_learned(z, q, valid, theta, 5, pages=pages)
    np.testing.assert_array_equal(np.asarray(got.indices), np.asarray(want.indices))
    # compiled selectors are named by the parameters' content, not by the file
    copy = save_params(tmp_path / "other.json", theta, {"data": "elsewhere"})
    assert selector_key("cds-learned", 5, {"params": resolve_params(str(path))}) == \
        selector_key("cds_learned", 5, {"params": resolve_params(str(copy))})
    assert str(path) not in repr(selector_key("cds_learned", 5, {"params": resolve_params(str(path))}))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_selector("cds_learned", 5, {"params": str(tmp_path / "missing.json")})


def test_each_learned_selector_plays_the_shipped_fit_of_its_readout():
    """One shipped fit per read-out (SelectorSpec.readout): each file says in its provenance which read-out it was
    fitted through, and a learned selector given no parameters (the edge, the pipeline) plays its own."""
    from cdsjax.learn import DEFAULT_PARAMS_FILES
    from cdsjax.learn.params_io import default_params_file
    from cdsjax.pipeline import Pipeline

    corpus, q = _corpus()
    pipe = Pipeline(corpus, embedders=("x",))
    learned = [s for s in core.registry.SPECS.values() if s.learned]
    assert {s.readout for s in learned} == set(DEFAULT_PARAMS_FILES) == {"top", "pages"}
    for spec in learned:
        theta, provenance = load_params(default_params_file(spec.readout))
        assert provenance["fit"].get("readout", "top") == spec.readout
        assert resolve_selector(spec.name, 5)[0] is spec
        assert resolve_options(spec.name)["params"] == theta
        assert pipe.selector_key(display(spec.name), 5) == selector_key(spec.name, 5, {"params": theta})
    assert default_params("pages") != default_params("top")
    with pytest.raises(ValueError, match="no shipped fit"):
        default_params_file("sideways")


def _corpus(n=20):
    from cdsjax.pipeline import Corpus

    z, q = problem(n)
    notes = [{"note_id": f"n{i}", "doc_id": "d", "page": i // 2, "kind": "text" if i % 3 else "figure",
              "text": f"note {i}"} for i in range(n)]
    return Corpus(embeddings=z, links=np.zeros((n, n), bool), notes=notes, embedder={"model": "x"}, roots=["r"]), q


@pytest.mark.slow
def test_pipeline_passes_params_and_structure(tmp_path):
    from cdsjax.pipeline import Pipeline, PipelineError

    corpus, q = _corpus()
    theta = LearnedParams(beta=0.2, w_page=-0.3, w_same_kind=0.1)
    path = save_params(tmp_path / "p.json", theta, {"data": "test"})
    pipe = Pipeline(corpus, params=str(path), embedders=("x",))
    sel = pipe.select(q, selector="cds-learned", budget=4)
    n, size = len(corpus), pipe.size
    pad = lambda a: np.concatenate([np.asarray(a, np.int32), np.full(size - n, -1, np.int32)])
    want = cds_learned(pipe.notes, q, pipe.valid, theta, 4, links=pipe.links, pages=pad([i // 2 for i in range(n)]),
                       doc_ids=pad([0] * n), kinds=pad([0 if i % 3 else 1 for i in range(n)]))
    np.testing.assert_array_equal(np.asarray(sel.indices), np.asarray(want.indices))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PipelineError, match="not valid JSON"):
        Pipeline(corpus, params=str(bad), embedders=("x",))


def test_ask_params_errors_are_one_line(tmp_path, capsys):
    rc = main(["ask", str(tmp_path), "what?", "--selector", "cds-learned", "--params", str(tmp_path / "none.json"),
               "--no-read"])
    err = capsys.readouterr().err
    assert rc == 1 and "does not exist" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "p.json").write_text(json.dumps({"format": "cdsjax-learned-params", "version": 1, "theta": []}))
    rc = main(["ask", str(tmp_path), "what?", "--selector", "cds-learned", "--params", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "not a learned parameter file" in err
    rc = main(["ask", str(tmp_path), "what?", "--selector", "cosine", "--params", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "--params applies to the learned selectors (cds-learned, cds-learned-pages" in err


def test_serve_takes_no_params_file_over_http():
    from cdsjax.commands.policy import check_http_options

    assert check_http_options("cds_learned", {"fill": False}) == {"fill": False}
    with pytest.raises(ValueError, match="'params' is not accepted"):
        check_http_options("cds_learned", {"params": "/etc/passwd"})


def _eval_config(data_root, out, cache, **fields):
    from configs import hotpotqa

    config = hotpotqa.get_config()
    config.update(dict(data_root=str(data_root), output_dir=str(out), cache_dir=str(cache), max_queries=4,
                       selectors="cds_learned", budgets=(2,), num_resamples=200, **fields))
    config.relevance.mode = "dense"  # the picks are checked against a selection of the embeddings alone
    return config


@pytest.mark.slow
def test_run_eval_params_field_and_flag(data_root, tmp_path):
    """run_eval takes the parameter file as the config field ``params`` (and ``--params``): its records are those
    of the selector built from that file, another file does not resume into the same run, and a missing file
    is one line before any data is loaded."""
    import subprocess
    import sys

    from cdsjax.eval import evaluate
    from cdsjax.eval.settings import selector_specs

    theta = LearnedParams(beta=0.05, w_same_kind=-0.5)
    path = save_params(tmp_path / "p.json", theta, {"data": "test"})
    config = _eval_config(data_root, tmp_path / "a", tmp_path / "cache", params=str(path))
    assert selector_specs(config) == [("cds_learned", "cds_learned", {"params": str(path)})]
    records, _ = evaluate(config, progress=False, log=lambda s: None)
    shipped, _ = evaluate(_eval_config(data_root, tmp_path / "b", tmp_path / "cache"), progress=False,
                          log=lambda s: None)
    assert len(records) == len(shipped) == 4
    assert [r["qid"] for r in records] == [r["qid"] for r in shipped]
    # the records are the file's selector's picks (direct call on the same problem)
    from cdsjax.eval import load_problems
    from cdsjax.io.embed import Embedder

    _, _, problems, _ = load_problems(config, Embedder(config), cache_dir=tmp_path / "cache", progress=False, log=lambda s: None)
    fn = core.make_selector("cds_learned", budget=2, params=load_params(path)[0])
    by_qid = {r["qid"]: r for r in records}
    for p in problems:
        s = p.structure(pages_only=True)
        sel = fn(core.CDSProblem.create(p.notes, p.query_emb, np.ones(len(p.notes), bool), links=p.links, **s))
        assert by_qid[p.query.qid]["selected"] == [p.note_ids[i] for i in np.asarray(sel.indices)]
    other = save_params(tmp_path / "q.json", LearnedParams(beta=0.5), {"data": "test"})
    with pytest.raises(ValueError, match="params"):
        evaluate(_eval_config(data_root, tmp_path / "a", tmp_path / "cache", params=str(other)), progress=False,
                 log=lambda s: None)

    script = [sys.executable, str(ROOT / "experiments" / "run_eval.py"), "--config", str(ROOT / "configs" / "hotpotqa.py"),
              f"--config.data_root={data_root}", f"--config.output_dir={tmp_path / 'c'}", "--noprogress"]
    proc = subprocess.run(script + ["--params", str(tmp_path / "none.json")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("run_eval: error:") and "none.json" in lines[0] and "does not exist" in lines[0]
    assert not (tmp_path / "c").exists()
    # the config field is read by the same check (run_eval calls it before locating any data)
    from cdsjax.eval.settings import check_params

    with pytest.raises(ValueError, match="none.json.*does not exist"):
        check_params(_eval_config(data_root, tmp_path / "d", tmp_path / "cache", params=str(tmp_path / "none.json")))
    check_params(_eval_config(data_root, tmp_path / "d", tmp_path / "cache"))  # no file: the shipped fit
