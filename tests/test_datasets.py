"""Benchmark loaders on the real files in ../shared/data, and VisDoM on a CSV + PDFs written here."""

import ast
import collections
import csv
import json

import pytest

from cdsjax.io import datasets as D


# --------------------------------------------------------------------------- MMLongBench-Doc


@pytest.fixture(scope="module")
def mmlb(data_root):
    return D.load_mmlongbench(data_root)


@pytest.fixture(scope="module")
def mmlb_raw(data_root):
    with open(data_root / D.MMLONGBENCH_SAMPLES) as f:
        return json.load(f)


def test_mmlongbench_counts_and_documents(mmlb, mmlb_raw):
    assert len(mmlb) == len(mmlb_raw) == 324
    assert len({q.qid for q in mmlb.queries}) == 324
    assert set(mmlb.documents) == {s["doc_id"] for s in mmlb_raw}
    assert all(p.is_file() and p.suffix == ".pdf" for p in mmlb.documents.values())
    unanswerable = [q for q in mmlb.queries if not q.meta["answerable"]]
    assert len(unanswerable) == sum(s["evidence_pages"] == "[]" for s in mmlb_raw) == 61
    assert all(not q.gold_pages for q in unanswerable)


def test_mmlongbench_pages_are_zero_based_and_in_range(mmlb, mmlb_raw):
    import pymupdf

    counts = {d: pymupdf.open(p).page_count for d, p in mmlb.documents.items()}
    n_with_pages = 0
    for q, s in zip(mmlb.queries, mmlb_raw):
        assert q.question == s["question"] and q.doc_ids == (s["doc_id"],)
        one_based = ast.literal_eval(s["evidence_pages"])
        expected = {p - 1 for p in one_based if 1 <= p <= counts[s["doc_id"]]}
        assert set(q.gold_pages.get(s["doc_id"], ())) == expected
        assert sorted(q.meta["dropped_pages"]) == sorted(
            {p - 1 for p in one_based} - expected)
        n_with_pages += bool(expected)
    # "[5]" on the first question is page index 4.
    assert mmlb.queries[0].gold_pages == {mmlb_raw[0]["doc_id"]: frozenset({4})}
    # A few benchmark pages point past the shipped PDFs (e.g. a 1-based "[0]").
    assert 0 < sum(bool(q.meta["dropped_pages"]) for q in mmlb.queries) < 15
    assert n_with_pages > 250


def test_mmlongbench_gold_boxes_from_mmdocir(mmlb, data_root):
    import pymupdf

    with_boxes = [q for q in mmlb.queries if q.gold_boxes]
    assert 200 < len(with_boxes) <= 249  # MMDocIR annotates 249 questions on these PDFs
    checked = 0
    for q in with_boxes:
        doc = pymupdf.open(mmlb.documents[q.doc_ids[0]])
        for box in q.gold_boxes:
            assert box.doc == q.doc_ids[0]
            x0, y0, x1, y1 = box.bbox
            rect = doc[box.page].rect
            assert 0 <= x0 < x1 <= rect.width + 1 and 0 <= y0 < y1 <= rect.height + 1
        # Where MMDocIR and the benchmark agree on pages, the boxes lie on gold pages.
        if q.meta["pages_agree"]:
            assert {b.page for b in q.gold_boxes} <= set(q.gold_pages[q.doc_ids[0]])
            checked += 1
    assert checked > 150
    # The box of the first question holds text of the chart the question asks about.
    q0 = mmlb.queries[0]
    b = q0.gold_boxes[0]
    text = pymupdf.open(mmlb.documents[b.doc])[b.page].get_text(clip=pymupdf.Rect(b.bbox))
    assert "Hispanic" in text or "Latino" in text or "%" in text


def test_mmlongbench_mmdocir_pages_and_max_queries(data_root):
    b = D.load_mmlongbench(data_root, max_queries=240, page_source="mmdocir")
    assert len(b) == 240
    for q in b.queries:
        if q.meta["mmdocir_pages"] is not None:
            assert set(q.gold_pages.get(q.doc_ids[0], ())) == set(q.meta["mmdocir_pages"])
    # The San Francisco guide excerpt: the benchmark numbers pages from the whole book
    # (out of range here); MMDocIR gives the page inside the PDF.
    sf = [q for q in b.queries if q.question.startswith("What is the Pier with the longest")]
    assert len(sf) == 1 and sf[0].gold_pages == {sf[0].doc_ids[0]: frozenset({7})}
    assert sf[0].meta["dropped_pages"] == []
    with pytest.raises(ValueError, match="page_source"):
        D.load_mmlongbench(data_root, page_source="pdf")


# --------------------------------------------------------------------------- QASPER


@pytest.fixture(scope="module")
def qasper(data_root):
    return D.load_qasper(data_root)


@pytest.fixture(scope="module")
def qasper_raw(data_root):
    with open(data_root / D.QASPER_FILE) as f:
        return json.load(f)


def test_qasper_counts(qasper, qasper_raw):
    assert len(qasper.corpora) == len(qasper_raw) == 209
    assert len(qasper) == sum(len(p["qas"]) for p in qasper_raw.values())
    assert len({q.qid for q in qasper.queries}) == len(qasper)
    with_gold = [q for q in qasper.queries if q.gold_note_ids]
    assert len(with_gold) / len(qasper) > 0.9
    for c in qasper.corpora.values():
        assert len(c) == len(c.texts) and all(t.strip() for t in c.texts)
        assert set(c.kinds) <= {"paragraph", "caption"}


def test_qasper_gold_found_verbatim(qasper, qasper_raw):
    n_caption_gold = n_unmatched = 0
    n_evidence = sum(len(a["answer"]["evidence"]) for p in qasper_raw.values() for x in p["qas"]
                     for a in x["answers"])
    for q in qasper.queries:
        paper_id = q.doc_ids[0]
        corpus = qasper.corpora[paper_id]
        text_of = dict(zip(corpus.note_ids, corpus.texts))
        kind_of = dict(zip(corpus.note_ids, corpus.kinds))
        raw_q = next(x for x in qasper_raw[paper_id]["qas"] if x["question_id"] == q.qid)
        evidence = [e for a in raw_q["answers"] for e in a["answer"]["evidence"]]
        paragraphs = {p.strip() for s in qasper_raw[paper_id]["full_text"] for p in s["paragraphs"]}
        captions = {f["caption"].strip() for f in qasper_raw[paper_id]["figures_and_tables"]}
        for nid in q.gold_note_ids:
            text = text_of[nid]
            if kind_of[nid] == "caption":
                n_caption_gold += 1
                assert text in captions
                assert any(e.startswith("FLOAT SELECTED") and text in e for e in evidence)
            else:
                # Matched verbatim up to runs of whitespace (QASPER evidence strings
                # sometimes fold the newlines inside equations).
                assert text in paragraphs
                flat = " ".join(text.split())
                assert any(flat == " ".join(e.split()) or " ".join(e.split()) in flat
                           for e in evidence if e.strip())
        if not evidence:
            assert not q.gold_note_ids
        # Every evidence string is either mapped (to a note of that annotator's gold) or reported, in order.
        para_notes = [(nid, " ".join(t.split())) for nid, t in text_of.items() if kind_of[nid] == "paragraph"]
        cap_notes = [(nid, " ".join(t.split())) for nid, t in text_of.items() if kind_of[nid] == "caption"]
        unmatched = []
        answers = [a["answer"] for a in raw_q["answers"]]
        assert len(q.meta["gold_per_annotator"]) == len(answers)
        for ann, gold in zip(answers, q.meta["gold_per_annotator"]):
            mapped = set()
            for e in ann["evidence"]:
                if e.startswith("FLOAT SELECTED: "):
                    nid = _unique_match(e[len("FLOAT SELECTED: "):], cap_notes)
                else:
                    nid = _unique_match(e, para_notes)
                if nid is None:
                    unmatched.append(e)
                else:
                    mapped.add(nid)
            assert set(gold) == mapped, q.qid
        assert q.meta["unmatched_evidence"] == unmatched, q.qid
        n_unmatched += len(unmatched)
    assert n_caption_gold > 100
    assert 0 < n_unmatched < n_evidence / 10, (n_unmatched, n_evidence)  # a few cite section headings


def _unique_match(evidence, notes):
    """The note an evidence string names: equal up to whitespace (the first such note), else the only note
    that contains it; None when there is no such note or several contain it."""
    key = " ".join(evidence.split())
    if not key:
        return None
    equal = [nid for nid, text in notes if text == key]
    if equal:
        return equal[0]
    containing = [nid for nid, text in notes if key in text]
    return containing[0] if len(containing) == 1 else None


def test_qasper_max_queries(data_root):
    b = D.load_qasper(data_root, max_queries=5)
    assert len(b) == 5
    assert set(b.corpora) == {q.doc_ids[0] for q in b.queries}


# --------------------------------------------------------------------------- HotpotQA


def test_hotpotqa_gold_paragraphs(data_root):
    b = D.load_hotpotqa(data_root)
    with open(data_root / D.HOTPOTQA_FILE) as f:
        raw = json.load(f)
    assert len(b) == len(raw) == 100
    assert len(b.corpora) == 100
    sizes = collections.Counter()
    for q, item in zip(b.queries, raw):
        corpus = b.corpora[q.doc_ids[0]]
        assert len(corpus) == len(item["context"]) <= 10
        assert 2 <= len(q.gold_note_ids) <= 5 and q.gold_note_ids <= set(corpus.note_ids)
        titles = {t for t, _ in item["supporting_facts"]}
        gold_titles = {corpus.texts[corpus.note_ids.index(n)].split("\n", 1)[0]
                       for n in q.gold_note_ids}
        assert gold_titles == titles
        sizes[len(corpus)] += 1
    assert sizes[10] >= 95
    assert len(D.load_hotpotqa(data_root, max_queries=3)) == 3


# --------------------------------------------------------------------------- VisDoMBench


def _write_pdf(path, pages):
    import pymupdf

    doc = pymupdf.open()
    for i in range(pages):
        doc.new_page().insert_text((72, 72), f"{path.stem} page {i}")
    doc.save(path)


@pytest.fixture()
def visdom_root(tmp_path):
    sub = tmp_path / "visdom" / "feta_tab"
    (sub / "docs").mkdir(parents=True)
    for name, pages in [("doc_a", 3), ("doc_b", 2), ("doc_c", 4)]:
        _write_pdf(sub / "docs" / f"{name}.pdf", pages)
    rows = [
        {"q_id": "q1", "question": "Which team won?", "answer": "['Team A']",
         "documents": "['doc_a.pdf', 'doc_b.pdf']", "doc_path": "docs/doc_a.pdf"},
        {"q_id": "q2", "question": "How many goals?", "answer": "3",
         "documents": '["doc_b", "doc_c"]', "doc_path": "doc_c.pdf"},
        {"q_id": "q3", "question": "No gold here?", "answer": "",
         "documents": "doc_a.pdf; doc_c.pdf", "doc_path": ""},
    ]
    with open(sub / "feta_tab.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return tmp_path


def test_visdom_document_level_gold(visdom_root):
    b = D.load_visdom(visdom_root, "feta_tab")
    assert b.name == "visdom/feta_tab"
    assert set(b.documents) == {"doc_a", "doc_b", "doc_c"}
    q1, q2, q3 = b.queries
    assert q1.qid == "q1" and q1.doc_ids == ("doc_a", "doc_b") and q1.answer == "Team A"
    assert q1.gold_pages == {"doc_a": frozenset({0, 1, 2})}  # every page of the gold document
    assert q2.doc_ids == ("doc_b", "doc_c") and q2.gold_pages == {"doc_c": frozenset(range(4))}
    assert q3.doc_ids == ("doc_a", "doc_c") and not q3.gold_pages and q3.answer is None
    assert not q1.meta["page_level"]
    assert len(D.load_benchmark("visdom", visdom_root, max_queries=2, subset="feta_tab")) == 2


def test_visdom_page_level_and_column_variants(tmp_path):
    sub = tmp_path / "slidevqa"
    (sub / "docs").mkdir(parents=True)
    _write_pdf(sub / "docs" / "deck1.pdf", 5)
    _write_pdf(sub / "docs" / "deck2.pdf", 5)
    with open(sub / "questions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "Query", "gt_answer", "candidate_documents", "gold_doc", "evidence_pages"])
        w.writerow(["s1", "What is on slide 2?", "x", "deck1|deck2", "deck2", "[2, 9]"])
        w.writerow(["s2", "And slide 1?", "y", "['deck1']", "", "1"])
    b = D.load_visdom(sub)  # the subset folder itself, 1-based pages
    s1, s2 = b.queries
    assert s1.gold_pages == {"deck2": frozenset({1})}  # page 9 is past the end: dropped
    assert s2.gold_pages == {"deck1": frozenset({0})}  # single candidate is the gold doc
    assert s1.meta["page_level"]
    b0 = D.load_visdom(sub, page_base=0)
    assert b0.queries[0].gold_pages == {"deck2": frozenset({2})}


def test_visdom_errors_name_the_problem(visdom_root, tmp_path):
    with pytest.raises(FileNotFoundError, match="spiqa"):
        D.load_visdom(visdom_root, "spiqa")
    sub = visdom_root / "visdom" / "feta_tab"
    (sub / "docs" / "doc_b.pdf").unlink()
    with pytest.raises(FileNotFoundError, match="doc_b"):
        D.load_visdom(visdom_root, "feta_tab")
    bad = tmp_path / "bad"
    (bad / "docs").mkdir(parents=True)
    (bad / "bad.csv").write_text("q_id,question\n1,hi\n")
    with pytest.raises(ValueError, match="documents column"):
        D.load_visdom(bad)


def test_data_root_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_root"):
        D.resolve_data_root(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="samples"):
        D.load_mmlongbench(tmp_path)
    with pytest.raises(ValueError, match="benchmark must be one of"):
        D.load_benchmark("squad", tmp_path)
