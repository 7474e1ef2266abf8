"""How many cores one analysis may take: the machine's, or a rank worker's share of them.

An analysis spreads over the cores it may use (the SQLite tables read in parts on several
threads, the path and overlap metrics side by side, polars' own thread pool). Where
several analyses already fill the machine (`k3trace analyze` of several rank reports, one
worker process each; a diff's two sides, in threads of one process), that spreading only
adds CPU time (threads handing work over, part reads joined) that the other analyses would
have used: each keeps to its share.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

#: The cores one analysis in this process may use (unset: all of the machine's).
ENV = "K3TRACE_CORES"
#: polars sizes its thread pool from this once, when the pool first starts.
POLARS_THREADS = "POLARS_MAX_THREADS"


def available() -> int:
    """The cores this process's analysis may use."""
    share = os.environ.get(ENV, "")
    return int(share) if share.isdigit() and int(share) > 0 else os.cpu_count() or 1


class _Analyses:
    """How many reports this process analyses at once (a diff runs its sides in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self.count -= 1


#: `with analysing():` around each analysis of this process.
analysing = _Analyses()


def alone() -> bool:
    """Whether no other analysis runs in this process now."""
    return analysing.count <= 1


def per_analysis() -> int:
    """The cores each analysis running in this process now may spread over: the diff's
    two sides in threads split them, as rank workers do."""
    return max(1, available() // max(1, analysing.count))


@contextlib.contextmanager
def shared_by(workers: int) -> Iterator[int]:
    """Processes started within the block each analyse with their share of the cores
    (polars' pool included: it starts with the process, before any set-up code of ours)."""
    share = max(1, available() // max(1, workers))
    saved = {name: os.environ.get(name) for name in (ENV, POLARS_THREADS)}
    os.environ[ENV] = str(share)
    polars_threads = saved[POLARS_THREADS] or ""
    if not (polars_threads.isdigit() and 0 < int(polars_threads) <= share):
        os.environ[POLARS_THREADS] = str(share)
    try:
        yield share
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
