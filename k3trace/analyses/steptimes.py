"""Step period (the ITL proxy), span, host share, GPU busy and two-stream residency."""

from __future__ import annotations

import polars as pl

from k3trace import intervals
from k3trace.analyses.overlap import StepOverlap


def per_step(steps: pl.DataFrame, overlap: StepOverlap) -> pl.DataFrame:
    """Stable steps with busy (union of all kernels) and residency (>= 2 streams) in ns."""
    stable = steps.filter(pl.col("stable")).select("step", "first_start", "last_end", "period", "span", "host", "kernels")
    busy = intervals.union_length(overlap.kernels, ["step"], "busy")
    resident = intervals.length(overlap.multi_stream, ["step"], "residency")
    return (
        stable.join(busy, on="step", how="left")
        .join(resident, on="step", how="left")
        .with_columns(pl.col("busy").fill_null(0), pl.col("residency").fill_null(0))
        .sort("step")
    )


def quantiles_us(values: pl.Series) -> dict[str, float | None]:
    """median / p90 / p99 of a ns column, in us (null when there is no value)."""
    v = values.drop_nulls().cast(pl.Float64)
    if v.is_empty():
        return {"median": None, "p90": None, "p99": None}
    return {
        "median": v.median() / 1e3,
        "p90": v.quantile(0.9, interpolation="linear") / 1e3,
        "p99": v.quantile(0.99, interpolation="linear") / 1e3,
    }
