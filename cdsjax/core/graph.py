r"""Walks on the note link graph: personalised PageRank and the graph-diffusion prior of CDS."""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.solvers.replicator import softmax_prior
from cdsjax.core.types import Affinity

# PageRank in float32 settles into limit cycles a few ulps of its largest entry
# wide; a step within this many ulps counts as converged.
PPR_ROUNDING_ULPS = 16


def ppr_vector(
    links: Array,
    seed: Array,
    valid: Array,
    *,
    damping: float = 0.85,
    tol: float = 1e-9,
    max_iter: int = 1000,
) -> Array:
    r"""Personalised PageRank of ``seed`` over the symmetrised binary link graph.

    :math:`A = (\text{links} \lor \text{links}^\top)` without self-loops, restricted
    to valid notes; :math:`P_{ij} = A_{ij}/\sum_k A_{ik}`, with dangling rows
    uniform over the valid notes. Power iteration
    :math:`r \leftarrow (1-\gamma)\,s + \gamma P^\top r`, renormalised to sum 1,
    from :math:`r = s` until :math:`\|\Delta r\|_\infty <` ``tol`` or ``max_iter``.
    In float32 a step of 1e-9 is below the rounding of entries near 0.1, so the
    step also counts as small once it is within :data:`PPR_ROUNDING_ULPS` ulps
    of :math:`\max_i r_i` (far below ``tol`` in float64, where it never binds).

    Args:
      links: ``[n, n]`` bool note-link adjacency (direction ignored).
      seed: ``[n]`` float teleport distribution (0 at padding, sums to 1).
      valid: ``[n]`` bool, True on real notes.
      damping: :math:`\gamma` in ``[0, 1)``.
      tol: stopping tolerance on the max-norm step.
      max_iter: cap on iterations (float32 rounding can keep the step above a
        very small ``tol``).

    Returns:
      ``[n]`` PageRank vector, 0 at padding.
    """
    valid = jnp.asarray(valid, bool)
    n = valid.shape[0]
    links = jnp.asarray(links)
    if links.shape != (n, n):
        raise ValueError(f"links must have shape ({n}, {n}), got {links.shape}")
    if not 0.0 <= float(damping) < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping!r}")
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    seed = jnp.where(valid, seed, 0.0)
    dtype = seed.dtype
    links = links.astype(bool)
    adj = (links | links.T) & valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
    adj = adj.astype(dtype)
    degree = jnp.sum(adj, axis=1)
    dangling = valid & (degree == 0)
    inv_degree = jnp.where(degree > 0, 1.0 / jnp.where(degree > 0, degree, 1.0), 0.0)
    uniform = valid.astype(dtype) / jnp.sum(valid)
    ulp = PPR_ROUNDING_ULPS * float(jnp.finfo(dtype).eps)

    def propagate(r):
        # P^T r: linked rows spread r_i / deg_i to neighbours; dangling mass spreads uniformly.
        spread = (r * inv_degree) @ adj + jnp.sum(jnp.where(dangling, r, 0.0)) * uniform
        r_new = (1.0 - damping) * seed + damping * spread
        return r_new / jnp.sum(r_new)

    def cond(state):
        r, step, it = state
        return (step >= jnp.maximum(tol, ulp * jnp.max(r))) & (it < max_iter)

    def body(state):
        r, _, it = state
        r_new = propagate(r)
        return r_new, jnp.max(jnp.abs(r_new - r)), it + 1

    r, _, _ = lax.while_loop(cond, body, (seed, jnp.asarray(jnp.inf, dtype), jnp.asarray(0, jnp.int32)))
    return r


def diffusion_prior(
    affinity: Affinity,
    links: Array,
    temperature: float = 0.1,
    *,
    damping: float = 0.85,
    tol: float = 1e-9,
    max_iter: int = 1000,
) -> Array:
    r"""Graph-diffusion initial point for CDS: the PageRank of the query-softmax seed.

    The notes' part of :func:`softmax_prior` (renormalised) is the teleport of
    :func:`ppr_vector` over the note link graph; the notes share the resulting
    vector, and each query vertex keeps :math:`1/(n+m)` as in the softmax prior.

    Args:
      affinity: the problem's :class:`Affinity` (queries first).
      links: ``[n, n]`` bool note-link adjacency over the notes.
      temperature: softmax temperature of the seed.
      damping, tol, max_iter: as :func:`ppr_vector`.

    Returns:
      ``[m+n]`` point on the simplex, 0 at padding.
    """
    m = affinity.num_queries
    prior = softmax_prior(affinity, temperature)
    notes_mass = prior[m:]
    note_valid = affinity.valid[m:]
    seed = notes_mass / jnp.sum(notes_mass)
    r = ppr_vector(links, seed, note_valid, damping=damping, tol=tol, max_iter=max_iter)
    return jnp.concatenate([prior[:m], r * jnp.sum(notes_mass)]).astype(prior.dtype)
