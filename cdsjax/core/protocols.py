r"""The declared interfaces of the core: what a solver and a payoff must provide, and how a solve ends.

A **payoff** is the matrix :math:`M` of :math:`\max_{x\in\Delta} x^\top M x`, seen only through
:class:`Payoff`'s methods, so a payoff stored in another form (a shared note block with per-question
relevance rows, :class:`~cdsjax.core.games.payoff.SharedPayoff`) runs under every solver without the solver
knowing its storage. A **solver** (:class:`Solver`) is a small frozen object the caller holds and passes:
``solve(payoff, x0)`` gives the result; it carries its algorithm's settings and nothing else
(:mod:`cdsjax.core.solvers.options`). A **strategy** (:class:`Strategy`) is how a selection is read off
equilibria: an object the caller picks (``Single()``, ``Peel()``, ``Support()``, ``Shared()``). Most solvers are one loop (:class:`IterativeSolver`): ``init`` / ``step`` /
``terminate`` that :func:`cdsjax.core.solvers.loop.iterate` runs under one ``lax.while_loop``; ``terminate``
says both whether to stop and why (a :class:`Status`), so every reason a solve can end is decided in
the loop, by the solver, and recorded as the result's ``status``.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple, runtime_checkable

from jax import Array


@runtime_checkable
class Payoff(Protocol):
    r"""A payoff matrix :math:`M` (symmetric), possibly for a batch of problems.

    Points are ``[*batch, N]`` with the batch axes in front (none for one problem). A payoff with a batch axis
    also gives ``question(i)``, question ``i``'s own payoff, for the solvers that solve a batch question by
    question (:func:`cdsjax.core.solvers.loop.each_question`).
    """

    @property
    def dtype(self) -> Any:
        """The dtype of :math:`M`."""

    @property
    def size(self) -> int:
        """Static ``N``, the number of vertices (padding included)."""

    @property
    def batch(self) -> Tuple[int, ...]:
        """Static batch shape (``()`` for one problem)."""

    @property
    def valid(self) -> Array:
        """``[N]`` bool, True on real vertices."""

    @property
    def alpha(self) -> Array:
        """The penalty inside :math:`M` (reported in results)."""

    def matvec(self, x: Array) -> Array:
        """``[*batch, N]`` :math:`Mx`."""

    def value(self, x: Array, mx: Array) -> Array:
        r""":math:`x^\top M x` from ``mx`` :math:`= Mx` (broadcastable against ``mx``)."""

    def row(self, i: Array) -> Array:
        """``[*batch, N]`` row ``i`` of :math:`M` (``i`` ``[*batch]`` int)."""

    def submatrix(self, idx: Array) -> Array:
        """``[K, K]`` :math:`M` on the vertices ``idx`` (``[K]`` int) of one problem (no batch axes)."""

    def diag(self) -> Array:
        """``[*batch, N]`` the diagonal of :math:`M`."""

    def shift(self, eps: float) -> Array:
        r"""The replicator shift :math:`c = \max(0, -\min M) + \varepsilon` (``[*batch, 1]`` or ``[]``)."""


@runtime_checkable
class Solver(Protocol):
    r"""A solver of :math:`\max_{x\in\Delta} x^\top M x`: its algorithm, and nothing about how a caller runs it.

    The loop solvers (:mod:`cdsjax.core.solvers`), the wrappers of :mod:`cdsjax.core.solvers.options`
    (:class:`~cdsjax.core.solvers.options.WithFallback`, :class:`~cdsjax.core.solvers.options.WarmStart`,
    :class:`~cdsjax.core.solvers.options.ByPayoff`) or a user's own object. A strategy calls ``solve`` and
    nothing else; how a batch of questions is chunked is the evaluation's business, how a selection is
    differentiated the adjoint's.
    """

    name: str  # what the result's ``solvers`` (and so diagnostics) call it

    def solve(self, payoff: Payoff, x0: Optional[Array]) -> Any:
        """The :class:`~cdsjax.core.SolverResult` on ``payoff`` from ``x0`` (None: the solver's own start).

        A payoff with batch axes (the ``Shared`` strategy's questions) is solved question by question unless
        the algorithm runs a batch in one loop (replicator dynamics)."""

    def with_limits(self, tol: Optional[float] = None, max_iter: Optional[int] = None) -> "Solver":
        """The solver with ``tol`` / ``max_iter`` replaced where given."""


@runtime_checkable
class IterativeSolver(Solver, Protocol):
    r"""A solver that is one loop, for :func:`cdsjax.core.solvers.loop.iterate`.

    ``consts = prepare(payoff)`` holds what a step needs but never changes; the loop runs ``step`` while
    ``terminate`` says not done, masking each batch row once it is done; ``solve`` is
    :func:`~cdsjax.core.solvers.loop.iterate` (as :class:`~cdsjax.core.solvers.loop.LoopSolver` gives it).
    """

    tol: Optional[float]
    max_iter: int
    unroll: int

    def tolerance(self, dtype) -> float:
        """The stopping tolerance in ``dtype`` (a solver may pick one per precision)."""

    def prepare(self, payoff: Payoff) -> Any:
        """Constants of the run (e.g. the replicator shift)."""

    def init(self, payoff: Payoff, x0: Optional[Array]) -> Any:
        """The starting :class:`~cdsjax.core.solvers.loop.LoopState` (``x0`` None: uniform)."""

    def step(self, payoff: Payoff, consts: Any, state: Any) -> Any:
        """One step of the solver's rule (it may count several iterations)."""

    def terminate(self, consts: Any, state: Any) -> Tuple[Array, Array]:
        """``(done [*batch] bool, status [*batch] int32)``: whether to stop, and the :class:`Status` if so."""


@runtime_checkable
class Game(Protocol):
    r"""The parameters of a CDS game: what :func:`cdsjax.core.strategies.cds` takes as ``params``.

    :class:`~cdsjax.core.CDSParams` is the paper's game and :class:`~cdsjax.core.games.learned.LearnedParams` the
    learned one; a new game is one more pytree with these members (its differentiable values as leaves) and
    runs under every strategy, solver and adjoint. Whatever differs between games is a member: its affinity
    (assembled with :func:`~cdsjax.core.games.affinity.assemble_affinity`, so pinned notes and the penalty rule are
    shared), its query edges, what it computes once per corpus (the note block, the spectral bound; None where
    they read the question), and its affinity at another note-block strength. No code outside a game asks
    which game it is.
    """

    beta: Any
    eps: float
    alpha_from: str
    alpha_bound: str
    coupling: str
    # whether the note block never reads the question, so the Shared strategy builds it once for a batch
    # (the paper's :class:`~cdsjax.core.strategies.shared.CorpusAffinity`)
    shares_note_block: bool

    def check(self) -> "Game":
        """The game with its static options checked (``ValueError`` naming a bad one)."""

    def penalty(self, bound: Array) -> Array:
        r"""The penalty :math:`\alpha` from the spectral bound :math:`b = \lambda_{\max} + \varepsilon`."""

    def strength(self, dtype=None) -> Array:
        r"""The note-block strength :math:`\beta` the affinity uses, as ``Selection.beta`` reports it."""

    def affinity(self, problem: Any) -> Any:
        """The :class:`~cdsjax.core.Affinity` of a :class:`~cdsjax.core.CDSProblem`."""

    def relevance(self, problem: Any) -> Array:
        """``[m, n]`` the problem's query edges, those its affinity holds."""

    def corpus_block(self, problem: Any) -> Optional[Array]:
        """``[n, n]`` the note block of the problem's corpus, built once for every question; None where it
        reads the question."""

    def corpus_bound(self, problem: Any) -> Optional[Array]:
        """The spectral bound of the problem's corpus, equal to the per-question one; None where it must be found
        per question."""

    def unit_corpus_bound(self, problem: Any) -> Optional[Array]:
        r"""The corpus bound of the game at :math:`\beta = 1` where :meth:`at_strength` rescales the affinity built
        with it (the ``Support`` strategy's); None where :meth:`at_strength` rebuilds it."""

    def at_strength(self, problem: Any, base: Any, beta: Array) -> Any:
        r"""The affinity at note-block strength ``beta`` given ``base``, the one at :math:`\beta = 1`."""


@runtime_checkable
class Strategy(Protocol):
    r"""How :func:`cdsjax.core.strategies.cds` reads a selection off equilibria: an object the caller picks
    (:class:`~cdsjax.core.strategies.select.Single`, :class:`~cdsjax.core.strategies.select.Peel`,
    :class:`~cdsjax.core.strategies.support.Support`, :class:`~cdsjax.core.strategies.shared.Shared`), carrying its
    own settings. It says what it computes once per corpus, so no game or registry asks which strategy it is.
    """

    def __call__(self, problem: Any, params: Game, options: Any, *, budget: int, adjoint: Any = None,
                 x0: Optional[Array] = None) -> Any:
        """The :class:`~cdsjax.core.Selection` of ``problem`` (``options`` checked; ``adjoint`` None: the
        strategy's default; ``x0`` a start, refused by a strategy that takes none)."""

    def corpus_bound(self, problem: Any, params: Game) -> Optional[Array]:
        """The spectral bound this strategy's solves use on the problem's corpus, once for every question; None
        where it is found per question."""

    def corpus_block(self, problem: Any, params: Game, options: Any) -> Optional[Array]:
        """The note block a question is posed with (a :class:`~cdsjax.core.types.BlockProblem`); None where this
        strategy solves the dense game."""
