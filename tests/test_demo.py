"""`cdsjax demo`: the generated report's layout, the facts-covered table, and its verdict."""

import numpy as np

from cdsjax import demo
from cdsjax.commands.demo import demo_selectors, verdict
from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, display

from tests.conftest import run_command


def test_report_pages_hold_the_facts_they_are_mapped_to(tmp_path):
    import pymupdf

    pdf = demo.write_report(tmp_path / "r.pdf")
    with pymupdf.open(pdf) as doc:
        texts = [" ".join(page.get_text().split()) for page in doc]
        images = [len(page.get_images()) for page in doc]
    assert len(texts) == len(demo.PAGES)
    for page, (fact, _) in demo.PAGES.items():
        for other, phrase in demo.FACTS.items():
            assert (phrase in texts[page]) == (other == fact), (page, other)
    finding_pages = [p for p, (f, _) in demo.PAGES.items() if f == "finding"]
    assert len(finding_pages) >= 4  # summary, intro, chart + caption, results, conclusion
    chart_page = next(p for p, (_, role) in demo.PAGES.items() if role.startswith("chart"))
    assert images[chart_page] == 1 and sum(images) == 1


def test_coverage_counts_facts_and_restatements():
    assert demo.coverage([0, 1, 4, 6]) == dict(covered=["finding", "method", "cost"], restatements=1, other=0)
    assert demo.coverage([3, 9, 2, 0]) == dict(covered=["finding"], restatements=3, other=0)
    assert demo.coverage([7, 8, 5]) == dict(covered=["caveat"], restatements=0, other=2)
    assert demo.coverage([]) == dict(covered=[], restatements=0, other=0)


def test_verdict_reports_what_was_measured():
    def row(sel, covered, restated):
        return dict(selector=sel, covered=covered, restatements=restated)

    default = display(DEFAULT_SELECTOR)
    more = verdict([row(default, ["finding", "method"], 0), row("cosine", ["finding"], 3)])
    same = verdict([row(default, ["finding"], 3), row("cosine", ["finding"], 3)])
    fewer = verdict([row(default, ["caveat"], 0), row("cosine", ["finding", "cost"], 1)])
    assert more.startswith("CDS covers more") and "2 vs 1" in more
    assert same.startswith("CDS does not cover more") and "both cover 1" in same
    assert fewer.startswith("CDS covers fewer") and "1 vs 2" in fewer


def test_demo_table_matches_the_selections(demo_run, monkeypatch):
    root, result = demo_run
    monkeypatch.setenv("CDSJAX_CACHE", str(root / "cache"))
    assert result["question"] == demo.QUESTION and result["facts"] == list(demo.FACTS)
    assert [r["label"] for r in result["selectors"]] == [label for label, _ in demo_selectors()]
    for r in result["selectors"]:
        assert len(r["pages"]) == result["budget"] == 4
        expect = demo.coverage(r["pages"])
        assert r["covered"] == expect["covered"] and r["restatements"] == expect["restatements"]
        assert ("mode" in r["diagnostics"]) == r["selector"].startswith("cds")
    assert result["verdict"] == verdict(result["selectors"])

    # the table's cosine row is the ranking of the report's notes by their relevance (the default's: the cosine
    # mixed with BM25, cdsjax.io.relevance), recomputed here
    from cdsjax.io.index import load_index
    from cdsjax.io.relevance import LexicalIndex, fuse, lexical_text
    from cdsjax.pipeline import Corpus, Pipeline

    pipe = Pipeline(Corpus.merge([load_index(root / "index")]))
    q = pipe.encode([demo.QUESTION])[0]
    dense = pipe.corpus.embeddings @ q
    relevance = fuse(dense, LexicalIndex.build([lexical_text(n) for n in pipe.corpus.notes]).scores(demo.QUESTION),
                     pipe.relevance.weight) if pipe.relevance.mode == "hybrid" else dense
    order = np.argsort(-relevance, kind="stable")[:4]
    cosine = next(r for r in result["selectors"] if r["selector"] == "cosine")
    assert cosine["pages"] == [int(pipe.corpus.notes[i]["page"]) for i in order]

    # the printed table: every selector, the verdict, and a reused index on the second run
    code, out, _ = run_command(root, "demo", "--dir", str(root))
    out = " ".join(out.split())
    assert code == 0 and "reused" in out
    default = display(DEFAULT_SELECTOR)
    assert all(name in out for _, name in demo_selectors()) and f"{default} *" in out
    assert f"* {default}: the default selector" in out
    assert " ".join(result["verdict"].split()) in out
