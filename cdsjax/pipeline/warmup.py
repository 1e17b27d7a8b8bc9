"""Compiling ahead what a question will run, while something else runs.

``cdsjax ask NEW.pdf "question"`` parses the PDF, embeds its notes and then selects. The first ask at a new
padded size compiles the selector (seconds on two cores); :meth:`cdsjax.pipeline.Pipeline.warm_for_notes`
compiles it while the notes are embedded, and these two pieces keep that compilation short:

- :func:`warm_question` (:func:`warm_question_ahead` on a thread) loads the question encoder (its onnxruntime
  session) and encodes the question once while the PDF is still being parsed;
- :func:`precompile` compiles the selector against the shapes of its corpus bound and note block while a second
  thread computes (and compiles) those two, instead of one after the other.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import jax
import numpy as np

from cdsjax import core
from cdsjax.core.baselines import key_from_query_id
from cdsjax.io.compilation_cache import ExportedJit
from cdsjax.pipeline.catalog import DEFAULT_SELECTOR
from cdsjax.defaults import DEFAULT_BUDGET
from cdsjax.pipeline.selection import corpus_arrays


def warm_question(question: str, config=None) -> None:
    """Loads the question encoder of ``config``'s embedder (the default index config when None) and encodes
    ``question`` once (the session's first run); nothing when that encoder needs torch (sentence-transformers)."""
    Embedder, default_config, SentenceEncoder = _encoder_modules()
    encoder = SentenceEncoder.from_info(Embedder(default_config() if config is None else config).info())
    if encoder is not None and isinstance(question, str) and question.strip():
        encoder.encode_queries([question])


def _encoder_modules():
    """The modules :func:`warm_question` needs. :func:`warm_question_ahead` imports them on the caller's thread:
    two threads importing modules of one package at once can deadlock on Python's import locks (an ``ask``
    failed so, on ``cdsjax.io.parse.layout``, while its main thread imported the parser)."""
    from cdsjax.io.embed import Embedder
    from cdsjax.io.index import default_config
    from cdsjax.io.onnx_encoder import SentenceEncoder

    return Embedder, default_config, SentenceEncoder


def warm_question_ahead(question: str, config=None) -> threading.Thread:
    """:func:`warm_question` on a daemon thread, started and returned (join it before asking). A failure there is
    dropped: it is only a head start, and the ask itself reports what is wrong."""

    def ahead():
        try:
            warm_question(question, config)
        except Exception:
            pass

    _encoder_modules()  # imported here, not on the thread (see there)
    thread = threading.Thread(target=ahead, daemon=True, name="cdsjax-warm-question")
    thread.start()
    return thread


def precompile(pipe, query: np.ndarray, *, selector=DEFAULT_SELECTOR, budget: int = DEFAULT_BUDGET, qid: str = "",
               options: Optional[dict] = None) -> bool:
    """Compiles ``selector`` of the :class:`~cdsjax.pipeline.Pipeline` ``pipe`` for an encoded question ``query``
    without asking it. The corpus bound and note block are computed (and compiled) on a second thread and kept by
    ``pipe``, while the selector compiles against their shapes (:meth:`ExportedJit.precompile
    <cdsjax.io.compilation_cache.ExportedJit.precompile>`); its executable serves the later calls. Returns False
    where nothing was compiled ahead (no compilation cache: the selector then compiles on its first call).
    ``selector``: a name or its spec, resolved once (:meth:`~cdsjax.pipeline.Pipeline.choose`)."""
    choice = pipe.choose(selector, budget, options)
    fn = pipe.compiled_selector(choice)
    if not isinstance(fn.select, ExportedJit):
        return False
    # the relevance rows the question ``qid`` (its text) will carry under the hybrid relevance: the same program's
    # inputs (no text: a question selected by its vector alone, ranked by the cosine)
    problem = pipe.candidates.problem(query, choice.spec, pipe.query_scores(query, qid or None))
    key = key_from_query_id(qid or "warm-up question")
    make, build = fn.corpus_bound, fn.corpus_block
    if make is None:
        return fn.select.precompile(problem, key)
    bound, block = jax.eval_shape(lambda p: corpus_arrays(make.jitted, build and build.jitted, p), problem)
    shapes = core.with_corpus_arrays(problem, bound, block)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdsjax-warm") as pool:
        side = pool.submit(pipe.with_bound, fn, problem, choice.key)
        done = fn.select.precompile(shapes, key)
        side.result()
    return done
