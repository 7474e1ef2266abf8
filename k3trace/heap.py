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
import gc
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


#: glibc's mallopt parameter for the most arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8


def tune_allocator() -> None:
    """At a command's start, before polars loads and before any thread: polars' allocator
    keeps freed pages a while, and glibc's malloc serves every thread from its one main
    heap. The latter for numpy's large arrays on the metric threads: from a thread's own
    arena (64 MB heaps) arrays past that size are mapped and unmapped each time, each page
    faulted in afresh; from the main heap they are reused. A cold analyze of 2.53M kernels
    5.73 -> 5.12 s (system time 2.76 -> 1.95 s, peak 1790 -> 1697 MB), of 421k kernels
    1.05 -> 0.97 s (medians of 6 and 8, alternating, with MALLOC_ARENA_MAX=1, what
    this sets). Options the user set are left alone; polars' too where it is already loaded."""
    if "polars" not in sys.modules:
        os.environ.setdefault(JEMALLOC_OPTIONS, JEMALLOC_TUNING)
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt = _mallopt()
        if mallopt is not None:
            mallopt(_M_ARENA_MAX, 1)


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


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


def freeze_imports() -> None:
    """Before a command's analysis, once it has imported what it runs: every object alive
    now (modules, classes, functions, about 200k of them with polars and numpy) is moved
    where the cyclic garbage collector no longer walks it (`gc.freeze`; reference counts
    still free them). The analysis allocates Python objects by the hundred thousand
    (polars expressions, numpy arrays, small frames), and each of the collections they
    trigger walked all of those imports again: a cold analyze of 2.53M kernels 8.65 -> 7.99
    CPU seconds of user time, 5.39 -> 5.19 s (medians of 6, alternating). For the command's
    own process only (a library caller's cycles among objects alive now would never be
    collected)."""
    gc.freeze()
