"""The DRAM read (or write) rate of one GPU as nsys sampled it: a piecewise-constant function
of time, and its integral over any set of intervals (docs/metrics.md, "DRAM").

A sample's value is the percent of the DRAM peak averaged over the interval that *starts*
at its timestamp and runs to the metric's next sample (about 5 us at
`--gpu-metrics-frequency=200000`). Measured on the H200 with nsys 2023.4.4
(bench/dram_probe.py): the first sample seeing a read kernel's traffic starts 1-3 us before
the kernel does, so end-stamped samples would put the reads before the kernel started.

Everything here is vectorised over intervals (cumulative sums, `searchsorted`): a report
holds hundreds of thousands of samples and the analysis asks for millions of integrals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

#: A sample followed by none within this many sampling periods covers one period; the time
#: after it, up to the next sample, is uncovered (a dropped sample, or a trimmed report).
MAX_GAP_PERIODS = 1.5


@dataclass(frozen=True)
class Rate:
    """bytes_per_ns[i] from starts[i] to ends[i] (ns); no rate is known between pieces."""

    starts: np.ndarray          # int64, rising
    ends: np.ndarray            # int64
    bytes_per_ns: np.ndarray    # float64
    period_ns: float            # the median sampling period
    _bytes_before: np.ndarray   # bytes of the pieces before each one
    _covered_before: np.ndarray  # ns of the pieces before each one

    @classmethod
    def of_samples(cls, timestamps: np.ndarray, percent: np.ndarray, peak_bytes_per_s: float) -> Rate:
        """The rate from one metric's samples (a percent of `peak_bytes_per_s` each)."""
        order = np.argsort(timestamps, kind="stable")
        starts = np.asarray(timestamps, dtype=np.int64)[order]
        rate = np.asarray(percent, dtype=np.float64)[order] / 100.0 * peak_bytes_per_s / 1e9
        steps = np.diff(starts)
        period = float(np.median(steps[steps > 0])) if np.any(steps > 0) else 0.0
        nxt = np.append(starts[1:], np.iinfo(np.int64).max)
        ends = np.where(nxt - starts <= MAX_GAP_PERIODS * period, nxt, starts + int(round(period)))
        length = (ends - starts).astype(np.float64)
        return cls(starts, ends, rate, period, np.concatenate([[0.0], np.cumsum(rate * length)[:-1]]),
                   np.concatenate([[0.0], np.cumsum(length)[:-1]]))

    def _until(self, t: np.ndarray, per_ns: np.ndarray, before: np.ndarray) -> np.ndarray:
        """The running integral of `per_ns` over the pieces, from the first one to `t`."""
        t = np.asarray(t, dtype=np.int64)
        if not len(self.starts):
            return np.zeros(t.shape)
        at = np.searchsorted(self.starts, t, side="right") - 1
        hit = np.maximum(at, 0)
        inside = np.minimum(t, self.ends[hit]) - self.starts[hit]
        return np.where(at >= 0, before[hit] + per_ns[hit] * inside, 0.0)

    def bytes_until(self, t: np.ndarray) -> np.ndarray:
        return self._until(t, self.bytes_per_ns, self._bytes_before)

    def covered_until(self, t: np.ndarray) -> np.ndarray:
        return self._until(t, np.ones_like(self.bytes_per_ns), self._covered_before)

    def integral(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Bytes over each [lo, hi)."""
        return self.bytes_until(hi) - self.bytes_until(lo)

    def covered(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """ns of each [lo, hi) that some sample covers."""
        return self.covered_until(hi) - self.covered_until(lo)


@dataclass(frozen=True)
class DramSource:
    """The GPU whose DRAM samples the analysis reads, with its peak and rates."""

    device_id: int
    type_id: int
    peak_bytes_per_s: float
    read: Rate
    write: Rate | None


def dram_source(metrics: pl.DataFrame, gpus: pl.DataFrame, device: int | None) -> tuple[DramSource | None, list[str]]:
    """The DRAM rates of the GPU whose kernels are analysed (`device`), and notes where none
    can be read: several GPUs' samples and none of them that device, or no DRAM peak."""
    reads = metrics.filter(pl.col("metric") == "dram_read")
    if reads.is_empty():
        return None, []
    types = reads.select("type_id", "device_id").unique().sort("type_id")
    if types.height > 1:
        types = types.filter(pl.col("device_id") == device) if device is not None else types.clear()
        if types.height != 1:
            return None, [f"GPU metrics of {reads['type_id'].n_unique()} GPUs and not one of them is device "
                          f"{device}, whose kernels are analysed: no DRAM numbers"]
    type_id, device_id = types.row(0)
    gpu = gpus.filter(pl.col("device_id") == device_id) if gpus.height > 1 else gpus
    peak = gpu["memory_bandwidth"].drop_nulls() if "memory_bandwidth" in gpu.columns else pl.Series([], dtype=pl.Int64)
    if peak.len() != 1 or peak[0] <= 0:
        return None, [f"DRAM metrics recorded, but the report gives no DRAM peak for GPU {device_id} "
                      "(TARGET_INFO_GPU.memoryBandwidth): their percentages cannot be read as bytes"]

    def rate(metric: str) -> Rate | None:
        rows = metrics.filter(pl.col("type_id") == type_id, pl.col("metric") == metric)
        if rows.is_empty():
            return None
        return Rate.of_samples(rows["timestamp"].to_numpy(), rows["value"].to_numpy(), float(peak[0]))

    read = rate("dram_read")
    assert read is not None
    return DramSource(int(device_id), int(type_id), float(peak[0]), read, rate("dram_write")), []
