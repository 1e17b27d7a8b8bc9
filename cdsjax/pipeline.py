"""Retrieve-then-read: index -> question embedding -> padded arrays -> selector -> reader.

    from cdsjax.pipeline import Pipeline
    pipe = Pipeline.from_paths(["report.pdf"])            # indexes into the cache if needed
    answer = pipe.ask("What drove the 2023 increase?", budget=10)   # learned CDS read per page (the default)
    answer.evidence[0]["page"], answer.diagnostics["converged"], answer.warnings

The default selector is :data:`cdsjax.catalog.DEFAULT_SELECTOR`, learned CDS read per page (``"cds_learned_pages"``:
the fitted game's equilibrium, found by the active-set solver, its ranking read one note per printed page per
round; ``"cds_learned"`` reads its top-B); ``"cds_converged"`` is the paper's game at equilibrium and ``"cds"``
the paper's replicator dynamics with its step cap, which often stops far from equilibrium on real indexes. A
selector may be named by its registry name or the display form users write (``cds-paper``); an answer shows
the display form. Candidates become a problem through :mod:`cdsjax.selection`, the path the integrations and the
evaluation take too.

With a reader (``reader=ReaderConfig(base_url=..., model=...)``) the answer text
comes from the VLM; without one, ``answer.answer`` is None and the selected
evidence is the result (the embedded default).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cdsjax import catalog, core
from cdsjax.catalog import DEFAULT_SELECTOR
from cdsjax.core.baselines import key_from_query_id
from cdsjax.core.types import as_selector
from cdsjax.core.validation import validate_embeddings
from cdsjax.defaults import DEFAULT_BUDGET
from cdsjax.io.compilation_cache import (  # noqa: F401 (enable_compilation_cache: the commands' entry point)
    CompileCache, ExportedJit, enable_compilation_cache)
from cdsjax.evidence import SNIPPET_CHARS, evidence_item  # noqa: F401  (SNIPPET_CHARS: the cut ask shows)
from cdsjax.io.embed import EmbedderError, check_embedder, embedder_key
from cdsjax.learn.params_io import resolve_params
from cdsjax.selection import (Candidates, CorpusArrays, note_structure, resolve_options, resolve_selector,
                              selector_key)
from cdsjax.selector_cache import DEFAULT_MAX_COMPILED, SelectorCache, shared_selector_cache  # noqa: F401 (public here)


class PipelineError(Exception):
    """A user-facing error of the pipeline (one line)."""


# The options that are array leaves of the game's parameters (CDSParams.beta, .tau): a value given for one is an
# argument of the compiled selector, so a new value reuses its program; every other option shapes the
# compilation (a static field, a loop limit, a Python-level choice) and is part of the selector's key, so each
# of its values is one entry of the pipeline's capped SelectorCache (``--max-compiled``).
TRACED_OPTIONS = ("beta", "tau")
_TRACED = "<argument>"  # a traced option's place in a selector key


def split_options(selector: str, options: Optional[dict]) -> tuple:
    """``(static, traced)``: ``options`` of the selector ``selector`` (a registry name) that key its
    compilation, and those passed to it as array arguments (:data:`TRACED_OPTIONS` given as real numbers)."""
    static, traced = {}, {}
    accepted = catalog.selector_spec(selector).options
    for name, value in dict(options or {}).items():
        if (name in TRACED_OPTIONS and name in accepted and isinstance(value, (int, float))
                and not isinstance(value, bool)):
            traced[name] = float(value)
        else:
            static[name] = value
    return static, traced


def _bind(entry: core.Selector, leaves: dict) -> core.Selector:
    """A selector of ``entry``'s compiled functions (which take the traced options as their last argument)
    with ``leaves`` given."""
    args = {k: jnp.asarray(v) for k, v in sorted(leaves.items())}  # weak-typed, as the Python number was
    return core.Selector(lambda problem, key=None: entry.select(problem, key, args),
                         corpus_bound=None if entry.corpus_bound is None else (
                             lambda problem: entry.corpus_bound(problem, args)),
                         corpus_block=None if entry.corpus_block is None else (
                             lambda problem: entry.corpus_block(problem, args)), solver=entry.solver)


@dataclasses.dataclass
class Corpus:
    """What retrieval needs from one or more indexes, merged into one note set.

    Attributes:
      embeddings: ``[n, d]`` float32, L2-normalised.
      links: ``[n, n]`` bool note-link adjacency (block diagonal across indexes).
      notes: n note dicts (note_id, doc_id, page, bbox, kind, text, summary, caption, image_path, ...).
      embedder: the embedder info shared by every index (model, prefixes, normalisation).
      roots: the index directories.
      index_of: document id -> the name of the index that holds it (:func:`cdsjax.io.store.index_name`).
    """

    embeddings: np.ndarray
    links: np.ndarray
    notes: List[dict]
    embedder: dict
    roots: List[str]
    index_of: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._positions = {n.get("note_id"): i for i, n in enumerate(self.notes)}

    def __len__(self) -> int:
        return len(self.notes)

    def note_index(self, note_id) -> int:
        """Row of the note with this id in ``embeddings`` / ``notes``."""
        return self._positions[note_id]

    @classmethod
    def merge(cls, indexes: Sequence[Any]) -> "Corpus":
        """Merges loaded :class:`~cdsjax.io.index.CorpusIndex` objects (same embedder required)."""
        if not indexes:
            raise PipelineError("no index to search")
        info = embedder_key(indexes[0].embedder)
        for idx in indexes[1:]:
            if embedder_key(idx.embedder) != info:
                raise PipelineError(
                    f"indexes were embedded with different models ({indexes[0].embedder.get('model')} vs "
                    f"{idx.embedder.get('model')}); re-index them with one embedder"
                )
        check_ids_apart(indexes)
        n = sum(len(idx.notes) for idx in indexes)
        from cdsjax.io.index.schema import max_notes, too_many_notes
        from cdsjax.io.store import index_name

        if n > max_notes():  # a question's work holds [n, n] matrices of the whole corpus
            raise PipelineError(too_many_notes("the indexes together", n))
        links = np.zeros((n, n), bool)
        notes: List[dict] = []
        start = 0
        for idx in indexes:
            k = len(idx.notes)
            links[start : start + k, start : start + k] = idx.links
            notes.extend(idx.notes)
            start += k
        embeddings = np.concatenate([np.asarray(idx.embeddings, np.float32) for idx in indexes])
        return cls(embeddings=embeddings, links=links, notes=notes, embedder=dict(indexes[0].embedder),
                   roots=[str(idx.root) for idx in indexes],
                   index_of={str(n.get("doc_id")): index_name(idx.root) for idx in indexes for n in idx.notes})


def check_ids_apart(indexes: Sequence[Any]) -> None:
    """Raises :class:`PipelineError` (one line naming both indexes) when two loaded indexes share a document id
    or a note id, or one index repeats a note id.

    Notes, crops and PDFs are looked up by these ids (the reader's evidence, ``/crop?note=``,
    ``/pdf?document=``): a collision would let one index's text or image stand in for the other's, so it is
    refused rather than resolved. Two PDFs of the same name kept apart belong in one index, where the second
    gets the id ``name~<sha8>``."""
    docs: Dict[str, int] = {}
    notes: Dict[Any, int] = {}
    roots = [str(getattr(idx, "root", "?")) for idx in indexes]

    def refuse(first: int, i: int, what: str) -> None:
        both = f"{roots[first]!r} and {roots[i]!r} together" if first != i else repr(roots[i])
        raise PipelineError(f"refusing to load {both}: {what}")

    for i, idx in enumerate(indexes):
        ids = {str(n.get("doc_id")) for n in idx.notes}
        ids |= {str(d.get("doc_id")) for d in idx.manifest.get("documents", []) if isinstance(d, dict)}
        for doc in sorted(ids):
            first = docs.setdefault(doc, i)
            if first != i:
                refuse(first, i, f"both hold a document with the id {doc[:80]!r}; index those PDFs into one "
                                 "index (the second gets a distinct id), or load one of them")
        for note in idx.notes:
            note_id = note.get("note_id")
            if note_id in notes:
                refuse(notes[note_id], i, f"the note id {str(note_id)[:80]!r} appears twice "
                                          "(cdsjax gives every note of a corpus its own id)")
            notes[note_id] = i


@dataclasses.dataclass
class Answer:
    """The result of one question.

    Attributes:
      question: the question.
      answer: the reader's answer text, or None when no reader is configured.
      evidence: the selected notes, best first: dicts with rank (1-based), score,
        document, page (0-based), bbox, kind, text (text or caption, cut to
        1500 chars), note_id, image_path.
      selector: selector name as users write it (``cds-converged``, ``cds-paper``,
        ``cosine``, ...); budget: the evidence budget.
      diagnostics: solver diagnostics for CDS (solver, mode "paper" | "converged",
        num_iters, converged, status = how the solve ended ("converged" | "max_steps" |
        "nonfinite" | "singular"), kkt_residual, objective, support_size = notes with
        weight > 1e-6, alpha, query_weight), else {}.
      timings: seconds per stage (encode, select, read, total).
      reader: model, cited evidence ranks, abstained, latency — or None.
      error: when reading failed, {"kind", "message", "server"} (``answer`` is then None), else None.
      warnings: one-line warnings (e.g. a CDS solve that ended unconverged).
    """

    question: str
    answer: Optional[str]
    evidence: List[dict]
    selector: str
    budget: int
    diagnostics: Dict[str, Any]
    timings: Dict[str, float]
    reader: Optional[Dict[str, Any]] = None
    error: Optional[Dict[str, Any]] = None
    warnings: List[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def reader_fields(result, local: Optional[dict] = None) -> Dict[str, Any]:
    """The ``reader`` object of ``ask --json`` from a :class:`cdsjax.io.reader.ReaderAnswer`."""
    out = dict(model=result.model, cited=list(result.cited), abstained=result.abstained, latency_s=result.latency_s,
               first_token_s=result.first_token_s, usage=result.usage, warnings=list(result.warnings),
               image_mode=result.image_mode, dropped=result.dropped, evidence_tokens=result.evidence_tokens,
               trimmed=result.trimmed, no_answer=result.no_answer, retried=result.retried,
               finish_reason=result.finish_reason)
    if result.no_answer is not None:
        out["reply"] = result.raw  # what the reader wrote instead of an answer
    if local is not None:  # a local server: which runtime, threads, slots, and whether it was already warm
        out["local"] = dict(local)
    return out


def checked_embedder(info: dict, *, allowed: Sequence[str] = (), trust_remote_code: bool = False) -> dict:
    """An index's embedder info if cdsjax may load that model (:func:`cdsjax.io.embed.check_embedder`),
    with ``trust_remote_code`` set to the caller's choice; else a one-line :class:`PipelineError`."""
    try:
        return check_embedder(info, allowed=allowed, trust_remote_code=trust_remote_code)
    except EmbedderError as err:
        raise PipelineError(str(err)) from None


def canonical_selector(name: str) -> str:
    """The registry name of a selector's registry name or display form (``cds-converged`` -> ``cds_converged``)."""
    try:
        return catalog.selector_spec(name).name
    except ValueError as err:
        raise PipelineError(str(err)) from None


def display_name(name: str) -> str:
    """The name users write for a selector (``cds`` -> ``cds-paper``, ``cds_converged`` -> ``cds-converged``)."""
    return catalog.display(canonical_selector(name))


def convergence_warning(diagnostics: Dict[str, Any]) -> Optional[str]:
    """One line when a CDS solve ended unconverged (how it ended, the residual and the way out), else None."""
    if not diagnostics or diagnostics.get("converged", True):
        return None
    ended = {"nonfinite": "ended on non-finite weights (NaN or inf)",
             "singular": "stopped on a singular Newton system"}.get(diagnostics.get("status"), "stopped unconverged")
    head = (f"CDS {diagnostics['mode']} mode {ended} after {diagnostics['num_iters']} steps "
            f"(KKT residual {diagnostics['kkt_residual']:.1e}); its evidence may be near-arbitrary")
    reference = catalog.display(catalog.REFERENCE_SELECTOR)
    if diagnostics["mode"] == "paper":
        return (head + f" — use --selector {catalog.display(DEFAULT_SELECTOR)} (the default) for the equilibrium, "
                f"or {reference}")
    default_solver = core.SPECS[DEFAULT_SELECTOR].solver
    other = next(catalog.display(s.name) for s in core.SPECS.values()
                 if s.mode == "converged" and s.solver != default_solver)
    return head + f" — try --selector {other} or {reference}"


class Pipeline:
    """Retrieval (and optionally reading) over one merged corpus.

    The corpus is padded once to a bucket size, so every question of a session
    reuses one compiled selector per (selector, budget, options). ``compiled`` is where those jitted
    selectors are kept: by default the process's shared :class:`SelectorCache` of ``max_compiled`` entries
    (:func:`shared_selector_cache`), or a mapping of the caller's. ``compile_cache`` (what the command's
    :func:`enable_compilation_cache` returned; None: plain ``jax.jit``) keeps the selectors' traced programs for
    later processes (:class:`ExportedJit`); a selector already in ``compiled`` keeps the cache it was made with.
    """

    def __init__(self, corpus: Corpus, *, embedder=None, reader=None, compiled: Optional[dict] = None,
                 max_compiled: int = DEFAULT_MAX_COMPILED, embedders: Sequence[str] = (),
                 trust_remote_code: bool = False, params=None, compile_cache: Optional[CompileCache] = None):
        if len(corpus) == 0:
            raise PipelineError("the index holds no notes (nothing was extracted from the documents)")
        validate_embeddings(corpus.embeddings)
        self.corpus = corpus
        self._embedder = embedder
        self.reader = reader
        # the one problem builder (cdsjax.selection): padded once, one problem per question
        self.candidates = Candidates.pad(corpus.embeddings, links=corpus.links, structure=note_structure(corpus.notes))
        self.size = self.candidates.size
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
                   warm: Optional[dict] = None, compile_cache: Optional[CompileCache] = None) -> "Pipeline":
        """Loads index directories and indexes PDFs (into the cache) named by ``paths``.

        An index whose manifest names an embedder cdsjax does not know (the shipped MiniLM, the presets of
        :mod:`cdsjax.io.embed`), nor one in ``embedders`` or ``config.embedder.model``, is refused
        (:class:`PipelineError`) before anything is loaded from it; model code runs only with
        ``trust_remote_code``, never because an index says so. ``params`` is the learned
        selectors' parameters: a file (read once, by :func:`cdsjax.learn.resolve_params`), a ``LearnedParams`` value,
        or None (each learned selector plays the shipped fit of its read-out).

        ``warm`` (``dict(question=, selector=, budget=, options=)``, the question about to be asked): when ``paths``
        is one PDF to be indexed, its selector compiles while the notes are embedded (:meth:`warm_for_notes`).
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
            from cdsjax.warmup import warm_question_ahead

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
        return cls(Corpus.merge(indexes), reader=reader, embedders=accepted, trust_remote_code=trust_remote_code,
                   compiled=compiled, params=params, compile_cache=compile_cache)

    @classmethod
    def warm_for_notes(cls, notes: Sequence[Any], *, question: str, selector: str = DEFAULT_SELECTOR,
                       budget: int = DEFAULT_BUDGET, options: Optional[dict] = None, config=None, compiled=None, params=None,
                       embedders: Sequence[str] = (), trust_remote_code: bool = False,
                       compile_cache: Optional[CompileCache] = None) -> None:
        """Compiles what asking ``question`` of an index of ``notes`` (not yet embedded) runs: the selector at
        the padded size, its corpus bound and note block, on stand-in embeddings
        (random unit vectors) of that shape (:func:`cdsjax.warmup.precompile`; without a compilation cache by
        asking once); the jitted selectors go to ``compiled``, which the real index's pipeline then shares.
        Nothing of the index depends on it."""
        from cdsjax.io.embed import Embedder
        from cdsjax.io.index import default_config
        from cdsjax.io.onnx_encoder import SentenceEncoder
        from cdsjax.warmup import precompile

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
    def selector_key(self, selector: str, budget: int, options: Optional[dict] = None) -> tuple:
        """The key of a selector in :attr:`compiled` (a parameter value by its content, never a path; a traced
        option (:data:`TRACED_OPTIONS`) by its name only: its values share one compiled selector)."""
        try:
            name = canonical_selector(selector)
            static, traced = split_options(name, options)
            return selector_key(name, budget, resolve_options(name, {**static, **dict.fromkeys(traced, _TRACED)},
                                                              self.params))
        except ValueError as err:
            raise PipelineError(str(err)) from None

    def is_compiled(self, selector: str, budget: int, options: Optional[dict] = None) -> bool:
        """True when this selector has been built and run before (so a call does not compile)."""
        try:
            key = self.selector_key(selector, budget, options)
            return key in self._ran and key in self.compiled
        except (PipelineError, TypeError):  # unknown names, unhashable option values
            return False

    def selector_fn(self, selector: str, budget: int, options: Optional[dict] = None):
        """The jitted per-question :class:`~cdsjax.core.Selector` ``fn(problem, key)`` (cached by :meth:`selector_key`).

        Every program it compiles (the selection, its corpus bound and note block, for each signature) belongs to
        its entry of :attr:`compiled` and goes with it. A traced option's value is an argument of those programs."""
        key = self.selector_key(selector, budget, options)
        static, traced = split_options(key[0], options)

        def build(leaves):
            try:
                _, fn = resolve_selector(key[0], budget, {**static, **leaves}, self.params)
            except ValueError as err:
                raise PipelineError(str(err)) from None
            return as_selector(fn)

        def make():
            sel = build(traced)  # (a bad static option is one line here, whatever the traced values)
            if traced:  # the functions take the traced options as an argument, built into the game when traced
                sel = core.Selector(lambda problem, k, leaves: build(leaves)(problem, k),
                                    corpus_bound=None if sel.corpus_bound is None else (
                                        lambda problem, leaves: build(leaves).corpus_bound(problem)),
                                    corpus_block=None if sel.corpus_block is None else (
                                        lambda problem, leaves: build(leaves).corpus_block(problem)),
                                    solver=sel.solver)
            # jitted, its traced program kept beside the compilation cache (when the command turned it on): a
            # fresh process neither traces nor lowers a selector it met before
            cache = self.compile_cache
            # the spectral bound and note block of the selector's game are computed once per corpus (select keeps
            # them per pipeline)
            suffix = {"select": "", "bound": ":bound", "block": ":block"}
            return sel.wrapped(lambda f, role: ExportedJit(f, repr(key) + suffix[role], cache))

        if isinstance(self.compiled, SelectorCache):
            entry = self.compiled.get_or_make(key, make)
        else:
            if key not in self.compiled:
                self.compiled[key] = make()
            entry = self.compiled[key]
        return _bind(entry, traced) if traced else entry

    def encode(self, questions: Sequence[str]) -> np.ndarray:
        for q in questions:
            if not isinstance(q, str) or not q.strip():
                raise PipelineError("the question is empty")
        emb = np.asarray(self.embedder.encode_queries(list(questions)), np.float32)
        validate_embeddings(emb, norm_atol=1e-2)
        return emb

    def select(self, query: np.ndarray, *, selector: str = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET, qid: str = "",
               options: Optional[dict] = None) -> core.Selection:
        """Runs one selector for one encoded question ([d], or [m, d] for several query vertices)."""
        fn = self.selector_fn(selector, budget, options)
        problem = self.with_bound(fn, self.candidates.problem(query, catalog.selector_spec(selector)),
                                  self.selector_key(selector, budget, options),
                                  traced=split_options(canonical_selector(selector), options)[1])
        sel = jax.device_get(fn(problem, key_from_query_id(qid)))
        self._ran.add(self.selector_key(selector, budget, options))
        if len(self._ran) > 4 * max(16, len(self.compiled)):  # forget keys the cache has dropped
            self._ran &= set(self.compiled)
        return sel

    def with_bound(self, fn, problem: core.CDSProblem, key: tuple, *, traced: Optional[dict] = None) -> core.CDSProblem:
        """``problem`` carrying the spectral bound and the note block of ``fn``'s game on this corpus, computed
        on the first question and kept (per selector and number of query rows): the corpus's one
        eigendecomposition replaces one per question (:func:`cdsjax.core.games.spectral.problem_bound`; same picks bit
        for bit), and with the note block built once a question costs its relevance row and its solve
        (:func:`cdsjax.core.strategies.corpus.solve_on_block`). ``traced``: the values of the selector's traced options
        (:func:`split_options`), which the bound and block depend on."""
        values = tuple(sorted((traced or {}).items()))
        return self.corpus_arrays.attach(fn, problem, key=(key[0], key[2], values))  # neither depends on the budget

    def evidence(self, selection: core.Selection) -> List[dict]:
        """The selected notes as evidence dicts, best first."""
        ok = np.asarray(selection.selected_valid)
        picked = [self.corpus.notes[int(i)] for i in np.asarray(selection.indices)[ok]]
        return [evidence_item(note, rank=rank, score=s, index=self.corpus.index_of.get(str(note.get("doc_id"))))
                for rank, (note, s) in enumerate(zip(picked, np.asarray(selection.scores)[ok]), 1)]

    def evidence_items(self, evidence: List[dict]) -> list:
        """Evidence dicts as reader EvidenceItems (cdsjax.io.reader), with each note's full text."""
        from cdsjax.io.prompt import EvidenceItem

        return [EvidenceItem(note_id=str(e["note_id"]), doc_id=str(e["document"]), page=int(e["page"]),
                             kind=e["kind"],
                             text=self.corpus.notes[self.corpus.note_index(e["note_id"])].get("text") or "",
                             summary=e.get("summary") or "", caption=e.get("caption") or "",
                             bbox=tuple(e["bbox"]) if e.get("bbox") else None, image_path=e.get("image_path"),
                             score=float(e["score"]), rank=int(e["rank"]),
                             ocr_text=self.corpus.notes[self.corpus.note_index(e["note_id"])].get("ocr_text") or "")
                for e in evidence]

    def retrieve(self, question: str, *, selector: str = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET, qid: str = "",
                 options: Optional[dict] = None) -> Answer:
        """Encodes and selects (no reading): an :class:`Answer` with ``answer=None``."""
        name = canonical_selector(selector)
        t0 = time.perf_counter()
        query = self.encode([question])[0]
        t1 = time.perf_counter()
        sel = self.select(query, selector=name, budget=budget, qid=qid or question, options=options)
        t2 = time.perf_counter()
        diag = self.diagnostics(sel, name)
        evidence = self.evidence(sel)
        warnings = [convergence_warning(diag), self.scanned_warning(evidence)]
        return Answer(question=question, answer=None, evidence=evidence, selector=display_name(name),
                      budget=budget, diagnostics=diag, timings=dict(encode=t1 - t0, select=t2 - t1, total=t2 - t0),
                      warnings=[w for w in warnings if w])

    def scanned_warning(self, evidence: List[dict]) -> Optional[str]:
        """One line when evidence comes from pages without a text layer (scanned pages: their text is OCR
        output, or there is only the page image); None otherwise. ``load_index`` sets the notes'
        ``no_text_layer`` and ``ocr`` fields."""
        scanned = []
        for e in evidence:
            note = self.corpus.notes[self.corpus.note_index(e["note_id"])]
            if note.get("no_text_layer"):
                scanned.append((e["rank"], e["document"], e["page"], note.get("ocr")))
        if not scanned:
            return None
        states = sorted({s or "unknown" for *_, s in scanned})
        where = ", ".join(f"[{r}] {d} p.{p + 1}" for r, d, p, _ in scanned[:6]) + (" ..." if len(scanned) > 6 else "")
        how = ("their text was read by OCR and may hold errors" if states == ["done"] else
               "they were indexed as page images without text (install tesseract-ocr and index again)")
        return (f"{len(scanned)} of {len(evidence)} evidence notes come from pages without a text layer "
                f"({where}; OCR: {'/'.join(states)}): {how}")

    def read(self, answer: Answer, *, on_token=None, on_retry=None) -> Answer:
        """Has the reader answer from ``answer.evidence`` (in place; a no-op without a reader), through the one
        reading path (:meth:`cdsjax.io.reader.Reader.answer`): the evidence fitted to the reader's token
        budget, the note that does not fit cut to its sentences nearest the question (by this index's embedder),
        the answer streamed to ``on_token`` as it is written, and a reply that is no answer asked again once.

        A failed read does not lose the selection: ``answer.answer`` stays None and ``answer.error`` says why; a
        reply that stays no answer leaves ``answer.answer`` None and ``answer.reader["no_answer"]`` says why.
        """
        if self.reader is None:
            return answer
        from cdsjax.io.llm.errors import ReaderError
        from cdsjax.io.reader import error_dict

        items = self.evidence_items(answer.evidence)
        t0 = time.perf_counter()
        try:
            result = self.reader.answer(answer.question, items, on_token=on_token, on_retry=on_retry,
                                        similarity=self.sentence_similarity)
        except ReaderError as err:  # the selection is kept: answer stays None and ``error`` says why
            result = None
            answer.error = error_dict(err)
        answer.timings["read"] = time.perf_counter() - t0
        answer.timings["total"] += answer.timings["read"]
        if result is not None:
            if result.first_token_s is not None:
                answer.timings["first_token"] = result.first_token_s
            answer.answer = result.text if result.no_answer is None else None
            answer.reader = reader_fields(result, getattr(self.reader, "local", None))
            answer.warnings.extend(result.warnings)  # e.g. a missing crop sent as text
            if result.no_answer is not None:
                from cdsjax.io.replies import describe_no_answer

                answer.warnings.append(describe_no_answer(result.no_answer))
        return answer

    def sentence_similarity(self, question: str, sentences) -> list:
        """Cosine of each sentence with the question under this index's embedder (what trimming keeps)."""
        vectors = np.asarray(self.encode([question, *sentences]), dtype=np.float64)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return (vectors[1:] @ vectors[0]).tolist()

    def ask(self, question: str, *, selector: str = DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET, qid: str = "",
            options: Optional[dict] = None, read: bool = True) -> Answer:
        """Answers one question: encode, select, and (with a reader) read."""
        answer = self.retrieve(question, selector=selector, budget=budget, qid=qid, options=options)
        return self.read(answer) if read else answer

    def warm(self, selectors: Sequence[str] = (DEFAULT_SELECTOR,), budget: int = DEFAULT_BUDGET) -> float:
        """Compiles the encoder and ``selectors`` at ``budget`` (e.g. before serving); returns seconds."""
        t0 = time.perf_counter()
        for name in selectors:
            self.retrieve("warm-up question", selector=name, budget=budget)
        # most questions are under 64 tokens: compile the encoder's second token bucket too
        self.encode([" ".join(["word"] * 40)])
        return time.perf_counter() - t0

    def diagnostics(self, sel: core.Selection, selector: str) -> Dict[str, Any]:
        """Solver diagnostics of a CDS selection as plain Python values ({} for baselines):
        :func:`cdsjax.core.diagnostics` (the solver that ran and its mode, read off the selection) with this
        corpus's mask; ``selector`` must be a known name."""
        try:
            catalog.selector_spec(selector)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        return core.diagnostics(sel, valid=self.valid)
