"""A step's dependency graph, replayable: the edges of the critical-path walk (same-stream
order, cross-stream joins, CPU launches, PDL) over one representative stable step, with
each kernel's median duration and each binding edge's median lag over stable steps.

Replaying it answers "what would the span be if this kernel took d instead": the basis of
the diff's counterfactual attribution and of each kernel's slack. A binding edge keeps the
gap measured on it (launch latency, event wait, PDL's 1 ns or overlap); a non-binding edge
gets no lag, so a predecessor that grows moves a kernel only once it exceeds its slack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from k3trace.analyses.critical_path import JOIN, LAUNCH, STREAM

#: Edge slots per node: the stream predecessor and the cross-stream join; the diff uses the
#: rest to wire in another build's edges (an added kernel in front of an old one, a matched
#: kernel's new stream predecessor and join) without changing the graph between variants.
STREAM_SLOT, JOIN_SLOT, EXTRA_SLOT, NEW_STREAM_SLOT, NEW_JOIN_SLOT = 0, 1, 2, 3, 4
SLOTS = 5
NEVER = -1e18  # lag of an edge that must never bind


@dataclass(frozen=True)
class StepGraph:
    """Nodes in topological order (`order`); predecessor index -1 where absent."""

    nodes: pl.DataFrame          # launch_rank, name, family, layer, stream_id, start, duration, binding, pdl
    preds: np.ndarray            # int64 [n, SLOTS]
    lags: np.ndarray             # float64 [n, SLOTS]: gap after each predecessor (0 unless binding)
    launch_at: np.ndarray        # float64 [n]: CPU release relative to the step start (ns)
    launch_lag: np.ndarray       # float64 [n]
    duration: np.ndarray         # float64 [n]
    order: np.ndarray            # int64 [n]: a topological order of the nodes

    @property
    def size(self) -> int:
        return len(self.duration)


def build(path: pl.DataFrame) -> StepGraph:
    """From `critical_path.walk` output over stable steps (all steps share the kernel list)."""
    spans = path.group_by("step").agg((pl.col("end").max() - pl.col("start").min()).alias("span"))
    median_span = spans["span"].median()
    rep_step = spans.with_columns((pl.col("span") - median_span).abs().alias("d")).sort("d", "step")["step"][0]
    step_start = path.group_by("step").agg(pl.col("start").min().alias("step_start"))
    timed = path.join(step_start, on="step").with_columns(
        (pl.col("end") - pl.col("start")).alias("duration"),
        (pl.col("start") - pl.col("release")).alias("lag"),
    )
    durations = timed.group_by("launch_rank").agg(pl.col("duration").median().alias("median_duration"))
    # A gap's median only over steps where the same edge released the kernel: a launch
    # edge's lag (the time since the CPU enqueued the graph) mixed with a stream edge's
    # (a few ns) would release the kernel milliseconds early in the replay.
    lags = timed.group_by("launch_rank", "binding").agg(pl.col("lag").median().alias("median_lag"))
    rep = (
        timed.filter(pl.col("step") == rep_step)
        .join(durations, on="launch_rank", how="left")
        .join(lags, on=["launch_rank", "binding"], how="left")
        # A launch edge keeps this step's own gap: how long the graph sat in the queue varies
        # from step to step, and the replay must start its roots where this step did.
        .with_columns(pl.when(pl.col("binding") == LAUNCH).then(pl.col("lag"))
                      .otherwise(pl.coalesce("median_lag", "lag")).alias("median_lag"))
        .sort("start", "end")
        .with_row_index("idx")
    )
    index_of = dict(zip(rep["kernel_id"].to_list(), rep["idx"].to_list()))

    def indices(col: str) -> np.ndarray:
        return np.array([index_of.get(v, -1) if v is not None else -1 for v in rep[col].to_list()], dtype=np.int64)

    n = rep.height
    binding = rep["binding"].to_numpy()
    lag = rep["median_lag"].fill_null(0).to_numpy().astype(np.float64)
    preds = np.full((n, SLOTS), -1, dtype=np.int64)
    preds[:, STREAM_SLOT] = indices("stream_pred")
    preds[:, JOIN_SLOT] = indices("join_pred")
    lags = np.zeros((n, SLOTS))
    lags[:, STREAM_SLOT] = np.where(binding == STREAM, lag, 0.0)
    lags[:, JOIN_SLOT] = np.where(binding == JOIN, lag, 0.0)
    # Missing launch records (a lost runtime row): treat the node as released at step start.
    launch_at = (rep["launch_release"] - rep["step_start"]).fill_null(0).to_numpy().astype(np.float64)
    nodes = rep.select("launch_rank", "name", "family", "layer", "stream_id",
                       (pl.col("start") - pl.col("step_start")).alias("start"),
                       pl.col("median_duration").alias("duration"), "binding", "pdl")
    return StepGraph(
        nodes=nodes, preds=preds, lags=lags, launch_at=launch_at,
        launch_lag=np.where(binding == LAUNCH, lag, 0.0),
        duration=rep["median_duration"].to_numpy().astype(np.float64),
        order=np.arange(n, dtype=np.int64),  # start order: every edge points forward in time
    )


def replay(g: StepGraph, duration: np.ndarray | None = None, lags: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every node, for one or many variants at once.

    `duration` may be [variants, n] and `lags` [variants, n, SLOTS]; the pass is sequential
    over nodes in topological order and vectorised over variants.
    """
    dur = g.duration if duration is None else duration
    lag = g.lags if lags is None else lags
    batch = np.broadcast_shapes(dur.shape[:-1], lag.shape[:-2])
    start = np.zeros((*batch, g.size))
    end = np.zeros((*batch, g.size))
    launch = g.launch_at + g.launch_lag
    for i in g.order:
        t = np.full(batch, launch[i])
        for slot in range(SLOTS):
            p = g.preds[i, slot]
            if p >= 0:
                t = np.maximum(t, end[..., p] + lag[..., i, slot])
        start[..., i] = t
        end[..., i] = t + dur[..., i]
    return start, end


def span(start: np.ndarray, end: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """Replayed step span; `present` masks out nodes that are absent in a variant."""
    if present is None:
        return end.max(axis=-1) - start.min(axis=-1)
    return np.where(present, end, -np.inf).max(axis=-1) - np.where(present, start, np.inf).min(axis=-1)


def slack(g: StepGraph) -> np.ndarray:
    """How much longer each node could run without lengthening the replayed span (ns)."""
    _, end = replay(g)
    latest_end = np.full(g.size, end.max())
    for i in g.order[::-1]:
        latest_start = latest_end[i] - g.duration[i]
        for slot in range(SLOTS):
            p = g.preds[i, slot]
            if p >= 0:
                latest_end[p] = min(latest_end[p], latest_start - g.lags[i, slot])
    return np.maximum(latest_end - end, 0.0)
