"""Where a step's kernels overlap across streams: the shared basis of residency, exposed
and hidden time (METRICS.md, "Per family")."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from k3trace import intervals


@dataclass(frozen=True)
class StepOverlap:
    kernels: pl.DataFrame        # stable-step kernels with `duration`, `exposed`
    multi_stream: pl.DataFrame   # per step: disjoint intervals with >= 2 streams active


def step_overlap(stable_kernels: pl.DataFrame) -> StepOverlap:
    """`exposed` = the part of a kernel's time during which no kernel of another stream
    runs: its duration minus its time inside the step's >= 2-stream coverage (its own
    stream is active throughout, so any second active stream is another one)."""
    multi = intervals.coverage(stable_kernels, ["step"], "stream_id", at_least=2)
    with_cover = intervals.measure_within(stable_kernels, multi, ["step"], "covered")
    kernels = with_cover.with_columns((pl.col("end") - pl.col("start")).alias("duration")).with_columns(
        (pl.col("duration") - pl.col("covered")).clip(lower_bound=0).alias("exposed")
    ).drop("covered")
    return StepOverlap(kernels=kernels, multi_stream=multi)
