"""`cdsjax ask --agent planning` end to end: a real index of a small PDF (parsed and embedded by `cdsjax index`),
the real question encoder, and a local OpenAI-compatible server scripted per role (tests/openai_server.py)."""

import json
import re

import numpy as np
import pytest

from cdsjax.cli import main
from cdsjax.io.index import load_index
from tests.scripted_server import OpenAIServer, message_text
from tests.test_planning import QUESTION, SUFFICIENT, Q1, Q2, Q3, plan_json, role

PAGES = [
    "The Falcon telescope was built in 1998 on a mountain in Chile. The Falcon telescope primary mirror "
    "diameter is 8 meters.",
    "The Heron telescope was built in 2005 on an island in Spain. The Heron telescope primary mirror "
    "diameter is 10 meters.",
    "The cafeteria menu lists soup, bread and coffee. Parking permits are issued by the front office.",
    "The staff choir rehearses on Thursday evenings. The library closes at six in the evening.",
]
MIRROR = re.compile(r"(Falcon|Heron) telescope primary mirror diameter is (\d+) meters")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    import pymupdf

    root = tmp_path_factory.mktemp("planning")
    pdf = root / "observatories.pdf"
    doc = pymupdf.open()
    for text in PAGES:
        doc.new_page(width=612, height=792).insert_htmlbox(pymupdf.Rect(72, 72, 540, 300), f"<p>{text}</p>")
    doc.save(str(pdf))
    out = root / "index"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CDSJAX_CACHE", str(root / "cache"))
        assert main(["index", str(pdf), "--out", str(out), "--no-progress"]) == 0
    return out


def worker(text: str) -> str:
    """Answers a mirror sub-question from the numbered evidence block that states it, citing that block."""
    question = text.split("Question: ")[-1].split("\n")[0]
    for name in ("Falcon", "Heron"):
        if f"diameter of the {name}" in question:
            for k, block in re.findall(r"\[(\d+)\] ([^\[]*)", text):
                hit = [m for m in MIRROR.findall(block) if m[0] == name]
                if hit:
                    return f"{hit[0][1]} meters [{k}]"
            return "Not answerable"
    if "Facts established by earlier steps" in text:
        return "Heron, because 10 meters is more than 8 meters."
    return "Not answerable"


@pytest.mark.slow
def test_ask_agent_planning_on_a_real_index(index, capsys, monkeypatch):
    replies = {"decompose": plan_json(Q1, Q2, Q3), "check": SUFFICIENT, "reason": "Heron [1]."}
    seen = []

    def respond(req):
        r = role(req)
        seen.append(r)
        return worker(message_text(req)) if r == "work" else replies[r]

    monkeypatch.delenv("CDSJAX_READER_URL", raising=False)
    with OpenAIServer(respond) as srv:
        code = main(["ask", str(index), QUESTION, "--agent", "planning", "--selector", "cosine", "--budget", "2",
                     "--json", "--reader-url", srv.base_url, "--reader-model", "test-model"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["agent"] == "planning" and result["answer"] == "Heron [1]."
    assert seen == ["decompose", "work", "work", "work", "check", "reason"]
    nodes = {n["id"]: n for n in result["trace"]["rounds"][0]["nodes"]}
    assert nodes["q1"]["answer"].startswith("8 meters [") and nodes["q2"]["answer"].startswith("10 meters [")
    assert nodes["q3"]["answer"] == "Heron, because 10 meters is more than 8 meters."

    # Each sub-question's evidence is the index's top 2 notes by cosine for that sub-question, encoded by the
    # same question encoder: what retrieval on the real index gives, not what a test double returns.
    from cdsjax.pipeline import Pipeline

    corpus = load_index(index)
    pipe = Pipeline.from_paths([str(index)])
    text_of = {n["note_id"]: n["text"] for n in corpus.notes}
    for q in (Q1, Q2):
        vec = np.asarray(pipe.embedder.encode_queries([q[1]]), np.float64)[0]
        rel = np.asarray(corpus.embeddings, np.float64) @ vec
        top = [corpus.notes[i]["note_id"] for i in np.argsort(-rel, kind="stable")[:2]]
        assert [e["note_id"] for e in nodes[q[0]]["evidence"]] == top
        assert any(q[1].split()[-1].rstrip("?") in text_of[nid] for nid in top)  # the telescope it names
    # The cited note states the answer, and the final evidence holds it with its page.
    cited = nodes["q2"]["cited"]
    assert len(cited) == 1 and "Heron telescope primary mirror diameter is 10 meters" in text_of[cited[0]]
    final = {e["note_id"]: e for e in result["evidence"]}
    assert cited[0] in final and final[cited[0]]["page"] == 1 and final[cited[0]]["document"] == "observatories.pdf"
