"""How many selected notes go to the reader (cdsjax.pipeline.amount)."""

from cdsjax.pipeline.amount import notes_to_read


def test_fixed_reads_every_selected_note():
    assert notes_to_read([0.5, 0.4, 0.1]) == [0, 1, 2]
    assert notes_to_read([]) == []


def test_the_support_caps_the_notes_and_at_least_one_is_read():
    assert notes_to_read([0.5, 0.4, 0.3, 0.2], support=2) == [0, 1]
    assert notes_to_read([0.5, 0.4], support=0) == [0]  # an empty support still reads the first note
    assert notes_to_read([0.5, 0.4], support=9) == [0, 1]


def test_notes_that_fall_off_the_best_relevance_are_cut_wherever_they_stand():
    # the page read-out does not order by relevance: the best note may come second
    assert notes_to_read([0.40, 0.60, 0.30, 0.55], delta=0.1) == [1, 3]
    assert notes_to_read([0.40, 0.60, 0.30, 0.55], delta=0.25) == [0, 1, 3]
    assert notes_to_read([0.40, 0.60, 0.30, 0.55], support=2, delta=0.1) == [1]
    assert notes_to_read([0.2, 0.9], support=1, delta=0.1) == [0]  # the support's note, even when weak
