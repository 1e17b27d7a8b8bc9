r"""One corpus, many questions one at a time: the note block built once, each question O(n d) plus its solve.

A served corpus answers one question after another with the same notes. For the paper's game and the
learned game without relevance-weighted repulsion the payoff of a single-vertex question is

.. math:: M = \begin{pmatrix} 0 & r^\top \\ r & W - \alpha I \end{pmatrix},

where only the relevance row :math:`r` reads the question: the note block :math:`W` and the penalty
:math:`\alpha` are the corpus's (:mod:`cdsjax.core.spectral` gives the bound once). Building :math:`W` costs
O(n² d) per question (0.4 GFLOP at n = 1024, 38 at 10,000), and solving on the dense ``[n+1, n+1]``
affinity adds copies of it; :func:`problem_block` builds :math:`W` once (the same functions as the dense
affinity), and a problem carrying it (``CDSProblem.note_block`` with ``bound``) is solved by
:func:`solve_on_block` on a :class:`~cdsjax.core.payoff.SharedPayoff` (products and rows of :math:`W`, no
per-question matrix).

The equilibrium is then found by the primal-dual active set (:mod:`cdsjax.core.pdas`): from the query
and the most relevant quarter of the notes it solves the face of a guessed support, drops the vertices whose
weight came out negative, adds those whose payoff beats the face's value, and solves again: 2-5 face solves,
each gathered into the smallest of its capacities that holds the support (LU up to 128 slots, conjugate
gradients on the well-conditioned face above, O(K² + K n) per product), where the vertex steps of InImDyn and
the active set needed about ``n`` sequential steps to shrink the uniform start's support. It stops, as every
converged solve does, on the Nash error over all ``n`` vertices. Where it does not converge (a payoff it
cycles on, a support past 8,192 notes), :func:`block_solver`'s active set runs from the uniform start, as
before: it starts with the InImDyn vertex steps (``vertex_first``, O(n) each) and solves each Newton system
gathered into the smallest of :data:`BLOCK_CAPACITIES` that holds the support
(:func:`cdsjax.core.active_set.gathered_direction`). The equilibrium is the same to the solver's tolerance;
the weights differ in their last bits, and the picks were measured equal on real blocks except the order of
notes whose weights tie.
No derivative flows through this path: differentiating it raises (give no ``note_block`` to differentiate a
selection).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.active_set import ActiveSet
from cdsjax.core.inimdyn import InImDyn
from cdsjax.core.payoff import SharedPayoff
from cdsjax.core.pdas import PrimalDualActiveSet
from cdsjax.core.ranking import query_cosine, read_out
from cdsjax.core.solver import iterate
from cdsjax.core.solvers import configured_solver
from cdsjax.core.types import CONVERGED, CDSProblem, Selection, SolveOptions

# The gathered Newton systems' sizes: the smallest that holds the support is solved.
BLOCK_CAPACITIES = (64, 128, 256, 512, 1024, 2048, 4096)


def block_solver(options: SolveOptions):
    """The solver :func:`solve_on_block` runs for ``options`` (checked, solver resolved), or None where the
    block path does not apply: the active set starting with its vertex steps, its Newton systems gathered
    (:data:`BLOCK_CAPACITIES`; its own ``gather`` kept if set), or InImDyn as configured; paper mode (replicator dynamics) is not run here."""
    solver = configured_solver(options.solver, options.tol, options.max_iter)
    if isinstance(solver, ActiveSet):
        return solver.replace(gather=solver.gather or BLOCK_CAPACITIES, vertex_first=True)
    if isinstance(solver, InImDyn):
        return solver
    return None


def problem_block(problem: CDSProblem, params, options: SolveOptions, strategy: str = "single") -> Optional[Array]:
    r"""The note block :math:`W` ``[n, n]`` the game ``params`` uses on ``problem``'s corpus, built once for every
    question (as the dense affinity builds it); None where :func:`solve_on_block` would not run: another
    strategy than ``"single"``, several query rows, pinned notes, ``alpha_from="full"``, paper mode, or a note
    block that reads the question (a learned game with relevance-weighted repulsion, any other game)."""
    if (strategy != "single" or problem.queries.shape[-2] != 1 or problem.pinned is not None
            or params.alpha_from != "free" or block_solver(options.check()) is None):
        return None
    return params.corpus_block(problem)


def block_solve(solver, payoff: SharedPayoff, fast: Optional[PrimalDualActiveSet] = None):
    """The equilibrium of one question on the block: with the active set configured, the primal-dual active set
    ``fast`` (:mod:`cdsjax.core.pdas`; None: its defaults, from the most relevant quarter of the notes), and where
    that does not converge the active set itself from the uniform start; any other solver (InImDyn) as
    configured."""
    if not isinstance(solver, ActiveSet):
        return iterate(solver, payoff, None)
    fast = PrimalDualActiveSet() if fast is None else fast
    fast = iterate(fast if fast.tol is not None else fast.replace(tol=solver.tol), payoff, None)
    return lax.cond(fast.status == CONVERGED, lambda: fast, lambda: iterate(solver, payoff, None))


def uses_block(problem: CDSProblem, options: SolveOptions, x0: Optional[Array] = None) -> bool:
    """Whether the ``"single"`` strategy solves ``problem`` on its ``note_block`` (static: decided at trace
    time): a block and a bound are given, one query row, no pinned notes, the uniform start, a converged solver."""
    return (problem.note_block is not None and problem.bound is not None and x0 is None
            and problem.queries.shape[-2] == 1 and problem.pinned is None and options.init == "uniform"
            and options.warm_start == "uniform" and block_solver(options) is not None)


@jax.custom_jvp
def not_differentiable(x: Array) -> Array:
    """``x`` itself; differentiating through it raises (the serving path's solve has no derivative rule)."""
    return x


@not_differentiable.defjvp
def _no_derivative(primals, tangents):
    raise ValueError("a problem carrying note_block is solved on the serving path, which is not differentiable: "
                     "give the problem without note_block (the dense path) to differentiate the selection")


def solve_on_block(problem: CDSProblem, params, options: SolveOptions, *, budget: int) -> Selection:
    r"""One question's ``"single"`` selection on the corpus's note block (module docstring).

    ``problem`` carries ``note_block`` (:func:`problem_block`) and ``bound``
    (:func:`cdsjax.core.spectral.problem_bound`) of the game ``params``; the read-out (threshold, fill rule by
    the KKT slack, then cosine) is that of the dense path. It is not differentiable: differentiating it (in the
    notes, the question, the block or the game) raises :class:`ValueError`; the dense path (no ``note_block``) is.
    """
    rel = not_differentiable(params.relevance(problem))
    dtype = rel.dtype
    w = not_differentiable(jnp.asarray(problem.note_block, dtype))
    n = problem.notes.shape[0]
    if w.shape != (n, n):
        raise ValueError(f"note_block must have shape ({n}, {n}), got {w.shape}")
    alpha = not_differentiable(params.penalty(jnp.asarray(problem.bound).astype(dtype)))
    payoff = SharedPayoff(coupling=w, rel=rel[0], note_valid=problem.valid, alpha=alpha,
                          corpus_shift=jnp.zeros((), dtype))
    result = block_solve(block_solver(options), payoff)
    slack = None
    if options.fill:
        mx = payoff.matvec(result.x)
        slack = (mx - payoff.value(result.x, mx))[1:]
    return read_out(result, problem.valid, budget=budget, threshold=options.threshold, slack=slack,
                    cosine=query_cosine(problem.notes, problem.queries).astype(dtype),
                    isolated=~jnp.any((rel[0] > 0) & problem.valid), beta=params.strength(dtype))
