"""Ingest: every export form and nsys version reads into the same typed frames, nothing is
written beside the input, and the Parquet cache is keyed, atomic and invalidated."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import stat
import sys
from pathlib import Path

import polars as pl
import pytest

from k3trace.ingest import Tools, load_report, schema
from k3trace.ingest.tables import decode_text
from tests.conftest import bundled

SAMPLE_VERSIONS = {
    "deepdive_vector_add_2023.4.sqlite": "2023.4", "extrap_con_kernel_pre2022.sqlite": "2022.1",
    "extrap_concurrent_s4_2022.1.sqlite": "2022.1", "llama3inf_nvtx_demo_2024.6.sqlite": "2024.6",
    "nsysai_h100_2gpu_wan21_2026.2.sqlite": "2026.2", "nsysai_mfu_2gpu_after_2026.2.sqlite": "2026.2",
    "nsysai_mfu_2gpu_before_2026.2.sqlite": "2026.2", "nsysai_mock_2026.1.sqlite": "2026.1",
    "pipit_cloverleaf_4xa100_2024.5.sqlite": "2024.5", "pipit_saxpy_mpi_2022.2.sqlite": "2022.2",
}


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def count(path: Path, table: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.mark.parametrize("name", sorted(SAMPLE_VERSIONS))
def test_public_sample_ingests(samples_dir, name):
    path = samples_dir / name
    before = listing(samples_dir)
    trace = load_report(path)
    assert trace.nsys_version.startswith(SAMPLE_VERSIONS[name])
    assert trace.kernels.schema == schema.KERNELS
    assert trace.kernels.height == count(path, "CUPTI_ACTIVITY_KIND_KERNEL") > 0
    assert trace.runtime.height == count(path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    assert trace.kernels["name"].null_count() == 0
    # rows come back in time order whatever order the export stored them in
    assert trace.kernels["start"].is_sorted()
    assert listing(samples_dir) == before


def test_every_public_sample_is_covered(samples_dir):
    assert {p.name for p in samples_dir.glob("*.sqlite")} == set(SAMPLE_VERSIONS)


def test_2026_schema_graph_id_column(samples_dir):
    trace = load_report(samples_dir / "nsysai_mfu_2gpu_before_2026.2.sqlite")
    assert "graph_id" in trace.kernels.columns
    assert trace.kernels["global_pid"].n_unique() >= 1


def test_nvtx_text_resolved_from_text_and_text_id(samples_dir):
    trace = load_report(samples_dir / "llama3inf_nvtx_demo_2024.6.sqlite")
    assert trace.nvtx.height > 0 and trace.nvtx["text"].null_count() == 0


def test_invalid_utf8_is_replaced_not_fatal(samples_dir):
    # This 2022 export stores a Latin-1 user name in its export metadata.
    trace = load_report(samples_dir / "extrap_con_kernel_pre2022.sqlite")
    assert trace.nsys_version.startswith("2022.1")
    s = decode_text(pl.Series([b"ok", b"Gei\xe1", None], dtype=pl.Binary))
    assert s.to_list() == ["ok", "Gei\ufffd", None]


def test_runtime_join_key_includes_pid(samples_dir):
    # Two ranks in one report: correlation ids repeat across processes.
    trace = load_report(samples_dir / "nsysai_mfu_2gpu_before_2026.2.sqlite")
    pids = trace.runtime["global_pid"].unique().to_list()
    assert len(pids) >= 2
    ids = [set(trace.runtime.filter(pl.col("global_pid") == p)["correlation_id"]) for p in pids[:2]]
    assert ids[0] & ids[1], "the sample should reuse correlation ids across ranks"
    calls = trace.runtime.unique(["global_pid", "correlation_id"])
    joined = trace.kernels.join(calls, on=["global_pid", "correlation_id"], how="inner")
    # The sample's producer trimmed a few runtime rows; every other kernel finds its call.
    assert joined.height >= 0.99 * trace.kernels.height
    by_id_only = trace.kernels.join(trace.runtime.unique(["global_pid", "correlation_id"]), on="correlation_id")
    assert by_id_only.height > joined.height  # correlationId alone pairs kernels with the wrong rank


def test_compressed_and_plain_read_the_same(trace_sqlite, tmp_path):
    plain = load_report(trace_sqlite("small_inside_a"))
    xz = load_report(bundled("small_inside_a"))
    gz = tmp_path / "copy.sqlite.gz"
    with open(trace_sqlite("small_inside_a"), "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    for other in (xz, load_report(gz)):
        for table in schema.TABLES:
            assert getattr(other, table).equals(getattr(plain, table)), table
    assert "compressed" in xz.form


def test_parquetdir_reads_like_sqlite(trace_sqlite, tmp_path):
    # A parquetdir export is one <TABLE>.parquet per table; build one from the SQLite rows
    # (nsys writes the same columns) and check both forms normalise identically.
    from report_copies import parquetdir_copy

    src = trace_sqlite("small_inside_a")
    out = parquetdir_copy(src, tmp_path / "run_pq", (
        "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUDA_GRAPH_EVENTS",
        "META_DATA_EXPORT", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_STREAM", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"))
    a, b = load_report(src), load_report(out)
    assert b.form == "parquetdir"
    for table in schema.TABLES:
        assert getattr(a, table).equals(getattr(b, table)), table


def test_cache_hit_invalidation_and_atomicity(trace_sqlite, tmp_path, cache_dir):
    path = tmp_path / "run.sqlite"
    shutil.copyfile(trace_sqlite("small_before"), path)
    phases: list[str] = []
    first = load_report(path, cache_dir=cache_dir, progress=phases.append)
    assert "cache hit" not in phases
    entries = list((cache_dir / "traces").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")
    phases.clear()
    second = load_report(path, cache_dir=cache_dir, progress=phases.append)
    assert phases == ["cache hit"]
    assert second.kernels.equals(first.kernels)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    phases.clear()
    load_report(path, cache_dir=cache_dir, progress=phases.append)
    assert "cache hit" not in phases
    assert len(list((cache_dir / "traces").iterdir())) == 2
    assert listing(tmp_path) == {"run.sqlite", "cache"}


def test_damaged_cache_entry_is_rebuilt(trace_sqlite, cache_dir):
    path = trace_sqlite("small_before")
    load_report(path, cache_dir=cache_dir)
    entry = next((cache_dir / "traces").iterdir())
    (entry / "kernels.parquet").write_bytes(b"not parquet")
    again = load_report(path, cache_dir=cache_dir)
    assert again.kernels.height == count(path, "CUPTI_ACTIVITY_KIND_KERNEL")


def fake_nsys(tmp_path: Path, export_from: Path) -> str:
    """A stand-in `nsys` that 'exports' by copying a real SQLite export to the -o path."""
    script = tmp_path / "nsys"
    script.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[0] == 'export' and '-t' in args and args[args.index('-t') + 1] == 'sqlite'\n"
        f"shutil.copyfile({str(export_from)!r}, args[args.index('-o') + 1])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_nsys_rep_goes_through_nsys_export_without_writing_beside_it(trace_sqlite, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    rep = inputs / "run.nsys-rep"
    rep.write_bytes(b"opaque report bytes")
    trace = load_report(rep, tools=Tools(nsys=fake_nsys(tmp_path, trace_sqlite("small_before"))))
    assert trace.form == "nsys-rep" and trace.source == "run.nsys-rep"
    assert trace.kernels.height == count(trace_sqlite("small_before"), "CUPTI_ACTIVITY_KIND_KERNEL")
    assert listing(inputs) == {"run.nsys-rep"}


def test_input_is_never_modified(trace_sqlite, tmp_path, cache_dir):
    path = tmp_path / "run.sqlite"
    shutil.copyfile(trace_sqlite("small_inside_a"), path)
    path.chmod(0o444)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    load_report(path, cache_dir=cache_dir)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert listing(tmp_path) == {"run.sqlite", "cache"}


def _parted_table(path: Path, rows: int) -> None:
    """A table past the part-wise read's threshold whose second half differs in type: ids
    null in the first half, and one text value among the integers of `n`."""
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE t (start INTEGER, node INTEGER, n INTEGER)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)",
                        ((i, None if i < rows // 2 else i, "x" if i == rows - 7 else i) for i in range(rows)))


def test_part_wise_read_equals_one_scan(tmp_path, monkeypatch):
    from k3trace.ingest import tables

    path = tmp_path / "parts.sqlite"
    _parted_table(path, 4 * tables.MIN_ROWS_PER_READER + 5)
    src = tables.SqliteTables(path)
    assert len(src._rowid_parts("t")) > 1 or (os.cpu_count() or 1) < 2
    parted = src.read("t", ["start", "node", "n"], integers=["start", "node", "n"])
    monkeypatch.setattr(tables, "MAX_READERS", 1)
    whole = tables.SqliteTables(path).read("t", ["start", "node", "n"], integers=["start", "node", "n"])
    assert parted.equals(whole)
    assert parted["start"].to_list() == list(range(parted.height))  # rowid order kept
    assert parted[tables.WRONG_TYPE].sum() == 1 and parted["n"].null_count() == 1
    assert parted["node"].dtype == pl.Int64 and parted["node"].null_count() == parted.height // 2


def test_analyses_at_once_split_the_readers(tmp_path, monkeypatch):
    """A table is read in as many parts as this analysis' share of the cores: the diff's
    two sides, analysed in threads of one process, take half each."""
    from k3trace import cores
    from k3trace.ingest import tables

    path = tmp_path / "parts.sqlite"
    _parted_table(path, 4 * tables.MIN_ROWS_PER_READER + 5)
    src = tables.SqliteTables(path)
    monkeypatch.setenv("K3TRACE_CORES", "4")
    with cores.analysing():
        assert cores.alone() and len(src._rowid_parts("t")) == 4
        with cores.analysing():
            assert not cores.alone() and cores.per_analysis() == 2 and len(src._rowid_parts("t")) == 2
        assert len(src._rowid_parts("t")) == 4
    monkeypatch.setenv("K3TRACE_CORES", "1")
    assert src._rowid_parts("t") == [""]


def test_ids_past_the_packed_bits_read_as_they_are(trace_sqlite, tmp_path):
    """The kernel table's read packs pairs of id columns into one integer each (stream and
    device, short and demangled name) and the launch dimensions past grid x; values past
    those bits (a stream id over 2^32, a grid y over 2^16) still come through as they are
    (the table read again column by column), as a plain SQLite read gives them."""
    path = tmp_path / "wide_ids.sqlite"
    shutil.copyfile(trace_sqlite("hf_base_a"), path)
    path.chmod(0o644)
    with sqlite3.connect(path) as con:
        rowids = [r[0] for r in con.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 2")]
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = ? WHERE rowid = ?", ((1 << 33) + 7, rowids[0]))
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridY = 70000 WHERE rowid = ?", (rowids[1],))
        expected = sorted(con.execute("SELECT start, end, streamId, deviceId, shortName FROM "
                                      "CUPTI_ACTIVITY_KIND_KERNEL").fetchall())
        names = dict(con.execute("SELECT id, value FROM StringIds"))
    kernels = load_report(path).kernels
    # Every row, none rejected, its ids as stored.
    got = sorted(kernels.select("start", "end", "stream_id", "device_id", "name").iter_rows())
    assert got == [(s, e, stream, device, names[short]) for s, e, stream, device, short in expected]
    assert (1 << 33) + 7 in kernels["stream_id"].to_list()
