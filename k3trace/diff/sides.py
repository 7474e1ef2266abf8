"""The two sides of a diff set next to each other for the report: step-time distributions
on shared bins, and the pre-attention window per full-attention layer, old vs new. Pure
functions over the Diff's analyses; the HTML page draws what they return."""

from __future__ import annotations

import statistics
from typing import Sequence

import polars as pl

from k3trace.analyses import Analysis
from k3trace.analyses.distribution import histogram, step_values

SIDES = ("old", "new")


def step_distributions(old: Sequence[Analysis], new: Sequence[Analysis], bins: int = 40) -> dict[str, pl.DataFrame]:
    """Per metric (`period`, `span`): the stable steps of every run of each side, pooled,
    binned on edges shared by both sides (series `old`, `new`)."""
    out = {}
    for metric in ("period", "span"):
        pooled = {side: [v for a in runs for v in step_values(a.step_times, metric)]
                  for side, runs in zip(SIDES, (old, new))}
        out[metric] = histogram(pooled, bins)
    return out


def central(runs: Sequence[Analysis], metric: str) -> float:
    """The side's central value, as the diff takes it: the median over runs of each run's
    stable-step median (us)."""
    return statistics.median(a.step_stats[metric]["median"] for a in runs)


def pre_attention_by_layer(old: Analysis, new: Analysis) -> pl.DataFrame:
    """layer, old_us, new_us, delta_us (new - old), old_p90_us, new_p90_us: the window's
    median over stable steps per full-attention layer; a layer one side lacks is null there."""
    o = old.pre_attention_by_layer().select("layer", pl.col("median_us").alias("old_us"),
                                            pl.col("p90_us").alias("old_p90_us"))
    n = new.pre_attention_by_layer().select("layer", pl.col("median_us").alias("new_us"),
                                            pl.col("p90_us").alias("new_p90_us"))
    return o.join(n, on="layer", how="full", coalesce=True).select(
        "layer", "old_us", "new_us", (pl.col("new_us") - pl.col("old_us")).alias("delta_us"), "old_p90_us",
        "new_p90_us").sort("layer")


def representative(runs: Sequence[Analysis]) -> Analysis:
    """The run of a side that the diff replays (its span median nearest the side's)."""
    from k3trace.diff import _representative

    return _representative(runs)


def family_changes(families: pl.DataFrame) -> pl.DataFrame:
    """Diff.families with each field's change (new - old) beside its two values."""
    from k3trace.diff import FAMILY_FIELDS

    return families.select("family", *[e for f in FAMILY_FIELDS for e in (
        pl.col(f"{f}_old"), pl.col(f"{f}_new"), (pl.col(f"{f}_new") - pl.col(f"{f}_old")).alias(f"{f}_delta"))])
