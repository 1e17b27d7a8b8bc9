"""How the ingestion processes ask the C allocator for memory.

Parsing a page (PyMuPDF's layout models on onnxruntime) and embedding a batch of notes (torch) allocate and
free blocks of tens to hundreds of megabytes many times over. glibc's ``malloc`` serves blocks above its
mmap threshold (at most 32 MB) straight from the kernel and gives them back on ``free``, so every such block
is faulted in again, 4 KB page by 4 KB page, the next time (~35,000 page faults per PDF page, measured). Two
remedies, each where it was measured to pay without holding memory:

- the parsing workers start with glibc's ``hugetlb`` tunable (:func:`worker_environment`): those blocks are
  faulted in as 2 MB transparent huge pages, 512 times fewer faults, at the same resident size;
- the indexing process, which with workers only embeds and writes, keeps its large freed blocks for reuse
  (:func:`keep_freed_memory`), hands them back after each document (:func:`release_freed_memory`), and
  stops keeping them when its workers are done (:func:`stop_keeping_freed_memory`). Parsing with blocks kept
  grew to 7-8 GB resident over the 41 dev PDFs (heap fragmentation), so a process never parses while it
  keeps them.

``CDSJAX_KEEP_FREED_MEMORY=0`` turns both off. Nothing computed depends on the allocator.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import Dict

OFF_VAR = "CDSJAX_KEEP_FREED_MEMORY"  # "0": leave the allocator as it is
HUGETLB = "glibc.malloc.hugetlb=1"  # malloc asks for transparent huge pages (madvise) for its memory
MMAP_MB = 1024  # blocks up to this size come from the heap
TRIM_MB = 1024  # free memory kept at the top of the heap before it is returned to the kernel

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>


def enabled() -> bool:
    """False with ``CDSJAX_KEEP_FREED_MEMORY=0`` or off Linux."""
    return os.environ.get(OFF_VAR, "1").strip() != "0" and sys.platform.startswith("linux")


def worker_environment() -> Dict[str, str]:
    """Environment variables for a parsing process to start with: glibc's ``hugetlb`` tunable (glibc >= 2.35;
    older or other C libraries ignore it), added to any ``GLIBC_TUNABLES`` already set. Empty when disabled."""
    if not enabled():
        return {}
    current = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in current:
        return {}
    return {"GLIBC_TUNABLES": ":".join(t for t in (current, HUGETLB) if t)}


@contextlib.contextmanager
def started_with(values: Dict[str, str]):
    """``os.environ`` with ``values`` set while processes are started (each reads it as it starts); restored
    after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Allocator:
    """This process's C allocator, and whether it keeps large freed blocks (:meth:`keep`).

    glibc's thresholds belong to the process and cannot be read back, so one object, :data:`ALLOCATOR`, records
    what cdsjax set; the module's functions are its methods.
    """

    def __init__(self):
        self.keeping = False

    def keep(self) -> bool:
        """Makes glibc's ``malloc`` in this process keep large freed blocks for reuse; True if it now does.

        For a process that does not parse PDFs (see the module docstring).

        A no-op returning False where the C library is not glibc (macOS, musl), or with
        ``CDSJAX_KEEP_FREED_MEMORY=0``. Only the allocator's thresholds change: nothing computed depends on it.
        Call :meth:`release` between documents. Safe to call more than once.
        """
        if self.keeping:
            return True
        if not enabled():
            return False
        try:
            libc = ctypes.CDLL(None)
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        # the trim threshold first: setting the mmap threshold alone would leave trimming at its dynamic value
        self.keeping = (bool(mallopt(_M_TRIM_THRESHOLD, TRIM_MB << 20))
                        and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_MB << 20)))
        return self.keeping

    def release(self) -> None:
        """Returns the free memory of every arena to the kernel (glibc ``malloc_trim``), where :meth:`keep` is in
        effect; otherwise does nothing."""
        if not self.keeping:
            return
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass

    def stop(self) -> None:
        """Undoes :meth:`keep` (where it is in effect) before this process parses again: hands the free memory
        back, and sets the thresholds glibc's own dynamic ones reach once 32 MB blocks have been freed (mmap
        32 MB, trim 64 MB; glibc cannot turn its dynamic adjustment back on)."""
        if not self.keeping:
            return
        self.release()
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        self.keeping = False

    @contextlib.contextmanager
    def kept(self):
        """:meth:`keep` for the duration of the block, undone after it (unless it was already in effect). For a
        stretch in which this process embeds and nothing parses: the encoder's large buffers are then reused
        instead of faulted in again for every batch."""
        started = not self.keeping and self.keep()
        try:
            yield
        finally:
            if started:
                self.stop()


ALLOCATOR = Allocator()  # the process's allocator: one per process, as the C library's is
keep_freed_memory = ALLOCATOR.keep
release_freed_memory = ALLOCATOR.release
stop_keeping_freed_memory = ALLOCATOR.stop
freed_memory_kept = ALLOCATOR.kept
