"""Join GPU work to the CPU calls that launched it, and order each kernel by launch.

The join key is (globalPid, correlationId), never correlationId alone (METRICS.md): two
processes count correlation ids independently. A graph replay's kernels all share the
`cudaGraphLaunch` correlation id.
"""

from __future__ import annotations

import numpy as np
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
    kernels = trace.kernels.with_row_index("kernel_id")
    calls = trace.runtime.select(
        "global_pid", "correlation_id",
        pl.col("global_tid").alias("launch_tid"),
        pl.col("start").alias("launch_start"),
    )  # (not the call's name: nothing reads it, and its text cost a gather per kernel)
    keyed = _call_keys(kernels, calls)
    if keyed is None:
        return looked_up(kernels, calls.unique(_CALL, keep="first"), _CALL)
    kernel_key, call_key = keyed
    # A call whose key is null launches nothing (no kernel's key is null).
    calls = calls.with_columns(call_key).drop(_CALL).drop_nulls("_call").unique("_call", keep="first")
    return kernels.with_columns(kernels.select(kernel_key).join(calls, on="_call", how="left").drop("_call"))


_CALL = ["global_pid", "correlation_id"]


def _call_keys(kernels: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.Series, pl.Series] | None:
    """(process, correlation id) as one integer per kernel and per call, `_call`: the
    process by its rank among the few processes, the id in the low 32 bits. A join on one
    integer costs half the two columns' (their rows hashed as pairs: 300 ms at 2.2M
    kernels). None where a kernel's key is null or an id is past 32 bits (a damaged export)."""
    if any(kernels[c].null_count() for c in _CALL):
        return None
    ids = pl.concat([kernels["correlation_id"], calls["correlation_id"]])
    low, high = ids.min(), ids.max()
    if low is not None and not (low >= 0 and high < 1 << 32):
        return None
    processes = pl.concat([kernels["global_pid"], calls["global_pid"]]).drop_nulls().unique().sort().to_numpy()

    def key(frame: pl.DataFrame) -> pl.Series:
        pid, corr = frame["global_pid"], frame["correlation_id"]
        rank = np.searchsorted(processes, pid.fill_null(0).to_numpy())
        value = pl.Series("_call", rank.astype(np.int64) << 32) + corr
        return value if not pid.null_count() else pl.select(pl.when(pid.is_not_null()).then(value)).to_series()
    return key(kernels), key(calls)


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
