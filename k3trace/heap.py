"""Freed memory given back to the system between the stages of an analysis.

numpy takes its large arrays from glibc's malloc. Once such an array (mmapped) is freed,
glibc raises its mmap threshold to that size, so later arrays of the size come from the
heap instead, and what they free there stays resident, counted in the process's peak,
until the heap is trimmed. A stage that leaves hundreds of MB of such arrays behind (the
critical path's scans at millions of kernels) trims once when it is done.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Callable

#: polars' allocator (its own jemalloc, symbols prefixed `_rjem_`) reads its options from
#: this variable once, when polars loads.
JEMALLOC_OPTIONS = "_RJEM_MALLOC_CONF"
#: Freed pages kept ten seconds before they go back to the system, not handed back at once:
#: at millions of kernels polars frees and takes again hundreds of MB between the stages,
#: and every page it takes back from the system is a page fault. A cold analyze of 2.53M
#: kernels 5.71 -> 5.18 s (page faults 608k -> 502k, system time 3.1 -> 2.2 s; peak
#: 1667 -> 1813 MB, 0.73 KiB per kernel), even at 421k (medians of 4 and 6, alternating).
JEMALLOC_TUNING = "muzzy_decay_ms:10000"


def tune_allocator() -> None:
    """Before polars loads (a command's start): its allocator keeps freed pages a while.
    Options the user set are left alone; so is a process where polars is already loaded."""
    if "polars" not in sys.modules:
        os.environ.setdefault(JEMALLOC_OPTIONS, JEMALLOC_TUNING)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim() -> None:
    """Return the free pages of malloc's heaps to the system (where malloc is glibc's)."""
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)
