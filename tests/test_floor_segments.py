"""bench/floor_segments.py on the bundled 8-layer K3 recordings: the segments between the
layers' first kernels, against plain loops over the raw rows (tests/reference.py), and the
bytes they split the HBM floor into."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import reference  # tests/reference.py

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "floor_segments.py"
#: bench_k3_step.py's floor at full depth, B = 1, on the H200 (kernels/README.md, round thirteen):
#: 36.02 GB per step, the routing's 16 distinct experts per MoE layer.
FULL_DEPTH_B1_GB = 36.02


@pytest.fixture(scope="module")
def segments_module(bench_script):
    return bench_script("floor_segments")


def raw_segments(r) -> dict[str, list[tuple[int, int]]]:
    """kind -> every segment's (time, tail) in ns over the stable steps: from each (layer,
    family)'s first kernel start (attention and MLP families), and from its last one's, to
    the next (layer, family)'s first."""
    out: dict[str, list[tuple[int, int]]] = {}
    for s in r.stable:
        first: dict[tuple[int, str], int] = {}
        last: dict[tuple[int, str], int] = {}
        for k in s.kernels:
            if k.family in ("kda", "mla", "moe", "dense") and k.layer is not None:
                key = (k.layer, k.family)
                first[key] = min(first.get(key, k.start), k.start)
                last[key] = max(last.get(key, k.start), k.start)
        anchors = sorted((start, key) for key, start in first.items())
        for (start, key), (after, next_key) in zip(anchors, anchors[1:]):
            family = key[1]
            kind = f"{family} > {next_key[1]}" if family in ("moe", "dense") else family
            out.setdefault(kind, []).append((after - start, after - last[key]))
    return out


def test_segments_are_the_gaps_between_the_layers_first_kernels(segments_module, analysis, trace_sqlite):
    name = "k3_bs1_c69"
    truth = raw_segments(reference.compute(trace_sqlite(name)))
    a = analysis(name)
    segments = segments_module.segment_times(a.kernels, a.step_times["step"].to_list())
    got = {kind: sorted(zip(g["time_ns"].to_list(), g["tail_ns"].to_list())) for (kind,), g in segments.group_by("kind")}
    assert got == {kind: sorted(v) for kind, v in truth.items()}
    # 8 layers: KDA on 1-3 and 5-7, MLA on 4 and 8; the last MoE segment has no end anchor.
    assert {kind: len(v) // a.stable_steps for kind, v in truth.items()} == {
        "kda": 6, "mla": 2, "moe > kda": 4, "moe > mla": 2, "dense > kda": 1}
    from kernels.k3.config import K3Config
    table = segments_module.floor_table(segments, segments_module.segment_bytes(K3Config(num_layers=8)), 4.21e3)
    row = {r["kind"]: r for r in table.to_dicts()}
    for kind, v in truth.items():
        assert row[kind]["median_us"] == pytest.approx(statistics.median(t for t, _ in v) / 1e3)
        assert row[kind]["tail_us"] == pytest.approx(statistics.median(t for _, t in v) / 1e3)
        assert 0 < row[kind]["tail_us"] < row[kind]["median_us"]
        assert row[kind]["above_us"] == pytest.approx(row[kind]["median_us"] - row[kind]["mb"] * 1e6 / 4.21e6)


def test_segment_bytes_split_the_floor_without_loss(segments_module):
    from kernels.k3.config import K3Config
    cfg = K3Config(batch=1)
    nbytes = segments_module.segment_bytes(cfg)
    per_step = sum(nbytes[cfg.attention_family(l)] + nbytes[cfg.mlp_family(l)] for l in cfg.layers)
    assert per_step / 1e9 == pytest.approx(FULL_DEPTH_B1_GB, abs=0.005)


def test_bad_input_is_one_line_and_exit_2(trace_sqlite, tmp_path):
    not_a_report = tmp_path / "notes.sqlite"
    not_a_report.write_text("not a report\n")
    for path, says in ((trace_sqlite("hf_base_a"), "no K3 layer segments"),
                       (not_a_report, "is not a report k3trace can read"),
                       (tmp_path / "missing.sqlite", "not found")):
        before = sorted(p.name for p in path.parent.iterdir())
        done = subprocess.run([sys.executable, str(SCRIPT), str(path), "--copy-tbs", "4.2"],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and says in done.stderr and "Traceback" not in done.stderr
        assert sorted(p.name for p in path.parent.iterdir()) == before  # nothing written beside it
