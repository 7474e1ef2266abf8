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
