"""Interval arithmetic over polars frames: union, k-stream coverage, measure within a set.

Every metric that asks "how long" (device busy, two-stream residency, exposed time, the
diff's replayed spans) goes through these few functions, grouped by arbitrary keys
(step, family, ...) and fully vectorised: no Python loop over intervals.
Intervals are half-open [start, end) in integer ns; group keys are never null.

Speed: rather than windowed (`over`) scans per group, each group's intervals are moved
onto a private stretch of one global timeline (`group_index * stride`), so a single
sorted scan handles every group at once and nothing can leak across groups. The scans
are numpy over that one line (an argsort and a running maximum or sum): polars' sorts and
as-of joins of the same cost 3 to 5 times as much at 400k kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl

Keys = Sequence[str]


def _group_index(frames: Sequence[pl.DataFrame], by: list[str]) -> list[np.ndarray]:
    """Per frame, an integer per row that orders groups as their keys sort (key by key)
    and is equal for equal keys across `frames`. Integer keys count from their minimum
    (no sort needed); others by their rank among the distinct values."""
    index = [np.zeros(f.height, dtype=np.int64) for f in frames]
    for c in by:
        columns = [f[c] for f in frames]
        if all(col.dtype.is_integer() for col in columns):
            values = [col.cast(pl.Int64).to_numpy() for col in columns]
            lo = min(int(v.min()) for v in values if len(v))
            width = max(int(v.max()) for v in values if len(v)) - lo + 1
            codes = [v - lo for v in values]
        else:
            distinct = pl.concat([col.cast(pl.String) for col in columns]).unique().drop_nulls().sort()
            width = len(distinct)
            # An Enum of the sorted values: its codes keep their order (2-3x cheaper than a
            # replace over the text).
            codes = [col.cast(pl.String).cast(pl.Enum(distinct)).to_physical().cast(pl.Int64).to_numpy()
                     for col in columns]
        index = [i * width + code for i, code in zip(index, codes)]
    return index


@dataclass(frozen=True)
class _Line:
    """One timeline for all groups: t -> t - lo + group * stride, each group's stretch
    longer than the whole time range, so no two groups' times meet."""

    lo: int
    stride: int

    @classmethod
    def spanning(cls, times: Sequence[np.ndarray], groups: Sequence[np.ndarray]) -> "_Line":
        lo = min(int(t.min()) for t in times if len(t))
        stride = max(int(t.max()) for t in times if len(t)) - lo + 2
        if (max(int(g.max()) for g in groups if len(g)) + 1) * stride >= 2**62:
            raise OverflowError("too many groups over too long a time range for one int64 timeline")
        return cls(lo, stride)

    def on(self, t: np.ndarray, group: np.ndarray) -> np.ndarray:
        return t - self.lo + group * self.stride

    def off(self, t: np.ndarray, group: np.ndarray) -> np.ndarray:
        return t - group * self.stride + self.lo


def _times(frame: pl.DataFrame, col: str) -> np.ndarray:
    return frame[col].cast(pl.Int64).to_numpy()


def _blocks(start: np.ndarray, end: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals visited in start order: (position of each block's first interval in
    that order, block starts, block ends). A block opens where a start passes every earlier
    end (touching intervals join); it closes just before the next opening, reaching the
    running maximum of ends there."""
    s = start[order]
    reach = np.maximum.accumulate(end[order])
    opens = np.ones(len(s), dtype=bool)
    opens[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, len(s) - 1)
    return first, s[first], reach[last]


def union(frame: pl.DataFrame, by: Keys, start: str = "start", end: str = "end") -> pl.DataFrame:
    """Disjoint intervals covering the union of `frame`'s intervals within each group."""
    by = list(by)
    base = frame.select(*by, pl.col(start).alias("start"), pl.col(end).alias("end"))
    if base.is_empty():
        return base
    return _union(base, by, *_group_index([base], by))


def _merged(frame: pl.DataFrame, group: np.ndarray):
    """The union's blocks, in group order: each block's first row, its group, and its start
    and end on the groups' line (`line.off` maps them back)."""
    s, e = _times(frame, "start"), _times(frame, "end")
    line = _Line.spanning([s, e], [group])
    flat_s = line.on(s, group)
    order = np.argsort(flat_s, kind="stable")
    first, block_start, block_end = _blocks(flat_s, line.on(e, group), order)
    rows = order[first]
    return rows, group[rows], block_start, block_end, line


def _union(base: pl.DataFrame, by: list[str], group: np.ndarray) -> pl.DataFrame:
    rows, g, block_start, block_end, line = _merged(base, group)
    return base.select(by)[rows].with_columns(pl.Series("start", line.off(block_start, g)),
                                              pl.Series("end", line.off(block_end, g)))


def length(intervals: pl.DataFrame, by: Keys, name: str = "length") -> pl.DataFrame:
    """Total length per group of (already disjoint) intervals."""
    total = (pl.col("end") - pl.col("start")).sum().alias(name)
    if not by:
        return intervals.select(total)
    return intervals.group_by(*by).agg(total)


def union_length(frame: pl.DataFrame, by: Keys, name: str = "length") -> pl.DataFrame:
    """Length of the union of `frame`'s intervals per group: one row per group (any order).
    Summed straight off the merged blocks, which the scan leaves in group order: the
    union's frame and a grouping of it by (possibly text) keys cost twice the scan."""
    by = list(by)
    if not by or frame.is_empty():
        return length(union(frame, by), by, name)
    (group,) = _group_index([frame], by)
    rows, g, block_start, block_end, _ = _merged(frame, group)
    opens = np.ones(len(g), dtype=bool)
    opens[1:] = g[1:] != g[:-1]
    at = np.flatnonzero(opens)
    return frame.select(by)[rows[at]].with_columns(pl.Series(name, np.add.reduceat(block_end - block_start, at),
                                                             dtype=pl.Int64))


def coverage(frame: pl.DataFrame, by: Keys, lane: str, at_least: int = 2) -> pl.DataFrame:
    """Disjoint intervals where at least `at_least` distinct `lane`s (streams) are active.

    Each lane's intervals are merged first, so a same-stream overlap (PDL reported as
    overlap by some CUPTI versions) never counts as two streams.
    """
    by = list(by)
    per_lane = union(frame, [*by, lane]) if _lane_overlaps(frame, [*by, lane]) else frame.select(*by, "start", "end")
    if per_lane.is_empty():
        return per_lane.select(*by, "start", "end")
    (group,) = _group_index([per_lane], by)
    s, e = _times(per_lane, "start"), _times(per_lane, "end")
    line = _Line.spanning([s, e], [group])
    n = len(s)
    t = np.concatenate([line.on(s, group), line.on(e, group)])
    delta = np.concatenate([np.ones(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)])
    # Each group's +1/-1 cancel before the next group's stretch, so one running sum serves
    # all. Of the events at one instant only the last is kept (it carries the count after
    # all of them), so their order among themselves does not matter: touching is not overlap.
    order = np.argsort(t, kind="stable")
    t, active = t[order], np.cumsum(delta[order])
    keep = np.flatnonzero((active[:-1] >= at_least) & (t[1:] > t[:-1]))
    rows = order[keep] % n
    if not len(keep):
        return per_lane.select(*by, "start", "end").clear()
    piece_start, piece_end = t[keep], t[keep + 1]
    # Pieces are disjoint and in time order; touching ones merge into one interval.
    first, block_start, block_end = _blocks(piece_start, piece_end, np.arange(len(keep)))
    g = group[rows[first]]
    return per_lane.select(by)[rows[first]].with_columns(pl.Series("start", line.off(block_start, g)),
                                                         pl.Series("end", line.off(block_end, g)))


def _lane_overlaps(frame: pl.DataFrame, keys: list[str]) -> bool:
    """Does any interval start before the previous one of its lane ended? Lanes are
    streams, which run their work in order, so only neighbours can overlap (a PDL prologue
    reported as overlap); checking consecutive pairs is enough."""
    if frame.height < 2:
        return False
    (group,) = _group_index([frame], keys)
    s, e = _times(frame, "start"), _times(frame, "end")
    line = _Line.spanning([s, e], [group])
    order = np.argsort(line.on(s, group), kind="stable")
    g, s, e = group[order], s[order], e[order]
    return bool(np.any((g[1:] == g[:-1]) & (s[1:] < e[:-1])))


def measure_within(frame: pl.DataFrame, mask: pl.DataFrame, by: Keys, name: str,
                   start: str = "start", end: str = "end") -> pl.DataFrame:
    """`frame` with column `name`: the length of each row's [start, end) inside `mask`,
    a set of disjoint intervals per group `by` (e.g. from `coverage` or `union`)."""
    by = list(by)
    if frame.is_empty() or mask.is_empty():
        return frame.with_columns(pl.lit(0, pl.Int64).alias(name))
    # One timeline for both sides: group indices must agree, so they count over both.
    fg, mg = _group_index([frame, mask], by)
    fs, fe = _times(frame, start), _times(frame, end)
    ms, me = _times(mask, "start"), _times(mask, "end")
    line = _Line.spanning([fs, fe, ms, me], [fg, mg])
    ms, me = line.on(ms, mg), line.on(me, mg)
    order = np.argsort(ms, kind="stable")
    ms, me = ms[order], me[order]
    before = np.concatenate([[0], np.cumsum(me - ms)[:-1]])

    def covered_until(t: np.ndarray) -> np.ndarray:
        # The mask interval starting last at or before t; those of earlier groups end before
        # this group's stretch, so clipping at their end counts them whole on both sides.
        at = np.searchsorted(ms, t, side="right") - 1
        hit = np.maximum(at, 0)
        return np.where(at >= 0, before[hit] + (np.minimum(t, me[hit]) - ms[hit]), 0)

    covered = covered_until(line.on(fe, fg)) - covered_until(line.on(fs, fg))
    return frame.with_columns(pl.Series(name, covered, dtype=pl.Int64))
