"""The mutation corpus (issue 12): the bundled real recordings, damaged the way a hostile
user or a broken pipeline would damage them, built at test time in tmp folders.

Every case ends one of two ways:
- refused: exit 2, one stderr line `k3trace: <problem>; <fix>` naming the problem, no
  traceback, no stdout, nothing written beside the input and the input unchanged;
- flagged: an analysis whose `completeness.problems` say what is wrong and how much (rows
  excluded, steps affected), with the numbers computed without the bad rows.
Expected values come from plain sqlite3 queries on the mutated copy and from
tests/reference.py run on a copy with the bad rows deleted, never from k3trace itself.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import reference as ref_mod  # tests/reference.py
from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.ingest import load_report

ROOT = Path(__file__).resolve().parents[1]
K = "CUPTI_ACTIVITY_KIND_KERNEL"
RT = "CUPTI_ACTIVITY_KIND_RUNTIME"
BASE = "small_inside_a"


# -- harness ------------------------------------------------------------------------------

def k3trace(*args: str, env: dict | None = None, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "K3TRACE_NSYS"}
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin"
    return subprocess.run([sys.executable, "-m", "k3trace.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**base, **(env or {})}, stdin=subprocess.DEVNULL, timeout=timeout)


def snapshot(folder: Path) -> dict[str, str]:
    """Names and digests of the regular files in `folder` (what 'nothing written, input
    unchanged' is checked against)."""
    out = {}
    for p in sorted(folder.iterdir()):
        out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else p.stat().st_mode
    return out


def refused(*args: str, says: str | list[str], watch: Path | None = None, env: dict | None = None,
            timeout: float = 120) -> str:
    """Run the CLI; it must refuse with one line. Returns the line."""
    before = snapshot(watch) if watch else None
    done = k3trace(*args, env=env, timeout=timeout)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("k3trace: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert ";" in lines[0], "the message names the problem and then what to do"
    for text in [says] if isinstance(says, str) else says:
        assert text in lines[0], lines[0]
    if watch:
        assert snapshot(watch) == before, "nothing written beside the input, the input unchanged"
    return lines[0]


def mutated(trace_sqlite, tmp_path: Path, *sql: str, name: str = BASE, unconstrain: tuple[str, ...] = ()) -> Path:
    """A copy of a bundled recording in its own folder, with `sql` applied. `unconstrain`
    rebuilds those tables without NOT NULL/type constraints first (so NULLs and text can
    be written where nsys never writes them)."""
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.sqlite"
    shutil.copyfile(trace_sqlite(name), path)
    path.chmod(0o644)
    con = sqlite3.connect(path)
    with con:
        for table in unconstrain:
            con.execute(f'CREATE TABLE "_tmp" AS SELECT * FROM "{table}"')
            con.execute(f'DROP TABLE "{table}"')
            con.execute(f'ALTER TABLE "_tmp" RENAME TO "{table}"')
        for statement in sql:
            con.execute(statement)
    con.close()
    return path


def query(path: Path, sql: str, *args):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def one(path: Path, sql: str, *args):
    return query(path, sql, *args)[0][0]


def cleaned(path: Path, tmp_path: Path, where: str) -> Path:
    """A copy of `path` with the kernel rows matching `where` deleted (what the numbers of
    the damaged report must equal), with the table's constraints back for the reference."""
    out = tmp_path / "clean" / path.name
    out.parent.mkdir(exist_ok=True)
    shutil.copyfile(path, out)
    con = sqlite3.connect(out)
    with con:
        con.execute(f"DELETE FROM {K} WHERE {where}")
    con.close()
    return out


def run(path: Path):
    return analyze(load_report(path), load_config())


def problems(a) -> str:
    return " | ".join(a.completeness.problems)


def assert_numbers_match_reference(a, clean: Path) -> None:
    """The damaged report's step numbers are those of the report without the bad rows."""
    ref = ref_mod.compute(clean)
    j = a.to_json()
    assert j["steps"]["count"] == len(ref.stable)
    for key in ("period", "span", "busy"):
        assert j["steps"][f"{key}_median_us"] == pytest.approx(ref.medians[key] / 1e3, rel=1e-6), key


def replays_hit(path: Path, where: str) -> int:
    """Graph replays (distinct launch correlation ids) holding a kernel row matching `where`."""
    return one(path, f"SELECT count(DISTINCT correlationId) FROM {K} WHERE graphNodeId IS NOT NULL AND ({where})")


# -- bad rows: flagged, excluded, numbers without them ------------------------------------

@dataclass(frozen=True)
class RowDamage:
    name: str
    sql: tuple[str, ...]
    bad: str              # SQL condition on the mutated kernel table: the damaged rows
    issue: str            # how the problem names them
    unconstrain: bool = True
    keep: str | None = None   # condition (on the clean copy) of rows to keep when cleaning


ROW_DAMAGE = [
    RowDamage("NULL start or end on 2% of kernels",
              (f"UPDATE {K} SET start = NULL WHERE rowid % 100 = 7", f"UPDATE {K} SET end = NULL WHERE rowid % 100 = 57"),
              "start IS NULL OR end IS NULL", "with no start or end time"),
    RowDamage("start and end swapped on 2% of kernels",
              (f"UPDATE {K} SET start = end, end = start WHERE rowid % 50 = 11 AND end > start",),
              "end < start", "ending before they start", unconstrain=False),
    RowDamage("text in an integer column on 1% of kernels",
              (f"UPDATE {K} SET end = 'x' || end WHERE rowid % 100 = 13",),
              "typeof(end) != 'integer'", "with non-integer values in integer columns"),
    RowDamage("a fractional end in the very last row (the column changes type late)",
              (f"UPDATE {K} SET end = end + 0.5 WHERE rowid = (SELECT max(rowid) FROM {K})",),
              "typeof(end) != 'integer'", "with non-integer values in integer columns", unconstrain=False),
    RowDamage("negative start times",
              (f"UPDATE {K} SET start = -1 WHERE rowid % 97 = 5",),
              "start < 0", "with negative times", unconstrain=False),
    RowDamage("names pointing at missing strings",
              (f"UPDATE {K} SET shortName = 999999999 WHERE rowid % 40 = 3",),
              "shortName NOT IN (SELECT id FROM StringIds)", "naming strings that are not in StringIds",
              unconstrain=False),
]


@pytest.mark.parametrize("case", ROW_DAMAGE, ids=lambda c: c.name)
def test_damaged_rows_are_counted_excluded_and_reported(trace_sqlite, tmp_path, case):
    path = mutated(trace_sqlite, tmp_path, *case.sql, unconstrain=(K,) if case.unconstrain else ())
    total = one(path, f"SELECT count(*) FROM {K}")
    bad = one(path, f"SELECT count(*) FROM {K} WHERE {case.bad}")
    hit = replays_hit(path, case.bad)
    assert 0 < bad < total and hit > 0
    a = run(path)
    text = problems(a)
    assert not a.completeness.ok
    assert f"{bad} of {total} kernel records were excluded as damaged ({bad} {case.issue})" in text, text
    assert re.search(rf"from {a.completeness.affected_steps} steps", text)
    # every damaged replay is a step that lost kernels (the eager step may add one more)
    assert a.completeness.affected_steps in (hit, hit + 1)
    assert a.completeness.excluded_rows == bad
    assert a.kernels.height == total - bad
    assert_numbers_match_reference(a, cleaned(path, tmp_path, case.bad))


def test_every_kernel_row_duplicated(trace_sqlite, tmp_path):
    original = trace_sqlite(BASE)
    cols = ", ".join(f'"{r[1]}"' for r in query(original, f'PRAGMA table_info("{K}")'))
    path = mutated(trace_sqlite, tmp_path, f"INSERT INTO {K} ({cols}) SELECT {cols} FROM {K}")
    total = one(path, f"SELECT count(*) FROM {K}")
    assert total == 2 * one(original, f"SELECT count(*) FROM {K}")
    a = run(path)
    assert f"{total // 2} of {total} kernel records were excluded as damaged ({total // 2} duplicating another row)" \
        in problems(a)
    # the numbers are those of the recording as made: calls per step not doubled
    ref = ref_mod.compute(original)
    for row in a.kernel_table.iter_rows(named=True):
        assert row["calls_per_step"] == pytest.approx(ref.kernel_table[(row["name"], row["family"])]["calls_per_step"])
    assert_numbers_match_reference(a, original)


# -- lost records -------------------------------------------------------------------------

def test_kernels_after_the_middle_deleted_is_a_truncated_capture(trace_sqlite, tmp_path):
    original = trace_sqlite(BASE)
    # the middle of the replays (the eager step runs first, long before them)
    lo, hi = query(original, f"SELECT min(start), max(start) FROM {K} WHERE graphNodeId IS NOT NULL")[0]
    middle = (lo + hi) // 2
    path = mutated(trace_sqlite, tmp_path, f"DELETE FROM {K} WHERE start > {middle}")
    # graph launches that lost every kernel record: launched, nothing left on the GPU
    launched = one(path, f"SELECT count(*) FROM {RT} r JOIN StringIds s ON s.id = r.nameId "
                         "WHERE s.value LIKE 'cudaGraphLaunch%' AND r.returnValue = 0")
    lost = one(path, f"SELECT count(*) FROM {RT} r JOIN StringIds s ON s.id = r.nameId "
                     "WHERE s.value LIKE 'cudaGraphLaunch%' AND r.returnValue = 0 AND r.correlationId NOT IN "
                     f"(SELECT correlationId FROM {K})")
    assert lost >= 20
    a = run(path)
    text = problems(a)
    assert not a.completeness.ok and a.completeness.truncated
    found = re.search(r"(\d+) of (\d+) CUDA graph launches \([\d.]+%\) have no GPU record", text)
    assert found, text
    # all of them but possibly the very last, whose work may not have fit before the end
    assert int(found[2]) == launched and lost - 1 <= int(found[1]) <= lost
    assert "the capture is truncated: GPU records stop at" in text


def test_the_windows_last_launch_running_after_the_window_is_not_a_loss(trace_sqlite, tmp_path):
    # The capture closes while the GPU is still working through the queue: the last graph
    # launch has no GPU records and none of the host's records goes past the last GPU one.
    original = trace_sqlite(BASE)
    last = one(original, f"SELECT correlationId FROM {K} WHERE graphNodeId IS NOT NULL "
                         "GROUP BY correlationId ORDER BY min(start) DESC LIMIT 1")
    path = mutated(trace_sqlite, tmp_path, f"DELETE FROM {K} WHERE correlationId = {last}")
    gpu_end = one(path, f"SELECT max(end) FROM {K}")
    con = sqlite3.connect(path)
    with con:
        con.execute(f"DELETE FROM {RT} WHERE end > ? AND correlationId != ?", (gpu_end, last))
        con.execute("DELETE FROM NVTX_EVENTS WHERE coalesce(end, start) > ?", (gpu_end,))
    con.close()
    assert one(path, f"SELECT count(*) FROM {RT} WHERE correlationId = ?", last) == 1
    a = run(path)
    assert "no GPU record" not in problems(a) and not a.completeness.truncated
    assert a.completeness.missing_launches == 0


def test_zero_length_layer_ranges_are_not_lost_records(trace_sqlite, tmp_path):
    path = mutated(trace_sqlite, tmp_path, "UPDATE NVTX_EVENTS SET end = start WHERE textId IN "
                   "(SELECT id FROM StringIds WHERE value = 'layer.3.kda') OR text = 'layer.3.kda'")
    assert one(path, "SELECT count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                     "WHERE coalesce(n.text, s.value) = 'layer.3.kda' AND n.end = n.start") > 0
    a = run(path)
    assert "hold no CUDA call" not in problems(a)


def test_a_damaged_side_carries_its_completeness_for_the_diff(trace_sqlite, tmp_path):
    path = mutated(trace_sqlite, tmp_path, f"DELETE FROM {K} WHERE rowid % 3 = 0")
    trust = run(path).trust()
    assert trust["ok"] is False and trust["problems"] >= 1 and trust["problem_texts"]
    assert run(trace_sqlite("small_inside_b")).trust()["ok"] is True


def test_diff_of_a_report_missing_a_third_of_its_kernels(trace_sqlite, tmp_path):
    path = mutated(trace_sqlite, tmp_path, f"DELETE FROM {K} WHERE rowid % 3 = 0")
    done = k3trace("diff", str(path), str(trace_sqlite(BASE)), "--json", "--no-cache")
    assert done.returncode in (0, 2) and "internal error" not in done.stderr, done.stderr
    if done.returncode == 0:  # analysed: the verdict carries the damaged side's completeness
        j = json.loads(done.stdout)
        assert j["incomplete"] == [path.name] and j["sides"]["old"][0]["ok"] is False
        assert any("incomplete capture on" in c for c in j["caveats"])


# -- caveats --------------------------------------------------------------------------------

def test_fewer_than_ten_stable_steps_carry_a_caveat(trace_sqlite, tmp_path):
    original = trace_sqlite(BASE)
    keep = [r[0] for r in query(original, f"SELECT correlationId FROM {K} WHERE graphNodeId IS NOT NULL "
                                          "GROUP BY correlationId ORDER BY min(start) LIMIT 8")]
    ids = ",".join(map(str, keep))
    path = mutated(trace_sqlite, tmp_path,
                   f"DELETE FROM {RT} WHERE correlationId IN (SELECT correlationId FROM {K} WHERE graphNodeId IS NOT "
                   f"NULL AND correlationId NOT IN ({ids}))",
                   f"DELETE FROM {K} WHERE graphNodeId IS NOT NULL AND correlationId NOT IN ({ids})")
    a = run(path)
    stable = len(ref_mod.compute(path).stable)
    assert a.stable_steps == stable < 10
    assert any(c.startswith(f"only {stable} stable steps: p90/p99") for c in a.completeness.caveats)
    assert a.to_json()["caveats"] == list(a.completeness.caveats)


def test_period_fallback_steps_carry_a_caveat(trace_sqlite, tmp_path):
    path = mutated(trace_sqlite, tmp_path, f"UPDATE {K} SET graphNodeId = NULL", "DELETE FROM NVTX_EVENTS")
    a = run(path)
    assert a.step_source == "period"
    assert any("period of the repeating kernel sequence" in c for c in a.completeness.caveats)


# -- refused: one line, exit 2 --------------------------------------------------------------

SCHEMA_DAMAGE = [
    ("kernel column start dropped", f'ALTER TABLE {K} DROP COLUMN start', f"table {K} has no column start"),
    ("kernel column end renamed", f'ALTER TABLE {K} RENAME COLUMN "end" TO stop', f"table {K} has no column end"),
    ("kernel column deviceId renamed", f"ALTER TABLE {K} RENAME COLUMN deviceId TO device",
     f"table {K} has no column deviceId"),
    ("kernel column graphNodeId dropped", f"ALTER TABLE {K} DROP COLUMN graphNodeId",
     f"table {K} has no column graphNodeId"),
    ("runtime column correlationId renamed", f"ALTER TABLE {RT} RENAME COLUMN correlationId TO corr",
     f"table {RT} has no column correlationId"),
    ("StringIds column value renamed", "ALTER TABLE StringIds RENAME COLUMN value TO v",
     "table StringIds has no column value"),
    ("every kernel start is text", f"UPDATE {K} SET start = 'x' || start",
     "none of its 7566 kernel records is usable (7566 with non-integer values"),
    ("every kernel's start and end swapped", f"UPDATE {K} SET start = end, end = start WHERE end > start",
     "none of its 7566 kernel records is usable"),
]


@pytest.mark.parametrize("name, sql, says", SCHEMA_DAMAGE, ids=[c[0] for c in SCHEMA_DAMAGE])
def test_damaged_schema_is_refused(trace_sqlite, tmp_path, name, sql, says):
    path = mutated(trace_sqlite, tmp_path, sql, unconstrain=(K,) if "text" in name else ())
    refused("analyze", str(path), "--no-cache", says=says, watch=path.parent)


def test_truncated_parquetdir_file_is_refused(trace_sqlite, tmp_path):
    import adbc_driver_sqlite.dbapi as adbc
    import polars as pl

    src = trace_sqlite(BASE)
    out = tmp_path / "in" / "run_pq"
    out.mkdir(parents=True)
    with adbc.connect(f"file:{src}?mode=ro&immutable=1") as con, con.cursor() as cur:
        for table in ("StringIds", K, RT, "NVTX_EVENTS", "META_DATA_EXPORT"):
            cur.execute(f"SELECT * FROM {table}")
            pl.from_arrow(cur.fetch_arrow_table()).write_parquet(out / f"{table}.parquet")
    kernels = out / f"{K}.parquet"
    kernels.write_bytes(kernels.read_bytes()[: kernels.stat().st_size // 2])
    refused("analyze", str(out), "--no-cache", says=f"reading {K}.parquet failed", watch=out)


CONFIGS = [
    ("mad_k = nan", "[steps]\nmad_k = nan\n", "steps.mad_k = nan is not a finite number"),
    ("warmup = -5", "[steps]\nwarmup = -5\n", "steps.warmup = -5 is out of range"),
    ("[step] for [steps]", "[step]\nwarmup = 1\n", "unknown section step (did you mean steps?)"),
    ("misspelt key", "[pdl]\nmax_gap = 5\n", "unknown key pdl.max_gap (did you mean pdl.max_gap_ns?)"),
    ("silent_stretch_ms = inf", "[completeness]\nsilent_stretch_ms = inf\n",
     "completeness.silent_stretch_ms = inf is not a finite number"),
    ("look-behind pattern", "[patterns]\nfmha = '(?<=x)fmha'\n", "patterns.fmha = '(?<=x)fmha' is not a regular"),
    ("look-ahead step pattern", "[steps]\nnvtx_pattern = '^decode(?!_x)'\n", "steps.nvtx_pattern"),
    ("backreference", "[labels]\nlayer_pattern = '^layer\\.(?P<index>\\d+)\\.(?P<family>\\w+)\\1$'\n",
     "labels.layer_pattern"),
    ("backreference in a name rule", "[[labels.name_rules]]\npattern = '(a)\\1'\nfamily = 'x'\n",
     "labels.name_rules[0].pattern"),
    ("ratio cap below 1", "[input]\nmax_compression_ratio = 0.5\n", "input.max_compression_ratio = 0.5 is out of range"),
]


@pytest.mark.parametrize("name, text, says", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_bad_config_is_refused(trace_sqlite, tmp_path, name, text, says):
    cfg = tmp_path / "cfg" / "k.toml"
    cfg.parent.mkdir()
    cfg.write_text(text)
    refused("analyze", str(trace_sqlite(BASE)), "--no-cache", "--config", str(cfg), says=says, watch=cfg.parent)


def test_non_utf8_config_is_refused(trace_sqlite, tmp_path):
    cfg = tmp_path / "k.toml"
    cfg.write_bytes(b"[steps]\nnvtx_pattern = '\xff\xfe'\n")
    refused("analyze", str(trace_sqlite(BASE)), "--no-cache", "--config", str(cfg), says="is not UTF-8 text")


@pytest.mark.parametrize("role", ["report", "config", "scrub input"])
def test_a_fifo_is_refused_without_blocking(trace_sqlite, tmp_path, role):
    fifo = tmp_path / "pipe.sqlite"
    os.mkfifo(fifo)
    args = {"report": ("analyze", str(fifo), "--no-cache"),
            "config": ("analyze", str(trace_sqlite(BASE)), "--no-cache", "--config", str(fifo)),
            "scrub input": ("scrub", str(fifo), "-o", str(tmp_path / "out.sqlite"))}[role]
    refused(*args, says=["pipe.sqlite", "FIFO" if role != "config" else "not a regular file"], timeout=60)
    assert not (tmp_path / "out.sqlite").exists()


def test_html_into_a_missing_folder_or_onto_a_folder(trace_sqlite, tmp_path):
    a, b = str(trace_sqlite(BASE)), str(trace_sqlite("small_inside_b"))
    refused("diff", a, b, "--no-cache", "--html", str(tmp_path / "nope" / "r.html"), says="does not exist")
    (tmp_path / "out").mkdir()
    refused("diff", a, b, "--no-cache", "--html", str(tmp_path / "out"), says="is a folder", watch=tmp_path / "out")
    assert list(tmp_path.rglob("*.tmp")) == []


def test_control_characters_in_names_are_escaped(tmp_path):
    path = tmp_path / "in" / "bad\nna\x1b[31mme.txt"
    path.parent.mkdir()
    path.write_text("x")
    line = refused("analyze", str(path), "--no-cache", says="bad\\nna\\x1b[31mme.txt is not a report")
    assert "\x1b" not in line


# -- resources: compressed bombs, huge names ------------------------------------------------

def bomb(path: Path, gib: float, head: bytes = b"") -> Path:
    """An xz file decompressing to `gib` GiB of zeros (after `head`): one 64 MiB stream of
    zeros compressed once and repeated (xz readers decode concatenated streams)."""
    block = lzma.compress(b"\0" * (64 << 20), preset=0)
    with open(path, "wb") as fh:
        if head:
            fh.write(lzma.compress(head))
        for _ in range(int(gib * 16)):
            fh.write(block)
    return path


def test_xz_of_zeros_is_refused_at_its_first_bytes(tmp_path):
    (tmp_path / "in").mkdir()
    path = bomb(tmp_path / "in" / "run.sqlite.xz", 5)
    assert path.stat().st_size < 2 << 20
    started = time.monotonic()
    refused("analyze", str(path), "--no-cache", says="decompresses to something that is not a report",
            watch=path.parent)
    assert time.monotonic() - started < 30


def test_xz_bomb_is_refused_by_ratio_before_it_is_written_out(tmp_path, cache_dir):
    (tmp_path / "in").mkdir()
    path = bomb(tmp_path / "in" / "run.nsys-rep.xz", 5)
    started = time.monotonic()
    refused("analyze", str(path), "--cache-dir", str(cache_dir), says="expands more than 200 times", watch=path.parent)
    assert time.monotonic() - started < 60
    assert [p for p in cache_dir.rglob("*") if p.is_file()] == [], "the partial output was removed"


def test_decompressed_size_cap_is_configurable(tmp_path, trace_sqlite):
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "run.sqlite.xz"
    path.write_bytes(lzma.compress(trace_sqlite(BASE).read_bytes(), preset=0))
    cfg = tmp_path / "k.toml"
    cfg.write_text("[input]\nmax_decompressed_gib = 0.0005\n")
    refused("analyze", str(path), "--no-cache", "--config", str(cfg), says="decompresses to more than 0.0005 GiB",
            watch=path.parent)


def resource_run(path: Path) -> tuple[dict, int, float]:
    """Analyse in a fresh process: (JSON, peak RSS in MiB, seconds)."""
    code = ("import json, resource, sys, time\n"
            "from k3trace.analyses import analyze\nfrom k3trace.config import load_config\n"
            "from k3trace.ingest import load_report\n"
            "t = time.monotonic()\n"
            "a = analyze(load_report(sys.argv[1]), load_config()).to_json()\n"
            "print(json.dumps({'j': a, 's': time.monotonic() - t, "
            "'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out["j"], out["rss"], out["s"]


def test_a_64_mib_kernel_name_is_cut_with_a_note(trace_sqlite, tmp_path):
    original = trace_sqlite(BASE)
    name_id = one(original, f"SELECT shortName FROM {K} GROUP BY shortName ORDER BY count(*) DESC LIMIT 1")
    path = mutated(trace_sqlite, tmp_path, f"UPDATE StringIds SET value = replace(hex(zeroblob({32 << 20})), '0', 'k') "
                                           f"WHERE id = {name_id}")
    assert one(path, "SELECT length(value) FROM StringIds WHERE id = ?", name_id) == 64 << 20
    j, rss, seconds = resource_run(path)
    total = one(path, "SELECT count(*) FROM StringIds")
    assert f"1 of {total} StringIds rows had with texts longer than 4 KiB, cut there" in " ".join(j["notes"])
    assert max(len(k["name"]) for k in j["kernels"]) == 4096
    assert rss < 1500 and seconds < 30, (rss, seconds)


def test_many_1_mib_names_stay_fast(trace_sqlite, tmp_path):
    path = mutated(trace_sqlite, tmp_path, f"UPDATE StringIds SET value = value || replace(hex(zeroblob({1 << 19})), "
                                           f"'0', 'n') WHERE id IN (SELECT DISTINCT shortName FROM {K})")
    cut = one(path, f"SELECT count(*) FROM StringIds WHERE length(value) > 4096")
    assert cut >= 10
    j, rss, seconds = resource_run(path)
    assert j["steps"]["count"] > 40 and seconds < 30 and rss < 1500, (seconds, rss)


# -- cache and files ----------------------------------------------------------------------

@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_an_unusable_cache_dir_is_a_note_and_the_run_goes_on(trace_sqlite, tmp_path, where):
    blocker = tmp_path / "cachefile"
    blocker.write_text("not a folder")
    cache = blocker if where == "a file" else blocker / "sub"
    done = k3trace("analyze", str(trace_sqlite(BASE)), "--json", "--cache-dir", str(cache))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("k3trace: note: cache folder") and "without the cache" in lines[0]
    assert json.loads(done.stdout)["completeness"]["ok"]
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("damage", ["{}", "not json", "[]"])
def test_a_damaged_trace_cache_manifest_is_rebuilt(trace_sqlite, cache_dir, damage):
    path = trace_sqlite(BASE)
    first = load_report(path, cache_dir=cache_dir)
    entry = next((cache_dir / "traces").iterdir())
    (entry / "manifest.json").write_text(damage)
    phases: list[str] = []
    again = load_report(path, cache_dir=cache_dir, progress=phases.append)
    assert "cache hit" not in phases and again.kernels.equals(first.kernels)
    phases.clear()
    load_report(path, cache_dir=cache_dir, progress=phases.append)
    assert phases == ["cache hit"]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_leftovers_of_killed_runs_are_cleaned(trace_sqlite, cache_dir):
    pid = dead_pid()
    (cache_dir / "traces").mkdir(parents=True)
    stale = [cache_dir / f".work-{pid}-deadbeef-x", cache_dir / "traces" / f".tmp-{pid}-deadbeef-key"]
    alive = cache_dir / "traces" / f".tmp-{os.getpid()}-cafecafe-key"
    for folder in (*stale, alive):
        folder.mkdir()
        (folder / "partial.parquet").write_bytes(b"half")
    load_report(trace_sqlite(BASE), cache_dir=cache_dir)
    assert not any(p.exists() for p in stale) and alive.exists()


def test_sigterm_mid_run_leaves_no_work_folder(trace_sqlite, tmp_path, cache_dir):
    # an .nsys-rep goes through `nsys export`; this stand-in nsys never finishes
    nsys = tmp_path / "nsys"
    nsys.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    nsys.chmod(0o755)
    (tmp_path / "in").mkdir()
    rep = tmp_path / "in" / "run.nsys-rep"
    rep.write_bytes(b"opaque")
    base = {k: v for k, v in os.environ.items()}
    proc = subprocess.Popen([sys.executable, "-m", "k3trace.cli", "analyze", str(rep), "--cache-dir", str(cache_dir)],
                            cwd=ROOT, env={**base, "K3TRACE_NSYS": str(nsys)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(cache_dir.glob(".work-*")):
        time.sleep(0.1)
    assert list(cache_dir.glob(".work-*")), "the run never started its conversion"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and stderr.strip().splitlines() == ["k3trace: interrupted"], stderr
    assert list(cache_dir.glob(".work-*")) == [] and sorted(p.name for p in rep.parent.iterdir()) == ["run.nsys-rep"]
