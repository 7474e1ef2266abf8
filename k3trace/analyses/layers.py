"""Per layer, per stable step, then the median over steps (METRICS.md, "Per layer"):
families, kernels per step, device busy, time on the critical path."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from k3trace import intervals
from k3trace.analyses.overlap import StepOverlap
from k3trace.keys import grouped_by_pair

_SCHEMA = {"index": pl.Int64, "families": pl.List(pl.String), "kernels_per_step": pl.Float64,
           "device_busy_us": pl.Float64, "critical_us": pl.Float64}


@dataclass(frozen=True)
class LayerSteps:
    """What the overlap side gives the layer table: per (stable step, layer), every pair,
    the device busy time and kernel count (null where the layer ran nothing in that step),
    and each layer's families in launch order; both None where no kernel has a layer."""

    per_step: pl.DataFrame | None
    families: pl.DataFrame | None


def layer_steps(overlap: StepOverlap) -> LayerSteps:
    k = overlap.kernels.select("step", "layer", "family", "start", "end", "launch_rank").filter(
        pl.col("layer").is_not_null())
    if k.is_empty():
        return LayerSteps(None, None)
    steps = overlap.kernels.select("step").unique()
    layers = k.select("layer").unique()
    grid = steps.join(layers, how="cross")
    busy = intervals.union_length(k, ["step", "layer"], "device_busy")
    counts = grouped_by_pair(k, "step", "layer", pl.len().alias("kernels"))
    per_step = grid.join(busy, on=["step", "layer"], how="left").join(counts, on=["step", "layer"], how="left")
    # Stable steps share one kernel sequence: one of them gives each layer's families in order.
    one = k.filter(pl.col("step") == k["step"].min()).sort("launch_rank")
    families = one.group_by("layer", maintain_order=True).agg(
        pl.col("family").unique(maintain_order=True).alias("families"))
    return LayerSteps(per_step, families)


def critical_per_step(path: pl.DataFrame) -> pl.DataFrame:
    """What the path side gives it: each (stable step, layer)'s time on the critical path."""
    return grouped_by_pair(path.select("step", "layer", "critical_ns").filter(pl.col("layer").is_not_null()),
                           "step", "layer", pl.col("critical_ns").sum())


def layer_table(steps: LayerSteps, critical: pl.DataFrame) -> pl.DataFrame:
    """index, families (in launch order), kernels_per_step, device_busy_us, critical_us."""
    if steps.per_step is None:
        return pl.DataFrame(schema=_SCHEMA)
    per_step = steps.per_step.join(critical, on=["step", "layer"], how="left").fill_null(0)
    return (
        per_step.group_by("layer").agg(
            pl.col("kernels").median().cast(pl.Float64).alias("kernels_per_step"),
            (pl.col("device_busy").median() / 1e3).alias("device_busy_us"),
            (pl.col("critical_ns").median() / 1e3).alias("critical_us"),
        )
        .join(steps.families, on="layer", how="left")
        .select(pl.col("layer").alias("index"), "families", "kernels_per_step", "device_busy_us", "critical_us")
        .sort("index")
        .cast(_SCHEMA)
    )
