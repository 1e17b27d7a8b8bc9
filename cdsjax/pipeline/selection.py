"""From candidates and a selector name to a selection: the one path every caller above the core takes.

The pipeline (``cdsjax ask``, the server), the LangChain and LlamaIndex adapters and the evaluation run a
registry selector the same way:

* :func:`structure_codes` turns each note's document, page and kind into the ``[n]`` int32 structure
  arrays of a :class:`~cdsjax.core.CDSProblem` (the one coding: documents by first appearance, unknown pages
  and kinds -1, kinds as :func:`cdsjax.core.games.learned.kind_codes` names them), and :func:`described_notes` the
  position of the visual each caption note describes (``describes``, -1 for none);
* :class:`Candidates` pads embeddings, links and structure once to a bucket size
  (:func:`cdsjax.core.batching.bucket_size`, at least ``budget`` rows) and builds the problem a selector's
  :class:`~cdsjax.core.SelectorSpec` asks for (structure only for a selector that reads it), so the same
  candidates in the same order give the same problem, hence the same evidence, everywhere;
* :func:`resolve_options` gives a learned selector its parameter *value* (a file read by
  :mod:`cdsjax.learn`, the shipped fit by default), :func:`resolve_selector` builds the selector with it
  (:func:`cdsjax.core.make_selector`), and :func:`selector_key` names a compiled selector by that value's
  content hash, never by a path;
* :class:`CorpusArrays` keeps what a selector's game computes once per corpus (the spectral bound, the note
  block) and gives every question its share, for the pipeline, the integrations and the evaluation alike.

A selector is named by its registry name, the display form users write, or its spec, resolved by
:func:`cdsjax.pipeline.catalog.selector_spec` (a spec given is not looked up again).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Sequence, Union

import numpy as np

from cdsjax.core import registry
from cdsjax.core.batching import bucket_size
from cdsjax.core.games.learned import kind_codes
from cdsjax.core.types import CDSProblem, as_selector, with_corpus_arrays
from cdsjax.pipeline import catalog

STRUCTURE_ARRAYS = ("pages", "doc_ids", "kinds", "describes")


def described_notes(notes: Sequence[dict]) -> np.ndarray:
    """``[n]`` int32: for each note, the position among ``notes`` of the note it describes, -1 for none.

    A note describes the one whose ``note_id`` its ``describes`` field names: a caption (or a Note/Source line)
    its figure, table or chart, as :func:`cdsjax.io.index.load_index` records it on an index's notes
    (:func:`cdsjax.io.notes.described_notes`) and :func:`cdsjax.pipeline.evidence.note_metadata` passes on. A
    note without it, or naming a note that is not among ``notes``, describes nothing.
    """
    position = {str(n.get("note_id")): i for i, n in enumerate(notes) if n.get("note_id") is not None}
    return np.asarray([position.get(str(n["describes"]), -1) if n.get("describes") else -1 for n in notes],
                      np.int32).reshape(len(notes))


def structure_codes(doc_ids: Sequence[Any], pages: Optional[Sequence[Any]] = None,
                    kinds: Optional[Sequence[Any]] = None,
                    describes: Optional[Sequence[int]] = None) -> Dict[str, np.ndarray]:
    """``pages``, ``doc_ids``, ``kinds`` and ``describes`` ``[n]`` int32 of n notes.

    Args:
      doc_ids: each note's document (any hashable; coded by first appearance).
      pages: each note's 0-based page (None entries, or None for all: -1, unknown).
      kinds: each note's kind name (``text``, ``figure``, ...; None or unknown: -1) or its code.
      describes: the position of the note each note describes (:func:`described_notes`; None: -1 for all).
    """
    n = len(doc_ids)
    order = {d: i for i, d in enumerate(dict.fromkeys(str(d) for d in doc_ids))}
    out = {"doc_ids": np.asarray([order[str(d)] for d in doc_ids], np.int32).reshape(n)}
    out["pages"] = np.asarray([-1 if p is None else int(p) for p in (pages if pages is not None else [None] * n)],
                              np.int32).reshape(n)
    kinds = list(kinds) if kinds is not None else [None] * n
    if kinds and all(isinstance(k, (int, np.integer)) for k in kinds):
        out["kinds"] = np.asarray(kinds, np.int32).reshape(n)
    else:
        out["kinds"] = np.asarray(kind_codes(kinds), np.int32).reshape(n)
    out["describes"] = np.asarray([-1] * n if describes is None else describes, np.int32).reshape(n)
    if out["describes"].size and (out["describes"].min() < -1 or out["describes"].max() >= n):
        raise ValueError(f"describes must hold note positions in [0, {n}) or -1")
    return out


def note_structure(notes: Sequence[dict]) -> Dict[str, np.ndarray]:
    """:func:`structure_codes` of note dicts: an index's notes (``doc_id``) or the metadata the integrations
    return (``document``), with their ``page``, ``kind`` and ``describes`` (:func:`described_notes`)."""
    docs = [n.get("doc_id", n.get("document")) for n in notes]
    return structure_codes(docs, [n.get("page") for n in notes], [n.get("kind") for n in notes],
                           described_notes(notes))


@dataclasses.dataclass
class Candidates:
    """Candidate notes padded once to a bucket size, ready to become one :class:`CDSProblem` per question.

    Attributes:
      notes: ``[size, d]`` float32 embeddings (zero rows as padding).
      valid: ``[size]`` bool, True on the real notes.
      links: ``[size, size]`` bool note links (None when the candidates have none).
      structure: ``pages`` / ``doc_ids`` / ``kinds`` / ``describes`` ``[size]`` int32 (padding -1), or None.
      count: the number of real notes.
    """

    notes: np.ndarray
    valid: np.ndarray
    links: Optional[np.ndarray]
    structure: Optional[Dict[str, np.ndarray]]
    count: int
    _device: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def pad(cls, embeddings, *, links=None, structure: Optional[Dict[str, np.ndarray]] = None,
            min_size: int = 1) -> "Candidates":
        """Pads ``embeddings`` ``[n, d]`` (and ``links`` ``[n, n]``, ``structure`` arrays ``[n]``) to
        ``bucket_size(max(n, min_size))`` rows; give ``min_size=budget`` so a budget above ``n`` still fits."""
        emb = np.asarray(embeddings, np.float32)
        n = emb.shape[0]
        size = bucket_size(max(n, int(min_size)))
        notes = np.zeros((size, emb.shape[1]), np.float32)
        notes[:n] = emb
        padded_links = None
        if links is not None:
            padded_links = np.zeros((size, size), bool)
            padded_links[:n, :n] = np.asarray(links, bool)
        padded = None
        if structure is not None:
            padded = {}
            for k in STRUCTURE_ARRAYS:
                a = np.full(size, -1, np.int32)
                a[:n] = np.asarray(structure[k], np.int32)
                padded[k] = a
        return cls(notes=notes, valid=np.arange(size) < n, links=padded_links, structure=padded, count=n)

    @property
    def size(self) -> int:
        """The padded number of rows."""
        return self.notes.shape[0]

    def _on_device(self, name: str):
        import jax.numpy as jnp

        if name not in self._device:
            value = getattr(self, name) if name in ("notes", "valid", "links") else self.structure[name]
            self._device[name] = None if value is None else jnp.asarray(value)
        return self._device[name]

    def problem(self, query, spec: registry.SelectorSpec, query_scores=None) -> CDSProblem:
        """The problem of one question (``query`` ``[d]`` or ``[m, d]``) for the selector ``spec``: links when the
        candidates have them, the structure arrays only when ``spec.structure`` (``ValueError`` when it needs
        them and they are missing); ``query_scores`` (``[count]`` or ``[m, count]``, the real notes' relevance
        where it is not the cosine, :mod:`cdsjax.io.relevance`) padded with zeros."""
        import jax.numpy as jnp

        structure = {}
        if spec.structure:
            if self.structure is None:
                raise ValueError(f"selector {catalog.display(spec.name)!r} reads the notes' documents, pages and "
                                 "kinds, which these candidates do not carry")
            structure = {k: self._on_device(k) for k in STRUCTURE_ARRAYS}
        queries = jnp.asarray(query)
        queries = queries if queries.ndim == 2 else queries[None, :]
        scores = None
        if query_scores is not None:
            rows = np.asarray(query_scores, np.float32).reshape(-1, self.count)
            scores = np.zeros((rows.shape[0], self.size), np.float32)
            scores[:, :self.count] = rows
            scores = jnp.asarray(scores)
        return CDSProblem(notes=self._on_device("notes"), queries=queries, valid=self._on_device("valid"),
                          links=self._on_device("links"), query_scores=scores, **structure)


def resolve_options(name: Union[str, registry.SelectorSpec], options: Optional[dict] = None, params=None) -> dict:
    """``options`` of the selector ``name`` (a name or its spec) with a learned selector's ``params`` resolved to
    a value.

    ``params`` (a file path, a :class:`~cdsjax.core.games.learned.LearnedParams` or None: the shipped fit of the
    selector's read-out, ``SelectorSpec.readout``) applies unless ``options`` names its own; files are read by
    :func:`cdsjax.learn.resolve_params` (one line on a bad file).
    """
    options = dict(options or {})
    spec = catalog.selector_spec(name)
    if spec.learned:
        from cdsjax.learn.params_io import resolve_params

        options["params"] = resolve_params(options.get("params", params), readout=spec.readout)
    return options


def _key_part(value):
    """An option value as part of a key: a value that names its own content (a learned game's parameters:
    ``content_key()``, their values) by that name, any other value as it is."""
    content_key = getattr(value, "content_key", None)
    return content_key() if callable(content_key) else value


def selector_key(name: Union[str, registry.SelectorSpec], budget: int, options: Optional[dict] = None) -> tuple:
    """A hashable name of a compiled selector (``name``: a selector's name or its spec): registry name, budget
    and options, a parameter value by its content (``LearnedParams.content_key``)."""
    items = [(k, _key_part(v)) for k, v in sorted(dict(options or {}).items())]
    return catalog.selector_spec(name).name, int(budget), tuple(items)


def resolve_selector(name: Union[str, registry.SelectorSpec], budget: int, options: Optional[dict] = None,
                     params=None):
    """``(spec, fn)``: the registry spec of ``name`` (a name or the spec itself) and its selector
    (:meth:`SelectorSpec.make <cdsjax.core.SelectorSpec.make>`, what :func:`cdsjax.core.make_selector` runs) with
    ``options`` completed by :func:`resolve_options`."""
    spec = catalog.selector_spec(name)
    return spec, spec.make(budget, **resolve_options(spec, options, params))


def corpus_arrays(bound_fn, block_fn, problem: CDSProblem) -> tuple:
    """``(bound, block)``: a selector's corpus bound and note block on ``problem``'s corpus (``bound_fn`` and
    ``block_fn``: its ``corpus_bound`` and ``corpus_block``); the block is None where there is no bound or no
    ``block_fn``."""
    bound = bound_fn(problem)
    return bound, (None if bound is None or block_fn is None else block_fn(problem))


def corpus_key(problem: CDSProblem) -> str:
    """A content hash of one problem's corpus arrays (notes, valid, links, structure, pinned; not the query)."""
    h = hashlib.blake2b(digest_size=16)
    for a in (problem.notes, problem.valid, problem.links, problem.pages, problem.doc_ids, problem.kinds,
              problem.pinned):
        if a is None:
            h.update(b"-")
            continue
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


# Note blocks kept by a CorpusArrays (bytes), and bounds (scalars: how many corpora).
DEFAULT_CORPUS_BYTES = 2 << 30
MAX_CORPUS_BOUNDS = 1 << 16


class CorpusArrays:
    """What a selector's game computes once per corpus, its spectral bound and note block, kept for the
    questions that follow: the one cache the pipeline (``cdsjax ask``, the server), the integrations and the
    evaluation give their problems ``bound`` and ``note_block`` from, so a question is solved by the same
    solver on the same payoff whoever asks it (:func:`cdsjax.core.strategies.corpus.solve_on_block`).

    An entry is keyed by ``key`` (the caller's name for the game and corpus, e.g. a pipeline's selector and
    options on its one corpus; default: the selector itself and :func:`corpus_key` of the problem) and the
    number of query rows. ``wrap(function, role)`` (None: the functions as they are) compiles a selector's
    ``corpus_bound`` / ``corpus_block`` once per selector (role ``"bound"`` / ``"block"``). Bounds are kept;
    note blocks (``[n, n]``) up to ``max_bytes``, the least recently used dropped first (and built again,
    without a new eigendecomposition, when their corpus comes back); bounds of up to :data:`MAX_CORPUS_BOUNDS`
    corpora. The caller owns it; thread-safe.
    """

    def __init__(self, *, wrap: Optional[Callable[[Callable, str], Callable]] = None,
                 max_bytes: int = DEFAULT_CORPUS_BYTES):
        self.wrap = wrap
        self.max_bytes = int(max_bytes)
        # selector -> (bound, block) functions, wrapped; held no longer than the selector (a pipeline's capped
        # SelectorCache drops a selector, and its compiled programs go with it)
        self._functions: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        self._bounds: "OrderedDict[Any, Any]" = OrderedDict()
        self._blocks: "OrderedDict[Any, Any]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        """How many (game, corpus) entries hold a bound."""
        return len(self._bounds)

    def functions(self, selector) -> tuple:
        """``(bound, block)``: ``selector``'s ``corpus_bound`` and ``corpus_block``, wrapped once (None for a
        selector without them)."""
        with self._lock:
            if selector not in self._functions:
                sel = as_selector(selector)
                wrap = self.wrap or (lambda f, role: f)
                self._functions[selector] = tuple(None if f is None else wrap(f, role) for f, role in
                                                  ((sel.corpus_bound, "bound"), (sel.corpus_block, "block")))
            return self._functions[selector]

    def arrays(self, selector, problem: CDSProblem, key: Any = None) -> tuple:
        """``(bound, block)`` of ``selector``'s game on ``problem``'s corpus, computed on first use and kept
        (``(None, None)`` for a selector without a corpus bound, or a game whose penalty reads the question)."""
        bound_fn, block_fn = self.functions(selector)
        if bound_fn is None:
            return None, None
        key = ((selector, corpus_key(problem)) if key is None else key, problem.queries.shape[-2])
        with self._lock:
            if key not in self._bounds:
                self._bounds[key] = bound_fn(problem)
                if len(self._bounds) > MAX_CORPUS_BOUNDS:
                    self._bounds.popitem(last=False)
            self._bounds.move_to_end(key)
            bound = self._bounds[key]
            if bound is None or block_fn is None:
                return bound, None
            if key not in self._blocks:
                block = block_fn(problem)
                self._blocks[key] = block
                self._bytes += 0 if block is None else int(np.prod(block.shape)) * block.dtype.itemsize
                while self._bytes > self.max_bytes and len(self._blocks) > 1:
                    _, old = self._blocks.popitem(last=False)
                    self._bytes -= 0 if old is None else int(np.prod(old.shape)) * old.dtype.itemsize
            self._blocks.move_to_end(key)
            return bound, self._blocks[key]

    def attach(self, selector, problem: CDSProblem, key: Any = None) -> CDSProblem:
        """``problem`` carrying ``selector``'s bound and note block on its corpus (:meth:`arrays`); unchanged
        where there is no bound."""
        bound, block = self.arrays(selector, problem, key)
        return with_corpus_arrays(problem, bound, block)

    def attach_rows(self, selector, batch: CDSProblem) -> CDSProblem:
        """``batch`` (a problem with a leading axis, one question per row) with each row's bound and note block
        (:meth:`attach`; rows on one corpus share them, found by content); unchanged where there is none."""
        import jax

        if self.functions(selector)[0] is None:
            return batch
        rows = [jax.tree_util.tree_map(lambda a, i=i: a[i], batch) for i in range(batch.notes.shape[0])]
        found = [self.arrays(selector, row) for row in rows]
        if all(bound is None for bound, _ in found):
            return batch
        bounds = np.stack([np.asarray(bound) for bound, _ in found])
        blocks = None if any(block is None for _, block in found) else np.stack([np.asarray(b) for _, b in found])
        return with_corpus_arrays(batch, bounds, blocks)

    @staticmethod
    def _names(key, selector) -> bool:
        """Whether ``key`` is a default key of ``selector``'s."""
        return isinstance(key[0], tuple) and len(key[0]) == 2 and key[0][0] is selector

    def drop(self, selector) -> list:
        """Forgets ``selector``'s arrays and functions; returns the wrapped functions dropped."""
        with self._lock:
            for key in [k for k in self._bounds if self._names(k, selector)]:
                del self._bounds[key]
            for key in [k for k in self._blocks if self._names(k, selector)]:
                old = self._blocks.pop(key)
                self._bytes -= 0 if old is None else int(np.prod(old.shape)) * old.dtype.itemsize
            return [f for f in self._functions.pop(selector, ()) if f is not None]

    def clear(self) -> None:
        """Forgets everything."""
        with self._lock:
            self._functions.clear()
            self._bounds.clear()
            self._blocks.clear()
            self._bytes = 0
