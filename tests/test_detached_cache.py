"""The detached cache writer (k3trace/ingest/detached.py): within `saved_detached`, the
cache entries are finished by a forked process once the block is left; they are the entries
an inline write makes (every frame reads back equal, of the same types), and a command run
without K3TRACE_CACHE_WAIT returns with its answer and leaves the entries to the writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from k3trace.analyses import analyze_report, pipeline
from k3trace.config import load_config
from k3trace.ingest import cachefs, detached, load_report

ROOT = Path(__file__).resolve().parents[1]
TRACE_FRAMES = ("kernels", "runtime", "nvtx", "graph_nodes", "sync", "gpus", "streams", "gpu_metrics", "findings",
                "rejected_kernels")


def test_detached_entries_equal_inline_ones(trace_sqlite, tmp_path):
    path, cfg = trace_sqlite("small_before"), load_config()
    inline, later = tmp_path / "inline", tmp_path / "detached"
    first = analyze_report(path, cfg, cache_dir=inline)
    with pipeline.saved_detached():
        second = analyze_report(path, cfg, cache_dir=later)
    pipeline.wait_detached()
    assert second.to_json() == first.to_json()
    phases: list[str] = []
    cached = analyze_report(path, cfg, cache_dir=later, progress=phases.append)
    assert phases == ["cached analysis"]
    assert cached.to_json() == first.to_json()
    assert cached.kernels.equals(first.kernels) and cached.path.equals(first.path)
    assert cached.kernels.schema == first.kernels.schema and cached.path.schema == first.path.schema
    a, b = load_report(path, cache_dir=inline), load_report(path, cache_dir=later, progress=phases.append)
    assert phases[-1] == "cache hit"
    for name in TRACE_FRAMES:
        assert getattr(b, name).schema == getattr(a, name).schema and getattr(b, name).equals(getattr(a, name)), name


def test_frames_of_every_kind_read_back_equal(tmp_path):
    plain = pl.concat([pl.DataFrame({"i": [1, None, 3], "u": pl.Series([1, 2, 3], dtype=pl.UInt32),
                                     "f": [0.5, None, 2.0], "b": [True, None, False], "s": ["a", None, "ccc"]}),
                       pl.DataFrame({"i": [4], "u": pl.Series([4], dtype=pl.UInt32), "f": [1.0], "b": [True],
                                     "s": ["d"]})], rechunk=False)
    assert plain["i"].n_chunks() == 2
    other = pl.DataFrame({"l": [[1, 2], None], "n": [None, None], "t": ["x", "y"]}).with_columns(
        pl.col("t").cast(pl.Categorical))
    frames = {"plain.arrow": plain, "plain.parquet": plain, "other.arrow": other, "other.parquet": other,
              "empty.arrow": plain.clear(), "none.arrow": pl.DataFrame()}
    writers = {name: detached.Frame(f, "ipc" if name.endswith(".arrow") else "parquet") for name, f in frames.items()}
    folder = tmp_path / "entry"
    with detached.writes_detached():
        assert cachefs.write_entry(folder, writers, {}, 1)
    detached.wait()
    assert cachefs.read_entry(folder, 1) is not None
    for name, want in frames.items():
        got = pl.read_ipc(folder / name) if name.endswith(".arrow") else pl.read_parquet(folder / name)
        assert got.schema == want.schema and got.equals(want), name


def test_command_returns_and_the_writer_finishes_the_entries(trace_sqlite, tmp_path):
    """A real process (the test process may have loaded pyarrow, which turns the fork off)."""
    env = {k: v for k, v in os.environ.items() if k != "K3TRACE_CACHE_WAIT"}
    env["PYTHONPATH"] = str(ROOT)
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "k3trace.cli", "analyze", str(trace_sqlite("small_before")), "--json",
           "--cache-dir", str(cache)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=300)
    probe = [sys.executable, "-c", "from k3trace.ingest import detached; print(detached.can_fork())"]
    if subprocess.run(probe, capture_output=True, text=True, env=env).stdout.strip() != "True":
        pytest.skip("no detached writer here (no fork, or pyarrow missing)")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        entries = [p for sub in ("traces", "analyses") for p in (cache / sub).glob("*")
                   if (p / cachefs.MANIFEST).exists()]
        if len(entries) == 2:
            break
        time.sleep(0.1)
    assert len(entries) == 2, "the detached writer did not finish both entries"
    assert not list(cache.rglob(".tmp-*"))
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=300)
    assert json.loads(second.stdout) == json.loads(first.stdout)


def test_commands_end_at_once_with_their_whole_answer_and_exit_code(trace_sqlite, tmp_path):
    """The console entry ends the process once analyze or diff has answered (no teardown):
    the answer is whole, the exit code kept (diff --fail-on slower: 1), and the cache
    entries are the detached writer's."""
    env = {k: v for k, v in os.environ.items() if k != "K3TRACE_CACHE_WAIT"}
    env["PYTHONPATH"] = str(ROOT)
    base, slow = str(trace_sqlite("small_inside_a")), str(trace_sqlite("small_delay_kda_step"))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    k3 = [sys.executable, "-m", "k3trace.cli"]
    slower = subprocess.run([*k3, "diff", base, slow, "--fail-on", "slower", "--json", *cache], capture_output=True,
                            text=True, env=env, timeout=300, cwd=tmp_path)
    assert slower.returncode == 1 and json.loads(slower.stdout)["verdict"] == "slower"
    faster = subprocess.run([*k3, "diff", slow, base, "--fail-on", "slower", *cache], capture_output=True, text=True,
                            env=env, timeout=300, cwd=tmp_path)
    assert faster.returncode == 0 and faster.stdout.endswith("\n") and faster.stdout.count("\n") > 5
    answered = subprocess.run([*k3, "analyze", base, *cache], capture_output=True, text=True, env=env, timeout=300,
                              cwd=tmp_path)
    assert answered.returncode == 0 and answered.stdout.count("\n") > 10


def test_held_entries_past_their_memory_are_written_at_once(tmp_path):
    frame = pl.DataFrame({"x": list(range(1000))})
    detached.hold(0)  # any frame is past it
    try:
        assert cachefs.write_entry(tmp_path / "e", {"x.arrow": detached.Frame(frame, "ipc")}, {}, 1)
    finally:
        detached.release_held()
    detached.wait()
    assert cachefs.read_entry(tmp_path / "e", 1) is not None
    assert pl.read_ipc(tmp_path / "e" / "x.arrow").equals(frame)
