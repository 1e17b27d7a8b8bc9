r"""The registered solvers of :math:`\max_{x\in\Delta} x^\top M x`, by name.

Every CDS strategy (:func:`cdsjax.core.cds`) and the differentiable equilibrium name their solver
through :data:`SOLVERS`; :func:`solver_name` applies the one default (:data:`DEFAULT_SOLVER`) and
checks the name, :func:`configured_solver` applies ``tol`` / ``max_iter``. A registry selector names its
solver in its spec; the one served by default is ``"pdas"`` (:class:`~cdsjax.core.pdas.PDAS`).
"""

from __future__ import annotations

from typing import Dict, Optional

from jax import Array

from cdsjax.core.active_set import ActiveSet
from cdsjax.core.inimdyn import InImDyn
from cdsjax.core.payoff import DensePayoff
from cdsjax.core.pdas import PDAS
from cdsjax.core.protocols import Solver
from cdsjax.core.replicator import Replicator
from cdsjax.core.types import DEFAULT_SOLVER, SOLVER_ALIASES, Affinity, SolverResult
from cdsjax.core.validation import check_option

# name -> solver configuration with its default limits (tol None: the dtype's default).
SOLVERS: Dict[str, Solver] = {
    "replicator": Replicator(),  # paper mode: tol 1e-7, 10,000 steps
    "inimdyn": InImDyn(),
    # The converged mode's solver: on the CDS payoff it reached KKT <= 1e-8 in one Newton step where
    # InImDyn took 1e4-2e5 vertex steps (experiments/bench_solvers.py).
    "active_set": ActiveSet(),
    # The serving solver of one question on its corpus block: the primal-dual active set, the active set (its
    # vertex steps first, Newton systems gathered) where it does not converge; on a dense payoff the active set.
    "pdas": PDAS(),
}
# the aliases (``solver="converged"``) as entries of their own, so each can be re-registered
SOLVERS.update({alias: SOLVERS[target] for alias, target in SOLVER_ALIASES.items()})


def register_solver(name: str, solver: Solver) -> None:
    """Makes a solver configuration (the :class:`~cdsjax.core.protocols.Solver` protocol) available as
    ``solver=name``."""
    SOLVERS[name] = solver


def solver_name(solver: Optional[str]) -> str:
    """``solver``, or :data:`DEFAULT_SOLVER` when None; raises ``ValueError`` unless it is registered."""
    name = DEFAULT_SOLVER if solver is None else solver
    check_option("solver", name, tuple(SOLVERS))
    return name


def solver_label(solver: Optional[str]) -> Optional[str]:
    """The solver as diagnostics name it: the target of an alias (``"converged"`` -> ``"active_set"``)."""
    return SOLVER_ALIASES.get(solver, solver)


def configured_solver(solver: Optional[str], tol: Optional[float] = None, max_iter: Optional[int] = None) -> Solver:
    """The registered solver ``solver`` (None: the default) with ``tol`` / ``max_iter`` replaced where given."""
    limits = {k: v for k, v in (("tol", tol), ("max_iter", max_iter)) if v is not None}
    config = SOLVERS[solver_name(solver)]
    return config.replace(**limits) if limits else config


def solve(
    affinity: Affinity,
    x0: Optional[Array] = None,
    *,
    solver: Optional[str] = DEFAULT_SOLVER,
    tol: Optional[float] = None,
    max_iter: Optional[int] = None,
) -> SolverResult:
    """Runs a registered solver on ``affinity``'s dense payoff (the solver's ``dense`` form) with its default
    ``tol`` / ``max_iter``."""
    return configured_solver(solver, tol, max_iter).dense.solve(DensePayoff.from_affinity(affinity), x0)
