r"""Structured subgraph readout (G²-Reader §3.2.3) as a selector.

Notes are ranked by cosine relevance to the query. Walking down that ranking,
each note joins the output together with its immediate neighbours in the note
link graph, until the output holds ``budget`` notes:

.. math:: V_{out} \leftarrow V_{out} \cup \{v\} \cup \mathcal{N}(v)
   \quad\text{for } v \text{ in ranked order, while } |V_{out}| < k.

A note already in the output (pulled in as someone's neighbour) still expands
its own neighbours when its turn in the ranking comes. The paper stops once
:math:`|V_{out}| \ge k`, which can overshoot; a :class:`Selection` has exactly
``budget`` slots, so the expansion that crosses the budget is cut: within one
expansion the seed comes first, then its new neighbours by decreasing
relevance (ties to the lowest index), and the output keeps the first
``budget`` notes in that order.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from cdsjax.core.baselines import relevance
from cdsjax.core.types import Selection
from cdsjax.core.validation import check_budget


def select_subgraph_readout(links: Array, notes: Array, query: Array, valid: Array, *, budget: int,
                            query_scores=None) -> Selection:
    r"""Greedy cosine ranking expanded by link neighbours, cut at ``budget`` notes.

    Args:
      links: ``[n, n]`` bool note-link adjacency (direction and the diagonal are
        ignored; rows and columns of padded notes are ignored).
      notes: ``[n, d]`` float, L2-normalised note embeddings, trailing padding.
      query: ``[d]`` or ``[m, d]`` float, L2-normalised query embedding(s); with
        several rows a note's relevance is its largest cosine over them.
      valid: ``[n]`` bool, True on real notes.
      budget: static number of notes to return (fewer, masked, when fewer notes
        are valid).

    Returns:
      :class:`Selection` in output order (seeds and their neighbours
      interleaved as they joined), ``scores`` the cosine relevances.

    Cost: one ``argsort`` plus one ``O(n)`` step per seed; at most ``n`` seeds.
    """
    budget = check_budget(budget)
    rel = relevance(notes, query, valid, query_scores)
    valid = jnp.asarray(valid, bool)
    n = valid.shape[0]
    links = jnp.asarray(links)
    if links.shape != (n, n):
        raise ValueError(f"links must have shape ({n}, {n}), got {links.shape}")
    links = links.astype(bool)
    adj = (links | links.T) & valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)

    # Ranked order: valid notes by decreasing relevance, ties to the lowest index
    # (stable sort), padding last.
    order = jnp.argsort(jnp.where(valid, -rel, jnp.inf), stable=True)
    n_valid = jnp.sum(valid)
    never = jnp.iinfo(jnp.int32).max  # position of a note that has not joined

    def cond(state):
        t, count, _ = state
        return (t < n_valid) & (count < budget)

    def body(state):
        t, count, position = state
        seed = order[t]
        joined = position < never
        seed_new = ~joined[seed]
        position = position.at[seed].set(jnp.where(seed_new, count, position[seed]))
        count = count + seed_new.astype(count.dtype)
        # New neighbours join in ranked order: a cumulative count along `order`.
        fresh = adj[seed] & ~joined & (jnp.arange(n) != seed)
        fresh_ranked = fresh[order]
        offset = jnp.cumsum(fresh_ranked) - 1
        place = jnp.where(fresh_ranked, count + offset, never).astype(jnp.int32)
        position = position.at[order].min(place)
        count = count + jnp.sum(fresh_ranked).astype(count.dtype)
        return t + 1, count, position

    init = (jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32), jnp.full((n,), never, jnp.int32))
    _, count, position = lax.while_loop(cond, body, init)

    slots = jnp.arange(budget)
    indices = jnp.zeros((budget,), jnp.int32).at[position].set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    selected_valid = slots < jnp.minimum(count, budget)
    indices = jnp.where(selected_valid, indices, 0)
    scores = jnp.where(selected_valid, rel[indices], 0.0)
    return Selection(indices=indices, selected_valid=selected_valid, scores=scores)
