"""Pytree types shared by every part of the core.

Inputs, parameters, solver results and selections each have a type. Arrays and
differentiable hyperparameters are pytree leaves; option strings and flags are
static fields, so they are fixed at trace time.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Optional

import jax.numpy as jnp
from flax import struct
from jax import Array

from cdsjax.core.validation import as_query_matrix, check_notes_valid, query_similarity

COUPLINGS = ("dissimilarity", "similarity", "none")
ALPHA_FROM = ("free", "full")
# How a penalty that depends on the question is computed (cdsjax.core.games): one eigvalsh of the block,
# or the certified Lanczos bound (an upper bound of lambda_max in O(k n^2)).
ALPHA_BOUNDS = ("exact", "certified")
TAU_MODES = ("hard", "soft")

# Why a CDS selection holds notes outside the equilibrium's support (Selection.fill_reason);
# see cdsjax.core.ranking for the fill rule.
FILL_NONE = 0  # every pick is in the support (or no slot could be filled)
FILL_SHORT_SUPPORT = 1  # the support held fewer than budget notes; the rest ranked by KKT slack
FILL_NO_QUERY_EDGE = 2  # no note has a positive query edge; the rest ranked by cosine
FILL_REASONS = ("none", "short_support", "no_query_edge")

class Status(enum.IntEnum):
    """How a solve ended: ``SolverResult.status`` holds the code, :attr:`label` its name, :attr:`message` a
    sentence for a user (the one definition; :data:`CONVERGED` ... and :data:`STATUSES` are views of it)."""

    CONVERGED = 0  # the stopping rule fired (step or Nash error below tol)
    MAX_STEPS = 1  # a step cap (max_iter, or the active set's Newton cap) was reached first
    NONFINITE = 2  # the point or its residual holds NaN or inf (e.g. NaN input)
    SINGULAR = 3  # a Newton system of the active-set solver was singular and the cap was reached

    @property
    def label(self) -> str:
        """The name written in records and diagnostics (``"converged"``, ``"max_steps"``, ...)."""
        return self.name.lower()

    @property
    def message(self) -> str:
        """One sentence for a user."""
        return _STATUS_MESSAGES[self]


_STATUS_MESSAGES = {
    Status.CONVERGED: "The stopping rule fired: the step or the Nash error fell below the tolerance.",
    Status.MAX_STEPS: "A step cap (max_iter, or the active set's Newton cap) was reached before the tolerance.",
    Status.NONFINITE: "The point or its residual holds NaN or inf (e.g. NaN input).",
    Status.SINGULAR: "A Newton system of the active-set solver was singular and a step cap was reached.",
}
# The codes as plain names (``converged`` is ``status == CONVERGED``) and the labels by code.
CONVERGED, MAX_STEPS, NONFINITE, SINGULAR = (int(s) for s in Status)
STATUSES = tuple(s.label for s in Status)

# Hard limits of SolveOptions, checked for every caller (library, CLI, server): a request cannot ask for
# unbounded work. 1,000,000 steps is InImDyn's own default cap; paper mode runs 10,000.
MAX_ITER_CAP = 1_000_000
MAX_SUPPORT_STEPS = 100

# Kinds of notes (CDSProblem.kinds holds their index; -1 for none given).
NOTE_KINDS = ("text", "figure", "table", "chart", "page-image", "other")

# Equilibrium weights above this count as the support (selections, diagnostics, implicit derivatives).
SUPPORT_THRESHOLD = 1e-6


def kind_code(kind: str) -> int:
    """The code of a note kind in :data:`NOTE_KINDS` (``"other"`` for an unknown one)."""
    return NOTE_KINDS.index(kind) if kind in NOTE_KINDS else NOTE_KINDS.index("other")


@struct.dataclass
class Affinity:
    r"""The query-augmented affinity graph of one problem.

    Vertices are ordered constraint queries first (``m`` of them), then the ``n``
    notes; padding is trailing.

    Attributes:
      matrix: ``[m+n, m+n]`` float, the affinity :math:`A` (zero diagonal, zero
        rows/columns at padding).
      constraint: ``[m+n]`` bool, True on constraint vertices (queries, pinned notes).
      valid: ``[m+n]`` bool, True on real vertices.
      alpha: ``[]`` float, the penalty :math:`\alpha` on free vertices.
      num_queries: static ``m``.
    """

    matrix: Array
    constraint: Array
    valid: Array
    alpha: Array
    num_queries: int = struct.field(pytree_node=False, default=1)

    @property
    def free(self) -> Array:
        """``[m+n]`` bool: valid vertices outside the constraint set."""
        return self.valid & ~self.constraint

    def payoff(self) -> Array:
        r"""The payoff :math:`M = A - \alpha I_{\bar S}` (free notes get :math:`-\alpha`)."""
        return self.matrix - jnp.diag(jnp.where(self.free, self.alpha, 0.0).astype(self.matrix.dtype))


@struct.dataclass
class SolverResult:
    r"""Point reached by a solver on the simplex, with diagnostics.

    Attributes:
      x: ``[m+n]`` float, the point on the simplex (zero at padding).
      num_iters: ``[]`` int32, steps taken.
      step: ``[]`` float, the last step size (``\|x_{t+1}-x_t\|_1`` for replicator
        dynamics; the Nash error for InImDyn).
      objective: ``[]`` float, :math:`x^\top M x`.
      kkt_residual: ``[]`` float, :math:`\max_i |\min(x_i, -r_i)|` with
        :math:`r = Mx - (x^\top M x)\mathbf 1` over valid vertices.
      alpha: ``[]`` float, the penalty used.
      status: ``[]`` int32, how the solve ended: :data:`CONVERGED` (the stopping rule fired: converged is
        ``status == CONVERGED``), :data:`MAX_STEPS`, :data:`NONFINITE` or :data:`SINGULAR` (names in
        :data:`STATUSES`).
      ran: ``[]`` int32, which of ``solvers`` gave the point (:attr:`solver_run`): 0 for a loop solver, 1 where
        the served solver's fallback ran.
      solvers: static, the names of the solvers the run may end with, in the order they are tried (one for a
        loop solver; ``("pdas", "active_set")`` for the served solver on a corpus block, ``("active_set",)``
        on a dense payoff).

    How many notes the point holds is a property of a selection (:attr:`Selection.support_size`), not of a
    solve.
    """

    x: Array
    num_iters: Array
    step: Array
    objective: Array
    kkt_residual: Array
    alpha: Array
    status: Array
    ran: Array
    solvers: tuple = struct.field(pytree_node=False, default=())

    @property
    def solver_run(self) -> str:
        """The name of the solver that gave the point (``ran`` concrete, one result)."""
        return self.solvers[int(self.ran)]


@struct.dataclass
class Selection:
    """Top-``budget`` notes chosen by a selector.

    Attributes:
      indices: ``[budget]`` int32 note indices (into the ``n`` notes, queries
        excluded), best first. Entries where ``selected_valid`` is False are
        meaningless and set to 0.
      selected_valid: ``[budget]`` bool, True where a real note was selected;
        selectors may return fewer than ``budget`` notes.
      scores: ``[budget]`` float, the selector's score of each pick (0 where
        ``selected_valid`` is False).
      result: the :class:`SolverResult` for CDS, None for baselines.
      support_size: CDS only, ``[]`` int32: notes (constraint queries excluded)
        with equilibrium weight above the support threshold.
      num_filled: CDS only, ``[]`` int32: picks taken from outside the support by
        the fill rule (:mod:`cdsjax.core.ranking`) because the support held fewer
        than ``budget`` notes.
      fill_reason: CDS only, ``[]`` int32: one of :data:`FILL_NONE`,
        :data:`FILL_SHORT_SUPPORT`, :data:`FILL_NO_QUERY_EDGE` (names in
        :data:`FILL_REASONS`).
      beta: CDS only, ``[]`` float: the note-block strength beta the
        equilibrium was computed with (chosen per question by ``cds_support``).
    """

    indices: Array
    selected_valid: Array
    scores: Array
    result: Optional[SolverResult] = None
    support_size: Optional[Array] = None
    num_filled: Optional[Array] = None
    fill_reason: Optional[Array] = None
    beta: Optional[Array] = None


INITS = ("uniform", "softmax", "diffusion")
DEFAULT_SUPPORT_STEPS = 20
DEFAULT_SCALE_RANGE = (1e-4, 1e4)


@dataclasses.dataclass(frozen=True, eq=False)
class Selector:
    """A selector with the arrays its game computes once per corpus.

    Calling it selects: ``selector(problem, key)`` is ``select(problem, key)``, a :class:`Selection`.
    ``corpus_bound(problem)`` is the spectral bound every question on ``problem``'s corpus shares (None where the
    penalty depends on the question), ``corpus_block(problem)`` the note block its solve reads (None where it reads
    none); a caller computes them once per corpus and gives each question its ``bound`` and, with a block, poses
    it as a :class:`BlockProblem` (:func:`with_corpus_arrays`). ``solver`` is the solver its selections run (the
    evaluation chunks a batch by it). Selectors without a penalty (the baselines) are plain functions. Equality
    is identity, so a selector keys a cache.
    """

    select: Callable
    corpus_bound: Optional[Callable] = None
    corpus_block: Optional[Callable] = None
    solver: Optional[Any] = None

    def __call__(self, problem, key=None):
        return self.select(problem, key)

    def wrapped(self, wrap: Callable[[Callable, str], Callable]) -> "Selector":
        """The same selector with each of its functions replaced by ``wrap(function, role)`` (role ``"select"``,
        ``"bound"`` or ``"block"``), e.g. jitted."""
        return Selector(wrap(self.select, "select"),
                        corpus_bound=None if self.corpus_bound is None else wrap(self.corpus_bound, "bound"),
                        corpus_block=None if self.corpus_block is None else wrap(self.corpus_block, "block"),
                        solver=self.solver)


def as_selector(fn: Callable) -> Selector:
    """``fn`` as a :class:`Selector` (a plain selector function computes nothing per corpus)."""
    return fn if isinstance(fn, Selector) else Selector(fn)


@struct.dataclass
class CDSProblem:
    r"""One CDS problem: the notes, the question(s) and what is known about the notes' structure.

    Every array is a pytree leaf, so a batch of problems is a ``CDSProblem`` with a leading axis
    (``jax.vmap`` over it). Padding is trailing and inert: padded notes (``valid`` False) are never
    selected and their structure entries are ignored. Build one with :meth:`create`.

    Attributes:
      notes: ``[n, d]`` float, L2-normalised note embeddings.
      queries: ``[m, d]`` float, L2-normalised query embeddings. For the strategies on one question
        (``Single``, ``Peel``, ``Support``) the ``m`` rows are the constraint vertices; for
        ``Shared`` they are ``m`` separate questions on the same notes (one vertex each).
      valid: ``[n]`` bool, True on real notes.
      links: optional ``[n, n]`` bool note-link adjacency (PPR, the diffusion prior).
      doc_ids: optional ``[n]`` int32 document of each note.
      pages: optional ``[n]`` int32 page of each note.
      kinds: optional ``[n]`` int32 kind of each note (an index into :data:`NOTE_KINDS`, see
        :func:`kind_code`).
      pinned: optional ``[n]`` bool, notes added to the constraint set.
      bound: optional ``[]`` float, the game's spectral bound :math:`\lambda_{\max}(W|_F) + \varepsilon`
        computed once for the corpus (the strategy's ``corpus_bound``, e.g. ``Single().corpus_bound``); with
        ``alpha_from="free"`` it replaces the per-question eigendecomposition. It must be the bound of
        the game that solves the problem (the registry's :func:`~cdsjax.core.registry.corpus_bound_fn`
        gives the right one per selector); an upper bound of the block's :math:`\lambda_{\max}` (e.g. one
        computed without the pinned notes) keeps the guarantee.
      describes: optional ``[n]`` int32, the note each note describes: a caption's (or a Note/Source line's)
        figure, table or chart, -1 for none (the default's read-out reads a caption with its visual,
        :func:`cdsjax.core.readouts.fold_described`); None: no note describes another.
      query_scores: optional ``[m, n]`` float, the query--note similarities that stand in for
        :math:`q_k^\top z_i` wherever a relevance is computed (every selector's: CDS's query edges, the
        baselines' rankings, the read-outs' ties), e.g. a lexical and dense relevance fused above the core on the
        cosine's scale; None: the cosine of the embeddings.

    A question posed with its corpus's precomputed note block is the problem type :class:`BlockProblem`.
    """

    notes: Array
    queries: Array
    valid: Array
    links: Optional[Array] = None
    doc_ids: Optional[Array] = None
    pages: Optional[Array] = None
    kinds: Optional[Array] = None
    pinned: Optional[Array] = None
    bound: Optional[Array] = None
    describes: Optional[Array] = None
    query_scores: Optional[Array] = None

    @classmethod
    def create(cls, notes, query, valid=None, *, links=None, doc_ids=None, pages=None, kinds=None,
               pinned=None, bound=None, describes=None, query_scores=None) -> "CDSProblem":
        """A problem with ``query`` ``[d]`` promoted to ``[1, d]`` and every shape checked.

        ``valid`` None marks every note real. Raises ``ValueError`` naming the argument whose shape is
        wrong (checks are static: they run at trace time under ``jit``).
        """
        notes = jnp.asarray(notes)
        queries = as_query_matrix(query, notes)
        valid = check_notes_valid(notes, jnp.ones(notes.shape[:1], bool) if valid is None else valid)
        n = notes.shape[0]
        extras = {}
        for name, value, dtype, shape in (("links", links, bool, (n, n)), ("doc_ids", doc_ids, jnp.int32, (n,)),
                                          ("pages", pages, jnp.int32, (n,)), ("kinds", kinds, jnp.int32, (n,)),
                                          ("pinned", pinned, bool, (n,)), ("describes", describes, jnp.int32, (n,))):
            if value is None:
                extras[name] = None
                continue
            value = jnp.asarray(value)
            if value.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {value.shape}")
            extras[name] = value.astype(dtype)
        if bound is not None:
            bound = jnp.asarray(bound)
            if bound.shape != ():
                raise ValueError(f"bound must be a scalar, got shape {bound.shape}")
        if query_scores is not None:
            query_scores = query_similarity(notes, queries, query_scores)
        return cls(notes=notes, queries=queries, valid=valid, bound=bound, query_scores=query_scores, **extras)

    @property
    def num_notes(self) -> int:
        """Static ``n`` (padding included)."""
        return self.notes.shape[-2]


@struct.dataclass
class BlockProblem(CDSProblem):
    r"""One question posed on its corpus's precomputed note block: a problem type of its own (as a problem per
    geometry), built by :meth:`pose` (or :func:`with_corpus_arrays`), with its block and bound required.

    Every field of :class:`CDSProblem`, with ``bound`` required, and ``note_block`` ``[n, n]`` float, the game's
    note--note block computed once for the corpus (the strategy's ``corpus_block``:
    :meth:`cdsjax.core.strategies.select.Single.corpus_block`). The ``Single`` strategy solves it on a
    :class:`~cdsjax.core.games.payoff.SharedPayoff` of that block without building the dense affinity
    (:func:`cdsjax.core.strategies.corpus.solve_on_block`; it has no derivative, and a question the block cannot
    serve raises ``ValueError``); every other strategy refuses it (``ValueError``). :meth:`dense_problem` is the
    same question without the block.
    """

    bound: Array = struct.field(kw_only=True)
    note_block: Array = struct.field(kw_only=True)

    @classmethod
    def pose(cls, problem: CDSProblem, bound: Array, note_block: Array) -> "BlockProblem":
        """``problem`` (or a batch of problems, a leading axis on every array alike) posed on its corpus's
        ``note_block`` ``[..., n, n]`` with its spectral ``bound``. Raises ``ValueError`` naming a missing or
        misshapen array (static checks: they run at trace time)."""
        if bound is None or note_block is None:
            raise ValueError("a BlockProblem needs its corpus's bound and note_block (both computed once per corpus)")
        n = problem.notes.shape[-2]
        if tuple(note_block.shape[-2:]) != (n, n):
            raise ValueError(f"note_block must have shape [..., {n}, {n}], got {tuple(note_block.shape)}")
        plain = problem.dense_problem() if isinstance(problem, BlockProblem) else problem
        fields = {f.name: getattr(plain, f.name) for f in dataclasses.fields(CDSProblem)}
        fields["bound"] = bound
        return cls(**fields, note_block=note_block)

    def dense_problem(self) -> CDSProblem:
        """The same question as a plain :class:`CDSProblem` (its ``bound`` kept): solved on its dense affinity."""
        return CDSProblem(**{f.name: getattr(self, f.name) for f in dataclasses.fields(CDSProblem)})


def refuse_block_problem(problem: CDSProblem, strategy: str) -> None:
    """Raises ``ValueError`` when ``problem`` is a :class:`BlockProblem`: ``strategy`` (its name, for the message)
    solves the dense game and cannot use the block."""
    if isinstance(problem, BlockProblem):
        raise ValueError(f"{strategy} solves the dense game and cannot use a BlockProblem's note block: pass "
                         "problem.dense_problem(), or the Single() strategy")


def with_corpus_arrays(problem: CDSProblem, bound: Optional[Array], note_block: Optional[Array] = None) -> CDSProblem:
    """``problem`` with its corpus's spectral ``bound`` (unchanged where None), posed as a :class:`BlockProblem`
    (:meth:`BlockProblem.pose`) where a ``note_block`` is given (a problem or a batch of them, a leading axis on
    every array alike)."""
    if bound is None:
        return problem
    if note_block is not None:
        return BlockProblem.pose(problem, bound, note_block)
    plain = problem.dense_problem() if isinstance(problem, BlockProblem) else problem
    return plain.replace(bound=bound)
