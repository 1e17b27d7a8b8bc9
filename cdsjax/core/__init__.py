"""Pure JAX core of cdsjax: affinity, spectral penalty, solvers, selectors.

Nothing here touches files, the network or global state, and nothing imports
torch, sentence-transformers, vllm, openai, pymupdf or :mod:`cdsjax.io`.
Functions handle one query; use ``jax.vmap`` (or :func:`batched`) for batches.
"""

from cdsjax.core.affinity import build_affinity, note_coupling, query_relevance, spectral_penalty
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
    attach_implicit,
    cds_equilibrium,
    cds_weights,
    equilibrium_scores,
    gold_mass,
    hard_recall,
    implicit_tangent,
    retrieval_surrogates,
    soft_recall,
)
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
    support_size,
    uniform_x0,
)
from cdsjax.core.registry import SELECTORS, SPECS, SelectorSpec, make_selector, selector_names, selector_options, selector_spec
from cdsjax.core.select import (
    SOLVERS,
    cds_peel,
    cds_select,
    configured_solver,
    register_solver,
    selection_from_solution,
    solve,
)
from cdsjax.core.solver import LoopState, iterate, nash_error, within_limits
from cdsjax.core.payoff import DensePayoff, SharedPayoff
from cdsjax.core.replicator import Replicator
from cdsjax.core.inimdyn import InImDyn
from cdsjax.core.active_set import ActiveSet
from cdsjax.core.graph import diffusion_prior, ppr_vector
from cdsjax.core.ranking import fill_order, isolated_query, kkt_slack, query_cosine, rank_support, read_selection, top_b
from cdsjax.core.inimdyn import solve_inimdyn
from cdsjax.core.active_set import solve_active_set
from cdsjax.core.support import cds_support, scale_note_block
from cdsjax.core.shared import CorpusAffinity, cds_select_shared, corpus_affinity, solve_replicator_shared
from cdsjax.core.subgraph import select_subgraph_readout
from cdsjax.core.types import (
    CONVERGED,
    MAX_STEPS,
    NONFINITE,
    SINGULAR,
    STATUSES,
    SUPPORT_THRESHOLD,
    SolveOptions,
    solve_options,
    FILL_NO_QUERY_EDGE,
    FILL_NONE,
    FILL_REASONS,
    FILL_SHORT_SUPPORT,
    Affinity,
    CDSParams,
    Selection,
    SolverResult,
)
from cdsjax.core.validation import validate_embeddings

__all__ = [
    "ActiveSet",
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
    "configured_solver",
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
    "selector_options",
    "selector_spec",
    "Affinity",
    "CDSParams",
    "DEFAULT_BUCKETS",
    "SOLVERS",
    "Selection",
    "SolverResult",
    "attach_implicit",
    "cds_equilibrium",
    "cds_weights",
    "equilibrium_scores",
    "gold_mass",
    "hard_recall",
    "implicit_tangent",
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
    "rank_support",
    "read_selection",
    "scale_note_block",
    "kkt_residual",
    "make_buckets",
    "note_coupling",
    "objective",
    "query_relevance",
    "register_solver",
    "replicator_shift",
    "run_buckets",
    "selection_from_solution",
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
    "support_size",
    "top_b",
    "uniform_x0",
    "validate_embeddings",
]
