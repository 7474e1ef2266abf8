"""The streaming event-array reader (k3trace/ingest/chrome_json.py) against json.loads, and
bad or foreign JSON through the CLI: one line naming the problem and the fix, exit 2."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from k3trace.ingest.chrome_json import JsonError, read_events

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "k3trace" / "data" / "hf_base_kineto.pt.trace.json.gz"
SCHEMA = pl.Schema({"ph": pl.String, "name": pl.String, "ts": pl.Float64,
                    "args": pl.Struct({"correlation": pl.Int64, "name": pl.String})})


def read(data: bytes, chunk: int = 1 << 20) -> tuple[pl.DataFrame, dict]:
    return read_events(io.BytesIO(data), "t.json", SCHEMA, lambda f: f, chunk=chunk)


@pytest.mark.parametrize("chunk", [7, 64, 4096, 1 << 20])
def test_fixture_in_any_chunking(chunk):
    """Kineto's own layout, cut at arbitrary bytes (inside strings, numbers, escapes)."""
    data = gzip.decompress(FIXTURE.read_bytes())
    if chunk < 64:
        data = data[:200_000] + b"\n]}"  # keep the tiny-chunk runs short
        data = data[: data.rindex(b"  },", 0, 200_000)] + b"  }\n]}"
    events, meta = read(data, chunk)
    expected = json.loads(data)
    assert events["name"].to_list() == [e.get("name") for e in expected["traceEvents"]]
    assert events["ts"].to_list() == [e.get("ts") for e in expected["traceEvents"]]
    assert meta["deviceProperties"][0]["name"] == "NVIDIA H200"


def test_strings_with_brackets_escapes_and_one_line_layout():
    names = ['void k<{lambda()#1}>(int)', 'a "quoted" ] name', 'back\\slash\\', 'x\\"}{,[', "\u00e9\n\t"]
    doc = {"traceName": "x", "traceEvents": [{"ph": "X", "name": n, "ts": i + 0.5, "args": {"correlation": i}}
                                             for i, n in enumerate(names)], "after": {"traceEvents": []}}
    for text in (json.dumps(doc), json.dumps(doc, indent=3), json.dumps(doc["traceEvents"])):
        for chunk in (3, 50, 1 << 16):
            events, _ = read(text.encode(), chunk)
            assert events["name"].to_list() == names
            assert events["args"].struct.field("correlation").to_list() == list(range(len(names)))


@pytest.mark.parametrize("text, says", [
    (b"", "is empty"),
    (b"   \n", "is empty"),
    (b'{"foo": [1, 2], "bar": {}}', "without a `traceEvents` array"),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": ', "is truncated"),
    (b'{"traceEvents": [{"ph": "X", "ts": oops}]}', "is not valid trace JSON"),
    (b'{"schemaVersion": 1, ', "ends before any `traceEvents` array"),
    (b"hello", "is not JSON"),
])
def test_not_a_trace(text, says):
    with pytest.raises(JsonError, match=says.replace("[", r"\[")):
        read(text)


def k3trace(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "K3TRACE_NSYS"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin"
    return subprocess.run([sys.executable, "-m", "k3trace.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, timeout=300)


def bad_input(path: Path, says: str) -> None:
    before = set(os.listdir(path.parent))
    done = k3trace("analyze", str(path), "--no-cache")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("k3trace: ") and ";" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert says in lines[0], lines[0]
    assert set(os.listdir(path.parent)) == before


def test_cli_bad_json(tmp_path):
    plain = gzip.decompress(FIXTURE.read_bytes())
    cases = {
        "cut.pt.trace.json": (plain[: len(plain) // 2], "is truncated: the `traceEvents` array never closes"),
        "cut.json.gz": (FIXTURE.read_bytes()[:50_000], "cannot decompress"),
        "foreign.json": (b'{"name": "not a trace", "values": [1, 2, 3]}', "without a `traceEvents` array"),
        "cpu_only.json": (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                                        "tid": 1, "ts": 1.0, "dur": 2.0}]}).encode(),
                          "holds no GPU kernel events"),
        "broken.json": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1.0,, }]}', "is not valid trace JSON"),
    }
    for name, (data, says) in cases.items():
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        path = folder / name
        path.write_bytes(data)
        path.chmod(0o444)
        bad_input(path, says)


def test_cli_analyze_and_diff_kineto(tmp_path):
    other = tmp_path / "again.pt.trace.json.gz"
    other.write_bytes(FIXTURE.read_bytes())
    done = k3trace("analyze", str(FIXTURE), "--json", "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["steps"]["source"] == "graph" and doc["steps"]["kernels_per_step"] == 429
    done = k3trace("diff", str(FIXTURE), str(other), "--json", "--no-cache")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["itl_delta_us"] == 0


def test_record_with_torch_profiler_plan(tmp_path):
    done = k3trace("record", "--profiler", "torch", "--workload", "small", "--steps", "5",
                   "-o", str(tmp_path / "run"), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "-m kernels.record_loop --workload small" in done.stdout
    assert f"--kineto {tmp_path / 'run'}.pt.trace.json.gz" in done.stdout and "nsys" not in done.stdout
    done = k3trace("record", "--profiler", "torch", "--", "vllm", "serve", "m")
    assert done.returncode == 2 and "built-in workload only" in done.stderr
