"""PyMuPDF's layout analysis (pymupdf4llm) run for :mod:`cdsjax.io.parse`: page regions in reading order.

pymupdf4llm analyses a document page by page. On each page PyMuPDF's layout model renders the page, runs an
image-feature network (a small convolutional net, onnxruntime) on it, and a graph network over the page's
boxes; the profile (RESULTS.md, "Ingestion: profile, floors and what changed") shows the image network as the
largest single cost. Two things here make it cheaper without changing what it computes:

- **pages in batches** (:class:`PageBatcher`): before the model sees page ``n``, the images of pages
  ``n .. n + batch - 1`` are prepared the way the model prepares them and run through the image network in one
  call; each page's own call then finds its output ready. An output is used only for an input that is equal
  byte for byte to the one it was computed from (a page whose rendering changed meanwhile, e.g. a rotated page,
  runs on its own as before).
- **threads that sleep** (:func:`limit_layout_threads`): onnxruntime's sessions get a fixed number of
  intra-op threads that do not spin when idle, so the Python half of each page and the embedding of the
  previous document are not starved by spinning threads.

The models are loaded once per process (PyMuPDF keeps them) and reused by every document.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

SPINNING = "session.intra_op.allow_spinning"  # onnxruntime's session option: idle threads spin ("1") or sleep
PAGE_BATCH = 8  # pages per call of the image network (each page's output is ~60 MB of float32)
OCR_DPI = 300
OCR_LANGUAGE = "eng"


@dataclasses.dataclass
class _Region:
    """One layout region of a page, in the page's reading order."""

    cls: str
    bbox: List[float]
    text: str
    order: int
    table_md: str = ""


def limit_layout_threads(threads: int) -> None:
    """Makes the onnxruntime sessions this process creates from now on (PyMuPDF's layout and table
    models) run on ``threads`` intra-op threads that sleep rather than spin when idle.

    onnxruntime's default is a spinning thread per core, each pinned by onnxruntime itself to a core, so
    the process affinity an ingestion worker is given does not hold them: two workers on two cores then
    spin on each other's core and each parses 1.6x slower (RESULTS.md, "Scale: workers and processes").
    PyMuPDF builds its sessions without a way to pass options, so ``onnxruntime.InferenceSession`` is
    replaced in this process by a subclass that fills in options a caller left at their defaults.
    """
    import onnxruntime as ort

    threads = max(1, int(threads))
    _STATE["threads"] = threads
    base = getattr(ort.InferenceSession, "cdsjax_base", ort.InferenceSession)

    class LimitedSession(base):
        cdsjax_base = base

        def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
            options = sess_options if sess_options is not None else ort.SessionOptions()
            if options.intra_op_num_threads == 0:  # 0: onnxruntime's default, a thread per core
                options.intra_op_num_threads = threads
            if options.inter_op_num_threads == 0:
                options.inter_op_num_threads = 1
            try:
                options.get_session_config_entry(SPINNING)
            except RuntimeError:  # not set by the caller
                options.add_session_config_entry(SPINNING, "0")
            super().__init__(path_or_bytes, options, providers, provider_options, **kwargs)

    ort.InferenceSession = LimitedSession


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


_SETUP = threading.Lock()
_STATE: dict = {}
SPLIT_MIN_PAGES = 12  # a document this long is analysed by two processes at once (when two cores are free)
CHUNK_PAGES = 2  # pages this process or the helper claims at a time


def prepare_models(threads: Optional[int] = None) -> None:
    """Once per process, before PyMuPDF's models load: sleeping onnxruntime threads (``threads``, default the
    cores this process may use; a worker process sets its own share first) and page batching."""
    with _SETUP:
        if _STATE.get("ready"):
            return
        import onnxruntime as ort

        if not hasattr(ort.InferenceSession, "cdsjax_base"):  # a worker process already chose its share
            limit_layout_threads(threads or usable_cores())
        import pymupdf  # noqa: F401
        import pymupdf4llm  # noqa: F401  (activates pymupdf.layout: loads the models)
        from pymupdf.layout.onnx import ImageFeatureExtractorV1 as imf_module
        from pymupdf4llm.helpers import document_layout

        _install_batching(imf_module.ImageFeatureExtractorV1, document_layout)
        _STATE["ready"] = True


class PageBatcher:
    """Runs the image network of PyMuPDF's layout model on several pages of a document in one call.

    Stands in for the image network's onnxruntime session: :meth:`run` answers a call whose input was
    computed ahead (same bytes), otherwise passes the call on to the session.
    """

    def __init__(self, session, batch: int = PAGE_BATCH):
        self.session = session
        self.batch = max(1, int(batch))
        self.ready: Dict[bytes, list] = {}
        self.stats = dict(batched=0, single=0, calls=0)
        inputs = session.get_inputs()
        self.input_name = inputs[0].name
        self.size = (inputs[0].shape[3], inputs[0].shape[2])  # (width, height) of the network's input
        self.output_names = [o.name for o in session.get_outputs()]
        self.done: set = set()  # (document, page) already tried ahead

    def __getattr__(self, name):  # everything else is the session's
        return getattr(self.session, name)

    def run(self, output_names, feeds, run_options=None):
        if len(feeds) == 1:
            (x,) = feeds.values()
            hit = self.ready.pop(_digest(x), None)
            if hit is not None and list(output_names) == self.output_names:
                self.stats["batched"] += 1
                return hit
        self.stats["single"] += 1
        return self.session.run(output_names, feeds, run_options)

    def prefetch(self, page) -> None:
        """Before ``page`` is analysed: runs it and the next pages of its document in one call, unless done."""
        doc, start = page.parent, page.number
        key = (id(doc), start)
        if key in self.done or len(self.size) != 2 or not all(isinstance(v, int) for v in self.size):
            return
        pages = range(start, min(doc.page_count, start + self.batch))
        self.ready.clear()  # what is left of an earlier batch was not asked for
        inputs = [_network_input(doc[p], self.size) for p in pages]
        self.done.update((id(doc), p) for p in pages)
        if len(inputs) < 2:
            return  # one page: the model's own call does it
        outputs = self.session.run(self.output_names, {self.input_name: np.concatenate(inputs)})
        self.stats["calls"] += 1
        for i, x in enumerate(inputs):
            self.ready[_digest(x)] = [o[i:i + 1] for o in outputs]

    def forget(self) -> None:
        """Drops what was computed ahead (between documents)."""
        self.ready.clear()
        self.done.clear()


def _digest(x: np.ndarray) -> bytes:
    x = np.ascontiguousarray(x)
    return hashlib.blake2b(x.tobytes(), digest_size=16, person=str(x.shape).encode()[:16]).digest()


def _network_input(page, size) -> np.ndarray:
    """A page as the image network takes it: PyMuPDF's 72-dpi rendering, resized to the network's input,
    grey, scaled to [0, 1]; shape ``(1, 1, H, W)`` float32 (what the layout model itself computes per page)."""
    from pymupdf.layout.common_util import resize_image, to_gray

    pix = page.get_pixmap()
    img = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, pix.n)
    grey = to_gray(resize_image(img, size)).astype(np.float32)
    lo, hi = grey.min(), grey.max()
    grey = (grey - lo) / (hi - lo) if hi > lo else np.zeros_like(grey, dtype=np.float32)
    return grey[None, None]


def _install_batching(extractor_cls, document_layout) -> None:
    """Wraps the image-feature extractor's predict (its session becomes a :class:`PageBatcher`) and
    pymupdf4llm's per-page layout call (which names the page about to be analysed)."""
    if getattr(extractor_cls.predict, "cdsjax_wrapped", False):
        return
    original_predict = extractor_cls.predict
    original_layout = document_layout.get_layout_locked
    current = threading.local()

    def predict(self, page_img, aug_fetmap=None):
        if not isinstance(self._session, PageBatcher):
            self._session = PageBatcher(self._session)
            _STATE["batcher"] = self._session
        page = getattr(current, "page", None)
        if aug_fetmap is None and page is not None and _STATE.get("batch", False):
            self._session.prefetch(page)
        return original_predict(self, page_img, aug_fetmap=aug_fetmap)

    def get_layout_locked(page, **kwargs):
        current.page = page
        try:
            return original_layout(page, **kwargs)
        finally:
            current.page = None

    predict.cdsjax_wrapped = True
    extractor_cls.predict = predict
    document_layout.get_layout_locked = get_layout_locked


def set_page_batching(enabled: bool) -> None:
    """Turns page batching on or off (default) in this process: on this 2-core CPU a batch of pages through
    the image network took as long as the same pages one by one (RESULTS.md, "Ingestion: profile,
    floors and what changed"), so it is off unless asked for."""
    _STATE["batch"] = bool(enabled)


def batch_stats() -> dict:
    """How many pages found their image-network output ready (``batched``), ran alone (``single``), and how
    many batched calls ran (``calls``), in this process so far."""
    b = _STATE.get("batcher")
    return dict(b.stats) if b is not None else dict(batched=0, single=0, calls=0)


def layout_pages(doc, path: Path, on_pages: Optional[Callable[[int, List[List[_Region]]], None]] = None
                 ) -> List[List[_Region]]:
    """Runs pymupdf4llm's layout analysis; returns each page's regions in reading order.

    With two or more cores to itself (one process indexing, not one of several workers) a document of
    ``SPLIT_MIN_PAGES`` pages or more is analysed by this process and a helper process at once: this process
    takes the pages from the front, ``CHUNK_PAGES`` at a time, the helper from the back, until they meet, so
    neither waits for the other (the helper starts later: its imports and model load). pymupdf4llm analyses
    each page on its own (the one thing it carries across pages, the font sizes of headings, sets a markdown
    header level this parser does not read), so the regions are the same as from one process.

    ``on_pages(start, regions)``, if given, is called with each run of pages this process has analysed, in
    page order from page 0 (``regions`` of pages ``start, start + 1, ...``), while the helper still works;
    the pages it has not been called with are in the returned list only.
    """
    prepare_models()
    n = doc.page_count
    if n < SPLIT_MIN_PAGES or _STATE.get("threads", 1) < 2 or not _STATE.get("split", True):
        return _analyse(doc, None)
    try:
        helper = _acquire_helper(start=True)
        if helper is None:  # another thread of this process has the helper busy: one process does it all
            return _analyse(doc, None)
    except Exception:  # no helper here (e.g. inside a daemonic process): one process does it all
        _drop_helper()
        _STATE["split"] = False
        return _analyse(doc, None)
    try:
        try:
            helper.send_layout(str(path), n, int(_STATE.get("reserve", 0)))
        except Exception:
            _drop_helper()
            return _analyse(doc, None)
        head: List[List[_Region]] = []
        while True:  # meanwhile the helper analyses pages from the back
            pages = helper.claims.take_front(CHUNK_PAGES, n - helper.reserve)
            if pages is None:
                break
            regions = _analyse(doc, pages)
            if on_pages is not None:
                on_pages(len(head), regions)
            head.extend(regions)
        rest = helper.receive_layout()
    finally:
        helper.lock.release()
    if rest is None:  # the helper died or failed: this process does its pages itself
        _drop_helper()
        return head + _analyse(doc, range(len(head), n))
    for p in range(len(head), n):  # as pymupdf4llm leaves every page it analysed (crops are cut from these pages)
        doc[p].remove_rotation()
    return head + [rest[p] for p in range(len(head), n)]


def set_page_split(enabled: bool) -> None:
    """Turns the two-process analysis of long documents on (default) or off in this process."""
    _STATE["split"] = bool(enabled)


class _Claims:
    """Which pages of the document being split are still free: ``[front, back)``, claimed from the front by
    this process and from the back by the helper (an array in shared memory, under its lock); ``closed`` is set
    by this process when it has no pages left, so that a helper still loading takes none."""

    def __init__(self, ctx):
        self.array = ctx.Array("i", 3)  # front, back, closed

    def reset(self, n: int) -> None:
        with self.array.get_lock():
            self.array[0], self.array[1], self.array[2] = 0, n, 0

    def take_front(self, chunk: int, limit: Optional[int] = None):
        """The next ``chunk`` pages from the front, none at or past ``limit`` (None: none left to this process;
        when no page is left at all the claims are closed)."""
        with self.array.get_lock():
            front, back = self.array[0], self.array[1]
            stop = min(front + chunk, back, back if limit is None else limit)
            if stop <= front:
                if front >= back:
                    self.array[2] = 1
                return None
            self.array[0] = stop
            return range(front, stop)

    def take_back(self, chunk: int):
        """The next ``chunk`` pages from the back (None: none left, or this process closed the claims)."""
        with self.array.get_lock():
            front, back, closed = self.array[0], self.array[1], self.array[2]
            start = max(back - chunk, front)
            if closed or start >= back:
                return None
            self.array[1] = start
            return range(start, back)

    def helper_took(self, n: int) -> bool:
        """Whether the helper claimed pages (or pages are left for it to claim)."""
        with self.array.get_lock():
            return self.array[1] < n or self.array[0] < self.array[1]


class _Helper:
    """A daemonic process with the layout models loaded, analysing the pages it claims (kept for later
    documents). Daemonic, so whatever way this process ends it does not wait for the helper (a helper of a
    worker process, joined at exit, would otherwise wait for a request that never comes).

    Started with glibc's ``hugetlb`` tunable (:func:`cdsjax.io.memory.worker_environment`), as the parsing
    workers are: its large blocks come as 2 MB pages, far fewer page faults.
    """

    def __init__(self, threads: int, path: Optional[str] = None):
        import multiprocessing

        from cdsjax.io.memory import worker_environment

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.claims = _Claims(ctx)
        self.proc = ctx.Process(target=_helper_main, args=(child, threads, os.getpid(), self.claims, path),
                                daemon=True, name="cdsjax-layout-helper")
        extra = worker_environment()
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)  # the child is started with this process's environment
        try:
            self.proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        self.busy = False
        self.stale = 0  # replies to requests this process stopped waiting for
        self.lock = threading.Lock()  # held by the thread with a request out (layout, keywords, embedding)

    def send_layout(self, path: str, n: int, reserve: int = 0) -> None:
        """Opens the claims on the ``n`` pages of ``path`` (the last ``reserve`` left to the helper) and has
        the helper claim pages from the back."""
        self.drain()
        self.claims.reset(n)
        self.reserve = max(0, min(int(reserve), n))
        self.pages = n
        self.request(("layout", path, n, CHUNK_PAGES, _STATE.get("embedding")))

    def receive_layout(self):
        """``{page: regions}`` of the pages the helper analysed (perhaps none), or None when it failed or died.
        When the helper took no page it is not waited for (its empty reply is read later)."""
        if not self.claims.helper_took(self.pages):
            self.busy = False
            self.stale += 1
            return {}
        return self.receive()

    def drain(self) -> bool:
        """Reads the replies left unread without waiting; False when one has not come yet (the helper is
        still busy with it)."""
        while self.stale:
            try:
                if not self.conn.poll():
                    return False
                self.conn.recv()
            except (EOFError, OSError):
                return False
            self.stale -= 1
        return True

    def request(self, message: tuple) -> None:
        if self.busy or not self.drain():  # an earlier request was never received (an exception in between)
            raise RuntimeError("helper busy")
        self.conn.send(message)
        self.busy = True

    def receive(self):
        """The answer to the request sent, or None when the helper failed or died."""
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError):
            return None
        self.busy = False
        return value if ok else None

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            if self.proc.is_alive():
                self.proc.terminate()
            self.proc.join(timeout=10)


_HELPER_LOCK = threading.Lock()  # held while the helper is looked up, started or dropped


def _helper(path: Optional[str] = None) -> _Helper:
    """The helper, started now unless one is running (``path``: see :func:`_helper_main`)."""
    with _HELPER_LOCK:
        helper = _STATE.get("helper")
        if helper is None or not helper.proc.is_alive():
            _drop_helper()
            helper = _STATE["helper"] = _Helper(max(1, _STATE.get("threads", 2) // 2), path)
        return helper


def _acquire_helper(start: bool = False) -> Optional[_Helper]:
    """The helper, locked for one request by this thread (``helper.lock``; the caller releases it), or None
    when another thread has it or (unless ``start``) none is running idle here. With ``start`` a helper that
    died or was left busy is replaced."""
    with _HELPER_LOCK:
        helper = _STATE.get("helper")
        if helper is not None:
            if not helper.lock.acquire(blocking=False):
                return None
            if helper.proc.is_alive() and not helper.busy and helper.drain():
                return helper
            helper.lock.release()
            if not start:
                return None
            _drop_helper()
        if not start:
            return None
        helper = _STATE["helper"] = _Helper(max(1, _STATE.get("threads", 2) // 2))
        helper.lock.acquire()
        return helper


def _drop_helper() -> None:
    helper = _STATE.pop("helper", None)
    if helper is not None:
        helper.close()


def offer_embedding(info: dict, cache_dir: Optional[str]) -> None:
    """Lets the layout helper load the JAX note encoder of ``info`` (the index's embedder) once it has no pages
    left, with JAX's persistent compilation cache in ``cache_dir`` (None: none), so that
    :func:`embed_in_helper` finds it ready."""
    _STATE["embedding"] = (dict(info), None if cache_dir is None else str(cache_dir))


def embed_in_helper(texts: List[str], batch_size: int, compute) -> Optional[np.ndarray]:
    """Note embeddings of ``texts`` (``compute(texts)`` encodes here), half of them computed by the helper of
    :func:`layout_pages` with the same JAX encoder while this process computes the other half: the same vectors
    within float tolerance (the batches differ), in about half the time. The texts are split by length, every
    other one to each side, so both halves pad alike. None (nothing computed) when no helper is running here
    or no encoder was offered (:func:`offer_embedding`); the caller then encodes them all itself."""
    offer = _STATE.get("embedding")
    if offer is None or len(texts) < 2 * batch_size:
        return None
    helper = _acquire_helper()
    if helper is None:
        return None
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    mine, theirs = order[0::2], order[1::2]
    try:
        try:
            helper.request(("embed", [texts[i] for i in theirs], int(batch_size), offer))
        except Exception:
            _drop_helper()
            return None
        head = np.asarray(compute([texts[i] for i in mine]), np.float32)
        rest = helper.receive()
    finally:
        helper.lock.release()
    if rest is None or len(rest) != len(theirs):  # the helper failed or died: this process does the rest
        _drop_helper()
        rest = compute([texts[i] for i in theirs])
    rest = np.asarray(rest, np.float32)
    out = np.zeros((len(texts), head.shape[1]), np.float32)
    out[mine], out[theirs] = head, rest
    return out


def _helper_encoder(offer):
    """The helper's JAX note encoder for an :func:`offer_embedding` offer (loaded once)."""
    info, cache_dir = offer
    if cache_dir:
        from cdsjax.io.compilation_cache import enable_compilation_cache

        enable_compilation_cache(cache_dir)
    from cdsjax.io.query_encoder import QueryEncoder

    encoder = QueryEncoder.from_info(info)
    if encoder is None:
        raise RuntimeError("the embedder cannot be run by the JAX encoder")
    return encoder


def keywords_in_helper(texts: List[str], top: int, language: str, compute) -> Optional[List[List[str]]]:
    """YAKE keywords of ``texts`` (``compute(text)`` for one), the second half computed by the helper of
    :func:`layout_pages` while this process computes the first: the same keywords, in about half the time.
    None (nothing computed) when no helper is running here (documents too short to split, worker processes,
    one core); the caller then computes them all itself."""
    if len(texts) < 2:
        return None
    helper = _acquire_helper()  # (None also while the helper is busy with a request no one waits for)
    if helper is None:
        return None
    half = (len(texts) + 1) // 2
    try:
        try:
            helper.request(("keywords", list(texts[half:]), int(top), language))
        except Exception:
            _drop_helper()
            return None
        head = [compute(t) for t in texts[:half]]
        rest = helper.receive()
    finally:
        helper.lock.release()
    if rest is None or len(rest) != len(texts) - half:  # the helper failed or died: this process does the rest
        _drop_helper()
        rest = [compute(t) for t in texts[half:]]
    return head + rest


def prestart_helper(path, *, count_pages: bool = True) -> None:
    """Starts the helper of :func:`layout_pages` now if ``path`` is a document it will split (``cdsjax ask``
    on a new PDF calls this first), so that the helper's imports and model load overlap this process's
    instead of delaying the pages it takes. Does nothing for short or unreadable documents.

    ``count_pages=False`` starts the helper without opening the document here (without importing PyMuPDF
    first); the helper counts the pages itself and ends at once if the document is too short to split.
    """
    if not _STATE.get("split", True) or min(usable_cores(), _STATE.get("threads", 2)) < 2 \
            or _STATE.get("helper") is not None:
        return
    try:
        if count_pages:
            import pymupdf

            with pymupdf.open(path) as doc:
                if doc.page_count < SPLIT_MIN_PAGES:
                    return
        _helper(None if count_pages else str(path))
    except Exception:  # the document is checked and reported where it is parsed
        _drop_helper()


def stop_helper() -> None:
    """Stops the helper process of :func:`layout_pages` (if one was started); the next long document starts
    another."""
    _drop_helper()


def _helper_main(conn, threads: int, parent: int, claims: _Claims, path: Optional[str] = None) -> None:
    """The helper's loop: ``("layout", path, n, chunk)`` in: it claims ``chunk`` pages at a time from the back
    (:class:`_Claims`) and analyses them, ``(True, {page: regions})`` out; ``("keywords", texts, top,
    language)`` in, ``(True, keywords of each text)`` out; ``(False, reason)`` when it failed. With ``path``
    it first counts that document's pages and ends if there are too few to split."""
    try:  # Linux: the helper dies with its parent
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        return
    limit_layout_threads(threads)
    _STATE["split"] = False
    if path is not None:
        import pymupdf

        try:
            with pymupdf.open(path) as doc:
                if doc.page_count < SPLIT_MIN_PAGES:
                    return
        except Exception:
            return
    prepare_models(threads)
    import pymupdf

    preload = None  # a thread loading the JAX note encoder once the pages are done
    while True:
        try:
            kind, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if kind == "embed":
                texts, batch_size, offer = args
                if preload is not None:
                    preload.join()
                encoder = _helper_encoder(offer)
                out = (True, np.asarray(encoder.encode_documents(texts, batch_size=batch_size, prefix=False),
                                        np.float32))
            elif kind == "keywords":
                from cdsjax.io.keywords import extract_keywords

                texts, top, language = args
                out = (True, [extract_keywords(t, top=top, language=language) for t in texts])
            else:
                path, n, chunk, offer = args
                done: Dict[int, List[_Region]] = {}
                doc = None
                try:
                    while True:
                        pages = claims.take_back(chunk)
                        if pages is None:
                            break
                        if doc is None:
                            doc = pymupdf.open(path)
                        done.update(zip(pages, _analyse(doc, pages)))
                finally:
                    if doc is not None:
                        doc.close()
                out = (True, done)
                if offer is not None and preload is None:
                    # no pages left: the note encoder loads while the parent finishes the document
                    def load(offer=offer):
                        try:
                            _helper_encoder(offer)
                        except Exception:  # reported by the embed request that needs it
                            pass

                    preload = threading.Thread(target=load, daemon=True)
        except Exception as err:  # the parent does this work itself
            out = (False, f"{type(err).__name__}: {err}")
        conn.send(out)
        if preload is not None and preload.ident is None:
            preload.start()


def _analyse(doc, pages) -> List[List[_Region]]:
    """pymupdf4llm's analysis of ``pages`` (None: all) of ``doc``, as regions per page."""
    from pymupdf4llm.helpers import document_layout

    batcher = _STATE.get("batcher")
    try:
        # pymupdf4llm prints progress and OCR notices to stdout; keep our output clean.
        with contextlib.redirect_stdout(io.StringIO()):
            parsed = document_layout.parse_document(
                doc, pages=None if pages is None else list(pages), use_ocr=False, force_text=True,
                embed_images=False, write_images=False
            )
    finally:
        batcher = _STATE.get("batcher", batcher)
        if batcher is not None:
            batcher.forget()
    pages_out: List[List[_Region]] = []
    for page_layout in parsed.pages:
        regions = []
        for order, box in enumerate(page_layout.boxes):
            bbox = [float(box.x0), float(box.y0), float(box.x1), float(box.y1)]
            text = ""
            table_md = ""
            if box.textlines:
                spans = [s for line in box.textlines for s in line["spans"]]
                text = document_layout.get_plain_text(spans).strip()
            if box.boxclass == "table" and box.table:
                table_md = (box.table.get("markdown") or "").strip()
            regions.append(_Region(box.boxclass, bbox, text, order, table_md))
        pages_out.append(regions)
    return pages_out


@contextlib.contextmanager
def _quiet_stderr():
    """Silences file descriptor 2: Tesseract (C++) prints lines such as "Line cannot be recognized!!"."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def ocr_regions(page, *, start: int) -> List[_Region]:
    """The text blocks Tesseract reads on a page (PyMuPDF ``get_textpage_ocr``), as body regions."""
    with _quiet_stderr():
        textpage = page.get_textpage_ocr(dpi=OCR_DPI, full=True, language=OCR_LANGUAGE)
    regions = []
    for block in page.get_text("blocks", textpage=textpage, sort=True):
        x0, y0, x1, y1, text, _, kind = block[:7]
        text = " ".join(str(text).split())
        if kind == 0 and len(text) >= 3:
            regions.append(_Region("text", [float(x0), float(y0), float(x1), float(y1)], text, start + len(regions)))
    return regions
