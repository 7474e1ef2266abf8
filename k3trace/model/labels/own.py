"""Source `nvtx`: k3trace's own `layer.<index>.<family>` ranges (config `[labels] layer_pattern`)."""

from __future__ import annotations

import polars as pl

from k3trace.config import Config
from k3trace.ingest import Trace


def layer_ranges(trace: Trace, cfg: Config, pid: int) -> pl.DataFrame:
    """tid, range_start, range_end, layer, family of every own-format layer range of process
    `pid`; a zero-length range can hold no launch and is left out."""
    ranges = trace.nvtx.filter(
        pl.col("global_pid") == pid, pl.col("end").is_not_null(), pl.col("end") > pl.col("start"),
        pl.col("text").str.contains(cfg.layer_pattern),
    )
    parts = pl.col("text").str.extract_groups(cfg.layer_pattern)
    return ranges.select(
        pl.col("global_tid").alias("tid"), pl.col("start").alias("range_start"), pl.col("end").alias("range_end"),
        parts.struct.field("index").cast(pl.Int64).alias("layer"), parts.struct.field("family").alias("family"),
    ).sort("range_start")
