"""A long document's layout analysis split over this process and a helper process, and the helper's other work.

:func:`layout_pages` runs :mod:`cdsjax.io.parse.layout`'s analysis of a document; with two cores to itself a
document of ``SPLIT_MIN_PAGES`` pages or more is analysed by this process and a helper process at once, each
claiming pages (:class:`_Claims`: this process from the front, the helper from the back) until they meet. The
helper, a daemonic process with the layout models loaded, is kept for later documents; meanwhile it also
computes a document's YAKE keywords with this process, claiming texts the same way
(:func:`keywords_in_helper`). ``cdsjax ask NEW.pdf`` starts it before anything else (:func:`prestart_helper`),
so its imports and model load overlap this process's, and it starts on the document's pages without waiting
for this process's request (:func:`_claim_early`). Every result is the one this process would compute.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional

from cdsjax.io.child import kill_with_parent, parent_alive, stop
from cdsjax.io.parse.layout import (Region, TextLayer, analyse_pages, import_pymupdf, layout_threads,
                              limit_layout_threads, prepare_models, read_text_layer)
from cdsjax.io.util import usable_cores

SPLIT_MIN_PAGES = 12  # a document this long is analysed by two processes at once (when two cores are free)
CHUNK_PAGES = 2  # pages this process or the helper claims at a time


def layout_pages(doc, path: Path, on_pages: Optional[Callable[[int, List[List[Region]]], None]] = None, *,
                 use_ocr: bool = False, text_layers: Optional[Dict[int, TextLayer]] = None, split: bool = True,
                 helper: Optional["LayoutHelper"] = None) -> List[List[Region]]:
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

    The helper also probes the text layer of each page it analysed and reads it with OCR when it has none and
    ``use_ocr`` (:func:`cdsjax.io.parse.layout.read_text_layer`): those pages' results go into ``text_layers``
    (``{page: TextLayer}``), so that a scanned document's OCR, the costliest step on its pages, is shared by
    both processes. The caller probes the other pages itself.

    ``split=False`` has this process analyse every page (a setting of the caller, e.g. a profile of one process
    alone); ``helper`` is the :class:`LayoutHelper` that holds the helper process (:data:`HELPER`, this
    process's, unless given).
    """
    prepare_models()
    holder = HELPER if helper is None else helper
    n = doc.page_count
    if n < SPLIT_MIN_PAGES or layout_threads() < 2 or not split or not holder.can_start:
        return analyse_pages(doc, None)
    try:
        helper = holder.acquire(start=True)
        if helper is None:  # another thread of this process has the helper busy: one process does it all
            return analyse_pages(doc, None)
    except Exception:  # no helper here (e.g. inside a daemonic process): one process does it all
        holder.drop()
        holder.can_start = False
        return analyse_pages(doc, None)
    try:
        try:
            helper.send_layout(str(path), n, int(holder.reserve), use_ocr=use_ocr)
        except Exception:
            holder.drop()
            return analyse_pages(doc, None)
        head: List[List[Region]] = []
        while True:  # meanwhile the helper analyses pages from the back
            pages = helper.claims.take_front(CHUNK_PAGES, n - helper.reserve)
            if pages is None:
                break
            regions = analyse_pages(doc, pages)
            if on_pages is not None:
                on_pages(len(head), regions)
            head.extend(regions)
        rest = helper.receive_layout()
    finally:
        helper.lock.release()
    if rest is None:  # the helper died or failed: this process does its pages itself
        holder.drop()
        return head + analyse_pages(doc, range(len(head), n))
    for p in range(len(head), n):  # as pymupdf4llm leaves every page it analysed (crops are cut from these pages)
        doc[p].remove_rotation()
    if text_layers is not None:
        text_layers.update((p, rest[p][1]) for p in range(len(head), n))
    return head + [rest[p][0] for p in range(len(head), n)]


class _Claims:
    """Which pages of the document being split are still free: ``[front, back)``, claimed from the front by
    this process and from the back by the helper (an array in shared memory, under its lock); ``closed`` is set
    by this process when it has no pages left, so that a helper still loading takes none."""

    def __init__(self, ctx):
        # front, back, closed, and who opened them: 0 nobody yet, -1 this process, n the helper ahead of the request
        self.array = ctx.Array("i", 4)

    def reset(self, n: int) -> None:
        with self.array.get_lock():
            self.array[0], self.array[1], self.array[2], self.array[3] = 0, n, 0, -1

    def open(self, n: int, keep_early: bool) -> None:
        """Opens the claims on a document of ``n`` pages for this process's request, keeping those the helper
        opened on it ahead of the request (``keep_early``: the document it was started for) and the pages it
        took since."""
        with self.array.get_lock():
            if not (keep_early and self.array[3] == n):
                self.array[0], self.array[1], self.array[2] = 0, n, 0
            self.array[3] = -1

    def open_early(self, n: int) -> bool:
        """The helper opens the claims on the ``n`` pages of the document it was started for, before this
        process's request; False when this process opened them already."""
        with self.array.get_lock():
            if self.array[3] != 0:
                return False
            self.array[0], self.array[1], self.array[2], self.array[3] = 0, n, 0, n
            return True

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

    def take_back(self, chunk: int, early: bool = False):
        """The next ``chunk`` pages from the back (None: none left, or this process closed the claims; with
        ``early``, also once this process opened them for its request)."""
        with self.array.get_lock():
            front, back, closed = self.array[0], self.array[1], self.array[2]
            start = max(back - chunk, front)
            if closed or start >= back or (early and self.array[3] < 0):
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

        from cdsjax.io.memory import started_with, worker_environment

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.claims = _Claims(ctx)
        self.proc = ctx.Process(target=_helper_main, daemon=True, name="cdsjax-layout-helper",
                                args=(child, threads, os.getpid(), self.claims, path, SPLIT_MIN_PAGES))
        self.early = None if path is None else os.path.realpath(path)  # the document it claims pages of ahead
        with started_with(worker_environment()):  # the child is started with this process's environment
            self.proc.start()
        child.close()
        self.busy = False
        self.stale = 0  # replies to requests this process stopped waiting for
        self.lock = threading.Lock()  # held by the thread with a request out (layout, keywords)

    def send_layout(self, path: str, n: int, reserve: int = 0, use_ocr: bool = False) -> None:
        """Opens the claims on the ``n`` pages of ``path`` (the last ``reserve`` left to the helper) and has
        the helper claim pages from the back (and read those without a text layer with OCR if ``use_ocr``)."""
        self.drain()
        early, self.early = self.early, None
        self.claims.open(n, keep_early=early is not None and early == os.path.realpath(path))
        self.reserve = max(0, min(int(reserve), n))
        self.pages = n
        self.request(("layout", path, n, CHUNK_PAGES, bool(use_ocr)))

    def receive_layout(self):
        """``{page: (regions, TextLayer)}`` of the pages the helper analysed (perhaps none), or None when it
        failed or died.
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
            stop(self.proc, timeout=10)


class LayoutHelper:
    """The layout helper process of this process (a :class:`_Helper`, ``current``; None until a long document or
    :meth:`prestart` starts one), kept for later documents, and the bookkeeping around it: ``lock``, held while
    the helper is looked up, started or dropped; ``can_start``, False once starting one failed here (inside a
    daemonic process: one process then does it all); ``reserve``, pages at the back of a document left to the
    helper (0; a test sets it so that the helper's path runs whatever the timing).

    The helper is a child of this process, reused by every document and index build it runs (``cdsjax ask
    NEW.pdf`` starts it before its build, ``serve`` keeps it between builds), so one object holds it per
    process: :data:`HELPER`, as :data:`cdsjax.io.memory.ALLOCATOR` holds the process's allocator. Whether a
    document is split is not decided here but by the caller (``layout_pages(split=...)``).
    """

    def __init__(self):
        self.current: Optional[_Helper] = None
        self.lock = threading.Lock()
        self.can_start = True
        self.reserve = 0

    def start(self, path: Optional[str] = None) -> _Helper:
        """The helper, started now unless one is running (``path``: see :func:`_helper_main`)."""
        with self.lock:
            helper = self.current
            if helper is None or not helper.proc.is_alive():
                self.drop()
                helper = self.current = _Helper(max(1, layout_threads(2) // 2), path)
            return helper

    def acquire(self, start: bool = False) -> Optional[_Helper]:
        """The helper, locked for one request by this thread (``helper.lock``; the caller releases it), or None
        when another thread has it or (unless ``start``) none is running idle here. With ``start`` a helper that
        died or was left busy is replaced."""
        with self.lock:
            helper = self.current
            if helper is not None:
                if not helper.lock.acquire(blocking=False):
                    return None
                if helper.proc.is_alive() and not helper.busy and helper.drain():
                    return helper
                helper.lock.release()
                if not start or (helper.proc.is_alive() and not helper.busy):
                    return None  # (a reply this process stopped waiting for is still to come: busy, not replaced)
                self.drop()
            if not start:
                return None
            helper = self.current = _Helper(max(1, layout_threads(2) // 2))
            helper.lock.acquire()
            return helper

    def drop(self) -> None:
        """Closes the helper (if one runs); the next long document starts another."""
        helper, self.current = self.current, None
        if helper is not None:
            helper.close()

    def keywords(self, texts: List[str], top: int, language: str, compute) -> Optional[List[List[str]]]:
        """YAKE keywords of ``texts`` (``compute(text)`` for one), computed by this process and the helper of
        :func:`layout_pages` at once: each claims texts (:class:`_Claims`), this process from the front and the
        helper from the back, until they meet, so neither waits for the other however long the texts or
        whoever starts later. The same keywords as computed here alone. None (nothing computed) when no helper
        is running here (documents too short to split, worker processes, one core); the caller then computes
        them all itself."""
        if len(texts) < 2:
            return None
        helper = self.acquire()  # (None also while the helper is busy with a request no one waits for)
        if helper is None:
            return None
        out: List[Optional[List[str]]] = [None] * len(texts)
        try:
            try:
                helper.claims.reset(len(texts))
                helper.request(("keywords", list(texts), int(top), language))
            except Exception:
                self.drop()
                return None
            while True:
                claimed = helper.claims.take_front(1)
                if claimed is None:
                    break
                for i in claimed:
                    out[i] = compute(texts[i])
            rest = helper.receive()
        finally:
            helper.lock.release()
        if isinstance(rest, dict):  # the texts the helper claimed (none of this process's: the claims are disjoint)
            for i, keywords in rest.items():
                out[i] = keywords
        else:  # the helper failed or died
            self.drop()
        return [compute(t) if k is None else k for t, k in zip(texts, out)]  # what the helper did not return

    def prestart(self, path, *, count_pages: bool = True) -> None:
        """Starts the helper of :func:`layout_pages` now if ``path`` is a document it will split (``cdsjax ask``
        on a new PDF calls this first), so that the helper's imports and model load overlap this process's
        instead of delaying the pages it takes; once loaded it starts on the document's pages from the back
        without waiting for this process (:func:`_claim_early`). Does nothing for short or unreadable documents.

        ``count_pages=False`` starts the helper without opening the document here (without importing PyMuPDF
        first); the helper counts the pages itself and ends at once if the document is too short to split.
        """
        if not self.can_start or min(usable_cores(), layout_threads(2)) < 2 or self.current is not None:
            return
        try:
            if count_pages:
                pymupdf = import_pymupdf()  # loads the layout models: their sessions limited first

                with pymupdf.open(path) as doc:
                    if doc.page_count < SPLIT_MIN_PAGES:
                        return
            self.start(str(path))
        except Exception:  # the document is checked and reported where it is parsed
            self.drop()

    def stop(self) -> None:
        """Stops the helper process (if one was started); the next long document starts another."""
        self.drop()


HELPER = LayoutHelper()  # this process's layout helper (see the class: one helper process per process)
keywords_in_helper = HELPER.keywords
prestart_helper = HELPER.prestart
stop_helper = HELPER.stop


def _claim_early(doc, claims: _Claims) -> Dict[int, tuple]:
    """The helper, started for ``doc`` before the parent asks for its layout (``cdsjax ask NEW.pdf``), opens the
    claims on it and analyses pages from the back while the parent is still importing: ``{page: (regions,
    TextLayer)}``, the text layers read without OCR (the request says whether to OCR). It stops when the parent
    sends its request (the request's loop goes on claiming) or no page is left; nothing when the parent opened
    the claims first."""
    done: Dict[int, tuple] = {}
    if not claims.open_early(doc.page_count):
        return done
    while True:
        pages = claims.take_back(CHUNK_PAGES, early=True)  # until the request comes: it goes on from there
        if pages is None:
            return done
        for p, regions in zip(pages, analyse_pages(doc, pages)):
            done[p] = (regions, read_text_layer(doc[p], start=len(regions), use_ocr=False))


def _helper_main(conn, threads: int, parent: int, claims: _Claims, path: Optional[str] = None,
                 min_pages: int = SPLIT_MIN_PAGES) -> None:
    """The helper's loop: ``("layout", path, n, chunk, use_ocr)`` in: it claims ``chunk`` pages at a
    time from the back (:class:`_Claims`), analyses them and reads their text layer
    (:func:`~cdsjax.io.parse.layout.read_text_layer`), ``(True, {page: (regions, TextLayer)})`` out;
    ``("keywords", texts, top, language)`` in: it claims texts one at a time from the back, ``(True, {index:
    keywords})`` out; ``(False, reason)`` when it failed. With ``path`` it first counts that document's pages
    and ends if there are fewer than ``min_pages`` (the parent's threshold to split), then analyses pages of it
    from the back before the request comes (:func:`_claim_early`)."""
    kill_with_parent()  # Linux: the helper dies with its parent
    if not parent_alive(parent):
        return
    limit_layout_threads(threads)
    HELPER.can_start = False  # the helper never starts a helper of its own
    path_started = path
    early_doc = None  # the document it was started for, open while it claims pages of it ahead of the request
    if path is not None:
        pymupdf = import_pymupdf(threads)

        try:
            early_doc = pymupdf.open(path)
            if early_doc.page_count < min_pages:
                return
        except Exception:
            return
    prepare_models(threads)
    pymupdf = import_pymupdf(threads)
    early: Dict[int, tuple] = {}  # {page: (regions, text layer read without OCR)} claimed ahead of the request
    if early_doc is not None:
        try:
            early = _claim_early(early_doc, claims)
        except Exception:  # whatever it claimed and did not finish, the parent's request finds unanswered
            early = None

    while True:
        try:
            kind, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if kind == "keywords":
                from cdsjax.io.keywords import extract_keywords

                texts, top, language = args
                found = {}
                while True:  # from the back, until the parent's claims from the front meet these
                    claimed = claims.take_back(1)
                    if claimed is None:
                        break
                    for i in claimed:
                        found[i] = extract_keywords(texts[i], top=top, language=language)
                out = (True, found)
            else:
                path, n, chunk, use_ocr = args
                done: Dict[int, tuple] = {}
                doc = None
                if early_doc is not None:  # the first request: is it for the document claimed ahead?
                    started, claimed, early_doc, early = early_doc, early, None, None
                    if os.path.realpath(path) == os.path.realpath(path_started) and started.page_count == n:
                        doc = started
                    else:  # another document: the parent opened the claims afresh
                        started.close()
                try:
                    if doc is not None:
                        if claimed is None:  # (its claims were kept: the parent analyses those pages itself)
                            raise RuntimeError("analysing pages ahead of the request failed")
                        for p, (regions, layer) in claimed.items():
                            if not layer.has_text and use_ocr:
                                layer = read_text_layer(doc[p], start=len(regions), use_ocr=True)
                            done[p] = (regions, layer)
                    while True:
                        pages = claims.take_back(chunk)
                        if pages is None:
                            break
                        if doc is None:
                            doc = pymupdf.open(path)
                        for p, regions in zip(pages, analyse_pages(doc, pages)):
                            done[p] = (regions, read_text_layer(doc[p], start=len(regions), use_ocr=use_ocr))
                finally:
                    if doc is not None:
                        doc.close()
                out = (True, done)
        except Exception as err:  # the parent does this work itself
            out = (False, f"{type(err).__name__}: {err}")
        conn.send(out)
