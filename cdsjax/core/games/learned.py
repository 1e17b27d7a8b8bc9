r"""Learned CDS: a parametric payoff with the paper's game as one point :math:`\theta_0`.

The affinity of :func:`cdsjax.core.games.affinity.build_affinity` is extended by twelve scalars
(:class:`LearnedParams`) that a fit may move away from the paper's values:

* **Query edges** :math:`r_{ki} = \max(s_{ki}, 0)\,g_{ki}\,h_{ki}` with the soft gate
  :math:`g = 1 - \gamma + \gamma\,\sigma\big((s - \tau)/T\big)` (``gate`` :math:`\gamma`
  mixes it in, ``tau``, ``log_gate_temperature`` :math:`\log T`) and the sharpening
  :math:`h = \exp\big(\kappa\,(s - \max_j s_{kj})\big)` (``sharpness`` :math:`\kappa \ge 0`),
  which concentrates the query's pull on its best notes as :math:`\kappa` grows.
* **Note--note edges**
  :math:`W_{ij} = \big[\beta(1 - z_i^\top z_j) + \sum_f w_f\,\phi_f(i, j)\big]
  \big(1 - \lambda + \lambda\,\rho_i\rho_j\big)`, where :math:`\rho_i \in [0, 1]` is
  note :math:`i`'s clipped cosine to the query divided by the best one. With
  ``rel_repulsion`` :math:`\lambda = 1` two notes reward each other for being unlike
  only in proportion to how relevant both are, so notes of unrelated documents are
  not paid for being unlike everything. The structure features :math:`\phi_f` are
  same page (same document too), same document, a link edge, same element kind, and
  a text--visual pair (one text note, one figure/table/chart/page image); their
  weights ``w_page``, ``w_doc``, ``w_link``, ``w_same_kind``, ``w_text_visual`` may
  take either sign.
* **Penalty** :math:`\alpha = b + (f - 1)\,|b|` with :math:`b` the paper's spectral
  bound :math:`\lambda_{\max}(A|_{\bar S}) + \varepsilon` and ``alpha_factor``
  :math:`f \ge 1`, so :math:`\alpha \ge b` always and the query stays in the support.

At :data:`LearnedParams.paper` every added weight is exactly 0 and every factor
exactly 1, and the affinity is computed by the same functions as
:func:`~cdsjax.core.games.affinity.build_affinity` followed by ``+ 0.0`` and ``* 1.0``, which are exact
in floating point: the game, its equilibrium and the selection are bit-identical to
today's CDS (``tests/test_learned.py``).

Bounds (``beta >= 0``, ``alpha_factor >= 1``, ``gate`` and ``rel_repulsion`` in
[0, 1], ``sharpness >= 0``) are kept by :meth:`LearnedParams.project`, which a fit
applies after every step; :func:`learned_affinity` reads the parameters through the
same clamp with identity derivatives inside the bounds. The factor :math:`f` is a
projected parameter rather than :math:`1 + \mathrm{softplus}(u)`: a smooth map onto
:math:`[1, \infty)` that reaches 1 exactly has zero slope there, so the fit could never
leave the paper's :math:`\alpha`.

Structure arrays come from the :class:`~cdsjax.core.CDSProblem` (all optional, ``[n]`` int32 unless said):
``pages`` (0-based page, -1 unknown), ``doc_ids`` (document code; None means one document), ``kinds``
(:data:`NOTE_KINDS` code, -1 unknown), ``links`` (``[n, n]`` bool); its ``pinned`` notes join the
constraint set as in the paper's game.

:class:`LearnedParams` is a game (:class:`~cdsjax.core.protocols.Game`): :func:`cdsjax.core.strategies.cds` takes it as
``params`` under every strategy, solver and adjoint, and :func:`cdsjax.core.cds_equilibrium` differentiates
it. Parameter files are read and written by :mod:`cdsjax.learn` (the core opens no file).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array, lax

from cdsjax.core.games.affinity import CDSParams, assemble_affinity, note_coupling, query_relevance
from cdsjax.core.types import NOTE_KINDS, Affinity, CDSProblem
from cdsjax.core.validation import as_query_matrix, check_notes_valid, query_similarity

# Element kinds are coded by their position in NOTE_KINDS (the coding of CDSProblem.kinds).
TEXT_KIND = NOTE_KINDS.index("text")
VISUAL_KINDS = tuple(NOTE_KINDS.index(k) for k in ("figure", "table", "chart", "page-image"))
PAPER_GATE_TEMPERATURE = 0.05
# The paper's game the learned one extends: its tau rule, eps and alpha_from (dissimilarity coupling).
BASE = CDSParams()

# Bounds kept by LearnedParams.project: name -> (low, high); None is unbounded.
BOUNDS = {
    "beta": (0.0, None),
    "alpha_factor": (1.0, None),
    "gate": (0.0, 1.0),
    "log_gate_temperature": (math.log(1e-3), math.log(1.0)),
    "sharpness": (0.0, None),
    "rel_repulsion": (0.0, 1.0),
}


@struct.dataclass
class LearnedParams:
    r"""The twelve scalars :math:`\theta` of the learned payoff (see the module docstring).

    Every field is a pytree leaf (a float or a ``[]`` array), so ``jax.grad`` of a loss
    of :func:`learned_affinity` returns a :class:`LearnedParams` of derivatives.
    """

    beta: float | Array = 1.0
    alpha_factor: float | Array = 1.0
    tau: float | Array = 0.0
    gate: float | Array = 0.0
    log_gate_temperature: float | Array = math.log(PAPER_GATE_TEMPERATURE)
    sharpness: float | Array = 0.0
    rel_repulsion: float | Array = 0.0
    w_page: float | Array = 0.0
    w_doc: float | Array = 0.0
    w_link: float | Array = 0.0
    w_same_kind: float | Array = 0.0
    w_text_visual: float | Array = 0.0

    @classmethod
    def paper(cls) -> "LearnedParams":
        r""":math:`\theta_0`: the paper's game (beta 1, alpha the spectral bound, no shaping, no structure)."""
        return cls()

    @classmethod
    def names(cls) -> tuple:
        """The field names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict:
        """``name -> float`` (for JSON)."""
        return {k: float(getattr(self, k)) for k in self.names()}

    def content_key(self) -> tuple:
        """These parameters by their values, ``("learned", ((name, value), ...))`` sorted by name (equal parameters,
        equal key; no path involved): how a compiled selector's key names them. Non-finite values raise
        ``ValueError``."""
        values = self.to_dict()
        if not all(math.isfinite(v) for v in values.values()):
            raise ValueError("learned parameters must be finite")
        return "learned", tuple(sorted(values.items()))

    @classmethod
    def from_dict(cls, values: dict) -> "LearnedParams":
        """Inverse of :meth:`to_dict`; unknown or non-numeric entries raise ``ValueError``."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise ValueError(f"unknown learned parameter(s) {unknown}; expected a subset of {list(cls.names())}")
        out = {}
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
                raise ValueError(f"learned parameter {k!r} must be a finite number, got {v!r}")
            out[k] = float(v)
        return cls(**out)

    def project(self) -> "LearnedParams":
        """The nearest parameters inside :data:`BOUNDS` (jittable)."""
        return self.replace(**{k: jnp.clip(getattr(self, k), lo, hi) for k, (lo, hi) in BOUNDS.items()})

    def astype(self, dtype) -> "LearnedParams":
        """Every leaf as a ``[]`` array of ``dtype``."""
        return jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), self)

    # The Game interface (cdsjax.core.protocols.Game): the static options are those of BASE.
    eps = property(lambda self: BASE.eps, doc="Margin of the spectral bound (the paper's).")
    alpha_from = property(lambda self: BASE.alpha_from, doc="The block of the spectral bound (the paper's).")
    coupling = property(lambda self: BASE.coupling, doc="The note block it extends: dissimilarity.")
    alpha_bound = property(lambda self: BASE.alpha_bound, doc="A per-question penalty is exact (eigvalsh).")
    # its note block has structure terms and may read the question: the Shared strategy solves each question
    # on its own payoff
    shares_note_block: ClassVar[bool] = False

    def check(self) -> "LearnedParams":
        """Itself (every leaf is a number; bounds are applied where the parameters are read)."""
        return self

    def penalty(self, bound: Array) -> Array:
        r"""The penalty :math:`\alpha = b + (f - 1)\,|b|` (``alpha_factor`` :math:`f \ge 1`)."""
        factor = _clamped(self.astype(bound.dtype)).alpha_factor
        return bound + (factor - 1.0) * jnp.abs(bound)

    def strength(self, dtype=None) -> Array:
        r"""The learned :math:`\beta`, read inside its bounds."""
        return _clamped(self.astype(dtype)).beta

    def affinity(self, problem: CDSProblem) -> Affinity:
        """The learned game's affinity of ``problem`` (:func:`learned_affinity` with its structure and pins)."""
        return learned_affinity(problem.notes, problem.queries, problem.valid, self, links=problem.links,
                                doc_ids=problem.doc_ids, pages=problem.pages, kinds=problem.kinds,
                                pinned=problem.pinned, bound=problem.bound, query_scores=problem.query_scores)

    def relevance(self, problem: CDSProblem) -> Array:
        """``[m, n]`` the query edges of ``problem`` (those its affinity holds), O(m n d)."""
        return learned_relevance(problem.notes, problem.queries, problem.valid, self, problem.query_scores)

    def corpus_block(self, problem: CDSProblem) -> Optional[Array]:
        """``[n, n]`` the note block of ``problem``'s corpus where it does not read the question
        (:func:`learned_is_corpus_level`), else None."""
        if not learned_is_corpus_level(self):
            return None
        return learned_note_block(problem.notes, problem.valid, self, links=problem.links, pages=problem.pages,
                                  doc_ids=problem.doc_ids, kinds=problem.kinds)

    def corpus_bound(self, problem: CDSProblem) -> Optional[Array]:
        """The exact spectral bound of ``problem``'s corpus (:func:`learned_corpus_bound`) where the note block
        does not read the question; None otherwise (found per question)."""
        if not learned_is_corpus_level(self):
            return None
        return learned_corpus_bound(problem.notes, problem.valid, self, links=problem.links, pages=problem.pages,
                                    doc_ids=problem.doc_ids, kinds=problem.kinds,
                                    num_queries=problem.queries.shape[-2])

    def unit_corpus_bound(self, problem: CDSProblem) -> None:
        """None: :meth:`at_strength` rebuilds the affinity (its penalty found per strength)."""
        return None

    def at_strength(self, problem: CDSProblem, base: Affinity, beta: Array) -> Affinity:
        """The affinity of ``problem`` at note-block strength ``beta`` (rebuilt; ``base`` is not reused)."""
        return self.replace(beta=beta).affinity(problem)


def _clamped(theta: LearnedParams) -> LearnedParams:
    """``theta`` inside its bounds with derivative 1 within them (``where`` keeps the tangent of the kept side)."""
    def clamp(v, lo, hi):
        if lo is not None:
            v = jnp.where(v >= lo, v, jnp.asarray(lo, v.dtype))
        if hi is not None:
            v = jnp.where(v <= hi, v, jnp.asarray(hi, v.dtype))
        return v

    return theta.replace(**{k: clamp(getattr(theta, k), lo, hi) for k, (lo, hi) in BOUNDS.items()})


def _codes(values: Optional[Array], n: int, name: str) -> Optional[Array]:
    if values is None:
        return None
    values = jnp.asarray(values)
    if values.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {values.shape}")
    return values.astype(jnp.int32)


def structure_features(
    n: int,
    *,
    links: Optional[Array] = None,
    pages: Optional[Array] = None,
    doc_ids: Optional[Array] = None,
    kinds: Optional[Array] = None,
    dtype=jnp.float32,
) -> Array:
    r"""``[5, n, n]`` 0/1 features of each note pair: same page, same document, link, same kind, text--visual.

    Missing arrays give all-zero features (``doc_ids`` None: every note in one document).
    Diagonal and padding are not masked here (:func:`learned_affinity` does).
    """
    pages, doc_ids, kinds = (_codes(v, n, k) for v, k in ((pages, "pages"), (doc_ids, "doc_ids"), (kinds, "kinds")))
    zeros = jnp.zeros((n, n), bool)
    same_doc = jnp.ones((n, n), bool) if doc_ids is None else doc_ids[:, None] == doc_ids[None, :]
    if pages is None:
        same_page = zeros
    else:
        known = pages >= 0
        same_page = same_doc & (pages[:, None] == pages[None, :]) & known[:, None] & known[None, :]
    if links is None:
        link = zeros
    else:
        link = jnp.asarray(links).astype(bool)
        if link.shape != (n, n):
            raise ValueError(f"links must have shape ({n}, {n}), got {link.shape}")
    if kinds is None:
        same_kind = mixed = zeros
    else:
        known = kinds >= 0
        same_kind = (kinds[:, None] == kinds[None, :]) & known[:, None] & known[None, :]
        text = kinds == TEXT_KIND
        visual = jnp.isin(kinds, jnp.asarray(VISUAL_KINDS, jnp.int32))
        mixed = (text[:, None] & visual[None, :]) | (visual[:, None] & text[None, :])
    return jnp.stack([same_page, same_doc, link, same_kind, mixed]).astype(dtype)


def _shaped_relevance(notes: Array, queries: Array, valid: Array, theta: LearnedParams, query_scores=None):
    """The query edges ``[m, n]`` and each note's relative relevance ``[n]`` in [0, 1] (``query_scores``: the
    similarities in place of :math:`q_k^\top z_i`, :attr:`CDSProblem.query_scores`)."""
    sims = query_similarity(notes, queries, query_scores).astype(notes.dtype)
    rel0 = query_relevance(notes, queries, valid, BASE, sims).astype(notes.dtype)
    gate = 1.0 - theta.gate + theta.gate * jax.nn.sigmoid((sims - theta.tau) / jnp.exp(theta.log_gate_temperature))
    best = jnp.max(jnp.where(valid[None, :], sims, -jnp.inf), axis=1, keepdims=True)
    below = jnp.where(valid[None, :], sims - best, 0.0)  # <= 0 on valid notes, finite everywhere
    sharp = jnp.exp(theta.sharpness * below)
    rel = jnp.where(valid[None, :], rel0 * gate * sharp, 0.0)
    # relative relevance for the repulsion weights: a function of the similarities only
    raw = jnp.max(jnp.where(valid[None, :], jnp.maximum(sims, 0.0), 0.0), axis=0)
    top = jnp.max(raw)
    rho = raw / jnp.where(top > 0, top, 1.0)
    return rel, lax.stop_gradient(rho)


def learned_affinity(
    notes: Array,
    queries: Array,
    valid: Array,
    theta: LearnedParams,
    *,
    links: Optional[Array] = None,
    doc_ids: Optional[Array] = None,
    pages: Optional[Array] = None,
    kinds: Optional[Array] = None,
    pinned: Optional[Array] = None,
    bound: Optional[Array] = None,
    query_scores: Optional[Array] = None,
) -> Affinity:
    r"""The query-augmented affinity of the learned game (module docstring).

    Args:
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      queries: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s).
      valid: ``[n]`` bool, True on real notes.
      theta: :class:`LearnedParams` (read inside its bounds).
      links, doc_ids, pages, kinds: optional structure arrays (module docstring).
      pinned: optional ``[n]`` bool, notes that join the constraint set.
      bound: optional ``[]`` spectral bound precomputed for the corpus
        (:func:`cdsjax.core.games.learned.learned_corpus_bound`), used instead of the per-question one.
      query_scores: optional ``[m, n]`` similarities in place of :math:`q_k^\top z_i`
        (:attr:`CDSProblem.query_scores`).

    Returns:
      The :class:`Affinity` over ``m + n`` vertices, differentiable in ``theta``; at
      :meth:`LearnedParams.paper` equal bit for bit to ``build_affinity(notes, queries, valid, CDSParams(),
      pinned)``.
    """
    notes, queries, valid, theta = _inputs(notes, queries, valid, theta)
    rel, rho = _shaped_relevance(notes, queries, valid, theta, query_scores)
    w = _note_block(notes, valid, theta, rho, links=links, pages=pages, doc_ids=doc_ids, kinds=kinds)
    return assemble_affinity(rel, w, valid, theta, pinned=pinned, bound=bound)


def _inputs(notes: Array, queries: Array, valid: Array, theta: LearnedParams):
    """The checked inputs in one dtype, ``theta`` inside its bounds."""
    queries = as_query_matrix(queries, notes)
    valid = check_notes_valid(notes, valid)
    dtype = jnp.result_type(notes.dtype, queries.dtype)
    return notes.astype(dtype), queries.astype(dtype), valid, _clamped(theta.astype(dtype))


def _note_block(notes: Array, valid: Array, theta: LearnedParams, rho: Array, *, links=None, pages=None,
                doc_ids=None, kinds=None) -> Array:
    """The note--note block ``[n, n]`` (module docstring) of clamped ``theta``, relative relevance ``rho``."""
    n = notes.shape[0]
    dtype = notes.dtype
    paper_block = note_coupling(notes, valid, BASE.replace(beta=theta.beta))
    feats = structure_features(n, links=links, pages=pages, doc_ids=doc_ids, kinds=kinds, dtype=dtype)
    weights = jnp.stack([theta.w_page, theta.w_doc, theta.w_link, theta.w_same_kind, theta.w_text_visual])
    structure = jnp.tensordot(weights, feats, axes=1)
    scale = 1.0 - theta.rel_repulsion + theta.rel_repulsion * (rho[:, None] * rho[None, :])
    pair = valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
    return jnp.where(pair, (paper_block + structure) * scale, 0.0).astype(dtype)


def learned_relevance(notes: Array, queries: Array, valid: Array, theta: LearnedParams,
                      query_scores: Optional[Array] = None) -> Array:
    """``[m, n]`` the learned game's query edges alone (those of :func:`learned_affinity`), O(m n d)."""
    notes, queries, valid, theta = _inputs(notes, queries, valid, theta)
    return _shaped_relevance(notes, queries, valid, theta, query_scores)[0]


def learned_note_block(notes: Array, valid: Array, theta: LearnedParams, *, links=None, pages=None, doc_ids=None,
                       kinds=None) -> Array:
    """``[n, n]`` the learned game's note block when it does not read the question (``rel_repulsion`` 0;
    with a repulsion, the block of a question that finds no note relevant), as :func:`learned_affinity`
    builds it: computed once for a corpus (:func:`cdsjax.core.strategies.corpus.problem_block`)."""
    notes = jnp.asarray(notes)
    notes, _, valid, theta = _inputs(notes, jnp.zeros((1, notes.shape[1]), notes.dtype), valid, theta)
    rho = jnp.zeros(notes.shape[:1], notes.dtype)
    return _note_block(notes, valid, theta, rho, links=links, pages=pages, doc_ids=doc_ids, kinds=kinds)


def kind_codes(kinds: Sequence[Optional[str]]) -> list:
    """:data:`NOTE_KINDS` codes of kind names (-1 for None or an unknown name; ``paragraph`` is text)."""
    aliases = {"paragraph": "text", "page_image": "page-image", "image": "figure"}
    out = []
    for k in kinds:
        k = aliases.get(k, k) if k is not None else None
        out.append(NOTE_KINDS.index(k) if k in NOTE_KINDS else -1)
    return out


def learned_is_corpus_level(theta) -> bool:
    """True when the learned game's note block does not read the question: a relevance-weighted repulsion at or
    below 0 (a Python number or a one-element array); False for a positive one or an array of several values.

    Raises:
      TypeError: a traced ``rel_repulsion`` (under ``jit``, ``grad`` or ``vmap`` of the parameters): its value
        decides what is computed once per corpus, so the same parameters would take another path traced than
        eagerly; compute the corpus's arrays with concrete parameters.
    """
    repulsion = theta.rel_repulsion
    if isinstance(repulsion, jax.core.Tracer):
        raise TypeError("the learned game's corpus arrays depend on rel_repulsion's value, which is traced here: "
                        "compute them with concrete parameters (outside jit/grad/vmap over the parameters)")
    repulsion = np.asarray(repulsion)
    return repulsion.size == 1 and repulsion.dtype != object and float(repulsion.reshape(())) <= 0.0


def learned_corpus_bound(notes: Array, valid: Array, theta, *, links=None, pages=None, doc_ids=None, kinds=None,
                         num_queries: int = 1) -> Array:
    r"""The learned game's spectral bound :math:`b = \lambda_{\max}(W|_{\text{valid}}) + \varepsilon` once per
    corpus (before ``alpha_factor``, which :func:`~cdsjax.core.games.learned.learned_affinity` applies).

    Built by :func:`~cdsjax.core.games.learned.learned_affinity` itself on an all-zero question (its rows are masked
    out of the bound). With ``rel_repulsion`` 0 the note block :math:`C` does not read the question and this is
    the per-question bound bit for bit. Otherwise the block is
    :math:`W(q) = (1-\lambda)C + \lambda D_\rho C D_\rho` with :math:`0 \le \rho_i \le 1`, and for a unit
    :math:`x`, :math:`x^\top W x \le (1-\lambda)\lambda_{\max}(C) + \lambda \max(\lambda_{\max}(C), 0)\|D_\rho x\|^2
    \le \max(\lambda_{\max}(C), 0)`: the bound of :math:`C`, raised to at least :math:`\varepsilon`, is then an
    upper bound for every question (certified, not exact: the picks can change).
    """
    exact = learned_is_corpus_level(theta)
    probe = theta.replace(alpha_factor=1.0) if exact else theta.replace(alpha_factor=1.0, rel_repulsion=0.0)
    notes = jnp.asarray(notes)
    queries = jnp.zeros((int(num_queries), notes.shape[1]), notes.dtype)
    bound = learned_affinity(notes, queries, valid, probe, links=links, pages=pages, doc_ids=doc_ids,
                             kinds=kinds).alpha
    return bound if exact else jnp.maximum(bound, jnp.asarray(theta.eps, bound.dtype))
