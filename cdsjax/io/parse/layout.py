"""PyMuPDF's layout analysis (pymupdf4llm) run for :mod:`cdsjax.io.parse`: page regions in reading order.

pymupdf4llm analyses a document page by page. On each page PyMuPDF's layout model renders the page, runs an
image-feature network (a small convolutional net, onnxruntime) on it, and a graph network over the page's
boxes; the layout model is the largest single cost of ingesting a PDF with a text layer (0.18 core-seconds a
page on a 2-core CPU), its networks about half of that. Two things here make it cheaper without changing what
it computes:

- **pages in batches** (:class:`PageBatcher`, off unless :func:`set_page_batching` turns it on, and wrapped into
  PyMuPDF only while on): before the model sees page ``n``, the images of pages ``n .. n + batch - 1`` are
  prepared the way the model prepares them and run through the image network in one call; each page's own call
  then finds its output ready. An output is used only for an input that is equal byte for byte to the one it
  was computed from (a page whose rendering changed meanwhile, e.g. a rotated page, runs on its own as before).
- **threads that sleep** (:class:`SessionLimits`): the models' onnxruntime sessions get a fixed number of
  intra-op threads that do not spin when idle, so the Python half of each page and the embedding of the
  previous document are not starved by spinning threads.

The models are loaded once per process (PyMuPDF keeps them) and reused by every document. A long document is
analysed by this process and a helper process at once: :mod:`cdsjax.io.parse.layout_split`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import threading
from typing import Callable, Dict, List, Optional

import numpy as np

from cdsjax.io.util import usable_cores

SPINNING = "session.intra_op.allow_spinning"  # onnxruntime's session option: idle threads spin ("1") or sleep
PAGE_BATCH = 8  # pages per call of the image network (each page's output is ~60 MB of float32)
OCR_DPI = 300
OCR_LANGUAGE = "eng"


@dataclasses.dataclass
class Region:
    """One layout region of a page, in the page's reading order."""

    cls: str
    bbox: List[float]
    text: str
    order: int
    table_md: str = ""


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    """The onnxruntime options cdsjax gives the sessions of PyMuPDF's layout and table models: ``threads``
    intra-op threads that sleep rather than spin when idle, one inter-op thread, and the memory arena back for
    models whose inputs have one fixed shape.

    onnxruntime's default is a spinning thread per core, each pinned by onnxruntime itself to a core, so
    the process affinity an ingestion worker is given does not hold them: two workers on two cores then
    spin on each other's core and each parses slower.

    PyMuPDF also turns onnxruntime's memory arena off for every session, so that a long-lived process's memory
    does not grow with the largest page it has seen. A model whose inputs have one fixed shape (apart from
    the batch), as the layout model's image network (one 300x300 page image, about 60 MB of outputs per
    page), needs the same buffers on every call, so the arena cannot grow there: it gets the arena back and
    keeps its buffers instead of mapping and faulting in fresh ones per page (the same outputs, bit for bit).
    Models with inputs of varying size keep PyMuPDF's setting.
    """

    threads: int

    def fill(self, options):
        """Fills in the options a caller left at onnxruntime's defaults (threads, inter-op threads, spinning);
        ``options`` is changed in place and returned."""
        if options.intra_op_num_threads == 0:  # 0: onnxruntime's default, a thread per core
            options.intra_op_num_threads = self.threads
        if options.inter_op_num_threads == 0:
            options.inter_op_num_threads = 1
        try:
            options.get_session_config_entry(SPINNING)
        except RuntimeError:  # not set by the caller
            options.add_session_config_entry(SPINNING, "0")
        return options

    @contextlib.contextmanager
    def installed(self):
        """While inside, ``onnxruntime.InferenceSession`` is a subclass that builds its sessions with these
        limits (:meth:`fill`, and the arena back for fixed-shape models); the original class is put back on
        leaving. PyMuPDF builds its sessions when it loads its models, with no way to pass options, so the
        models are loaded inside this."""
        import onnxruntime as ort

        with _SETUP:
            base = ort.InferenceSession
            limits = self

            class LimitedSession(base):
                def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None,
                             **kwargs):
                    options = limits.fill(sess_options if sess_options is not None else ort.SessionOptions())
                    super().__init__(path_or_bytes, options, providers, provider_options, **kwargs)
                    if not options.enable_cpu_mem_arena and fixed_input_shapes(self):
                        options.enable_cpu_mem_arena = True  # built again, keeping its buffers between calls
                        super().__init__(path_or_bytes, options, providers, provider_options, **kwargs)

            ort.InferenceSession = LimitedSession
            try:
                yield
            finally:
                ort.InferenceSession = base


@dataclasses.dataclass
class LayoutProcess:
    """What this process holds of PyMuPDF's layout analysis (PyMuPDF loads its models once per process):
    the session limits chosen for it (None until chosen), whether the loaded models run on them, whether the
    models are prepared (:func:`prepare_models`), whether page batching is on, the image network's
    :class:`PageBatcher` once the model has run with batching on, and the function that takes page batching
    out of PyMuPDF again while it is in (:func:`_install_batching`)."""

    limits: Optional[SessionLimits] = None
    models_limited: bool = False
    ready: bool = False
    batch: bool = False
    batcher: Optional["PageBatcher"] = None
    uninstall: Optional[Callable[[], None]] = None


def limit_layout_threads(threads: int) -> SessionLimits:
    """Chooses this process's share for the onnxruntime sessions of PyMuPDF's layout and table models loaded
    from now on (through :func:`import_pymupdf` / :func:`prepare_models`) and for the encoder's session
    (:func:`cdsjax.io.onnx_encoder.session`): ``threads`` intra-op threads that sleep when idle
    (:class:`SessionLimits`). Returns the limits."""
    PROCESS.limits = SessionLimits(max(1, int(threads)))
    return PROCESS.limits


def fixed_input_shapes(session) -> bool:
    """True when every input of an onnxruntime session has a fixed size in every dimension but the first
    (the batch)."""
    try:
        inputs = session.get_inputs()
    except Exception:
        return False
    return bool(inputs) and all(all(isinstance(d, int) and d > 0 for d in list(i.shape)[1:]) for i in inputs)


def layout_threads(default: int = 1) -> int:
    """The intra-op threads :func:`limit_layout_threads` chose for this process's sessions (``default`` before)."""
    return PROCESS.limits.threads if PROCESS.limits is not None else int(default)


_SETUP = threading.RLock()  # one loader of PyMuPDF's models at a time
PROCESS = LayoutProcess()  # this process's layout analysis (PyMuPDF holds its models per process)


def _chosen_limits(threads: Optional[int]) -> SessionLimits:
    """This process's limits: the share a worker process chose, else ``threads`` (default the usable cores)."""
    return PROCESS.limits or limit_layout_threads(threads or usable_cores())


def import_pymupdf(threads: Optional[int] = None):
    """``import pymupdf``; when this is the process's first import, PyMuPDF's layout models (which
    ``pymupdf.layout`` loads on import) are loaded with this process's :class:`SessionLimits` installed
    (:meth:`SessionLimits.installed`; ``threads`` default the cores this process may use, unless the process
    chose its share already).

    A process whose first ``import pymupdf`` came without the limits would run every page on onnxruntime's
    defaults: a spinning thread per core and no memory arena. Every import of PyMuPDF in cdsjax goes through
    here; :func:`prepare_models` loads the models again if someone else imported it first.
    """
    import sys

    if "pymupdf" not in sys.modules:
        with _SETUP:
            if "pymupdf" not in sys.modules:
                with _chosen_limits(threads).installed():
                    import pymupdf

                PROCESS.models_limited = True  # the import loaded the models with the limited sessions
    import pymupdf

    return pymupdf


def prepare_models(threads: Optional[int] = None) -> None:
    """Once per process, before PyMuPDF's models are used: sleeping onnxruntime threads (``threads``, default the
    cores this process may use; a worker process sets its own share first), and page batching where it is on
    (:func:`set_page_batching`). Where PyMuPDF was
    imported before cdsjax could limit its sessions (by the caller's own code), its layout models are loaded
    again with the limits installed."""
    with _SETUP:
        if PROCESS.ready:
            return
        limits = _chosen_limits(threads)
        import_pymupdf(threads)
        with limits.installed():
            import pymupdf4llm
            import pymupdf.layout.onnx.ImageFeatureExtractorV1  # noqa: F401 (loaded with the limits installed)
            import pymupdf4llm.helpers.document_layout  # noqa: F401

            if not PROCESS.models_limited:  # loaded on onnxruntime's defaults: load them again, limited
                # pymupdf4llm's switch: off drops the layout analyser PyMuPDF holds, on loads its models anew
                pymupdf4llm.use_layout(False)
                pymupdf4llm.use_layout(True)
                PROCESS.models_limited = True
        PROCESS.ready = True
        _apply_page_batching()


class PageBatcher:
    """Runs the image network of PyMuPDF's layout model on several pages of a document in one call.

    Stands in for the image network's onnxruntime session: :meth:`run` answers a call whose input was
    computed ahead (same bytes), otherwise passes the call on to the session.
    """

    def __init__(self, session, batch: int = PAGE_BATCH, stats: Optional[Dict[str, int]] = None):
        self.session = session
        self.batch = max(1, int(batch))
        self.ready: Dict[bytes, list] = {}
        self.stats = stats if stats is not None else dict(batched=0, single=0, calls=0)
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


def _install_batching(extractor_cls, document_layout) -> Callable[[], None]:
    """Wraps the image-feature extractor's predict (its session becomes a :class:`PageBatcher`) and
    pymupdf4llm's per-page layout call (which names the page about to be analysed). Returns the function
    that undoes both and gives each wrapped extractor its own session back."""
    original_predict = extractor_cls.predict
    original_layout = document_layout.get_layout_locked
    current = threading.local()
    wrapped = []  # the extractors whose session is a PageBatcher

    def predict(self, page_img, aug_fetmap=None):
        if not isinstance(self._session, PageBatcher):
            self._session = PageBatcher(self._session, stats=PROCESS.batcher.stats if PROCESS.batcher else None)
            PROCESS.batcher = self._session
            wrapped.append(self)
        page = getattr(current, "page", None)
        if aug_fetmap is None and page is not None:
            self._session.prefetch(page)
        return original_predict(self, page_img, aug_fetmap=aug_fetmap)

    def get_layout_locked(page, **kwargs):
        current.page = page
        try:
            return original_layout(page, **kwargs)
        finally:
            current.page = None

    def uninstall():
        extractor_cls.predict = original_predict
        document_layout.get_layout_locked = original_layout
        for extractor in wrapped:
            if isinstance(extractor._session, PageBatcher):
                extractor._session = extractor._session.session

    extractor_cls.predict = predict
    document_layout.get_layout_locked = get_layout_locked
    return uninstall


def _apply_page_batching() -> None:
    """Puts page batching into PyMuPDF's loaded models while it is on, and takes it out again while it is off
    (PyMuPDF's own methods back); nothing before the models are prepared."""
    with _SETUP:
        if not PROCESS.ready:
            return
        if PROCESS.batch and PROCESS.uninstall is None:
            from pymupdf.layout.onnx import ImageFeatureExtractorV1 as imf_module
            from pymupdf4llm.helpers import document_layout

            PROCESS.uninstall = _install_batching(imf_module.ImageFeatureExtractorV1, document_layout)
        elif not PROCESS.batch and PROCESS.uninstall is not None:
            PROCESS.uninstall()
            PROCESS.uninstall = None


def set_page_batching(enabled: bool) -> None:
    """Turns page batching on or off (default) in this process: on this 2-core CPU a batch of pages through
    the image network took as long as the same pages one by one, so it is off unless asked for. PyMuPDF's
    methods are wrapped only while it is on (:func:`page_batching` for a block)."""
    PROCESS.batch = bool(enabled)
    _apply_page_batching()


@contextlib.contextmanager
def page_batching():
    """Page batching on for the block, then off again with PyMuPDF's own methods back."""
    set_page_batching(True)
    try:
        yield
    finally:
        set_page_batching(False)


def batch_stats() -> dict:
    """How many pages found their image-network output ready (``batched``), ran alone (``single``), and how
    many batched calls ran (``calls``), in this process so far while page batching was on."""
    b = PROCESS.batcher
    return dict(b.stats) if b is not None else dict(batched=0, single=0, calls=0)


def analyse_pages(doc, pages) -> List[List[Region]]:
    """pymupdf4llm's analysis of ``pages`` (None: all) of ``doc``, as regions per page."""
    from pymupdf4llm.helpers import document_layout

    batcher = PROCESS.batcher
    try:
        # pymupdf4llm prints progress and OCR notices to stdout; keep our output clean.
        with contextlib.redirect_stdout(io.StringIO()):
            parsed = document_layout.parse_document(
                doc, pages=None if pages is None else list(pages), use_ocr=False, force_text=True,
                embed_images=False, write_images=False
            )
    finally:
        batcher = PROCESS.batcher or batcher
        if batcher is not None:
            batcher.forget()
    pages_out: List[List[Region]] = []
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
            regions.append(Region(box.boxclass, bbox, text, order, table_md))
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


@dataclasses.dataclass
class TextLayer:
    """What a page's text layer holds for the parser: whether it has one, and, when it has none and OCR is on,
    the regions Tesseract read (``ocr_failed`` when Tesseract failed on the page)."""

    has_text: bool
    ocr: List[Region] = dataclasses.field(default_factory=list)
    ocr_failed: bool = False


def read_text_layer(page, *, start: int, use_ocr: bool) -> TextLayer:
    """Probes ``page``'s text layer and, when it has none and ``use_ocr``, reads it with OCR (:func:`ocr_regions`,
    regions numbered from ``start``). Runs where the page was analysed: this process, or the layout helper for
    the pages it claimed (:mod:`cdsjax.io.parse.layout_split`), so a scanned document's OCR is shared by both."""
    if page.get_text("text").strip():
        return TextLayer(True)
    if not use_ocr:
        return TextLayer(False)
    try:
        return TextLayer(False, ocr_regions(page, start=start))
    except Exception:  # Tesseract failed on this page: it stays a page image
        return TextLayer(False, ocr_failed=True)


def ocr_regions(page, *, start: int) -> List[Region]:
    """The text blocks Tesseract reads on a page (PyMuPDF ``get_textpage_ocr``), as body regions."""
    with _quiet_stderr():
        textpage = page.get_textpage_ocr(dpi=OCR_DPI, full=True, language=OCR_LANGUAGE)
    regions = []
    for block in page.get_text("blocks", textpage=textpage, sort=True):
        x0, y0, x1, y1, text, _, kind = block[:7]
        text = " ".join(str(text).split())
        if kind == 0 and len(text) >= 3:
            regions.append(Region("text", [float(x0), float(y0), float(x1), float(y1)], text, start + len(regions)))
    return regions


def ocr_clip(page, rect) -> str:
    """The text Tesseract reads in ``rect`` of ``page`` (rendered at :data:`OCR_DPI`): one line per line read,
    whitespace collapsed, lines without a letter or digit (rules, specks of a photo) left out.

    The clip is rendered on its own and read through PyMuPDF's OCR of a pixmap (``Pixmap.pdfocr_tobytes``),
    the same Tesseract path as :func:`ocr_regions`, so a page's other content costs nothing.

    Raises:
      Exception: whatever PyMuPDF raises when Tesseract fails (the caller decides what a failure means).
    """
    pymupdf = import_pymupdf()
    pix = page.get_pixmap(clip=rect, dpi=OCR_DPI, alpha=False)
    with _quiet_stderr():
        data = pix.pdfocr_tobytes(language=OCR_LANGUAGE, tessdata=pymupdf.get_tessdata())
    with pymupdf.open("pdf", data) as read:
        text = read[0].get_text("text", sort=True)
    lines = (" ".join(line.split()) for line in text.splitlines())
    return "\n".join(line for line in lines if any(c.isalnum() for c in line))
