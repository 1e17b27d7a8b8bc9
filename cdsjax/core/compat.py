r"""The array-taking entry points, kept for the README's first lines, notebooks and existing callers.

Each is one call of the API (:func:`cdsjax.core.strategies.cds` on ``CDSProblem.create(notes, query, valid, ...)``, or
:func:`cdsjax.core.cds_equilibrium`): ``cds_select`` (the ``Single()`` strategy), ``cds_peel``, ``cds_support``,
``cds_select_shared`` and ``cds_weights`` (the equilibrium's weights, differentiable). New code poses a
:class:`~cdsjax.core.types.CDSProblem` and calls :func:`cdsjax.core.strategies.cds`.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax import Array

from cdsjax.core.games.affinity import CDSParams
from cdsjax.core.strategies.cds import cds
from cdsjax.core.strategies.select import Peel, Single
from cdsjax.core.strategies.shared import Shared
from cdsjax.core.strategies.support import Support
from cdsjax.core.equilibrium import cds_equilibrium
from cdsjax.core.protocols import Game
from cdsjax.core.solvers.options import SolveOptions
from cdsjax.core.types import CDSProblem, Selection


def _on_arrays(strategy, notes, query, valid, pinned, links, params, options, budget, kwargs) -> Selection:
    """:func:`cds` on ``CDSProblem.create(notes, query, valid, links=, pinned=)``: the array-taking entry points."""
    problem = CDSProblem.create(notes, query, valid, links=links, pinned=pinned)
    return cds(problem, strategy, params, options, budget=budget, **kwargs)


def cds_select(notes: Array, query: Array, valid: Array, *, budget: int, params: Game = CDSParams(),
               options: Optional[SolveOptions] = None, pinned: Optional[Array] = None,
               links: Optional[Array] = None, **kwargs) -> Selection:
    """Selects evidence as a constrained dominant set (one extraction).

    ``cds_select(notes, query, valid, **kw)`` is ``cds(CDSProblem.create(notes, query, valid, links=, pinned=),
    Single(), params, options, **kw)``; see :func:`cds`.
    """
    return _on_arrays(Single(), notes, query, valid, pinned, links, params, options, budget, kwargs)


def cds_peel(notes: Array, query: Array, valid: Array, *, budget: int, params: Game = CDSParams(),
             options: Optional[SolveOptions] = None, pinned: Optional[Array] = None,
             links: Optional[Array] = None, **kwargs) -> Selection:
    """Peeling extraction for several constraint vertices.

    ``cds_peel(notes, query, valid, **kw)`` is ``cds(CDSProblem.create(notes, query, valid, links=, pinned=),
    Peel(), params, options, **kw)``; see :func:`cds`.
    """
    return _on_arrays(Peel(), notes, query, valid, pinned, links, params, options, budget, kwargs)


def cds_support(notes: Array, query: Array, valid: Array, *, budget: int, params: Game = CDSParams(),
                options: Optional[SolveOptions] = None, pinned: Optional[Array] = None,
                links: Optional[Array] = None, num_steps: Optional[int] = None, scale_range=None,
                **kwargs) -> Selection:
    """Constrained dominant set whose support holds about ``budget`` notes.

    ``cds_support(notes, query, valid, num_steps=, scale_range=, **kw)`` is ``cds(CDSProblem.create(notes, query,
    valid, links=, pinned=), Support(num_steps, scale_range), params, options, **kw)``; see :func:`cds`.
    """
    return _on_arrays(Support(num_steps, scale_range), notes, query, valid, pinned, links, params, options, budget, kwargs)


def cds_select_shared(notes: Array, query: Array, valid: Array, *, budget: int, params: Game = CDSParams(),
                      options: Optional[SolveOptions] = None, pinned: Optional[Array] = None,
                      links: Optional[Array] = None, corpus=None, **kwargs) -> Selection:
    """Selection for ``b`` single-vertex questions (``query`` ``[b, d]``) on one corpus.

    ``cds_select_shared(notes, query, valid, corpus=, **kw)`` is ``cds(CDSProblem.create(notes, query, valid,
    links=, pinned=), Shared(corpus), params, options, **kw)``; see :func:`cds`.
    """
    if jnp.ndim(query) != 2:
        raise ValueError(f"queries must have shape [b, d] (one query vector per question), got {jnp.shape(query)}")
    return _on_arrays(Shared(corpus), notes, query, valid, pinned, links, params, options, budget, kwargs)


def cds_weights(notes: Array, query: Array, valid: Array, params: Game = CDSParams(), *,
                pinned: Optional[Array] = None, **kwargs) -> Array:
    r"""The equilibrium :math:`x^*` ``[m+n]`` (queries first), differentiable in ``params``.

    A thin wrapper of :func:`cds_equilibrium` on ``CDSProblem.create(notes, query, valid, pinned=pinned)``
    (``kwargs``: ``options``, ``x0``, ``adjoint`` (an adjoint object such as ``ForwardLoopAdjoint()``) and
    :class:`SolveOptions` fields) for callers that only need the weights; use :func:`cds_equilibrium` to also get
    the convergence diagnostics that say whether the derivative can be trusted.
    """
    return cds_equilibrium(CDSProblem.create(notes, query, valid, pinned=pinned), params, **kwargs)[0].x
