"""Open any report form as normalised frames: .nsys-rep, .qdstrm, SQLite, parquetdir, a
torch.profiler (Kineto) JSON trace, or any of those files gzip/xz/bz2-compressed.

Nothing is ever written beside the input: conversions (nsys export, QdstrmImporter,
decompression) happen in a private work folder, and the normalised frames are cached as
Parquet under the cache directory, keyed on the input's path, size, mtime and the schema
version. Every cache write is atomic (write to a temporary folder, then rename).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl

from k3trace.errors import ReportError
from k3trace.ingest import kineto, normalize, schema
from k3trace.ingest.tables import ParquetDirTables, SqliteTables

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
    source: str                      # the input's file name (never a full path)
    form: str                        # sqlite | parquetdir | nsys-rep | qdstrm | kineto (+compressed)
    export: dict[str, str] = field(default_factory=dict)

    @property
    def nsys_version(self) -> str:
        return self.export.get("EXPORT_PRODUCT_VERSION", "unknown")


@dataclass(frozen=True)
class Tools:
    """External programs, resolved by the CLI (the library reads no environment)."""

    nsys: str | None = None

    def qdstrm_importer(self) -> str | None:
        if self.nsys:
            # host-linux-x64/QdstrmImporter sits beside target-linux-x64/nsys in every layout.
            root = Path(self.nsys).resolve().parent.parent
            for candidate in (root / "host-linux-x64" / "QdstrmImporter", root / "QdstrmImporter"):
                if candidate.is_file():
                    return str(candidate)
        return shutil.which("QdstrmImporter")


def _no_progress(_: str) -> None:
    pass


def load_report(
    path: Path, *, cache_dir: Path | None = None, tools: Tools = Tools(), progress: Progress = _no_progress
) -> Trace:
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path.name}: no such file or folder", "check the path of the report")
    key = report_key(path)
    if cache_dir is not None:
        cached = _read_cache(cache_dir, key)
        if cached is not None:
            progress("cache hit")
            return cached
    with tempfile.TemporaryDirectory(prefix="k3trace-", dir=_work_root(cache_dir)) as work:
        trace = _convert(path, Path(work), tools, progress)
    if cache_dir is not None:
        progress("writing cache")
        _write_cache(cache_dir, key, trace)
    return trace


def _work_root(cache_dir: Path | None) -> str | None:
    if cache_dir is None:
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    return str(cache_dir)


def _convert(path: Path, work: Path, tools: Tools, progress: Progress) -> Trace:
    if kineto.looks_like_json(path):  # by content: Kineto traces come as .json, .json.gz, .pt.trace.json...
        progress("reading torch.profiler trace")
        frames, export, form = kineto.load(path)
        return Trace(**frames, source=path.name, form=form, export=export)
    readable, form = materialise(path, work, tools, progress)
    progress("reading parquetdir" if readable.is_dir() else "reading SQLite")
    tables = ParquetDirTables(readable) if readable.is_dir() else SqliteTables(readable)
    frames = normalize.normalise(tables, path.name)
    return Trace(**frames, source=path.name, form=form, export=normalize.export_metadata(tables))


def materialise(path: Path, work: Path, tools: Tools, progress: Progress = _no_progress) -> tuple[Path, str]:
    """A readable export of any report form: the SQLite file or parquetdir folder itself,
    or a conversion made inside `work` (never beside the input). Returns (path, form)."""
    label = path.name
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
            inner = work / path.stem
            try:
                with opener(path, "rb") as src, open(inner, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 22)
            except (OSError, EOFError, lzma.LZMAError) as exc:
                raise ReportError(f"{label}: cannot decompress ({exc})", "the file is truncated; copy it again") from None
            readable, form = materialise(inner, work, tools, progress)
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


def _read_cache(cache_dir: Path, key: str) -> Trace | None:
    folder = cache_dir / "traces" / key
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        frames = {name: pl.read_parquet(folder / f"{name}.parquet") for name in schema.TABLES}
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None  # a damaged entry is rebuilt, never trusted
    return Trace(**frames, source=meta["source"], form=meta["form"], export=meta["export"])


def _write_cache(cache_dir: Path, key: str, trace: Trace) -> None:
    root = cache_dir / "traces"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name in schema.TABLES:
            getattr(trace, name).write_parquet(tmp / f"{name}.parquet", compression="lz4", statistics=False)
        meta = {"source": trace.source, "form": trace.form, "export": trace.export}
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, root / key)
        except OSError:
            pass  # another process cached the same report first: keep theirs
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
