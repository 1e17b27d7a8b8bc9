"""The jitted selectors of a process, least recently used dropped beyond a cap (:class:`SelectorCache`), and
the one that pipelines built without their own share (:func:`shared_selector_cache`, held by
:data:`cdsjax.memo.PROCESS`)."""

from __future__ import annotations

import collections
import threading

from cdsjax.memo import PROCESS

DEFAULT_MAX_COMPILED = 16


class SelectorCache(collections.OrderedDict):
    """Jitted selectors (of one pipeline, or of the process: :func:`shared_selector_cache`), least recently used
    dropped beyond ``maxsize``.

    Each entry holds its compiled executables (about 10 MB for a CDS selector on a few hundred notes), and
    every new budget or option value compiles a new one: without a cap a server's clients could grow its
    memory at will. Thread-safe (a server's timed-out selection may still be running on another thread).
    """

    def __init__(self, maxsize: int = DEFAULT_MAX_COMPILED):
        super().__init__()
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = int(maxsize)
        self.lock = threading.RLock()

    def get_or_make(self, key, make):
        """The entry for ``key``, made with ``make()`` (and the oldest entries dropped) when absent."""
        with self.lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
            value = make()
            self[key] = value
            while len(self) > self.maxsize:
                self.popitem(last=False)
            return value


def shared_selector_cache(maxsize: int = DEFAULT_MAX_COMPILED) -> SelectorCache:
    """The process's :class:`SelectorCache` of ``maxsize`` entries, which pipelines built without ``compiled``
    share: a new pipeline (another index, the same index reloaded, the next ``ask`` of a process) reuses the
    selectors jitted before it, and asks without tracing or compiling again where its corpus pads to a size
    already met. Its cap bounds the process's compiled selectors as it bounded each pipeline's."""
    return PROCESS.selector_caches.get(int(maxsize), lambda: SelectorCache(maxsize))
