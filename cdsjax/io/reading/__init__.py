"""The reader wing: everything that reads evidence with a language model, in one place.

- :mod:`cdsjax.io.reading.reader` — :class:`~cdsjax.io.reading.reader.Reader`, answering from evidence;
- :mod:`cdsjax.io.reading.prompt` — the evidence items and the prompt built from them;
- :mod:`cdsjax.io.reading.evidence_fit` — evidence cut to a token budget;
- :mod:`cdsjax.io.reading.replies` / :mod:`cdsjax.io.reading.reply_cache` — replies as text, JSON and
  citations; replies kept on disk by content;
- :mod:`cdsjax.io.reading.judge` — grading answers; :mod:`cdsjax.io.reading.vlm` — notes enriched by a VLM;
- :mod:`cdsjax.io.reading.llm` — the one OpenAI-compatible chat client behind all of them;
- :mod:`cdsjax.io.reading.local` — llama.cpp's server on this machine as a reader.
"""
