"""cdsjax inside LlamaIndex: a retriever over a cdsjax index, a node postprocessor, an embedding adapter.

    from llama_index.core.query_engine import RetrieverQueryEngine
    from cdsjax.integrations.llama_index import CDSEmbedding, CDSPostprocessor, CDSRetriever

    retriever = CDSRetriever(index="runs/my-index", budget=5)      # the default selector, as `cdsjax ask`
    nodes = retriever.retrieve("What is this document about?")
    nodes[0].node.metadata["note_id"], nodes[0].score

    # after any retriever: CDS keeps 5 of the retrieved nodes
    engine = vector_index.as_query_engine(similarity_top_k=40,
                                          node_postprocessors=[CDSPostprocessor(embed_model=CDSEmbedding(), budget=5)])

Every returned :class:`NodeWithScore` carries in its node's metadata ``note_id`` (for cdsjax notes, else the
node's id), ``rank``, ``selector`` and ``diagnostics``; its ``score`` is the selector's. Nodes from a cdsjax
index also carry document, page (0-based), bbox, kind, image_path / crop, and their embedding in
``node.embedding``. The bulky keys are excluded from what the LLM and the embedder read.

Bad input: no nodes give ``[]``; a budget larger than the nodes keeps them all, ranked by the selector; nodes
without embeddings and no ``embed_model`` (or a query without an embedding and no ``embed_model``) raise a
``ValueError`` naming the fix.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from cdsjax.integrations import _common as common
from cdsjax.integrations._common import HIDDEN_KEYS, Chooser, IndexSource, missing_extra
from cdsjax.defaults import DEFAULT_BUDGET
from cdsjax.pipeline.evidence import note_text

__all__ = ["CDSEmbedding", "CDSPostprocessor", "CDSRetriever"]

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as _err:  # pragma: no cover - exercised without the extra
    raise missing_extra("llamaindex", "llama-index-core", _err) from None


class CDSEmbedding(BaseEmbedding):
    """A LlamaIndex :class:`BaseEmbedding` that encodes as cdsjax does: questions as ``cdsjax ask`` encodes them,
    texts through sentence-transformers (offline: all-MiniLM-L6-v2 from its wheel). ``index`` (a directory) makes
    it encode exactly as that index's notes were embedded; ``model`` names another model (ignored with
    ``index``)."""

    _encoder: Any = PrivateAttr(default=None)

    def __init__(self, index: Optional[str] = None, model: Optional[str] = None, **kwargs: Any):
        info = common.embedder_info(index, model)
        super().__init__(model_name=str(info.get("model")), **kwargs)
        self._encoder = common.Encoder(info)

    @classmethod
    def class_name(cls) -> str:
        return "CDSEmbedding"

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._encoder.queries([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> List[float]:
        import asyncio

        return await asyncio.to_thread(self._get_query_embedding, query)

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._encoder.documents([text])[0].tolist()

    def _get_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return self._encoder.documents(texts).tolist() if texts else []


def note_node(note: dict, meta: dict, embedding: Optional[np.ndarray], score: Optional[float]) -> NodeWithScore:
    """A cdsjax note as a scored LlamaIndex node (its id is the note id)."""
    hidden = [k for k in HIDDEN_KEYS if k in meta]
    node = TextNode(id_=meta["note_id"], text=note_text(note), metadata=dict(meta),
                    embedding=None if embedding is None else np.asarray(embedding, np.float32).tolist(),
                    excluded_llm_metadata_keys=hidden, excluded_embed_metadata_keys=hidden)
    return NodeWithScore(node=node, score=score)


class CDSRetriever(BaseRetriever):
    """A LlamaIndex retriever over a cdsjax index (a directory or a PDF, several, or a loaded
    :class:`cdsjax.pipeline.Pipeline`): the ``budget`` nodes ``cdsjax ask`` would select with ``selector`` (None:
    the default of ``cdsjax ask``, ``cds_learned_pages``) and its ``options`` (``beta``, ``tau``, ``lam``, ...)."""

    def __init__(self, index, selector: Optional[str] = None, budget: int = DEFAULT_BUDGET, options: Optional[dict] = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self._source = IndexSource(index, selector, budget, options)

    @property
    def pipeline(self):
        """The :class:`cdsjax.pipeline.Pipeline` behind the retriever."""
        return self._source.pipe

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        rows, _ = self._source.retrieve(query_bundle.query_str)
        return [note_node(note, meta, emb, meta["score"]) for note, meta, emb in rows]

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        import asyncio

        return await asyncio.to_thread(self._retrieve, query_bundle)


class CDSPostprocessor(BaseNodePostprocessor):
    """Keeps the ``budget`` nodes a cdsjax selector chooses, usable in
    ``as_query_engine(node_postprocessors=[...])``.

    Args:
      embed_model: a LlamaIndex embedding model for nodes without ``node.embedding`` and for a query that
        comes without an embedding (the query bundle's own embedding is used when it has one).
      selector: a cdsjax selector name (default: ``cds_learned_pages``, the default of ``cdsjax ask``).
      budget: nodes kept per query (a larger budget than nodes keeps them all, ranked).
      options: the selector's options.
    """

    embed_model: Optional[BaseEmbedding] = Field(default=None)
    selector: Optional[str] = Field(default=None)
    budget: int = Field(default=DEFAULT_BUDGET)
    options: Dict[str, Any] = Field(default_factory=dict)
    _chooser: Any = PrivateAttr(default=None)

    def __init__(self, **data: Any):
        super().__init__(**data)
        self._chooser = Chooser(self.selector, self.budget, self.options)

    @classmethod
    def class_name(cls) -> str:
        return "CDSPostprocessor"

    def _vectors(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle]):
        if query_bundle is None:
            raise ValueError("CDSPostprocessor needs the query (query_bundle or query_str)")
        missing = [i for i, n in enumerate(nodes) if n.node.embedding is None]
        if (missing or query_bundle.embedding is None) and self.embed_model is None:
            what = f"{len(missing)} of {len(nodes)} nodes carry no embedding" if missing else \
                "the query carries no embedding"
            raise ValueError(f"CDSPostprocessor: {what} and no embed_model was given: pass embed_model=..., "
                             "e.g. CDSEmbedding()")
        vectors = [n.node.embedding for n in nodes]
        if missing:
            texts = [nodes[i].node.get_content(metadata_mode="embed") for i in missing]
            for i, v in zip(missing, self.embed_model.get_text_embedding_batch(texts)):
                vectors[i] = v
        query = query_bundle.embedding
        if query is None:
            query = self.embed_model.get_agg_embedding_from_queries(query_bundle.embedding_strs)
        return np.asarray(vectors, np.float32), np.asarray(query, np.float32)

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        if not nodes:
            return []
        vectors, query = self._vectors(nodes, query_bundle)
        chosen, diagnostics = self._chooser(vectors, query, query_bundle.query_str,
                                             metadata=[n.node.metadata for n in nodes],
                                             texts=[n.node.get_content() for n in nodes])
        out = []
        for rank, (i, score) in enumerate(chosen, 1):
            node = nodes[i].node.model_copy()
            node.metadata = dict(node.metadata)
            node.metadata.setdefault("note_id", node.node_id)
            node.metadata.update(rank=rank, selector=self._chooser.name, diagnostics=dict(diagnostics))
            hidden = ("rank", "selector", "diagnostics", "note_id")
            node.excluded_llm_metadata_keys = list(dict.fromkeys([*node.excluded_llm_metadata_keys, *hidden]))
            node.excluded_embed_metadata_keys = list(dict.fromkeys([*node.excluded_embed_metadata_keys, *hidden]))
            out.append(NodeWithScore(node=node, score=score))
        return out
