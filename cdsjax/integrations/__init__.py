"""cdsjax as a drop-in for the RAG frameworks people already run.

- :mod:`cdsjax.integrations.langchain` (``pip install 'cdsjax[langchain]'``): ``CDSRetriever`` over a cdsjax
  index, ``CDSCompressor`` (a ``BaseDocumentCompressor`` for ``ContextualCompressionRetriever``) and
  ``CDSEmbeddings``.
- :mod:`cdsjax.integrations.llama_index` (``pip install 'cdsjax[llamaindex]'``): ``CDSRetriever``,
  ``CDSPostprocessor`` (a ``BaseNodePostprocessor`` for ``as_query_engine(node_postprocessors=[...])``) and
  ``CDSEmbedding``.

The adapters build the cdsjax problem and call a selector of :mod:`cdsjax.core.registry` (one jitted call per
query); they hold no selection logic of their own. Import the submodule you need: this package imports neither
framework.
"""
