"""Segments: contiguous runs of one (layer, family) in launch order (METRICS.md, "Labels")."""

from __future__ import annotations

import polars as pl


def with_segments(kernels: pl.DataFrame) -> pl.DataFrame:
    """`segment`: an id of the contiguous run of one (layer, family) in launch order within
    a step (or an eager step); a new segment starts whenever the pair changes. Ids are
    unique across the trace (counted per step where needed), not restarted per step."""
    group = pl.coalesce(pl.col("step"), -1 - pl.col("eager_step")).alias("seg_group")
    # Only the columns the segments depend on go through the two sorts.
    ordered = kernels.select("kernel_id", group, "launch_rank", "layer", "family").sort("seg_group", "launch_rank")
    changed = (
        (pl.col("seg_group") != pl.col("seg_group").shift(1))
        | (pl.col("layer").fill_null(-1) != pl.col("layer").fill_null(-1).shift(1))
        | (pl.col("family") != pl.col("family").shift(1))
    ).fill_null(True)
    segment = ordered.select("kernel_id", changed.cast(pl.Int64).cum_sum().sub(1).alias("segment")).sort("kernel_id")
    return kernels.sort("kernel_id").with_columns(segment["segment"])
