r"""The query-augmented affinity and its spectral penalty: the one affinity builder of every game.

:func:`problem_affinity` is what every strategy of :func:`cdsjax.core.strategies.cds` and the differentiable
equilibrium call: the paper's game for :class:`~cdsjax.core.CDSParams` (:func:`build_affinity`), a
parametric game's own edges for any other :class:`~cdsjax.core.protocols.Game` (the learned game,
:class:`~cdsjax.core.games.learned.LearnedParams`). Both assemble their matrix, constraint set and penalty with
:func:`assemble_affinity`, so pinned notes and the penalty rule mean the same in every game.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array

from cdsjax.core.derivative_checks import hard_tau
from cdsjax.core.games.certified import certified_bound
from cdsjax.core.types import ALPHA_BOUNDS, ALPHA_FROM, COUPLINGS, TAU_MODES, Affinity, CDSProblem
from cdsjax.core.validation import as_query_matrix, check_notes_valid, query_similarity


def query_relevance(notes: Array, queries: Array, valid: Array, params: CDSParams,
                    query_scores: Optional[Array] = None) -> Array:
    r"""Query--note edge weights after sparsification.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings; rows past the valid
        prefix are padding and are ignored.
      queries: ``[m, d]`` float, L2-normalised query embeddings.
      valid: ``[n]`` bool, True on real notes.
      params: the :class:`CDSParams` (uses ``tau``, ``tau_mode``, ``tau_temperature``).
      query_scores: optional ``[m, n]`` similarities in place of :math:`q_k^\top z_i`
        (:attr:`CDSProblem.query_scores`).

    Returns:
      ``[m, n]`` float, :math:`r_{ki} = \max(q_k^\top z_i, 0)` with the
      :math:`\tau` rule applied per query row, 0 at padding.
    """
    sims = query_similarity(notes, queries, query_scores)
    rel = TAU_GATES[params.tau_mode](sims, jnp.maximum(sims, 0.0), valid, params)
    return jnp.where(valid[None, :], rel, 0.0)


def hard_tau_gate(sims: Array, rel: Array, valid: Array, params: "CDSParams") -> Array:
    """``rel`` zeroed below ``tau``, keeping each row's strongest valid edge when none clears it (a derivative
    with respect to ``tau`` is 0 here, and warns: :func:`~cdsjax.core.derivative_checks.hard_tau`)."""
    keep = sims >= hard_tau(params.tau)
    any_keep = jnp.any(keep & valid[None, :], axis=1, keepdims=True)
    masked = jnp.where(valid[None, :], sims, -jnp.inf)
    strongest = jnp.arange(sims.shape[-1])[None, :] == jnp.argmax(masked, axis=1)[:, None]
    keep = jnp.where(any_keep, keep, strongest)
    return jnp.where(keep, rel, 0.0)


def soft_tau_gate(sims: Array, rel: Array, valid: Array, params: "CDSParams") -> Array:
    r"""``rel`` times :math:`\sigma((s - \tau) / T_\tau)`."""
    return rel * jax.nn.sigmoid((sims - params.tau) / params.tau_temperature)


# tau_mode -> the rule applied to the query edges (CDSParams.tau_mode; TAU_MODES are its keys)
TAU_GATES = {"hard": hard_tau_gate, "soft": soft_tau_gate}


def note_coupling(notes: Array, valid: Array, params: CDSParams) -> Array:
    r"""The note--note block :math:`W` [n, n] (zero diagonal, zero at padding)."""
    n = notes.shape[0]
    if params.coupling == "none":
        return jnp.zeros((n, n), notes.dtype)
    gram = notes @ notes.T
    if params.coupling == "dissimilarity":
        block = params.beta * (1.0 - gram)
    else:
        block = params.beta * jnp.maximum(gram, 0.0)
    pair = valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
    return jnp.where(pair, block, 0.0).astype(notes.dtype)


def spectral_penalty(matrix: Array, mask: Array, eps: float) -> Array:
    r"""Largest eigenvalue of ``matrix`` restricted to ``mask``, plus ``eps``.

    The rows and columns outside ``mask`` are not zero-padded before ``eigvalsh``
    (that would add spurious zero eigenvalues, wrong whenever the true spectrum is
    negative). They are cut off and their diagonal set to a sentinel strictly below
    the spectrum of the restricted block, so the top eigenvalue is the block's own.

    Args:
      matrix: ``[N, N]`` float, symmetric.
      mask: ``[N]`` bool, the vertices of the block.
      eps: margin added to the eigenvalue.

    Returns:
      ``[]`` float, :math:`\lambda_{\max}(\text{matrix}[\text{mask}, \text{mask}]) + \varepsilon`;
      just ``eps`` when the mask is empty.
    """
    pair = mask[:, None] & mask[None, :]
    block = jnp.where(pair, matrix, 0.0)
    # Every eigenvalue of the block is >= -(sum of |entries|); go one below that.
    sentinel = -jnp.sum(jnp.abs(block)) - 1.0
    block = block + jnp.diag(jnp.where(mask, 0.0, sentinel))
    lam = jnp.linalg.eigvalsh(block)[-1]
    return jnp.where(jnp.any(mask), lam, 0.0) + eps


def block_bound(matrix: Array, mask: Array, params, bound: Optional[Array] = None) -> Array:
    r"""The spectral bound :math:`b \ge \lambda_{\max}(\text{matrix}[\text{mask}, \text{mask}]) + \varepsilon`
    of a game's penalty: ``bound`` when given (a corpus's, precomputed) and ``alpha_from`` is ``"free"``, else
    one eigendecomposition (:func:`spectral_penalty`) or, with ``alpha_bound="certified"``, the certified
    Lanczos bound (:func:`cdsjax.core.games.certified.certified_bound`)."""
    dtype = matrix.dtype
    if bound is not None and params.alpha_from == "free":
        return jnp.asarray(bound).astype(dtype)
    if params.alpha_bound == "certified":
        return certified_bound(matrix, mask, params.eps).astype(dtype)
    return spectral_penalty(matrix, mask, params.eps).astype(dtype)


def build_affinity(
    notes: Array,
    queries: Array,
    valid: Array,
    params: Optional["CDSParams"] = None,
    pinned: Optional[Array] = None,
    bound: Optional[Array] = None,
    query_scores: Optional[Array] = None,
) -> Affinity:
    r"""Builds the query-augmented affinity graph of one problem.

    Vertices are the ``m`` queries, then the ``n`` notes. Note--note edges follow
    ``params.coupling`` (scaled by :math:`\beta`), query--note edges are
    :math:`\max(q^\top z, 0)` after the :math:`\tau` rule, query--query edges and
    the diagonal are 0. The penalty is
    :math:`\alpha = \lambda_{\max}(A|_{\bar S}) + \varepsilon` (``alpha_from="free"``)
    or :math:`\lambda_{\max}(A) + \varepsilon` (``"full"``).

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      queries: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes (a valid prefix).
      params: :class:`CDSParams` (None: its defaults, the paper's game).
      pinned: optional ``[n]`` bool, notes that join the constraint set.
      bound: optional ``[]`` spectral bound precomputed for the corpus (:func:`block_bound`).
      query_scores: optional ``[m, n]`` similarities in place of :math:`q_k^\top z_i` (the query edges'
        source; :attr:`CDSProblem.query_scores`).

    Returns:
      The :class:`Affinity` over ``m + n`` vertices.
    """
    params = (CDSParams() if params is None else params).check()
    queries = as_query_matrix(queries, notes)
    valid = check_notes_valid(notes, valid)
    dtype = jnp.result_type(notes.dtype, queries.dtype)
    notes = notes.astype(dtype)
    queries = queries.astype(dtype)
    rel = query_relevance(notes, queries, valid, params, query_scores).astype(dtype)
    return assemble_affinity(rel, note_coupling(notes, valid, params), valid, params, pinned=pinned, bound=bound)


def check_pinned(pinned: Optional[Array], valid: Array) -> Array:
    """``[n]`` bool pinned notes (real ones only; none when ``pinned`` is None); ``ValueError`` on a bad shape."""
    n = valid.shape[0]
    if pinned is None:
        return jnp.zeros((n,), bool)
    pinned = jnp.asarray(pinned)
    if pinned.shape != (n,):
        raise ValueError(f"pinned must have shape ({n},), got {pinned.shape}")
    return pinned.astype(bool) & valid


def assemble_affinity(rel: Array, w: Array, valid: Array, params, *, pinned: Optional[Array] = None,
                      bound: Optional[Array] = None) -> Affinity:
    r"""The :class:`Affinity` of query edges ``rel`` and note block ``w``, with its constraint set and penalty.

    Args:
      rel: ``[m, n]`` query--note edges (0 at padding), in the affinity's dtype.
      w: ``[n, n]`` note--note block (zero diagonal, zero at padding), same dtype.
      valid: ``[n]`` bool, True on real notes.
      params: the game (:class:`~cdsjax.core.protocols.Game`): ``alpha_from`` and ``eps`` give the
        spectral bound :math:`b`, ``params.penalty(b)`` the penalty :math:`\alpha`.
      pinned: optional ``[n]`` bool, notes that join the constraint set.
      bound: optional ``[]`` spectral bound precomputed for the corpus (:func:`block_bound`).
    """
    m, n = rel.shape
    dtype = w.dtype
    pinned = check_pinned(pinned, valid)
    top = jnp.concatenate([jnp.zeros((m, m), dtype), rel], axis=1)
    bottom = jnp.concatenate([rel.T, w], axis=1)
    matrix = jnp.concatenate([top, bottom], axis=0)
    all_valid = jnp.concatenate([jnp.ones((m,), bool), valid])
    constraint = jnp.concatenate([jnp.ones((m,), bool), pinned])
    mask = all_valid & ~constraint if params.alpha_from == "free" else all_valid
    alpha = params.penalty(block_bound(matrix, mask, params, bound))
    return Affinity(matrix=matrix, constraint=constraint, valid=all_valid, alpha=alpha, num_queries=m)


def problem_affinity(problem: CDSProblem, params) -> Affinity:
    """The affinity of ``problem`` under the game ``params`` (:class:`~cdsjax.core.protocols.Game`): the one
    builder every strategy calls, ``params.affinity(problem)`` (:class:`CDSParams`: :func:`build_affinity`; the
    learned game reads the problem's structure arrays too)."""
    if not callable(getattr(params, "affinity", None)):
        raise TypeError(f"params must be a game (CDSParams, LearnedParams, or one with an affinity(problem) "
                        f"method), got {type(params).__name__}")
    return params.affinity(problem)


@struct.dataclass
class CDSParams:
    r"""Hyperparameters of the query-augmented affinity.

    Attributes:
      beta: diversification strength :math:`\beta` multiplying the note--note block.
        A leaf, so derivatives with respect to it are available.
      tau: query-edge sparsification threshold :math:`\tau` on cosine relevance.
        A leaf (differentiable in ``tau_mode="soft"``).
      eps: margin :math:`\varepsilon` added to the spectral bound (paper: 1e-3).
      coupling: note--note block: ``"dissimilarity"`` :math:`\beta(1-z_i^\top z_j)`
        (default), ``"similarity"`` :math:`\beta\max(z_i^\top z_j, 0)`, or ``"none"``.
      alpha_from: ``"free"`` uses :math:`\lambda_{\max}` of the block on the free
        notes (the constrained-dominant-set bound); ``"full"`` uses
        :math:`\lambda_{\max}(A)` (the literal reading of the paper's Algorithm 1).
      tau_mode: ``"hard"`` zeroes query edges below ``tau`` but keeps the single
        strongest one if none clears it; ``"soft"`` multiplies each edge by
        :math:`\sigma((s_i-\tau)/T_\tau)`.
      tau_temperature: :math:`T_\tau` of the soft mode.
      alpha_bound: how a penalty computed per question is found: ``"exact"`` (one ``eigvalsh`` of the
        block, O(n³)) or ``"certified"`` (:func:`cdsjax.core.games.certified.certified_bound`: an upper bound
        of :math:`\lambda_{\max}` in O(k n²); the guarantee holds, the penalty may be a little larger).
        A precomputed corpus bound (``CDSProblem.bound``) is used whichever is set.
    """

    beta: float | Array = 1.0
    tau: float | Array = 0.0
    eps: float = struct.field(pytree_node=False, default=1e-3)
    coupling: str = struct.field(pytree_node=False, default="dissimilarity")
    alpha_from: str = struct.field(pytree_node=False, default="free")
    tau_mode: str = struct.field(pytree_node=False, default="hard")
    tau_temperature: float = struct.field(pytree_node=False, default=0.05)
    alpha_bound: str = struct.field(pytree_node=False, default="exact")

    def check(self) -> "CDSParams":
        """Raises ``ValueError`` naming the field if an option string is unknown."""
        if self.coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {COUPLINGS}, got {self.coupling!r}")
        if self.alpha_from not in ALPHA_FROM:
            raise ValueError(f"alpha_from must be one of {ALPHA_FROM}, got {self.alpha_from!r}")
        if self.alpha_bound not in ALPHA_BOUNDS:
            raise ValueError(f"alpha_bound must be one of {ALPHA_BOUNDS}, got {self.alpha_bound!r}")
        if self.tau_mode not in TAU_MODES:
            raise ValueError(f"tau_mode must be one of {TAU_MODES}, got {self.tau_mode!r}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps!r}")
        if not self.tau_temperature > 0:
            raise ValueError(f"tau_temperature must be positive, got {self.tau_temperature!r}")
        return self

    def penalty(self, bound: Array) -> Array:
        r"""The penalty :math:`\alpha` from the spectral bound :math:`b`: the paper's :math:`\alpha = b`."""
        return bound

    def strength(self, dtype=None) -> Array:
        r"""The note-block strength :math:`\beta` as a selection reports it."""
        return self.beta

    # The Game protocol (cdsjax.core.protocols.Game): what the paper's game computes on a problem.
    # Its note block never reads the question, so the Shared strategy builds it once for a batch.
    shares_note_block: ClassVar[bool] = True

    def affinity(self, problem: CDSProblem) -> Affinity:
        """The query-augmented affinity of ``problem`` (:func:`build_affinity`, pinned notes and bound kept)."""
        return build_affinity(problem.notes, problem.queries, problem.valid, self, pinned=problem.pinned,
                              bound=problem.bound, query_scores=problem.query_scores)

    def relevance(self, problem: CDSProblem) -> Array:
        """``[m, n]`` the query edges of ``problem`` (those its affinity holds), O(m n d)."""
        queries = as_query_matrix(problem.queries, problem.notes)
        dtype = jnp.result_type(problem.notes.dtype, queries.dtype)
        return query_relevance(problem.notes.astype(dtype), queries.astype(dtype), problem.valid, self,
                               problem.query_scores).astype(dtype)

    def corpus_block(self, problem: CDSProblem) -> Array:
        """``[n, n]`` the note block :math:`W` of ``problem``'s corpus, the same for every question on it."""
        notes = jnp.asarray(problem.notes)
        valid = check_notes_valid(notes, problem.valid)
        return note_coupling(notes.astype(jnp.result_type(notes.dtype, problem.queries.dtype)), valid, self)

    def corpus_bound(self, problem: CDSProblem) -> Optional[Array]:
        """The spectral bound of ``problem``'s corpus, equal bit for bit to the per-question one
        (:func:`corpus_bound`); None with ``alpha_from="full"`` (that penalty reads each question's row)."""
        if self.alpha_from != "free":
            return None
        return corpus_bound(problem.notes, problem.valid, self, num_queries=problem.queries.shape[-2])

    def unit_corpus_bound(self, problem: CDSProblem) -> Optional[Array]:
        r"""The corpus bound at :math:`\beta = 1`, which :meth:`at_strength` rescales (None where it rebuilds:
        ``alpha_from="full"``)."""
        return self.replace(beta=1.0).corpus_bound(problem)

    def at_strength(self, problem: CDSProblem, base: Affinity, beta: Array) -> Affinity:
        r"""The affinity of ``problem`` at note-block strength ``beta``, given ``base`` built at :math:`eta = 1`:
        rescaled (:func:`scale_note_block`) where the penalty is the free block's, rebuilt otherwise."""
        if self.alpha_from == "free":
            return scale_note_block(base, beta, self.eps)
        return self.replace(beta=beta).affinity(problem)


def padded_note_penalty(block: Array, valid: Array, num_queries: int, eps: float) -> Array:
    r""":func:`spectral_penalty` of an ``[n, n]`` note block laid out as in a problem with ``num_queries``
    query rows: the same ``[m+n, m+n]`` matrix (query rows zero, as the mask leaves them) and the same
    mask, so the result equals the per-question penalty bit for bit."""
    n = block.shape[0]
    m = int(num_queries)
    dtype = block.dtype
    top = jnp.zeros((m, m + n), dtype)
    bottom = jnp.concatenate([jnp.zeros((n, m), dtype), block], axis=1)
    matrix = jnp.concatenate([top, bottom], axis=0)
    mask = jnp.concatenate([jnp.zeros((m,), bool), valid])
    return spectral_penalty(matrix, mask, eps).astype(dtype)


def corpus_bound(notes: Array, valid: Array, params: CDSParams = CDSParams(), *, num_queries: int = 1) -> Array:
    r"""The paper game's penalty :math:`\lambda_{\max}(W|_{\text{valid}}) + \varepsilon`, once per corpus.

    Equal bit for bit to the ``alpha`` of :func:`~cdsjax.core.games.affinity.build_affinity` on any question with
    ``num_queries`` query rows and no pinned notes, when ``params.alpha_from`` is ``"free"``.

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding (the padded corpus).
      valid: ``[n]`` bool, True on real notes.
      params: :class:`CDSParams` (``coupling``, ``beta``, ``eps``).
      num_queries: query rows of the questions it will serve (1 for a single question vector).

    Raises:
      ValueError: ``alpha_from="full"`` (that penalty depends on the question).
    """
    params.check()
    if params.alpha_from != "free":
        raise ValueError(f"a corpus bound needs alpha_from='free' (got {params.alpha_from!r}): "
                         "with 'full' the penalty depends on each question's relevance row")
    notes = jnp.asarray(notes)
    valid = check_notes_valid(notes, valid)
    return padded_note_penalty(note_coupling(notes, valid, params), valid, num_queries, params.eps)


def scale_note_block(base: Affinity, beta: Array, eps: float) -> Affinity:
    r"""The affinity at note-block strength ``beta`` from the one built at :math:`\beta = 1`.

    Only valid for ``alpha_from="free"``: the free block is the note block
    restricted to free notes, so :math:`\alpha(\beta) = \beta(\alpha(1)-\varepsilon)+\varepsilon`.
    """
    m = base.num_queries
    size = base.matrix.shape[0]
    query_edge = (jnp.arange(size) < m)[:, None] | (jnp.arange(size) < m)[None, :]
    beta = jnp.asarray(beta, base.matrix.dtype)
    matrix = jnp.where(query_edge, base.matrix, beta * base.matrix)
    alpha = beta * (base.alpha - eps) + eps
    return base.replace(matrix=matrix, alpha=alpha.astype(base.matrix.dtype))
