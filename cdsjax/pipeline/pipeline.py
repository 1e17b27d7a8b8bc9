"""Retrieve-then-read over one corpus: index -> question embedding -> padded arrays -> selector -> reader.

    from cdsjax.pipeline import Pipeline
    pipe = Pipeline.from_paths(["report.pdf"])            # indexes into the cache if needed
    answer = pipe.ask("What drove the 2023 increase?")    # learned CDS read per page (the default)
    answer.evidence[0]["page"], answer.diagnostics["converged"], answer.warnings

The default selector is :data:`cdsjax.pipeline.catalog.DEFAULT_SELECTOR`, learned CDS read per page
(``"cds_learned_pages"``: the fitted game's equilibrium, found by the active-set solver, its ranking read one note
per printed page per round; ``"cds_learned"`` reads its top-B); ``"cds_converged"`` is the paper's game at
equilibrium and ``"cds"`` the paper's replicator dynamics with its step cap, which often stops far from
equilibrium on real indexes. A selector may be named by its registry name or the display form users write
(``cds-paper``); an answer shows the display form. A question's selector name is resolved once, into a
:class:`~cdsjax.pipeline.compiled.Choice` that everything below takes. Candidates become a problem through
:mod:`cdsjax.pipeline.selection`, the path the integrations and the evaluation take too.

With a reader (``reader=ReaderConfig(base_url=..., model=...)``) the answer text
comes from the VLM; without one, ``answer.answer`` is None and the selected
evidence is the result (the embedded default).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import jax
import numpy as np

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id
from cdsjax.core.registry import SelectorSpec
from cdsjax.core.validation import validate_embeddings
from cdsjax.io.reading.options import ReadOptions
from cdsjax.io.compilation_cache import CompileCache
from cdsjax.defaults import DEFAULT_LEXICAL_WEIGHT, DEFAULT_NOTE_CONTEXT, DEFAULT_RELEVANCE
from cdsjax.io.relevance import Relevance, check_relevance, lexical_text
from cdsjax.io.relevance import settings_of as relevance_of
from cdsjax.learn.params_io import resolve_params
from cdsjax.pipeline import catalog
from cdsjax.pipeline.answer import Answer, convergence_warning, mark_read, read_answer, scanned_warning
from cdsjax.pipeline.cache import DEFAULT_MAX_COMPILED, SelectorCache, shared_selector_cache
from cdsjax.pipeline.catalog import DEFAULT_SELECTOR
from cdsjax.pipeline.compiled import Choice, bind, compile_selector
from cdsjax.pipeline.corpus import Corpus, checked_embedder
from cdsjax.defaults import DEFAULT_BUDGET
from cdsjax.pipeline.errors import PipelineError
from cdsjax.pipeline.evidence import evidence_item
from cdsjax.pipeline.selection import Candidates, CorpusArrays, note_structure

# A selector as the methods below take it: a registry name or display form (looked up once, by the method), or
# its spec (not looked up again).
SelectorName = Union[str, SelectorSpec]


class Pipeline:
    """Retrieval (and optionally reading) over one merged corpus.

    The corpus is padded once to a bucket size, so every question of a session
    reuses one compiled selector per (selector, budget, options). ``compiled`` is where those jitted
    selectors are kept: by default the process's shared :class:`SelectorCache` of ``max_compiled`` entries
    (:func:`shared_selector_cache`), or a mapping of the caller's. ``compile_cache`` (what the command's
    :func:`~cdsjax.io.compilation_cache.enable_compilation_cache` returned; None: plain ``jax.jit``) keeps the
    selectors' traced programs for later processes (:class:`~cdsjax.io.compilation_cache.ExportedJit`); a
    selector already in ``compiled`` keeps the cache it was made with.
    """

    def __init__(self, corpus: Corpus, *, embedder=None, reader=None, compiled: Optional[dict] = None,
                 max_compiled: int = DEFAULT_MAX_COMPILED, embedders: Sequence[str] = (),
                 trust_remote_code: bool = False, params=None, compile_cache: Optional[CompileCache] = None,
                 relevance: str = DEFAULT_RELEVANCE, lexical_weight: float = DEFAULT_LEXICAL_WEIGHT,
                 note_context: bool = DEFAULT_NOTE_CONTEXT):
        if len(corpus) == 0:
            raise PipelineError("the index holds no notes (nothing was extracted from the documents)")
        validate_embeddings(corpus.embeddings)
        self.corpus = corpus
        self._embedder = embedder
        self.reader = reader
        # the one problem builder (cdsjax.pipeline.selection): padded once, one problem per question
        self.candidates = Candidates.pad(corpus.embeddings, links=corpus.links, structure=note_structure(corpus.notes))
        self.size = self.candidates.size
        # what ranks the notes for every selector (cdsjax.io.relevance): the BM25 index of the notes' placed text is
        # built on the first hybrid question
        try:
            self.relevance = Relevance([lexical_text(n, note_context) for n in corpus.notes], relevance,
                                       lexical_weight)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        self.notes, self.valid, self.links = self.candidates.notes, self.candidates.valid, self.candidates.links
        # the learned game's parameters, a value read once (None: each learned selector plays the shipped fit of its
        # read-out, read once per process)
        try:
            self.params = None if params is None or params == "" else resolve_params(params)
        except ValueError as err:  # a missing or malformed file is one line now, not at the first question
            raise PipelineError(str(err)) from None
        # jitted selectors by (selector, budget, options, ...): by default shared by the process's pipelines
        self.compiled = shared_selector_cache(max_compiled) if compiled is None else compiled
        self.compile_cache = compile_cache
        self._ran: set = set()  # keys whose selector has run (compiled) at least once
        # the spectral bound and note block of each selector's game on this corpus, by (selector, options)
        self.corpus_arrays = CorpusArrays()
        # the embedders the user accepts beyond the known ones, and whether model code may run (never the index's)
        self.embedders = tuple(embedders)
        self.trust_remote_code = bool(trust_remote_code)
        self.embedder_info = dict(corpus.embedder) if embedder is not None else checked_embedder(
            corpus.embedder, allowed=self.embedders, trust_remote_code=self.trust_remote_code)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_paths(cls, paths: Sequence[str], *, config=None, reader=None, progress: bool = False,
                   embedders: Sequence[str] = (), trust_remote_code: bool = False,
                   max_compiled: int = DEFAULT_MAX_COMPILED, params: Optional[str] = None,
                   warm: Optional[dict] = None, compile_cache: Optional[CompileCache] = None,
                   relevance: Optional[str] = None) -> "Pipeline":
        """Loads index directories and indexes PDFs (into the cache) named by ``paths``.

        An index whose manifest names an embedder cdsjax does not know (the shipped MiniLM, the presets of
        :mod:`cdsjax.io.embed`), nor one in ``embedders`` or ``config.embedder.model``, is refused
        (:class:`PipelineError`) before anything is loaded from it; model code runs only with
        ``trust_remote_code``, never because an index says so. ``params`` is the learned
        selectors' parameters: a file (read once, by :func:`cdsjax.learn.resolve_params`), a ``LearnedParams`` value,
        or None (each learned selector plays the shipped fit of its read-out).

        ``warm`` (``dict(question=, selector=, budget=, options=)``, the question about to be asked): when ``paths``
        is one PDF to be indexed, its selector compiles while the notes are embedded (:meth:`warm_for_notes`).
        ``relevance`` (``dense`` | ``hybrid``) overrides ``config.relevance.mode`` (:mod:`cdsjax.io.relevance`).
        """
        from cdsjax.io.elements import IngestError
        from cdsjax.io.index import index_pdf, load_index
        from cdsjax.io.storefiles import StoreError

        indexes, compiled = [], shared_selector_cache(max_compiled)
        on_prepared = None if warm is None or len(paths) != 1 else (lambda doc: cls.warm_for_notes(
            doc.notes, config=config, compiled=compiled, params=params, embedders=embedders,
            trust_remote_code=trust_remote_code, compile_cache=compile_cache, **warm))
        # the question's encoder loads while the PDF is parsed, off the selector's compilation
        early = None
        if on_prepared is not None and Path(paths[0]).is_file():
            from cdsjax.pipeline.warmup import warm_question_ahead

            early = warm_question_ahead(warm["question"], config)
        try:
            for p in paths:
                path = Path(p)
                try:
                    if path.is_dir():
                        indexes.append(load_index(path))
                    elif path.exists():
                        indexes.append(index_pdf(path, config=config, progress=progress, on_prepared=on_prepared))
                    else:
                        raise PipelineError(f"{path}: no such file or directory")
                except (IngestError, StoreError) as err:
                    raise PipelineError(str(err)) from None
        finally:
            if early is not None:
                early.join()
        accepted = tuple(embedders)
        if config is not None and "embedder" in config and config.embedder.get("model"):
            accepted += (str(config.embedder.model),)
        try:
            settings = relevance_of(config)
            if relevance is not None:
                settings["mode"] = check_relevance(relevance)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        return cls(Corpus.merge(indexes), reader=reader, embedders=accepted, trust_remote_code=trust_remote_code,
                   compiled=compiled, params=params, compile_cache=compile_cache, relevance=settings["mode"],
                   lexical_weight=settings["lexical_weight"], note_context=settings["context"])

    @classmethod
    def warm_for_notes(cls, notes: Sequence[Any], *, question: str, selector: SelectorName = DEFAULT_SELECTOR,
                       budget: int = DEFAULT_BUDGET, options: Optional[dict] = None, config=None, compiled=None,
                       params=None,
                       embedders: Sequence[str] = (), trust_remote_code: bool = False,
                       compile_cache: Optional[CompileCache] = None) -> None:
        """Compiles what asking ``question`` of an index of ``notes`` (not yet embedded) runs: the selector at
        the padded size, its corpus bound and note block, on stand-in embeddings
        (random unit vectors) of that shape (:func:`cdsjax.pipeline.warmup.precompile`; without a compilation cache by
        asking once); the jitted selectors go to ``compiled``, which the real index's pipeline then shares.
        Nothing of the index depends on it."""
        from cdsjax.io.embed import Embedder
        from cdsjax.io.index import default_config
        from cdsjax.io.onnx_encoder import SentenceEncoder
        from cdsjax.pipeline.warmup import precompile

        rows = [n if isinstance(n, dict) else dict(doc_id=n.doc_id, page=n.page, kind=n.kind) for n in notes]
        info = Embedder(default_config() if config is None else config).info()
        encoder = SentenceEncoder.from_info(info)  # None: sentence-transformers (its dimension needs torch loaded)
        if not rows or encoder is None:
            return
        emb = np.random.default_rng(0).standard_normal((len(rows), encoder.dim)).astype(np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        corpus = Corpus(embeddings=emb, links=np.zeros((len(rows),) * 2, bool), notes=rows, embedder=info, roots=[])
        pipe = cls(corpus, compiled=compiled, params=params, embedders=embedders, trust_remote_code=trust_remote_code,
                   compile_cache=compile_cache)
        if precompile(pipe, emb[0], selector=selector, budget=budget, qid=question, options=options):
            pipe.encode([question])
        else:  # no compilation cache (library use): compiled by asking once
            pipe.retrieve(question, selector=selector, budget=budget, options=options)

    def with_reader(self, reader) -> "Pipeline":
        """This pipeline read by ``reader`` instead: a shallow copy sharing the corpus, the encoder and the compiled
        selectors (the warm server's pipelines serve requests with different readers)."""
        self.embedder  # noqa: B018  (loaded here, once, so that the copy shares it)
        other = copy.copy(self)
        other.reader = reader
        return other

    @property
    def embedder(self):
        """The question encoder: the model's ONNX export on onnxruntime when the index's model allows it (no torch
        import), else the sentence-transformers :class:`~cdsjax.io.embed.Embedder`."""
        if self._embedder is None:
            from cdsjax.io.onnx_encoder import SentenceEncoder

            self._embedder = SentenceEncoder.from_info(self.embedder_info)
            if self._embedder is None:
                from cdsjax.io.embed import Embedder

                self._embedder = Embedder.from_info(self.embedder_info, allowed=self.embedders,
                                                    trust_remote_code=self.trust_remote_code)
        return self._embedder

    # ------------------------------------------------------------------ retrieval
    def choose(self, selector: SelectorName = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET,
               options: Optional[dict] = None) -> Choice:
        """``selector`` (a name as users write it, or its spec) at ``budget`` with ``options``, resolved once
        (:class:`~cdsjax.pipeline.compiled.Choice`: the spec, the options split, the key in :attr:`compiled`);
        this pipeline's learned parameters apply unless ``options`` names its own. Unknown names and bad options
        are a one-line :class:`PipelineError`."""
        return Choice.make(selector, budget, options, self.params)

    def selector_key(self, selector: SelectorName, budget: int, options: Optional[dict] = None) -> tuple:
        """The key of a selector in :attr:`compiled` (a parameter value by its content, never a path; a traced
        option (:data:`~cdsjax.pipeline.compiled.TRACED_OPTIONS`) by its name only: its values share one compiled
        selector)."""
        return self.choose(selector, budget, options).key

    def is_compiled(self, selector: SelectorName, budget: int, options: Optional[dict] = None) -> bool:
        """True when this selector has been built and run before (so a call does not compile)."""
        try:
            key = self.choose(selector, budget, options).key
            return key in self._ran and key in self.compiled
        except (PipelineError, TypeError):  # unknown names, unhashable option values
            return False

    def selector_fn(self, selector: SelectorName, budget: int, options: Optional[dict] = None) -> core.Selector:
        """The jitted per-question :class:`~cdsjax.core.Selector` ``fn(problem, key)`` (cached by
        :meth:`selector_key`): :meth:`compiled_selector` of :meth:`choose`."""
        return self.compiled_selector(self.choose(selector, budget, options))

    def compiled_selector(self, choice: Choice) -> core.Selector:
        """The jitted per-question :class:`~cdsjax.core.Selector` of ``choice`` (cached by ``choice.key``).

        Every program it compiles (the selection, its corpus bound and note block, for each signature) belongs to
        its entry of :attr:`compiled` and goes with it. A traced option's value is an argument of those programs."""
        key = choice.key

        def make():
            # a selector already in ``compiled`` keeps the compilation cache it was made with
            return compile_selector(choice, self.params, self.compile_cache)

        if isinstance(self.compiled, SelectorCache):
            entry = self.compiled.get_or_make(key, make)
        else:
            if key not in self.compiled:
                self.compiled[key] = make()
            entry = self.compiled[key]
        return bind(entry, choice.traced) if choice.traced else entry

    def encode(self, questions: Sequence[str]) -> np.ndarray:
        for q in questions:
            if not isinstance(q, str) or not q.strip():
                raise PipelineError("the question is empty")
        emb = np.asarray(self.embedder.encode_queries(list(questions)), np.float32)
        validate_embeddings(emb, norm_atol=1e-2)
        return emb

    def select(self, query: np.ndarray, *, selector: SelectorName = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET,
               qid: str = "", options: Optional[dict] = None) -> core.Selection:
        """Runs one selector for one encoded question ([d], or [m, d] for several query vertices)."""
        return self.run(query, self.choose(selector, budget, options), qid=qid)

    def query_scores(self, query: np.ndarray, question: Optional[str]) -> Optional[np.ndarray]:
        """``[n]`` the relevance of each note to ``question`` (encoded as ``query`` ``[d]``) where it is not the
        cosine (:attr:`relevance` hybrid), else None; several query vectors, or no question text, rank by the
        cosine."""
        query = np.asarray(query, np.float32)
        if question is None or query.ndim != 1 or self.relevance.mode == "dense":
            return None
        return self.relevance.scores(question, np.asarray(self.corpus.embeddings, np.float32) @ query)

    def run(self, query: np.ndarray, choice: Choice, *, qid: str = "",
            query_scores: Optional[np.ndarray] = None) -> core.Selection:
        """Runs the selector ``choice`` (:meth:`choose`) for one encoded question ([d], or [m, d] for several query
        vertices), ranking by ``query_scores`` (the question's relevance row, :meth:`query_scores`) where given, else
        by the cosine."""
        fn = self.compiled_selector(choice)
        problem = self.candidates.problem(query, choice.spec, query_scores)
        problem = self.with_bound(fn, problem, choice.key, traced=choice.traced)
        sel = jax.device_get(fn(problem, key_from_query_id(qid)))
        self._ran.add(choice.key)
        if len(self._ran) > 4 * max(16, len(self.compiled)):  # forget keys the cache has dropped
            self._ran &= set(self.compiled)
        return sel

    def with_bound(self, fn, problem: core.CDSProblem, key: tuple, *, traced: Optional[dict] = None) -> core.CDSProblem:
        """``problem`` carrying the spectral bound and the note block of ``fn``'s game on this corpus, computed
        on the first question and kept (per selector and number of query rows): the corpus's one
        eigendecomposition replaces one per question (:func:`cdsjax.core.games.affinity.corpus_bound`; same picks bit
        for bit), and with the note block built once a question costs its relevance row and its solve
        (:func:`cdsjax.core.strategies.corpus.solve_on_block`). ``traced``: the values of the selector's traced options
        (``Choice.traced``), which the bound and block depend on."""
        values = tuple(sorted((traced or {}).items()))
        return self.corpus_arrays.attach(fn, problem, key=(key[0], key[2], values))  # neither depends on the budget

    def evidence(self, selection: core.Selection) -> List[dict]:
        """The selected notes as evidence dicts, best first."""
        ok = np.asarray(selection.selected_valid)
        picked = [self.corpus.notes[int(i)] for i in np.asarray(selection.indices)[ok]]
        return [evidence_item(note, rank=rank, score=s, index=self.corpus.index_of.get(str(note.get("doc_id"))))
                for rank, (note, s) in enumerate(zip(picked, np.asarray(selection.scores)[ok]), 1)]

    def evidence_items(self, evidence: List[dict]) -> list:
        """Evidence dicts as reader EvidenceItems (cdsjax.io.reading.reader), with each note's full text."""
        from cdsjax.io.reading.prompt import EvidenceItem

        return [EvidenceItem(note_id=str(e["note_id"]), doc_id=str(e["document"]), page=int(e["page"]),
                             kind=e["kind"],
                             text=self.corpus.notes[self.corpus.note_index(e["note_id"])].get("text") or "",
                             summary=e.get("summary") or "", caption=e.get("caption") or "",
                             bbox=tuple(e["bbox"]) if e.get("bbox") else None, image_path=e.get("image_path"),
                             score=float(e["score"]), rank=int(e["rank"]),
                             ocr_text=self.corpus.notes[self.corpus.note_index(e["note_id"])].get("ocr_text") or "")
                for e in evidence]

    def retrieve(self, question: str, *, selector: SelectorName = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET,
                 qid: str = "", options: Optional[dict] = None, abstain: bool = True) -> Answer:
        """Encodes and selects (no reading): an :class:`Answer` with ``answer=None``. The selector's name is
        resolved once, here; its spec goes down to the selection, the diagnostics and the answer. The selection
        is judged (:meth:`judge`): ``answer.abstained`` when its evidence is too weak to read (never with
        ``abstain=False``; the judgement is recorded either way)."""
        spec = catalog.resolve(selector)
        t0 = time.perf_counter()
        query = self.encode([question])[0]
        t1 = time.perf_counter()
        scores = self.query_scores(query, question)  # the relevance the selection ranks by and the judgement reads
        sel = self.run(query, self.choose(spec, budget, options), qid=qid or question, query_scores=scores)
        t2 = time.perf_counter()
        diag = self.diagnostics(sel)
        evidence = self.evidence(sel)
        warnings = [convergence_warning(diag), self.scanned_warning(evidence)]
        verdict = self.judge(sel, query, spec.name, enabled=abstain, relevance=scores)
        return Answer(question=question, answer=None, evidence=evidence, selector=catalog.display(spec),
                      budget=budget, diagnostics=diag, timings=dict(encode=t1 - t0, select=t2 - t1, total=t2 - t0),
                      warnings=[w for w in warnings if w], relevance=self.relevance.describe(),
                      abstained=verdict.abstained, abstention=verdict.to_dict())

    def judge(self, selection: core.Selection, query: np.ndarray, selector: str, *, enabled: bool = True,
              relevance: Optional[np.ndarray] = None):
        """Whether ``selection`` (of ``selector``, for the encoded question ``query``) is too weak to read:
        :func:`cdsjax.pipeline.abstain.judge` on its scores (:func:`~cdsjax.pipeline.abstain.strength_features`) on
        ``relevance``, the row the selector ranked by (None: the cosine), under the shipped rules."""
        from cdsjax.pipeline.abstain import judge, note_relevance, strength_features

        if relevance is None:
            relevance = note_relevance(self.corpus.embeddings, query)
        return judge(selector, strength_features(selection, relevance), enabled=enabled)

    def scanned_warning(self, evidence: List[dict]) -> Optional[str]:
        """One line when evidence comes from pages without a text layer (:func:`cdsjax.pipeline.answer.scanned_warning`
        on this corpus); None otherwise."""
        return scanned_warning(evidence, self.corpus)

    def with_similarity(self, options: Optional[ReadOptions]) -> ReadOptions:
        """``options`` (None: the reader's defaults) trimming by this index's embedder unless they say otherwise."""
        options = options or ReadOptions()
        if options.similarity is None:
            options = dataclasses.replace(options, similarity=self.sentence_similarity)
        return options

    def plan_read(self, answer: Answer, options: Optional[ReadOptions] = None) -> Answer:
        """Marks each evidence dict's ``read`` (in place) as the reader will get it, before reading: the reader's own
        fit of the evidence to the read's token budget (:meth:`cdsjax.io.reading.reader.Reader.fit`, trimming by
        :meth:`sentence_similarity`); :meth:`read` marks it again from what was sent. A no-op without a reader."""
        if self.reader is None or not hasattr(self.reader, "fit"):
            return answer
        items = self.evidence_items(answer.evidence)
        fitted = self.reader.fit(answer.question, items, self.with_similarity(options))
        mark_read(answer.evidence, items, fitted.items)
        return answer

    def read(self, answer: Answer, options: Optional[ReadOptions] = None, *, on_token=None, on_retry=None,
             started: Optional[float] = None) -> Answer:
        """Has the reader answer from ``answer.evidence`` (in place; a no-op without a reader), through the one
        reading path (:func:`cdsjax.pipeline.answer.read_answer`): the evidence fitted to the reader's token
        budget, the note that does not fit cut to its sentences nearest the question (by this index's embedder:
        :meth:`sentence_similarity`), the answer streamed to ``on_token`` as it is written, and a reply that is no
        answer asked again once. A failed read keeps the selection (``answer.error`` says why).

        ``options``: the read's :class:`cdsjax.io.reading.options.ReadOptions` (evidence budget, answer tokens,
        seed), built by the caller's edge; None: the reader's defaults."""
        if self.reader is None:
            return answer
        return read_answer(self.reader, answer, self.evidence_items(answer.evidence), self.with_similarity(options),
                           on_token=on_token, on_retry=on_retry, started=started)

    def sentence_similarity(self, question: str, sentences) -> list:
        """Cosine of each sentence with the question under this index's embedder (what trimming keeps)."""
        vectors = np.asarray(self.encode([question, *sentences]), dtype=np.float64)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return (vectors[1:] @ vectors[0]).tolist()

    def ask(self, question: str, *, selector: SelectorName = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET,
            qid: str = "", options: Optional[dict] = None, read: bool = True, read_options=None,
            abstain: bool = True) -> Answer:
        """Answers one question: encode, select, and (with a reader) read (``read_options``: see :meth:`read`),
        unless the selection is abstained (``abstain=False``: never)."""
        answer = self.retrieve(question, selector=selector, budget=budget, qid=qid, options=options, abstain=abstain)
        return self.read(answer, read_options) if read else answer

    def warm(self, selectors: Sequence[SelectorName] = (DEFAULT_SELECTOR,), budget: int = DEFAULT_BUDGET) -> float:
        """Compiles the encoder and ``selectors`` at ``budget`` (e.g. before serving); returns seconds."""
        t0 = time.perf_counter()
        for name in selectors:
            self.retrieve("warm-up question", selector=name, budget=budget)
        # most questions are under 64 tokens: compile the encoder's second token bucket too
        self.encode([" ".join(["word"] * 40)])
        return time.perf_counter() - t0

    def diagnostics(self, sel: core.Selection, selector: Optional[SelectorName] = None) -> Dict[str, Any]:
        """Solver diagnostics of a CDS selection as plain Python values ({} for baselines):
        :func:`cdsjax.core.diagnostics` (the solver that ran and its mode, read off the selection) with this
        corpus's mask. ``selector``, when given as a name, must be a known one (a :class:`PipelineError`
        otherwise)."""
        if selector is not None:
            catalog.resolve(selector)
        return core.diagnostics(sel, valid=self.valid)
