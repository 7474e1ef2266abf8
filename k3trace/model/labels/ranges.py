"""The label range around a point in time on one thread (a launch call, a graph node's
creation): the innermost enclosing one, since module ranges nest over the whole module tree."""

from __future__ import annotations

import numpy as np
import polars as pl


def with_depth(ranges: pl.DataFrame) -> pl.DataFrame:
    """`depth`: how many of `ranges` on the same thread enclose each range.

    Push/pop ranges of one thread nest properly, so the ranges still open when one starts
    are exactly those enclosing it: (ranges started before it) - (ranges ended by then).
    """
    if ranges.is_empty():
        return ranges.with_columns(pl.lit(0, dtype=pl.Int64).alias("depth"))
    parts = []
    ordered = ranges.sort("tid", "range_start", "range_end", descending=[False, False, True])
    for part in ordered.partition_by("tid", maintain_order=True):
        starts = part["range_start"].to_numpy()
        ends = np.sort(part["range_end"].to_numpy())
        closed = np.searchsorted(ends, starts, side="right")
        parts.append(part.with_columns(pl.Series("depth", np.arange(len(starts)) - closed, dtype=pl.Int64)))
    return pl.concat(parts)


def innermost(points: pl.DataFrame, ranges: pl.DataFrame, key: str, payload: list[str]) -> pl.DataFrame:
    """`key` -> `payload` of the innermost range enclosing each point (columns `tid`, `at`).

    Ranges at one depth on one thread never overlap, so per depth the latest range starting
    at or before the point is its only candidate; the deepest enclosing one wins.
    """
    schema = {key: points.schema[key], **{c: ranges.schema[c] for c in payload}}
    keyed = points.filter(pl.col("at").is_not_null(), pl.col("tid").is_not_null()).sort("at")
    if keyed.is_empty() or ranges.is_empty():
        return pl.DataFrame(schema=schema)
    ranged = with_depth(ranges)
    hits = []
    for depth in range(int(ranged["depth"].max()) + 1):
        level = ranged.filter(pl.col("depth") == depth).sort("range_start")
        hit = keyed.join_asof(level, left_on="at", right_on="range_start", by="tid", strategy="backward",
                              check_sortedness=False)
        hits.append(hit.filter(pl.col("at") <= pl.col("range_end")).select(key, "depth", *payload))
    return pl.concat(hits).sort("depth", descending=True).unique(key, keep="first").select(list(schema))
