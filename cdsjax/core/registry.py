"""Selectors by name, behind one calling convention.

The pipeline, the integrations, the server and the evaluation harness pick selectors from configuration
strings. :func:`make_selector` turns a name and its options into a function

    ``fn(problem: CDSProblem, key=None) -> Selection``

so every selector is jitted and vmapped the same way (a batch of problems is a ``CDSProblem`` with a
leading axis). A selector reads what it needs from the problem: the notes and query rows always, ``links``
for ``"ppr"``, ``"subgraph"`` and CDS with ``init="diffusion"`` (and the learned game's link feature), the
structure arrays ``pages`` / ``doc_ids`` / ``kinds`` when its spec says :attr:`SelectorSpec.structure`;
``key`` matters to ``"random"`` only. The CDS builders call :func:`cdsjax.core.strategies.cds` with a strategy object
and a game (:class:`~cdsjax.core.CDSParams`, or the learned :class:`~cdsjax.core.games.learned.LearnedParams`).

Each selector has one :class:`SelectorSpec` in :data:`SPECS`: its registry name, builder, the inputs it reads
(links, key, structure, pages only), whether it takes learned parameters, and its options. The solver a CDS
selector runs is stated once, in its builder; the built :class:`~cdsjax.core.types.Selector` carries it
(``Selector.solver``) and the spec reads it off its default build (:attr:`SelectorSpec.solver`). Callers build
problems from the spec alone, so a selector is described in one place: this table. What the product makes of the
selectors (the default, the names shown to users, help lines) and the lookup of a name as users write it
(:func:`cdsjax.pipeline.catalog.selector_spec`) are :mod:`cdsjax.pipeline.catalog`'s. The registry receives
parameter values, never file paths: :mod:`cdsjax.learn` reads parameter files (and supplies the shipped fit to a
learned selector).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


from cdsjax.core.games.affinity import CDSParams
from cdsjax.core.baselines import (DPP_QUALITIES, select_cosine, select_cosine_pages, select_dpp, select_mmr,
                                   select_ppr, select_random)
from cdsjax.core.strategies.cds import cds
from cdsjax.core.strategies.select import Peel, Single
from cdsjax.core.strategies.support import Support
from cdsjax.core.games.learned import LearnedParams
from cdsjax.core.readouts import PAGE_OPTIONS, per_page
from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.inimdyn import InImDyn
from cdsjax.core.solvers.replicator import Replicator
from cdsjax.core.solvers.options import SERVING_SOLVER, SolveOptions, check_solver, solver_from_name
from cdsjax.core.subgraph import select_subgraph_readout
from cdsjax.core.types import CDSProblem, Selection, Selector
from cdsjax.core.diagnostics import CONVERGED_MODE, PAPER_MODE, solver_mode
from cdsjax.core.validation import check_budget, check_int_range, check_option, check_positive
from jax import Array

SelectorFn = Callable[..., Selection]

# Hard limit of the PPR selector's power iterations (the largest max_iter it accepts).
PPR_MAX_ITER_CAP = 100_000


def _cosine(budget: int) -> SelectorFn:
    def fn(problem: CDSProblem, key=None):
        return select_cosine(problem.notes, problem.queries, problem.valid, budget=budget,
                             query_scores=problem.query_scores)

    return fn


def _cosine_pages(budget: int, *, fill: bool = True) -> SelectorFn:
    def fn(problem: CDSProblem, key=None):
        if problem.pages is None:
            raise ValueError("selector 'cosine_pages' needs pages ([n] int page, or paragraph group, of each note)")
        return select_cosine_pages(problem.notes, problem.queries, problem.valid, problem.pages, budget=budget,
                                   doc_ids=problem.doc_ids, fill=fill, query_scores=problem.query_scores)

    return fn


def _random(budget: int) -> SelectorFn:
    def fn(problem: CDSProblem, key=None):
        if key is None:
            raise ValueError("selector 'random' needs a PRNG key (see cdsjax.core.baselines.key_from_query_id)")
        return select_random(problem.valid, budget=budget, key=key)

    return fn


def _mmr(budget: int, *, lam: float = 0.5) -> SelectorFn:
    if not 0.0 <= float(lam) <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")

    def fn(problem: CDSProblem, key=None):
        return select_mmr(problem.notes, problem.queries, problem.valid, budget=budget, lam=lam,
                          query_scores=problem.query_scores)

    return fn


def _dpp(budget: int, *, theta: float = 1.0, quality: str = "exp", gain_tol: Optional[float] = None) -> SelectorFn:
    check_option("quality", quality, DPP_QUALITIES)

    def fn(problem: CDSProblem, key=None):
        return select_dpp(problem.notes, problem.queries, problem.valid, budget=budget, theta=theta, quality=quality,
                          gain_tol=gain_tol, query_scores=problem.query_scores)

    return fn


def _links(problem: CDSProblem, name: str):
    if problem.links is None:
        raise ValueError(f"selector {name!r} needs links ([n, n] bool note-link adjacency)")
    return problem.links


def _ppr(
    budget: int, *, damping: float = 0.85, temperature: float = 0.1, tol: float = 1e-9, max_iter: int = 1000
) -> SelectorFn:
    check_positive("tol", tol)
    check_int_range("max_iter", max_iter, PPR_MAX_ITER_CAP)

    def fn(problem: CDSProblem, key=None):
        return select_ppr(_links(problem, "ppr"), problem.notes, problem.queries, problem.valid, budget=budget,
                          damping=damping, temperature=temperature, tol=tol, max_iter=max_iter,
                          query_scores=problem.query_scores)

    return fn


def _subgraph(budget: int) -> SelectorFn:
    def fn(problem: CDSProblem, key=None):
        return select_subgraph_readout(_links(problem, "subgraph"), problem.notes, problem.queries, problem.valid,
                                       budget=budget, query_scores=problem.query_scores)

    return fn


PARAM_OPTIONS = tuple(f.name for f in dataclasses.fields(CDSParams))
CDS_OPTIONS = ("params", *PARAM_OPTIONS, "threshold", "tol", "max_iter", "init", "prior_temperature", "peel",
               "fill")
SUPPORT_OPTIONS = (*(p for p in PARAM_OPTIONS if p != "beta"), "threshold", "tol", "max_iter", "num_steps",
                   "scale_range", "fill")


def _cds_inputs(name: str, solver, fields: dict, allowed: tuple, params=None) -> tuple[CDSParams, SolveOptions]:
    """The :class:`CDSParams` and :class:`SolveOptions` of a CDS selector (its ``solver`` object), built once from
    its options.

    ``None`` means "the default" for every option.
    """
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for selector {name!r}; allowed: {list(allowed)}")
    given = {k: v for k, v in fields.items() if v is not None}
    param_fields = {k: given.pop(k) for k in PARAM_OPTIONS if k in given}
    if params is not None and param_fields:
        raise ValueError(f"pass either params or the CDSParams fields {sorted(param_fields)}, not both")
    params = (params if params is not None else CDSParams(**param_fields)).check()
    return params, SolveOptions(solver=solver, **given).check()


def _cds_fn(strategy, budget: int, params, options: SolveOptions, *, on_block: bool = True) -> SelectorFn:
    """The selector function of a CDS strategy object and game: :func:`cdsjax.core.strategies.cds` on the caller's
    problem, with the strategy's corpus bound and (``on_block``) its note block, and the solver it runs."""

    def fn(problem: CDSProblem, key=None):
        return cds(problem, strategy, params, options, budget=budget)

    def bound(problem: CDSProblem):
        return strategy.corpus_bound(problem, params)

    def block(problem: CDSProblem):
        return strategy.corpus_block(problem, params, options)

    return Selector(fn, corpus_bound=bound, corpus_block=block if on_block else None,
                    solver=options.limited_solver())


def corpus_bound_fn(fn: SelectorFn) -> Optional[Callable[[CDSProblem], Optional[Array]]]:
    """``bound(problem)``: the spectral bound selector ``fn`` would compute for every question on
    ``problem``'s corpus (its strategy's ``corpus_bound`` of its game; None where it depends on the question),
    to compute once per corpus and give each question as ``CDSProblem.bound``.
    None for a selector without a penalty (the baselines)."""
    return fn.corpus_bound if isinstance(fn, Selector) else None


def corpus_block_fn(fn: SelectorFn) -> Optional[Callable[[CDSProblem], Optional[Array]]]:
    """``block(problem)``: the note block selector ``fn`` would build for every question on ``problem``'s
    corpus (its strategy's ``corpus_block``; None where its solve does not use one), to build once per corpus and
    pose each question with, next to its ``bound`` (:func:`cdsjax.core.types.with_corpus_arrays`, a
    :class:`~cdsjax.core.types.BlockProblem`). None for a baseline."""
    return fn.corpus_block if isinstance(fn, Selector) else None


def _cds_builder(name: str, solver, *, on_block: bool = True) -> Callable[..., SelectorFn]:
    """The builder of a CDS selector on the paper's game running ``solver``; ``on_block``: its questions may be
    posed on their corpus's note block (False keeps every solve on the dense payoff)."""

    def build(budget: int, *, params: Optional[CDSParams] = None, peel: bool = False, **fields) -> SelectorFn:
        params, options = _cds_inputs(name, solver, fields, CDS_OPTIONS, params)
        if peel and options.init != "uniform":
            raise ValueError(f"peel=True starts every round uniformly; init={options.init!r} is not supported with it")

        return _cds_fn(Peel() if peel else Single(), budget, params, options, on_block=on_block)

    return build


def _cds_support(budget: int, **fields) -> SelectorFn:
    """Support-targeted CDS (:func:`cdsjax.core.compat.cds_support`): beta chosen per question."""
    strategy = Support(fields.pop("num_steps", None), fields.pop("scale_range", None)).check()
    params, options = _cds_inputs("cds_support", ActiveSet(), fields, SUPPORT_OPTIONS)
    if params.coupling == "none":
        raise ValueError("selector 'cds_support' needs a note block: coupling='none' makes beta irrelevant")

    return _cds_fn(strategy, budget, params, options)



LEARNED_OPTIONS = ("params", "solver", "threshold", "tol", "max_iter", "fill")


def _cds_learned(budget: int, *, params: Optional[LearnedParams] = None, solver=SERVING_SOLVER,
                 **fields) -> SelectorFn:
    """The learned game (:mod:`cdsjax.core.games.learned`) through :func:`cdsjax.core.strategies.cds`: ``params`` is the
    :class:`~cdsjax.core.games.learned.LearnedParams` value (``cdsjax.learn.default_params()`` is the shipped fit;
    callers above the core pass it, the registry never reads a file); ``solver`` a solver object, or the name a
    configuration gives (:func:`~cdsjax.core.solvers.options.solver_from_name`)."""
    if not isinstance(params, LearnedParams):
        raise ValueError(f"selector 'cds_learned' needs params=LearnedParams(...) (cdsjax.learn reads a parameter "
                         f"file and supplies the shipped fit), got {type(params).__name__}")
    unknown = sorted(set(fields) - set(LEARNED_OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for selector 'cds_learned'; allowed: {list(LEARNED_OPTIONS)}")
    solver = solver_from_name(solver) if isinstance(solver, str) else check_solver(solver)
    options = SolveOptions(solver=solver, **{k: v for k, v in fields.items() if v is not None}).check()
    return _cds_fn(Single(), budget, params, options)



# Read page by page (cdsjax.core.readouts): a ranking read at most notes_per_page notes of a page per round
_mmr_pages = per_page("mmr_pages", _mmr, greedy=True)
_dpp_pages = per_page("dpp_pages", _dpp, greedy=True)
# the default's read-out keeps a visual and its caption together: a caption is read as the visual it describes
_cds_learned_pages = per_page("cds_learned_pages", _cds_learned, captions=True)


@dataclasses.dataclass(frozen=True)
class SelectorSpec:
    """Everything the layers above the core need to know about one selector.

    Attributes:
      name: the registry name (configs, records, :func:`make_selector`).
      build: ``build(budget, **options) -> fn`` with the uniform signature.
      needs_links: it reads ``problem.links`` (always, or with some options).
      needs_key: it reads the PRNG ``key``.
      structure: it reads the structure arrays ``problem.pages`` / ``doc_ids`` / ``kinds`` / ``describes``
        (callers build the problem with them; other selectors get a problem without them and compile as they
        always did).
      pages_only: with ``structure``, ``pages`` must be printed pages: a text corpus's paragraph groups are
        not given as pages (the learned game's same-page weight is fitted on printed pages).
      learned: its ``params`` option is a :class:`~cdsjax.core.games.learned.LearnedParams` value; callers above the
        core supply it (``cdsjax.learn`` resolves a file or the shipped fit).
      readout: for a learned selector, the read-out its parameters are fitted through (``"top"``: its top-B;
        ``"pages"``: its equilibrium read one note per page, ``cdsjax.core.surrogates.page_readout_scores``); ``cdsjax.learn``
        ships one fit per read-out and ``cdsjax tune`` fits through it.
      option_names: the options its builder accepts (:attr:`options`).
    """

    name: str
    build: Callable[..., SelectorFn]
    needs_links: bool = False
    needs_key: bool = False
    structure: bool = False
    pages_only: bool = False
    learned: bool = False
    readout: str = "top"
    option_names: Tuple[str, ...] = ()

    @functools.cached_property
    def solver(self) -> Optional[Any]:
        """The solver its default build runs (``Selector.solver``; a learned selector built at the paper's
        parameters), None for a baseline. A build with a ``solver`` option carries its own."""
        defaults = {"params": LearnedParams.paper()} if self.learned else {}
        return getattr(self.make(1, **defaults), "solver", None)

    @property
    def mode(self) -> Optional[str]:
        """``"paper"`` (replicator dynamics, a fixed step budget), ``"converged"`` or None (a baseline): the mode
        of :attr:`solver` (:func:`~cdsjax.core.diagnostics.solver_mode`)."""
        return None if self.solver is None else solver_mode(self.solver)

    @property
    def paper_mode(self) -> bool:
        """Whether this selector solves in paper mode (replicator dynamics); False for the converged solvers and
        for a baseline."""
        return self.solver is not None and self.mode == PAPER_MODE

    @property
    def converged_mode(self) -> bool:
        """Whether this selector solves to the equilibrium (a converged solver); False in paper mode and for a
        baseline."""
        return self.solver is not None and self.mode == CONVERGED_MODE

    @property
    def solver_label(self) -> Optional[str]:
        """The name of :attr:`solver` (``"pdas"``, ``"active_set"``, ...), None for a baseline."""
        return None if self.solver is None else self.solver.name

    @property
    def options(self) -> tuple:
        """The option names the builder accepts."""
        return self.option_names

    def make(self, budget: int, **options) -> SelectorFn:
        """This selector at ``budget`` with ``options`` (see :func:`make_selector`), its selection function named
        ``select_<name>`` for the programs JAX compiles from it."""
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for selector {self.name!r}; "
                             f"allowed: {list(self.option_names)}")
        fn = self.build(check_budget(budget), **options)
        name = f"select_{self.name}"
        if isinstance(fn, Selector):
            return dataclasses.replace(fn, select=NamedFunction(fn.select, name))
        return NamedFunction(fn, name)


@dataclasses.dataclass(frozen=True, eq=False)
class NamedFunction:
    """``function`` under ``name``, the name JAX gives the programs it compiles from it (``jit_<name>``; JAX reads a
    callable's ``__name__``). Equality is identity, as for a function, so it keys JAX's caches."""

    function: Callable
    name: str

    @property
    def __name__(self) -> str:  # noqa: A003 - the attribute JAX names a traced function by
        return self.name

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)


def keyword_options(build: Callable) -> tuple:
    """The keyword-only parameter names of ``build``: the options of a builder that spells each one out."""
    return tuple(p for p, spec in inspect.signature(build).parameters.items()
                 if spec.kind is inspect.Parameter.KEYWORD_ONLY)


def _spec(name, build, *, options=None, **reads):
    options = keyword_options(build) if options is None else tuple(options)
    return SelectorSpec(name=name, build=build, option_names=options, **reads)


SPECS: Mapping[str, SelectorSpec] = {s.name: s for s in (
    _spec("cosine", _cosine),
    # cosine top-B taking the best note of each (document, page) first
    _spec("cosine_pages", _cosine_pages, structure=True),
    _spec("random", _random, needs_key=True),
    _spec("mmr", _mmr),
    _spec("dpp", _dpp),
    _spec("ppr", _ppr, needs_links=True),
    _spec("subgraph", _subgraph, needs_links=True),
    # paper mode: replicator dynamics with the paper's step budget ("cds" keeps meaning paper mode everywhere), on
    # the dense payoff the paper defines them on (its questions are never posed on a corpus block)
    _spec("cds", _cds_builder("cds", Replicator(), on_block=False), needs_links=True, options=CDS_OPTIONS),
    # converged mode: the serving solver (the primal-dual active set on the corpus block, the active-set Newton
    # solver on a dense payoff); InImDyn is its own entry
    _spec("cds_converged", _cds_builder("cds_converged", SERVING_SOLVER), needs_links=True, options=CDS_OPTIONS),
    _spec("cds_inimdyn", _cds_builder("cds_inimdyn", InImDyn()), needs_links=True, options=CDS_OPTIONS),
    # beta chosen per question so the equilibrium's support holds about `budget` notes (the active set)
    _spec("cds_support", _cds_support, options=SUPPORT_OPTIONS),
    # the learned game (cdsjax.learn): its parameters a value the caller supplies (cdsjax.learn: a file, the
    # shipped fit by default); it reads the notes' structure, pages only where there are printed pages
    _spec("cds_learned", _cds_learned, needs_links=True, structure=True, pages_only=True, learned=True,
          options=LEARNED_OPTIONS),
    # read-outs that see the document's pages (cdsjax.core.readouts): a ranking read at most notes_per_page
    # notes of a page per round, in the ranking's order
    _spec("mmr_pages", _mmr_pages, structure=True,
          options=(*keyword_options(_mmr), *PAGE_OPTIONS)),
    _spec("dpp_pages", _dpp_pages, structure=True,
          options=(*keyword_options(_dpp), *PAGE_OPTIONS)),
    _spec("cds_learned_pages", _cds_learned_pages, needs_links=True, structure=True,
          pages_only=True, learned=True, readout="pages",
          options=(*LEARNED_OPTIONS, *PAGE_OPTIONS)),
)}

# name -> builder(budget, **options) -> selector function (a view of SPECS).
SELECTORS: Dict[str, Callable[..., SelectorFn]] = {name: spec.build for name, spec in SPECS.items()}


def make_selector(name: str, *, budget: int, **options) -> SelectorFn:
    """A selector function with the uniform signature.

    Args:
      name: a registry name (a key of :data:`SPECS`): the baselines ``"cosine"``,
        ``"cosine_pages"``, ``"random"``, ``"mmr"``, ``"dpp"``, ``"ppr"``, ``"subgraph"``; CDS ``"cds"``
        (paper mode: replicator dynamics), ``"cds_converged"`` (the active-set solver), ``"cds_inimdyn"``,
        ``"cds_support"`` (beta chosen per question so the support holds about ``budget`` notes),
        ``"cds_learned"`` (the learned game) and the per-page read-outs ``"mmr_pages"``, ``"dpp_pages"``,
        ``"cds_learned_pages"``; ``-`` may stand for ``_`` (``"cds-learned-pages"``).
      budget: number of notes to select.
      **options: the selector's own options (``SPECS[name].options``),
        e.g. ``lam`` for MMR, ``theta``/``quality`` for DPP, ``damping`` /
        ``temperature`` for PPR, ``beta``/``tau``/``init``/``peel``/``fill`` for CDS, ``params`` (a
        :class:`~cdsjax.core.games.learned.LearnedParams`) for the learned game.

    Returns:
      ``fn(problem: CDSProblem, key=None) -> Selection``, pure and ``jit`` / ``vmap``-able (a CDS selector is a
      :class:`~cdsjax.core.types.Selector` carrying its corpus functions and the ``solver`` it runs). What it reads
      of the problem is in ``SPECS[name]``.

    Raises:
      ValueError: naming an unknown selector, unknown options, or a bad value.
    """
    name = name if name in SPECS else str(name).replace("-", "_")
    check_option("selector", name, tuple(SELECTORS))
    return SPECS[name].make(budget, **options)
