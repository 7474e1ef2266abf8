"""`k3trace scrub`: a copy of an SQLite export without the profiled machine's environment
and host data, safe to share or commit as a fixture. The input is never modified.

A report stores the environment and host in three places (../shared/nsys/README.md):
`META_DATA_CAPTURE` rows named *ENVIRONMENT*, `TARGET_INFO_SYSTEM_ENV` rows such as
`DeviceEnvironment` and `Hostname`, and environment strings in `StringIds` (whole blocks
`KEY=VALUE\\0KEY=VALUE...` and single entries). Besides those three, this removes the
host's process and thread lists, CPU sampling/OS-runtime rows, the working directory,
command-line paths, and the exporter's host, user and file paths.
"""

from __future__ import annotations

import gzip
import lzma
import os
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

from k3trace.errors import ReportError
from k3trace.ingest import Tools
from k3trace.ingest.report import materialise

SCRUBBED = "[scrubbed]"
_ENV_IN_BLOCK = re.compile(rb"(?:^|\x00)[A-Za-z_][A-Za-z0-9_]*=")
_HOST_ENV_ROWS = ("DeviceEnvironment", "Hostname", "TargetInstallDir", "InjectionFilesStoragePath", "CpuInfo")
_HOST_TABLES = ("OSRT_API", "OSRT_CALLCHAINS", "SCHED_EVENTS", "COMPOSITE_EVENTS", "SAMPLING_CALLCHAINS",
                "CUDA_CALLCHAINS", "PROFILER_OVERHEAD", "DIAGNOSTIC_EVENT")
# Columns that point into StringIds with text an analysis needs; every other string
# (host process names, log paths, environment entries) is replaced.
_STRING_REFERENCES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("shortName", "demangledName", "mangledName"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("nameId",),
    "NVTX_EVENTS": ("textId", "jsonTextId"),
    "CUDA_GRAPH_EVENTS": ("nameId",),
    "CUDA_GRAPH_NODE_EVENTS": ("nameId",),
    "ThreadNames": ("nameId",),
    "CUBLAS_EVENTS": ("nameId",),
    "CUDNN_EVENTS": ("nameId",),
}


def looks_like_environment(value: bytes, referenced: bool) -> bool:
    """A block of several KEY=VALUE entries, or any string nothing kept refers to."""
    if len(_ENV_IN_BLOCK.findall(value)) >= 2:
        return True
    return not referenced


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def _scrub_strings(con: sqlite3.Connection, tables: set[str]) -> int:
    referenced: set[int] = set()
    for table, cols in _STRING_REFERENCES.items():
        if table in tables:
            present = _columns(con, table)
            for col in (c for c in cols if c in present):
                referenced.update(r[0] for r in con.execute(f'SELECT DISTINCT "{col}" FROM "{table}" WHERE "{col}" IS NOT NULL'))
    doomed = [
        (SCRUBBED, sid)
        for sid, value in con.execute("SELECT id, CAST(value AS BLOB) FROM StringIds")
        if isinstance(value, bytes) and looks_like_environment(value, sid in referenced)
    ]
    con.executemany("UPDATE StringIds SET value = ? WHERE id = ?", doomed)
    return len(doomed)


def _profiled_pids(con: sqlite3.Connection, tables: set[str]) -> set[int]:
    pids: set[int] = set()
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        pids.update(r[0] for r in con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        pids.update(r[0] >> 24 << 24 for r in con.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
    return pids


def scrub_connection(con: sqlite3.Connection) -> dict[str, int]:
    tables = _tables(con)
    if "StringIds" not in tables:
        raise ReportError("not an Nsight Systems SQLite export (no StringIds table)",
                          "export the report with `nsys export -t sqlite` first")
    done: dict[str, int] = {}
    if "META_DATA_CAPTURE" in tables:
        done["capture env rows"] = con.execute(
            "DELETE FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").rowcount
        con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE name LIKE '%WORKING_DIR%' OR name LIKE '%USER_NAME%' "
                    "OR name LIKE '%DISPLAY_NAME%' OR value LIKE '%/%'", (SCRUBBED,))
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        marks = ",".join("?" * len(_HOST_ENV_ROWS))
        done["host rows"] = con.execute(
            f"DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE CAST(name AS TEXT) IN ({marks})", _HOST_ENV_ROWS).rowcount
    for meta in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if meta in tables:
            con.execute(f"UPDATE {meta} SET value = ? WHERE name LIKE '%HOST%' OR name LIKE '%USER%' "
                        "OR name LIKE '%PATH%' OR name LIKE '%FILE%'", (SCRUBBED,))
    pids = _profiled_pids(con, tables)
    if pids:
        keep = ",".join(str(p) for p in pids)
        if "PROCESSES" in tables:
            done["host processes"] = con.execute(f"DELETE FROM PROCESSES WHERE globalPid NOT IN ({keep})").rowcount
        if "ThreadNames" in tables and "globalTid" in _columns(con, "ThreadNames"):
            done["host threads"] = con.execute(
                f"DELETE FROM ThreadNames WHERE (globalTid >> 24 << 24) NOT IN ({keep})").rowcount
    for table in _HOST_TABLES:
        if table in tables:
            con.execute(f'DELETE FROM "{table}"')
    done["strings"] = _scrub_strings(con, tables)
    return done


def scrub(src: Path, dst: Path, tools: Tools = Tools()) -> dict[str, int]:
    """Write a scrubbed SQLite copy of the report `src` (any form `load_report` reads) to
    `dst`, atomically; `dst` ending in .xz or .gz is compressed."""
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise ReportError(f"{src.name}: no such file", "pass a report or its SQLite export")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ReportError("the output would overwrite the input", "pass a different -o path")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".k3trace-scrub-", dir=dst.parent) as work:
        readable, form = materialise(src, Path(work), tools)
        if readable.is_dir():
            raise ReportError(f"{src.name} is a parquetdir export", "scrub the .nsys-rep or its SQLite export instead")
        copy = Path(work) / "scrubbed.sqlite"
        shutil.copyfile(readable, copy)
        try:
            con = sqlite3.connect(copy)
            try:
                with con:
                    summary = scrub_connection(con)
                con.execute("VACUUM")
            finally:
                con.close()
        except sqlite3.DatabaseError as exc:
            raise ReportError(f"{src.name}: cannot scrub ({exc})", "the export is corrupt; export the report again") from None
        final = Path(work) / "out"
        opener = {".xz": lzma.open, ".gz": gzip.open}.get(dst.suffix.lower())
        if opener is None:
            os.replace(copy, final)
        else:
            with open(copy, "rb") as fin, opener(final, "wb") as fout:
                shutil.copyfileobj(fin, fout, length=1 << 22)
        os.replace(final, dst)
    return summary
