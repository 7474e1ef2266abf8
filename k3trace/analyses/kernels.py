"""Per kernel (name and family) over stable steps: calls/step, mean, median, hidden share,
and how far its call sites' medians lie apart."""

from __future__ import annotations

import polars as pl

from k3trace.analyses.overlap import StepOverlap


def kernel_table(overlap: StepOverlap, n_steps: int) -> pl.DataFrame:
    k = overlap.kernels
    return (_by_call(k, n_steps).join(site_spread(k), on=["name", "family"], how="left")
            .sort("busy_per_step_us", "name", "family", descending=[True, False, False]))


def site_spread(kernels: pl.DataFrame) -> pl.DataFrame:
    """name, family, sites, site_median_min_us, site_median_max_us: the lowest and the highest
    of the kernel's call-site medians, a call site being one position in the step's launch
    order (`launch_rank`: one node of a graph). The same launch can take twice its time at some
    sites: the K3 router beside its MoE front GEMM runs 7 us in two layers and 15-17 us in the
    other five, which a median over every call hides."""
    per_site = kernels.group_by("name", "family", "launch_rank").agg(pl.col("duration").median().alias("median"))
    return per_site.group_by("name", "family").agg(
        pl.len().alias("sites"),
        (pl.col("median").min() / 1e3).alias("site_median_min_us"),
        (pl.col("median").max() / 1e3).alias("site_median_max_us"),
    )


def _by_call(k: pl.DataFrame, n_steps: int) -> pl.DataFrame:
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
    )
