"""Cross-validation by document (cdsjax.eval.folds) and the structure arrays problems carry."""

import numpy as np
import pytest

from cdsjax.eval.folds import document_folds, split_problems, validation_split
from cdsjax.eval.pools import DocumentNotes
from cdsjax.eval.problems import NOTE_KINDS, Problem, text_kinds, text_sections
from cdsjax.io.datasets import Query, TextCorpus


def test_folds_partition_documents_and_are_seeded():
    docs = [f"d{i}" for i in range(23)]
    folds = document_folds(docs, 5, seed=3)
    tests = [set(f.test) for f in folds]
    assert set().union(*tests) == set(docs) and sum(len(t) for t in tests) == 23
    for f in folds:
        assert not set(f.test) & set(f.train) and set(f.test) | set(f.train) == set(docs)
        assert 4 <= len(f.test) <= 5
    assert [f.test for f in document_folds(docs, 5, seed=3)] == [f.test for f in folds]
    assert [f.test for f in document_folds(docs, 5, seed=4)] != [f.test for f in folds]
    with pytest.raises(ValueError, match="cannot make"):
        document_folds(docs[:3], 5)


def test_validation_split_holds_out_a_share_of_documents():
    fit, val = validation_split([f"d{i}" for i in range(10)], 0.2, seed=1)
    assert len(val) == 2 and len(fit) == 8 and not set(fit) & set(val)
    fit, val = validation_split(["a", "b"], 0.9)
    assert len(fit) == 1 and len(val) == 1


def _notes(docs, n=4, d=6, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for doc in docs:
        z = rng.normal(size=(n, d)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        out[doc] = DocumentNotes(z, np.zeros((n, n), bool), [f"{doc}#{i}" for i in range(n)],
                                 pages=[0, 0, 1, 2], boxes=[(0, 0, 1, 1)] * n,
                                 kinds=["text", "figure", "table", "text"])
    return out


def test_pools_are_drawn_inside_one_side_of_the_split():
    docs = [f"d{i}" for i in range(12)]
    notes = _notes(docs)
    queries = [Query(f"q{i}", "?", None, (docs[i],), gold_pages={docs[i]: frozenset({0})}) for i in range(12)]
    qemb = np.stack([notes[d].embeddings[0] for d in docs])
    fold = document_folds(docs, 3, seed=0)[0]
    test = split_problems("b", queries, qemb, notes, fold.test, pool_size=3)
    train = split_problems("b", queries, qemb, notes, fold.train, pool_size=3)
    assert {p.query.doc_ids[0] for p in test} == set(fold.test)
    assert {p.query.doc_ids[0] for p in train} == set(fold.train)
    for p in test:
        assert set(p.docs) <= set(fold.test) and len(set(p.docs)) == 3 and p.gold_docs == p.query.doc_ids
    for p in train:
        assert set(p.docs) <= set(fold.train)
    single = split_problems("b", queries, qemb, notes, fold.test)
    assert all(p.pool is None and p.gold_docs is None and set(p.docs) == set(p.query.doc_ids) for p in single)
    s = test[0].structure()
    n = test[0].notes.shape[0]
    assert all(v.shape == (n,) and v.dtype == np.int32 for v in s.values())
    assert sorted(set(s["doc_ids"].tolist())) == [0, 1, 2]
    assert s["kinds"][:4].tolist() == [NOTE_KINDS.index(k) for k in ("text", "figure", "table", "text")]
    assert s["pages"][:4].tolist() == [0, 0, 1, 2]


def test_text_sections_and_kinds():
    corpus = TextCorpus("c", ("p0", "p1", "p2", "p3", "f0", "f1"), ("a", "b", "c", "d", "Table 1: x", "Figure 2: y"),
                        ("paragraph",) * 4 + ("caption",) * 2,
                        meta={"sections": ["Intro", "Intro", "Method", "Intro", "t.png", "f.png"]})
    assert text_sections(corpus) == [0, 0, 1, 2, 3, 4]
    assert text_kinds(corpus) == ["text"] * 4 + ["table", "figure"]
    bare = TextCorpus("h", ("a", "b"), ("x", "y"), ("paragraph", "paragraph"))
    assert text_sections(bare) == [0, 1]
    z = np.eye(6, dtype=np.float32)
    p = Problem(Query("q", "?", None, ("c",)), z, z[0], np.zeros((6, 6), bool), list(corpus.note_ids), ["c"] * 6,
                kinds=text_kinds(corpus), sections=text_sections(corpus))
    assert p.structure()["pages"].tolist() == [0, 0, 1, 2, 3, 4]
    # the learned game reads printed pages only: a text problem's notes are each their own unit
    assert p.structure(pages_only=True)["pages"].tolist() == [0, 1, 2, 3, 4, 5]
    from cdsjax import core

    assert core.SPECS["cds_learned"].pages_only
    assert not core.SPECS["cosine_pages"].pages_only
    with pytest.raises(ValueError, match="sections has 2 entries"):
        Problem(Query("q", "?", None, ("c",)), z, z[0], np.zeros((6, 6), bool), list(corpus.note_ids), ["c"] * 6,
                sections=[0, 1])
