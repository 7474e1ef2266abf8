"""DRAM throughput from nsys's GPU metrics (k3trace/analyses/dram.py, dram_rate.py), on real
H200 recordings with `--gpu-metrics-device=0 --gpu-metrics-frequency=200000`:

- dram_probe (bench/dram_probe.py): reads and device-to-device copies of a buffer of known
  size, with idle spins between; the expected bytes come from the probe's JSON and the copy
  records' own byte counts, never from k3trace;
- k3_bs1_c72_gm: the K3 decode path at 8 layers (build c72), against the bytes the model
  must read (kernels/k3/config.py);
- hf_gm_base: transformers' Llama (kernels/hf_llama.py), against its parameter bytes
  computed here from its configuration.

Integrals are checked against plain loops over the raw GPU_METRICS rows (sqlite3), steps and
labels against tests/reference.py.
"""

from __future__ import annotations

import bisect
import collections
import json
import sqlite3
import statistics
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import reference  # tests/reference.py
from report_copies import altered_copy, parquetdir_copy
from k3trace.analyses.dram_rate import Rate, dram_source
from k3trace.ingest import load_report

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "k3trace" / "data"
READ, WRITE = "DRAM Read Bandwidth [Throughput %]", "DRAM Write Bandwidth [Throughput %]"


# -- the raw rows, read here ----------------------------------------------------------------

class RawSamples:
    """One metric's samples as recorded: sample i holds its percent of memoryBandwidth from
    its timestamp to the next sample's (docs/metrics.md, "DRAM"); a sample followed by none
    within 1.5 periods holds one period, the rest of the gap is unknown."""

    def __init__(self, path: Path, metric: str = READ) -> None:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        type_id, metric_id = con.execute("SELECT typeId, metricId FROM TARGET_INFO_GPU_METRICS WHERE metricName = ?",
                                         (metric,)).fetchone()
        rows = con.execute("SELECT timestamp, value FROM GPU_METRICS WHERE typeId = ? AND metricId = ? "
                           "ORDER BY timestamp", (type_id, metric_id)).fetchall()
        self.peak = con.execute("SELECT memoryBandwidth FROM TARGET_INFO_GPU").fetchone()[0]
        con.close()
        self.t = [r[0] for r in rows]
        self.percent = [r[1] for r in rows]
        self.period = statistics.median(b - a for a, b in zip(self.t, self.t[1:]) if b > a)
        self.ends = [nxt if nxt - t <= 1.5 * self.period else t + round(self.period)
                     for t, nxt in zip(self.t, self.t[1:] + [float("inf")])]

    def bytes(self, lo: int, hi: int) -> float:
        total = 0.0
        for i in range(max(bisect.bisect_right(self.t, lo) - 1, 0), len(self.t)):
            if self.t[i] >= hi:
                break
            overlap = min(hi, self.ends[i]) - max(lo, self.t[i])
            if overlap > 0:
                total += overlap * self.percent[i] / 100 * self.peak / 1e9
        return total

    def covered(self, lo: int, hi: int) -> int:
        return sum(max(0, min(hi, e) - max(lo, t)) for t, e in zip(self.t, self.ends))


def raw_kernels(path: Path, name: str) -> list[tuple[int, int]]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    rows = con.execute("SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                       "WHERE s.value = ? ORDER BY k.start", (name,)).fetchall()
    con.close()
    return rows


def raw_copies(path: Path) -> list[tuple[int, int, int]]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    rows = con.execute("SELECT start, end, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start").fetchall()
    con.close()
    return rows


# -- the probe: known bytes -----------------------------------------------------------------

@pytest.fixture(scope="module")
def probe(trace_sqlite):
    path = trace_sqlite("dram_probe")
    info = json.loads((DATA / "dram_probe.json").read_text())
    source, notes = dram_source(load_report(path).gpu_metrics, load_report(path).gpus, 0)
    assert source is not None and notes == []
    return path, info, source


def test_probe_reads_and_copies_come_to_their_known_bytes(probe):
    """Each read kernel's and each copy's reads, integrated over its span widened by one
    sampling period on both sides (a sample averages 5 us, so an isolated kernel's traffic
    spreads into the samples straddling its edges), within 3% of the buffer's bytes."""
    path, info, source = probe
    reads = raw_kernels(path, "reduce_kernel")
    copies = raw_copies(path)
    assert len(reads) == len(copies) == info["reps"]
    assert {b for _, _, b in copies} == {info["buffer_bytes"]}
    pad = RawSamples(path).period
    spans = np.array([(s, e) for s, e in reads] + [(s, e) for s, e, _ in copies], dtype=np.int64)
    got = source.read.integral(spans[:, 0] - round(pad), spans[:, 1] + round(pad))
    error = got / info["buffer_bytes"] - 1
    assert np.all(np.abs(error) < 0.03), error
    # The percentages are of about 1.9% more than memoryBandwidth (docs/metrics.md): the bytes
    # at memoryBandwidth come that much short, reads and copies alike.
    assert error.mean() == pytest.approx(-0.019, abs=0.003)
    assert abs(error[:len(reads)].mean() - error[len(reads):].mean()) < 0.005
    # The samples straddling the edges: over the bare span the bytes come short by up to 4%.
    bare = source.read.integral(spans[:, 0], spans[:, 1]) / info["buffer_bytes"] - 1
    assert np.all(bare < error) and np.all(bare > -0.04)


def test_probe_idle_gaps_read_almost_nothing(probe):
    path, info, source = probe
    spins = raw_kernels(path, "spin_kernel")
    assert len(spins) == 2 * info["reps"]
    lo, hi = (np.array(x, dtype=np.int64) for x in zip(*spins))
    share = source.read.integral(lo, hi) / ((hi - lo) * source.peak_bytes_per_s / 1e9)
    assert np.all(share < 0.02), share
    # Away from the kernels' edges (one sample period in), under 1%.
    period = round(source.read.period_ns)
    inner = source.read.integral(lo + period, hi - period) / ((hi - lo - 2 * period) * source.peak_bytes_per_s / 1e9)
    assert np.all(inner < 0.01), inner


def test_probe_integral_matches_the_raw_rows(probe):
    """k3trace's integral = a plain loop over the raw rows, over every kernel and copy, bare
    and widened, and over intervals that start and end mid-sample."""
    path, _, source = probe
    raw = RawSamples(path)
    assert source.read.period_ns == pytest.approx(raw.period)
    assert source.peak_bytes_per_s == raw.peak
    spans = raw_kernels(path, "reduce_kernel") + raw_kernels(path, "spin_kernel") + [(s, e) for s, e, _ in raw_copies(path)]
    spans += [(s - 7_777, e + 1_234) for s, e in spans] + [(raw.t[10] + 1, raw.t[10] + 2), (raw.t[0] - 5, raw.t[3])]
    lo, hi = (np.array(x, dtype=np.int64) for x in zip(*spans))
    expected = [raw.bytes(a, b) for a, b in spans]
    assert source.read.integral(lo, hi) == pytest.approx(expected, rel=1e-9, abs=1e-3)
    writes = RawSamples(path, WRITE)
    assert source.write.integral(lo, hi) == pytest.approx([writes.bytes(a, b) for a, b in spans], rel=1e-9, abs=1e-3)


def test_probe_sample_timestamps_start_their_interval(probe):
    """The convention itself, read off the raw rows: for each read kernel, the first sample
    with reads in it (5% or more) holds more bytes than the kernel could have read, at the
    peak, in the interval that *ends* at its timestamp (for most, that interval lies wholly
    before the kernel started), while the interval that starts there overlaps the kernel."""
    path, _, _ = probe
    raw = RawSamples(path)
    before = 0
    for start, end in raw_kernels(path, "reduce_kernel"):
        i = next(i for i in range(len(raw.t)) if raw.t[i] > start - 6_000 and raw.percent[i] >= 5)
        assert raw.percent[i] / 100 * raw.period > 1.05 * max(0, raw.t[i] - start)
        assert raw.t[i] < end and raw.ends[i] > start
        before += raw.t[i] < start
    assert before >= 8  # mostly 1-3 us before the kernel starts


# -- the K3 path at 8 layers ------------------------------------------------------------------

@pytest.fixture(scope="module")
def k3(trace_sqlite, analysis):
    path = trace_sqlite("k3_bs1_c72_gm")
    return path, reference.compute(path), analysis("k3_bs1_c72_gm")


def test_k3_bytes_per_step_are_the_models_reads(k3):
    from kernels.k3.config import K3Config

    path, ref, a = k3
    layers = {k.layer for s in ref.stable for k in s.kernels if k.layer is not None}
    cfg = K3Config(batch=1, num_layers=max(layers))
    assert max(layers) == 8
    model = sum(sum(cfg.read_bytes(layer).values()) for layer in cfg.layers)
    s = a.dram.summary()
    assert s["steps"] == len(ref.stable) and s["steps_uncovered"] == 0
    assert s["read_gb_per_step"] * 1e9 == pytest.approx(model, rel=0.03)
    # Per stable step, against the raw rows over the reference's step spans.
    raw = RawSamples(path)
    by_first = {s.first: raw.bytes(s.first, s.last) for s in ref.stable}
    steps = a.dram.steps.join(a.steps.select("step", "first_start"), on="step")
    assert len(by_first) == steps.height
    for row in steps.iter_rows(named=True):
        assert row["read_bytes"] == pytest.approx(by_first[row["first_start"]], rel=1e-9)
        span = row["span_ns"]
        assert row["read_tbs"] == pytest.approx(by_first[row["first_start"]] / span / 1e3)
        assert row["idle_equivalent_ns"] == pytest.approx(span - by_first[row["first_start"]] / (raw.peak / 1e9))
    assert s["fraction_of_peak"] == pytest.approx(statistics.median(
        by_first[s_.first] / (s_.last - s_.first) / (raw.peak / 1e9) for s_ in ref.stable))


def raw_windows(ref) -> list[tuple[str, int, int]]:
    """(kind, start, end) of every segment window of the stable steps, from the reference's
    labels: a (layer, family)'s first kernel start to the next one's, families with several
    runs in a layer (in capture order) opening none, a step's last window left out."""
    out = []
    for s in ref.stable:
        runs: dict[tuple[int, str], int] = {}
        prev = None
        for k in s.kernels:
            key = (k.layer, k.family)
            if k.layer is not None and key != prev:
                runs[key] = runs.get(key, 0) + 1
            prev = key
        folded = {f for (_, f), n in runs.items() if n > 1}
        first: dict[tuple[int, str], int] = {}
        for k in s.kernels:
            if k.layer is not None and k.family not in folded:
                first[(k.layer, k.family)] = min(first.get((k.layer, k.family), k.start), k.start)
        openers = sorted((t, f) for (_, f), t in first.items())
        out += [(f"{f} > {nf}", t, nt) for (t, f), (nt, nf) in zip(openers, openers[1:])]
    return out


def test_k3_segments_against_the_raw_rows(k3):
    path, ref, a = k3
    raw = RawSamples(path)
    windows = raw_windows(ref)
    kinds: dict[str, list] = {}
    for kind, lo, hi in windows:
        kinds.setdefault(kind, []).append((lo, hi))
    # K3's attention residual pairs fold into the segments; every layer's attention and MLP open one.
    assert set(kinds) == {"dense > kda", "kda > dense", "kda > moe", "moe > kda", "moe > mla", "mla > moe"}
    got = a.dram.kinds
    assert set(got["kind"]) == set(kinds)
    for row in got.iter_rows(named=True):
        spans = kinds[row["kind"]]
        assert row["instances"] == len(spans)
        assert row["time_us"] == pytest.approx(statistics.median(hi - lo for lo, hi in spans) / 1e3)
        assert row["read_mb"] == pytest.approx(statistics.median(raw.bytes(lo, hi) for lo, hi in spans) / 1e6, rel=1e-9)
        assert row["read_tbs"] == pytest.approx(
            statistics.median(raw.bytes(lo, hi) / (hi - lo) / 1e3 for lo, hi in spans), rel=1e-9)
    # The profile: per 1-us bin from the window's start, the mean over the windows lasting it.
    kind = "moe > kda"
    spans = kinds[kind]
    bins = int(statistics.median(hi - lo for lo, hi in spans)) // 1000
    prof = a.dram.profile.filter(pl.col("kind") == kind).sort("t_us")
    assert prof.height == bins
    for b in (0, 1, 17, bins - 1):
        inside = [lo for lo, hi in spans if (b + 1) * 1000 <= hi - lo]
        mean = statistics.fmean(raw.bytes(lo + b * 1000, lo + (b + 1) * 1000) for lo in inside) / 1000 / 1e3
        assert prof["instances"][b] == len(inside)
        assert prof["read_tbs"][b] == pytest.approx(mean, rel=1e-9)


def test_dips_are_the_runs_below_the_plateau():
    """A made-up profile: runs of bins under 80% of the kind's best bin are dips, with their
    idle-equivalent at the peak and the kernels whose median start falls in them or in the bin
    before; a run with bins missing inside is not one stretch."""
    from k3trace.analyses.dram import dips

    rates = [4.0, 4.0, 1.0, 2.0, 4.0, 3.1, 4.0, 0.5]   # TB/s; the plateau 4.0, the bar 3.2
    prof = pl.DataFrame({"kind": ["a > b"] * 8 + ["c > d"] * 3, "t_us": [float(i) for i in range(8)] + [0.0, 1.0, 4.0],
                         "read_tbs": rates + [4.0, 1.0, 1.0], "instances": [9] * 11})
    offsets = pl.DataFrame({"kind": ["a > b"] * 4, "kernel": ["gemm", "norm", "gemm#2", "score"],
                            "offset_us": [0.2, 1.5, 4.1, 6.9]})
    got = dips(prof, offsets, 5e12)
    peak = 5.0
    assert got.filter(pl.col("kind") == "a > b").rows() == [
        ("a > b", 2.0, 4.0, 1.0, ((peak - 1.0) + (peak - 2.0)) / peak, ["norm"]),
        ("a > b", 5.0, 6.0, 3.1, (peak - 3.1) / peak, ["gemm#2"]),
        ("a > b", 7.0, 8.0, 0.5, (peak - 0.5) / peak, ["score"]),
    ]
    # c > d: bins 1 and 4 are low but bins 2-3 are missing, so no single stretch spans them.
    assert got.filter(pl.col("kind") == "c > d").height == 0


def test_k3_dips_name_the_transitions(k3):
    """On c72: every dip's bins sit under 80% of its kind's best bin and the bins around it do
    not; its idle-equivalent is over those bins; the kernels' offsets are the medians of their
    starts after their window's (raw rows); and the MoE segment shows K3's four hand-overs."""
    path, ref, a = k3
    d = a.dram
    peak = RawSamples(path).peak / 1e12
    for row in d.dips.iter_rows(named=True):
        prof = d.profile.filter(pl.col("kind") == row["kind"]).drop_nulls("read_tbs").sort("t_us")
        bar = 0.8 * prof["read_tbs"].max()
        inside = prof.filter((pl.col("t_us") >= row["from_us"]) & (pl.col("t_us") < row["to_us"]))
        assert inside.height == round(row["to_us"] - row["from_us"]) and (inside["read_tbs"] < bar).all()
        for edge in (row["from_us"] - 1, row["to_us"]):
            around = prof.filter(pl.col("t_us") == edge)["read_tbs"]
            assert around.is_empty() or around[0] >= bar
        assert row["idle_equivalent_us"] == pytest.approx(sum((peak - r) / peak for r in inside["read_tbs"]))
    starts: dict[str, list[int]] = {}
    for kind, lo, hi in raw_windows(ref):
        if kind != "moe > kda":
            continue
        for s in ref.stable:
            starts.setdefault("norm", []).extend(k.start - lo for k in s.kernels
                                                 if k.name == "rmsnorm_kernel" and lo <= k.start < hi)
    offsets = kernel_offsets_of(a)
    assert offsets["rmsnorm_kernel"] == pytest.approx(statistics.median(starts["norm"]) / 1e3)
    moe = d.dips.filter(pl.col("kind") == "moe > kda").sort("from_us")
    named = [set(k) for k in moe["kernels"].to_list()]
    assert any({"moe_grouped_gemm_kernel#2"} <= n for n in named)                    # gate|up -> down
    assert any({"rmsnorm_kernel", "skinny_mm_kernel#2"} <= n for n in named)         # down -> norm -> up
    assert any({"attn_res_score_kernel", "attn_res_combine_kernel"} <= n for n in named)  # up -> the pair
    assert moe["idle_equivalent_us"].sum() < d.kinds.filter(pl.col("kind") == "moe > kda")["time_us"][0]


def test_diff_compares_where_hbm_idled(k3, tmp_path):
    """k3trace diff, both builds with DRAM metrics: per segment kind the old and new time, bytes
    and idle-equivalent. The new build here is the same recording with every DRAM read
    sample doubled (the same kernels, twice the bytes): its bytes are twice the raw rows' over
    the same windows, its idle-equivalent the window's time less those bytes at the peak. The
    recording against itself moves nothing; a side without metrics gives no DRAM table."""
    from k3trace.analyses import analyze
    from k3trace.config import load_config
    from k3trace.diff import diff

    path, ref, a = k3
    doubled = altered_copy(path, tmp_path / "doubled.sqlite", [
        "UPDATE GPU_METRICS SET value = 2 * value WHERE metricId IN (SELECT metricId FROM TARGET_INFO_GPU_METRICS "
        f"WHERE metricName = '{READ}')"])
    b = analyze(load_report(doubled), load_config())
    d = diff([a], [b]).dram
    raw = RawSamples(path)
    us_per_byte = 1e6 / raw.peak
    spans: dict[str, list] = {}
    for kind, lo, hi in raw_windows(ref):
        spans.setdefault(kind, []).append((lo, hi))
    rows = {r["kind"]: r for r in d.iter_rows(named=True)}
    assert set(rows) == {"step", *spans}
    for kind, windows in spans.items():
        r = rows[kind]
        time = statistics.median(hi - lo for lo, hi in windows) / 1e3
        mb = statistics.median(raw.bytes(lo, hi) for lo, hi in windows) / 1e6
        assert r["time_us_old"] == pytest.approx(time) and r["time_us_new"] == pytest.approx(time)
        assert r["read_mb_old"] == pytest.approx(mb, rel=1e-9) and r["read_mb_new"] == pytest.approx(2 * mb, rel=1e-9)
        assert r["idle_us_old"] == pytest.approx(time - mb * 1e6 * us_per_byte, rel=1e-9)
        assert r["idle_us_new"] == pytest.approx(time - 2 * mb * 1e6 * us_per_byte, rel=1e-9)
        per_step = statistics.median(collections.Counter(
            next(s.first for s in ref.stable if s.first <= lo <= s.last) for lo, _ in windows).values())
        assert r["idle_us_per_step_delta"] == pytest.approx(-mb * 1e6 * us_per_byte * per_step, rel=1e-9)
    steps = [(s.first, s.last) for s in ref.stable]
    step_mb = statistics.median(raw.bytes(lo, hi) for lo, hi in steps) / 1e6
    assert rows["step"]["read_mb_new"] == pytest.approx(2 * rows["step"]["read_mb_old"], rel=1e-9)
    assert rows["step"]["read_mb_old"] == pytest.approx(step_mb, rel=1e-9)
    same = diff([a], [a]).dram
    assert same["idle_us_per_step_delta"].abs().max() == 0
    hf = analyze(load_report(altered_copy(path, tmp_path / "none.sqlite", ["DELETE FROM GPU_METRICS"])), load_config())
    assert diff([a], [hf]).dram is None and "dram" not in diff([a], [hf]).to_json()


def kernel_offsets_of(a) -> dict[str, float]:
    from k3trace.analyses.dram import kernel_offsets, segment_windows

    stable = a.kernels.filter(pl.col("step").is_in(a.dram.steps["step"].implode()))
    off = kernel_offsets(stable, segment_windows(stable)).filter(pl.col("kind") == "moe > kda")
    return dict(zip(off["kernel"].to_list(), off["offset_us"].to_list()))


def test_k3_family_reads_against_the_raw_rows(k3):
    """A family's reads: over the union of its kernel intervals in the step (median over steps)."""
    path, ref, a = k3
    raw = RawSamples(path)
    per_family: dict[str, list[float]] = {}
    for s in ref.stable:
        for fam in {k.family for k in s.kernels}:
            merged = reference.union([(k.start, k.end) for k in s.kernels if k.family == fam])
            per_family.setdefault(fam, []).append(sum(raw.bytes(lo, hi) for lo, hi in merged))
    got = {r["family"]: r for r in a.dram.families.iter_rows(named=True)}
    assert set(got) == set(per_family)
    for fam, values in per_family.items():
        assert got[fam]["read_mb"] == pytest.approx(statistics.median(values) / 1e6, rel=1e-9), fam
    assert sum(r["share_of_reads"] for r in got.values()) > 1.0  # two streams: overlapping time counts twice


# -- transformers' Llama --------------------------------------------------------------------

def hf_read_bytes(info: dict) -> tuple[int, int]:
    """(parameter bytes, KV-cache bytes) one decode step must read, from kernels/hf_llama.py's
    configuration: intermediate 4 x hidden, heads hidden / 128 of 128, KV heads
    max(hidden // 512, 1), vocabulary 32000, LM head not tied; bf16; a StaticCache of
    context (512, the default) + steps + 8 positions, read whole by SDPA every step."""
    h, layers = info["hidden"], info["layers"]
    heads, kv_heads, head_dim, inter, vocab = h // 128, max(h // 512, 1), 128, 4 * h, 32000
    attention = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
    mlp = 3 * h * inter
    params = layers * (attention + mlp + 2 * h) + vocab * h + h + h   # LM head, final norm, one embedding row
    cache = layers * 2 * (512 + info["steps"] + 8) * kv_heads * head_dim
    return 2 * params, 2 * cache


def test_hf_bytes_per_step_are_its_parameters(trace_sqlite, analysis):
    """Within 3%: the metric reads 1.9% low (the probe), and GQA's repeat_kv copies of the
    cache (4x its 18 MB) may or may not leave the 60 MB L2; activations stay in L2."""
    info = json.loads((DATA / "hf_gm_base.json").read_text())
    params, cache = hf_read_bytes(info)
    a = analysis("hf_gm_base")
    s = a.dram.summary()
    # The fixture keeps 20 ms of samples (scrub --window 40:60): the steps they cover whole.
    ref = reference.compute(trace_sqlite("hf_gm_base"))
    raw = RawSamples(trace_sqlite("hf_gm_base"))
    covered = [st for st in ref.stable if raw.covered(st.first, st.last) == st.last - st.first]
    assert s["steps"] == len(covered) >= 8 and s["steps_uncovered"] == len(ref.stable) - len(covered)
    assert s["read_gb_per_step"] * 1e9 == pytest.approx(params + cache, rel=0.03)
    assert s["read_gb_per_step"] * 1e9 == pytest.approx(
        statistics.median(raw.bytes(st.first, st.last) for st in covered), rel=1e-9)
    assert any("cover 9 of the 28 stable steps" in n for n in a.notes)
    assert {r["kind"] for r in a.dram.kinds.iter_rows(named=True)} == {"attn > mlp", "mlp > attn", "mlp > head"}


def test_samples_covering_no_whole_step_give_no_dram_numbers(trace_sqlite, tmp_path):
    from k3trace.analyses import analyze
    from k3trace.config import load_config
    from k3trace.scrub import scrub

    short = tmp_path / "short.sqlite"
    scrub(trace_sqlite("hf_gm_base"), short, window=(45_000_000, 46_000_000))
    a = analyze(load_report(short), load_config())
    assert a.dram is None and "dram" not in a.to_json()
    assert any("cover none of the 28 stable steps" in n for n in a.notes)


# -- reports without metrics, damaged metrics -----------------------------------------------------

def test_report_without_metrics_is_unchanged(trace_sqlite, analysis):
    trace = load_report(trace_sqlite("k3_bs1_c72"))
    assert trace.gpu_metrics.is_empty() and trace.gpu_metrics.schema == load_report(
        trace_sqlite("dram_probe")).gpu_metrics.schema
    a = analysis("k3_bs1_c72")
    assert a.dram is None and "dram" not in a.to_json()
    assert not any("DRAM" in n for n in a.notes)


damaged_copy = altered_copy


def dram_rowids(path: Path, n: int) -> list[int]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    ids = [r[0] for r in con.execute(
        "SELECT g.rowid FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t USING (typeId, metricId) "
        "WHERE t.metricName = ? ORDER BY g.timestamp LIMIT ?", (READ, n))]
    con.close()
    return ids


def test_damaged_metric_rows_are_excluded_and_reported(trace_sqlite, tmp_path):
    from k3trace.analyses import analyze
    from k3trace.config import load_config

    src = trace_sqlite("k3_bs1_c72_gm")
    ids = dram_rowids(src, 300)[200:]
    path = damaged_copy(src, tmp_path / "damaged.sqlite", [
        f"UPDATE GPU_METRICS SET value = 'n/a' WHERE rowid IN ({','.join(map(str, ids[:40]))})",
        f"UPDATE GPU_METRICS SET timestamp = NULL WHERE rowid IN ({','.join(map(str, ids[40:50]))})",
        f"UPDATE GPU_METRICS SET value = -3 WHERE rowid IN ({','.join(map(str, ids[50:55]))})",
        f"INSERT INTO GPU_METRICS SELECT * FROM GPU_METRICS WHERE rowid IN ({','.join(map(str, ids[60:62]))})",
        # another metric's row with text in it is not read at all
        "UPDATE GPU_METRICS SET value = 'x' WHERE rowid = (SELECT min(g.rowid) FROM GPU_METRICS g JOIN "
        f"TARGET_INFO_GPU_METRICS t USING (typeId, metricId) WHERE t.metricName = '{WRITE}')",
    ])
    clean, trace = load_report(src), load_report(path)
    found = {r["issue"]: r["rows"] for r in trace.findings.filter(pl.col("table") == "GPU_METRICS").iter_rows(named=True)}
    assert found == {"with non-integer values in integer columns": 41, "with no timestamp or value": 10,
                     "with negative values": 5, "duplicating another row": 2}
    assert trace.gpu_metrics.height == clean.gpu_metrics.height - 41 - 10 - 5
    a = analyze(trace, load_config())
    assert not a.completeness.ok
    assert any("GPU_METRICS" in p and "excluded as damaged" in p for p in a.completeness.problems)
    assert a.dram is not None


def test_metrics_table_without_a_column_leaves_dram_out(trace_sqlite, tmp_path):
    """Another nsys's metrics layout costs the report its DRAM numbers, with a finding, not
    the kernels' analysis."""
    from k3trace.analyses import analyze
    from k3trace.config import load_config

    for table, col in (("GPU_METRICS", "value"), ("TARGET_INFO_GPU_METRICS", "metricName")):
        path = damaged_copy(trace_sqlite("dram_probe"), tmp_path / f"renamed_{table}.sqlite",
                            [f"ALTER TABLE {table} RENAME COLUMN {col} TO other"])
        trace = load_report(path)
        assert trace.gpu_metrics.is_empty() and trace.kernels.height > 0
        found = trace.findings.filter(pl.col("table") == table)["issue"].to_list()
        assert found == [f"without column {col}: DRAM numbers left out"]
        assert analyze(trace, load_config()).dram is None


def test_metric_names_decide_not_ids(trace_sqlite, tmp_path):
    """Ids differ between nsys versions: the DRAM rows are found by name wherever their ids are."""
    src = trace_sqlite("dram_probe")
    swapped = damaged_copy(src, tmp_path / "ids.sqlite", [
        "UPDATE GPU_METRICS SET metricId = metricId + 100", "UPDATE TARGET_INFO_GPU_METRICS SET metricId = metricId + 100"])
    a, b = load_report(src).gpu_metrics, load_report(swapped).gpu_metrics
    assert a.height > 0 and a.equals(b)


def test_metric_ids_are_per_gpu_type(trace_sqlite, tmp_path):
    """A second GPU type whose id 18 is another metric and whose DRAM read is id 20: each
    type's rows are read by its own names."""
    src = trace_sqlite("dram_probe")
    path = damaged_copy(src, tmp_path / "two.sqlite", [
        "INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId + 1, sourceId, typeName, 18, 'SM Active [Throughput %]' "
        "FROM TARGET_INFO_GPU_METRICS LIMIT 1",
        f"INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId + 1, sourceId, typeName, 20, '{READ}' "
        "FROM TARGET_INFO_GPU_METRICS LIMIT 1",
        "INSERT INTO GPU_METRICS SELECT timestamp, typeId + 1, 18, 77 FROM GPU_METRICS WHERE metricId = 18",
        "INSERT INTO GPU_METRICS SELECT timestamp, typeId + 1, 20, 5 FROM GPU_METRICS WHERE metricId = 18",
    ])
    a, b = load_report(src).gpu_metrics, load_report(path).gpu_metrics
    second = b.filter(pl.col("type_id") != a["type_id"][0])
    assert b.filter(pl.col("type_id") == a["type_id"][0]).equals(a)
    assert second["metric"].unique().to_list() == ["dram_read"] and second["value"].unique().to_list() == [5]
    assert second.height == a.filter(pl.col("metric") == "dram_read").height


def test_filtered_reads_leave_the_other_rows_unread(trace_sqlite, tmp_path):
    """`read(only=...)` in both export forms: the rows of the other ids never come back."""
    from k3trace.ingest.tables import ParquetDirTables, SqliteTables

    src = trace_sqlite("dram_probe")
    (tmp_path / "pq").mkdir()
    con = sqlite3.connect(f"file:{src}?mode=ro&immutable=1", uri=True)
    rows = con.execute("SELECT timestamp, typeId, metricId, value FROM GPU_METRICS").fetchall()
    con.close()
    pl.DataFrame(rows, schema=["timestamp", "typeId", "metricId", "value"], orient="row").write_parquet(
        tmp_path / "pq" / "GPU_METRICS.parquet", row_group_size=500)
    cols = ["timestamp", "typeId", "metricId", "value"]
    for tables in (SqliteTables(src), ParquetDirTables(tmp_path / "pq")):
        read = tables.read("GPU_METRICS", cols, integers=cols, only=("metricId", [19]))
        assert read["metricId"].unique().to_list() == [19]
        assert read.height == sum(1 for r in rows if r[2] == 19)
        assert tables.read("GPU_METRICS", cols, integers=cols, only=("metricId", [4])).height == 0


def test_parquetdir_reads_the_same_samples(trace_sqlite, tmp_path):
    src = trace_sqlite("dram_probe")
    out = parquetdir_copy(src, tmp_path / "probe_pq", (
        "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "META_DATA_EXPORT",
        "TARGET_INFO_GPU", "GPU_METRICS", "TARGET_INFO_GPU_METRICS"), row_group_size=2000)
    a, b = load_report(src), load_report(out)
    assert b.form == "parquetdir"
    assert a.gpu_metrics.height > 0 and a.gpu_metrics.equals(b.gpu_metrics) and a.gpus.equals(b.gpus)


def test_several_gpus_take_the_analysed_device(trace_sqlite):
    """Samples of two GPUs: the one whose kernels are analysed, by the type id's low byte;
    none when neither is that device, with a note."""
    trace = load_report(trace_sqlite("dram_probe"))
    other = trace.gpu_metrics.with_columns(pl.col("type_id") + 1, pl.lit(1, pl.Int32).alias("device_id"),
                                           pl.col("value") * 0)
    both = pl.concat([trace.gpu_metrics, other])
    gpus = pl.concat([trace.gpus, trace.gpus.with_columns(pl.lit(1, pl.Int32).alias("device_id"),
                                                          pl.lit(1, pl.Int64).alias("memory_bandwidth"))])
    source, _ = dram_source(both, gpus, 0)
    assert source.device_id == 0 and source.peak_bytes_per_s == trace.gpus["memory_bandwidth"][0]
    assert source.read.bytes_per_ns.max() > 0
    source, notes = dram_source(both, gpus, 1)
    assert source.device_id == 1 and source.peak_bytes_per_s == 1
    source, notes = dram_source(both, gpus, 5)
    assert source is None and "2 GPUs" in notes[0]
    source, notes = dram_source(trace.gpu_metrics, gpus.with_columns(pl.lit(None, pl.Int64).alias("memory_bandwidth")), 0)
    assert source is None and "memoryBandwidth" in notes[0]


# -- the rate on its own -----------------------------------------------------------------------

def test_rate_is_piecewise_from_each_sample_to_the_next():
    # Of a 1 B/ns peak: 10% from 0 to 5000, 50% to 10000, 20% for one period (5000) after
    # 10000 (the next sample is 4 periods away), unknown to 30000, 40% for one period after it.
    rate = Rate.of_samples(np.array([10_000, 0, 5_000, 30_000]), np.array([20, 10, 50, 40]), 1e9)
    assert rate.period_ns == 5_000
    lo = np.array([0, 2_500, 9_000, 14_000, 20_000, 29_000, -100, 0])
    hi = np.array([5_000, 7_500, 11_000, 16_000, 25_000, 40_000, 100, 40_000])
    expected = [500, 250 + 1250, 500 + 200, 200, 0, 2000, 10, 500 + 2500 + 1000 + 2000]
    assert rate.integral(lo, hi) == pytest.approx(expected)
    assert rate.covered(lo, hi).tolist() == [5_000, 5_000, 2_000, 1_000, 0, 5_000, 100, 20_000]
    empty = Rate.of_samples(np.array([], dtype=np.int64), np.array([]), 1e9)
    assert empty.integral(lo, hi).tolist() == [0.0] * len(lo)


# -- scrub, the commands ----------------------------------------------------------------------

def test_scrub_keeps_the_dram_samples_only(trace_sqlite, tmp_path):
    """Another metric's samples and the GENERIC_EVENTS copies are dropped, the DRAM samples and
    the GPU's peak kept: the analysis reads the same; --window trims the samples to a range."""
    from k3trace.scrub import scrub

    src = trace_sqlite("k3_bs1_c72_gm")
    raw = damaged_copy(src, tmp_path / "raw.sqlite", [
        "INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId, sourceId, typeName, 3, 'SM Active [Throughput %]' "
        "FROM TARGET_INFO_GPU_METRICS LIMIT 1",
        "INSERT INTO GPU_METRICS SELECT timestamp, typeId, 3, 99 FROM GPU_METRICS",
        "INSERT INTO GENERIC_EVENTS SELECT timestamp, timestamp, typeId, '{}' FROM GPU_METRICS LIMIT 50",
    ])

    def counts(path: Path) -> tuple[int, int, int, int]:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        dram = con.execute("SELECT count(*) FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t USING (typeId, metricId) "
                           "WHERE t.metricName LIKE 'DRAM%'").fetchone()[0]
        other = con.execute("SELECT count(*) FROM GPU_METRICS WHERE metricId = 3").fetchone()[0]
        generic = con.execute("SELECT count(*) FROM GENERIC_EVENTS WHERE typeId IN "
                              "(SELECT typeId FROM TARGET_INFO_GPU_METRICS)").fetchone()[0]
        peak = con.execute("SELECT memoryBandwidth FROM TARGET_INFO_GPU").fetchone()[0]
        con.close()
        return dram, other, generic, peak

    before = counts(raw)
    assert before[1] == before[0] and before[2] == 50
    out = tmp_path / "clean.sqlite"
    summary = scrub(raw, out)
    assert counts(out) == (before[0], 0, 0, before[3])
    assert summary["GPU metric samples dropped"] == before[0]
    assert load_report(out).gpu_metrics.equals(load_report(src).gpu_metrics)
    # A window in ns: the samples inside it, no others.
    lo, hi = 95_000_000, 100_000_000
    trimmed = tmp_path / "trimmed.sqlite"
    scrub(raw, trimmed, window=(lo, hi))
    kept = load_report(trimmed).gpu_metrics
    whole = load_report(src).gpu_metrics
    assert kept.equals(whole.filter(pl.col("timestamp").is_between(lo, hi)))
    # Near GPU work: every sample within 50 us of a kernel stays.
    near = tmp_path / "near.sqlite"
    scrub(raw, near, window="kernels")
    kernels = raw_kernels(src, "skinny_mm_kernel")
    t = np.array(load_report(near).gpu_metrics["timestamp"])
    for s, e in kernels[::50]:
        assert np.count_nonzero((t >= s - 10_000) & (t <= e + 10_000)) == np.count_nonzero(
            (whole["timestamp"].to_numpy() >= s - 10_000) & (whole["timestamp"].to_numpy() <= e + 10_000))


def test_commands_show_dram_only_where_recorded(trace_sqlite, tmp_path, cache_dir):
    from typer.testing import CliRunner

    from k3trace.cli import app

    runner = CliRunner()
    run = lambda *args: runner.invoke(app, [*args, "--cache-dir", str(cache_dir)], catch_exceptions=False)  # noqa: E731
    with_metrics, without = str(trace_sqlite("k3_bs1_c72_gm")), str(trace_sqlite("k3_bs1_c72"))
    shown = run("analyze", with_metrics, "--width", "160")
    assert shown.exit_code == 0 and "DRAM (GPU metrics)" in shown.stdout and "moe > mla" in shown.stdout
    assert "DRAM" not in run("analyze", without, "--width", "160").stdout
    j = json.loads(run("analyze", with_metrics, "--json").stdout)["dram"]
    assert j["steps"] == 28 and j["peak_tbs"] == pytest.approx(4.814304)
    assert {f["family"] for f in j["families"]} == {"moe", "kda", "attn_res", "mla", "dense"}
    assert all(len(p["read_tbs"]) == len(p["instances"]) > 10 for p in j["profile"])
    assert "dram" not in json.loads(run("analyze", without, "--json").stdout)
    # Read back from the analysis cache: the same document.
    assert json.loads(run("analyze", with_metrics, "--json").stdout)["dram"] == j
    page = tmp_path / "k3.html"
    assert run("analyze", with_metrics, "--html", str(page)).exit_code == 0
    assert "<section id='dram'>" in page.read_text()


def test_record_and_scrub_options():
    from typer.testing import CliRunner

    from k3trace.cli import app

    runner = CliRunner()
    dry = runner.invoke(app, ["record", "--gpu-metrics", "--dry-run", "-o", "run"])
    assert dry.exit_code == 0 and "--gpu-metrics-device=0 --gpu-metrics-frequency=200000" in dry.stdout
    assert "--gpu-metrics" not in runner.invoke(app, ["record", "--dry-run", "-o", "run"]).stdout
    torch = runner.invoke(app, ["record", "--gpu-metrics", "--profiler", "torch", "--dry-run"])
    assert torch.exit_code == 2 and "--gpu-metrics needs nsys" in torch.output
    bad = runner.invoke(app, ["scrub", "x.sqlite", "-o", "y.sqlite", "--window", "9:3"])
    assert bad.exit_code == 2 and "--window" in bad.output and "Traceback" not in bad.output
