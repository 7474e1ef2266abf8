"""Histograms of step times on shared bins, so two builds (or period and span) are drawn
on the same edges. The figures draw the counts; they bin nothing themselves."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import polars as pl


def histogram(series: Mapping[str, Sequence[float]], bins: int = 40) -> pl.DataFrame:
    """One row per (series, bin): series, left, right, count; the same `bins` equal-width
    bins over the range of all values (the last bin holds its right edge)."""
    values = {name: np.asarray(v, dtype=np.float64) for name, v in series.items()}
    values = {name: v[np.isfinite(v)] for name, v in values.items()}
    every = np.concatenate([v for v in values.values()] or [np.zeros(0)])
    schema = {"series": pl.String, "left": pl.Float64, "right": pl.Float64, "count": pl.Int64}
    if every.size == 0:
        return pl.DataFrame(schema=schema)
    lo, hi = float(every.min()), float(every.max())
    if not hi > lo:  # one value: one bin around it
        lo, hi = lo - 0.5, hi + 0.5
        bins = 1
    width = (hi - lo) / bins
    rows = []
    for name, v in values.items():
        index = np.minimum(((v - lo) / width).astype(np.int64), bins - 1)
        counts = np.bincount(index, minlength=bins)
        rows += [(name, lo + i * width, hi if i == bins - 1 else lo + (i + 1) * width, int(c))
                 for i, c in enumerate(counts)]
    return pl.DataFrame(rows, schema=schema, orient="row")


def step_values(step_times: pl.DataFrame, column: str) -> list[float]:
    """A stable-step column in us (period has no value on the last step)."""
    return [x / 1e3 for x in step_times[column].drop_nulls().to_list() if not math.isnan(x)]


def steps_us(steps: pl.DataFrame) -> pl.DataFrame:
    """Every step in order, stable or dropped: step, period_us, span_us, status (`stable`
    or the drop reason)."""
    return steps.select(
        "step", (pl.col("period") / 1e3).alias("period_us"), (pl.col("span") / 1e3).alias("span_us"),
        pl.when(pl.col("stable")).then(pl.lit("stable")).otherwise(pl.col("drop_reason")).fill_null("dropped")
        .alias("status"),
    ).sort("step")
