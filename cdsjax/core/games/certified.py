r"""A certified upper bound of the largest eigenvalue of a symmetric block in O(k n²) (no eigendecomposition).

For *any* unit vector :math:`v` with :math:`\theta = v^\top A v` and residual :math:`r = Av - \theta v`,
:math:`A = A' + \theta vv^\top + (rv^\top + vr^\top)` with :math:`A'v = 0`, so by Weyl
:math:`\lambda_{\max}(A) \le \max(\theta, \lambda_{\max}(A'|_{v^\perp})) + \|r\|`, and Gershgorin bounds the
middle term. Lanczos only finds a good :math:`v`; :mod:`cdsjax.core.games` says where the CDS penalty uses it.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax import Array, lax

LANCZOS_STEPS = 32


def _lanczos_vector(matrix: Array, mask: Array, steps: int) -> Array:
    """A unit vector supported on ``mask`` near the top eigenvector of the masked block (the top Ritz vector
    of ``steps`` Lanczos steps with full reorthogonalisation, started from the mask's indicator)."""
    size = matrix.shape[0]
    dtype = matrix.dtype
    k = max(1, min(int(steps), size))
    start = mask.astype(dtype)
    start = start / jnp.maximum(jnp.linalg.norm(start), jnp.finfo(dtype).tiny)

    def body(j, state):
        basis, alphas, betas = state
        v = basis[j]
        w = jnp.where(mask, matrix @ v, 0.0)
        a = w @ v
        # full reorthogonalisation (twice is enough) against every vector so far
        for _ in range(2):
            w = w - basis.T @ (basis @ w)
        b = jnp.linalg.norm(w)
        ok = b > 100 * jnp.finfo(dtype).eps * (jnp.abs(a) + 1.0)
        nxt = jnp.where(ok, w / jnp.where(ok, b, 1.0), 0.0)
        basis = basis.at[j + 1].set(nxt)
        return basis, alphas.at[j].set(a), betas.at[j].set(jnp.where(ok, b, 0.0))

    basis = jnp.zeros((k + 1, size), dtype).at[0].set(start)
    basis, alphas, betas = lax.fori_loop(0, k, body, (basis, jnp.zeros((k,), dtype), jnp.zeros((k,), dtype)))
    tri = jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)
    _, vecs = jnp.linalg.eigh(tri)
    v = basis[:k].T @ vecs[:, -1]
    v = jnp.where(mask, v, 0.0)
    norm = jnp.linalg.norm(v)
    return jnp.where(norm > 0, v / jnp.where(norm > 0, norm, 1.0), start)


def gershgorin(matrix: Array, mask: Array) -> Array:
    r"""Gershgorin's upper bound of :math:`\lambda_{\max}` of the masked block:
    :math:`\max_i a_{ii} + \sum_{j \ne i} |a_{ij}|` over the mask (``-inf`` when it is empty)."""
    pair = mask[:, None] & mask[None, :]
    off = jnp.where(pair & ~jnp.eye(matrix.shape[0], dtype=bool), jnp.abs(matrix), 0.0)
    rows = jnp.diagonal(matrix) + jnp.sum(off, axis=1)
    return jnp.max(jnp.where(mask, rows, -jnp.inf))


def certified_bound(matrix: Array, mask: Array, eps: float, *, steps: int = LANCZOS_STEPS,
                    vector: Optional[Array] = None) -> Array:
    r"""An upper bound of :math:`\lambda_{\max}(\text{matrix}[\text{mask}, \text{mask}])`, plus ``eps``,
    in O(``steps`` n²) (module docstring: deflated Gershgorin with a Lanczos vector, and Weyl).

    Args:
      matrix: ``[N, N]`` float, symmetric.
      mask: ``[N]`` bool, the vertices of the block.
      eps: margin added (as in :func:`~cdsjax.core.games.affinity.spectral_penalty`).
      steps: Lanczos steps that find the test vector.
      vector: optional ``[N]`` test vector to use instead of Lanczos (any nonzero vector keeps the bound
        valid; a good one keeps it tight).

    Returns:
      ``[]`` float :math:`\ge \lambda_{\max} + \varepsilon` (``eps`` when the mask is empty).
    """
    matrix = jnp.asarray(matrix)
    dtype = matrix.dtype
    pair = mask[:, None] & mask[None, :]
    block = jnp.where(pair, matrix, 0.0)
    if vector is None:
        v = _lanczos_vector(block, mask, steps)
    else:
        v = jnp.where(mask, jnp.asarray(vector, dtype), 0.0)
        v = v / jnp.maximum(jnp.linalg.norm(v), jnp.finfo(dtype).tiny)
    av = block @ v
    theta = v @ av
    r = jnp.where(mask, av - theta * v, 0.0)
    deflated = block - theta * jnp.outer(v, v) - jnp.outer(r, v) - jnp.outer(v, r)
    weyl = jnp.maximum(theta, gershgorin(deflated, mask)) + jnp.linalg.norm(r)
    plain = gershgorin(block, mask)
    # rounding of the products above: |fl(Av) - Av| <= n u |A| |v| elementwise, and the same for the sums
    n_mask = jnp.sum(mask).astype(dtype)
    margin = 2.0 * n_mask * jnp.finfo(dtype).eps * jnp.maximum(jnp.max(jnp.sum(jnp.abs(block), axis=1)), 0.0)
    bound = jnp.minimum(weyl, plain) + margin
    return jnp.where(jnp.any(mask), bound, 0.0).astype(dtype) + eps
