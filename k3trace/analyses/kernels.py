"""Per kernel (name and family) over stable steps: calls/step, mean, median, hidden share."""

from __future__ import annotations

import polars as pl

from k3trace.analyses.overlap import StepOverlap


def kernel_table(overlap: StepOverlap, n_steps: int) -> pl.DataFrame:
    k = overlap.kernels
    return (
        k.group_by("name", "family")
        .agg(
            (pl.len() / max(n_steps, 1)).alias("calls_per_step"),
            (pl.col("duration").mean() / 1e3).alias("mean_us"),
            (pl.col("duration").median() / 1e3).alias("median_us"),
            (pl.col("duration").sum() / max(n_steps, 1) / 1e3).alias("busy_per_step_us"),
            (pl.col("exposed").sum() / max(n_steps, 1) / 1e3).alias("exposed_per_step_us"),
            (1 - pl.col("exposed").sum() / pl.col("duration").sum()).alias("hidden_share"),
        )
        .with_columns(pl.col("hidden_share").fill_nan(0.0))
        .sort("busy_per_step_us", descending=True)
    )
