"""How the ingestion processes ask the C allocator for memory.

Parsing a page (PyMuPDF's layout models on onnxruntime) and embedding a batch of notes (torch) allocate and
free blocks of tens to hundreds of megabytes many times over. glibc's ``malloc`` serves blocks above its
mmap threshold (at most 32 MB) straight from the kernel and gives them back on ``free``, so every such block
is faulted in again, page by page, the next time (~35,000 page faults per PDF page, measured).
:func:`keep_freed_memory` raises the thresholds so that these blocks come from the heap and are reused
within a document, and :func:`release_freed_memory` hands the free memory back to the kernel after each
document (kept for good, the free blocks of every thread's arena added up to 6-8 GB over the 41 dev PDFs).
RESULTS.md, "Scale: workers and processes", has the measurement.
"""

from __future__ import annotations

import ctypes
import os
import sys

OFF_VAR = "CDSJAX_KEEP_FREED_MEMORY"  # "0": leave the allocator as it is
MMAP_MB = 1024  # blocks up to this size come from the heap
TRIM_MB = 1024  # free memory kept at the top of the heap before it is returned to the kernel

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
_done = False


def keep_freed_memory() -> bool:
    """Makes glibc's ``malloc`` in this process keep large freed blocks for reuse; True if it now does.

    A no-op returning False where the C library is not glibc (macOS, musl), or with
    ``CDSJAX_KEEP_FREED_MEMORY=0``. Only the allocator's thresholds change: nothing computed depends on it.
    Call :func:`release_freed_memory` between documents. Safe to call more than once.
    """
    global _done
    if _done:
        return True
    if os.environ.get(OFF_VAR, "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # the trim threshold first: setting the mmap threshold alone would leave trimming at its dynamic value
    _done = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_MB << 20)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_MB << 20))
    return _done


def release_freed_memory() -> None:
    """Returns the free memory of every arena to the kernel (glibc ``malloc_trim``), where
    :func:`keep_freed_memory` is in effect; otherwise does nothing."""
    if not _done:
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
