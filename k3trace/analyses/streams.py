"""Which capture stream each kernel of a step ran on: the main stream or a side stream
(docs/metrics.md, "Stream roles").

An eager step's kernels carry the streams they were launched on. A CUDA graph replay's do
not: the driver runs a graph's branches on internal streams of its own and moves a chain of
kernels to another internal stream at forks and joins, and nsys records no stream for the
launches made during capture. When the trace holds an eager step of the same code (the same
kernel names in the same launch order, as a warm-up before the capture), each replayed
kernel takes the stream of the eager kernel at its launch position. Otherwise the rows are
inferred: kernels packed by time into as few rows as their overlaps allow, each preferring
the row of the kernel that released it.

The main stream is the one holding the most kernels (ties: the one launching the step's
first kernel); the others are side streams, in order of their first kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

RECORDED, EAGER, INFERRED = "recorded", "eager", "inferred"
MAIN = "main"


@dataclass(frozen=True)
class StreamRoles:
    rows: pl.DataFrame        # kernel_id, capture_stream (null when inferred), row (0 = main), role
                              # ("main", "side" or "side 1", "side 2", ...)
    source: str               # recorded | eager | inferred
    eager_step: int | None    # the eager step the streams were taken from (source eager)

    @property
    def labels(self) -> list[str]:
        """Row labels, main first."""
        return self.rows.unique("row").sort("row")["role"].to_list()

    def describe(self) -> str:
        if self.source == RECORDED:
            return "rows: the streams the kernels were launched on"
        if self.source == EAGER:
            return (f"rows: capture streams, from eager step {self.eager_step} of the same code (aligned by launch "
                    "order; a graph replay runs on internal streams of its own)")
        return ("rows inferred: no eager step of this graph to take capture streams from, so kernels are packed by "
                "time, each following the kernel that released it; main = the row with the most kernels")


def stream_roles(kernels: pl.DataFrame, path: pl.DataFrame, step: int) -> StreamRoles:
    """`kernels`: the Analysis' labelled kernels; `path`: its critical-path frame (for the
    releasing kernel of each, used when rows are inferred)."""
    k = kernels.filter(pl.col("step") == step).sort("launch_rank")
    if k["graph_node_id"].is_null().all() or k["stream_id"].n_unique() == 1:  # eager, or one stream throughout
        return _roles(k.select("kernel_id", "start", pl.col("stream_id").alias("capture_stream")), RECORDED, None)
    eager = kernels.filter(pl.col("graph_node_id").is_null(), pl.col("eager_step").is_not_null())
    names = k["name"].to_list()
    for (number,), cand in eager.sort("eager_step", "launch_rank").group_by("eager_step", maintain_order=True):
        if cand.height == k.height and cand["name"].to_list() == names:
            streams = k.select("kernel_id", "start").with_columns(cand["stream_id"].alias("capture_stream"))
            return _roles(streams, EAGER, int(number))
    return _inferred(k, path.filter(pl.col("step") == step))


def _roles(streams: pl.DataFrame, source: str, eager_step: int | None) -> StreamRoles:
    """Main = the stream with the most kernels (ties: the one with the earliest kernel)."""
    per = streams.group_by("capture_stream").agg(pl.len().alias("n"), pl.col("start").min().alias("first"))
    main = per.sort(["n", "first"], descending=[True, False])["capture_stream"][0]
    sides = per.filter(pl.col("capture_stream") != main).sort("first")["capture_stream"].to_list()
    order = {main: 0, **{s: i + 1 for i, s in enumerate(sides)}}
    names = {0: MAIN, **{i + 1: ("side" if len(sides) == 1 else f"side {i + 1}") for i in range(len(sides))}}
    rows = streams.with_columns(pl.col("capture_stream").replace_strict(order, return_dtype=pl.Int64).alias("row"))
    rows = rows.with_columns(pl.col("row").replace_strict(names, return_dtype=pl.String).alias("role"))
    return StreamRoles(rows.select("kernel_id", "capture_stream", "row", "role"), source, eager_step)


def _inferred(k: pl.DataFrame, path: pl.DataFrame) -> StreamRoles:
    """Greedy packing in start order: a kernel goes to its releaser's row when that row is
    free by its start, else to the first free row, else to a new one."""
    pred = dict(zip(path["kernel_id"].to_list(), path["pred"].to_list()))
    ordered = k.sort("start", "end")
    row_of: dict[int, int] = {}
    row_end: list[int] = []
    for kid, start, end in ordered.select("kernel_id", "start", "end").iter_rows():
        free = [r for r, e in enumerate(row_end) if e <= start]
        p = pred.get(kid)
        if p is not None and row_of.get(p) in free:
            row = row_of[p]
        elif free:
            row = free[0]
        else:
            row_end.append(0)
            row = len(row_end) - 1
        row_of[kid] = row
        row_end[row] = max(row_end[row], end)
    streams = ordered.select("kernel_id", "start").with_columns(
        pl.Series("capture_stream", [row_of[i] for i in ordered["kernel_id"].to_list()], dtype=pl.Int64))
    roles = _roles(streams, INFERRED, None)
    return StreamRoles(roles.rows.with_columns(pl.lit(None, pl.Int64).alias("capture_stream")), INFERRED, None)
