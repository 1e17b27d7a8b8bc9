"""How a solve is differentiated: an :class:`Adjoint` object, the ``adjoint=`` argument of every solve
(optimistix's ``adjoint=``), applied in one place (:func:`cdsjax.core.equilibrium.equilibrium`).

* :class:`ImplicitAdjoint` (the default): the implicit function theorem on the KKT conditions
  (:func:`cdsjax.core.implicit.attach_implicit`), forward and reverse mode, whatever the solver;
* :class:`ForwardLoopAdjoint`: forward mode through the solver's iterations (the reference of the tests;
  reverse mode through a ``while_loop`` is not defined in JAX);
* :class:`NoDerivative`: the solve is a constant (its derivative is zero);
* :class:`NoAdjoint`: differentiating the solve raises, saying why.

Each says whether it gives a derivative (:attr:`Adjoint.gives_derivative`); an adjoint the caller gives is used or
refused, never replaced.
"""

from __future__ import annotations

import abc
import functools
from typing import Callable, ClassVar, Optional

import jax
from flax import struct
from jax import lax

from cdsjax.core.derivative_checks import check_converged
from cdsjax.core.implicit import attach_implicit
from cdsjax.core.types import CONVERGED, Affinity, SolverResult


class Adjoint(abc.ABC):
    """How a solve is differentiated.

    Attributes:
      gives_derivative: whether a derivative taken through the solve is one (False: zero, or refused).
    """

    gives_derivative: ClassVar[bool] = True

    @abc.abstractmethod
    def apply(self, run: Callable, inputs, threshold: Optional[float] = None):
        """``run(inputs)`` (the solve of a game), differentiated this adjoint's way.

        Args:
          run: the solve, a function of the game (an :class:`Affinity` or a payoff) to its :class:`SolverResult`.
          inputs: the game.
          threshold: the support threshold of a derivative that needs one.
        """


@struct.dataclass
class ImplicitAdjoint(Adjoint):
    r"""Differentiate an equilibrium by the implicit function theorem on its KKT conditions.

    The solve runs with gradients stopped and :func:`attach_implicit` gives :math:`x^*` the derivative of
    the KKT system on its support: forward and reverse mode, whatever the solver, exact where the solve
    converged. The default of :func:`cdsjax.core.strategies.cds` and
    :func:`cdsjax.core.equilibrium.cds_equilibrium`.

    A derivative through a solve that did not converge warns (:func:`~cdsjax.core.derivative_checks.check_converged`);
    with ``nan_if_unconverged`` it is also NaN there.
    """

    nan_if_unconverged: bool = struct.field(pytree_node=False, default=False)

    def apply(self, run: Callable[[Affinity], SolverResult], affinity: Affinity, threshold: float) -> SolverResult:
        """``run(affinity)`` with the implicit derivative attached to its point."""
        if not isinstance(affinity, Affinity):
            raise TypeError("ImplicitAdjoint differentiates a dense game (an Affinity); a payoff stored in another "
                            f"form has none: pass ForwardLoopAdjoint() or NoAdjoint(), got {type(affinity).__name__}")
        result = run(lax.stop_gradient(affinity))
        x = attach_implicit(affinity, lax.stop_gradient(result.x), threshold)
        return result.replace(x=check_converged(x, result.status == CONVERGED, self.nan_if_unconverged))


@struct.dataclass
class ForwardLoopAdjoint(Adjoint):
    """Differentiate through the solver's iterations, forward mode only (``jax.jvp``, ``jax.jacfwd``; reverse mode
    through a ``while_loop`` is not defined in JAX): the reference path of the tests."""

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
class NoAdjoint(Adjoint):
    """A solve that has no derivative, saying why: ``apply`` runs it on its inputs; differentiating them raises
    ``ValueError(reason)`` (a question's corpus block, :func:`cdsjax.core.strategies.corpus.solve_on_block`)."""

    gives_derivative: ClassVar[bool] = False
    reason: str = struct.field(pytree_node=False, default="this solve has no derivative")

    def apply(self, run: Callable, inputs, threshold: Optional[float] = None):
        """``run(inputs)``, with a derivative through ``inputs`` refused."""
        return run(refuse_derivative(inputs, self.reason))


@struct.dataclass
class NoDerivative(Adjoint):
    """A solve that is a constant for differentiation: ``apply`` runs it on gradient-stopped inputs, so its
    derivative is zero and no tangent is traced through it (e.g. the support strategy's probes, which only count
    a support)."""

    gives_derivative: ClassVar[bool] = False

    def apply(self, run: Callable, inputs, threshold: Optional[float] = None):
        """``run(inputs)`` with ``inputs`` gradient-stopped."""
        return run(lax.stop_gradient(inputs))


# the earlier name of ForwardLoopAdjoint (the name says what it does: forward mode only)
LoopAdjoint = ForwardLoopAdjoint


def check_adjoint(adjoint) -> Adjoint:
    """``adjoint`` (None: :class:`ImplicitAdjoint`) if it is an :class:`Adjoint`; ``TypeError`` otherwise."""
    if adjoint is None:
        return ImplicitAdjoint()
    if not isinstance(adjoint, Adjoint):
        raise TypeError(f"adjoint must be an Adjoint (ImplicitAdjoint(), ForwardLoopAdjoint(), NoDerivative(), "
                        f"NoAdjoint()), got {adjoint!r}")
    return adjoint
