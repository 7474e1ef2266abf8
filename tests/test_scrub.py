"""`k3trace scrub`: environment and host data gone from all three places, analysis intact,
input untouched; and every bundled trace is scrubbed (the check the before-stop hook runs)."""

from __future__ import annotations

import hashlib
import lzma
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.demo import bundled_names
from k3trace.ingest import load_report
from k3trace.scrub import SCRUBBED, scrub

ENV = re.compile(rb"(?:^|\x00)[A-Za-z_][A-Za-z0-9_]*=")


def leaks(path: Path) -> int:
    """Environment/host rows left, counted the way the project's before-stop hook does."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    con.text_factory = bytes
    n = con.execute("SELECT count(*) FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").fetchone()[0]
    n += con.execute("SELECT count(*) FROM TARGET_INFO_SYSTEM_ENV WHERE CAST(name AS TEXT) IN "
                     "('DeviceEnvironment', 'Hostname')").fetchone()[0]
    n += sum(1 for (v,) in con.execute("SELECT value FROM StringIds") if isinstance(v, bytes) and len(ENV.findall(v)) >= 3)
    n += sum(1 for (v,) in con.execute("SELECT value FROM StringIds") if isinstance(v, bytes) and v.startswith(b"SECRET_TOKEN="))
    con.close()
    return n


def plant_environment(path: Path) -> None:
    """What a raw report carries (../shared/nsys/README.md, 'Fixtures and privacy')."""
    con = sqlite3.connect(path)
    with con:
        con.execute("INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT', 'HOME=/home/x')")
        con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV (globalVid, devStateName, name, nameEnum, value) "
                    "VALUES (1, 'x', 'Hostname', 0, 'build-host-7')")
        con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV (globalVid, devStateName, name, nameEnum, value) "
                    "VALUES (1, 'x', 'DeviceEnvironment', 0, 'A=1;B=2')")
        con.execute("INSERT INTO StringIds (id, value) VALUES (900001, ?)",
                    (b"PATH=/usr/bin\x00SECRET_TOKEN=abc123\x00HOME=/root",))
        con.execute("INSERT INTO StringIds (id, value) VALUES (900002, 'SECRET_TOKEN=abc123')")
    con.close()


def test_scrub_removes_planted_environment_and_keeps_the_analysis(trace_sqlite, tmp_path):
    raw = tmp_path / "raw.sqlite"
    shutil.copyfile(trace_sqlite("small_inside_a"), raw)
    raw.chmod(0o644)
    plant_environment(raw)
    assert leaks(raw) >= 4
    digest = hashlib.sha256(raw.read_bytes()).hexdigest()
    out = tmp_path / "out" / "clean.sqlite"
    summary = scrub(raw, out)
    assert hashlib.sha256(raw.read_bytes()).hexdigest() == digest, "the input must not change"
    assert leaks(out) == 0
    assert summary["capture env rows"] >= 1 and summary["host rows"] >= 2
    con = sqlite3.connect(out)
    assert con.execute("SELECT value FROM StringIds WHERE id = 900001").fetchone()[0] == SCRUBBED
    assert con.execute("SELECT count(*) FROM META_DATA_EXPORT WHERE value LIKE '%/%'").fetchone()[0] == 0
    con.close()
    before, after = (analyze(load_report(p), load_config()).to_json() for p in (trace_sqlite("small_inside_a"), out))
    for key in ("steps", "families", "kernels", "labels", "pre_attention_window_us", "pdl"):
        assert before[key] == after[key], key
    assert sorted(p.name for p in out.parent.iterdir()) == ["clean.sqlite"]


def test_scrub_writes_compressed_output(trace_sqlite, tmp_path):
    out = tmp_path / "clean.sqlite.xz"
    scrub(trace_sqlite("small_before"), out)
    plain = tmp_path / "clean.sqlite"
    plain.write_bytes(lzma.decompress(out.read_bytes()))
    assert leaks(plain) == 0


def test_scrub_refuses_to_overwrite_its_input(trace_sqlite, tmp_path):
    from k3trace.errors import ReportError

    path = tmp_path / "x.sqlite"
    shutil.copyfile(trace_sqlite("small_before"), path)
    with pytest.raises(ReportError, match="overwrite the input"):
        scrub(path, path)


@pytest.mark.parametrize("name", bundled_names())
def test_bundled_traces_are_scrubbed(trace_sqlite, name):
    path = trace_sqlite(name)
    assert leaks(path) == 0
    text = path.read_bytes()
    assert b"/work/" not in text and b"/home/" not in text and b"/root" not in text


# -- secrets anywhere ---------------------------------------------------------------------

USER, HOST = "alice", "build-host-7"
PAYLOAD = (f"run by {USER} on {HOST}: /home/{USER}/venv/bin/python, C:\\Users\\Alice\\AppData\\x.exe, "
           "HF_TOKEN=hf_SECRETVALUE123 AWS_SECRET_ACCESS_KEY=AKIA0SECRET")
SECRETS = [USER.encode(), b"Alice", HOST.encode(), b"hf_SECRETVALUE123", b"AKIA0SECRET"]


def text_columns(con, table):
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")') if "CHAR" in r[2].upper()
            or "TEXT" in r[2].upper() or r[2] == ""]


def plant_everywhere(path: Path) -> dict[str, int]:
    """The payload in a text column of every table that has one (a new row where the table
    allows it, else its first row), in NVTX texts and marks, in a process and a thread name,
    and the report's own user and host metadata rows."""
    con = sqlite3.connect(path)
    planted = {}
    with con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            cols = text_columns(con, table)
            if not cols:
                continue
            n = con.execute(f'UPDATE "{table}" SET "{cols[0]}" = ? WHERE rowid = (SELECT min(rowid) FROM "{table}")',
                            (PAYLOAD,)).rowcount
            if n == 0:
                try:
                    con.execute(f'INSERT INTO "{table}" ("{cols[0]}") VALUES (?)', (PAYLOAD,))
                    n = 1
                except sqlite3.DatabaseError:
                    continue
            planted[table] = n
        con.execute("INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:USER_NAME', ?)", (USER,))
        con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV (globalVid, devStateName, name, nameEnum, value) "
                    "VALUES (1, 'x', 'Hostname', 0, ?)", (HOST,))
        con.execute("INSERT INTO StringIds (id, value) VALUES (900010, ?)", (PAYLOAD,))
        con.execute("INSERT INTO StringIds (id, value) VALUES (900011, ?)", (f"/home/{USER}/venv/bin/python",))
        # an NVTX mark with inline text, and one registered through StringIds
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (1, NULL, 34, ?, 1)",
                    (PAYLOAD,))
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, textId, globalTid) VALUES (2, NULL, 34, 900010, 1)")
        con.execute("UPDATE ThreadNames SET nameId = 900010 WHERE rowid = (SELECT min(rowid) FROM ThreadNames)")
        con.execute("UPDATE PROCESSES SET name = ? WHERE rowid = (SELECT min(rowid) FROM PROCESSES)",
                    (f"/home/{USER}/venv/bin/python3",))
    con.close()
    return planted


def every_value(path: Path):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            for col in [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]:
                for (v,) in con.execute(f'SELECT CAST("{col}" AS BLOB) FROM "{table}" '
                                        f'WHERE typeof("{col}") IN (\'text\', \'blob\')'):
                    yield table, col, v
    finally:
        con.close()


def names(path: Path) -> tuple[set, set]:
    """Kernel names (short and demangled) and NVTX texts, as stored."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    con.text_factory = bytes
    kernels = {r[0] for r in con.execute(
        "SELECT s.value FROM StringIds s WHERE s.id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)")}
    nvtx = {r[0] for r in con.execute(
        "SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId")}
    con.close()
    return kernels, nvtx


def test_scrub_removes_secrets_planted_in_every_table(trace_sqlite, tmp_path):
    raw = tmp_path / "raw.sqlite"
    shutil.copyfile(trace_sqlite("small_inside_a"), raw)
    raw.chmod(0o644)
    kernels_before, nvtx_before = names(raw)
    planted = plant_everywhere(raw)
    con = sqlite3.connect(raw)
    all_tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    with_text = {t for t in all_tables if text_columns(sqlite3.connect(raw), t)}
    assert set(planted) == with_text and len(planted) > 50, sorted(with_text - set(planted))
    assert sum(PAYLOAD.encode() in v for _, _, v in every_value(raw)) >= len(planted)

    out = tmp_path / "clean.sqlite"
    scrub(raw, out)
    left = [(t, c, v[:80]) for t, c, v in every_value(out) if any(s in v for s in SECRETS)]
    assert left == []
    # home paths keep their shape, the user part gone; process names keep the file name
    values = [v for _, _, v in every_value(out)]
    assert any(b"/home/[scrubbed]/venv/bin/python" in v for v in values)
    assert any(b"HF_TOKEN=[scrubbed]" in v for v in values)
    con = sqlite3.connect(out)
    assert con.execute("SELECT count(*) FROM PROCESSES WHERE name = 'python3'").fetchone()[0] >= 1
    con.close()
    # kernel names and NVTX texts that carried no secret are byte for byte the same
    kernels_after, nvtx_after = names(out)
    assert kernels_after == kernels_before
    assert nvtx_before <= nvtx_after
    assert all(b"[scrubbed]" in t for t in nvtx_after - nvtx_before if t is not None)
    assert leaks(out) == 0
