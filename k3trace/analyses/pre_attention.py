"""The pre-attention window of each full-attention layer (METRICS.md): FMHA kernel start
minus the end of the kernel that completed the residual stream before that layer (the
last residual kernel of the previous layer; its last kernel when none matches)."""

from __future__ import annotations

import polars as pl

from k3trace.config import Config
from k3trace.keys import grouped_by_pair


def windows(stable_kernels: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """One row per (stable step, full-attention layer): `window_ns`, the two kernels."""
    k = stable_kernels.select("step", "layer", "family", "name", "start", "end").filter(pl.col("layer").is_not_null())
    # The family first, then the pattern over the few kernels left (the two together read
    # every layered kernel's name).
    attention = k.filter(pl.col("family").is_in(cfg.full_attention_families))
    fmha = (
        attention.filter(_matching(attention["name"], cfg.fmha_pattern))
        .group_by("step", "layer")
        .agg(pl.col("start").min().alias("fmha_start"), pl.col("name").sort_by("start").first().alias("fmha_kernel"))
    )
    if fmha.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "layer": pl.Int64, "window_ns": pl.Int64,
                                    "fmha_kernel": pl.String, "residual_kernel": pl.String})
    # Only the layers just before a full-attention layer matter.
    before = k.filter(pl.col("layer").is_in((fmha["layer"] - 1).unique().implode()))
    # Only the columns the choice reads go through the sort (80k rows at 373k kernels), and
    # the groups are keyed on one integer (keys.py): 19 -> ~8 ms.
    prev = before.select("step", (pl.col("layer") + 1).alias("next_layer"), "end", "name",
                         _matching(before["name"], cfg.residual_pattern).alias("is_residual"))
    # Prefer residual-pattern kernels; within the preferred set, the last to end.
    completing = grouped_by_pair(
        prev.sort("is_residual", "end"), "step", "next_layer",
        pl.col("end").last().alias("residual_end"), pl.col("name").last().alias("residual_kernel"),
    ).rename({"next_layer": "layer"})
    return (
        fmha.join(completing, on=["step", "layer"], how="inner")
        .select("step", "layer", (pl.col("fmha_start") - pl.col("residual_end")).alias("window_ns"),
                "fmha_kernel", "residual_kernel")
        .sort("step", "layer")
    )


def _matching(names: pl.Series, pattern: str) -> pl.Series:
    """`names.str.contains(pattern)`, the pattern run over the distinct names only (a step
    repeats a few dozen names thousands of times) and the rows matched by membership."""
    distinct = names.unique()
    return names.is_in(distinct.filter(distinct.str.contains(pattern)).implode())


def summary(w: pl.DataFrame) -> dict[str, float | int] | None:
    """Median over layers x stable steps (null when the trace has no full-attention layer)."""
    if w.is_empty():
        return None
    return {"median": float(w["window_ns"].median()) / 1e3, "count": w.height,
            "layers": int(w["layer"].n_unique())}
