"""Join GPU work to the CPU calls that launched it, and order each kernel by launch.

The join key is (globalPid, correlationId), never correlationId alone (METRICS.md): two
processes count correlation ids independently. A graph replay's kernels all share the
`cudaGraphLaunch` correlation id.
"""

from __future__ import annotations

import polars as pl

from k3trace.ingest import Trace
from k3trace.model.frames import looked_up

#: Runtime/driver calls that put GPU work on a stream.
#: (HIP's equivalents too: torch.profiler traces from ROCm name them so.)
LAUNCH_CALL = r"^(cudaLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperativeKernel|cuLaunchKernel|cuLaunchKernelEx|cuLaunchCooperativeKernel|cudaGraphLaunch|cuGraphLaunch|hipLaunchKernel|hipExtLaunchKernel|hipModuleLaunchKernel|hipExtModuleLaunchKernel|hipLaunchCooperativeKernel|hipGraphLaunch)(_v\d+|_ptsz|_ptds|_spt)*$"
GRAPH_LAUNCH_CALL = r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"
CAPTURE_BEGIN_CALL = r"^(cudaStreamBeginCapture|cuStreamBeginCapture|hipStreamBeginCapture)"
CAPTURE_END_CALL = r"^(cudaStreamEndCapture|cuStreamEndCapture|hipStreamEndCapture)"


def kernels_with_launch(trace: Trace) -> pl.DataFrame:
    """Kernels (time-ordered, with `kernel_id`) plus the launching call's thread and time."""
    calls = trace.runtime.select(
        "global_pid", "correlation_id",
        pl.col("global_tid").alias("launch_tid"),
        pl.col("start").alias("launch_start"),
        pl.col("name").alias("launch_call"),
    ).unique(["global_pid", "correlation_id"], keep="first")
    return looked_up(trace.kernels.with_row_index("kernel_id"), calls, ["global_pid", "correlation_id"])


def captured_calls() -> pl.Expr:
    """True for calls made on a thread between stream-capture begin and end: they are
    recorded into a graph, not executed, so they never get GPU records of their own."""
    marks = (
        pl.when(pl.col("name").str.contains(CAPTURE_BEGIN_CALL)).then(1)
        .when(pl.col("name").str.contains(CAPTURE_END_CALL)).then(-1)
        .otherwise(0)
    )
    depth = marks.cum_sum().over("global_tid", order_by="start")
    return (depth > 0) & (marks == 0)


def capture_nodes(trace: Trace) -> pl.DataFrame:
    """Exec-graph node -> the node created at capture time (following instantiation clones)
    with that creation event's time and thread: where the capture-time NVTX stack is read.

    nsys numbers graph nodes `graph << 32 | index` in creation order, so the captured
    node's id also gives the kernel's launch order within the graph.
    """
    events = trace.graph_nodes
    if events.is_empty():
        return pl.DataFrame(schema={"graph_node_id": pl.Int64, "capture_node_id": pl.Int64,
                                    "created_at": pl.Int64, "created_tid": pl.Int64})
    parent = events.filter(pl.col("original_graph_node_id").is_not_null()).select(
        "graph_node_id", pl.col("original_graph_node_id").alias("root")
    ).unique("graph_node_id")
    # Clones of clones: follow originals until a node has none (depth is 1-2 in practice).
    for _ in range(4):
        hop = parent.rename({"graph_node_id": "root", "root": "next"})
        parent = parent.join(hop, on="root", how="left").select(
            "graph_node_id", pl.coalesce("next", "root").alias("root")
        )
    created = events.filter(pl.col("original_graph_node_id").is_null()).select(
        pl.col("graph_node_id").alias("root"), pl.col("start").alias("created_at"),
        pl.col("global_tid").alias("created_tid"),
    ).unique("root", keep="first")
    return parent.join(created, on="root", how="left").rename({"root": "capture_node_id"})
