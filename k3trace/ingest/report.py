"""Open any report form as normalised frames: .nsys-rep, .qdstrm, SQLite, parquetdir, a
torch.profiler (Kineto) JSON trace, or any of those files gzip/xz/bz2-compressed.

Nothing is ever written beside the input: conversions (nsys export, QdstrmImporter,
decompression) happen in a private work folder, and the normalised frames are cached as
Parquet under the cache directory, keyed on the input's path, size, mtime and the schema
version. Every cache write is atomic and every entry checked on read (cachefs.py).

Inputs are untrusted: only regular files and folders are opened (a FIFO or a device would
block), and decompression is streamed and capped (`Limits`) before anything is written in
full, so a small archive of zeros is refused early instead of filling the disk.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import stat
import subprocess
import tempfile
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl

from k3trace.errors import ReportError
from k3trace.ingest import cachefs, detached, kineto, normalize, schema
from k3trace.ingest.kineto import CUDA
from k3trace.ingest.tables import ParquetDirTables, SqliteTables
from k3trace.ingest.tools import Tools

Progress = Callable[[str], None]

_SQLITE_MAGIC = b"SQLite format 3\x00"
_COMPRESSED = {b"\x1f\x8b": gzip.open, b"\xfd7zXZ": lzma.open, b"BZh": bz2.open}


@dataclass(frozen=True)
class Trace:
    """One report's normalised frames (schema.TABLES) and what it was read from."""

    kernels: pl.DataFrame
    runtime: pl.DataFrame
    nvtx: pl.DataFrame
    graph_nodes: pl.DataFrame
    sync: pl.DataFrame
    gpus: pl.DataFrame
    streams: pl.DataFrame
    gpu_metrics: pl.DataFrame        # the DRAM metrics' samples, when recorded (else empty)
    source: str                      # the input's file name (never a full path)
    form: str                        # sqlite | parquetdir | nsys-rep | qdstrm | kineto (+compressed)
    export: dict[str, str] = field(default_factory=dict)
    findings: pl.DataFrame = field(default_factory=lambda: schema.empty("findings"))    # schema.FINDINGS
    rejected_kernels: pl.DataFrame = field(default_factory=lambda: schema.empty("rejected_kernels"))

    @property
    def nsys_version(self) -> str:
        return self.export.get("EXPORT_PRODUCT_VERSION", "unknown")

    @property
    def platform(self) -> str:
        """CUDA, or ROCm for a torch.profiler trace of HIP work (nsys records CUDA only)."""
        return self.export.get("PLATFORM", CUDA)


@dataclass(frozen=True)
class Limits:
    """Caps on what reading one report may cost (configurable: `[input]` in the config)."""

    max_decompressed_bytes: int = 64 << 30
    #: Output / input size of a compressed report, checked once the output passes
    #: `ratio_after_bytes` (nsys SQLite exports compress about 10x with xz).
    max_ratio: float = 200.0
    ratio_after_bytes: int = 256 << 20


def _no_progress(_: str) -> None:
    pass


def load_report(
    path: Path, *, cache_dir: Path | None = None, tools: Tools = Tools(), progress: Progress = _no_progress,
    limits: Limits = Limits(), writer: Executor | None = None,
) -> Trace:
    """The report's normalised frames, from the cache when it holds them. The cache entry
    of a converted report is written by `writer` when given (the caller waits for it, e.g.
    by leaving its `with` block: the analysis goes on meanwhile), else before returning."""
    path = Path(path)
    check_readable(path)
    key = report_key(path)
    if cache_dir is not None:
        cached = _read_cache(cache_dir, key)
        if cached is not None:
            progress("cache hit")
            return cached
    with work_folder(cache_dir) as work:
        trace = _convert(path, work, tools, progress, limits)
    if cache_dir is not None:
        progress("writing cache")
        if writer is not None:
            writer.submit(_write_cache, cache_dir, key, trace)
        else:
            _write_cache(cache_dir, key, trace)
    return trace


def check_readable(path: Path, what: str = "report") -> None:
    """A regular file or a folder, else ReportError (checked without opening it: a FIFO
    would block the open)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ReportError(f"{path.name}: no such file or folder", f"check the path of the {what}") from None
    except OSError as exc:
        raise ReportError(f"{path.name}: cannot be read ({exc.strerror})", f"check the path of the {what}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ReportError(f"{path.name} is {kind}, not a file", f"pass the {what} as a regular file")


class work_folder:
    """A private folder for conversions: under the cache directory when there is one (large
    exports land on its disk, and a killed run's leftovers are cleaned from there), else in
    the system's temporary folder. Removed on every exit path."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.root = cache_dir if cache_dir is not None and cache_dir.is_dir() else Path(tempfile.gettempdir())

    def __enter__(self) -> Path:
        cachefs.clean_leftovers(self.root)
        self.path = Path(tempfile.mkdtemp(prefix=cachefs.temp_name(".work-") + "-", dir=self.root))
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _convert(path: Path, work: Path, tools: Tools, progress: Progress, limits: Limits) -> Trace:
    if kineto.looks_like_json(path):  # by content: Kineto traces come as .json, .json.gz, .pt.trace.json...
        progress("reading torch.profiler trace")
        frames, export, form = kineto.load(path)
        return Trace(**frames, source=path.name, form=form, export=export)
    readable, form = materialise(path, work, tools, progress, limits)
    progress("reading parquetdir" if readable.is_dir() else "reading SQLite")
    tables = ParquetDirTables(readable) if readable.is_dir() else SqliteTables(readable)
    frames = normalize.normalise(tables, path.name)
    return Trace(**frames, source=path.name, form=form, export=normalize.export_metadata(tables))


def materialise(path: Path, work: Path, tools: Tools, progress: Progress = _no_progress,
                limits: Limits = Limits()) -> tuple[Path, str]:
    """A readable export of any report form: the SQLite file or parquetdir folder itself,
    or a conversion made inside `work` (never beside the input). Returns (path, form)."""
    label = path.name
    check_readable(path)
    if path.is_dir():
        if not (path / "StringIds.parquet").exists():
            raise ReportError(
                f"{label} is a folder but not an nsys parquetdir export (no StringIds.parquet)",
                "pass the folder `nsys export -t parquetdir` wrote, or a report file",
            )
        return path, "parquetdir"
    head = _head(path)
    if head.startswith(_SQLITE_MAGIC):
        return path, "sqlite"
    for magic, opener in _COMPRESSED.items():
        if head.startswith(magic):
            progress("decompressing")
            inner = work / (path.stem or "report")
            _decompress(path, inner, opener, limits)
            readable, form = materialise(inner, work, tools, progress, limits)
            return readable, "compressed " + form
    suffix = path.suffix.lower()
    if suffix in (".nsys-rep", ".qdrep"):
        return _export_sqlite(path, work, tools, progress), "nsys-rep"
    if suffix == ".qdstrm":
        importer = tools.qdstrm_importer()
        if importer is None:
            raise ReportError(
                f"{label} is a raw .qdstrm and no QdstrmImporter is at hand",
                "install Nsight Systems' host package (or set K3TRACE_NSYS to its nsys) and run again, "
                "or run `QdstrmImporter -i FILE.qdstrm` where one exists and pass the .nsys-rep",
            )
        progress("importing .qdstrm")
        local = work / path.name
        shutil.copyfile(path, local)  # the importer writes its .nsys-rep beside its input
        _run([importer, "-i", str(local)], label, "QdstrmImporter")
        rep = local.with_suffix(".nsys-rep")
        if not rep.exists():
            raise ReportError(f"{label}: QdstrmImporter made no report", "the .qdstrm is incomplete; record again")
        return _export_sqlite(rep, work, tools, progress), "qdstrm"
    raise ReportError(
        f"{label} is not a report k3trace can read",
        "pass an .nsys-rep, .qdstrm, SQLite export (.sqlite), a parquetdir export folder, "
        "or a torch.profiler trace (.json, .json.gz)",
    )


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(16)


def _decompress(path: Path, inner: Path, opener, limits: Limits) -> None:
    """Stream `path` into `inner`, refusing early: output that is no report form (its first
    bytes), output past the size cap, or a ratio past the cap once the output is large."""
    label = path.name
    packed = max(path.stat().st_size, 1)
    written = 0
    try:
        with opener(path, "rb") as src, open(inner, "wb") as dst:
            first = True
            while block := src.read(1 << 22):
                if first:
                    first = False
                    opaque = inner.suffix.lower() in (".nsys-rep", ".qdrep", ".qdstrm")
                    if not opaque and not block.startswith((_SQLITE_MAGIC, *_COMPRESSED)):
                        raise ReportError(f"{label} decompresses to something that is not a report",
                                          "pass a compressed SQLite export, .nsys-rep or .qdstrm")
                written += len(block)
                if written > limits.max_decompressed_bytes:
                    raise ReportError(
                        f"{label} decompresses to more than {limits.max_decompressed_bytes / 2**30:.3g} GiB",
                        "decompress it yourself if it is genuine, or raise [input] max_decompressed_gib in a --config file")
                if written > limits.ratio_after_bytes and written / packed > limits.max_ratio:
                    raise ReportError(
                        f"{label} expands more than {limits.max_ratio:g} times (a decompression bomb?)",
                        "decompress it yourself if it is genuine, or raise [input] max_compression_ratio in a --config file")
                dst.write(block)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise ReportError(f"{label}: cannot decompress ({exc})", "the file is truncated; copy it again") from None


def _export_sqlite(rep: Path, work: Path, tools: Tools, progress: Progress) -> Path:
    if tools.nsys is None:
        raise ReportError(
            f"{rep.name} needs `nsys export` and no nsys was found",
            "put nsys on PATH or set K3TRACE_NSYS, or pass an export made with `nsys export -t sqlite`",
        )
    progress("nsys export")
    out = work / (rep.stem + ".sqlite")
    _run([tools.nsys, "export", "-t", "sqlite", "-f", "true", "-o", str(out), str(rep)], rep.name, "nsys export")
    if not out.exists():
        raise ReportError(f"{rep.name}: nsys export wrote no SQLite file", "check the report opens in Nsight Systems")
    return out


def _run(cmd: list[str], label: str, what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=3600)
    except OSError as exc:
        raise ReportError(f"{label}: cannot run {what} ({exc})", "check the nsys installation") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ReportError(f"{label}: {what} failed ({last[0]})", "check that the report is complete and opens in Nsight Systems")


# -- cache -------------------------------------------------------------------------------

def report_key(path: Path) -> str:
    """The cache key of a report: its resolved path, size, mtime and the schema version."""
    st = path.stat()
    size = st.st_size if path.is_file() else sum(p.stat().st_size for p in path.glob("*.parquet"))
    ident = f"{path.resolve()}|{size}|{st.st_mtime_ns}|schema{schema.SCHEMA_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


#: Trace cache entry layout version (with schema.SCHEMA_VERSION in the key). 3: the export
#: metadata names the platform (a Kineto trace of HIP work infers no PDL), and mangled HIP
#: kernel names are shortened. 4: the DRAM metrics' samples, and the GPUs' DRAM peak.
CACHE_FORMAT = 4


def _frames() -> dict[str, pl.Schema]:
    return {**schema.TABLES, **schema.EXTRA}


def _read_cache(cache_dir: Path, key: str) -> Trace | None:
    folder = cache_dir / "traces" / key
    entry = cachefs.read_entry(folder, CACHE_FORMAT)
    if entry is None:
        return None
    try:
        meta = entry["meta"]
        frames = {name: pl.read_parquet(folder / f"{name}.parquet") for name in _frames()}
        if any(frames[name].schema != want for name, want in _frames().items()):
            raise ValueError("schema changed")
        trace = Trace(**frames, source=str(meta["source"]), form=str(meta["form"]),
                      export={str(k): str(v) for k, v in dict(meta["export"]).items()})
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        cachefs.discard(folder)  # a damaged entry is rebuilt, never trusted
        return None
    return trace


def _write_cache(cache_dir: Path, key: str, trace: Trace) -> None:
    writers = {f"{name}.parquet": detached.Frame(getattr(trace, name), "parquet") for name in _frames()}
    meta = {"source": trace.source, "form": trace.form, "export": trace.export}
    cachefs.write_entry(cache_dir / "traces" / key, writers, meta, CACHE_FORMAT)
