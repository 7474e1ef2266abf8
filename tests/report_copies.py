"""Altered copies of a fixture export for tests: SQL run on a copy, or the tables written out
as an nsys parquetdir (one <TABLE>.parquet per table, the same columns nsys writes)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl


def altered_copy(src: Path, dst: Path, statements) -> Path:
    """`dst`: a writable copy of `src` with each SQL statement applied in one transaction."""
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    with con:
        for statement in statements:
            con.execute(statement)
    con.close()
    return dst


def parquetdir_copy(src: Path, out: Path, tables, row_group_size: int | None = None) -> Path:
    """`out`: the named tables of SQLite export `src` as a parquetdir (read-only, immutable)."""
    import adbc_driver_sqlite.dbapi as adbc

    out.mkdir()
    with adbc.connect(f"file:{src}?mode=ro&immutable=1") as con, con.cursor() as cur:
        for table in tables:
            cur.execute(f"SELECT * FROM {table}")
            pl.from_arrow(cur.fetch_arrow_table()).write_parquet(out / f"{table}.parquet", row_group_size=row_group_size)
    return out
