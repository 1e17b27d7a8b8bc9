"""The one client for OpenAI-compatible chat servers (reader, judge, VLM enrichment, planner), by job:

* :mod:`cdsjax.io.llm.config` — :class:`ReaderConfig` (how to reach a server and decode) and :class:`ChatReply`;
* :mod:`cdsjax.io.llm.errors` — :class:`ReaderError` and its kinds, which failures are retried, which refusals not;
* :mod:`cdsjax.io.llm.transport` — one request, streamed or not; the images a request carries; ``GET /props``;
* :mod:`cdsjax.io.llm.client` — :class:`ChatClient`: retries within one deadline, error messages, the model,
  whether the server takes images, its context window.
"""
