r"""How solvers see a payoff: apply :math:`M` to :math:`x`, read a row, its valid mask.

Solvers never index a payoff's storage; they call these methods, so a payoff kept
in another form drops in without touching them. Two kinds:

* :class:`DensePayoff`: one problem's materialised ``[N, N]`` matrix
  :math:`M = A - \alpha I_{\bar S}` (every solver runs on it).
* :class:`SharedPayoff`: ``b`` single-vertex questions on one corpus,
  :math:`M_k = \begin{pmatrix} 0 & r_k^\top \\ r_k & W - \alpha I\end{pmatrix}`,
  stored as the shared block :math:`W` and the ``[b, n]`` relevance rows, applied
  with one ``[b, n] @ [n, n]`` product (replicator dynamics run on it batched).

Points are ``[..., N]`` with the batch axes (none for a dense payoff) in front.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from flax import struct
from jax import Array

from cdsjax.core.types import Affinity

SHIFT_EPS = 1e-3


def prepare_x0(x0: Optional[Array], valid: Array, dtype, batch: tuple = ()) -> Array:
    """``[*batch, N]`` start: a user point masked to ``valid`` and renormalised, uniform if None."""
    shape = batch + valid.shape
    if x0 is None:
        v = valid.astype(dtype)
        return jnp.broadcast_to(v / jnp.sum(v), shape)
    x0 = jnp.asarray(x0, dtype)
    if x0.shape != shape:
        raise ValueError(f"x0 must have shape {shape}, got {x0.shape}")
    x0 = jnp.where(valid, jnp.maximum(x0, 0.0), 0.0)
    return x0 / jnp.sum(x0, axis=-1, keepdims=True)


def replicator_shift(payoff: Array, valid: Array, eps: float = SHIFT_EPS) -> Array:
    r"""Shift :math:`c = \max(0, -\min M) + \varepsilon`, the minimum taken over valid entries."""
    pair = valid[:, None] & valid[None, :]
    lowest = jnp.min(jnp.where(pair, payoff, jnp.inf))
    return jnp.maximum(0.0, -lowest) + eps


@struct.dataclass
class DensePayoff:
    r"""One problem's payoff matrix.

    Attributes:
      matrix: ``[N, N]`` float, symmetric :math:`M` (zero rows/columns at padding).
      valid: ``[N]`` bool, True on real vertices.
      alpha: ``[]`` float, the penalty inside :math:`M` (reported, not used).
    """

    matrix: Array
    valid: Array
    alpha: Array

    @classmethod
    def from_affinity(cls, affinity: Affinity) -> "DensePayoff":
        """The payoff :math:`M = A - \\alpha I_{\\bar S}` of ``affinity``."""
        return cls(matrix=affinity.payoff(), valid=affinity.valid, alpha=affinity.alpha)

    @classmethod
    def of(cls, payoff) -> "DensePayoff":
        """``payoff`` itself (any payoff with the protocol's methods), or a bare ``[N, N]`` matrix wrapped
        (every vertex valid)."""
        if hasattr(payoff, "matvec") and hasattr(payoff, "row"):
            return payoff
        matrix = jnp.asarray(payoff)
        return cls(matrix=matrix, valid=jnp.ones(matrix.shape[:1], bool), alpha=jnp.zeros((), matrix.dtype))

    @property
    def dtype(self):
        return self.matrix.dtype

    @property
    def size(self) -> int:
        return self.matrix.shape[0]

    @property
    def batch(self) -> tuple:
        return ()

    def matvec(self, x: Array) -> Array:
        """``[N]`` :math:`Mx`."""
        return self.matrix @ x

    def value(self, x: Array, mx: Array) -> Array:
        r"""``[]`` :math:`x^\top M x` from ``mx`` :math:`= Mx`."""
        return x @ mx

    def row(self, i: Array) -> Array:
        """``[N]`` row ``i`` of :math:`M`."""
        return self.matrix[i]

    def submatrix(self, idx: Array) -> Array:
        """``[K, K]`` :math:`M` on the vertices ``idx`` (``[K]`` int)."""
        return self.matrix[idx[:, None], idx[None, :]]

    def diag(self) -> Array:
        """``[N]`` the diagonal of :math:`M`."""
        return jnp.diagonal(self.matrix)

    def padded(self) -> Array:
        """``[N+1, N+1]`` :math:`M` with a zero row and column appended: a face's block is then one gather from
        it (:func:`~cdsjax.core.solvers.active_set.gathered_face`), its empty slots reading the last row."""
        return jnp.pad(self.matrix, ((0, 1), (0, 1)))

    def shift(self, eps: float) -> Array:
        """The replicator shift :func:`replicator_shift` of :math:`M`."""
        return replicator_shift(self.matrix, self.valid, eps).astype(self.dtype)


@struct.dataclass
class SharedPayoff:
    r"""``b`` single-vertex questions on one corpus (query vertex first, then ``n`` notes).

    The note block is stored once; a question's row, diagonal or product is formed on demand, so no
    per-question ``[n+1, n+1]`` matrix exists. ``rel`` ``[n]`` (no batch axis) is one question, the
    form the converged solvers run on question by question.

    Attributes:
      coupling: ``[n, n]`` shared note block :math:`W` (symmetric, zero at padding).
      rel: ``[b, n]`` (or ``[n]``) relevance rows :math:`r_k`, 0 at padding.
      note_valid: ``[n]`` bool, True on real notes.
      alpha: ``[]`` the shared penalty :math:`\alpha`.
      corpus_shift: ``[]`` the replicator shift, a property of the corpus
        (:func:`cdsjax.core.strategies.shared.corpus_affinity`).
    """

    coupling: Array
    rel: Array
    note_valid: Array
    alpha: Array
    corpus_shift: Array

    @property
    def dtype(self):
        return self.coupling.dtype

    @property
    def size(self) -> int:
        return self.coupling.shape[0] + 1

    @property
    def batch(self) -> tuple:
        return self.rel.shape[:-1]

    @property
    def valid(self) -> Array:
        """``[n+1]`` bool (the query vertex, then the notes)."""
        return jnp.concatenate([jnp.ones((1,), bool), self.note_valid])

    def matvec(self, x: Array) -> Array:
        r"""``[b, n+1]`` rows :math:`M_k x_k` with one matrix--matrix product."""
        xq, y = x[..., :1], x[..., 1:]
        # W is symmetric: y @ W is (W y_k)_k without a transpose.
        notes_part = xq * self.rel + y @ self.coupling - jnp.where(self.note_valid, self.alpha, 0.0) * y
        query_part = jnp.sum(self.rel * y, axis=-1, keepdims=True)
        return jnp.concatenate([query_part, notes_part], axis=-1)

    def value(self, x: Array, mx: Array) -> Array:
        r"""``[b, 1]`` :math:`x_k^\top M_k x_k`."""
        return jnp.sum(x * mx, axis=-1, keepdims=True)

    def row(self, i: Array) -> Array:
        """``[b, n+1]`` row ``i`` (``[b]`` int; ``[]`` for one question) of each :math:`M_k`."""
        i = jnp.asarray(i)
        n = self.coupling.shape[0]
        j = jnp.maximum(i - 1, 0)
        own = (jnp.arange(n) == j[..., None]) & self.note_valid
        note_block = self.coupling[j] - jnp.where(own, self.alpha, 0.0).astype(self.dtype)
        rel_j = jnp.take_along_axis(self.rel, j[..., None], axis=-1)
        note_row = jnp.concatenate([rel_j, note_block], axis=-1)
        query_row = jnp.concatenate([jnp.zeros(self.rel.shape[:-1] + (1,), self.dtype), self.rel], axis=-1)
        return jnp.where((i == 0)[..., None], query_row, note_row)

    def submatrix(self, idx: Array) -> Array:
        """``[K, K]`` :math:`M` on the vertices ``idx`` (``[K]`` int; one question, ``rel`` ``[n]``), read from
        the block directly (no ``[K, n+1]`` rows)."""
        note = idx > 0
        j = jnp.maximum(idx - 1, 0)
        own = (idx[:, None] == idx[None, :]) & (note & self.note_valid[j])[:, None]
        notes = self.coupling[j[:, None], j[None, :]] - jnp.where(own, self.alpha, 0.0).astype(self.dtype)
        rel = self.rel[j]
        out = jnp.where(note[:, None] & note[None, :], notes, 0.0)
        out = jnp.where(~note[:, None] & note[None, :], rel[None, :], out)
        return jnp.where(note[:, None] & ~note[None, :], rel[:, None], out)

    def padded(self) -> Array:
        r"""``[n+2, n+2]`` one question's :math:`M` (``rel`` ``[n]``) with a zero row and column appended, each
        entry the value :meth:`submatrix` reads (the same operations): a face's block is then one gather from it
        (:func:`~cdsjax.core.solvers.active_set.gathered_face`), built once per solve where gathering from the
        block row by row costs several times its size on every face."""
        if self.rel.ndim != 1:
            raise ValueError(f"padded() is one question's matrix (rel [n]), got rel of shape {self.rel.shape}")
        n = self.coupling.shape[0]
        notes = jnp.arange(1, n + 1)
        # off the diagonal the block as it is (submatrix subtracts 0.0 there: the same value); on it, minus the
        # penalty on valid notes
        diag = jnp.diagonal(self.coupling) - jnp.where(self.note_valid, self.alpha, 0.0).astype(self.dtype)
        out = jnp.pad(self.coupling, ((1, 1), (1, 1)))
        out = out.at[notes, notes].set(diag)
        out = out.at[0, 1:n + 1].set(self.rel)
        return out.at[1:n + 1, 0].set(self.rel)

    def diag(self) -> Array:
        """``[b, n+1]`` the diagonal of each :math:`M_k` (0 at the query, :math:`-\alpha` at free notes)."""
        notes = jnp.diagonal(self.coupling) - jnp.where(self.note_valid, self.alpha, 0.0).astype(self.dtype)
        d = jnp.concatenate([jnp.zeros((1,), self.dtype), notes])
        return jnp.broadcast_to(d, self.batch + d.shape)

    def shift(self, eps: float) -> Array:
        """The corpus's shift (fixed, with its own ``eps``, when the corpus was built)."""
        return self.corpus_shift

    def question(self, i: Array) -> "SharedPayoff":
        """Question ``i`` (``[]`` int) of a batch: its own relevance row on the same block (``rel`` ``[n]``)."""
        return self.replace(rel=self.rel[i])
