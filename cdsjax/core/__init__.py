"""Pure JAX core of cdsjax: affinity, spectral penalty, solvers, selectors.

Nothing here touches files, the network or global state, and nothing imports
torch, sentence-transformers, vllm, openai, pymupdf or :mod:`cdsjax.io`; parameter
files are read by :mod:`cdsjax.learn` and passed in as values.
Functions handle one query; use ``jax.vmap`` (or :func:`batched`) for batches.
One entry point, :func:`cds` (problem, strategy, game, options, adjoint).
"""

from cdsjax.core.affinity import (CDSParams, assemble_affinity, build_affinity, note_coupling, problem_affinity,
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
    ImplicitAdjoint,
    NoAdjoint,
    LoopAdjoint,
    attach_implicit,
    cds_equilibrium,
    cds_weights,
    implicit_tangent,
    initial_point,
)
from cdsjax.core.learned import LearnedParams
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
from cdsjax.core.replicator import (
    kkt_residual,
    objective,
    replicator_shift,
    softmax_prior,
    solve_replicator,
    uniform_x0,
)
from cdsjax.core.registry import PPR_MAX_ITER_CAP, SELECTORS, SPECS, SelectorSpec, make_selector, selector_names, selector_spec
from cdsjax.core.solvers import (DEFAULT_SOLVER, SERVING_SOLVER, SOLVER_NAMES, SolveOptions, WithFallback, solve,
                                 solve_options, solver_from_name)
from cdsjax.core.cds import (
    STRATEGIES,
    cds,
    cds_peel,
    cds_select,
    cds_select_shared,
    cds_support,
)
from cdsjax.core.diagnostics import diagnostics
from cdsjax.core.protocols import Game, IterativeSolver, Payoff, Solver, Status
from cdsjax.core.solver import LoopState, iterate, nash_error, stop_rule, support_count, within_limits
from cdsjax.core.payoff import DensePayoff, SharedPayoff
from cdsjax.core.replicator import Replicator
from cdsjax.core.inimdyn import InImDyn
from cdsjax.core.active_set import ActiveSet
from cdsjax.core.pdas import PrimalDualActiveSet
from cdsjax.core.graph import diffusion_prior, ppr_vector
from cdsjax.core.ranking import fill_order, isolated_query, kkt_slack, query_cosine, read_out, read_selection, top_b
from cdsjax.core.inimdyn import solve_inimdyn
from cdsjax.core.active_set import solve_active_set
from cdsjax.core.support import support_settings
from cdsjax.core.shared import CorpusAffinity, corpus_affinity, solve_replicator_shared
from cdsjax.core.subgraph import select_subgraph_readout
from cdsjax.core.types import (
    CONVERGED,
    MAX_ITER_CAP,
    MAX_SUPPORT_STEPS,
    NOTE_KINDS,
    CDSProblem,
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

__all__ = [
    "CDSProblem",
    "DEFAULT_SOLVER",
    "MAX_ITER_CAP",
    "MAX_SUPPORT_STEPS",
    "NOTE_KINDS",
    "PPR_MAX_ITER_CAP",
    "Payoff",
    "STRATEGIES",
    "Solver",
    "Status",
    "cds",
    "diagnostics",
    "kind_code",
    "Game",
    "ImplicitAdjoint",
    "NoAdjoint",
    "LearnedParams",
    "LoopAdjoint",
    "assemble_affinity",
    "initial_point",
    "problem_affinity",
    "support_settings",
    "solver_from_name",
    "SOLVER_NAMES",
    "SERVING_SOLVER",
    "WithFallback",
    "IterativeSolver",
    "stop_rule",
    "ActiveSet",
    "PrimalDualActiveSet",
    "CONVERGED",
    "DensePayoff",
    "InImDyn",
    "LoopState",
    "MAX_STEPS",
    "NONFINITE",
    "Replicator",
    "SINGULAR",
    "STATUSES",
    "SUPPORT_THRESHOLD",
    "SharedPayoff",
    "SolveOptions",
    "iterate",
    "nash_error",
    "solve_options",
    "within_limits",
    "SELECTORS",
    "SPECS",
    "SelectorSpec",
    "diffusion_prior",
    "key_from_query_id",
    "make_selector",
    "ppr_vector",
    "relevance",
    "select_cosine",
    "select_cosine_pages",
    "select_dpp",
    "select_mmr",
    "select_ppr",
    "select_random",
    "select_subgraph_readout",
    "selector_names",
    "selector_spec",
    "Affinity",
    "CDSParams",
    "DEFAULT_BUCKETS",
    "Selection",
    "Selector",
    "as_selector",
    "SolverResult",
    "attach_implicit",
    "cds_equilibrium",
    "cds_weights",
    "equilibrium_scores",
    "gold_mass",
    "hard_recall",
    "implicit_tangent",
    "page_readout_scores",
    "retrieval_surrogates",
    "soft_recall",
    "batch_apply",
    "auto_chunk",
    "batched",
    "bucket_size",
    "padded_batch",
    "build_affinity",
    "cds_peel",
    "cds_select",
    "cds_support",
    "FILL_NO_QUERY_EDGE",
    "FILL_NONE",
    "FILL_REASONS",
    "FILL_SHORT_SUPPORT",
    "fill_order",
    "isolated_query",
    "kkt_slack",
    "query_cosine",
    "read_out",
    "read_selection",
    "scale_note_block",
    "kkt_residual",
    "make_buckets",
    "note_coupling",
    "objective",
    "query_relevance",
    "replicator_shift",
    "run_buckets",
    "softmax_prior",
    "solve",
    "solve_replicator",
    "solve_inimdyn",
    "solve_active_set",
    "CorpusAffinity",
    "corpus_affinity",
    "solve_replicator_shared",
    "cds_select_shared",
    "spectral_penalty",
    "support_count",
    "top_b",
    "uniform_x0",
    "validate_embeddings",
]
