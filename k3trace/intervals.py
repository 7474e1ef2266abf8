"""Interval arithmetic over polars frames: union, k-stream coverage, measure within a set.

Every metric that asks "how long" (device busy, two-stream residency, exposed time, the
diff's replayed spans) goes through these few functions, grouped by arbitrary keys
(step, family, ...) and fully vectorised: no Python loop over intervals.
Intervals are half-open [start, end) in ns.

Speed: rather than windowed (`over`) scans per group, each group's intervals are moved
onto a private stretch of one global timeline (`group_index * stride`), so a single
sorted scan handles every group at once and nothing can leak across groups.
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

Keys = Sequence[str]


def _on_one_timeline(frame: pl.DataFrame, by: Keys, cols: Sequence[str]) -> tuple[pl.DataFrame, int, int]:
    """`frame` with `_g` (dense group index) and `cols` shifted to `col - base + _g*stride`."""
    by = list(by)
    lo = min(int(frame[c].min()) for c in cols) if frame.height else 0
    hi = max(int(frame[c].max()) for c in cols) if frame.height else 0
    stride = hi - lo + 2
    out = frame.with_columns(_group_index(frame, by).alias("_g")).with_columns(
        (pl.col(c) - lo + pl.col("_g") * stride).alias(c) for c in cols
    )
    return out, lo, stride


def _group_index(frame: pl.DataFrame, by: list[str]) -> pl.Expr:
    """A dense-enough integer per group: integer keys are combined arithmetically (ranking
    a struct of keys costs more than the rest of a union); other keys are ranked."""
    if not by:
        return pl.lit(0, pl.Int64)
    if not all(frame.schema[c].is_integer() for c in by):
        return pl.struct(by).rank("dense").cast(pl.Int64) - 1
    index = pl.lit(0, pl.Int64)
    for c in by:
        rank = pl.col(c).rank("dense").cast(pl.Int64) - 1
        index = index * (pl.col(c).n_unique().cast(pl.Int64)) + rank
    return index


def _from_timeline(frame: pl.DataFrame, cols: Sequence[str], lo: int, stride: int) -> pl.DataFrame:
    return frame.with_columns((pl.col(c) - pl.col("_g") * stride + lo).alias(c) for c in cols)


def union(frame: pl.DataFrame, by: Keys, start: str = "start", end: str = "end") -> pl.DataFrame:
    """Disjoint intervals covering the union of `frame`'s intervals within each group."""
    by = list(by)
    base = frame.select(*by, pl.col(start).alias("start"), pl.col(end).alias("end"))
    if base.is_empty():
        return base
    flat, lo, stride = _on_one_timeline(base, by, ["start", "end"])
    flat = flat.sort("start").with_columns(pl.col("end").cum_max().alias("_reach"))
    opens = (pl.col("start") > pl.col("_reach").shift(1)).fill_null(True)
    flat = flat.with_columns(opens.alias("_open")).with_columns(
        pl.col("_open").shift(-1).fill_null(True).alias("_close")
    )
    # A block opens where a start passes every earlier end; it closes just before the next
    # opening, reaching the running maximum of ends there.
    firsts = flat.filter(pl.col("_open")).select("_g", *by, "start")
    lasts = flat.filter(pl.col("_close")).select(pl.col("_reach").alias("end"))
    merged = pl.concat([firsts, lasts], how="horizontal")
    return _from_timeline(merged, ["start", "end"], lo, stride).select(*by, "start", "end")


def length(intervals: pl.DataFrame, by: Keys, name: str = "length") -> pl.DataFrame:
    """Total length per group of (already disjoint) intervals."""
    total = (pl.col("end") - pl.col("start")).sum().alias(name)
    if not by:
        return intervals.select(total)
    return intervals.group_by(*by).agg(total)


def union_length(frame: pl.DataFrame, by: Keys, name: str = "length") -> pl.DataFrame:
    return length(union(frame, by), by, name)


def coverage(frame: pl.DataFrame, by: Keys, lane: str, at_least: int = 2) -> pl.DataFrame:
    """Disjoint intervals where at least `at_least` distinct `lane`s (streams) are active.

    Each lane's intervals are merged first, so a same-stream overlap (PDL reported as
    overlap by some CUPTI versions) never counts as two streams.
    """
    by = list(by)
    per_lane = union(frame, [*by, lane]) if _lane_overlaps(frame, [*by, lane]) else frame.select(*by, "start", "end")
    if per_lane.is_empty():
        return per_lane.select(*by, "start", "end")
    flat, lo, stride = _on_one_timeline(per_lane, by, ["start", "end"])
    events = pl.concat([
        flat.select("_g", *by, pl.col("start").alias("t"), pl.lit(1, pl.Int32).alias("delta")),
        flat.select("_g", *by, pl.col("end").alias("t"), pl.lit(-1, pl.Int32).alias("delta")),
    ]).sort("t", "delta")  # ends before starts at one instant: touching is not overlap
    # Each group's +1/-1 cancel before the next group's stretch, so one running sum serves all.
    pieces = (
        events.with_columns(pl.col("delta").cum_sum().alias("active"), pl.col("t").shift(-1).alias("t_next"))
        .filter(pl.col("active") >= at_least, pl.col("t_next") > pl.col("t"))
        .select("_g", *by, pl.col("t").alias("start"), pl.col("t_next").alias("end"))
    )
    pieces = _from_timeline(pieces, ["start", "end"], lo, stride).drop("_g")
    return union(pieces, by)


def _lane_overlaps(frame: pl.DataFrame, keys: list[str]) -> bool:
    """Does any interval start before the previous one of its lane ended? Lanes are
    streams, which run their work in order, so only neighbours can overlap (a PDL prologue
    reported as overlap); checking consecutive pairs is enough."""
    if frame.height < 2:
        return False
    ordered = frame.select(*keys, "start", "end").sort(*keys, "start")
    same = pl.all_horizontal(pl.col(k) == pl.col(k).shift(1) for k in keys)
    return bool(ordered.select((same & (pl.col("start") < pl.col("end").shift(1))).any()).item())


def measure_within(frame: pl.DataFrame, mask: pl.DataFrame, by: Keys, name: str,
                   start: str = "start", end: str = "end") -> pl.DataFrame:
    """`frame` with column `name`: the length of each row's [start, end) inside `mask`,
    a set of disjoint intervals per group `by` (e.g. from `coverage` or `union`)."""
    by = list(by)
    if frame.is_empty() or mask.is_empty():
        return frame.with_columns(pl.lit(0, pl.Int64).alias(name))
    # One timeline for both sides: group indices must agree, so rank over the union of keys.
    keys = pl.concat([frame.select(by), mask.select(by)]).unique() if by else None
    lo = min(int(frame[start].min()), int(mask["start"].min()))
    hi = max(int(frame[end].max()), int(mask["end"].max()))
    stride = hi - lo + 2
    if by:
        keys = keys.sort(by).with_row_index("_g").with_columns(pl.col("_g").cast(pl.Int64))
        f = frame.with_row_index("_row").join(keys, on=by, how="left")
        m = mask.join(keys, on=by, how="left")
    else:
        f = frame.with_row_index("_row").with_columns(pl.lit(0, pl.Int64).alias("_g"))
        m = mask.with_columns(pl.lit(0, pl.Int64).alias("_g"))
    shift = pl.col("_g") * stride - lo
    m = m.select((pl.col("start") + shift).alias("_ms"), (pl.col("end") + shift).alias("_me")).sort("_ms")
    m = m.with_columns((pl.col("_me") - pl.col("_ms")).cum_sum().shift(1).fill_null(0).alias("_before"))

    def covered_until(col: str) -> pl.Series:
        probe = f.select("_row", (pl.col(col) + shift).alias("_t")).sort("_t")
        hit = probe.join_asof(m, left_on="_t", right_on="_ms", strategy="backward", check_sortedness=False)
        # Mask intervals of earlier groups end before this group's stretch: clip at _me.
        upto = pl.col("_before") + (pl.min_horizontal("_t", "_me") - pl.col("_ms"))
        return hit.select("_row", upto.fill_null(0).alias("_cov")).sort("_row")["_cov"]

    covered = covered_until(end) - covered_until(start)
    return frame.with_columns(covered.alias(name))
