"""cdsjax inside LangChain: a retriever over a cdsjax index, a document compressor, an embeddings adapter.

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from cdsjax.integrations.langchain import CDSCompressor, CDSEmbeddings, CDSRetriever

    retriever = CDSRetriever(index="runs/my-index", budget=5)            # the default selector, as `cdsjax ask`
    docs = retriever.invoke("What is this document about?")
    docs[0].metadata["note_id"], docs[0].metadata["page"], docs[0].metadata["diagnostics"]["converged"]

    # any first-stage retriever, then CDS keeps 5 of its documents
    compressor = CDSCompressor(embeddings=CDSEmbeddings(), budget=5)
    pipeline = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=first_stage)

Every returned :class:`Document` carries in its metadata ``note_id`` (for cdsjax notes, else the document's
``id``, else its position), ``score``, ``rank``, ``selector`` and ``diagnostics``; documents from a cdsjax
index also carry document, page (0-based), bbox, kind, image_path / crop and ``embedding``.

Bad input: an empty candidate list gives ``[]``; a budget larger than the candidates keeps them all, ranked
by the selector; documents without embeddings (``metadata["embedding"]``, or the ``state["embedded_doc"]`` of
LangChain's embedding filters) and no ``embeddings`` model raise a ``ValueError`` naming the fix.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from cdsjax.integrations._common import Chooser, Encoder, IndexSource, embedder_info, missing_extra
from cdsjax.defaults import DEFAULT_BUDGET
from cdsjax.pipeline.evidence import note_text

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables.config import run_in_executor
    from pydantic import ConfigDict, PrivateAttr
except ImportError as _err:  # pragma: no cover - exercised without the extra
    raise missing_extra("langchain", "langchain-core", _err) from None

__all__ = ["CDSCompressor", "CDSEmbeddings", "CDSRetriever"]


class CDSEmbeddings(Embeddings):
    """cdsjax's embedder as LangChain :class:`Embeddings` (offline: all-MiniLM-L6-v2 from its wheel).

    Args:
      index: optional index directory: encode exactly as its notes were embedded (model, prefixes).
      model: optional model name instead of the default (ignored with ``index``).

    Questions go through the same encoder as ``cdsjax ask`` (the model's ONNX export on onnxruntime for MiniLM), documents through
    sentence-transformers; vectors are L2-normalised float lists.
    """

    def __init__(self, index: Optional[str] = None, model: Optional[str] = None):
        self._encoder = Encoder(embedder_info(index, model))

    @property
    def info(self) -> dict:
        """The embedder description (model, prefixes, normalisation)."""
        return dict(self._encoder.info)

    def embed_documents(self, texts: List[str]) -> List[List[float]]:
        return self._encoder.documents(texts).tolist() if texts else []

    def embed_query(self, text: str) -> List[float]:
        return self._encoder.queries([text])[0].tolist()

    async def aembed_documents(self, texts: List[str]) -> List[List[float]]:
        return await run_in_executor(None, self.embed_documents, texts)

    async def aembed_query(self, text: str) -> List[float]:
        return await run_in_executor(None, self.embed_query, text)


def _document(note: dict, meta: dict, embedding: np.ndarray, with_embedding: bool) -> Document:
    meta = dict(meta)
    if with_embedding:
        meta["embedding"] = np.asarray(embedding, np.float32).tolist()
    return Document(page_content=note_text(note), metadata=meta, id=meta["note_id"])


class CDSRetriever(BaseRetriever):
    """A LangChain retriever over a cdsjax index: the evidence ``cdsjax ask`` would select.

    Args:
      index: an index directory or a PDF (indexed into the cache), a list of them, or a loaded
        :class:`cdsjax.pipeline.Pipeline`.
      selector: a cdsjax selector name (default: ``cds_learned_pages``, the default of ``cdsjax ask``).
      budget: documents returned per query.
      options: the selector's options (``beta``, ``tau``, ``lam``, ...).
      include_embeddings: put each note's embedding in ``metadata["embedding"]`` (a later
        :class:`CDSCompressor` then need not embed again).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: Any
    selector: Optional[str] = None
    budget: int = DEFAULT_BUDGET
    options: Dict[str, Any] = {}
    include_embeddings: bool = True
    _source: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        self._source = IndexSource(self.index, self.selector, self.budget, self.options)

    @property
    def pipeline(self):
        """The :class:`cdsjax.pipeline.Pipeline` behind the retriever."""
        return self._source.pipe

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> List[Document]:
        rows, _ = self._source.retrieve(query)
        return [_document(note, meta, emb, self.include_embeddings) for note, meta, emb in rows]

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> List[Document]:
        rows, _ = await run_in_executor(None, self._source.retrieve, query)
        return [_document(note, meta, emb, self.include_embeddings) for note, meta, emb in rows]


def stored_embedding(doc: Document) -> Optional[Sequence[float]]:
    """An embedding the document already carries: ``metadata["embedding"]`` or, after LangChain's embedding
    filters, ``state["embedded_doc"]``; None otherwise."""
    state = getattr(doc, "state", None)
    if isinstance(state, dict) and state.get("embedded_doc") is not None:
        return state["embedded_doc"]
    return doc.metadata.get("embedding")


class CDSCompressor(BaseDocumentCompressor):
    """Keeps the ``budget`` documents a cdsjax selector chooses: a drop-in for
    ``ContextualCompressionRetriever(base_compressor=...)`` next to ``EmbeddingsRedundantFilter`` and MMR.

    Args:
      embeddings: LangChain :class:`Embeddings` for the query, and for documents that carry no embedding.
      selector: a cdsjax selector name (default: ``cds_learned_pages``, the default of ``cdsjax ask``).
      budget: documents kept per query (a larger budget than documents keeps them all, ranked).
      options: the selector's options.

    The documents are embedded in one batch (or their stored embeddings reused), padded and selected in one
    jitted call. Returned documents are copies with ``note_id``, ``score``, ``rank``, ``selector`` and
    ``diagnostics`` added to their metadata, best first.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    embeddings: Optional[Embeddings] = None
    selector: Optional[str] = None
    budget: int = DEFAULT_BUDGET
    options: Dict[str, Any] = {}
    _chooser: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        self._chooser = Chooser(self.selector, self.budget, self.options)

    def _vectors(self, documents: Sequence[Document]) -> np.ndarray:
        stored = [stored_embedding(d) for d in documents]
        missing = [i for i, v in enumerate(stored) if v is None]
        if missing and self.embeddings is None:
            raise ValueError(f"CDSCompressor: {len(missing)} of {len(documents)} documents carry no embedding "
                             "(metadata['embedding']) and no embeddings model was given: pass embeddings=..., "
                             "e.g. CDSEmbeddings()")
        if missing:
            fresh = self.embeddings.embed_documents([documents[i].page_content for i in missing])
            for i, v in zip(missing, fresh):
                stored[i] = v
        return np.asarray(stored, np.float32)

    def _query_vector(self, query: str) -> np.ndarray:
        if self.embeddings is None:
            raise ValueError("CDSCompressor: no embeddings model to embed the query: pass embeddings=..., "
                             "e.g. CDSEmbeddings()")
        return np.asarray(self.embeddings.embed_query(query), np.float32)

    def _choose(self, documents: Sequence[Document], vectors: np.ndarray, query_vector: np.ndarray,
                query: str) -> List[Document]:
        chosen, diagnostics = self._chooser(vectors, query_vector, query, metadata=[d.metadata for d in documents],
                                            texts=[d.page_content for d in documents])
        out = []
        for rank, (i, score) in enumerate(chosen, 1):
            doc = documents[i]
            meta = dict(doc.metadata)
            meta.setdefault("note_id", str(doc.id) if doc.id is not None else str(i))
            meta.update(score=score, rank=rank, selector=self._chooser.name, diagnostics=dict(diagnostics))
            out.append(Document(page_content=doc.page_content, metadata=meta, id=doc.id))
        return out

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks=None) -> Sequence[Document]:
        """The ``budget`` documents the selector keeps, best first (``[]`` for no documents)."""
        if not documents:
            return []
        return self._choose(documents, self._vectors(documents), self._query_vector(query), query)

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks=None) -> Sequence[Document]:
        """As :meth:`compress_documents`; the embeddings model's async methods do the embedding."""
        if not documents:
            return []
        stored = [stored_embedding(d) for d in documents]
        missing = [i for i, v in enumerate(stored) if v is None]
        if self.embeddings is None:
            return self.compress_documents(documents, query, callbacks)  # raises the one-line error
        if missing:
            fresh = await self.embeddings.aembed_documents([documents[i].page_content for i in missing])
            for i, v in zip(missing, fresh):
                stored[i] = v
        query_vector = np.asarray(await self.embeddings.aembed_query(query), np.float32)
        vectors = np.asarray(stored, np.float32)
        return await run_in_executor(None, self._choose, documents, vectors, query_vector, query)
