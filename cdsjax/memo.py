"""What a process loads once and reuses, held in one place.

* :class:`KeyedCache` — objects by key, each made once under the cache's lock; :meth:`KeyedCache.clear` drops
  them.
* :data:`PROCESS` — the one holder of what lives as long as the process (:class:`ProcessCaches` says what and
  why). Everything else that caches is an object its owner creates and hands down (an evaluation's
  :class:`~cdsjax.eval.run.Executables`, a pipeline's :class:`~cdsjax.pipeline.cache.SelectorCache`, a parse's
  text splitter, the layout helper of :mod:`cdsjax.io.parse.layout_split`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable


class KeyedCache:
    """Objects by key, each made once (:meth:`get`) under this cache's lock, so two threads asking for the same
    model load it once; a ``make`` that raises leaves nothing behind (the next call tries again)."""

    def __init__(self):
        self._items: Dict[Hashable, Any] = {}
        self.lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The object for ``key``, made with ``make()`` when absent."""
        with self.lock:
            if key not in self._items:
                self._items[key] = make()
            return self._items[key]

    def __contains__(self, key) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Drops every object (the next :meth:`get` of a key makes it again)."""
        with self.lock:
            self._items.clear()


class ProcessCaches:
    """What this process has loaded, reused by every later user in it: one load per model per process.

    These live as long as the process because their users are many short-lived objects that meet the same
    model: ``cdsjax ask NEW.pdf`` builds an index (an ``Embedder``) and then loads it (another), a ``serve``
    builds and loads indexes for as long as it runs, an evaluation embeds each benchmark's problems, and every
    document's notes extract keywords. A model takes seconds and hundreds of MB to load; handing an owner
    through every ``Embedder(config)``, pipeline and note call would change every public constructor for no
    other gain. Each field is a :class:`KeyedCache`; :meth:`clear` drops them all (a test, a process that moves
    on to other models).

    Attributes:
      sentence_transformers: ``(source, device, trust_remote_code)`` -> a loaded sentence-transformers model
        (:class:`cdsjax.io.embed.Embedder`).
      onnx_encoders: ``(model directory, query prefix, document prefix, normalize)`` -> an onnxruntime
        :class:`~cdsjax.io.onnx_encoder.SentenceEncoder`.
      keyword_extractors: ``(language, top)`` -> a YAKE extractor (:mod:`cdsjax.io.keywords`).
      shipped_params: a shipped parameter file -> its :class:`~cdsjax.core.games.learned.LearnedParams`
        (:func:`cdsjax.learn.params_io.default_params`).
      selector_caches: ``maxsize`` -> the :class:`~cdsjax.pipeline.cache.SelectorCache` that pipelines built
        without their own share (:func:`cdsjax.pipeline.cache.shared_selector_cache`).
      machine: facts about this machine probed once, e.g. ``"tesseract"``: whether OCR can run
        (:func:`cdsjax.io.parse.pymupdf.ocr_available`).
    """

    def __init__(self):
        self.sentence_transformers = KeyedCache()
        self.onnx_encoders = KeyedCache()
        self.keyword_extractors = KeyedCache()
        self.shipped_params = KeyedCache()
        self.selector_caches = KeyedCache()
        self.machine = KeyedCache()

    def clear(self) -> None:
        """Drops everything loaded (each is loaded again on its next use)."""
        for cache in vars(self).values():
            cache.clear()


PROCESS = ProcessCaches()  # the process's loaded models and probes (see the class: why one per process)
