"""Pure JAX core of cdsjax: problems, games, solvers, adjoints, selectors.

Nothing here touches files, the network or global state, and nothing imports
torch, sentence-transformers, vllm, openai, pymupdf or :mod:`cdsjax.io`; parameter
files are read by :mod:`cdsjax.learn` and passed in as values.
Functions handle one query; use ``jax.vmap`` (or :func:`batched`) for batches.
One entry point, :func:`cds` (problem, strategy, game, options, adjoint).

- A problem is a :class:`CDSProblem`, or a :class:`BlockProblem` when the question is posed with its
  corpus's precomputed note block (:func:`with_corpus_arrays`); the type, not an optional field, says which.
- A solver is an object the caller holds and passes (``SolveOptions.solver``, ``solver=``):
  :class:`Replicator`, :class:`InImDyn`, :class:`ActiveSet`, :class:`PrimalDualActiveSet`, or
  :class:`WithFallback` (a solver tried first, another run where it ends unconverged);
  :data:`SERVING_SOLVER` is the combination the served selectors use. Solver names are for configuration
  files and the command line only, converted once by :func:`solver_from_name`.
- :func:`equilibrium` (game, solver, x0, adjoint=) is the one solve every strategy runs; the adjoint is applied
  there only, and the result records which solver gave the point (``SolverResult.solver_run``).

``__all__`` is the public API (docs/api.md); the other names imported here stay importable for existing code.
"""

from cdsjax.core.games.affinity import (CDSParams, assemble_affinity, build_affinity, note_coupling, problem_affinity,
                                  query_relevance, scale_note_block, spectral_penalty)
from cdsjax.core.baselines import (
    key_from_query_id,
    relevance,
    select_cosine,
    select_cosine_pages,
    select_dpp,
    select_mmr,
    select_ppr,
    select_random,
)
from cdsjax.core.implicit import (
    equilibrium,
    ImplicitAdjoint,
    NoAdjoint,
    LoopAdjoint,
    attach_implicit,
    cds_equilibrium,
    implicit_tangent,
    initial_point,
)
from cdsjax.core.games.learned import LearnedParams
from cdsjax.core.surrogates import (equilibrium_scores, gold_mass, hard_recall, page_readout_scores,
                                    retrieval_surrogates, soft_recall)
from cdsjax.core.batching import (
    DEFAULT_BUCKETS,
    auto_chunk,
    batch_apply,
    batched,
    bucket_size,
    make_buckets,
    padded_batch,
    run_buckets,
)
from cdsjax.core.solvers.replicator import (
    kkt_residual,
    objective,
    replicator_shift,
    softmax_prior,
    solve_replicator,
    uniform_x0,
)
from cdsjax.core.registry import PPR_MAX_ITER_CAP, SELECTORS, SPECS, SelectorSpec, make_selector, selector_names, selector_spec
from cdsjax.core.solvers.options import (DEFAULT_SOLVER, SERVING_SOLVER, SOLVER_NAMES, SolveOptions, WithFallback, solve,
                                 solve_options, solver_from_name)
from cdsjax.core.strategies.cds import STRATEGIES, cds
from cdsjax.core.compat import cds_peel, cds_select, cds_select_shared, cds_support, cds_weights
from cdsjax.core.diagnostics import diagnostics
from cdsjax.core.protocols import Game, IterativeSolver, Payoff, Solver, Status
from cdsjax.core.solvers.loop import LoopState, iterate, nash_error, stop_rule, support_count, within_limits
from cdsjax.core.games.payoff import DensePayoff, SharedPayoff
from cdsjax.core.solvers.replicator import Replicator
from cdsjax.core.solvers.inimdyn import InImDyn
from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.pdas import PrimalDualActiveSet
from cdsjax.core.graph import diffusion_prior, ppr_vector
from cdsjax.core.ranking import fill_order, isolated_query, kkt_slack, query_cosine, read_out, read_selection, top_b
from cdsjax.core.solvers.inimdyn import solve_inimdyn
from cdsjax.core.solvers.active_set import solve_active_set
from cdsjax.core.strategies.support import support_settings
from cdsjax.core.strategies.shared import CorpusAffinity, corpus_affinity, solve_replicator_shared
from cdsjax.core.subgraph import select_subgraph_readout
from cdsjax.core.types import (
    CONVERGED,
    MAX_ITER_CAP,
    MAX_SUPPORT_STEPS,
    NOTE_KINDS,
    CDSProblem,
    BlockProblem,
    with_corpus_arrays,
    kind_code,
    MAX_STEPS,
    NONFINITE,
    SINGULAR,
    STATUSES,
    SUPPORT_THRESHOLD,
    FILL_NO_QUERY_EDGE,
    FILL_NONE,
    FILL_REASONS,
    FILL_SHORT_SUPPORT,
    Affinity,
    Selection,
    Selector,
    SolverResult,
    as_selector,
)
from cdsjax.core.validation import validate_embeddings

# The public API (what ``from cdsjax.core import *`` gives): the problem, the games, the solvers and adjoints, the
# entry points, the result and status types and the selectors. Every other name imported above stays importable
# from ``cdsjax.core`` for existing callers; its home is its submodule (the array-taking entry points:
# cdsjax.core.compat). docs/api.md lists these names with a glossary.
__all__ = [
    # a problem, and the same question with its corpus's note block
    "CDSProblem",
    "BlockProblem",
    "with_corpus_arrays",
    # games (the affinity a problem is solved on) and payoffs (how a solver sees a game)
    "Game",
    "CDSParams",
    "LearnedParams",
    "Affinity",
    "Payoff",
    "DensePayoff",
    "SharedPayoff",
    # solvers: objects the caller holds
    "Solver",
    "IterativeSolver",
    "Replicator",
    "InImDyn",
    "ActiveSet",
    "PrimalDualActiveSet",
    "WithFallback",
    "SERVING_SOLVER",
    "solver_from_name",
    "SolveOptions",
    # adjoints: how an equilibrium is differentiated
    "ImplicitAdjoint",
    "LoopAdjoint",
    "NoAdjoint",
    # entry points: a selection by strategy, the equilibrium itself
    "cds",
    "equilibrium",
    "cds_equilibrium",
    # results and how a solve ended
    "SolverResult",
    "Selection",
    "Status",
    "CONVERGED",
    "diagnostics",
    # selectors by name, one calling convention
    "Selector",
    "SelectorSpec",
    "SPECS",
    "make_selector",
    "selector_spec",
    # batches of ragged problems
    "batched",
    "batch_apply",
]
