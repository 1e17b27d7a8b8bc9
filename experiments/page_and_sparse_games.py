"""Two structure-aware games kept as experiment selectors: the page game and the learned game's sparse regime.

They are experiments, not in the registry (:mod:`cdsjax.core.registry`); RESULTS.md ("Games and read-outs that
see pages") compares them with the registry's per-page read-outs. Their cores are in :mod:`experiments.page_game`
(:func:`~experiments.page_game.select_page_game`, :func:`~experiments.page_game.sparse_learned_ranking`), which
``experiments/structured_cv.py`` calls directly.
Here they are selectors with the registry's calling convention, ``fn(problem: CDSProblem, key=None) ->
Selection``, under a :class:`~cdsjax.core.SelectorSpec` each (:data:`SPECS`), for an experiment script that runs
them as selectors::

    from experiments.page_and_sparse_games import SPECS
    fn = SPECS["cds_pages"].make(10, beta=0.03)

``cds_learned_sparse`` needs its ``params`` (a :class:`~cdsjax.core.games.learned.LearnedParams`; ``cdsjax.learn.
default_params()`` is the shipped fit).
"""

from __future__ import annotations

from typing import Callable, Optional

import jax.numpy as jnp

from cdsjax.core.baselines import relevance
from cdsjax.core.games.learned import LearnedParams
from cdsjax.core.readouts import MAX_NOTES_PER_PAGE, structured_readout
from cdsjax.core.registry import SelectorSpec
from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import CDSProblem, Selection, Selector
from cdsjax.core.validation import check_int_range
from experiments.page_game import KEEP_QUERY, PageGameParams, select_page_game, sparse_learned_ranking

PAGE_GAME_OPTIONS = ("beta", "alpha_factor", "w_doc", "notes_per_page", "tol", "max_iter")
SPARSE_OPTIONS = ("params", "alpha_factor", "notes_per_page", "keep", "tol", "max_iter")


def needs_pages(problem: CDSProblem, name: str):
    if problem.pages is None:
        raise ValueError(f"selector {name!r} needs pages ([n] int page, or paragraph group, of each note)")
    return problem.pages


def cds_pages(budget: int, *, beta: float = 0.03, alpha_factor: float = 1.0, w_doc: float = 0.0,
              notes_per_page: int = 1, tol: Optional[float] = None, max_iter: Optional[int] = None) -> Callable:
    """The page game (:func:`~experiments.page_game.select_page_game`): pages are the vertices, the ranked pages'
    best ``notes_per_page`` notes per round the evidence; ``alpha_factor < 1`` is its sparse regime."""
    if not float(beta) >= 0.0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    if not float(alpha_factor) > 0.0:
        raise ValueError(f"alpha_factor must be > 0, got {alpha_factor!r}")
    check_int_range("notes_per_page", notes_per_page, MAX_NOTES_PER_PAGE)
    params = PageGameParams(beta=float(beta), alpha_factor=float(alpha_factor), w_doc=float(w_doc))
    options = SolveOptions(solver=ActiveSet(), tol=tol, max_iter=max_iter).check()

    def fn(problem: CDSProblem, key=None) -> Selection:
        return select_page_game(problem.notes, problem.queries, problem.valid, needs_pages(problem, "cds_pages"),
                                params, budget=budget, k=notes_per_page, doc_ids=problem.doc_ids, options=options)

    return Selector(fn, solver=options.limited_solver())


def cds_learned_sparse(budget: int, *, params: Optional[LearnedParams] = None, alpha_factor: float = 0.5,
                       notes_per_page: int = 0, keep: str = "peel", tol: Optional[float] = None,
                       max_iter: Optional[int] = None) -> Callable:
    """The learned game in its sparse regime (:func:`~experiments.page_game.sparse_learned_ranking`): the penalty
    at ``alpha_factor`` (< 1) of the spectral bound, solved from around the query; where the query leaves the
    support, ``keep="peel"`` peels that support off and solves again until one holds the query, ``keep="bound"``
    reads the bound's game; every note ranked; ``notes_per_page`` 0 reads the top-B, k >= 1 reads at most k notes
    per page per round."""
    if not isinstance(params, LearnedParams):  # validates the input only
        raise ValueError("selector 'cds_learned_sparse' needs params=LearnedParams(...) (cdsjax.learn supplies the "
                         f"shipped fit), got {type(params).__name__}")
    if not 0.0 <= float(alpha_factor) < 1.0:
        raise ValueError(f"alpha_factor must be in [0, 1) (the sparse regime), got {alpha_factor!r}")
    if notes_per_page != 0:
        check_int_range("notes_per_page", notes_per_page, MAX_NOTES_PER_PAGE)
    if keep not in KEEP_QUERY:
        raise ValueError(f"keep must be one of {KEEP_QUERY}, got {keep!r}")
    options = SolveOptions(solver=ActiveSet(), tol=tol, max_iter=max_iter).check()

    def fn(problem: CDSProblem, key=None) -> Selection:
        rank, sel, _ = sparse_learned_ranking(problem.notes, problem.queries, problem.valid, params,
                                              float(alpha_factor), links=problem.links, pages=problem.pages,
                                              doc_ids=problem.doc_ids, kinds=problem.kinds, options=options,
                                              keep=keep)
        if notes_per_page:
            units, docs, k = needs_pages(problem, "cds_learned_sparse"), problem.doc_ids, notes_per_page
        else:  # top-B of the ranking: every note its own unit
            units, docs, k = jnp.arange(problem.valid.shape[0]), None, 1
        idx, ok = structured_readout(rank, problem.valid, units, budget=budget, k=k, doc_ids=docs)
        cos = relevance(problem.notes, problem.queries, problem.valid)
        return sel.replace(indices=idx, selected_valid=ok, scores=jnp.where(ok, cos[idx], 0.0))

    return Selector(fn, solver=options.limited_solver())


SPECS = {s.name: s for s in (
    SelectorSpec(name="cds_pages", build=cds_pages, structure=True,
                 option_names=PAGE_GAME_OPTIONS),
    SelectorSpec(name="cds_learned_sparse", build=cds_learned_sparse, needs_links=True,
                 structure=True, pages_only=True, learned=True, option_names=SPARSE_OPTIONS),
)}
