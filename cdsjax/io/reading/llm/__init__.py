"""The one client for OpenAI-compatible chat servers (reader, judge, VLM enrichment, planner), by job:

* :mod:`cdsjax.io.reading.llm.config` — :class:`ReaderConfig` (how to reach a server and decode) and :class:`ChatReply`;
* :mod:`cdsjax.io.reading.llm.errors` — :class:`ReaderError` and its kinds, which failures are retried, which refusals not;
* :mod:`cdsjax.io.reading.llm.transport` — one request, streamed or not; the images a request carries; ``GET /props``;
* :mod:`cdsjax.io.reading.llm.client` — :class:`ChatClient`: retries within one deadline, error messages, the model,
  whether the server takes images, its context window.
"""
