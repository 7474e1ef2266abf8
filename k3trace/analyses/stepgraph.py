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


@dataclass(frozen=True)
class StepGraph:
    """Nodes in topological (start) order; predecessor indices are -1 where absent."""

    nodes: pl.DataFrame          # launch_rank, name, family, layer, stream_id, start, duration, binding, pdl
    stream_pred: np.ndarray      # int64 [n]
    join_pred: np.ndarray        # int64 [n]
    launch_at: np.ndarray        # float64 [n]: CPU release relative to the step start (ns)
    stream_lag: np.ndarray       # float64 [n]: gap after the stream predecessor (0 unless binding)
    join_lag: np.ndarray         # float64 [n]
    launch_lag: np.ndarray       # float64 [n]
    duration: np.ndarray         # float64 [n]

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
    medians = timed.group_by("launch_rank").agg(
        pl.col("duration").median().alias("median_duration"), pl.col("lag").median().alias("median_lag")
    )
    rep = (
        timed.filter(pl.col("step") == rep_step)
        .join(medians, on="launch_rank", how="left")
        .sort("start", "end")
        .with_row_index("idx")
    )
    index_of = dict(zip(rep["kernel_id"].to_list(), rep["idx"].to_list()))

    def indices(col: str) -> np.ndarray:
        return np.array([index_of.get(v, -1) if v is not None else -1 for v in rep[col].to_list()], dtype=np.int64)

    binding = rep["binding"].to_numpy()
    lag = rep["median_lag"].fill_null(0).to_numpy().astype(np.float64)
    # Missing launch records (a lost runtime row): treat the node as released at step start.
    launch_at = (rep["launch_release"] - rep["step_start"]).fill_null(0).to_numpy().astype(np.float64)
    nodes = rep.select("launch_rank", "name", "family", "layer", "stream_id",
                       (pl.col("start") - pl.col("step_start")).alias("start"),
                       pl.col("median_duration").alias("duration"), "binding", "pdl")
    return StepGraph(
        nodes=nodes,
        stream_pred=indices("stream_pred"),
        join_pred=indices("join_pred"),
        launch_at=launch_at,
        stream_lag=np.where(binding == STREAM, lag, 0.0),
        join_lag=np.where(binding == JOIN, lag, 0.0),
        launch_lag=np.where(binding == LAUNCH, lag, 0.0),
        duration=rep["median_duration"].to_numpy().astype(np.float64),
    )


def replay(g: StepGraph, duration: np.ndarray | None = None, stream_lag: np.ndarray | None = None,
           join_lag: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every node, for one or many variants at once.

    Arrays may carry a leading batch axis ([variants, n]); the pass is sequential over
    nodes (topological order) and vectorised over variants.
    """
    dur = g.duration if duration is None else duration
    s_lag = g.stream_lag if stream_lag is None else stream_lag
    j_lag = g.join_lag if join_lag is None else join_lag
    batch = np.broadcast(dur, s_lag, j_lag).shape[:-1]
    dur = np.broadcast_to(dur, (*batch, g.size))
    s_lag = np.broadcast_to(s_lag, (*batch, g.size))
    j_lag = np.broadcast_to(j_lag, (*batch, g.size))
    start = np.zeros((*batch, g.size))
    end = np.zeros((*batch, g.size))
    launch = g.launch_at + g.launch_lag
    for i in range(g.size):
        t = np.full(batch, launch[i])
        sp, jp = g.stream_pred[i], g.join_pred[i]
        if sp >= 0:
            t = np.maximum(t, end[..., sp] + s_lag[..., i])
        if jp >= 0:
            t = np.maximum(t, end[..., jp] + j_lag[..., i])
        start[..., i] = t
        end[..., i] = t + dur[..., i]
    return start, end


def span(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    return end.max(axis=-1) - start.min(axis=-1)


def slack(g: StepGraph) -> np.ndarray:
    """How much longer each node could run without lengthening the replayed span (ns)."""
    start, end = replay(g)
    finish = end.max()
    latest_end = np.full(g.size, finish)
    for i in range(g.size - 1, -1, -1):
        latest_start = latest_end[i] - g.duration[i]
        sp, jp = g.stream_pred[i], g.join_pred[i]
        if sp >= 0:
            latest_end[sp] = min(latest_end[sp], latest_start - g.stream_lag[i])
        if jp >= 0:
            latest_end[jp] = min(latest_end[jp], latest_start - g.join_lag[i])
    return np.maximum(latest_end - end, 0.0)
