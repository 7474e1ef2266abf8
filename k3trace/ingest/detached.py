"""Cache entries finished by a detached writer: within `writes_detached()`, cachefs.write_entry
queues each entry instead of writing it, and leaving the block forks one process that writes
them all while the caller goes on (the command prints its answer and returns; the entry
appears a little later, atomically, as every entry does).

Why: at 373k kernels the two entries (the trace's Parquet frames, the analysis' Arrow IPC
frames) cost about 0.2 s of CPU to encode and compress, 0.1 s of it after the answer is
ready; a forked writer takes them off the command's wall time.

How, safely: the fork happens only where it cannot deadlock. polars' thread pool does not
survive a fork (its workers are not copied), so the child never calls polars: before the
fork each frame's columns are exported through Arrow's C data interface (no copy: the child
sees the same buffers, copy-on-write), and the child imports them with pyarrow, which this
process has not loaded (its pools start fresh in the child) and writes them as the same
formats polars reads back (frames of other column types are encoded by polars before the
fork). Where that cannot be done (no fork, pyarrow already loaded, or not installed) the
entries are written in this process when the block is left, as without it.

`wait()` waits for the writers this process started (tests and the bench scripts call it,
outside their timings, so that a writer never shares the cores with the next measured run).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class Frame:
    """One file of an entry that is a polars frame: Arrow IPC ("ipc") or Parquet
    ("parquet"), both lz4-compressed, Parquet without statistics."""

    frame: "pl.DataFrame"
    kind: str

    def __call__(self, path: Path) -> None:
        """Written by polars, in this process."""
        if self.kind == "ipc":
            self.frame.write_ipc(path, compression="lz4")
        else:
            self.frame.write_parquet(path, compression="lz4", statistics=False)


@dataclass(frozen=True)
class Entry:
    folder: Path
    writers: dict[str, Callable[[Path], None]]
    meta: dict[str, Any]
    fmt: int


def _frame_bytes(entry: Entry) -> int:
    return sum(w.frame.estimated_size() for w in entry.writers.values() if isinstance(w, Frame))


class _Session:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[Entry] | None = None
        self._children: list[int] = []
        self._held: list[Entry] | None = None   # within `hold`: entries kept for `release_held`
        self._held_limit = 0

    def active(self) -> bool:
        return self._queue is not None or self._held is not None

    def queue(self, entry: Entry) -> bool:
        """Queue the entry when a detached block is open, or hold it (True), else False."""
        with self._lock:
            if self._queue is not None:
                self._queue.append(entry)
                return True
            if self._held is None:
                return False
            self._held.append(entry)
            full = sum(map(_frame_bytes, self._held)) > self._held_limit
            if full:
                entries, self._held = self._held, []
        if full:  # past the memory they may keep: a writer for those held so far, now
            self._launch(entries)
        return True

    def hold(self, limit_bytes: int) -> None:
        with self._lock:
            if self._held is None:
                self._held = []
            self._held_limit = limit_bytes

    def release_held(self) -> None:
        with self._lock:
            entries, self._held = self._held or [], None
        if entries:
            self._launch(entries)

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        with self._lock:
            outermost = self._queue is None
            if outermost:
                self._queue = []
        if not outermost:  # inside another block: its exit writes
            yield
            return
        try:
            yield
        finally:
            with self._lock:
                entries, self._queue = self._queue, None
            if entries:
                self._launch(entries)

    def _launch(self, entries: list[Entry]) -> None:
        from k3trace.ingest import cachefs

        self._reap(block=False)
        prepared: list[tuple[Entry, dict[str, Callable[[Path], None]]]] = []
        pid = -1
        try:
            if can_fork():
                for e in entries:
                    prepared.append((e, {}))
                    for name, w in e.writers.items():
                        prepared[-1][1][name] = _Exported.of(w) if isinstance(w, Frame) else w
                for stream in (sys.stdout, sys.stderr):  # the answer out before the fork
                    with contextlib.suppress(Exception):
                        stream.flush()
                pid = os.fork()
        except Exception:  # noqa: BLE001 - any failure here: written in this process instead
            pid = -1
        if pid == 0:  # the writer: never returns into the caller's code
            code = 1
            try:
                _child(prepared)
                code = 0
            finally:
                os._exit(code)
        for _, writers in prepared:  # this process' references to the exported buffers
            for w in writers.values():
                if isinstance(w, _Exported):
                    w.release()
        if pid > 0:
            with self._lock:
                self._children.append(pid)
            return
        for e in entries:
            cachefs.write_entry(e.folder, e.writers, e.meta, e.fmt, detach=False)

    def _reap(self, block: bool) -> None:
        with self._lock:
            children = list(self._children)
        for pid in children:
            try:
                done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                with self._lock:
                    self._children.remove(pid)

    def wait(self) -> None:
        self._reap(block=True)


_session = _Session()


def writes_detached() -> contextlib.AbstractContextManager[None]:
    """Within the block, cache entries are queued; leaving it hands them to one forked
    writer and returns at once (nested blocks: the outermost one's exit)."""
    return _session.block()


def hold(limit_bytes: int) -> None:
    """From now on this process's cache entries are held, not written, until
    `release_held()` hands them all to one detached writer (or, once their frames pass
    `limit_bytes`, those held so far at once). For a process that analyses one report after
    another and whose caller waits for all of them: a rank worker, whose entries are
    written once the answer is ready, not between its analyses (the writes would take the
    CPU time the other workers' analyses wait for)."""
    _session.hold(limit_bytes)


def release_held() -> None:
    """The held entries to one detached writer (written here where none can be started)."""
    _session.release_held()


def queue(folder: Path, writers: dict[str, Callable[[Path], None]], meta: dict[str, Any], fmt: int) -> bool:
    """cachefs.write_entry's hook: True when the entry was queued for a detached writer."""
    return _session.queue(Entry(folder, dict(writers), meta, fmt))


def active() -> bool:
    """Whether a detached block is open (entries written now would only be queued)."""
    return _session.active()


def wait() -> None:
    """Wait for the detached writers this process started."""
    _session.wait()


def can_fork() -> bool:
    """A fork whose child can write frames without polars: on Linux (macOS's system
    libraries do not promise to survive a fork of a threaded process), pyarrow at hand but
    not loaded here (a loaded pyarrow's thread pools would not survive the fork either)."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and "pyarrow" not in sys.modules
            and importlib.util.find_spec("pyarrow") is not None)


# -- Arrow's C data interface --------------------------------------------------------------

class _ArrowSchema(ctypes.Structure):
    pass


_ArrowSchema._fields_ = [("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_char_p),
                         ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64),
                         ("children", ctypes.POINTER(ctypes.POINTER(_ArrowSchema))),
                         ("dictionary", ctypes.POINTER(_ArrowSchema)),
                         ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(_ArrowSchema))),
                         ("private_data", ctypes.c_void_p)]


class _ArrowArray(ctypes.Structure):
    pass


_ArrowArray._fields_ = [("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
                        ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
                        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
                        ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
                        ("dictionary", ctypes.POINTER(_ArrowArray)),
                        ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(_ArrowArray))),
                        ("private_data", ctypes.c_void_p)]


def _plain(dtype) -> bool:
    """Column types that go through pyarrow and come back from polars' readers as the
    same type (others are encoded by polars before the fork)."""
    import polars as pl

    return dtype in (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64, pl.Float32,
                     pl.Float64, pl.Boolean, pl.String)


class _Exported:
    """A Frame made ready for the child: each column chunk exported (array and schema
    structs that hold references to polars' buffers), or, for frames of other column
    types, the file's bytes encoded here by polars."""

    def __init__(self, kind: str, columns: list[tuple[str, list[tuple[_ArrowArray, _ArrowSchema]]]] | None,
                 encoded: bytes | None) -> None:
        self.kind, self.columns, self.encoded = kind, columns, encoded

    @classmethod
    def of(cls, w: Frame) -> "_Exported":
        frame = w.frame
        if (frame.width == 0 or not all(_plain(t) for t in frame.schema.dtypes())
                or any(s.n_chunks() == 0 for s in frame.get_columns())):
            buf = io.BytesIO()
            w(buf)  # type: ignore[arg-type]  (polars writes to a file object too)
            return cls(w.kind, None, buf.getvalue())
        columns = []
        for s in frame.get_columns():
            chunks = []
            for chunk in s.get_chunks():
                arr, sch = _ArrowArray(), _ArrowSchema()
                chunk._export_arrow_to_c(ctypes.addressof(arr), ctypes.addressof(sch))
                chunks.append((arr, sch))
            columns.append((s.name, chunks))
        return cls(w.kind, columns, None)

    def release(self) -> None:
        for _, chunks in self.columns or ():
            for arr, sch in chunks:
                if arr.release:
                    arr.release(ctypes.byref(arr))
                if sch.release:
                    sch.release(ctypes.byref(sch))
        self.columns = None

    def __call__(self, path: Path) -> None:
        """Written by pyarrow, in the child."""
        if self.encoded is not None:
            path.write_bytes(self.encoded)
            return
        import pyarrow as pa

        arrays = [pa.chunked_array([pa.Array._import_from_c(ctypes.addressof(a), ctypes.addressof(s))
                                    for a, s in chunks]) for _, chunks in self.columns]
        table = pa.table(arrays, names=[name for name, _ in self.columns])
        # Kept to the end: freeing them would run polars' release callbacks in the child.
        _KEPT.append(table)
        if self.kind == "ipc":
            import pyarrow.ipc

            with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(
                    fh, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as out:
                out.write_table(table)
        else:
            import pyarrow.parquet as pq

            # No dictionary pages: half the write's time (88 -> 42 ms for the kernels at 373k),
            # the same size; polars reads the file in 14-16 ms (its own: 9-10 ms).
            pq.write_table(table, str(path), compression="lz4", write_statistics=False, use_dictionary=False)


#: The child's imported tables (never freed: it exits without tearing anything down).
_KEPT: list[Any] = []


def _child(prepared: list[tuple[Entry, dict[str, Callable[[Path], None]]]]) -> None:
    """The detached writer: off the caller's terminal and process group, the entries
    written one after the other (cachefs's atomic write), then gone."""
    import gc

    gc.disable()  # nothing of the caller's is freed here (its polars objects least of all)
    # Off the caller's terminal and pipes: whoever reads the command's output (a shell's
    # pipe, a parent waiting for EOF) sees it end with the command, not with the writer.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, null)
    os.closerange(null + 1, 1 << 16)
    with contextlib.suppress(OSError):
        os.setsid()
    from k3trace.ingest import cachefs

    for entry, writers in prepared:
        cachefs.write_entry(entry.folder, writers, entry.meta, entry.fmt, detach=False)
