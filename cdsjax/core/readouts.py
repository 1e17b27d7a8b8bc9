"""The per-page read-out of a selector (:mod:`cdsjax.core.structure`): its ranking read at most ``k`` notes per page
per round. The registry (:mod:`cdsjax.core.registry`) builds its ``*_pages`` selectors with :func:`per_page`; each
builder returns ``fn(problem: CDSProblem, key=None) -> Selection``.
"""

from __future__ import annotations

from typing import Callable

from cdsjax.core.structure import GREEDY_DEPTH_FACTOR, select_structured
from cdsjax.core.types import CDSProblem, Selection, Selector
from cdsjax.core.validation import check_int_range

# notes_per_page: the k of the read-out (at most k notes of a page per round)
PAGE_OPTIONS = ("notes_per_page",)
MAX_NOTES_PER_PAGE = 1_000_000


def _needs_pages(problem: CDSProblem, name: str):
    if problem.pages is None:
        raise ValueError(f"selector {name!r} needs pages ([n] int page, or paragraph group, of each note)")
    return problem.pages


def per_page(name: str, base: Callable[..., Callable], *, greedy: bool = False,
             captions: bool = False) -> Callable[..., Callable]:
    """The builder of ``base`` read page by page: ``base``'s ranking of the notes (every note; a greedy baseline
    to :data:`~cdsjax.core.structure.GREEDY_DEPTH_FACTOR` times the budget, then cosine), at most
    ``notes_per_page`` notes of a page per round (:func:`~cdsjax.core.structure.select_structured`). The units are
    the problem's ``pages`` with its ``doc_ids``. ``captions``: a caption is read with the visual it describes
    (the problem's ``describes``, :func:`~cdsjax.core.structure.fold_described`; a problem without it has no
    captions to fold)."""

    def build(budget: int, *, notes_per_page: int = 1, **options) -> Callable:
        check_int_range("notes_per_page", notes_per_page, MAX_NOTES_PER_PAGE)
        probe = base(budget, **options)  # checks the base's options once, at build time
        depth = GREEDY_DEPTH_FACTOR * budget if greedy else None

        def fn(problem: CDSProblem, key=None) -> Selection:
            pages = _needs_pages(problem, name)

            def ranked(b):
                inner = base(b, **options)
                return lambda notes, query, valid: inner(problem, key)

            return select_structured(ranked, problem.notes, problem.queries, problem.valid, pages, budget=budget,
                                     k=notes_per_page, doc_ids=problem.doc_ids, depth=depth,
                                     describes=problem.describes if captions else None)

        # the base game's corpus-level bound and note block (budget-free): a warm corpus reads its questions
        # without an eigendecomposition each, as the base selector does (the ranking reads problem.note_block)
        if isinstance(probe, Selector):
            return Selector(fn, corpus_bound=probe.corpus_bound, corpus_block=probe.corpus_block)
        return fn

    return build
