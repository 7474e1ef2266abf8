"""Checks on a raw export before it is normalised: the columns each table must have, and
the rows that cannot be trusted.

A missing or renamed column is bad input (one line, exit 2). Damaged rows are not: they are
counted by reason, excluded from the frames, and reported (`findings`), so an analysis of
the rest says what was left out instead of silently analysing it. Row reasons, first match
wins: an integer column holding something else, a NULL time or id, a negative time, an end
before its start, a name id with no string, and an exact duplicate of an earlier row.
"""

from __future__ import annotations

import re

import polars as pl

from k3trace.errors import ReportError
from k3trace.ingest import schema
from k3trace.ordering import has_repeats
from k3trace.ingest.tables import TRUNCATED, WRONG_TYPE, MAX_TEXT_BYTES, TableSource

# Each reads after a row count: "152 with no start or end time".
WRONG_TYPE_ISSUE = "with non-integer values in integer columns"
NULL_ISSUE = "with no start or end time"
NULL_ID_ISSUE = "with no stream, device, process or correlation id"
NEGATIVE_ISSUE = "with negative times"
INVERTED_ISSUE = "ending before they start"
DANGLING_ISSUE = "naming strings that are not in StringIds"
DUPLICATE_ISSUE = "duplicating another row"
NULL_SAMPLE_ISSUE = "with no timestamp or value"
NEGATIVE_VALUE_ISSUE = "with negative values"
TRUNCATED_ISSUE = f"with texts longer than {MAX_TEXT_BYTES // 1024} KiB, cut there"

#: Columns every export schema k3trace reads (nsys 2022.1 to 2026.2, export schema 2.9 to
#: 3.25) has, per table; a table that is absent altogether is handled by its reader.
REQUIRED = {
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "globalPid", "correlationId",
                                   "shortName", "demangledName", "graphNodeId", "gridX", "gridY", "gridZ",
                                   "blockX", "blockY", "blockZ"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId", "returnValue"),
    "NVTX_EVENTS": ("start", "end", "eventType", "text", "textId", "domainId", "globalTid"),
    "CUDA_GRAPH_NODE_EVENTS": ("start", "globalTid", "graphNodeId", "originalGraphNodeId", "nameId"),
    "CUDA_GRAPH_EVENTS": ("start", "globalTid", "graphNodeId", "originalGraphNodeId", "nameId"),
}
#: The GPU metrics' tables, optional beside the trace: one without these columns costs the
#: report its DRAM numbers (a finding), never the kernels' analysis (normalize.gpu_metrics).
OPTIONAL = {
    "GPU_METRICS": ("timestamp", "typeId", "metricId", "value"),
    "TARGET_INFO_GPU_METRICS": ("typeId", "metricId", "metricName"),
}
#: Columns a later export schema added: (table, column) -> first (major, minor) with it.
ADDED_IN = {("CUPTI_ACTIVITY_KIND_KERNEL", "graphId"): (3, 24)}


def schema_version(metadata: dict[str, str]) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", metadata.get("EXPORT_SCHEMA_VERSION", ""))
    return (int(match[1]), int(match[2])) if match else None


def check_columns(src: TableSource, label: str, version: tuple[int, int] | None) -> None:
    """Every column the export's schema version must have is there (else ReportError)."""
    needed = {table: list(cols) for table, cols in REQUIRED.items()}
    for (table, col), since in ADDED_IN.items():
        if version is not None and version >= since:
            needed[table].append(col)
    tables = src.tables()
    for table, cols in needed.items():
        if table not in tables:
            continue
        have = src.columns(table)
        missing = [c for c in cols if c not in have]
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            where = f"export schema {version[0]}.{version[1]}" if version else "every nsys export"
            raise ReportError(
                f"{label}: table {table} has no column {shown} ({where} has it: dropped or renamed?)",
                "export the report again with `nsys export -t sqlite` from the .nsys-rep; do not edit the export",
            )


def finding(table: str, issue: str, rows: int, total: int, excluded: bool = True) -> dict:
    return {"table": table, "issue": issue, "rows": int(rows), "total": int(total), "excluded": excluded}


def findings_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([r for r in rows if r["rows"]], schema=schema.FINDINGS)


def reasons(checks: list[tuple[str, pl.Expr]]) -> pl.Expr:
    """The first issue whose condition holds (null: the row is fine)."""
    expr = pl.lit(None, dtype=pl.String)
    for issue, bad in reversed(checks):
        expr = pl.when(bad.fill_null(True)).then(pl.lit(issue)).otherwise(expr)
    return expr


def interval_checks(ids: tuple[str, ...] = (), end_may_be_null: bool = False,
                    negative: bool = False) -> list[tuple[str, pl.Expr]]:
    """Row checks of a table with start/end times. Negative times are checked only where
    asked (GPU records): host-side events before the session started are real (an NVTX
    domain registered before nsys attached carries a negative time)."""
    start, end = pl.col("start"), pl.col("end")
    checks = [(WRONG_TYPE_ISSUE, pl.col(WRONG_TYPE) > 0)]
    checks.append((NULL_ISSUE, start.is_null() if end_may_be_null else start.is_null() | end.is_null()))
    if ids:
        checks.append((NULL_ID_ISSUE, pl.any_horizontal(pl.col(c).is_null() for c in ids)))
    if negative:
        checks.append((NEGATIVE_ISSUE, (start < 0) | (end.fill_null(0) < 0)))
    checks.append((INVERTED_ISSUE, end.fill_null(start) < start))
    return checks


def split(frame: pl.DataFrame, checks: list[tuple[str, pl.Expr]], table: str, *,
          duplicates_on: list[str] | None = None) -> tuple[pl.DataFrame, pl.DataFrame, list[dict]]:
    """(kept rows, excluded rows with `issue`, findings) of one raw table."""
    total = frame.height
    # The reason texts are worked out for the flagged rows only (over a whole table the
    # nested when/then of strings took twice its memory), and a clean table (the usual
    # case) is kept as it is: filtering would copy every column.
    flagged = frame.select(pl.any_horizontal(cond.fill_null(True) for _, cond in checks)).to_series()
    bad = frame.filter(flagged).with_columns(reasons(checks).alias("issue"))
    good = frame if bad.is_empty() else frame.filter(~flagged)
    # Rows equal on every column are equal on the first few (times, mostly distinct): when
    # those hold no repeat, there is no duplicate and the costly order-keeping unique is skipped.
    if duplicates_on and has_repeats(good, *duplicates_on[:3]):
        first = good.with_row_index("_row").unique(duplicates_on, keep="first", maintain_order=True)
        dup = good.with_row_index("_row").join(first.select("_row"), on="_row", how="anti").drop("_row")
        good = first.drop("_row")
        bad = pl.concat([bad, dup.with_columns(pl.lit(DUPLICATE_ISSUE).alias("issue"))])
    counts = bad.group_by("issue").len()
    found = [finding(table, issue, n, total) for issue, n in counts.sort("issue").iter_rows()]
    if TRUNCATED in frame.columns:
        found.append(finding(table, TRUNCATED_ISSUE, int((frame[TRUNCATED] > 0).sum()), total, excluded=False))
    drop = [c for c in ("issue", WRONG_TYPE, TRUNCATED) if c in good.columns]
    return good.drop(drop), bad, found
