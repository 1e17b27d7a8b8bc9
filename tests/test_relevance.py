"""Relevance: the query--note scores every selector ranks by (cdsjax.io.relevance, CDSProblem.query_scores)."""

import numpy as np
import pytest

from cdsjax.core.types import CDSProblem
from cdsjax.io.relevance import LexicalIndex, Relevance, fuse, settings_of, tokenize

# one selector of each family: the baselines, a page read-out, the paper's game, the learned game (dense block)
SELECTORS = ("cosine", "mmr", "dpp", "ppr", "subgraph", "cosine_pages", "cds_converged", "cds_learned",
             "cds_learned_pages")


def _selector(name, budget=5):
    from cdsjax.pipeline.selection import resolve_selector

    return resolve_selector(name, budget)[1]


def _problem(n=24, d=16, seed=0, **extra):
    rng = np.random.default_rng(seed)
    notes = rng.normal(size=(n, d)).astype(np.float32)
    notes /= np.linalg.norm(notes, axis=1, keepdims=True)
    query = notes[0] + 0.5 * notes[1]
    query = (query / np.linalg.norm(query)).astype(np.float32)
    links = np.zeros((n, n), bool)
    links[np.arange(n - 1), np.arange(1, n)] = True
    links |= links.T
    pages = np.arange(n, dtype=np.int32) // 3
    return notes, query, CDSProblem.create(notes, query, links=links, pages=pages, doc_ids=np.zeros(n, np.int32),
                                           kinds=np.zeros(n, np.int32), **extra)


@pytest.mark.parametrize("name", SELECTORS)
def test_the_cosine_given_as_scores_picks_what_the_embeddings_pick(name):
    notes, query, plain = _problem()
    given = plain.replace(query_scores=(query @ notes.T)[None, :])
    fn = _selector(name)
    a, b = fn(plain), fn(given)
    np.testing.assert_array_equal(np.asarray(a.indices)[np.asarray(a.selected_valid)],
                                  np.asarray(b.indices)[np.asarray(b.selected_valid)])


@pytest.mark.parametrize("name", ("cosine", "mmr", "cds_converged", "cds_learned_pages"))
def test_every_selector_ranks_by_the_scores_it_is_given(name):
    notes, query, plain = _problem()
    cos = query @ notes.T
    far = int(np.argmin(cos))  # the note least like the question, by the embeddings
    scores = cos.copy()
    scores[far] = cos.max() + 0.2  # ... that the lexical match says answers it
    fn = _selector(name)
    before, after = fn(plain), fn(plain.replace(query_scores=scores[None, :]))
    assert far not in np.asarray(before.indices)[np.asarray(before.selected_valid)]
    assert far in np.asarray(after.indices)[np.asarray(after.selected_valid)]


def test_scores_of_the_wrong_shape_are_one_line():
    notes, query, _ = _problem()
    with pytest.raises(ValueError, match="query_scores must have shape"):
        CDSProblem.create(notes, query, query_scores=np.zeros(5, np.float32))


def test_bm25_matches_numbers_names_and_stems():
    texts = ["The model reaches 83.2% accuracy on MMLU Physics.", "We fine-tune BERT-base with 12 layers.",
             "Results improve steadily.", "x", ""]
    index = LexicalIndex.build(texts)
    assert np.argmax(index.scores("What accuracy on MMLU?")) == 0
    assert np.argmax(index.scores("Which BERT variant?")) == 1
    assert np.argmax(index.scores("how much did it improve")) == 2  # 'improve' ~ 'improves' by its stem
    assert index.scores("83.2")[0] > 0 and index.scores("83.2")[1:].max() == 0


@pytest.mark.parametrize("question", ["", "   ", "what is the of and", "?!", "zzzz qqqq"])
def test_a_question_without_a_matching_word_ranks_by_the_cosine(question):
    index = LexicalIndex.build(["alpha beta", "gamma", "x"])
    lexical = index.scores(question)
    assert lexical.shape == (3,) and not lexical.any()
    dense = np.array([0.3, 0.5, 0.1], np.float32)
    np.testing.assert_array_equal(fuse(dense, lexical, 0.4), dense)


def test_hostile_notes_give_scores_not_errors():
    texts = ["a", "", "word " * 20_000, "naïve café Zürich 東京"]
    index = LexicalIndex.build(texts)
    assert index.scores("word").argmax() == 2
    assert index.scores("Zürich")[3] > 0
    assert LexicalIndex.build([]).scores("anything").shape == (0,)
    assert not LexicalIndex.build(["", " "]).scores("the").any()


def test_fuse_stays_on_the_cosine_scale():
    dense = np.array([0.6, 0.2, 0.1, 0.4], np.float32)
    lexical = np.array([0.0, 9.0, 0.0, 3.0], np.float32)
    mixed = fuse(dense, lexical, 0.5)
    assert mixed.max() <= dense.max() + 1e-6 and mixed.dtype == np.float32
    assert fuse(dense.astype(np.float64), lexical, 0.5).dtype == np.float64
    assert np.argmax(mixed) == 1  # the best lexical match counts as the best cosine, half and half
    np.testing.assert_allclose(fuse(dense, lexical, 0.0), dense)
    valid = np.array([True, True, True, False])
    assert fuse(dense, lexical, 0.5, valid)[3] == dense[3]  # padding keeps its value
    with pytest.raises(ValueError, match="lexical weight"):
        fuse(dense, lexical, 1.5)


def test_relevance_settings_are_checked_in_one_line():
    assert settings_of(None)["mode"] in ("dense", "hybrid")
    assert settings_of({"relevance": "dense"})["mode"] == "dense"
    with pytest.raises(ValueError, match="relevance must be one of"):
        settings_of({"relevance": "sparse"})
    with pytest.raises(ValueError, match="no field 'bogus'"):
        settings_of({"relevance": {"bogus": 1}})
    assert Relevance(["a"], "dense").scores("a", np.ones(1)) is None
    assert Relevance(["a b"], "hybrid", 0.5).describe() == {"mode": "hybrid", "lexical_weight": 0.5}
    assert tokenize(["The 1,024 tokens of v1.5"])[0] == ["1,024", "token", "v1.5"]


class _Encoder:
    """A question encoder whose vector says nothing of the words: every question sits on one fixed direction, as
    like every note as any other."""

    def __init__(self, direction):
        self.direction = direction

    def encode_queries(self, texts):
        return np.stack([self.direction for _ in texts]).astype(np.float32)


def _pipeline(relevance, texts):
    from cdsjax.pipeline import Pipeline
    from cdsjax.pipeline.corpus import Corpus

    n, d = len(texts), 8
    emb = np.eye(d, dtype=np.float32)[np.arange(n) % d]
    notes = [dict(note_id=f"n{i}", doc_id="doc", page=i, kind="text", text=t, summary=t[:200], caption="",
                  bbox=[0.0, 0.0, 10.0, 10.0]) for i, t in enumerate(texts)]
    corpus = Corpus(embeddings=emb, links=np.zeros((n, n), bool), notes=notes, embedder={"model": "test"}, roots=[])
    direction = emb.sum(axis=0) / np.linalg.norm(emb.sum(axis=0))
    return Pipeline(corpus, embedder=_Encoder(direction), relevance=relevance)


TEXTS = ["An overview of the system.", "The encoder has 12 layers.", "Zeppelin accuracy reached 91.4 on the test set.",
         "a", "word " * 25_000, "Related work and future plans."]


def test_hybrid_relevance_finds_the_note_that_names_the_question_words():
    dense = _pipeline("dense", TEXTS).retrieve("What accuracy did Zeppelin reach?", selector="cosine", budget=1)
    hybrid = _pipeline("hybrid", TEXTS).retrieve("What accuracy did Zeppelin reach?", selector="cosine", budget=1)
    assert dense.evidence[0]["note_id"] == "n0"  # the encoder cannot tell: a tie, to the first note
    assert hybrid.evidence[0]["note_id"] == "n2"
    assert hybrid.to_dict()["relevance"]["mode"] == "hybrid" and dense.relevance == {"mode": "dense"}


@pytest.mark.parametrize("question", ["the of and a", "?", "x"])
def test_hostile_questions_select_by_the_cosine_without_an_error(question):
    answer = _pipeline("hybrid", TEXTS).retrieve(question, selector="cds-learned-pages", budget=3)
    assert 1 <= len(answer.evidence) <= 3


def test_an_empty_question_and_an_unknown_relevance_are_one_line():
    from cdsjax.pipeline import PipelineError

    with pytest.raises(PipelineError, match="empty"):
        _pipeline("hybrid", TEXTS).retrieve("  ")
    with pytest.raises(PipelineError, match="relevance must be one of"):
        _pipeline("lexical", TEXTS)


def test_notes_are_placed_under_their_title_and_section():
    from cdsjax.io.notes import embedding_text
    from cdsjax.io.placement import is_heading, place

    assert is_heading("4.2 Experimental Setup") and is_heading("ABSTRACT") and is_heading("Related Work")
    assert not is_heading("We train the model for 3 epochs.") and not is_heading("2019")
    elements = [dict(kind="text", page=0, role="body", text="Weak-to-Strong Generalization\n\nAbstract\n\nWe study"),
                dict(kind="text", page=0, role="body", text="more of it.\n\n1 Introduction\n\nLarge models"),
                dict(kind="figure", page=1, role="figure", text=""),
                dict(kind="text", page=1, role="body", text="3.1 Setup\n\nWe fine-tune.")]
    title, sections = place(elements)
    assert title == "Weak-to-Strong Generalization"
    assert sections[1:] == ["Abstract", "1 Introduction", "3.1 Setup"]
    note = dict(summary="We fine-tune.", keywords=["fine-tune"], title=title, section="3.1 Setup")
    assert embedding_text(note, context=True) == ("We fine-tune. keywords: fine-tune (in: Weak-to-Strong Generalization / "
                                    "3.1 Setup)")
    assert embedding_text(note, context=False) == embedding_text(note) == "We fine-tune. keywords: fine-tune"
    assert embedding_text(dict(summary="x")) == "x"  # an index of before has no place: its text alone


def test_building_the_lexical_index_logs_nothing_a_person_would_see(caplog):
    import logging

    with caplog.at_level(logging.DEBUG):
        LexicalIndex.build(["alpha beta", "gamma"]).scores("alpha")
    assert not [r for r in caplog.records if r.name.startswith("bm25s")]
