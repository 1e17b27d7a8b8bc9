"""The layout helper's other work (:mod:`cdsjax.io.layout_split`): a document's YAKE keywords, computed by this
process and the helper at once, each claiming texts from its end, and half of the last document's note
embeddings (off unless :data:`SHARE_EMBEDDING`). Every result is the one this process would compute alone (the
embeddings within float tolerance: other batches)."""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from cdsjax.io.layout import _STATE
from cdsjax.io.layout_split import _acquire_helper, _drop_helper

HELPER_EMBED_SHARE = 0.5  # of a document's note text (the longest notes) the helper embeds
# whether the last document's notes are shared with the helper (embed_in_helper): off, because on the 2-core
# machine the helper's encoder load cost more CPU than its half of the encoding saved (RESULTS.md,
# "Ingestion: profile, floors and what changed")
SHARE_EMBEDDING = False


def offer_embedding(info: dict) -> None:
    """Lets the layout helper load the onnxruntime note encoder of ``info`` (the index's embedder) once it has no
    pages left, so that :func:`embed_in_helper` finds it ready."""
    _STATE["embedding"] = dict(info)


def embed_in_helper(texts: List[str], batch_size: int, compute) -> Optional[np.ndarray]:
    """Note embeddings of ``texts`` (``compute(texts)`` encodes here), half of them computed by the helper of
    :func:`~cdsjax.io.layout_split.layout_pages` with the same encoder while this process computes the other
    half: the same vectors within float tolerance (the batches differ). None (nothing computed) when no helper
    is running here or no encoder was offered (:func:`offer_embedding`); the caller then encodes them all itself."""
    offer = _STATE.get("embedding")
    if offer is None or len(texts) < 2 * batch_size:
        return None
    helper = _acquire_helper()
    if helper is None:
        return None
    # longest first; the helper takes the longest texts up to HELPER_EMBED_SHARE of all characters (in whole
    # batches), so each side pads its batches as one sorted run would. (When `ask` compiles its selector
    # meanwhile, this process runs that on a thread of its own: the cores stay busy after the helper is done.)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    total, cut, acc = sum(len(t) for t in texts), 0, 0
    while cut < len(order) - batch_size and acc + len(texts[order[cut]]) <= HELPER_EMBED_SHARE * total:
        acc += len(texts[order[cut]])
        cut += 1
    cut = max(batch_size, min(len(order) - 1, batch_size * round(cut / batch_size)))  # whole batches there
    theirs, mine = order[:cut], order[cut:]
    try:
        try:
            helper.request(("embed", [texts[i] for i in theirs], int(batch_size), offer))
        except Exception:
            _drop_helper()
            return None
        head = np.asarray(compute([texts[i] for i in mine]), np.float32)
        rest = helper.receive()
    finally:
        helper.lock.release()
    if rest is None or len(rest) != len(theirs):  # the helper failed or died: this process does the rest
        _drop_helper()
        rest = compute([texts[i] for i in theirs])
    rest = np.asarray(rest, np.float32)
    out = np.zeros((len(texts), head.shape[1]), np.float32)
    out[mine], out[theirs] = head, rest
    return out


def keywords_in_helper(texts: List[str], top: int, language: str, compute) -> Optional[List[List[str]]]:
    """YAKE keywords of ``texts`` (``compute(text)`` for one), computed by this process and the helper of
    :func:`~cdsjax.io.layout_split.layout_pages` at once: each claims texts
    (:class:`~cdsjax.io.layout_split._Claims`), this process from the front and the helper from the back, until
    they meet, so neither waits for the other however long the texts or whoever
    starts later. The same keywords as computed here alone. None (nothing computed) when no helper is running
    here (documents too short to split, worker processes, one core); the caller then computes them all itself."""
    if len(texts) < 2:
        return None
    helper = _acquire_helper()  # (None also while the helper is busy with a request no one waits for)
    if helper is None:
        return None
    out: List[Optional[List[str]]] = [None] * len(texts)
    try:
        try:
            helper.claims.reset(len(texts))
            helper.request(("keywords", list(texts), int(top), language))
        except Exception:
            _drop_helper()
            return None
        while True:
            claimed = helper.claims.take_front(1)
            if claimed is None:
                break
            for i in claimed:
                out[i] = compute(texts[i])
        rest = helper.receive()
    finally:
        helper.lock.release()
    if isinstance(rest, dict):  # the texts the helper claimed (none of this process's: the claims are disjoint)
        for i, keywords in rest.items():
            out[i] = keywords
    else:  # the helper failed or died
        _drop_helper()
    return [compute(t) if k is None else k for t, k in zip(texts, out)]  # what the helper did not return
