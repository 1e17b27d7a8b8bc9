r"""Derivatives of the CDS equilibrium with respect to its hyperparameters.

At a KKT point :math:`x^*` of :math:`\max_{x\in\Delta} x^\top M x` with support
:math:`S = \{i : x^*_i > \theta\}`,

.. math:: (M x^*)_i = \lambda \ (i \in S), \qquad x^*_i = 0 \ (i \notin S), \qquad \textstyle\sum_i x^*_i = 1,

with :math:`\lambda = x^{*\top} M x^*`. As long as the support does not change,
differentiating these equations in a perturbation :math:`\mathrm{d}M` gives the
bordered linear system

.. math:: M_{SS}\,\mathrm{d}x_S - \mathrm{d}\lambda\,\mathbf 1 = -(\mathrm{d}M\,x^*)_S,
          \qquad \mathbf 1^\top \mathrm{d}x_S = 0, \qquad \mathrm{d}x_{\bar S} = 0,

solved here at a fixed shape ``[N+1, N+1]`` by replacing the rows (and columns) of
vertices off the support with identity rows, so it jits and vmaps. The tangent is
linear in :math:`\mathrm{d}M`, so the ``jax.custom_jvp`` rule transposes and
``jax.grad`` works as well as ``jax.jacfwd``. :math:`\mathrm{d}M` itself comes from
ordinary autodiff of :func:`cdsjax.core.games.affinity.build_affinity`, so every input
of the affinity is covered: :math:`\beta`, :math:`\tau` (soft mode), the embeddings,
and the penalty :math:`\alpha = \lambda_{\max}(A|_{\bar S}) + \varepsilon` through
``eigvalsh`` (:math:`\mathrm{d}\lambda_{\max} = v^\top \mathrm{d}A\, v` for a simple
top eigenvalue; for the dissimilarity coupling :math:`\alpha - \varepsilon` is
linear in :math:`\beta`).

What the derivative means:

* It is the derivative of the equilibrium *branch* through :math:`x^*` with the
  current support. It is exact only at a converged point: report ``converged`` /
  ``kkt_residual`` next to it (:func:`cds_equilibrium` returns them).
* Where the support changes (a note enters or leaves as :math:`\beta` or
  :math:`\tau` moves) the equilibrium is continuous but has a kink; the derivative
  returned there is the one-sided derivative of the branch whose support is
  :math:`\{x^*_i > \theta\}`. It is always finite: if the restricted system is
  singular (a degenerate equilibrium) the tangent is 0 and
  :func:`implicit_system_ok` reports it.
* Hard :math:`\tau` is piecewise constant in :math:`\tau` (edges switch on and off),
  so its derivative is 0 almost everywhere; use ``tau_mode="soft"`` for
  :math:`\tau`-derivatives. Taking one under hard :math:`\tau` warns, and so does a
  derivative through a solve that did not converge (:mod:`cdsjax.core.derivative_checks`).

How to differentiate is an argument of the solve (optimistix's ``adjoint=``): :class:`ImplicitAdjoint`
(the default), :class:`LoopAdjoint` (the reference), :class:`NoDerivative` (the solve is a constant) or
:class:`NoAdjoint` (differentiating it raises, saying why); an adjoint the caller gives is used or refused,
never replaced. :func:`equilibrium` is the one solve
every strategy runs and the one place an adjoint is applied; :func:`cds_equilibrium` is a problem's equilibrium
on its dense game: :func:`cdsjax.core.strategies.cds` reads its selections off it, and the retrieval objectives of
:mod:`cdsjax.core.surrogates` differentiate it, for the paper's game and the learned one alike.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from flax import struct
from jax import Array, lax

from cdsjax.core.derivative_checks import check_converged
from cdsjax.core.games.affinity import CDSParams, problem_affinity
from cdsjax.core.graph import diffusion_prior
from cdsjax.core.games.payoff import DensePayoff
from cdsjax.core.protocols import Game
from cdsjax.core.solvers.replicator import softmax_prior
from cdsjax.core.solvers.options import SolveOptions, solve_options
from cdsjax.core.types import CONVERGED, INITS, SUPPORT_THRESHOLD, Affinity, CDSProblem, SolverResult
from cdsjax.core.validation import check_option


def implicit_system(payoff: Array, x: Array, valid: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    r"""The bordered KKT matrix of the support, padded to ``[N+1, N+1]``.

    Args:
      payoff: ``[N, N]`` float, the payoff :math:`M` (symmetric).
      x: ``[N]`` float, an equilibrium on the simplex (0 at padding).
      valid: ``[N]`` bool, True on real vertices.
      threshold: support threshold :math:`\theta`.

    Returns:
      ``[N+1, N+1]`` float :math:`K` with :math:`K_{SS} = M_{SS}`, the border
      :math:`-\mathbf 1_S` in the last row and column, identity rows and columns on
      vertices off the support (including padding), and :math:`K_{N,N} = 0`.
    """
    size = x.shape[0]
    dtype = payoff.dtype
    support = valid & (x > threshold)
    pair = support[:, None] & support[None, :]
    eye = jnp.eye(size, dtype=dtype)
    top = jnp.where(pair, payoff, jnp.where(support[:, None], 0.0, eye))
    border = -support.astype(dtype)
    upper = jnp.concatenate([top, border[:, None]], axis=1)
    lower = jnp.concatenate([border, jnp.zeros((1,), dtype)])[None, :]
    return jnp.concatenate([upper, lower], axis=0)


def _factor(system: Array) -> tuple[tuple[Array, Array], Array]:
    """LU factors of ``system`` and whether it is numerically nonsingular.

    A singular system is replaced by the identity (the caller zeroes the tangent),
    so no NaN reaches the derivative.
    """
    lu, piv = jsl.lu_factor(system)
    pivots = jnp.abs(jnp.diagonal(lu))
    scale = jnp.max(jnp.abs(system))
    tiny = jnp.finfo(system.dtype).eps * system.shape[0] * scale
    ok = jnp.all(jnp.isfinite(lu)) & (jnp.min(pivots) > tiny)
    eye = jnp.eye(system.shape[0], dtype=system.dtype)
    lu = jnp.where(ok, lu, eye)
    piv = jnp.where(ok, piv, jnp.arange(system.shape[0], dtype=piv.dtype))
    return (lu, piv), ok


def implicit_system_ok(payoff: Array, x: Array, valid: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    """``[]`` bool: whether the restricted KKT system at ``x`` is nonsingular (its tangent is used)."""
    return _factor(implicit_system(payoff, x, valid, threshold))[1]


def implicit_tangent(
    payoff: Array, x: Array, valid: Array, d_payoff: Array, threshold: float = SUPPORT_THRESHOLD
) -> Array:
    r"""Tangent :math:`\mathrm{d}x^*` of the equilibrium for a payoff tangent :math:`\mathrm{d}M`.

    Linear in ``d_payoff`` (so it transposes for reverse mode).

    Args:
      payoff: ``[N, N]`` float, :math:`M`.
      x: ``[N]`` float, the equilibrium.
      valid: ``[N]`` bool, True on real vertices.
      d_payoff: ``[N, N]`` float, :math:`\mathrm{d}M`.
      threshold: support threshold :math:`\theta`.

    Returns:
      ``[N]`` float, :math:`\mathrm{d}x^*` (0 off the support and at padding; 0
      everywhere when the restricted system is singular).
    """
    support = valid & (x > threshold)
    factors, ok = _factor(implicit_system(payoff, x, valid, threshold))
    rhs = jnp.where(support, -(d_payoff @ x), 0.0)
    rhs = jnp.concatenate([rhs, jnp.zeros((1,), rhs.dtype)])
    sol = jsl.lu_solve(factors, rhs)
    return jnp.where(ok & support, sol[:-1], 0.0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def attach_implicit(affinity: Affinity, x: Array, threshold: float = SUPPORT_THRESHOLD) -> Array:
    r"""Returns ``x`` unchanged; its derivative is the implicit one through ``affinity``.

    ``x`` must be an equilibrium of ``affinity.payoff()`` computed with gradients
    stopped (its own tangent is ignored). The JVP differentiates the KKT conditions
    on the support (see the module docstring), so it does not depend on which
    solver produced ``x``.

    Args:
      affinity: the :class:`Affinity`; tangents of ``matrix`` and ``alpha`` are used.
      x: ``[m+n]`` float, the equilibrium.
      threshold: static support threshold :math:`\theta`.

    Returns:
      ``x``.
    """
    return x


@attach_implicit.defjvp
def _attach_implicit_jvp(threshold, primals, tangents):
    affinity, x = primals
    d_affinity, _ = tangents
    free = affinity.free
    d_payoff = d_affinity.matrix - jnp.diag(jnp.where(free, d_affinity.alpha, 0.0).astype(x.dtype))
    dx = implicit_tangent(affinity.payoff(), x, affinity.valid, d_payoff, threshold)
    return x, dx


@struct.dataclass
class ImplicitAdjoint:
    r"""Differentiate an equilibrium by the implicit function theorem on its KKT conditions.

    The solve runs with gradients stopped and :func:`attach_implicit` gives :math:`x^*` the derivative of
    the KKT system on its support: forward and reverse mode, whatever the solver, exact where the solve
    converged. The default of :func:`cdsjax.core.strategies.cds` and :func:`cds_equilibrium`.

    A derivative through a solve that did not converge warns (:func:`~cdsjax.core.derivative_checks.check_converged`);
    with ``nan_if_unconverged`` it is also NaN there.
    """

    nan_if_unconverged: bool = struct.field(pytree_node=False, default=False)

    def apply(self, run: Callable[[Affinity], SolverResult], affinity: Affinity, threshold: float) -> SolverResult:
        """``run(affinity)`` with the implicit derivative attached to its point."""
        if not isinstance(affinity, Affinity):
            raise TypeError("ImplicitAdjoint differentiates a dense game (an Affinity); a payoff stored in another "
                            f"form has none: pass LoopAdjoint() or NoAdjoint(), got {type(affinity).__name__}")
        result = run(lax.stop_gradient(affinity))
        x = attach_implicit(affinity, lax.stop_gradient(result.x), threshold)
        return result.replace(x=check_converged(x, result.status == CONVERGED, self.nan_if_unconverged))


@struct.dataclass
class LoopAdjoint:
    """Differentiate through the solver's iterations (forward mode only): the reference path of the tests."""

    def apply(self, run: Callable[[Affinity], SolverResult], affinity: Affinity, threshold: float) -> SolverResult:
        """``run(affinity)`` as it is."""
        return run(affinity)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def refuse_derivative(inputs, reason: str):
    """``inputs`` (a pytree) unchanged; a derivative taken through them raises ``ValueError(reason)`` while JAX
    traces it (before anything runs)."""
    return inputs


@refuse_derivative.defjvp
def _refuse_derivative_jvp(reason, primals, tangents):
    raise ValueError(reason)


@struct.dataclass
class NoAdjoint:
    """A solve that has no derivative, saying why: ``apply`` runs it on its inputs; differentiating them raises
    ``ValueError(reason)`` (a question's corpus block, :func:`cdsjax.core.strategies.corpus.solve_on_block`)."""

    reason: str = struct.field(pytree_node=False, default="this solve has no derivative")

    def apply(self, run: Callable, inputs, threshold: Optional[float] = None):
        """``run(inputs)``, with a derivative through ``inputs`` refused."""
        return run(refuse_derivative(inputs, self.reason))


@struct.dataclass
class NoDerivative:
    """A solve that is a constant for differentiation: ``apply`` runs it on gradient-stopped inputs, so its
    derivative is zero and no tangent is traced through it (e.g. the support strategy's probes, which only count
    a support)."""

    def apply(self, run: Callable, inputs, threshold: Optional[float] = None):
        """``run(inputs)`` with ``inputs`` gradient-stopped."""
        return run(lax.stop_gradient(inputs))


Adjoint = Union[ImplicitAdjoint, LoopAdjoint, NoAdjoint, NoDerivative]
# the adjoints that give no derivative: what a solve without one (a BlockProblem's) takes as the caller's choice
NO_DERIVATIVE = (NoAdjoint, NoDerivative)


def check_adjoint(adjoint) -> Adjoint:
    """``adjoint`` (None: :class:`ImplicitAdjoint`) if it has an ``apply``; ``TypeError`` otherwise."""
    if adjoint is None:
        return ImplicitAdjoint()
    if not callable(getattr(adjoint, "apply", None)):
        raise TypeError(f"adjoint must be an adjoint object (ImplicitAdjoint(), LoopAdjoint(), NoDerivative(), "
                        f"NoAdjoint()), got {adjoint!r}")
    return adjoint


def equilibrium(game, solver, x0=None, *, adjoint=None, threshold: float = SUPPORT_THRESHOLD) -> SolverResult:
    r"""The equilibrium of ``game`` found by ``solver`` and differentiated by ``adjoint``: the one solve every
    strategy runs, the adjoint applied here and nowhere else.

    Args:
      game: the problem of :math:`\max_{x\in\Delta} x^\top M x`: an :class:`Affinity` (a question's dense
        game, solved on its :class:`~cdsjax.core.games.payoff.DensePayoff`) or a payoff stored in another form
        (:class:`~cdsjax.core.games.payoff.SharedPayoff`: a question's corpus block, or the questions of the
        ``Shared`` strategy).
      solver: the solver object (:mod:`cdsjax.core.solvers.options`).
      x0: the start: None (the solver's own), a point, or a function of the game (as the adjoint hands it to
        the solve: gradient-stopped under :class:`ImplicitAdjoint`) that returns one.
      adjoint: :class:`ImplicitAdjoint` (None; a dense game only: ``TypeError`` on another payoff),
        :class:`LoopAdjoint` (through the iterations), :class:`NoDerivative` (a constant) or :class:`NoAdjoint`
        (a derivative refused, saying why); used as given.
      threshold: the support threshold of the implicit derivative.

    Returns:
      The :class:`~cdsjax.core.SolverResult`; its ``solvers`` / ``ran`` say which solver gave the point (a
      fallback taken included).
    """
    adjoint = check_adjoint(adjoint)

    def run(g):
        start = x0(g) if callable(x0) else x0
        return solver.solve(DensePayoff.from_affinity(g) if isinstance(g, Affinity) else g, start)

    return adjoint.apply(run, game, threshold)


def initial_point(
    affinity: Affinity, init: str = "uniform", temperature: float = 0.1, links: Optional[Array] = None
) -> Optional[Array]:
    """The solver's starting point: None (uniform), the query-softmax or the graph-diffusion prior."""
    check_option("init", init, INITS)
    if init == "softmax":
        return softmax_prior(affinity, temperature)
    if init == "diffusion":
        if links is None:
            raise ValueError("init='diffusion' needs links ([n, n] bool note-link adjacency)")
        return diffusion_prior(affinity, links, temperature)
    return None


def cds_equilibrium(
    problem: CDSProblem,
    params: Game = CDSParams(),
    options: Optional[SolveOptions] = None,
    *,
    x0: Optional[Array] = None,
    adjoint: Optional[Adjoint] = None,
    **overrides,
) -> tuple[SolverResult, Affinity]:
    r"""The equilibrium of a CDS problem, differentiable in the game's parameters: the one solve every
    dense strategy of :func:`cdsjax.core.strategies.cds` runs, and the entry point for derivatives.

    Args:
      problem: the :class:`CDSProblem` (one question; its structure arrays reach a game that reads them, its
        ``pinned`` notes join the constraint set). Notes and queries must be L2-normalised (the game reads dot
        products as cosines; :func:`~cdsjax.core.surrogates.retrieval_surrogates` checks concrete ones,
        :func:`~cdsjax.core.validation.check_unit_norm`).
      params: the game: :class:`CDSParams` (``beta`` and ``tau`` are differentiable leaves; ``tau`` only in
        ``tau_mode="soft"``) or :class:`~cdsjax.core.games.learned.LearnedParams` (every leaf).
      options: :class:`SolveOptions`: ``solver`` (default ``Replicator()``, paper mode; pass a converged one,
        e.g. ``ActiveSet()`` or ``WarmStart(Replicator(), ActiveSet())``, for exact derivatives), ``tol`` /
        ``max_iter``, ``init`` (the start when ``x0`` is None) and ``threshold`` (the support of the implicit
        system).
      x0: optional ``[m+n]`` initial point (overrides ``options.init``).
      adjoint: how to differentiate: :class:`ImplicitAdjoint` (None; KKT implicit function, forward and
        reverse mode, solver-independent), :class:`LoopAdjoint` (forward mode through the iterations),
        :class:`NoDerivative` or :class:`NoAdjoint`.
      **overrides: :class:`SolveOptions` fields replacing those of ``options``.

    Returns:
      ``(result, affinity)``: the :class:`SolverResult` with differentiable ``x`` (``[m+n]``, queries first;
      the diagnostics are those of the solve, without derivatives) and the differentiable
      :class:`Affinity`. The derivative is only right where ``result.status == CONVERGED`` holds.
    """
    options = solve_options(options, **overrides)
    solver = options.limited_solver()

    def start(aff):
        return initial_point(aff, options.init, options.prior_temperature, problem.links) if x0 is None else x0

    affinity = problem_affinity(problem, params.check())
    return equilibrium(affinity, solver, start, adjoint=adjoint, threshold=options.threshold), affinity
