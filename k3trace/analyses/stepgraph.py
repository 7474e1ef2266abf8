"""A step's dependency graph, replayable: the edges of the critical-path walk (same-stream
order, cross-stream joins, CPU launches, PDL) over one representative stable step, with
each kernel's mean duration and each binding edge's mean lag over stable steps.

Replaying it answers "what would the span be if this kernel took d instead": the basis of
the diff's counterfactual attribution and of each kernel's slack. A binding edge keeps the
mean gap measured on it (launch latency, event wait, PDL's 1 ns or overlap); a non-binding
edge at most its mean slack, so a predecessor that grows moves a kernel only once it
exceeds that slack.

Means, not medians: a chain's span is the sum of its kernels, and the mean of a sum is the
sum of the means. Kernel durations are right-skewed, so medians replayed the K3 step ~10 us
(0.9%) short of its median span on every bundled recording. Lags are calibrated on mean
start and end times (a gap averaged only over the steps where its edge bound counted the
waits of both edges, ~1 us too long on the small workload), so the replay reproduces every
kernel's mean start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from k3trace.analyses.critical_path import JOIN, LAUNCH, STREAM

#: Edge slots per node: the stream predecessor and the cross-stream join.
STREAM_SLOT, JOIN_SLOT = 0, 1
SLOTS = 2


@dataclass(frozen=True)
class StepGraph:
    """Nodes in topological order (`order`); predecessor index -1 where absent."""

    nodes: pl.DataFrame          # kernel_id, launch_rank, name, signature, family, layer, stream_id, start, duration,
                                 # binding, pdl; role (main | side ...) once the pipeline adds it
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
    # A window, not a join: the rows stay in place and no column is copied (peak memory).
    timed = path.with_columns(pl.col("start").min().over("step").alias("step_start")).with_columns(
        (pl.col("end") - pl.col("start")).alias("duration"),
        (pl.col("start") - pl.col("release")).alias("lag"),
    )
    means = timed.group_by("launch_rank").agg(
        pl.col("duration").mean().alias("mean_duration"),
        (pl.col("start") - pl.col("step_start")).mean().alias("mean_start"),
        (pl.col("end") - pl.col("step_start")).mean().alias("mean_end"),
    )
    rep = (
        timed.filter(pl.col("step") == rep_step)
        .join(means, on="launch_rank", how="left")
        .sort("start", "end")
        .with_row_index("idx")
    )
    index_of = dict(zip(rep["kernel_id"].to_list(), rep["idx"].to_list()))

    def indices(col: str) -> np.ndarray:
        return np.array([index_of.get(v, -1) if v is not None else -1 for v in rep[col].to_list()], dtype=np.int64)

    n = rep.height
    binding = rep["binding"].to_numpy()
    preds = np.full((n, SLOTS), -1, dtype=np.int64)
    preds[:, STREAM_SLOT] = indices("stream_pred")
    preds[:, JOIN_SLOT] = indices("join_pred")
    # Nodes are in start order; a predecessor that started after the kernel cannot have
    # released it (the cross-stream PDL probe can pick a producer's neighbour that started
    # late and ended just after): drop such edges, so start order stays topological.
    preds = np.where(preds < np.arange(n)[:, None], preds, -1)
    mean_start = rep["mean_start"].to_numpy().astype(np.float64)
    mean_end = rep["mean_end"].to_numpy().astype(np.float64)
    # Lags calibrated on the means: the binding edge gets the mean gap to its predecessor
    # over all stable steps, every other edge at most the slack it has on average, so the
    # replay puts each kernel at its mean start (and the span at the mean span) while a
    # predecessor that grows still delays what depends on it once past that slack.
    gap = mean_start[:, None] - mean_end[np.clip(preds, 0, None)]
    binds = np.stack([binding == STREAM, binding == JOIN], axis=1) & (preds >= 0)
    # A kernel whose binding edge was dropped above is calibrated on its stream edge instead.
    lost = ~binds.any(axis=1) & (binding != LAUNCH) & (preds[:, STREAM_SLOT] >= 0)
    binds[lost, STREAM_SLOT] = True
    lags = np.where(preds >= 0, np.where(binds, gap, np.minimum(gap, 0.0)), 0.0)
    # Missing launch records (a lost runtime row): treat the node as released at step start.
    launch_at = (rep["launch_release"] - rep["step_start"]).fill_null(0).to_numpy().astype(np.float64)
    launch_at = np.where(binding == LAUNCH, mean_start, np.minimum(launch_at, mean_start))
    # No kernel of a step starts before the step does: a graph launch the CPU enqueued 60 ms
    # ahead releases its kernels at the step start (the previous replay's end), not then.
    launch_at = np.maximum(launch_at, 0.0)
    nodes = rep.select("kernel_id", "launch_rank", "name", "signature", "family", "layer", "stream_id",
                       (pl.col("start") - pl.col("step_start")).alias("start"),
                       pl.col("mean_duration").alias("duration"), "binding", "pdl",
                       "pdl_start")
    return StepGraph(
        nodes=nodes, preds=preds, lags=lags, launch_at=launch_at,
        launch_lag=np.zeros(n),
        duration=rep["mean_duration"].to_numpy().astype(np.float64),
        order=np.arange(n, dtype=np.int64),  # start order: every edge points forward in time
    )


def side_stream(g: StepGraph) -> np.ndarray:
    """Per node: runs on a side stream. By capture stream where the analysis resolved one
    (`role`: a graph replay runs on internal streams of its own, and on the K3 path the
    busiest of them holds 16 of 198 kernels); else off the stream most kernels use."""
    if "role" in g.nodes.columns and g.nodes["role"].null_count() < g.nodes.height:
        return (g.nodes["role"].fill_null("main") != "main").to_numpy()
    stream = g.nodes["stream_id"].to_numpy()
    values, counts = np.unique(stream, return_counts=True)
    return stream != values[np.argmax(counts)]


def replay(g: StepGraph, duration: np.ndarray | None = None, lags: np.ndarray | None = None,
           launch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every node, for one or many variants at once.

    `duration` may be [variants, n], `lags` [variants, n, SLOTS] and `launch` (each node's
    CPU release, default the graph's) [variants, n]; the pass is sequential over nodes in
    topological order and vectorised over variants.
    """
    dur = g.duration if duration is None else duration
    lag = g.lags if lags is None else lags
    release = (g.launch_at + g.launch_lag) if launch is None else launch
    batch = np.broadcast_shapes(dur.shape[:-1], lag.shape[:-2], release.shape[:-1])
    start = np.zeros((*batch, g.size))
    end = np.zeros((*batch, g.size))
    for i in g.order:
        t = np.broadcast_to(release[..., i], batch).copy()
        for slot in range(SLOTS):
            p = g.preds[i, slot]
            if p >= 0:
                t = np.maximum(t, end[..., p] + lag[..., i, slot])
        start[..., i] = t
        end[..., i] = t + dur[..., i]
    return start, end


def on_path(g: StepGraph, start: np.ndarray, end: np.ndarray, lags: np.ndarray | None = None,
            launch: np.ndarray | None = None, present: np.ndarray | None = None) -> np.ndarray:
    """The replayed critical path of one variant (1-d start/end): walk back from the
    last-ending node through whichever input released each node."""
    lag = g.lags if lags is None else lags
    release = (g.launch_at + g.launch_lag) if launch is None else launch
    ends = end if present is None else np.where(present, end, -np.inf)
    path = np.zeros(g.size, dtype=bool)
    i = int(np.argmax(ends))
    while i >= 0 and not path[i]:
        path[i] = True
        nxt, best = -1, release[i]
        for slot in range(SLOTS):
            p = g.preds[i, slot]
            if p >= 0 and end[p] + lag[i, slot] >= best - 1e-6:
                nxt, best = int(p), end[p] + lag[i, slot]
        i = nxt
    return path


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
