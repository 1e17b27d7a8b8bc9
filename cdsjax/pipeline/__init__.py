"""The product layer: from a user's question and index to evidence (and an answer), as ``cdsjax ask``, the server,
the integrations and the evaluation run it.

    from cdsjax.pipeline import Pipeline
    pipe = Pipeline.from_paths(["report.pdf"])            # indexes into the cache if needed
    answer = pipe.ask("What drove the 2023 increase?")    # learned CDS read per page (the default)
    answer.evidence[0]["page"], answer.diagnostics["converged"], answer.warnings

Modules, by job (the package itself imports none of them until one of its names is used, so a command's flags
can read :mod:`cdsjax.defaults` before JAX loads):

* :mod:`~cdsjax.defaults` — the product's defaults (budget, the local reader's evidence tokens), plain
  values;
* :mod:`~cdsjax.pipeline.catalog` — the selectors as users name them: ``DEFAULT_SELECTOR`` and the other roles,
  display forms, help lines, and :func:`~cdsjax.pipeline.catalog.selector_spec` (a name as users write it ->
  its :class:`~cdsjax.core.SelectorSpec` in the core's table);
* :mod:`~cdsjax.pipeline.selection` — candidates -> one problem per question, a selector built with its options
  and parameters, the corpus arrays kept per corpus: the path the pipeline, the integrations and the evaluation
  share;
* :mod:`~cdsjax.pipeline.compiled` — a selector chosen for a question (:class:`~cdsjax.pipeline.compiled.Choice`:
  the name resolved once) and its jitted functions;
* :mod:`~cdsjax.pipeline.cache` — the process's capped cache of jitted selectors;
* :mod:`~cdsjax.pipeline.corpus` — one or more loaded indexes merged into the :class:`Corpus` a pipeline searches;
* :mod:`~cdsjax.pipeline.pipeline` — :class:`Pipeline`: encode, select, retrieve, ask;
* :mod:`~cdsjax.pipeline.answer` — the :class:`Answer` of one question, its warnings, and reading it;
* :mod:`~cdsjax.pipeline.evidence` — how a selected note is shown (``ask --json`` evidence, adapter metadata);
* :mod:`~cdsjax.pipeline.warmup` — compiling ahead what a question will run;
* :mod:`~cdsjax.pipeline.errors` — :class:`PipelineError`, the one-line error users see.

The package's own names are the four a user of the library starts from: :class:`Pipeline`, :class:`Answer`,
:class:`Corpus` and :class:`PipelineError`; everything else is imported from its module.
"""

from __future__ import annotations

__all__ = ["Answer", "Corpus", "Pipeline", "PipelineError"]


def __getattr__(name: str):
    # Loaded on first use: importing cdsjax.defaults (a command's flags) must not load JAX.
    if name == "Pipeline":
        from cdsjax.pipeline.pipeline import Pipeline

        return Pipeline
    if name == "Answer":
        from cdsjax.pipeline.answer import Answer

        return Answer
    if name == "Corpus":
        from cdsjax.pipeline.corpus import Corpus

        return Corpus
    if name == "PipelineError":
        from cdsjax.pipeline.errors import PipelineError

        return PipelineError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
