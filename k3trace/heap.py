"""Memory of an analysis' process: the allocators set up at a command's start, the
imports frozen before its analysis, and freed memory given back between its stages.

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

from k3trace import cores

#: polars' allocator (its own jemalloc, symbols prefixed `_rjem_`) reads its options from
#: this variable once, when polars loads.
JEMALLOC_OPTIONS = "_RJEM_MALLOC_CONF"
#: Freed pages kept ten seconds before they go back to the system, not handed back at once:
#: at millions of kernels polars frees and takes again hundreds of MB between the stages,
#: and every page it takes back from the system is a page fault. A cold analyze of 2.53M
#: kernels on 2 cores 5.71 -> 5.18 s (page faults 608k -> 502k, system time 3.1 -> 2.2 s;
#: peak 1667 -> 1813 MB), even at 421k (medians of 4 and 6, alternating). With more
#: threads each keeps its own pages: on 16 cores with 8 threads the peak grew 1.6-1.7 ->
#: 1.9-2.0 GB for no time measured, so only where the pool has few threads.
JEMALLOC_TUNING = "muzzy_decay_ms:10000"
KEEP_PAGES_UP_TO_THREADS = 2
#: polars' thread pool at most this large: more threads add memory, not speed. On 16
#: cores at 2.53M kernels, 16 threads 4.96-5.82 s and a peak of 2.8 GB, 8 threads
#: 4.81-5.94 s and 1.9-2.0 GB (two runs each; 4 threads 5.29-5.67 s, 1.8 GB).
MAX_POLARS_THREADS = 8
#: numpy's OpenBLAS starts a thread per extra core when numpy loads, each spinning about 2^28
#: cycles (its THREAD_TIMEOUT) waiting for work before it sleeps. k3trace makes no BLAS
#: call, so that is CPU taken from the analysis on every command that loads numpy: a cold
#: analyze of 2.53M kernels on 2 cores, user time 3.68 -> 3.58 s, 2.87 -> 2.79 s wall
#: (medians of 10, alternating, with OPENBLAS_NUM_THREADS=1 set outside).
OPENBLAS_THREADS = "OPENBLAS_NUM_THREADS"
#: glibc's mallopt parameter for the most arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8


def tune_allocator() -> None:
    """At a command's start, before polars loads and before any thread: polars' pool at
    most MAX_POLARS_THREADS threads, its allocator keeping freed pages a while where the
    threads are few (JEMALLOC_TUNING), and glibc's malloc serving every thread from its one
    main heap. The last for numpy's large arrays on the metric threads: from a thread's own
    arena (64 MB heaps) arrays past that size are mapped and unmapped each time, each page
    faulted in afresh; from the main heap they are reused. A cold analyze of 2.53M kernels
    5.73 -> 5.12 s (system time 2.76 -> 1.95 s, peak 1790 -> 1697 MB), of 421k kernels
    1.05 -> 0.97 s (2 cores, medians of 6 and 8, alternating, with MALLOC_ARENA_MAX=1, what
    this sets). And numpy's OpenBLAS without threads of its own (OPENBLAS_THREADS). Options
    the user set are left alone; polars' and numpy's too where they are loaded already."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(OPENBLAS_THREADS, "1")
    if "polars" not in sys.modules:
        threads = os.environ.setdefault(cores.POLARS_THREADS, str(min(cores.available(), MAX_POLARS_THREADS)))
        if threads.isdigit() and int(threads) <= KEEP_PAGES_UP_TO_THREADS:
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
