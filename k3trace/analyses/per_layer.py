"""Per layer and family: the kernel time a layer spends per stable step and its time on the
critical path (median over stable steps, us): seed 003's standalone per-layer cost, and
where along the depth the step's time goes."""

from __future__ import annotations

import polars as pl


def layer_family_table(path: pl.DataFrame) -> pl.DataFrame:
    """layer, family, kernels (per step), kernel_us (summed durations), critical_us; kernels
    without a layer are left out."""
    k = path.filter(pl.col("layer").is_not_null())
    per_step = k.group_by("step", "layer", "family").agg(
        pl.len().alias("kernels"), (pl.col("end") - pl.col("start")).sum().alias("kernel_ns"),
        pl.col("critical_ns").sum())
    steps = k.select("step").unique()
    cells = k.select("layer", "family").unique()
    full = steps.join(cells, how="cross").join(per_step, on=["step", "layer", "family"], how="left").fill_null(0)
    return full.group_by("layer", "family").agg(
        pl.col("kernels").median().alias("kernels"),
        (pl.col("kernel_ns").median() / 1e3).alias("kernel_us"),
        (pl.col("critical_ns").median() / 1e3).alias("critical_us"),
    ).sort("layer", "family")
