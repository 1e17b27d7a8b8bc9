"""The planning-graph agent through a real local OpenAI-compatible server scripted per role."""

import hashlib
import json
import re

import jax
import networkx as nx
import numpy as np
import pytest

from cdsjax import cli
from cdsjax.core.compat import cds_peel, cds_select
from cdsjax.core.subgraph import select_subgraph_readout
from cdsjax.agents import plan as P
from cdsjax.agents.agent import PlanningAgent
from cdsjax.agents.retrieval import make_retriever
from cdsjax.io.reading.llm.config import ReaderConfig
from cdsjax.io.reading.llm.errors import ReaderError
from cdsjax.io.reading.prompt import EvidenceItem, reading_order
from tests.scripted_server import OpenAIServer, message_text

FAST = dict(model="test-model", max_retries=0, backoff=0.01, max_backoff=0.02, timeout=5.0)

# --------------------------------------------------------------------------- a tiny corpus

TEXTS = [
    "Falcon telescope was built in 1998 on a mountain in Chile.",
    "Falcon telescope primary mirror diameter is 8 meters.",
    "Heron telescope was built in 2005 on an island in Spain.",
    "Heron telescope primary mirror diameter is 10 meters.",
    "The cafeteria menu lists soup, bread and coffee.",
    "Parking permits are issued by the front office.",
    "Annual rainfall at the coastal site averages 400 millimetres.",
    "The staff choir rehearses on Thursday evenings.",
    "Visitors must sign the guest book at reception.",
    "The library closes at six in the evening.",
]
LINKS = np.zeros((10, 10), bool)
LINKS[0, 1] = LINKS[1, 0] = LINKS[2, 3] = LINKS[3, 2] = True
NOTES = [dict(note_id=f"n{i}", doc_id="report", page=i // 3, kind="text", text=t, summary=t, caption="",
              bbox=[0.0, 10.0 * i, 100.0, 10.0 * i + 8]) for i, t in enumerate(TEXTS)]
DIM = 64


def embed(text):
    """Deterministic bag-of-words vector: each word hashed into one of DIM buckets."""
    v = np.zeros(DIM)
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        v[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += 1.0
    return v / max(np.linalg.norm(v), 1e-12)


class FakeEmbedder:
    def __init__(self):
        self.calls = []

    def encode_queries(self, texts):
        self.calls.append(list(texts))
        return np.stack([embed(t) for t in texts]).astype(np.float32)


EMB = np.stack([embed(t) for t in TEXTS]).astype(np.float32)
QUESTION = "Which telescope has the larger primary mirror, Falcon or Heron?"


def retriever(selector="cosine", budget=2, **kw):
    return make_retriever(EMB, LINKS, NOTES, FakeEmbedder(), selector=selector, budget=budget, **kw)


# --------------------------------------------------------------------------- a scripted server


def role(req):
    text = message_text(req)
    system = req["messages"][0]["content"]
    if "plan the research" in system:
        return "refine" if "The previous plan was" in text else "decompose"
    if "check whether research findings" in system:
        return "check"
    return "reason" if "Findings of sub-questions that were researched" in text else "work"


class Script:
    """Replies per role from queues (the last reply repeats), and answers workers from their evidence."""

    def __init__(self, **replies):
        self.replies = {k: list(v) if isinstance(v, list) else [v] for k, v in replies.items()}
        self.seen = {"decompose": [], "refine": [], "check": [], "work": [], "reason": []}

    def __call__(self, req):
        r = role(req)
        self.seen[r].append(req)
        if r == "work" and "work" not in self.replies:
            return self.work(message_text(req))
        queue = self.replies[r]
        out = queue.pop(0) if len(queue) > 1 else queue[0]
        return out(req) if callable(out) else out

    @staticmethod
    def work(text):
        """Reads the mirror size of the telescope a sub-question names off its numbered evidence."""
        question = text.split("Question: ")[-1]
        for name in ("Falcon", "Heron"):
            if f"diameter of the {name}" in question.split("\n")[0]:
                for k, size in re.findall(r"\[(\d+)\] text[^\n]*\n" + name + r" telescope primary mirror "
                                          r"diameter is (\d+) meters", text):
                    return f"{size} meters [{k}]"
                return "Not answerable"
        if "Facts established by earlier steps" in question:
            return "Heron, because 10 meters is more than 8 meters."
        return "Not answerable"

    def count(self, r):
        return len(self.seen[r])


def plan_json(*nodes):
    return json.dumps({"nodes": [{"id": i, "question": q, "needs": list(n)} for i, q, n in nodes]})


Q1 = ("q1", "What is the primary mirror diameter of the Falcon telescope?", ())
Q2 = ("q2", "What is the primary mirror diameter of the Heron telescope?", ())
Q3 = ("q3", "Which primary mirror is larger given both diameters?", ("q1", "q2"))
SUFFICIENT = '{"sufficient": true, "gaps": []}'


def run_agent(script, retrieve=None, **kw):
    with OpenAIServer(script) as srv:
        agent = PlanningAgent(ReaderConfig(base_url=srv.base_url, **FAST), retrieve or retriever(), **kw)
        result = agent.run(QUESTION)
    out = result.to_dict()
    json.loads(json.dumps(out))  # the whole trace is plain JSON
    return result, out


def node(out, round_index, node_id):
    return next(n for n in out["trace"]["rounds"][round_index]["nodes"] if n["id"] == node_id)


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_plan_execute_check_refine_answer():
    script = Script(
        decompose="```json\n" + plan_json(Q1, ("q3", Q3[1], ("q1",))) + "\n```",
        check=['{"sufficient": false, "gaps": ["the Heron telescope mirror diameter"]}', SUFFICIENT],
        refine=plan_json(Q1, Q2, Q3),
        reason="Heron has the larger primary mirror (10 m vs 8 m) [2][3].",
    )
    result, out = run_agent(script)
    assert out["answer"].startswith("Heron has the larger primary mirror")
    rounds = out["trace"]["rounds"]
    assert [r["plan_source"] for r in rounds] == ["decomposer", "refinement"]
    assert [r["verdict"]["sufficient"] for r in rounds] == [False, True]
    assert rounds[0]["verdict"]["gaps"] == ["the Heron telescope mirror diameter"]
    assert out["trace"]["stop_reason"] == "sufficient"
    assert rounds[1]["plan"]["order"] == ["q1", "q2", "q3"]

    # Each node retrieved for its own sub-question: the Falcon and Heron mirror notes.
    assert [e["note_id"] for e in node(out, 1, "q1")["evidence"]][0] == "n1"
    assert [e["note_id"] for e in node(out, 1, "q2")["evidence"]][0] == "n3"
    assert node(out, 1, "q1")["answer"] == "8 meters [1]" and node(out, 1, "q1")["cited"] == ["n1"]
    assert node(out, 1, "q2")["answer"] == "10 meters [1]"
    # q1 was unchanged between rounds, so it was not asked again; q3's inputs changed, so it was.
    assert node(out, 1, "q1")["reused"] and not node(out, 1, "q3")["reused"]
    assert script.count("work") == 2 + 2  # round 0: q1, q3; round 1: q2, q3
    # The dependent node saw its prerequisites' answers, without their citation marks.
    q3_request = message_text(script.seen["work"][-1])
    assert "- What is the primary mirror diameter of the Heron telescope? -> 10 meters\n" in q3_request
    # The checker and the refiner saw the findings; the refiner the gaps and the previous plan.
    refine_text = message_text(script.seen["refine"][0])
    assert "the Heron telescope mirror diameter" in refine_text and '"id": "q3"' in refine_text
    assert "answer: 8 meters" in message_text(script.seen["check"][0])
    # The reasoner read the union of the probe's and the nodes' evidence, and the findings.
    reason_text = message_text(script.seen["reason"][0])
    assert "Heron, because 10 meters is more than 8 meters." in reason_text
    ids = [e["note_id"] for e in out["evidence"]]
    assert {"n1", "n3"} <= set(ids) and len(ids) == len(set(ids))
    assert [e["rank"] for e in out["evidence"]] == list(range(1, len(ids) + 1))
    # the reasoner cited its prompt's 2nd and 3rd notes, the prompt listing the evidence in reading order
    in_prompt = [e.note_id for e in reading_order([EvidenceItem(note_id=e["note_id"], doc_id=e["document"],
                                                                page=e["page"]) for e in out["evidence"]])]
    assert out["reader"]["cited"] == in_prompt[1:3]
    assert set(out["trace"]["explored_note_ids"]) >= set(ids)
    assert out["trace"]["llm_calls"] == 1 + 2 + 1 + 1 + 2 + 1 + 1  # decompose, work, check, refine, work, check, reason
    assert {"document", "page", "bbox", "kind", "text", "score", "rank"} <= set(out["evidence"][0])


@pytest.mark.slow
def test_malformed_plan_is_asked_again_then_replaced():
    script = Script(decompose=["I would first look up the mirrors.", plan_json(Q1, Q2, Q3)], check=SUFFICIENT,
                    reason="Heron.")
    _, out = run_agent(script)
    assert script.count("decompose") == 2
    assert "could not be used (no JSON object in the reply" in message_text(script.seen["decompose"][1])
    assert out["trace"]["rounds"][0]["plan_source"] == "decomposer"

    script = Script(decompose="{nodes: [q1, q2", check=SUFFICIENT, reason="Heron.")
    _, out = run_agent(script)
    first = out["trace"]["rounds"][0]
    assert first["plan_source"] == "fallback" and "no JSON object" in first["plan_error"]
    assert first["raw_plan"] == ["{nodes: [q1, q2", "{nodes: [q1, q2"]
    assert [n["question"] for n in first["nodes"]] == [QUESTION]
    assert out["answer"] == "Heron."


def test_cyclic_and_unknown_dependencies_are_repaired_and_reported():
    cyclic = json.dumps({"nodes": [
        {"id": "q1", "question": Q1[1], "needs": ["q3"]},
        {"id": "q2", "question": Q2[1], "depends_on": "q9"},
        {"id": "q3", "question": Q3[1], "needs": ["q1", "q2"]},
    ]})
    script = Script(decompose=cyclic, check=SUFFICIENT, reason="Heron.")
    _, out = run_agent(script)
    first = out["trace"]["rounds"][0]
    assert first["plan"]["order"] == ["q1", "q2", "q3"]
    assert any("unknown node 'q9'" in r for r in first["plan_repairs"])
    assert any("cycle among ['q1', 'q3']" in r for r in first["plan_repairs"])
    assert first["raw_plan"] == [cyclic]

    script = Script(decompose=cyclic, check=SUFFICIENT, reason="Heron.")
    _, out = run_agent(script, cycles="reject")
    first = out["trace"]["rounds"][0]
    assert first["plan_source"] == "fallback" and "dependency cycle among ['q1', 'q3']" in first["plan_error"]
    assert "dependency cycle" in message_text(script.seen["decompose"][1])


def test_verdicts_malformed_or_gapless_and_refinement_limits():
    # An unreadable verdict ends refinement (after one more try).
    script = Script(decompose=plan_json(Q1, Q2, Q3), check="Looks fine to me.", reason="Heron.")
    _, out = run_agent(script)
    assert script.count("check") == 2 and script.count("refine") == 0
    assert "could not be read" in out["trace"]["stop_reason"]
    assert out["trace"]["rounds"][0]["raw_verdict"] == ["Looks fine to me."] * 2
    assert out["answer"] == "Heron."

    # Insufficient every time: tau_max refinements, then stop; a gapless "no" gets a generic gap.
    script = Script(decompose=plan_json(Q1), check='{"sufficient": "no"}',
                    refine=[plan_json(Q1, Q2), plan_json(Q2), plan_json(Q1, Q2, Q3)], reason="Heron.")
    _, out = run_agent(script, tau_max=2)
    rounds = out["trace"]["rounds"]
    assert len(rounds) == 3 and script.count("refine") == 2
    assert out["trace"]["stop_reason"] == "tau_max=2 refinement rounds reached"
    assert "named no gap" in rounds[0]["verdict"]["gaps"][0]

    # A refinement that changes nothing stops the loop instead of repeating the round.
    script = Script(decompose=plan_json(Q1, Q2), check='{"sufficient": false, "gaps": ["more"]}',
                    refine=plan_json(("a", Q1[1], ()), ("b", Q2[1], ())), reason="Heron.")
    _, out = run_agent(script)
    assert out["trace"]["stop_reason"] == "the refinement returned the same plan"
    assert len(out["trace"]["rounds"]) == 1

    # An unusable refinement keeps the previous plan and stops.
    script = Script(decompose=plan_json(Q1, Q2), check='{"sufficient": false, "gaps": ["more"]}',
                    refine='{"nodes": []}', reason="Heron.")
    _, out = run_agent(script, tau_max=0)
    assert out["trace"]["stop_reason"] == "tau_max=0 refinement rounds reached"
    _, out = run_agent(script)
    assert out["trace"]["stop_reason"].startswith("the refined plan could not be used (the plan has no usable")


def test_server_failures():
    # A failing worker call is recorded on its node; the run goes on.
    def work_fails(req):
        if "Heron" in message_text(req).split("Question: ")[-1]:
            return (400, {"error": {"message": "bad image"}})
        return "8 meters [1]"

    script = Script(decompose=plan_json(Q1, Q2), check=SUFFICIENT, work=work_fails, reason="Unclear.")
    _, out = run_agent(script)
    q2 = node(out, 0, "q2")
    assert q2["answer"] is None and "HTTP 400" in q2["error"] and q2["abstained"]
    assert "the step failed" in message_text(script.seen["check"][0])
    assert out["answer"] == "Unclear."

    # A server that is down is one clear error, not a trace.
    agent = PlanningAgent(ReaderConfig(base_url="http://127.0.0.1:9/v1", **FAST), retriever())
    with pytest.raises(ReaderError, match="cannot reach") as info:
        agent.run(QUESTION)
    assert info.value.kind == "unreachable"


# --------------------------------------------------------------------------- retrieval modes


@pytest.mark.slow
def test_separate_retrieval_uses_any_selector():
    retrieve = retriever("subgraph", budget=3)
    script = Script(decompose=plan_json(Q1, Q2, Q3), check=SUFFICIENT, reason="Heron.")
    _, out = run_agent(script, retrieve=retrieve)
    # One encode for the probe, one batch for the sub-questions.
    assert retrieve.pipeline.embedder.calls == [[QUESTION], [Q1[1], Q2[1], Q3[1]]]
    for q, (node_id, text, _) in zip(out["trace"]["rounds"][0]["nodes"], (Q1, Q2, Q3)):
        want = select_subgraph_readout(LINKS, EMB, embed(text), np.ones(10, bool), budget=3)
        want_ids = [f"n{i}" for i in np.asarray(want.indices)[np.asarray(want.selected_valid)]]
        assert [e["note_id"] for e in q["evidence"]] == want_ids
        np.testing.assert_allclose([e["score"] for e in q["evidence"]],
                                   np.asarray(want.scores)[: len(want_ids)], atol=1e-6)


@pytest.mark.parametrize("mode", ["single", "peel"])
def test_combined_retrieval_is_one_cds_selection(mode):
    retrieve = retriever("cds", budget=2)
    script = Script(decompose=plan_json(Q1, Q2, Q3), check=SUFFICIENT, reason="Heron.")
    _, out = run_agent(script, retrieve=retrieve, combined=mode)
    first = out["trace"]["rounds"][0]
    queries = np.stack([embed(q) for _, q, _ in (Q1, Q2, Q3)]).astype(np.float32)
    pad = retrieve.pipeline.size
    notes = np.zeros((pad, DIM), np.float32)
    notes[:10] = EMB
    select = cds_select if mode == "single" else cds_peel
    want = jax.jit(lambda z, q, v: select(z, q, v, budget=6))(notes, queries, np.arange(pad) < 10)
    want_ids = [f"n{i}" for i in np.asarray(want.indices)[np.asarray(want.selected_valid)]]
    assert [e["note_id"] for e in first["joint_evidence"]] == want_ids
    assert all([e["note_id"] for e in n["evidence"]] == want_ids for n in first["nodes"])
    diag = first["retrieval"][-1]
    assert diag["combined"] == mode and diag["queries"] == [Q1[1], Q2[1], Q3[1]]
    assert diag["diagnostics"][0]["num_iters"] == int(want.result.num_iters)
    assert retrieve.pipeline.embedder.calls[-1] == [Q1[1], Q2[1], Q3[1]]


def test_peel_needs_cds_and_retrieve_output_is_checked():
    with pytest.raises(ValueError, match="needs a CDS selector"):
        retriever("cosine")([Q1[1], Q2[1]], combined="peel")
    script = Script(decompose=plan_json(Q1, Q2), check=SUFFICIENT, reason="Heron.")
    with OpenAIServer(script) as srv:
        agent = PlanningAgent(ReaderConfig(base_url=srv.base_url, **FAST), lambda queries: [[]])
        with pytest.raises(ValueError, match="retrieve returned 1 evidence lists for 2 queries"):
            agent.run(QUESTION)
    with pytest.raises(ValueError, match="combined must be one of"):
        PlanningAgent(ReaderConfig(base_url="http://x/v1"), retriever(), combined="joint")
    with pytest.raises(ValueError, match="tau_max is out of range"):
        PlanningAgent(ReaderConfig(base_url="http://x/v1"), retriever(), tau_max=-1)


# --------------------------------------------------------------------------- the command line


def test_cli_ask_agent_planning(monkeypatch, capsys):
    from cdsjax import pipeline

    pipe = retriever().pipeline
    monkeypatch.setattr(pipeline.Pipeline, "from_paths", classmethod(lambda cls, paths, **kw: pipe))
    monkeypatch.delenv("CDSJAX_READER_URL", raising=False)
    script = Script(decompose=plan_json(Q1, Q2, Q3), check=SUFFICIENT, reason="Heron [1].")
    with OpenAIServer(script) as srv:
        code = cli.main(["ask", "index-dir", QUESTION, "--agent", "planning", "--selector", "subgraph",
                         "--budget", "2", "--json", "--reader-url", srv.base_url, "--reader-model", "test-model"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    # the reader cited the first note of its prompt (reading order): the answer names it by its evidence rank
    cited = result["reader"]["cited"] if "reader" in result else None
    assert re.fullmatch(r"Heron \[\d+\]\.", result["answer"]) and result["agent"] == "planning", result["answer"]
    assert cited == ["n0"]  # n0 comes first in reading order, whatever its rank
    assert [n["id"] for n in result["trace"]["rounds"][0]["nodes"]] == ["q1", "q2", "q3"]
    assert node(result, 0, "q2")["answer"] == "10 meters [1]"

    code = cli.main(["ask", "index-dir", QUESTION, "--agent", "planning"])
    _, err = capsys.readouterr()
    assert code == 2 and "needs a reader" in err


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("reply, order, repaired", [
    ('{"nodes": [{"id": "a", "question": "x"}, {"id": "b", "question": "y", "needs": ["a"]}]}', ["a", "b"], 0),
    ('<think>{"nodes": []}</think> [{"task": "x"}, "y"]', ["n1", "n2"], 2),
    ('{"sub_questions": [{"id": 1, "text": "x"}, {"id": 2, "text": "y"}], "edges": [[2, 1]]}', ["2", "1"], 0),
    ('{"plan": {"steps": [{"id": "a", "q": "x", "after": "b"}, {"id": "b", "q": "y"}]}}', ["b", "a"], 0),
    ('{"nodes": [{"id": "a", "question": "x", "needs": ["a"]}, {"id": "a", "question": "z"}]}', ["a"], 2),
    ("{\u201cnodes\u201d: [{\u201cid\u201d: \u201ca\u201d, \u201cquestion\u201d: \u201cx\u201d},]}", ["a"], 0),
])
def test_parse_plan_shapes(reply, order, repaired):
    plan, repairs = P.parse_plan(reply)
    assert list(plan.order) == order and len(repairs) == repaired, repairs


def test_parse_plan_limits():
    chain = json.dumps({"nodes": [{"id": f"s{k}", "question": f"step {k}", "needs": [f"s{k - 1}"] if k else []}
                                  for k in range(8)]})
    plan, repairs = P.parse_plan(chain)
    assert list(plan.order) == ["s0", "s1", "s2"] and plan.depth() == 3
    assert any("at most 6 nodes" in r for r in repairs) and any("at most 3 nodes long" in r for r in repairs)
    for bad, why in [("no json here", "no JSON object"), ('{"answer": 3}', "no list of nodes"),
                     ('{"nodes": [{"id": "a"}]}', "no usable sub-question"), ("", "the reply is empty")]:
        with pytest.raises(P.PlanError, match=why):
            P.parse_plan(bad)


@pytest.mark.parametrize("reply, want", [
    ('{"sufficient": true, "gaps": ["ignored"]}', (True, ())),
    ('```json\n{"Sufficient": "No", "gaps": [{"gap": "year"}, "place"]}\n```', (False, ("year", "place"))),
    ('{"gaps": ["a", "b", "c", "d"]}', (False, ("a", "b", "c"))),
    ('{"sufficient": 0, "gaps": "the unit"}', (False, ("the unit",))),
])
def test_parse_sufficiency(reply, want):
    v = P.parse_sufficiency(reply)
    assert (v.sufficient, v.gaps) == want
    for bad in ("yes", '{"sufficient": "maybe"}', '{"gaps": []}'):
        with pytest.raises(P.PlanError):
            P.parse_sufficiency(bad)


@pytest.mark.parametrize("seed", range(5))
def test_kahn_order_against_networkx(seed):
    rng = np.random.default_rng(seed)
    ids = [f"v{i}" for i in rng.permutation(7)]
    needs = {i: [j for j in ids if rng.random() < 0.3 and j != i] for i in ids}
    order, stuck = P.topological_order(ids, needs)
    graph = nx.DiGraph([(d, i) for i in ids for d in needs[i]])
    graph.add_nodes_from(ids)
    assert (not stuck) == nx.is_directed_acyclic_graph(graph)
    if not stuck:
        position = {v: k for k, v in enumerate(order)}
        assert all(position[d] < position[i] for i in ids for d in needs[i])
    else:
        on_cycle = {v for c in nx.simple_cycles(graph) for v in c}
        assert on_cycle <= set(stuck) and set(order).isdisjoint(on_cycle)


def test_evaluation_variants_and_cached_encoder():
    from cdsjax.agents.evaluate import CachedQueryEncoder, Variant, parse_variants

    assert parse_variants("cosine, cds+peel") == [Variant("cosine", "cosine"), Variant("cds+peel", "cds", {}, "peel")]
    for bad in ("cds+joint", "", "cosine,cosine"):
        with pytest.raises(ValueError):
            parse_variants(bad)
    inner = FakeEmbedder()
    enc = CachedQueryEncoder(inner, {QUESTION: embed(QUESTION)})
    out = enc.encode_queries([QUESTION, Q1[1], Q1[1], Q2[1]])
    assert inner.calls == [[Q1[1], Q2[1]]]
    np.testing.assert_allclose(out, np.stack([embed(t) for t in (QUESTION, Q1[1], Q1[1], Q2[1])]), atol=1e-6)
    enc.encode_queries([Q2[1]])
    assert len(inner.calls) == 1
