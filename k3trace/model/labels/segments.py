"""Segments: contiguous runs of one (layer, family) in launch order (METRICS.md, "Labels")."""

from __future__ import annotations

import numpy as np
import polars as pl

from k3trace.ordering import sort_positions


def with_segments(kernels: pl.DataFrame) -> pl.DataFrame:
    """`segment`: an id of the contiguous run of one (layer, family) in launch order within
    a step (or an eager step); a new segment starts whenever the pair changes. Ids are
    unique across the trace (counted per step where needed), not restarted per step."""
    kernels = kernels.sort("kernel_id")
    group = pl.coalesce(pl.col("step"), -1 - pl.col("eager_step")).alias("seg_group")
    # Only the columns the segments depend on are put in launch order, by row positions
    # (ordering.py), and the ids go back to the rows by position: no sort of the frame.
    keys = kernels.select(group, "launch_rank", "layer", "family")
    order = sort_positions(keys, "seg_group", "launch_rank")
    changed = (
        (pl.col("seg_group") != pl.col("seg_group").shift(1))
        | (pl.col("layer").fill_null(-1) != pl.col("layer").fill_null(-1).shift(1))
        | (pl.col("family") != pl.col("family").shift(1))
    ).fill_null(True)
    in_order = keys[order].select(changed.cast(pl.Int64).cum_sum().sub(1)).to_series().to_numpy()
    segment = np.empty(kernels.height, dtype=np.int64)
    segment[order] = in_order
    return kernels.with_columns(pl.Series("segment", segment))
