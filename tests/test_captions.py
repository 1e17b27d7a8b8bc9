"""A visual and its caption read together (issue 62, item 8): the default's page read-out reads a caption note as
the figure, table or chart it describes (cdsjax.core.readouts.fold_described), so it never returns a table's
caption and leaves the table behind; a loaded index's caption notes name their visual (cdsjax.io.notes.
described_notes, ``describes``), which the pipeline, the integrations' metadata and the evaluation's problems
turn into the problem's ``describes`` array (cdsjax.pipeline.selection.described_notes)."""

import jax
import jax.numpy as jnp
import numpy as np

from cdsjax.pipeline.catalog import DEFAULT_SELECTOR
from cdsjax.core import readouts as S
from cdsjax.io import notes as io_notes
from cdsjax.pipeline.selection import described_notes


def test_fold_described_reads_a_caption_as_its_visual_under_jit_and_vmap():
    # notes 0..5 valid, 6..7 padding; note 1 captions note 0, note 3 captions note 4 (ranked after its caption),
    # note 5 points at a caption (a chain: not folded), padding 6 points at 2 (ignored), note 2 at itself
    rank = jnp.asarray([3, 0, 2, 1, 5, 4, 6, 7], jnp.int32)
    valid = jnp.asarray([True] * 6 + [False] * 2)
    describes = jnp.asarray([-1, 0, 2, 4, -1, 1, 2, -1], jnp.int32)
    folded, readable = jax.jit(S.fold_described)(rank, valid, describes)
    np.testing.assert_array_equal(np.asarray(readable), [True, False, True, False, True, True, False, False])
    got = np.asarray(folded)
    assert got[0] == 0 and got[4] == 1  # each visual at the better of its own and its caption's rank
    assert got[2] == 2 and got[5] == 4  # the others keep theirs
    assert len(set(got[np.asarray(readable)].tolist())) == 4  # distinct on readable notes
    # nothing describes anything: the ranking and the valid notes unchanged
    same, ok = S.fold_described(rank, valid, jnp.full((8,), -1, jnp.int32))
    np.testing.assert_array_equal(np.asarray(same), np.asarray(rank))
    np.testing.assert_array_equal(np.asarray(ok), np.asarray(valid))
    # a batch under vmap is each row on its own
    ranks = jnp.stack([rank, jnp.roll(rank, 1)])
    many = jax.vmap(S.fold_described, in_axes=(0, None, 0))(ranks, valid, jnp.stack([describes, -describes - 1]))
    for row in range(2):
        one = S.fold_described(ranks[row], valid, jnp.stack([describes, -describes - 1])[row])
        np.testing.assert_array_equal(np.asarray(many[0][row]), np.asarray(one[0]))
        np.testing.assert_array_equal(np.asarray(many[1][row]), np.asarray(one[1]))
    # read one note per page: page 0 holds the caption (best) and its table, pages 1 and 2 one note each
    pages = jnp.asarray([0, 0, 1, 2, 2, 3, 0, 0])
    idx, ok = S.structured_readout(rank, valid, pages, budget=3)
    assert np.asarray(idx)[np.asarray(ok)].tolist() == [1, 3, 2]  # the captions, not their visuals
    idx, ok = S.structured_readout(folded, readable, pages, budget=3)
    assert np.asarray(idx)[np.asarray(ok)].tolist() == [0, 4, 2]  # the visuals, same pages, same order


def _note(i, doc, page, kind, role, text, caption="", footnote=""):
    return {"note_id": f"{doc}#{i}", "doc_id": doc, "page": page, "kind": kind, "role": role, "text": text,
            "caption": caption, "footnote": footnote, "summary": caption or text, "reading_order": i,
            "bbox": [0, 0, 1, 1], "image_path": None}


def test_a_caption_note_names_the_visual_holding_its_text():
    notes = [
        _note(0, "a", 0, "table", "table", "x | y", caption="Table 1: Revenue. (continued)"),
        _note(1, "a", 0, "text", "caption", "Table 1:  Revenue."),  # whitespace differs
        _note(2, "a", 0, "figure", "figure", "", caption="Figure 2: Costs", footnote="Source: ACME"),
        _note(3, "a", 0, "text", "footnote", "Source: ACME"),
        _note(4, "a", 1, "text", "caption", "Figure 2: Costs"),  # another page: no visual there holds it
        _note(5, "b", 0, "text", "caption", "Table 1: Revenue."),  # another document
        _note(6, "a", 0, "text", "body", "Table 1: Revenue."),  # a body note describes nothing
        _note(7, "a", 2, "chart", "chart", "", caption="Figure 9: Sales"),
        _note(8, "a", 2, "chart", "chart", "", caption="Figure 9: Sales"),
        _note(9, "a", 2, "text", "caption", "Figure 9: Sales"),  # two hold it: the nearer in reading order
    ]
    assert io_notes.described_notes(notes) == [-1, 0, -1, 2, -1, -1, -1, -1, -1, 8]
    # the problem's array: positions of the named notes among the candidates; one that is not there, none
    named = [dict(n, describes=notes[j]["note_id"]) if j >= 0 else n
             for n, j in zip(notes, io_notes.described_notes(notes))]
    assert described_notes(named).tolist() == [-1, 0, -1, 2, -1, -1, -1, -1, -1, 8]
    assert described_notes(named[1:4]).tolist() == [-1, -1, 1]  # the table of note 1 is not among them
    from cdsjax.pipeline.evidence import note_metadata

    meta = [note_metadata(n) for n in named]
    assert meta[1]["describes"] == "a#0" and "describes" not in meta[0]
    assert described_notes(meta).tolist() == described_notes(named).tolist()


def _two_documents(named: bool):
    """Document a: a table and its caption on page 0 (the caption the closest to the question), an unrelated
    paragraph on page 1; document b: one note on each of three pages, less close than the table."""
    rows = [("a", 0, "table", "table", "north 12 south 30", "Table 1: Revenue by region", 0.80),
            ("a", 0, "text", "caption", "Table 1: Revenue by region", "", 0.90),
            ("a", 1, "text", "body", "An unrelated paragraph.", "", 0.30),
            ("b", 0, "text", "body", "A note of the other document.", "", 0.60),
            ("b", 1, "text", "body", "Another note of b.", "", 0.55),
            ("b", 2, "text", "body", "A third note of b.", "", 0.50)]
    notes, vectors = [], []
    for i, (doc, page, kind, role, text, caption, cosine) in enumerate(rows):
        notes.append(_note(i, doc, page, kind, role, text, caption=caption))
        v = np.zeros(16, np.float32)
        v[0], v[i + 1] = cosine, np.sqrt(1 - cosine ** 2)  # cosine to the question e_0, orthogonal otherwise
        vectors.append(v)
    if named:  # as load_index records it
        for note, j in zip(notes, io_notes.described_notes(notes)):
            if j >= 0:
                note["describes"] = notes[j]["note_id"]
    return notes, np.stack(vectors)


def test_the_default_reads_a_table_with_its_caption_on_two_documents():
    from cdsjax.pipeline import Corpus, Pipeline

    question = np.eye(16, dtype=np.float32)[0]
    picked = {}
    for named in (False, True):  # no note naming what it describes: the read-out as it was
        notes, z = _two_documents(named)
        pipe = Pipeline(Corpus(embeddings=z, links=np.zeros((len(notes), len(notes)), bool), notes=notes,
                               embedder={"model": "all-MiniLM-L6-v2"}, roots=[]), embedder=object())
        for selector in (DEFAULT_SELECTOR, "cosine"):
            sel = pipe.select(question, selector=selector, budget=3)
            picked[named, selector] = [notes[int(i)]["note_id"] for i, ok in
                                       zip(np.asarray(sel.indices), np.asarray(sel.selected_valid)) if ok]
    before, after = picked[False, DEFAULT_SELECTOR], picked[True, DEFAULT_SELECTOR]
    assert "a#1" in before and "a#0" not in before  # the caption, its table skipped for document b
    assert "a#0" in after and "a#1" not in after  # the table (its note carries the caption's text)
    assert after == ["a#0" if i == "a#1" else i for i in before]  # in the caption's slot; the rest unchanged
    assert picked[False, "cosine"] == picked[True, "cosine"] == ["a#1", "a#0", "b#3"]  # cosine: unchanged


def test_an_evaluation_problem_gives_its_selectors_the_captions_of_its_own_notes():
    from cdsjax.eval.problems import Problem, described_ids
    from cdsjax.io.datasets import Query

    notes, z = _two_documents(named=True)
    assert described_ids("a", notes[:3]) == ["", "a#0", ""]
    ids = [n["note_id"] for n in notes]
    p = Problem(Query("q", "?", None, ("a", "b")), z, z[0], np.zeros((6, 6), bool), ids, [n["doc_id"] for n in notes],
                pages=[n["page"] for n in notes], describes=["", "a#0", "", "", "", ""])
    assert p.structure()["describes"].tolist() == [-1, 0, -1, -1, -1, -1]
    # the caption without its table among the candidates (a first stage kept only the caption): it stands alone
    q = Problem(p.query, z[1:], z[0], np.zeros((5, 5), bool), ids[1:], p.docs[1:], pages=p.pages[1:],
                describes=p.describes[1:])
    assert q.structure()["describes"].tolist() == [-1] * 5
    # a text benchmark has no separate visuals: no note describes another
    assert Problem(p.query, z, z[0], np.zeros((6, 6), bool), ids, p.docs).structure()["describes"].tolist() == [-1] * 6
