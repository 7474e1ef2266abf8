"""Per family, per stable step, then the median over steps (METRICS.md, "Per family"):
segments/step, device_busy, two_stream_residency, share_of_busy, exposed."""

from __future__ import annotations

import numpy as np
import polars as pl

from k3trace import intervals
from k3trace.analyses.overlap import StepOverlap


def family_table(overlap: StepOverlap, n_steps: int) -> pl.DataFrame:
    # Keyed on the family's code throughout: its position among the distinct families,
    # sorted, so the interval scans order the groups as by the text (which they would cast
    # to such a code themselves), and the per-segment firsts, grouping and joins below read
    # integers, not text; the text is put back on the result's few rows.
    names = overlap.kernels["family"].unique().drop_nulls().sort()
    k = overlap.kernels.select("step", "segment", "start", "end", "exposed", "duration",
                               pl.col("family").cast(pl.Enum(names)).to_physical().cast(pl.Int64))
    busy = intervals.union_length(k, ["step", "family"], "device_busy")
    windows = segment_windows(k)
    merged = intervals.union(windows, ["step", "family"])
    resident = (
        intervals.measure_within(merged, overlap.multi_stream, ["step"], "residency")
        .group_by("step", "family").agg(pl.col("residency").sum())
    )
    per_step = (
        windows.group_by("step", "family")
        .agg(pl.len().alias("segments"), pl.col("exposed").sum(), pl.col("duration").sum())
        .join(busy, on=["step", "family"], how="left")
        .join(resident, on=["step", "family"], how="left")
        .with_columns(pl.col("residency").fill_null(0))
    )
    # A family absent from some stable steps counts as zero there (medians over all steps).
    steps = windows.select("step").unique()
    grid = steps.join(per_step.select("family").unique(), how="cross")
    full = grid.join(per_step, on=["step", "family"], how="left").fill_null(0).with_columns(
        pl.when(pl.col("device_busy") > 0).then(pl.col("residency") / pl.col("device_busy")).otherwise(0.0)
        .alias("share")
    )
    per_family = (
        full.group_by("family")
        .agg(
            pl.col("segments").median().alias("segments_per_step"),
            (pl.col("device_busy").median() / 1e3).alias("device_busy_us"),
            (pl.col("residency").median() / 1e3).alias("two_stream_residency_us"),
            (pl.col("exposed").median() / 1e3).alias("exposed_us"),
            (pl.col("duration").median() / 1e3).alias("kernel_time_us"),
            # Like every family number: per step first, then the median over steps.
            pl.col("share").median().alias("share_of_busy"),
        )
    )
    return per_family.with_columns(names.gather(per_family["family"]).alias("family")).sort(
        "device_busy_us", descending=True)


def segment_windows(k: pl.DataFrame) -> pl.DataFrame:
    """One row per segment: its step and family, its window (its first kernel's start to
    its last kernel's end) and its kernels' exposed and kernel time summed, so that the
    per-step sums and the segment count group one row per segment, not one per kernel.

    A segment lies in one step and one family (labels/segments.py), so its id alone is the
    group. Where the ids come in order (the stable kernels come in start order and the ids
    in launch order: on the recordings at hand they agree) each segment's kernels are one
    run, and the window and sums are numpy reductions over the runs, where a hash grouping
    of the ids costs ten times as much (2.2M kernels: 220 -> 20 ms; a sort first cost more
    than the grouping). Kernel times are never null (ingest validates them), nor then are
    `exposed` and `duration`."""
    if not k["segment"].is_sorted():
        return k.group_by("segment").agg(pl.col("step").first(), pl.col("family").first(), pl.col("start").min(),
                                         pl.col("end").max(), pl.col("exposed").sum(), pl.col("duration").sum())
    segment = k["segment"].to_numpy()
    opens = np.ones(len(segment), dtype=bool)
    opens[1:] = segment[1:] != segment[:-1]
    at = np.flatnonzero(opens)

    def over_runs(reduce: np.ufunc, col: str) -> pl.Series:
        return pl.Series(col, reduce.reduceat(k[col].to_numpy(), at), dtype=k.schema[col])

    # The step and family of a run's first kernel: every kernel of the segment has the same.
    return k[at].select("segment", "step", "family").with_columns(
        over_runs(np.minimum, "start"), over_runs(np.maximum, "end"),
        over_runs(np.add, "exposed"), over_runs(np.add, "duration"))
