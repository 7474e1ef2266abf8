"""How much of a decode step's time HBM streams, from nsys's DRAM metrics (docs/metrics.md,
"DRAM"): per stable step the bytes read and the time they would take at the peak; per
family the bytes read while its kernels run; per segment (a (layer, family)'s first kernel
to the next one's) the bytes and throughput, and the mean throughput by time since the
segment's start over all its instances.

Samples average 5 us: one sample cannot show a transition of 1-2 us between two GEMMs. Its
phase against a segment's start is random, though, so the mean over many instances at a
given time since the start is the true rate smoothed by a triangle of +-1 sampling period
(5 us at half height), at 1-us resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from k3trace import intervals
from k3trace.analyses.dram_rate import DramSource, Rate, dram_source

#: The profile's bins (ns).
PROFILE_BIN_NS = 1000
#: A dip: a run of a kind's profile bins below this share of its best bin (its GEMMs' plateau).
DIP_SHARE = 0.8
#: Kernels named per dip in the text outputs (the frame keeps them all).
DIP_KERNELS_SHOWN = 4
TB = 1e12


@dataclass(frozen=True)
class DramReading:
    """The DRAM numbers of one analysis (docs/metrics.md, "DRAM"); medians over the stable
    steps the samples cover."""

    device_id: int
    peak_bytes_per_s: float        # TARGET_INFO_GPU.memoryBandwidth, what the percentages are of
    sample_period_ns: float
    steps: pl.DataFrame            # per covered stable step: step, span_ns, read_bytes, write_bytes, ...
    families: pl.DataFrame         # family, device_busy_us, read_mb, read_tbs, share_of_reads
    kinds: pl.DataFrame            # per segment kind: kind, per_step, time_us, read_mb, read_tbs
    segments: pl.DataFrame         # per (layer, family) segment: layer, family, kind, time_us, read_mb, read_tbs
    profile: pl.DataFrame          # kind, t_us (bin start), read_tbs (mean), instances
    uncovered_steps: int           # stable steps the samples do not cover whole
    dips: pl.DataFrame             # kind, from_us, to_us, min_tbs, idle_equivalent_us, kernels (list[str])

    def summary(self) -> dict[str, Any]:
        """The step's numbers: medians over the covered stable steps."""
        s = self.steps

        def median(col: str, scale: float = 1.0) -> float | None:
            v = s[col].drop_nulls()
            return None if v.is_empty() else float(v.median()) / scale

        return {"device_id": self.device_id, "peak_tbs": self.peak_bytes_per_s / TB,
                "sample_period_us": self.sample_period_ns / 1e3, "steps": s.height,
                "steps_uncovered": self.uncovered_steps,
                "read_gb_per_step": median("read_bytes", 1e9), "write_gb_per_step": median("write_bytes", 1e9),
                "span_us": median("span_ns", 1e3), "read_tbs": median("read_tbs"),
                "fraction_of_peak": median("fraction_of_peak"),
                "idle_equivalent_us": median("idle_equivalent_ns", 1e3)}

    def to_json(self) -> dict[str, Any]:
        # One list per kind: bin i runs from i to i + 1 bins after the segment's start.
        profile = self.profile.group_by("kind", maintain_order=True).agg("read_tbs", "instances")
        return {**self.summary(), "profile_bin_us": PROFILE_BIN_NS / 1e3,
                "families": self.families.to_dicts(), "segment_kinds": self.kinds.to_dicts(),
                "segments": self.segments.to_dicts(), "profile": profile.to_dicts(), "dips": self.dips.to_dicts()}


def read_dram(metrics: pl.DataFrame, gpus: pl.DataFrame, steps: pl.DataFrame, kernels: pl.DataFrame,
              device: int | None) -> tuple[DramReading | None, list[str]]:
    """The DRAM reading of the stable steps (`steps`: step, stable, first_start, last_end;
    `kernels`: the stable steps' labelled kernels), with notes; None without DRAM metrics."""
    source, notes = dram_source(metrics, gpus, device)
    if source is None:
        return None, notes
    stable = steps.filter(pl.col("stable")).select("step", pl.col("first_start").alias("start"),
                                                   pl.col("last_end").alias("end"))
    per_step = step_reads(source, stable)
    uncovered = stable.height - per_step.height
    if per_step.is_empty():
        return None, [f"the DRAM metrics cover none of the {stable.height} stable steps whole: no DRAM numbers"]
    if uncovered:
        notes.append(f"the DRAM metrics cover {per_step.height} of the {stable.height} stable steps "
                     "(whole steps only): the DRAM numbers are over those")
    kernels = kernels.filter(pl.col("step").is_in(per_step["step"].implode()))
    windows = segment_windows(kernels)
    prof = profile(source.read, windows)
    return DramReading(
        device_id=source.device_id, peak_bytes_per_s=source.peak_bytes_per_s,
        sample_period_ns=source.read.period_ns, steps=per_step,
        families=family_reads(source.read, kernels, per_step), kinds=kind_reads(source.read, windows),
        segments=layer_segment_reads(source.read, windows), profile=prof,
        uncovered_steps=uncovered,
        dips=dips(prof, kernel_offsets(kernels, windows), source.peak_bytes_per_s)), notes


def _integral(rate: Rate, frame: pl.DataFrame) -> pl.Series:
    return pl.Series(rate.integral(frame["start"].to_numpy(), frame["end"].to_numpy()))


def step_reads(source: DramSource, stable: pl.DataFrame) -> pl.DataFrame:
    """Per stable step the samples cover whole (step, start, end): span_ns, read_bytes,
    write_bytes, read_tbs (mean over the span), fraction_of_peak, and idle_equivalent_ns:
    the span less the time the bytes read take at the peak."""
    lo, hi = stable["start"].to_numpy(), stable["end"].to_numpy()
    whole = source.read.covered(lo, hi) >= hi - lo
    steps = stable.filter(pl.Series(whole))
    peak_per_ns = source.peak_bytes_per_s / 1e9
    write = _integral(source.write, steps) if source.write is not None else None
    return steps.select(
        "step", (pl.col("end") - pl.col("start")).alias("span_ns"), _integral(source.read, steps).alias("read_bytes"),
        (write if write is not None else pl.lit(None, pl.Float64)).alias("write_bytes"),
    ).with_columns(
        (pl.col("read_bytes") / pl.col("span_ns") / 1e3).alias("read_tbs"),
        (pl.col("read_bytes") / pl.col("span_ns") / peak_per_ns).alias("fraction_of_peak"),
        (pl.col("span_ns") - pl.col("read_bytes") / peak_per_ns).alias("idle_equivalent_ns"),
    )


def family_reads(rate: Rate, kernels: pl.DataFrame, per_step: pl.DataFrame) -> pl.DataFrame:
    """Per family, medians over the steps: its device busy time (the union of its kernel
    intervals), the bytes read within it, their rate, and their share of the step's reads.
    Time when two families' kernels run together counts for both."""
    busy = intervals.union(kernels.select("step", "family", "start", "end"), ["step", "family"])
    if busy.is_empty():
        return pl.DataFrame(schema={"family": pl.String, "device_busy_us": pl.Float64, "read_mb": pl.Float64,
                                    "read_tbs": pl.Float64, "share_of_reads": pl.Float64})
    cells = busy.with_columns(_integral(rate, busy).alias("read_bytes")).group_by("step", "family").agg(
        (pl.col("end") - pl.col("start")).sum().alias("busy_ns"), pl.col("read_bytes").sum())
    # A family absent from a step counts 0 there, as in the family table.
    grid = per_step.select("step", pl.col("read_bytes").alias("step_bytes")).join(
        cells.select("family").unique(), how="cross")
    full = grid.join(cells, on=["step", "family"], how="left").fill_null(0)
    return full.group_by("family").agg(
        (pl.col("busy_ns").median() / 1e3).alias("device_busy_us"),
        (pl.col("read_bytes").median() / 1e6).alias("read_mb"),
        pl.when(pl.col("busy_ns") > 0).then(pl.col("read_bytes") / pl.col("busy_ns") / 1e3).median().alias("read_tbs"),
        (pl.col("read_bytes") / pl.col("step_bytes")).median().alias("share_of_reads"),
    ).sort("read_mb", descending=True)


def segment_windows(kernels: pl.DataFrame) -> pl.DataFrame:
    """step, layer, family, kind, start, end: a window from each (layer, family)'s first
    kernel start to the next one's in the step (bench/floor_segments.py's segments). A
    family whose kernels in a layer come as several runs in launch order (K3's attention
    residual pairs, one before the attention and one before the MLP) opens no window: its
    runs fall into the windows they start in. A step's last window has no end and is left
    out. `kind` is the family and the next window's: `moe > mla`."""
    labelled = kernels.filter(pl.col("layer").is_not_null())
    if labelled.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "layer": pl.Int64, "family": pl.String, "kind": pl.String,
                                    "start": pl.Int64, "end": pl.Int64})
    firsts = labelled.group_by("step", "layer", "family").agg(pl.col("segment").n_unique().alias("runs"),
                                                              pl.col("start").min())
    folded = firsts.filter(pl.col("runs") > 1)["family"].unique().implode()
    openers = firsts.filter(~pl.col("family").is_in(folded)).sort("step", "start", "layer", "family")
    nxt = pl.col("start").shift(-1).over("step"), pl.col("family").shift(-1).over("step")
    return (openers.with_columns(end=nxt[0], kind=pl.concat_str("family", pl.lit(" > "), nxt[1]))
            .drop_nulls("end").select(pl.col("step").cast(pl.Int64), pl.col("layer").cast(pl.Int64), "family", "kind",
                                      pl.col("start").cast(pl.Int64), pl.col("end").cast(pl.Int64)))


def _with_reads(rate: Rate, windows: pl.DataFrame) -> pl.DataFrame:
    return windows.with_columns(_integral(rate, windows).alias("read_bytes"),
                                (pl.col("end") - pl.col("start")).alias("time_ns"))


_MEDIANS = ((pl.col("time_ns").median() / 1e3).alias("time_us"), (pl.col("read_bytes").median() / 1e6).alias("read_mb"),
            (pl.col("read_bytes") / pl.col("time_ns") / 1e3).median().alias("read_tbs"))


def kind_reads(rate: Rate, windows: pl.DataFrame) -> pl.DataFrame:
    """Per segment kind: windows per step, and the median window's time, bytes and rate."""
    w = _with_reads(rate, windows)
    per_step = w.group_by("step", "kind").len().group_by("kind").agg(pl.col("len").median().alias("per_step"))
    return (w.group_by("kind").agg(pl.len().alias("instances"), *_MEDIANS)
            .join(per_step, on="kind").select("kind", "per_step", "time_us", "read_mb", "read_tbs", "instances")
            .sort("kind"))


def layer_segment_reads(rate: Rate, windows: pl.DataFrame) -> pl.DataFrame:
    """Per (layer, family) window: medians over the steps of its time, bytes and rate."""
    w = _with_reads(rate, windows)
    return (w.group_by("layer", "family").agg(pl.col("kind").mode().first(), pl.len().alias("steps"), *_MEDIANS)
            .select("layer", "family", "kind", "steps", "time_us", "read_mb", "read_tbs").sort("layer", "family"))


def profile(rate: Rate, windows: pl.DataFrame, bin_ns: int = PROFILE_BIN_NS) -> pl.DataFrame:
    """Per segment kind, the mean read rate (TB/s) in bins of `bin_ns` from the windows'
    starts, up to the kind's median window: over the instances that last the whole bin and
    whose samples cover it."""
    out = []
    for (kind,), w in windows.group_by("kind", maintain_order=True):
        start = w["start"].to_numpy()
        length = (w["end"] - w["start"]).to_numpy()
        bins = max(int(np.median(length)) // bin_ns, 1)
        edges = start[:, None] + np.arange(bins + 1, dtype=np.int64) * bin_ns
        read = np.diff(rate.bytes_until(edges), axis=1)
        whole = (np.diff(rate.covered_until(edges), axis=1) >= bin_ns) & (
            (np.arange(1, bins + 1) * bin_ns)[None, :] <= length[:, None])
        n = whole.sum(axis=0)
        mean = np.where(n > 0, (read * whole).sum(axis=0) / np.maximum(n, 1) / bin_ns / 1e3, np.nan)
        out.append(pl.DataFrame({"kind": [kind] * bins, "t_us": np.arange(bins) * bin_ns / 1e3,
                                 "read_tbs": mean, "instances": n.astype(np.int64)}))
    if not out:
        return pl.DataFrame(schema={"kind": pl.String, "t_us": pl.Float64, "read_tbs": pl.Float64,
                                    "instances": pl.Int64})
    return pl.concat(out).with_columns(pl.col("read_tbs").fill_nan(None)).sort("kind", "t_us")


def kernel_offsets(kernels: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """kind, kernel, offset_us: each kernel's start after its window's start, the median over
    the window's instances, a kernel named once per occurrence in its window in start order
    (`skinny_mm_kernel#2`: the window's second). Under PDL a kernel records its start where it
    launched, near its producer's wait, not where its own wait returned."""
    if windows.is_empty():
        return pl.DataFrame(schema={"kind": pl.String, "kernel": pl.String, "offset_us": pl.Float64})
    w = windows.select("step", "kind", pl.col("start").alias("w_start"), pl.col("end").alias("w_end")).sort("w_start")
    k = (kernels.select(pl.col("step").cast(pl.Int64), "name", pl.col("start").cast(pl.Int64)).sort("start")
         .join_asof(w, left_on="start", right_on="w_start", by="step", strategy="backward",
                    check_sortedness=False)  # both sorted by start above
         .filter(pl.col("start") < pl.col("w_end")))
    k = k.with_columns(nth=pl.col("start").rank("ordinal").over("step", "w_start", "name"))
    named = pl.when(pl.col("nth") > 1).then(pl.concat_str("name", pl.lit("#"), pl.col("nth").cast(pl.String)))
    return (k.with_columns(kernel=named.otherwise(pl.col("name")), offset=pl.col("start") - pl.col("w_start"))
            .group_by("kind", "kernel").agg((pl.col("offset").median() / 1e3).alias("offset_us"))
            .sort("kind", "offset_us", "kernel"))


def dips(prof: pl.DataFrame, offsets: pl.DataFrame, peak_bytes_per_s: float,
         share: float = DIP_SHARE) -> pl.DataFrame:
    """Per segment kind, where HBM idles: each run of profile bins whose mean rate is below
    `share` of the kind's best bin (the plateau its GEMMs reach), with its bounds (us since
    the segment's start), its lowest bin, its idle-equivalent (its time less its bytes at the
    peak, the step's idle-equivalent over that stretch) and the kernels whose median start
    falls in it or in the bin before (under early triggers a GEMM's tail is recorded by the
    kernel after it), in start order."""
    schema = {"kind": pl.String, "from_us": pl.Float64, "to_us": pl.Float64, "min_tbs": pl.Float64,
              "idle_equivalent_us": pl.Float64, "kernels": pl.List(pl.String)}
    rows = []
    peak_tbs = peak_bytes_per_s / TB
    for (kind,), bins in prof.drop_nulls("read_tbs").group_by("kind", maintain_order=True):
        t, rate = bins["t_us"].to_numpy(), bins["read_tbs"].to_numpy()
        width = PROFILE_BIN_NS / 1e3
        low = rate < share * rate.max()
        # Runs of low bins, a gap in the bins (no instance covered them) ending a run.
        edges = np.flatnonzero(np.diff(np.concatenate([[0], low.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            if b - a > 1 and np.any(np.diff(t[a:b]) > width * 1.5):
                continue  # not one stretch: bins missing inside
            lo, hi = float(t[a]), float(t[b - 1] + width)
            near = offsets.filter((pl.col("kind") == kind) & (pl.col("offset_us") >= lo - width)
                                  & (pl.col("offset_us") < hi))
            rows.append({"kind": kind, "from_us": lo, "to_us": hi, "min_tbs": float(rate[a:b].min()),
                         "idle_equivalent_us": float(np.sum(np.maximum(peak_tbs - rate[a:b], 0.0)) / peak_tbs * width),
                         "kernels": near["kernel"].to_list()})
    return pl.DataFrame(rows, schema=schema)
