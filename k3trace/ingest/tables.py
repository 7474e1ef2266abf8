"""Read raw nsys export tables as Arrow-backed polars frames, from SQLite or a parquetdir.

SQLite is read through ADBC (Arrow-native, no Python row loop), opened read-only and
`immutable` so SQLite never creates a journal or WAL file beside the input. Text columns
are fetched as BLOBs: nsys writes whatever bytes the profiled program gave it (a 2022
export here carries a Latin-1 user name), and ADBC would otherwise hand back invalid
UTF-8 inside an Arrow string array.

Every read is bounded and typed the same way in both forms: a text value longer than
`MAX_TEXT_BYTES` comes back cut there (a 64 MB kernel name must not take the machine's
memory), and a value of an integer column that is not an integer (a hand-edited or
damaged export) comes back null, with `WRONG_TYPE` / `TRUNCATED` counting them per row so
ingest can exclude and report the rows.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence

import polars as pl

from k3trace import cores
from k3trace.errors import ReportError

#: Text values are cut at this many bytes (names of 4 KiB are already far past any real one).
MAX_TEXT_BYTES = 4096
#: Per-row counts added by `read`: integer columns holding something else, text values cut.
WRONG_TYPE, TRUNCATED = "_wrong_type", "_truncated"
#: Columns packed into one integer by the source (`read(packed=...)`): per packed column,
#: its source columns with the bits each takes, the first one highest.
Packing = Mapping[str, Sequence[tuple[str, int]]]
#: Large tables are read in parts on up to this many threads, each part at least this many
#: rows (a part's connection and query set-up cost about as much as reading 10k rows).
MAX_READERS, MIN_ROWS_PER_READER = 4, 32768
#: `read(only=(column, values))`: only the rows whose integer `column` holds one of `values`
#: (the few GPU metrics k3trace reads of a table holding some twenty, one row each per sample).
RowFilter = tuple[str, Sequence[int]]


class TableSource(Protocol):
    def tables(self) -> frozenset[str]: ...

    def columns(self, table: str) -> frozenset[str]: ...

    def read(self, table: str, columns: Sequence[str], *, text: Sequence[str] = (),
             integers: Sequence[str] = (), packed: Packing = {}, only: RowFilter | None = None) -> pl.DataFrame:
        """The named columns of `table`; missing ones come back as nulls, text decoded and
        cut at MAX_TEXT_BYTES (TRUNCATED counts cut values per row), `integers` columns as
        Int64 with non-integer values nulled (WRONG_TYPE counts them per row). Each
        `packed` column, after those, holds its source columns in one Int64 (a source
        column costs a read as much as a kept one), and is null in a row where one of them
        is null, not an integer or past its bits (the caller reads them one by one then).
        `only`: the rows whose column (an integer one) holds one of the values, filtered
        where the rows are read (the rest never reach memory); none when it is missing."""
        ...


def packed_value(sources: Sequence[tuple[str, int]]) -> pl.Expr:
    """The packing of `read(packed=...)` in polars, for sources read as columns."""
    fits = pl.all_horizontal(pl.col(c).is_between(0, (1 << bits) - 1) for c, bits in sources)
    value = pl.lit(0, pl.Int64)
    for col, bits in sources:
        value = value * (1 << bits) + pl.col(col).cast(pl.Int64)
    return pl.when(fits).then(value)


def _packed_sql(sources: Sequence[tuple[str, int]], present: frozenset[str], checked: bool) -> str:
    """The same in SQLite: a non-integer value is refused by its type where `checked`, else
    by the result (text is past every number; a real makes the column real, which the
    fast read refuses)."""
    if any(c not in present for c, _ in sources):
        return "NULL"
    fits = " AND ".join((f"typeof(\"{c}\") = 'integer' AND " if checked else "")
                        + f'"{c}" BETWEEN 0 AND {(1 << bits) - 1}' for c, bits in sources)
    value = "0"
    for col, bits in sources:
        value = f'({value} * {1 << bits} + "{col}")'
    return f"CASE WHEN {fits} THEN {value} END"


def _only_sql(only: RowFilter | None, present: frozenset[str]) -> str:
    """`read(only=...)` as an SQL condition ("" for every row). A text value never equals an
    integer in SQLite: a damaged id is not read (it cannot be told to be one of `values`)."""
    if only is None:
        return ""
    col, values = only
    if col not in present or not values:
        return "0"
    return f'"{col}" IN ({", ".join(str(int(v)) for v in values)})'


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

    @staticmethod
    def _select(table: str, columns: Sequence[str], present: frozenset[str], text: Sequence[str],
                integers: Sequence[str], packed: Packing = {}) -> str:
        select, wrong, cut = [], [], []
        for col in columns:
            if col not in present:
                select.append(f'NULL AS "{col}"')
            elif col in text:
                blob = f'CAST("{col}" AS BLOB)'
                select.append(f'CASE WHEN length({blob}) > {MAX_TEXT_BYTES} THEN substr({blob}, 1, {MAX_TEXT_BYTES}) '
                              f'ELSE {blob} END AS "{col}"')
                cut.append(f'coalesce(length({blob}) > {MAX_TEXT_BYTES}, 0)')
            elif col in integers:
                # SQLite columns take any type: keep integers, count the rest per row.
                select.append(f'CASE WHEN typeof("{col}") = \'integer\' THEN "{col}" END AS "{col}"')
                wrong.append(f'(typeof("{col}") NOT IN (\'integer\', \'null\'))')
            else:
                select.append(f'"{col}"')
        for name, sources in packed.items():
            select.append(f'{_packed_sql(sources, present, checked=bool(integers))} AS "{name}"')
        if integers:
            select.append(f'({" + ".join(wrong) or "0"}) AS "{WRONG_TYPE}"')
        if text:
            select.append(f'({" + ".join(cut) or "0"}) AS "{TRUNCATED}"')
        return f'SELECT {", ".join(select)} FROM "{table}"'

    def _rowid_parts(self, table: str) -> list[str]:
        """Conditions cutting `table` into consecutive rowid ranges, one per reader: a
        large table is read on every core at once (SQLite and ADBC release the GIL), and the
        parts, concatenated in rowid order, are the rows of one full scan in its order."""
        readers = min(cores.per_analysis(), MAX_READERS)
        if readers < 2:
            return [""]
        try:
            with sqlite3.connect(self._uri, uri=True) as con:
                # One aggregate per query: SQLite reads min() or max() alone off the b-tree's
                # ends, but the two together by a full scan.
                low, high = con.execute(f'SELECT (SELECT min(rowid) FROM "{table}"), '
                                        f'(SELECT max(rowid) FROM "{table}")').fetchone()
        except sqlite3.DatabaseError:
            return [""]  # a WITHOUT ROWID table, or a damaged one: read whole (and fail there)
        if not (isinstance(low, int) and isinstance(high, int)) or high - low < MIN_ROWS_PER_READER * readers:
            return [""]
        cuts = [low + (high - low + 1) * i // readers for i in range(1, readers)]
        bounds = [None, *cuts, None]
        return [" AND ".join(([f"rowid >= {lo}"] if lo is not None else [])
                             + ([f"rowid < {hi}"] if hi is not None else []))
                for lo, hi in zip(bounds, bounds[1:])]

    def _query_part(self, table: str, query: str) -> pl.DataFrame:
        # ADBC's own driver manager, not its DB-API module: that one imports pyarrow (and its
        # dataset and compute modules, 0.1 s of every analyze's start-up) to hand over a
        # pyarrow table, where polars takes the driver's Arrow stream as it is.
        import adbc_driver_manager as adbc
        import adbc_driver_sqlite

        try:
            with (adbc_driver_sqlite.connect(self._uri) as db, adbc.AdbcConnection(db) as con,
                  adbc.AdbcStatement(con) as statement):
                # Fewer, larger Arrow batches than the driver's default 1024 rows: 6% faster.
                statement.set_options(**{adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value: "16384"})
                statement.set_sql_query(query)
                stream, _ = statement.execute_query()
                # Zero-copy, one chunk per batch: one contiguous copy of a large table would
                # double its peak memory.
                frame = pl.DataFrame(stream)
        except Exception as exc:  # ADBC raises its own error types for corrupt pages
            raise ReportError(
                f"{self.path.name}: reading table {table} failed ({str(exc).splitlines()[0]})",
                "the export is truncated or corrupt; export the report again",
            ) from None
        assert isinstance(frame, pl.DataFrame)
        return frame

    def _query(self, table: str, query: str, where: str = "") -> pl.DataFrame:
        parts = self._rowid_parts(table)

        def part(rowids: str) -> str:
            conditions = [c for c in (rowids, where) if c]
            return query + (" WHERE " + " AND ".join(conditions) if conditions else "")

        if len(parts) == 1:
            return self._query_part(table, part(parts[0]))
        try:
            with ThreadPoolExecutor(len(parts)) as pool:
                frames = list(pool.map(lambda rowids: self._query_part(table, part(rowids)), parts))
            # Each part is typed from its own values: a column all null in one part comes
            # back as Null there, which the relaxed concatenation widens to the others' type
            # (and mixed types to one the callers' type checks refuse, as a whole read's).
            return pl.concat(frames, how="vertical_relaxed", rechunk=False)
        except (ReportError, pl.exceptions.PolarsError):
            # A part failed: the whole read decides, so a damaged table fails (or reads) as
            # it always did, with the same message.
            return self._query_part(table, part(""))

    def read(self, table: str, columns: Sequence[str], *, text: Sequence[str] = (),
             integers: Sequence[str] = (), packed: Packing = {}, only: RowFilter | None = None) -> pl.DataFrame:
        present = self.columns(table)
        requested = [*columns, *packed]
        where = _only_sql(only, present)
        # Columns this export lacks are added as typed nulls afterwards, not selected as
        # NULL: a constant column costs SQLite and ADBC as much as a real one (10% of the
        # kernel table's read for nsys 2022-2025's missing graphId).
        missing = [c for c in columns if c not in present]
        if len(missing) < len(columns):
            columns = [c for c in columns if c in present]
        else:
            missing = []
        frame = None
        if integers:
            # Fast path: ADBC types each column from its values and fails on a column whose
            # values change type, so a read that comes back with integer columns holds no
            # other value (checking typeof() per value in SQL costs 3x the read).
            try:
                frame = self._query(table, self._select(table, columns, present, text, (), packed), where)
            except ReportError:
                frame = None
            if frame is not None and not all(frame.schema[c].is_integer() or frame.schema[c] == pl.Null
                                             for c in [*(c for c in integers if c in present), *packed]):
                frame = None
            if frame is not None:
                frame = frame.with_columns(pl.lit(0, pl.Int64).alias(WRONG_TYPE))
        if frame is None:
            frame = self._query(table, self._select(table, columns, present, text, integers, packed), where)
        assert isinstance(frame, pl.DataFrame)
        if missing:
            extra = [c for c in frame.columns if c not in requested]
            frame = frame.with_columns(pl.lit(None, pl.String if c in text else pl.Int64).alias(c) for c in missing)
            frame = frame.select(*requested, *extra)
        frame = frame.with_columns(decode_text(frame[c]) for c in text if c in frame.columns)
        return frame.with_columns(pl.col(c).cast(pl.Int64, strict=False)
                                  for c in [*(c for c in integers if c in present), *packed])


@dataclass
class ParquetDirTables:
    """`nsys export -t parquetdir`: one `<TABLE>.parquet` per table."""

    path: Path

    def __post_init__(self) -> None:
        # Regular files only: a FIFO or device named *.parquet would block the read.
        self._files = {p.stem: p for p in self.path.glob("*.parquet") if p.is_file()}

    def tables(self) -> frozenset[str]:
        return frozenset(self._files)

    def _failed(self, table: str, exc: Exception) -> ReportError:
        return ReportError(
            f"{self.path.name}: reading {table}.parquet failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
            "the parquetdir export is truncated or corrupt; export the report again",
        )

    def columns(self, table: str) -> frozenset[str]:
        if table not in self._files:
            return frozenset()
        try:
            return frozenset(pl.read_parquet_schema(self._files[table]))
        except Exception as exc:  # polars and pyarrow raise several types for a damaged file
            raise self._failed(table, exc) from None

    def read(self, table: str, columns: Sequence[str], *, text: Sequence[str] = (),
             integers: Sequence[str] = (), packed: Packing = {}, only: RowFilter | None = None) -> pl.DataFrame:
        present = self.columns(table)
        if packed and only is not None:
            raise ValueError("packed columns of a filtered read are not supported")
        frame = self._read(table, columns, text, integers, present, only)
        # Read as they are and packed here: a Parquet read has nothing to save by it.
        return frame.with_columns(self._packed(table, present, sources, frame.height).alias(name)
                                  for name, sources in packed.items())

    def _packed(self, table: str, present: frozenset[str], sources: Sequence[tuple[str, int]],
                rows: int) -> pl.Series:
        """One `packed` column: of integer columns only, as SQLite's packing."""
        if all(c in present for c, _ in sources):
            raw = self._read(table, [c for c, _ in sources], (), (), present)
            if all(raw.schema[c].is_integer() for c, _ in sources):
                return raw.select(packed_value(sources)).to_series()
        return pl.Series([None] * rows, dtype=pl.Int64)

    def _read(self, table: str, columns: Sequence[str], text: Sequence[str], integers: Sequence[str],
              present: frozenset[str], only: RowFilter | None = None) -> pl.DataFrame:
        wanted = [c for c in columns if c in present]
        try:
            if only is None:
                frame = pl.read_parquet(self._files[table], columns=wanted)
            else:
                # Filtered as the row groups are read (the rest never reach memory); a column
                # of another type (damaged) is compared by its integer value where it has one.
                col, values = only
                scan = pl.scan_parquet(self._files[table])
                if col not in present:
                    frame = scan.select(wanted).head(0).collect()
                else:
                    key = pl.col(col) if scan.collect_schema()[col].is_integer() else pl.col(col).cast(
                        pl.Int64, strict=False)
                    frame = scan.filter(key.is_in([int(v) for v in values])).select(wanted).collect()
        except Exception as exc:
            raise self._failed(table, exc) from None
        missing = [pl.lit(None).alias(c) for c in columns if c not in present]
        frame = frame.with_columns(missing).select(columns) if missing else frame.select(columns)
        out = []
        wrong = pl.lit(0, pl.Int64)
        for col in integers:
            if col in present and frame.schema[col] not in (pl.Int64, pl.Int32, pl.Int16, pl.Int8, pl.UInt32,
                                                              pl.UInt16, pl.UInt8, pl.Null):
                as_int = pl.col(col).cast(pl.Int64, strict=False) if frame.schema[col].is_integer() else pl.lit(None, pl.Int64)
                wrong = wrong + (pl.col(col).is_not_null() & as_int.is_null()).cast(pl.Int64)
                out.append(as_int.alias(col))
        if integers:
            frame = frame.with_columns(wrong.alias(WRONG_TYPE)).with_columns(out)
        if text:
            cut = pl.lit(0, pl.Int64)
            fixed = []
            for col in (c for c in text if c in present):
                raw = frame[col] if frame.schema[col] == pl.Binary else frame[col].cast(pl.String).cast(pl.Binary)
                long = raw.bin.size() > MAX_TEXT_BYTES
                cut = cut + pl.Series(long).fill_null(False).cast(pl.Int64)
                fixed.append(decode_text(pl.select(pl.when(long).then(raw.bin.slice(0, MAX_TEXT_BYTES))
                                                   .otherwise(raw)).to_series().alias(col)))
            frame = frame.with_columns(*fixed, cut.alias(TRUNCATED))
        return frame
