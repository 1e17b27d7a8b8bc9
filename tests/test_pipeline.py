"""Retrieve-then-read end to end: the pipeline, `cdsjax ask`, `cdsjax demo`, through a real local server."""

import base64
import json

import numpy as np
import pytest

from cdsjax import cli
from cdsjax.io.reading.prompt import EvidenceItem, reading_order
from cdsjax.io.util import free_port
from cdsjax.pipeline import Corpus, Pipeline, PipelineError
from cdsjax.pipeline.answer import convergence_warning
from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display
from tests.scripted_server import OpenAIServer, message_images, message_text


@pytest.fixture(scope="module")
def demo_index(demo_run):
    return demo_run[0] / "index"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CDSJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CDSJAX_READER_URL", raising=False)
    monkeypatch.delenv("CDSJAX_READER_MODEL", raising=False)
    return tmp_path / "cache"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_ask_json_schema_without_reader(demo_index, capsys, cache):
    code, out, err = run_cli(capsys, "ask", str(demo_index), "How much did battery storage cut diesel use?",
                             "--json", "--budget", "4")
    assert code == 0, err
    result = json.loads(out)
    assert result["answer"] is None and result["reader"] is None
    assert result["selector"] == display(DEFAULT_SELECTOR) and result["budget"] == 4
    ev = result["evidence"]
    assert 1 <= len(ev) <= 4
    assert [e["rank"] for e in ev] == list(range(1, len(ev) + 1))
    # each note's score is its relevance (hybrid: the cosine mixed with BM25); the rank is the equilibrium's
    assert all(isinstance(e["score"], float) and 0.0 < e["score"] <= 1.0 for e in ev)
    for e in ev:
        assert set(e) >= {"document", "page", "bbox", "kind", "text", "score", "rank"}
        assert e["document"] == "harbour_island_report.pdf" and 0 <= e["page"] < 10
        assert len(e["bbox"]) == 4 and e["bbox"][0] < e["bbox"][2] and e["bbox"][1] < e["bbox"][3]
        assert e["kind"] in ("text", "figure", "table", "chart")
    d = result["diagnostics"]
    assert d["solver"] == "pdas" and d["mode"] == "converged"  # the serving solver, named
    assert d["num_iters"] >= 1 and d["converged"] is True and 0 <= d["kkt_residual"] <= 1e-6
    assert d["support_size"] >= 1
    assert result["warnings"] == [] and err == ""
    assert "38 percent" in " ".join(e["text"] for e in ev)
    assert result["abstained"] is False and result["abstention"]["enabled"] is True  # judged before reading


@pytest.mark.slow
def test_default_is_learned_cds_and_paper_mode_is_named(demo_index):
    from cdsjax.io.index import load_index
    from cdsjax.pipeline.catalog import resolve

    assert resolve(DEFAULT_SELECTOR).name == "cds_learned_pages"
    pipe = Pipeline(Corpus.merge([load_index(demo_index)]))
    q = "How much did battery storage cut diesel use?"
    default = pipe.ask(q, budget=4)
    assert default.selector == "cds-learned-pages" and default.diagnostics["mode"] == "converged"
    paper = pipe.ask(q, selector="cds-paper", budget=4)
    same = pipe.ask(q, selector="cds", budget=4)  # "cds" keeps meaning paper mode
    assert paper.selector == same.selector == "cds-paper"
    assert paper.diagnostics["mode"] == "paper" and paper.diagnostics["solver"] == "replicator"
    assert [e["note_id"] for e in paper.evidence] == [e["note_id"] for e in same.evidence]


@pytest.mark.slow
@pytest.mark.parametrize("selector", ["cds-converged", "cds-paper"])
def test_support_size_counts_notes_not_the_query(demo_index, selector):
    from cdsjax.io.index import load_index

    pipe = Pipeline(Corpus.merge([load_index(demo_index)]))
    query = pipe.encode(["What problems did the pilot run into?"])[0]
    sel = pipe.select(query, selector=selector, budget=4)
    d = pipe.diagnostics(sel, selector)
    x = np.asarray(sel.result.x)
    assert x.shape[0] == pipe.size + 1  # the query vertex first, then the padded notes
    notes_on = int(((x[1:] > 1e-6) & pipe.valid).sum())
    assert d["support_size"] == notes_on
    assert d["query_weight"] == pytest.approx(float(x[0])) and x[0] > 1e-6
    assert d["support_size"] == int(sel.support_size)  # one support_size: the selection's notes


@pytest.mark.slow
def test_support_targeted_cds_reports_its_beta_and_fill(demo_index, capsys, cache):
    code, out, err = run_cli(capsys, "ask", str(demo_index), "What problems did the pilot run into?",
                             "--selector", "cds-support", "--budget", "3", "--json")
    assert code == 0, err
    result = json.loads(out)
    d = result["diagnostics"]
    assert result["selector"] == "cds-support" and d["mode"] == "converged" and d["solver"] == "active_set"
    assert len(result["evidence"]) == 3
    assert d["fill_reason"] in ("none", "short_support", "no_query_edge") and 0 <= d["num_filled"] <= 3
    assert d["support_size"] + d["num_filled"] >= 3  # the support (cut to B) plus the filled slots
    assert 0 < d["beta"] < 1  # chosen per question: well below the default beta = 1 at this n


@pytest.mark.slow
def test_unconverged_solve_warns_in_one_line(demo_index, capsys, cache):
    q = "How much did battery storage cut diesel use?"
    code, out, err = run_cli(capsys, "ask", str(demo_index), q, "--json", "--selector", "cds-paper",
                             "--max-iter", "3")
    assert code == 0
    result = json.loads(out)
    assert result["diagnostics"]["converged"] is False and result["diagnostics"]["num_iters"] == 3
    assert result["diagnostics"]["status"] == "max_steps"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and len(result["warnings"]) == 1
    residual = f"{result['diagnostics']['kkt_residual']:.1e}"
    assert "warning" in lines[0] and f"KKT residual {residual}" in lines[0]
    assert f"--selector {display(DEFAULT_SELECTOR)}" in lines[0]
    # the table view prints the same line
    code, out, err = run_cli(capsys, "ask", str(demo_index), q, "--selector", "cds-paper", "--max-iter", "3")
    assert code == 0 and len(err.strip().splitlines()) == 1 and "did NOT converge (max_steps)" in out
    # converged mode: no warning
    code, out, err = run_cli(capsys, "ask", str(demo_index), q, "--json")
    assert code == 0 and err == "" and json.loads(out)["warnings"] == []
    assert json.loads(out)["diagnostics"]["status"] == "converged"


def test_convergence_warning_names_how_the_solve_ended():
    base = {"converged": False, "mode": "paper", "num_iters": 7, "kkt_residual": float("nan")}
    lines = {status: convergence_warning({**base, "status": status})
             for status in ("max_steps", "nonfinite", "singular")}
    assert "stopped unconverged after 7 steps" in lines["max_steps"]
    assert "non-finite weights (NaN or inf)" in lines["nonfinite"]
    assert "singular Newton system" in lines["singular"]
    assert all("\n" not in line and "near-arbitrary" in line for line in lines.values())
    assert convergence_warning({**base, "converged": True, "status": "converged"}) is None
    assert convergence_warning({}) is None


def test_ask_help_shows_the_json_schema(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ask", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for field in ('"evidence"', '"diagnostics"', '"support_size"', '"mode"', '"warnings"', '"timings"',
                  "cds-paper", "--server"):
        assert field in out, field


@pytest.mark.slow
def test_ask_baseline_has_no_solver_diagnostics(demo_index, capsys, cache):
    code, out, _ = run_cli(capsys, "ask", str(demo_index), "What problems did the pilot have?", "--json",
                           "--selector", "cosine", "--budget", "3")
    assert code == 0
    result = json.loads(out)
    assert result["diagnostics"] == {} and len(result["evidence"]) == 3


def test_pipeline_cosine_matches_numpy_ranking(demo_index):
    from cdsjax.io.index import load_index

    pipe = Pipeline(Corpus.merge([load_index(demo_index)]))
    q = pipe.encode(["inverter firmware trips"])[0]
    sel = pipe.select(q, selector="cosine", budget=5)
    expect = np.argsort(-(pipe.corpus.embeddings @ q), kind="stable")[:5]
    np.testing.assert_array_equal(np.asarray(sel.indices), expect)


def test_a_question_looks_its_selector_name_up_once(demo_index, monkeypatch):
    """``Pipeline.retrieve`` resolves the selector's name once and hands its spec down: the compiled selector, its
    key, the problem and the answer's display form take the spec, and no step looks the name up again."""
    from cdsjax.io.index import load_index
    from cdsjax.pipeline import catalog

    pipe = Pipeline(Corpus.merge([load_index(demo_index)]))
    q = "How much did battery storage cut diesel use?"
    lookup = catalog.selector_spec
    for selector, options in (("cosine", None), ("mmr", {"lam": 0.4})):
        pipe.retrieve(q, selector=selector, budget=4, options=options)  # compiled before counting
        names = []
        monkeypatch.setattr(catalog, "selector_spec", lambda name: (names.append(name), lookup(name))[1])
        answer = pipe.retrieve(q, selector=selector, budget=4, options=options)
        monkeypatch.setattr(catalog, "selector_spec", lookup)
        assert [n for n in names if isinstance(n, str)] == [selector], names
        assert answer.selector == display(selector) and len(answer.evidence) == 4


@pytest.mark.slow
def test_ask_through_local_openai_server_sends_text_and_images(demo_index, capsys, cache):
    def responder(req):
        return "Diesel use fell by 38 percent [1], see the chart [2]."

    with OpenAIServer(responder, models=("qwen-test",)) as srv:
        # a selector whose evidence holds a figure here (the default's, read one note per page, holds none)
        code, out, err = run_cli(capsys, "ask", str(demo_index), "How much did battery storage cut diesel use?",
                                 "--json", "--budget", "6", "--selector", "cds-learned", "--reader-url",
                                 srv.base_url, "--reader-model", "qwen-test")
        assert code == 0, err
        assert len(srv.requests) == 1
        req = srv.requests[0]
    result = json.loads(out)
    assert result["answer"].startswith("Diesel use fell by 38 percent")
    # the prompt lists the evidence in reading order: its [1] and [2] come back as those notes' ranks
    in_prompt = reading_order([EvidenceItem(note_id=e["note_id"], doc_id=e["document"], page=e["page"], rank=e["rank"])
                               for e in result["evidence"]])
    assert result["reader"]["model"] == "qwen-test"
    assert result["reader"]["cited"] == [in_prompt[0].rank, in_prompt[1].rank]
    assert result["reader"]["image_mode"] == "images" and result["reader"]["dropped"] == 0
    assert req["temperature"] == 0 and req["max_tokens"] == 1024
    text = message_text(req)
    assert "How much did battery storage cut diesel use?" in text
    first = result["evidence"][0]
    assert " ".join(first["text"].split())[:60] in " ".join(text.split())
    visual = [e for e in result["evidence"] if e["kind"] != "text"]
    images = message_images(req)
    assert len(images) == len(visual) >= 1
    png = base64.b64decode(images[0].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "timings" in result and result["timings"]["read"] >= 0


def test_reader_from_environment_and_server_errors(demo_index, capsys, cache, monkeypatch):
    with OpenAIServer(lambda req: (500, {"error": {"message": "boom"}}), models=("m",)) as srv:
        monkeypatch.setenv("CDSJAX_READER_URL", srv.base_url)
        monkeypatch.setenv("CDSJAX_READER_MODEL", "m")
        monkeypatch.setenv("CDSJAX_READER_API_KEY", "x")
        code, out, err = run_cli(capsys, "ask", str(demo_index), "any question", "--timeout", "5", "--retries", "1")
        assert code == 1 and "500" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
        assert len(srv.requests) >= 2  # retried


def test_ask_server_down_is_one_clear_line(demo_index, capsys, cache):
    code, out, err = run_cli(capsys, "ask", str(demo_index), "q?", "--reader-url", f"http://127.0.0.1:{free_port()}/v1",
                             "--reader-model", "m", "--timeout", "2", "--retries", "0")
    assert code == 1 and "cannot reach" in err and len(err.strip().splitlines()) == 1


def test_ask_indexes_a_shared_pdf_on_the_fly(data_root, capsys, cache):
    pdf = data_root / "pdfs" / "multicolumn.pdf"
    code, out, err = run_cli(capsys, "ask", str(pdf), "What is the sample document about?", "--json",
                             "--budget", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["evidence"] and result["evidence"][0]["document"] == "multicolumn.pdf"
    assert any(cache.iterdir())  # the PDF was indexed into the cache


@pytest.mark.parametrize(
    "argv, word",
    [
        (["ask", "/nonexistent/x.pdf", "q?"], "no such file"),
        (["ask", "only-a-question"], "at least one"),
        (["ask", "DEMO", "   "], "empty"),
        (["ask", "DEMO", "q?", "--budget", "0"], "budget"),
        (["ask", "DEMO", "q?", "--selector", "cosine", "--beta", "2"], "beta"),
        (["ask", "DEMO", "q?", "--max-iter", "0"], "max-iter"),
        (["ask", "--server", "ftp://x", "q?"], "http"),
        (["ask", "--server", "http://127.0.0.1:9", "DEMO", "q?"], "only the question"),
        (["ask", "--server", "http://127.0.0.1:9", "q?", "--reader-url", "http://x/v1"], "server's reader"),
    ],
)
def test_ask_bad_input_one_line(demo_index, capsys, cache, argv, word):
    argv = [str(demo_index) if a == "DEMO" else a for a in argv]
    code, out, err = run_cli(capsys, *argv)
    assert code != 0 and word in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_corpus_merge_rejects_mixed_embedders(demo_index):
    from cdsjax.io.index import load_index

    a = load_index(demo_index)
    b = load_index(demo_index)
    b.embedder = dict(b.embedder, model="other-model")
    with pytest.raises(PipelineError, match="different models"):
        Corpus.merge([a, b])
    with pytest.raises(PipelineError, match="both hold a document with the id"):
        Corpus.merge([a, load_index(demo_index)])  # the same document ids twice: refused (issue 63)
    c = load_index(demo_index)
    for note in c.notes:
        note.update(doc_id="copy-" + note["doc_id"], note_id="copy-" + note["note_id"])
    for doc in c.manifest["documents"]:
        doc["doc_id"] = "copy-" + doc["doc_id"]
    merged = Corpus.merge([a, c])
    n = len(a.notes)
    assert merged.links.shape == (2 * n, 2 * n) and not merged.links[:n, n:].any()


def test_selector_compiled_ahead_for_notes_not_yet_embedded(demo_index):
    """`ask NEW.pdf` compiles its selector while the notes are embedded (Pipeline.warm_for_notes, on stand-in
    vectors of the same shape): the pipeline of the real index then shares that jitted selector and picks what
    a pipeline without the warm-up picks."""
    from cdsjax.io.index import load_index
    from cdsjax.pipeline.cache import SelectorCache

    corpus = Corpus.merge([load_index(demo_index)])
    q = "How much did battery storage cut diesel use?"
    compiled = SelectorCache()
    Pipeline.warm_for_notes(corpus.notes, question=q, budget=4, compiled=compiled)
    assert len(compiled) == 1
    (key,) = list(compiled)
    warmed = Pipeline(corpus, compiled=compiled)
    assert warmed.selector_key(DEFAULT_SELECTOR, 4) == key
    assert warmed.selector_fn(DEFAULT_SELECTOR, 4) is compiled[key]
    got = warmed.ask(q, budget=4)
    plain = Pipeline(corpus).ask(q, budget=4)
    assert [e["note_id"] for e in got.evidence] == [e["note_id"] for e in plain.evidence]
    assert [e["score"] for e in got.evidence] == [e["score"] for e in plain.evidence]


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_head_start_on_the_question_is_silent_and_the_pdf_still_indexes(tmp_path, cache, monkeypatch,
                                                                                  capfd):
    """`ask NEW.pdf` loads the question's encoder on a thread while the PDF is parsed (cdsjax.pipeline.warmup): when
    that head start fails, the ask goes on without a traceback on stderr, and the thread has ended when the index is
    returned."""
    import threading

    from cdsjax.pipeline import warmup
    from tests.ingest_pdfs import make_text_pdf

    def fail(question, config=None):
        raise RuntimeError("no encoder here")

    monkeypatch.setattr(warmup, "warm_question", fail)
    pdf = make_text_pdf(tmp_path / "one.pdf")
    pipe = Pipeline.from_paths([str(pdf)], warm=dict(question="What does the paragraph say?", budget=3))
    assert len(pipe.corpus.notes) >= 1
    assert "Exception in thread" not in capfd.readouterr().err
    assert not any(t.name == "cdsjax-warm-question" for t in threading.enumerate())


def test_pipelines_of_a_process_share_their_jitted_selectors(demo_index):
    """Pipelines built without ``compiled`` share the process's SelectorCache (one per cap): a second pipeline
    (the same index reloaded, or the next in-process ask) reuses the jitted selector and picks the same; a cache
    of the caller's stays the caller's."""
    from cdsjax.io.index import load_index
    from cdsjax.pipeline.cache import SelectorCache, shared_selector_cache

    q = "How much did battery storage cut diesel use?"
    first, second = (Pipeline(Corpus.merge([load_index(demo_index)])) for _ in range(2))
    assert first.compiled is second.compiled is shared_selector_cache()
    assert first.selector_fn(DEFAULT_SELECTOR, 4) is second.selector_fn(DEFAULT_SELECTOR, 4)
    a, b = first.ask(q, budget=4), second.ask(q, budget=4)
    assert [e["note_id"] for e in a.evidence] == [e["note_id"] for e in b.evidence]
    capped = Pipeline(Corpus.merge([load_index(demo_index)]), max_compiled=2)
    assert capped.compiled is shared_selector_cache(2) and capped.compiled.maxsize == 2
    own = SelectorCache()
    assert Pipeline(Corpus.merge([load_index(demo_index)]), compiled=own).compiled is own


def test_the_warm_up_thread_finds_its_modules_imported_by_the_caller():
    """warm_question_ahead imports the encoder's modules (and with them the parser package) before its thread
    starts: two threads importing one package's modules at once can deadlock on the import locks."""
    import subprocess
    import sys

    code = ("import sys, threading\n"
            "seen = []\n"
            "class Held(threading.Thread):\n"
            "    def start(self): seen.append('cdsjax.io.parse.layout' in sys.modules)\n"
            "threading.Thread = Held\n"
            "from cdsjax.pipeline import warmup\n"
            "assert 'cdsjax.io.parse.layout' not in sys.modules\n"
            "warmup.warm_question_ahead('q')\n"
            "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[True]"
