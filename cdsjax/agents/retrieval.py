"""Retrieval for the planning agent from a corpus (any registry selector), and the ready-made entry points.

:class:`SelectorRetriever` adapts a :class:`cdsjax.pipeline.Pipeline` to the agent's ``retrieve``;
:func:`make_retriever` builds one over arrays; :func:`run_planning` is what ``cdsjax ask --agent planning``
calls.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

from cdsjax.agents.agent import COMBINED_MODES, PlanningAgent
from cdsjax.agents.trace import PlanningResult
from cdsjax.io.reading.llm.config import ReaderConfig
from cdsjax.io.reading.reader import Reader
from cdsjax.io.reading.prompt import EvidenceItem


class SelectorRetriever:
    """``retrieve`` for :class:`PlanningAgent` over one corpus, with any registry selector.

    Separate mode: each query is encoded and selected alone (``budget`` notes each). Combined mode
    (``retrieve(queries, combined="single" | "peel")``): all queries are encoded into ``[m, d]`` and one
    selection is made with every query as a query vertex — for CDS selectors a constrained dominant set
    with m constraint vertices (``cdsjax.core.compat.cds_select``; ``"peel"`` uses ``cdsjax.core.compat.cds_peel``), for the
    baselines their multi-query relevance (largest cosine over the queries). The joint budget is
    ``joint_budget`` or ``budget * m``.

    Args:
      pipeline: a :class:`cdsjax.pipeline.Pipeline` (padded corpus, embedder, compiled selectors).
      selector: a registry selector name or display form; None for the default of ``cdsjax ask``
        (:data:`cdsjax.pipeline.catalog.DEFAULT_SELECTOR`).
      budget: notes per query.
      options: selector options (``beta``, ``tau``, ``lam``, ...).
      joint_budget: notes of a combined selection; None means ``budget * m``.

    Attributes:
      last_diagnostics: per selection of the last call, the solver diagnostics ({} for baselines).
    """

    def __init__(self, pipeline, *, selector: Optional[str] = None, budget: int = 5,
                 options: Optional[dict] = None, joint_budget: Optional[int] = None):
        from cdsjax.pipeline.catalog import DEFAULT_SELECTOR, resolve

        if budget < 1 or (joint_budget is not None and joint_budget < 1):
            raise ValueError(f"budget and joint_budget must be >= 1, got {budget} and {joint_budget}")
        self.pipeline = pipeline
        self.spec = resolve(selector or DEFAULT_SELECTOR)  # the name resolved once; its spec goes down
        self.selector = self.spec.name
        self.budget = int(budget)
        self.options = dict(options or {})
        self.joint_budget = joint_budget
        self.last_diagnostics: List[dict] = []

    def __call__(self, queries: Sequence[str], *, combined: Optional[str] = None) -> List[List[EvidenceItem]]:
        if combined not in COMBINED_MODES:
            raise ValueError(f"combined must be one of {COMBINED_MODES}, got {combined!r}")
        queries = list(queries)
        if not queries:
            return [] if combined is None else [[]]
        emb = self.pipeline.encode(queries)
        if combined is None:
            out, diags = [], []
            for q, e in zip(queries, emb):
                sel = self.pipeline.select(e, selector=self.spec, budget=self.budget, qid=q,
                                           options=self.options or None)
                out.append(self._items(sel))
                diags.append(self.pipeline.diagnostics(sel))
            self.last_diagnostics = diags
            return out
        options = dict(self.options)
        if combined == "peel":
            from cdsjax.core.registry import SPECS
            from cdsjax.pipeline.catalog import display

            if "peel" not in self.spec.options:
                able = ", ".join(display(s.name) for s in SPECS.values() if "peel" in s.options)
                raise ValueError(f"combined='peel' needs a CDS selector that peels ({able}), got {self.selector!r}")
            options["peel"] = True
        budget = self.joint_budget or self.budget * len(queries)
        sel = self.pipeline.select(emb, selector=self.spec, budget=budget, qid=" | ".join(queries),
                                   options=options or None)
        self.last_diagnostics = [self.pipeline.diagnostics(sel)]
        return [self._items(sel)]

    def _items(self, sel) -> List[EvidenceItem]:
        return self.pipeline.evidence_items(self.pipeline.evidence(sel))


def make_retriever(embeddings, links, notes: Sequence[Mapping[str, Any]], embedder, *, selector: Optional[str] = None,
                   budget: int = 5, options: Optional[dict] = None, joint_budget: Optional[int] = None,
                   compiled: Optional[dict] = None) -> SelectorRetriever:
    """A :class:`SelectorRetriever` over a corpus given as arrays.

    Args:
      embeddings: ``[n, d]`` float32 L2-normalised note embeddings.
      links: ``[n, n]`` bool note-link adjacency.
      notes: n note dicts with at least note_id, doc_id, page (and kind, text, summary, caption, bbox,
        image_path when known).
      embedder: anything with ``encode_queries(list[str]) -> [m, d]`` (an :class:`~cdsjax.io.embed.Embedder`).
      compiled: a dict shared by many retrievers to hold their jitted selectors, so corpora padded to
        the same size compile each selector once (the evaluation over many questions passes one).
    """
    import numpy as np

    from cdsjax.pipeline import Corpus, Pipeline

    embeddings = np.asarray(embeddings, np.float32)
    links = np.asarray(links, bool)
    n = len(notes)
    if embeddings.ndim != 2 or embeddings.shape[0] != n:
        raise ValueError(f"embeddings must be [n={n}, d], got {embeddings.shape}")
    if links.shape != (n, n):
        raise ValueError(f"links must be [{n}, {n}], got {links.shape}")
    corpus = Corpus(embeddings=embeddings, links=links, notes=[dict(x) for x in notes], embedder={}, roots=[])
    pipe = Pipeline(corpus, embedder=embedder, compiled=compiled)
    return SelectorRetriever(pipe, selector=selector, budget=budget, options=options, joint_budget=joint_budget)


def run_planning(pipeline, question: str, *, reader: Union[ReaderConfig, Reader, None],
                 selector: Optional[str] = None,
                 budget: int = 5, options: Optional[dict] = None, combined: Optional[str] = None,
                 joint_budget: Optional[int] = None, tau_max: int = 3, **agent_options) -> PlanningResult:
    """Runs the planning agent on a :class:`cdsjax.pipeline.Pipeline` (what ``cdsjax ask --agent
    planning`` calls).

    Args:
      pipeline: the corpus to search.
      question: the question.
      reader: the model for every role; required (planning needs a model).
      selector, budget, options: retrieval per sub-question (the paper: the subgraph readout, k = 5; here
        the default selector of ``cdsjax ask`` unless one is named).
      combined: None, "single" or "peel" (see :class:`PlanningAgent`).
      joint_budget: notes of a combined selection (default ``budget`` per sub-question).
      tau_max: most refinement rounds.
      **agent_options: further :class:`PlanningAgent` options.

    Raises:
      ValueError: no reader, or a bad option.
      ReaderError: the model server is unreachable, lacks the model, or refuses the key.
    """
    if reader is None:
        raise ValueError("the planning agent needs a reader model: pass --reader-url or set CDSJAX_READER_URL")
    retrieve = SelectorRetriever(pipeline, selector=selector, budget=budget, options=options,
                                 joint_budget=joint_budget)
    agent = PlanningAgent(reader, retrieve, combined=combined, tau_max=tau_max, **agent_options)
    return agent.run(question)
