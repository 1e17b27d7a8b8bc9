r"""Support-targeted CDS: choose the note-block strength so the support is the evidence.

The paper reads the evidence off the equilibrium's *support*, a cluster that
contains the query. With the spectral penalty at :math:`\beta = 1` the support is
usually every note (the selection is then a top-B of an interior weight vector,
not a cluster); it shrinks to a few notes only at small :math:`\beta`. Why, and
why the right :math:`\beta` scales like :math:`1/n`:

**The payoff as a function of** :math:`\beta`. Write the note block as
:math:`\beta W` with :math:`W_{ij} = 1 - z_i^\top z_j` (dissimilarity coupling; the
argument only uses that :math:`\beta` multiplies the block) and the query row as
:math:`r \ge 0`. With :math:`\alpha = \lambda_{\max}(\beta W) + \varepsilon
= \beta\lambda_1 + \varepsilon` (the free-block bound, one query, no pins) the payoff is

.. math:: M(\beta) = \begin{pmatrix} 0 & r^\top \\ r & \beta(W - \lambda_1 I) - \varepsilon I \end{pmatrix}.

:math:`W - \lambda_1 I` is negative semidefinite with a null direction along the
Perron vector of :math:`W`, which is positive and spread over all notes.

**KKT on a support.** Take the model in which every pair is equally dissimilar,
:math:`W = c(\mathbf 1\mathbf 1^\top - I)` (for real embeddings :math:`c` is the mean
dissimilarity, ~0.8 for MiniLM, and the deviations are lower order): then
:math:`\lambda_1 = c(n-1)` and the note block is
:math:`\beta c\,\mathbf 1\mathbf 1^\top - D I` with :math:`D = \beta c n + \varepsilon`.
With query weight :math:`x_q`, note weights :math:`y` (:math:`\mathbf 1^\top y = 1 - x_q`)
and equilibrium payoff :math:`\lambda`, stationarity on the support reads
:math:`x_q r_i + \beta c (1 - x_q) - D y_i = \lambda`, so

.. math:: y_i = \frac{x_q}{D}\,(r_i - t), \qquad t = \frac{\lambda - \beta c (1-x_q)}{x_q},

and a note is in the support iff :math:`r_i > t`. Summing over the support,

.. math:: \sum_i (r_i - t)_+ = \frac{(1 - x_q)}{x_q}\,(\beta c n + \varepsilon).

The left side decreases in :math:`t`, so the threshold :math:`t` falls and the
support grows with the right side, i.e. with :math:`\beta n` (times the mean
dissimilarity and the odds :math:`(1-x_q)/x_q` of note mass to query mass). The
whole graph is the support once :math:`\sum_i (r_i - \min_j r_j) \lesssim
\beta c n (1-x_q)/x_q`, i.e. once :math:`\bar r - \min r \lesssim \beta c (1-x_q)/x_q`:
with cosines spread over ~0.2 and :math:`\beta = 1`, :math:`c \approx 0.8`, that
holds for almost every question, whatever :math:`n`. A support of :math:`k` notes
whose relevances spread by :math:`\Delta_k` above the cut needs
:math:`k\Delta_k \approx \beta c n (1-x_q)/x_q`, so :math:`\beta \propto k/n`.
Below :math:`\beta c n \approx \varepsilon` the penalty's margin dominates
:math:`D` and :math:`\beta` no longer changes the support (the smallest reachable
support is set by :math:`\varepsilon`).

**The selector.** The :class:`Support` strategy of :func:`cdsjax.core.strategies.cds` (:func:`cds_support`) therefore searches :math:`\gamma = \beta n`
(``n`` the valid notes) on a log scale by bisection with a fixed number of steps:
each step solves the equilibrium with the converged (active-set) solver from the
uniform start; a support of fewer than ``budget`` notes moves the lower end up,
otherwise the upper end down. It keeps the :math:`\gamma` whose support size is
closest to ``budget`` in ratio (ties to the larger support), solves there once
more, and returns that support ranked by weight: truncated to ``budget`` when
longer, completed by the fill rule of :mod:`cdsjax.core.ranking` when shorter.
Support size is monotone in :math:`\beta` in the model above; where a real
problem is not monotone, bisection still returns the best size it visited.

For the paper's game with ``alpha_from="free"`` the penalty scales exactly,
:math:`\alpha(\beta) = \beta(\alpha(1) - \varepsilon) + \varepsilon`, so the
affinity is built (one ``eigvalsh``) once and rescaled at each step;
``alpha_from="full"`` and other games (the learned one, whose note block is not
proportional to :math:`\beta`) rebuild it per step.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct
from jax import Array, lax

from typing import Optional

from cdsjax.core.games.affinity import problem_affinity
from cdsjax.core.adjoints import Adjoint, NoDerivative
from cdsjax.core.equilibrium import equilibrium
from cdsjax.core.protocols import Game
from cdsjax.core.ranking import query_cosine, read_selection
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.strategies.select import refuse_start
from cdsjax.core.types import (DEFAULT_SCALE_RANGE, DEFAULT_SUPPORT_STEPS, MAX_SUPPORT_STEPS, CDSProblem, Selection,
                               refuse_block_problem)
from cdsjax.core.validation import check_int_range


def support_settings(num_steps: Optional[int] = None, scale_range=None) -> tuple:
    r"""``(num_steps, scale_range)`` of the support strategy, checked (None: the defaults).

    ``1 <= num_steps <= MAX_SUPPORT_STEPS`` (each step one solve); ``scale_range`` a ``(low, high)`` bracket of
    :math:`\gamma = \beta n` with ``0 < low < high``, returned as a tuple of floats (a static, hashable value).
    """
    num_steps = DEFAULT_SUPPORT_STEPS if num_steps is None else num_steps
    check_int_range("num_steps", num_steps, MAX_SUPPORT_STEPS)
    scale_range = DEFAULT_SCALE_RANGE if scale_range is None else scale_range
    try:
        low, high = (float(v) for v in scale_range)
    except (TypeError, ValueError):
        raise ValueError(f"scale_range must be (low, high), got {scale_range!r}") from None
    if not 0 < low < high:
        raise ValueError(f"scale_range must be (low, high) with 0 < low < high, got {scale_range!r}")
    return int(num_steps), (low, high)


def solve_support(problem: CDSProblem, params: Game, options: SolveOptions, *, budget: int,
                  adjoint: Optional[Adjoint] = None, num_steps: Optional[int] = None,
                  scale_range=None) -> Selection:
    r"""The :class:`Support` strategy: the constrained dominant set whose support holds about ``budget`` notes.

    Chooses :math:`\beta` per question (bisection on :math:`\log(\beta n)`, see the
    module docstring) so that the equilibrium's support is closest to ``budget``
    notes, and returns that support as the evidence, ranked by weight. ``params.beta``
    is ignored (it is what is chosen); ``coupling`` must not be ``"none"``. Of
    ``options``: ``solver`` of each equilibrium, ``threshold``, ``tol`` / ``max_iter``
    of each solve and ``fill``; the strategy's own settings are ``num_steps`` (bisection
    steps, each one solve) and ``scale_range`` (``(low, high)`` bracket of
    :math:`\gamma = \beta n`), checked by :func:`support_settings`; every solve
    starts uniformly. ``result`` is the equilibrium at the chosen :math:`\beta` (differentiated by
    ``adjoint``, the choice itself held fixed), ``beta`` that :math:`\beta`. A
    :class:`~cdsjax.core.types.BlockProblem` raises ``ValueError``.
    """
    refuse_block_problem(problem, "Support()")
    notes, query = problem.notes, problem.queries
    solver, threshold = options.limited_solver(), options.threshold
    if params.coupling == "none":
        raise ValueError("cds_support needs a note block: coupling='none' makes beta irrelevant")
    num_steps, (low, high) = support_settings(num_steps, scale_range)

    base_params = params.replace(beta=1.0)
    base = problem_affinity(problem, base_params)
    dtype = base.matrix.dtype
    m = base.num_queries
    n_valid = jnp.maximum(jnp.sum(base.valid[m:]), 1).astype(dtype)

    def affinity_at(log_gamma):
        beta = jnp.exp(log_gamma) / n_valid
        return params.at_strength(problem, base, beta), beta

    def support_at(log_gamma):
        aff, _ = affinity_at(log_gamma)
        res = equilibrium(aff, solver, adjoint=NoDerivative())  # its size only: a constant
        return jnp.sum(base.valid[m:] & (res.x[m:] > threshold)).astype(jnp.int32)

    target = jnp.asarray(budget, dtype)

    def miss(size):
        # log-ratio distance to the budget; a short support loses ties to a long one
        s = size.astype(dtype)
        d = jnp.where(size > 0, jnp.abs(jnp.log(jnp.where(size > 0, s, 1.0) / target)), jnp.inf)
        return d + jnp.where(size < budget, 1e-6, 0.0).astype(dtype)

    def step(_, state):
        lo, hi, best, best_miss = state
        mid = 0.5 * (lo + hi)
        size = support_at(mid)
        short = size < budget
        lo = jnp.where(short, mid, lo)
        hi = jnp.where(short, hi, mid)
        err = miss(size)
        better = err < best_miss
        return lo, hi, jnp.where(better, mid, best), jnp.where(better, err, best_miss)

    lo0 = jnp.asarray(jnp.log(low), dtype)
    hi0 = jnp.asarray(jnp.log(high), dtype)
    init = (lo0, hi0, 0.5 * (lo0 + hi0), jnp.asarray(jnp.inf, dtype))
    _, _, best, _ = lax.fori_loop(0, num_steps, step, init)

    aff, beta = affinity_at(best)
    result = equilibrium(aff, solver, adjoint=adjoint, threshold=threshold)
    return read_selection(result, aff, options, budget=budget, cosine=query_cosine(notes, query, problem.query_scores).astype(dtype),
                          beta=beta)


@struct.dataclass
class Support:
    r"""The note-block strength chosen per question so the support holds about ``budget`` notes
    (:func:`solve_support`; module docstring). Takes no start and no :class:`~cdsjax.core.types.BlockProblem`.

    Attributes:
      num_steps: bisection steps, each one solve (None: :data:`DEFAULT_SUPPORT_STEPS`).
      scale_range: the ``(low, high)`` bracket of :math:`\gamma = \beta n` (None: the default bracket).
    """

    num_steps: Optional[int] = struct.field(pytree_node=False, default=None)
    scale_range: Optional[tuple] = struct.field(pytree_node=False, default=None)

    def check(self) -> "Support":
        """The strategy with its settings checked and filled in (:func:`support_settings`)."""
        num_steps, scale_range = support_settings(self.num_steps, self.scale_range)
        return self.replace(num_steps=num_steps, scale_range=scale_range)

    def __call__(self, problem: CDSProblem, params: Game, options: SolveOptions, *, budget: int,
                 adjoint: Optional[Adjoint] = None, x0: Optional[Array] = None) -> Selection:
        refuse_start(x0, "Support()")
        return solve_support(problem, params, options, budget=budget, adjoint=adjoint, num_steps=self.num_steps,
                             scale_range=self.scale_range)

    def corpus_bound(self, problem: CDSProblem, params: Game) -> Optional[Array]:
        r"""The game's corpus bound at :math:`\beta = 1`, which each step rescales (None where a step rebuilds
        the affinity)."""
        return params.unit_corpus_bound(problem)

    def corpus_block(self, problem: CDSProblem, params: Game, options: SolveOptions) -> None:
        """None: every step solves the dense game."""
        return None
