"""Where along the model a change moved the step (docs/metrics.md, "Diff", "Segments").

A segment window runs from a (layer, family)'s first kernel start to the next one's in the
step (analyses/dram.segment_windows, the windows the DRAM reading uses); its kind is the two
families, `moe > kda`. Per kind and build: the windows per step and their median time, and
what the kind adds up to in a step (time x windows per step); the change of that is where
the step's time moved, whatever kernel it was recorded in (under PDL a kernel's recorded time
holds its producer's tail, so a change shows in a neighbour's row: the window around both
still moves by what the change did). The windows tile the step from its first window's
start to its last one's, so their changes add up to the span's change less the edges'.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import polars as pl

from k3trace.analyses import Analysis
from k3trace.analyses.anatomy import MAX_STEPS, spaced_steps
from k3trace.analyses.dram import segment_windows

FIELDS = ("per_step", "time_us", "us_per_step")


def segment_times(a: Analysis, max_steps: int = MAX_STEPS) -> pl.DataFrame:
    """kind, per_step (windows per stable step), time_us (median), us_per_step (time x
    windows per step) of one run, over at most `max_steps` of its stable steps, evenly spaced."""
    steps = spaced_steps(a.step_times["step"], max_steps)
    kernels = a.kernels.filter(pl.col("step").is_in(steps.implode()))
    w = segment_windows(kernels)
    return w.group_by("kind").agg(
        (pl.len() / steps.len()).alias("per_step"), ((pl.col("end") - pl.col("start")).median() / 1e3).alias("time_us"),
    ).with_columns((pl.col("per_step") * pl.col("time_us")).alias("us_per_step")).sort("kind")


def segment_table(old: Sequence[Analysis], new: Sequence[Analysis], max_steps: int = MAX_STEPS) -> pl.DataFrame | None:
    """Per segment kind: windows per step, median time and us per step, old and new (each the
    median over the runs of each run's value; 0 where a build has none of the kind), and
    `us_per_step_delta`, by its size. None where neither build has a labelled segment."""
    def side(runs: Sequence[Analysis], suffix: str) -> pl.DataFrame:
        rows = pl.concat([segment_times(a, max_steps) for a in runs])
        return rows.group_by("kind").agg(pl.col(f).median().alias(f"{f}_{suffix}") for f in FIELDS)

    old_rows, new_rows = side(old, "old"), side(new, "new")
    if old_rows.is_empty() and new_rows.is_empty():
        return None
    joined = old_rows.join(new_rows, on="kind", how="full", coalesce=True).fill_null(0.0)
    return joined.with_columns((pl.col("us_per_step_new") - pl.col("us_per_step_old")).alias("us_per_step_delta")).sort(
        pl.col("us_per_step_delta").abs(), "kind", descending=[True, False])


def windows_total(table: pl.DataFrame) -> dict[str, float]:
    """The windows' us per step summed, old, new and the change: what the table accounts for
    of the span's change."""
    return {side: float(statistics.fsum(table[f"us_per_step_{side}"].to_list())) for side in ("old", "new", "delta")}
