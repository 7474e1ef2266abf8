"""`k3trace scrub`: a copy of an SQLite export without the profiled machine's environment
and host data, safe to share or commit as a fixture. The input is never modified.

A report stores the environment and host in three places (../shared/nsys/README.md):
`META_DATA_CAPTURE` rows named *ENVIRONMENT*, `TARGET_INFO_SYSTEM_ENV` rows such as
`DeviceEnvironment` and `Hostname`, and environment strings in `StringIds` (whole blocks
`KEY=VALUE\\0KEY=VALUE...` and single entries). Besides those three, this removes the
host's process and thread lists, CPU sampling/OS-runtime rows, the working directory,
command-line paths, and the exporter's host, user and file paths.

Then every text value left, in every table and column (kernel names and NVTX texts
included), is swept (`redact`): the user and host names the report names are replaced
wherever they occur, as are the user part of POSIX and Windows home paths
(`/home/<user>/`, `/Users/<user>/`, `C:\\Users\\<user>\\`) and the value of environment-like
`KEY=VALUE` entries (an upper-case key: `HF_TOKEN=...`); process names keep only the
executable's file name. A name that carries none of these is left byte for byte.

GPU metrics (`--gpu-metrics-device`): only the DRAM metrics' samples are kept (the ones
k3trace reads; the other twenty-odd metrics are most of a report's rows), with their rows of
TARGET_INFO_GPU_METRICS; their copies as JSON texts in GENERIC_EVENTS go; TARGET_INFO_GPU
stays (it holds the DRAM peak). `window` trims the
samples further to a time range: `kernels` keeps those within 50 us of a kernel, copy or
memset, `(start_ns, end_ns)` those inside it; the trace's own rows are all kept (labels come
from the graph capture, which is outside the steps), so steps outside it read as uncovered.
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
from k3trace.ingest.normalize import DRAM_METRICS, METRIC_NAMES_TABLE, METRICS_TABLE
from k3trace.ingest.report import materialise

SCRUBBED = "[scrubbed]"
_ENV_IN_BLOCK = re.compile(rb"(?:^|\x00)[A-Za-z_][A-Za-z0-9_]*=")
# An environment-like entry: an upper-case key (HF_TOKEN, AWS_SECRET_ACCESS_KEY) not glued to
# a preceding word, its value up to whitespace or a separator.
_ENV_ENTRY = re.compile(rb"(?<![A-Za-z0-9_.$])([A-Z][A-Z0-9_]+)=(?!\[scrubbed\])[^\s\x00;,&'\"]+")
_HOME = re.compile(rb"(/home/|/Users/|/export/home/)(?!\[scrubbed\])[^/\s\x00'\"]+")
_WIN_HOME = re.compile(rb"([A-Za-z]:[\\/]+(?:Users|Documents and Settings)[\\/]+)(?!\[scrubbed\])[^\\/\s\x00'\"]+",
                       re.IGNORECASE)
# Metadata rows naming the user or the host, read before they are removed.
_IDENTITY_ROWS = ("%USER_NAME%", "%DISPLAY_NAME%", "%HOST%", "%USER%")
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


def _identities(con: sqlite3.Connection, tables: set[str]) -> set[bytes]:
    """User and host names the report itself names (metadata rows, home paths)."""
    found: set[bytes] = set()

    def add(value) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape")
        if isinstance(value, bytes):
            value = value.strip()
            # Too short or too generic to replace wherever it occurs.
            if len(value) >= 3 and value != SCRUBBED.encode() and not value.isdigit() and b"/" not in value:
                found.add(value)

    for table in ("META_DATA_CAPTURE", "META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables and {"name", "value"} <= _columns(con, table):
            for pattern in _IDENTITY_ROWS:
                for (v,) in con.execute(f'SELECT CAST(value AS BLOB) FROM "{table}" WHERE name LIKE ?', (pattern,)):
                    add(v)
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        for (v,) in con.execute("SELECT CAST(value AS BLOB) FROM TARGET_INFO_SYSTEM_ENV "
                                "WHERE CAST(name AS TEXT) IN ('Hostname', 'UserName')"):
            add(v)
    for (v,) in con.execute("SELECT CAST(value AS BLOB) FROM StringIds"):
        if isinstance(v, bytes):
            for m in _HOME.finditer(v):
                add(m.group(0)[len(m.group(1)):])
            for m in _WIN_HOME.finditer(v):
                add(m.group(0)[len(m.group(1)):])
    return found


def redactor(identities: set[bytes]):
    """The function applied to every text value: returns it unchanged when nothing in it
    needs scrubbing."""
    names = re.compile(rb"(?<![A-Za-z0-9])(?:" + b"|".join(re.escape(n) for n in sorted(identities, key=len, reverse=True))
                       + rb")(?![A-Za-z0-9])", re.IGNORECASE) if identities else None
    mark = SCRUBBED.encode()

    def redact(value):
        if not isinstance(value, (str, bytes)):
            return value
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        out = _HOME.sub(lambda m: m.group(1) + mark, raw)
        out = _WIN_HOME.sub(lambda m: m.group(1) + mark, out)
        out = _ENV_ENTRY.sub(lambda m: m.group(1) + b"=" + mark, out)
        if names is not None:
            out = names.sub(mark, out)
        if out == raw:
            return value
        return out.decode("utf-8", "surrogateescape") if isinstance(value, str) else out

    return redact


def _sweep(con: sqlite3.Connection, tables: set[str], identities: set[bytes]) -> int:
    """Redact every text or blob value of every table; process names keep their file name."""
    con.create_function("k3_redact", 1, redactor(identities), deterministic=True)
    con.create_function("k3_basename", 1, lambda v: re.split(r"[\\/]", v)[-1] if isinstance(v, str) else v,
                        deterministic=True)
    changed = 0
    for table in sorted(tables):
        if table.startswith("sqlite_"):
            continue
        for col in sorted(_columns(con, table)):
            changed += con.execute(
                f'UPDATE "{table}" SET "{col}" = k3_redact("{col}") WHERE typeof("{col}") IN (\'text\', \'blob\') '
                f'AND k3_redact("{col}") IS NOT "{col}"').rowcount
    if "PROCESSES" in tables and "name" in _columns(con, "PROCESSES"):
        changed += con.execute("UPDATE PROCESSES SET name = k3_basename(name) WHERE typeof(name) = 'text' "
                               "AND k3_basename(name) IS NOT name").rowcount
    return changed


#: `window="kernels"`: GPU-metrics samples this close to GPU work are kept (ns).
WINDOW_MARGIN_NS = 50_000
_GPU_WORK_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
#: A time range of GPU-metrics samples to keep: `kernels`, or (start, end) in the report's ns.
Window = str | tuple[int, int] | None


def parse_window(text: str | None) -> Window:
    """`--window`: `kernels`, or START_MS:END_MS on the report's clock."""
    if text is None or text == "kernels":
        return text
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d*)?)\s*:\s*(-?\d+(?:\.\d*)?)\s*", text)
    if match is None or float(match[1]) >= float(match[2]):
        raise ReportError(f"--window {text!r} is neither `kernels` nor START_MS:END_MS with START below END",
                          "pass e.g. --window kernels, or --window 40:50 (ms on the report's clock)")
    return round(float(match[1]) * 1e6), round(float(match[2]) * 1e6)


def _dram_only(con: sqlite3.Connection, tables: set[str]) -> int:
    """Drop every GPU-metrics sample but the DRAM metrics' (matched by name, as ingest does)."""
    if not {METRICS_TABLE, METRIC_NAMES_TABLE} <= tables:
        return 0
    patterns = [re.compile(p) for p in DRAM_METRICS.values()]
    keep = [(t, m) for t, m, name in con.execute(f"SELECT typeId, metricId, CAST(metricName AS TEXT) FROM "
                                                 f"{METRIC_NAMES_TABLE}")
            if isinstance(name, str) and any(p.search(name) for p in patterns)]
    if "GENERIC_EVENTS" in tables:
        # The same samples again, every metric of one sample in a JSON text (nsys writes both).
        con.execute(f"DELETE FROM GENERIC_EVENTS WHERE typeId IN (SELECT typeId FROM {METRIC_NAMES_TABLE})")
    con.execute("CREATE TEMP TABLE k3_dram (typeId INTEGER, metricId INTEGER)")
    con.executemany("INSERT INTO temp.k3_dram VALUES (?, ?)", keep)
    dropped = con.execute(f"DELETE FROM {METRICS_TABLE} WHERE NOT EXISTS (SELECT 1 FROM temp.k3_dram k WHERE "
                          f"k.typeId = {METRICS_TABLE}.typeId AND k.metricId = {METRICS_TABLE}.metricId)").rowcount
    con.execute(f"DELETE FROM {METRIC_NAMES_TABLE} WHERE NOT EXISTS (SELECT 1 FROM temp.k3_dram k WHERE "
                f"k.typeId = {METRIC_NAMES_TABLE}.typeId AND k.metricId = {METRIC_NAMES_TABLE}.metricId)")
    con.execute("DROP TABLE temp.k3_dram")
    return dropped


def _windowed(con: sqlite3.Connection, tables: set[str], window: Window) -> int:
    """Drop the GPU-metrics samples outside `window`."""
    if window is None or METRICS_TABLE not in tables:
        return 0
    if window == "kernels":
        spans = sorted((s - WINDOW_MARGIN_NS, e + WINDOW_MARGIN_NS) for t in _GPU_WORK_TABLES if t in tables
                       for s, e in con.execute(f'SELECT start, "end" FROM {t} WHERE start IS NOT NULL AND '
                                               '"end" IS NOT NULL'))
        merged: list[list[int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
    else:
        merged = [list(window)]
    con.execute("CREATE TEMP TABLE k3_window (lo INTEGER, hi INTEGER)")
    con.executemany("INSERT INTO temp.k3_window VALUES (?, ?)", merged)
    dropped = con.execute(f"DELETE FROM {METRICS_TABLE} WHERE NOT EXISTS (SELECT 1 FROM temp.k3_window w WHERE "
                          f"{METRICS_TABLE}.timestamp BETWEEN w.lo AND w.hi)").rowcount
    con.execute("DROP TABLE temp.k3_window")
    return dropped


def scrub_connection(con: sqlite3.Connection, window: Window = None) -> dict[str, int]:
    tables = _tables(con)
    if "StringIds" not in tables:
        raise ReportError("not an Nsight Systems SQLite export (no StringIds table)",
                          "export the report with `nsys export -t sqlite` first")
    identities = _identities(con, tables)
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
    if METRICS_TABLE in tables:
        done["GPU metric samples dropped"] = _dram_only(con, tables) + _windowed(con, tables, window)
    done["strings"] = _scrub_strings(con, tables)
    done["redacted values"] = _sweep(con, tables, identities)
    return done


def scrub(src: Path, dst: Path, tools: Tools = Tools(), window: Window = None) -> dict[str, int]:
    """Write a scrubbed SQLite copy of the report `src` (any form `load_report` reads) to
    `dst`, atomically; `dst` ending in .xz or .gz is compressed. `window`: the GPU-metrics
    samples kept (module docstring)."""
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
                    summary = scrub_connection(con, window)
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
