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
from typing import Callable


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
