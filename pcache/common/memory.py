"""Process-wide allocator settings for the data path.

A remote read receives each read unit (8 MiB) into a new ``bytes`` object, which the reader
keeps (a whole-unit ``read()`` returns it without a copy). glibc's malloc serves such blocks
from mmap until a process has freed one, then raises its mmap threshold, up to 32 MiB, and its
trim threshold to twice that; until then every unit is a fresh mapping, and a heap whose top
holds more than the trim threshold is given back to the kernel, so the next units fault their
pages in again (and the kernel zeroes them): with four units of read-ahead half the pages of a
read were faulted, costing a quarter of the throughput. :func:`tune_malloc` sets, at start, the
values glibc's dynamic thresholds reach by themselves once a 32 MiB block has been freed
(``mallopt(3)``: ``M_MMAP_THRESHOLD`` 32 MiB, ``M_TRIM_THRESHOLD`` 64 MiB): up to 64 MiB free at
the top of an arena stays mapped, as it would in any long-running process that has handled a
large buffer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc derives from it

_lock = threading.Lock()
_done: bool | None = None


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds once per process (see the module docstring).

    Returns True when they are set (now or earlier), False where the C library is not glibc or
    refuses; never raises.
    """
    global _done
    with _lock:
        if _done is not None:
            return _done
        _done = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            logger.debug("no mallopt here (not glibc): allocator thresholds left as they are")
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        return _done
