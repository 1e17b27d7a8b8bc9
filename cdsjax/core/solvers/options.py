r"""The solvers of :math:`\max_{x\in\Delta} x^\top M x` as objects the caller holds, and how a CDS solve is set up.

A solver is a small frozen object (as optimistix passes them) that is its algorithm and nothing more: its name
and its own settings (``tol``, ``max_iter``, its knobs). The loop solvers are
:class:`~cdsjax.core.solvers.replicator.Replicator` (paper mode), :class:`~cdsjax.core.solvers.inimdyn.InImDyn`,
:class:`~cdsjax.core.solvers.active_set.ActiveSet` and :class:`~cdsjax.core.solvers.pdas.PrimalDualActiveSet`;
combinations are solvers too:

* :class:`WithFallback`: one solver tried first, a monotone one run where it does not converge;
* :class:`WarmStart`: one solver run from the point another one reaches (e.g. the active set from replicator
  dynamics' point);
* :class:`ByPayoff`: one solver for a payoff stored on a corpus's note block, another for a question's dense
  payoff. The served combination is :data:`SERVING_SOLVER`.

Every solver has ``solve(payoff, x0)`` and ``with_limits(tol, max_iter)``; the strategies call nothing else.
How a batch of questions is chunked on a device is the evaluation's concern (:mod:`cdsjax.eval.run`), how a
selection is differentiated the adjoint's (:mod:`cdsjax.core.implicit`). A user passes their own object (any
:class:`~cdsjax.core.protocols.Solver`). Names are for the edges only (configuration files, the command line):
:func:`solver_from_name` is the one conversion. :class:`SolveOptions` holds the solver with the read-out's options.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
from flax import struct
from jax import Array, lax

from cdsjax.core.solvers.active_set import ActiveSet
from cdsjax.core.solvers.inimdyn import InImDyn
from cdsjax.core.games.payoff import DensePayoff
from cdsjax.core.solvers.loop import each_question
from cdsjax.core.solvers.pdas import BLOCK_CAPACITIES, PrimalDualActiveSet
from cdsjax.core.solvers.replicator import Replicator
from cdsjax.core.types import (CONVERGED, INITS, MAX_ITER_CAP, SUPPORT_THRESHOLD, Affinity,
                               SolverResult)
from cdsjax.core.validation import check_int_range, check_option, check_positive


@struct.dataclass
class WithFallback:
    r"""``primary`` from its own start, and where it ends unconverged ``fallback`` from the caller's start,
    under ``lax.cond`` (a batched payoff runs question by question, :func:`~cdsjax.core.solvers.loop.each_question`).

    The served solver's block part is ``WithFallback(PrimalDualActiveSet(), ActiveSet(gather=...,
    vertex_first=True))`` (:data:`SERVING_SOLVER`): the primal-dual active set on a question's corpus block, the
    active set where it cycles or its support outgrows its capacities. The primal-dual rule is written for one
    query vertex on a corpus block: give it a :class:`~cdsjax.core.games.payoff.SharedPayoff`.

    Attributes:
      primary: the solver tried first (its own start: the primal-dual rule's most relevant notes).
      fallback: the solver run where ``primary`` does not converge, from the caller's start (None: uniform).
    """

    primary: Any = struct.field(pytree_node=False, default=PrimalDualActiveSet())
    fallback: Any = struct.field(pytree_node=False, default=ActiveSet())

    @property
    def name(self) -> str:
        """The primary's name: the solver that runs first (``"pdas"`` for the served solver)."""
        return self.primary.name

    def with_limits(self, tol: Optional[float] = None, max_iter: Optional[int] = None) -> "WithFallback":
        """``tol`` for both solvers, ``max_iter`` for ``fallback`` (the primary's cap counts its own steps, e.g.
        face solves), where given."""
        return self.replace(primary=self.primary.with_limits(tol=tol), fallback=self.fallback.with_limits(tol, max_iter))

    def solve(self, payoff, x0: Optional[Array] = None) -> SolverResult:
        """The primary's point where it converges, else ``fallback``'s from ``x0``; the result's ``solvers`` are
        the primary's then the fallback's, ``ran`` says which gave the point."""
        if payoff.batch:
            return each_question(self.solve, payoff, x0)
        fast = self.primary.solve(payoff, None)
        # the names the fallback's result carries, read off its shape (the branches must return one structure)
        names = fast.solvers + jax.eval_shape(self.fallback.solve, payoff, x0).solvers
        skip = len(fast.solvers)

        def taken(result, offset):
            return result.replace(ran=result.ran + offset, solvers=names)

        return lax.cond(fast.status == CONVERGED, lambda: taken(fast, 0),
                        lambda: taken(self.fallback.solve(payoff, x0), skip))


@struct.dataclass
class WarmStart:
    r"""``solver`` started from the point ``start`` reaches from the caller's start: e.g.
    ``WarmStart(Replicator(), ActiveSet())`` polishes paper mode's point to an equilibrium.

    Attributes:
      start: the solver run first, with its own limits (from the caller's start).
      solver: the solver whose result is returned, from ``start``'s point; its name is this one's.
    """

    start: Any = struct.field(pytree_node=False, default=Replicator())
    solver: Any = struct.field(pytree_node=False, default=ActiveSet())

    @property
    def name(self) -> str:
        """The name of ``solver``, whose point is returned."""
        return self.solver.name

    def with_limits(self, tol: Optional[float] = None, max_iter: Optional[int] = None) -> "WarmStart":
        """``solver`` with its limits replaced where given (``start`` keeps its own)."""
        return self.replace(solver=self.solver.with_limits(tol, max_iter))

    def solve(self, payoff, x0: Optional[Array] = None) -> SolverResult:
        """``solver`` on ``payoff`` from ``start``'s point (``start`` from ``x0``)."""
        return self.solver.solve(payoff, self.start.solve(payoff, x0).x)


@struct.dataclass
class ByPayoff:
    r"""One solver per payoff storage: ``block`` on a payoff kept as a corpus's note block (a
    :class:`~cdsjax.core.games.payoff.SharedPayoff`: a :class:`~cdsjax.core.types.BlockProblem`, the ``Shared``
    strategy), ``dense`` on a question's dense payoff (:class:`~cdsjax.core.games.payoff.DensePayoff`), the choice
    made by the payoff's type as it is traced.

    :data:`SERVING_SOLVER` is ``ByPayoff(block=WithFallback(PrimalDualActiveSet(), ActiveSet(...)),
    dense=ActiveSet())``: the primal-dual rule needs one query vertex on a corpus block; a question with pinned
    notes, several query rows, a start or a game whose block reads the question is solved on its dense payoff
    by the active set.
    """

    block: Any = struct.field(pytree_node=False)
    dense: Any = struct.field(pytree_node=False)

    @property
    def name(self) -> str:
        """The name of ``block``, the solver it serves with (``"pdas"`` for :data:`SERVING_SOLVER`)."""
        return self.block.name

    def with_limits(self, tol: Optional[float] = None, max_iter: Optional[int] = None) -> "ByPayoff":
        """Both solvers with their limits replaced where given."""
        return self.replace(block=self.block.with_limits(tol, max_iter), dense=self.dense.with_limits(tol, max_iter))

    def solve(self, payoff, x0: Optional[Array] = None) -> SolverResult:
        """``dense`` on a :class:`~cdsjax.core.games.payoff.DensePayoff`, ``block`` on any other payoff."""
        return (self.dense if isinstance(payoff, DensePayoff) else self.block).solve(payoff, x0)


# The served solver: on a question's corpus block the primal-dual active set, and where it does not converge the
# active set (its vertex steps first, its Newton systems gathered); a question's dense payoff runs the active set.
SERVING_SOLVER = ByPayoff(block=WithFallback(PrimalDualActiveSet(), ActiveSet(gather=BLOCK_CAPACITIES,
                                                                              vertex_first=True)),
                          dense=ActiveSet())
# The solver of SolveOptions() when none is given: paper mode (tol 1e-7, 10,000 steps), the long-standing default
# of cds_select.
DEFAULT_SOLVER = Replicator()
# The names a configuration file or the command line may give (the solver's own ``name``).
SOLVER_NAMES = ("replicator", "inimdyn", "active_set", "pdas")


def solver_from_name(name: str):
    """The solver an edge (a configuration file, the command line) names: ``"replicator"`` (paper mode),
    ``"inimdyn"``, ``"active_set"`` or ``"pdas"`` (:data:`SERVING_SOLVER`), with its default limits; the one place
    a name becomes a solver. Raises ``ValueError`` for another name."""
    check_option("solver", name, SOLVER_NAMES)
    return {"replicator": Replicator(), "inimdyn": InImDyn(), "active_set": ActiveSet(),
            "pdas": SERVING_SOLVER}[name]


def check_solver(solver, field: str = "solver") -> Any:
    """``solver`` if it is a solver object (it has ``solve`` and ``with_limits``); ``TypeError`` naming ``field``
    otherwise (a name is converted by :func:`solver_from_name` at the edge)."""
    if not (callable(getattr(solver, "solve", None)) and callable(getattr(solver, "with_limits", None))):
        raise TypeError(f"{field} must be a solver object such as Replicator(), InImDyn(), ActiveSet() or "
                        f"SERVING_SOLVER (a name is converted by solver_from_name), got {solver!r}")
    return solver


def solve(affinity: Affinity, x0: Optional[Array] = None, *, solver: Any = DEFAULT_SOLVER) -> SolverResult:
    """Runs ``solver`` on ``affinity``'s dense payoff from ``x0`` (None: the solver's own start)."""
    return check_solver(solver).solve(DensePayoff.from_affinity(affinity), x0)


@struct.dataclass
class SolveOptions:
    r"""How a CDS selector solves and reads its equilibrium (every field static).

    One object for :func:`cdsjax.core.compat.cds_select`, :func:`cdsjax.core.compat.cds_peel`,
    :func:`cdsjax.core.compat.cds_select_shared` and :func:`cdsjax.core.compat.cds_support`; the
    registry builds it once per selector. The affinity's parameters (and the array
    leaves :math:`\beta`, :math:`\tau` a sweep varies) live in :class:`CDSParams`.

    Attributes:
      solver: the solver object (module docstring); default :data:`DEFAULT_SOLVER`
        (``Replicator()``, paper mode). Registry selectors give their own.
      threshold: support threshold :math:`\theta`.
      tol, max_iter: limits replacing the solver's own where given (``solver.with_limits``;
        :meth:`limited_solver`); None keeps the solver's (replicator: 1e-7 and 10,000).
      init: ``"uniform"``, ``"softmax"`` (query-softmax prior) or ``"diffusion"``
        (personalised PageRank of the softmax seed; needs ``links``).
      prior_temperature: temperature of the softmax / diffusion prior.
      fill: True fills slots the support leaves empty (the fill rule of
        :mod:`cdsjax.core.ranking`); False returns only the support.

    The support strategy's own settings (bisection steps, the bracket of :math:`\gamma = \beta n`) are
    fields of that strategy (``Support(num_steps=, scale_range=)``), not fields here.
    """

    solver: Any = struct.field(pytree_node=False, default=DEFAULT_SOLVER)
    threshold: float = struct.field(pytree_node=False, default=SUPPORT_THRESHOLD)
    tol: Optional[float] = struct.field(pytree_node=False, default=None)
    max_iter: Optional[int] = struct.field(pytree_node=False, default=None)
    init: str = struct.field(pytree_node=False, default="uniform")
    prior_temperature: float = struct.field(pytree_node=False, default=0.1)
    fill: bool = struct.field(pytree_node=False, default=True)

    def check(self) -> "SolveOptions":
        """Raises ``ValueError`` naming the field if an option string, a limit or a count is invalid, ``TypeError``
        if ``solver`` is not a solver object.

        Hard limits: ``tol > 0`` when given, ``1 <= max_iter <= MAX_ITER_CAP`` when given.
        """
        check_solver(self.solver)
        if self.tol is not None:
            check_positive("tol", self.tol)
        if self.max_iter is not None:
            check_int_range("max_iter", self.max_iter, MAX_ITER_CAP)
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        return self

    def limited_solver(self):
        """``solver`` with ``tol`` / ``max_iter`` applied where given (the solver every solve of these options
        runs)."""
        return self.solver.with_limits(self.tol, self.max_iter)


def solve_options(options: Optional[SolveOptions] = None, **overrides) -> SolveOptions:
    """``options`` (default :class:`SolveOptions`) with ``overrides`` replaced, checked.

    The functions that take ``options`` also take its fields as keyword overrides, so
    ``cds_select(..., solver=ActiveSet())`` reads as well as
    ``cds_select(..., options=SolveOptions(solver=ActiveSet()))``.

    Raises:
      TypeError: an override that is not a :class:`SolveOptions` field, or a solver that is not a solver object.
    """
    options = SolveOptions() if options is None else options
    if not isinstance(options, SolveOptions):
        raise TypeError(f"options must be a SolveOptions, got {type(options).__name__}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(SolveOptions)})
    if unknown:
        raise TypeError(f"unknown solve option(s) {unknown}; SolveOptions fields: "
                        f"{[f.name for f in dataclasses.fields(SolveOptions)]}")
    return (options.replace(**overrides) if overrides else options).check()
