"""Read raw nsys export tables as Arrow-backed polars frames, from SQLite or a parquetdir.

SQLite is read through ADBC (Arrow-native, no Python row loop), opened read-only and
`immutable` so SQLite never creates a journal or WAL file beside the input. Text columns
are fetched as BLOBs: nsys writes whatever bytes the profiled program gave it (a 2022
export here carries a Latin-1 user name), and ADBC would otherwise hand back invalid
UTF-8 inside an Arrow string array.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import polars as pl

from k3trace.errors import ReportError


class TableSource(Protocol):
    def tables(self) -> frozenset[str]: ...

    def columns(self, table: str) -> frozenset[str]: ...

    def read(self, table: str, columns: Sequence[str], *, text: Sequence[str] = ()) -> pl.DataFrame:
        """The named columns of `table`; missing ones come back as nulls, text decoded."""
        ...


def decode_text(column: pl.Series) -> pl.Series:
    """Binary -> String, replacing invalid UTF-8 (rare: fall back to Python only then)."""
    if column.dtype == pl.String:
        return column
    try:
        return column.cast(pl.String)
    except pl.exceptions.ComputeError:
        values = [None if v is None else v.decode("utf-8", errors="replace") for v in column.to_list()]
        return pl.Series(column.name, values, dtype=pl.String)


@dataclass
class SqliteTables:
    path: Path
    _columns: dict[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        uri = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro&immutable=1"
        self._uri = uri
        try:
            with sqlite3.connect(uri, uri=True) as con:
                names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
                for name in names:
                    self._columns[name] = frozenset(r[1] for r in con.execute(f'PRAGMA table_info("{name}")'))
        except sqlite3.DatabaseError as exc:
            raise ReportError(
                f"{self.path.name} is not a readable SQLite database ({exc})",
                "export the report again with `nsys export -t sqlite` (the file may be truncated or corrupt)",
            ) from None

    def tables(self) -> frozenset[str]:
        return frozenset(self._columns)

    def columns(self, table: str) -> frozenset[str]:
        return self._columns.get(table, frozenset())

    def read(self, table: str, columns: Sequence[str], *, text: Sequence[str] = ()) -> pl.DataFrame:
        import adbc_driver_sqlite.dbapi as adbc

        present = self.columns(table)
        select = []
        for col in columns:
            if col not in present:
                select.append(f'NULL AS "{col}"')
            elif col in text:
                select.append(f'CAST("{col}" AS BLOB) AS "{col}"')
            else:
                select.append(f'"{col}"')
        query = f'SELECT {", ".join(select)} FROM "{table}"'
        try:
            with adbc.connect(self._uri) as con, con.cursor() as cur:
                cur.execute(query)
                frame = pl.from_arrow(cur.fetch_arrow_table())
        except Exception as exc:  # ADBC raises its own error types for corrupt pages
            raise ReportError(
                f"{self.path.name}: reading table {table} failed ({str(exc).splitlines()[0]})",
                "the export is truncated or corrupt; export the report again",
            ) from None
        assert isinstance(frame, pl.DataFrame)
        return frame.with_columns(decode_text(frame[c]) for c in text if c in frame.columns)


@dataclass
class ParquetDirTables:
    """`nsys export -t parquetdir`: one `<TABLE>.parquet` per table."""

    path: Path

    def __post_init__(self) -> None:
        self._files = {p.stem: p for p in self.path.glob("*.parquet")}

    def tables(self) -> frozenset[str]:
        return frozenset(self._files)

    def columns(self, table: str) -> frozenset[str]:
        if table not in self._files:
            return frozenset()
        return frozenset(pl.read_parquet_schema(self._files[table]))

    def read(self, table: str, columns: Sequence[str], *, text: Sequence[str] = ()) -> pl.DataFrame:
        present = self.columns(table)
        frame = pl.read_parquet(self._files[table], columns=[c for c in columns if c in present])
        missing = [pl.lit(None).alias(c) for c in columns if c not in present]
        return frame.with_columns(missing).select(columns) if missing else frame.select(columns)
