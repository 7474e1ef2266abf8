"""Bad input: a one-line error naming the problem and the fix, exit code 2, no traceback,
nothing written beside the input. A report without NVTX is not bad input."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def k3trace(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "K3TRACE_NSYS"}
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin"  # no nsys on it
    return subprocess.run([sys.executable, "-m", "k3trace.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**base, **(env or {})}, stdin=subprocess.DEVNULL, timeout=300)


def assert_bad_input(path: Path, *extra: str, says: str) -> None:
    folder = path.parent if path.exists() else None
    before = set(os.listdir(folder)) if folder else None
    done = k3trace("analyze", str(path), "--no-cache", *extra)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("k3trace: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert says in lines[0], lines[0]
    assert ";" in lines[0], "the message names the problem and then what to do"
    if folder:
        assert set(os.listdir(folder)) == before


def copy_fixture(trace_sqlite, tmp_path: Path, name: str = "small_inside_a") -> Path:
    out = tmp_path / "in" / f"{name}.sqlite"
    out.parent.mkdir(exist_ok=True)
    shutil.copyfile(trace_sqlite(name), out)
    out.chmod(0o644)
    return out


def edit(path: Path, *sql: str) -> None:
    with sqlite3.connect(path) as con:
        for statement in sql:
            con.execute(statement)
    con.close()


def test_not_a_report(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert_bad_input(path, says="is not a report k3trace can read")


def test_missing_file(tmp_path):
    assert_bad_input(tmp_path / "nope.sqlite", says="no such file")


def test_folder_that_is_not_a_parquetdir(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(b"")
    assert_bad_input(folder, says="no reports found")


def test_truncated_sqlite(trace_sqlite, tmp_path):
    path = tmp_path / "cut.sqlite"
    path.write_bytes(trace_sqlite("small_inside_a").read_bytes()[:65536])
    assert_bad_input(path, says="cut.sqlite")


def test_corrupt_sqlite(trace_sqlite, tmp_path):
    data = bytearray(trace_sqlite("small_inside_a").read_bytes())
    data[4096:] = os.urandom(len(data) - 4096)
    path = tmp_path / "corrupt.sqlite"
    path.write_bytes(bytes(data))
    assert_bad_input(path, says="corrupt.sqlite")


def test_sqlite_that_is_not_an_nsys_export(tmp_path):
    path = tmp_path / "other.sqlite"
    edit(path, "CREATE TABLE t (x INTEGER)")
    assert_bad_input(path, says="is not an Nsight Systems export")


def test_missing_kernel_table(trace_sqlite, tmp_path):
    path = copy_fixture(trace_sqlite, tmp_path)
    edit(path, "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    assert_bad_input(path, says="holds no CUDA kernel records")


def test_no_kernels(trace_sqlite, tmp_path):
    path = copy_fixture(trace_sqlite, tmp_path)
    edit(path, "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert_bad_input(path, says="holds no kernel records")


def test_graph_level_tracing(trace_sqlite, tmp_path):
    # What --cuda-graph-trace=graph leaves: graph launches, no per-node kernel records.
    path = copy_fixture(trace_sqlite, tmp_path)
    edit(path, "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL")
    assert_bad_input(path, says="--cuda-graph-trace=node")


def test_no_decode_steps(samples_dir, tmp_path):
    path = tmp_path / "vector_add.sqlite"
    shutil.copyfile(samples_dir / "deepdive_vector_add_2023.4.sqlite", path)
    assert_bad_input(path, says="no decode steps found")


def test_only_prefill_steps(trace_sqlite, tmp_path):
    """The transformers Llama's eager decode loop with its vLLM step ranges renamed to
    prefill's (`execute_context_1(N)_generation_0(0)`): no decode step, and most kernels sit in
    prefill ranges, so the period of the kernel sequence (a layer's, in a real prefill trace) is
    not taken as a step. A pattern that takes those ranges analyses them, one step each."""
    path = copy_fixture(trace_sqlite, tmp_path, "hf_vllm_eager_donor")
    with sqlite3.connect(path) as con:
        rows = con.execute("SELECT n.rowid, COALESCE(n.text, s.value) FROM NVTX_EVENTS n "
                           "LEFT JOIN StringIds s ON n.textId = s.id").fetchall()
        renamed = 0
        for rowid, text in rows:
            if text and text.startswith("execute_context_0(0)_generation_1("):
                step = text.removeprefix("execute_context_0(0)_generation_1(").rstrip(")")
                con.execute("UPDATE NVTX_EVENTS SET text = ?, textId = NULL WHERE rowid = ?",
                            (f"execute_context_1({step})_generation_0(0)", rowid))
                renamed += 1
    con.close()
    assert renamed == 20
    assert_bad_input(path, says="only prefill steps: 20 step ranges ('execute_context_1(")
    cfg = tmp_path / "prefill.toml"
    cfg.write_text("[steps]\nnvtx_pattern = 'execute_context_1'\n")
    done = k3trace("analyze", str(path), "--no-cache", "--json", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    assert steps["source"] == "nvtx" and steps["total"] == renamed


def test_invalid_config(trace_sqlite, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[steps\nwarmup = ")
    assert_bad_input(trace_sqlite("small_before"), "--config", str(cfg), says="config bad.toml cannot be read")


def test_config_with_a_bad_pattern(trace_sqlite, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[patterns]\nfmha = '('\n")
    assert_bad_input(trace_sqlite("small_before"), "--config", str(cfg), says="config bad.toml: patterns.fmha")


def test_nsys_rep_without_nsys(tmp_path):
    path = tmp_path / "run.nsys-rep"
    path.write_bytes(b"x" * 100)
    assert_bad_input(path, says="needs `nsys export` and no nsys was found")


def test_qdstrm_without_importer(tmp_path):
    path = tmp_path / "run.qdstrm"
    path.write_bytes(b"x" * 100)
    assert_bad_input(path, says="no QdstrmImporter is at hand")


def test_diff_with_one_report(trace_sqlite):
    done = k3trace("diff", str(trace_sqlite("small_before")), "--no-cache")
    assert done.returncode == 2 and "diff takes two reports" in done.stderr and "Traceback" not in done.stderr


def test_report_without_nvtx_is_analysed_with_fallbacks(trace_sqlite, tmp_path):
    import json

    path = copy_fixture(trace_sqlite, tmp_path)
    edit(path, "DELETE FROM NVTX_EVENTS")
    done = k3trace("analyze", str(path), "--json", "--no-cache")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["steps"]["source"] == "graph"
    assert out["labels"]["sources"]["nvtx"] == out["labels"]["sources"]["graph_capture"] == 0
    # No label reaches the replays: their layers are inferred, and the report says so.
    assert out["labels"]["sources"]["inferred"] > 0 and out["labels"]["convention"] == "none"
    assert any("layers inferred from the repeating kernel sequence" in n for n in out["notes"])
