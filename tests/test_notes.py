"""Elements -> notes: lite enrichment, structural links, VLM enrichment against a local OpenAI-style server."""

import json
import re

import pytest

from cdsjax.io.elements import Element
from cdsjax.io.index import default_config
from cdsjax.io.notes import (
    edges_to_array,
    embedding_text,
    enrich_lite,
    extract_keywords,
    leading_sentences,
    structural_links,
)
from cdsjax.io.reading.vlm import VLMError, enrich_vlm
from tests.scripted_server import OpenAIServer, message_images, message_text


def _doc():
    """Page 0: text, figure + caption; page 1: text citing Figure 1, table + caption, text far away."""
    e = [
        Element("d", 0, [72, 72, 540, 200], "text", "Intro. Selection matters for long documents. More text."),
        Element("d", 0, [150, 220, 450, 400], "figure", "", role="figure", caption="Figure 1: Recall by budget.",
                label="Figure 1"),
        Element("d", 0, [150, 404, 450, 416], "text", "Figure 1: Recall by budget.", role="caption",
                label="Figure 1"),
        Element("d", 1, [72, 72, 540, 150], "text", "As shown in Fig. 1, recall grows; see also Table 2."),
        Element("d", 1, [100, 300, 500, 500], "table", "a | b\n1 | 2", role="table", caption="Table 2: Costs.",
                label="Table 2"),
        Element("d", 1, [100, 280, 500, 292], "text", "Table 2: Costs.", role="caption", label="Table 2"),
        Element("d", 1, [72, 700, 540, 760], "text", "Closing remarks without references."),
    ]
    for i, el in enumerate(e):
        el.reading_order = i
    e[2].parent = 1
    e[5].parent = 4
    return e


def test_structural_links():
    els = _doc()
    edges = structural_links(els, window=1, proximity=10.0)
    assert all(i < j for i, j in edges)
    # reading-order window
    for i in range(len(els) - 1):
        assert (i, i + 1) in edges
    # caption <-> figure / table
    assert (1, 2) in edges and (4, 5) in edges
    # "Fig. 1" and "Table 2" references from note 3 reach the labelled visuals and their captions
    assert {(1, 3), (2, 3), (3, 4), (3, 5)} <= edges
    # proximity: the table caption (y1=292) is 8pt above the table; the closing text is far from both
    assert (4, 5) in edges and (4, 6) not in edges and (0, 6) not in edges
    # nothing else
    assert edges == {(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (1, 3), (3, 5)}
    arr = edges_to_array(edges)
    assert arr.dtype.name == "int32" and arr.shape == (len(edges), 2)


def test_proximity_links_same_page_only():
    a = Element("d", 0, [0, 0, 100, 100], "text", "a", reading_order=0)
    b = Element("d", 0, [105, 0, 200, 100], "text", "b", reading_order=5)
    c = Element("d", 1, [105, 0, 200, 100], "text", "c", reading_order=9)
    edges = structural_links([a, b, c], window=0, proximity=10.0)
    assert edges == {(0, 1)}


def test_lite_notes():
    els = _doc()
    cfg = default_config()
    notes = enrich_lite(els, cfg)
    assert [n.note_id for n in notes] == [f"d#{i}" for i in range(len(els))]
    assert notes[1].summary.startswith("Figure 1: Recall by budget.")
    assert notes[1].kind == "figure" and "figure" in notes[1].tags and "Figure 1" in notes[1].tags
    assert notes[4].summary.startswith("Table 2: Costs.")
    assert notes[0].summary == "Intro. Selection matters for long documents. More text."
    for n in notes:
        assert isinstance(n.keywords, list) and len(n.keywords) <= cfg.enrich.num_keywords
    assert embedding_text(notes[0]) == notes[0].summary + " keywords: " + ", ".join(notes[0].keywords)


def test_leading_sentences_and_keywords():
    text = "First sentence here. Second one is longer than the first. Third."
    assert leading_sentences(text, 25) == "First sentence here."
    assert leading_sentences(text, 1000) == text
    assert len(leading_sentences("x" * 50, 10)) == 10
    kws = extract_keywords("Constrained dominant sets select evidence. Dominant sets avoid redundancy in evidence.",
                           top=5)
    assert kws and any("dominant" in k.lower() for k in kws)
    assert extract_keywords("", top=5) == []


def test_figure_without_caption_uses_surrounding_sentences():
    el = Element("d", 0, [0, 0, 10, 10], "figure", "", role="figure", reading_order=0,
                 context="Earlier text. The map below shows sales by region. [...] Sales rose in the west. Later.")
    note = enrich_lite([el], default_config())[0]
    assert "sales by region" in note.summary and "Sales rose in the west" in note.summary


# --------------------------------------------------------------------------- VLM


def _responder(calls):
    def respond(req):
        system = req["messages"][0]["content"]
        user = message_text(req)
        if "[cdsjax:describe]" in system:
            calls["describe"] += 1
            kind = re.search(r"kind: (\w+)", user).group(1)
            page = re.search(r"page: (\d+)", user).group(1)
            if "Closing remarks" in user:
                return "sorry, no JSON here"
            return "```json\n" + json.dumps({"summary": f"VLM summary of a {kind} on page {page}",
                                             "keywords": ["vlm", kind], "tags": ["tagged"]}) + "\n```"
        if "[cdsjax:verify-links]" in system:
            calls["verify"] += 1
            ids = [int(x) for x in re.findall(r"^\[(\d+)\]", user.split("candidates:")[1], re.M)]
            # keep every candidate except note 6 (the closing remarks)
            return json.dumps({"related": [i for i in ids if i != 6]})
        if "[cdsjax:evolve]" in system:
            calls["evolve"] += 1
            anchor = int(re.search(r"^\[(\d+)\]", user.split("card:")[1], re.M).group(1))
            if anchor == 0:
                return json.dumps({"update": True, "summary": f"evolved round {calls['evolve']}",
                                   "keywords": ["evolved"], "tags": ["e"]})
            return json.dumps({"update": False})
        return "?"

    return respond


def test_vlm_enrichment(tmp_path):
    els = _doc()
    png = tmp_path / "fig.png"
    import pymupdf

    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 20, 10), 0)
    pix.clear_with(50)
    pix.save(str(png))
    els[1].image_path = "fig.png"
    cfg = default_config()
    calls = {"describe": 0, "verify": 0, "evolve": 0}
    with OpenAIServer(_responder(calls)) as srv:
        cfg.enrich.vlm_url = srv.base_url
        cfg.enrich.vlm_model = "test-model"
        cfg.enrich.evolution_rounds = 2
        cfg.enrich.concurrency = 4
        notes = enrich_lite(els, cfg)
        lite_summary_6 = notes[6].summary
        edges = structural_links(els, window=1, proximity=10.0)
        notes, kept = enrich_vlm(notes, els, edges, config=cfg, image_root=tmp_path)
        requests = list(srv.requests)
    assert calls["describe"] == len(els)
    assert notes[1].summary == "VLM summary of a figure on page 1"
    assert notes[4].keywords == ["vlm", "table"] and notes[4].tags == ["tagged"]
    assert notes[6].summary == lite_summary_6, "an unreadable reply keeps the lite note"
    # the figure's crop went to the model as a base64 PNG; text notes carry no image
    images = [message_images(r) for r in requests if "[cdsjax:describe]" in r["messages"][0]["content"]]
    assert sum(len(i) for i in images) == 1 and images and any(
        u.startswith("data:image/png;base64,") for i in images for u in i)
    # verification dropped the link to note 6; caption <-> visual links are kept without asking
    assert (5, 6) not in kept and (1, 2) in kept and (4, 5) in kept
    assert kept == {e for e in edges if 6 not in e}
    # two evolution rounds: note 0 updated, from the snapshot each round
    n_linked = sum(1 for i in range(len(els)) if any(i in e for e in kept))
    assert calls["evolve"] == 2 * n_linked
    assert notes[0].summary.startswith("evolved round") and notes[0].keywords == ["evolved"]
    assert all(r["model"] == "test-model" and r["temperature"] == 0.0 for r in requests)


def test_vlm_unreachable_is_one_line(tmp_path):
    els = _doc()[:2]
    cfg = default_config()
    cfg.enrich.vlm_url = "http://127.0.0.1:9/v1"
    cfg.enrich.max_retries = 0
    cfg.enrich.timeout = 2.0
    notes = enrich_lite(els, cfg)
    with pytest.raises(VLMError, match=r"cannot reach the VLM at http://127.0.0.1:9/v1") as info:
        enrich_vlm(notes, els, set(), config=cfg)
    assert "\n" not in str(info.value)
