"""Pure JAX core of cdsjax: problems, games, solvers, adjoints, strategies, selectors.

Nothing here touches files, the network or global state, and nothing imports
torch, sentence-transformers, vllm, openai, pymupdf or :mod:`cdsjax.io`; parameter
files are read by :mod:`cdsjax.learn` and passed in as values.
Functions handle one query; use ``jax.vmap`` (or :func:`batched`) for batches.
One entry point, :func:`cds` (problem, strategy, game, options, adjoint).

- A problem is a :class:`CDSProblem`, or a :class:`BlockProblem` when the question is posed with its
  corpus's precomputed note block (:meth:`BlockProblem.pose`, :func:`with_corpus_arrays`; the block and bound
  required); the type, not an optional field, says which, and a strategy that cannot use a block refuses it.
- A game (:class:`CDSParams`, :class:`LearnedParams`) turns a problem into an :class:`Affinity`; a payoff
  (:class:`DensePayoff`, :class:`SharedPayoff`) is how a solver sees it.
- A strategy is an object the caller picks (:class:`Single`, :class:`Peel`, :class:`Support`, :class:`Shared`,
  any :class:`Strategy`), with its own settings; it says what it computes once per corpus.
- A solver is its algorithm: an object the caller holds and passes (``SolveOptions.solver``, ``solver=``) with
  ``solve`` and ``with_limits`` only: :class:`Replicator`, :class:`InImDyn`, :class:`ActiveSet`,
  :class:`PrimalDualActiveSet`, or a combination: :class:`WithFallback` (a solver tried first, another run where
  it ends unconverged), :class:`WarmStart` (a solver started from another's point), :class:`ByPayoff` (one
  solver per payoff storage); :data:`SERVING_SOLVER` is the combination the served selectors use. Solver names
  are for configuration files and the command line only, converted once by :func:`solver_from_name`.
- :func:`equilibrium` (game, solver, x0, adjoint=) is the one solve every strategy runs; the adjoint
  (an :class:`Adjoint`: :class:`ImplicitAdjoint`, :class:`ForwardLoopAdjoint`, :class:`NoDerivative`,
  :class:`NoAdjoint`) is applied there
  only, as the caller gave it, and the result records which solver gave the point (``SolverResult.solver_run``).

Modules, grouped by job (import a name that is not in ``__all__`` from its module):

- ``solvers/``: ``loop`` (the one ``while_loop``: ``iterate``, ``LoopState``, ``stop_rule``), ``replicator``,
  ``inimdyn``, ``active_set``, ``pdas`` (a step rule each) and ``options`` (``SolveOptions``, ``WithFallback``,
  ``WarmStart``, ``ByPayoff``, ``SERVING_SOLVER``, ``solver_from_name``, ``solve``);
- ``games/``: ``affinity`` (the paper's game), ``learned`` (the fitted one), ``spectral`` / ``certified`` (the
  penalty's bound), ``payoff`` (how a solver sees a game);
- ``strategies/``: ``cds`` (the entry point), ``select`` (``Single``, ``Peel``), ``support`` (``Support``),
  ``shared`` (``Shared``), ``corpus`` (a :class:`BlockProblem` on its block);
- cross-cutting, at this level: ``types``, ``protocols``, ``validation``, ``adjoints`` (``Adjoint`` and
  its kinds), ``equilibrium`` (the one solve), ``implicit`` (the KKT derivative), ``ranking`` and ``readouts`` (read-outs: top-B, per page), ``baselines``, ``graph``,
  ``subgraph``, ``surrogates``, ``batching``, ``registry`` (selectors by name), ``diagnostics``, ``compat`` (the
  array-taking entry points ``cds_select``, ``cds_peel``, ``cds_support``, ``cds_select_shared``, ``cds_weights``).

``__all__`` is the public API (docs/api.md), and the only names imported here.
"""

from cdsjax.core.batching import batch_apply, batched
from cdsjax.core.diagnostics import diagnostics, ran_paper_mode, solver_mode
from cdsjax.core.games.affinity import CDSParams
from cdsjax.core.games.learned import LearnedParams
from cdsjax.core.games.payoff import DensePayoff, SharedPayoff
from cdsjax.core.adjoints import Adjoint, ForwardLoopAdjoint, ImplicitAdjoint, LoopAdjoint, NoAdjoint, NoDerivative
from cdsjax.core.equilibrium import cds_equilibrium, equilibrium
from cdsjax.core.protocols import Game, IterativeSolver, Payoff, Solver, Strategy
from cdsjax.core.registry import SPECS, SelectorSpec, make_selector
from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.inimdyn import InImDyn
from cdsjax.core.solvers.options import (SERVING_SOLVER, ByPayoff, SolveOptions, WarmStart, WithFallback,
                                         solver_from_name)
from cdsjax.core.solvers.pdas import PrimalDualActiveSet
from cdsjax.core.solvers.replicator import Replicator
from cdsjax.core.strategies.cds import cds
from cdsjax.core.strategies.select import Peel, Single
from cdsjax.core.strategies.shared import Shared
from cdsjax.core.strategies.support import Support
from cdsjax.core.types import (CONVERGED, Affinity, BlockProblem, CDSProblem, Selection, Selector, SolverResult, Status,
                               with_corpus_arrays)

# The public API (what ``from cdsjax.core import *`` gives): the problem, the games, the solvers and adjoints, the
# entry points, the result and status types and the selectors. docs/api.md lists these names with a glossary.
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
    "WarmStart",
    "ByPayoff",
    "SERVING_SOLVER",
    "solver_from_name",
    "SolveOptions",
    # adjoints: how an equilibrium is differentiated
    "ImplicitAdjoint",
    "LoopAdjoint",
    "ForwardLoopAdjoint",
    "Adjoint",
    "NoDerivative",
    "NoAdjoint",
    # strategies: objects the caller picks
    "Strategy",
    "Single",
    "Peel",
    "Support",
    "Shared",
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
    "ran_paper_mode",
    "solver_mode",
    # selectors by name, one calling convention
    "Selector",
    "SelectorSpec",
    "SPECS",
    "make_selector",
    # batches of ragged problems
    "batched",
    "batch_apply",
]
