"""Stable steps (METRICS.md): the dominant decode signature after warm-up, without
outliers beyond median +- k*MAD of span or period. Every dropped step keeps its reason."""

from __future__ import annotations

import polars as pl

from k3trace.config import Config

#: MAD of perfectly regular replays can be 0 ns; a floor of 0.1% of the median keeps
#: 1-ns jitter from being called an outlier.
MAD_FLOOR = 1e-3


def _robust_bound(values: pl.Expr, kept: pl.Expr, k: float) -> pl.Expr:
    """|x - median| <= k * max(MAD, floor), with median and MAD over the `kept` rows."""
    med = values.filter(kept).median()
    mad = (values.filter(kept) - med).abs().median()
    scale = pl.max_horizontal(mad, med.abs() * MAD_FLOOR)
    return values.is_null() | ((values - med).abs() <= k * scale)


def classify_steps(steps: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """Adds period, span, host, dominant, kernels_expected, stable, drop_reason."""
    out = steps.sort("step").with_columns(
        (pl.col("first_start").shift(-1) - pl.col("first_start")).alias("period"),
        (pl.col("last_end") - pl.col("first_start")).alias("span"),
    ).with_columns((pl.col("period") - pl.col("span")).alias("host"))
    signature = out.group_by("signature").agg(pl.len(), pl.col("kernels").max().alias("most")).sort(
        "len", "most", descending=True
    )["signature"][0]
    dominant = pl.col("signature") == signature
    expected = int(out.filter(dominant)["kernels"].mode().max())
    out = out.with_columns(dominant.alias("dominant"), pl.lit(expected).alias("kernels_expected"))
    complete = pl.col("dominant") & (pl.col("kernels") == expected)
    out = out.with_columns(
        (complete & (complete.cast(pl.Int64).cum_sum() <= cfg.warmup_steps)).alias("warmup")
    )
    candidate = complete & ~pl.col("warmup")
    within = _robust_bound(pl.col("span").cast(pl.Float64), candidate, cfg.mad_k) & _robust_bound(
        pl.col("period").cast(pl.Float64), candidate, cfg.mad_k
    )
    return out.with_columns(
        (candidate & within).alias("stable"),
        pl.when(~pl.col("dominant")).then(pl.lit("other signature"))
        .when(~complete).then(pl.lit("incomplete"))
        .when(pl.col("warmup")).then(pl.lit("warm-up"))
        .when(~within).then(pl.lit("outlier"))
        .otherwise(None).alias("drop_reason"),
    ).drop("warmup")
