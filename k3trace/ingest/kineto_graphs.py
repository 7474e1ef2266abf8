"""Graph-node ids for Kineto's CUDA/HIP-graph replays, and the capture's node-creation events.

Kineto (torch 2.11) records a replay as one `cudaGraphLaunch` (`hipGraphLaunch`) call and one
kernel event per node, all carrying the launch's correlation id, but no graph-node id. When
the capture is in the trace, its kernel launches are there too: runtime/driver launch
calls between `*StreamBeginCapture` and `*StreamEndCapture` on one thread, with no kernel of
their own. Each replay is aligned with them stream by stream: a replay runs every stream's
kernels in that stream's capture order, so walking the launches in call order and taking,
each time, the stream whose next kernel started first (on HIP, among the streams whose next
kernel has the launched kernel's name) pairs every kernel with the launch that created its
node. Then the nsys shape is rebuilt: a capture graph `2g+1` whose nodes are created at
their launch calls (where the capture-time annotation stack is read), an exec graph `2g+2`
whose nodes clone them at instantiation, and the replay kernels on the exec nodes, so
labels, launch order and step signatures downstream work as they do for nsys.

Without a matching capture, node ids still come out stable across replays: replays are
grouped into graphs by their per-stream kernel-name sequences, and a node is a (stream,
position on that stream) numbered in the first replay's start order.
"""

from __future__ import annotations

from collections import deque

import polars as pl

GRAPH_LAUNCH = r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"
KERNEL_LAUNCH = r"^(cuda|cu|hip)(Ext)?(Module)?Launch(Cooperative)?Kernel(Ex|ExC)?(_v\d+|_ptsz|_ptds|_spt)*$"
CAPTURE_BEGIN = r"^(cuda|cu|hip)StreamBeginCapture"
CAPTURE_END = r"^(cuda|cu|hip)StreamEndCapture"
INSTANTIATE = r"^(cuda|cu|hip)GraphInstantiate"
DRIVER_LAUNCH = r"^cu[A-Z]"
NODE_CREATED = "Graph Node Creation"

#: A node id made here is `graph << NODE_BITS | index of the node in its graph`.
NODE_BITS = 32


def _node_frame() -> pl.DataFrame:
    return pl.DataFrame(schema={"start": pl.Int64, "global_tid": pl.Int64, "graph_node_id": pl.Int64,
                                "original_graph_node_id": pl.Int64, "event": pl.String, "kernel": pl.String})


def captures(runtime: pl.DataFrame, kernels: pl.DataFrame, launch_names: pl.DataFrame) -> list[dict]:
    """Each capture in the trace: its thread, launch calls in call order (with the kernel
    name where the runtime recorded it) and when the graph was instantiated."""
    marks = (
        pl.when(pl.col("name").str.contains(CAPTURE_BEGIN)).then(1)
        .when(pl.col("name").str.contains(CAPTURE_END)).then(-1).otherwise(0)
    )
    calls = runtime.sort("start").with_columns(marks.alias("mark")).with_columns(
        pl.col("mark").cum_sum().over("global_tid").alias("depth"),
        (pl.col("mark") == 1).cum_sum().over("global_tid").alias("capture"),
    )
    if calls.filter(pl.col("mark") == 1).is_empty():
        return []
    ran = kernels.select("global_pid", "correlation_id").unique()
    inside = calls.filter(pl.col("depth") > 0, pl.col("mark") == 0, pl.col("name").str.contains(KERNEL_LAUNCH))
    inside = inside.join(ran, on=["global_pid", "correlation_id"], how="anti")
    inside = _drop_nested_driver_calls(inside).join(
        launch_names.unique(["global_tid", "correlation_id"]), on=["global_tid", "correlation_id"], how="left")
    ends = calls.filter(pl.col("mark") == -1).select("global_tid", "capture", pl.col("start").alias("ended"))
    inst = calls.filter(pl.col("name").str.contains(INSTANTIATE)).select("global_tid", pl.col("start").alias("at"))
    out = []
    for (tid, number), group in inside.group_by("global_tid", "capture", maintain_order=True):
        ended = ends.filter(pl.col("global_tid") == tid, pl.col("capture") == number)["ended"]
        end_at = int(ended[0]) if len(ended) else int(group["end"].max())
        later = inst.filter(pl.col("global_tid") == tid, pl.col("at") >= end_at)["at"]
        out.append({
            "tid": int(tid), "begin": int(group["start"].min()), "instantiated": int(later.min()) if len(later) else end_at,
            "launch_start": group["start"].to_list(), "launched": group["launched"].to_list(),
        })
    return out


def _drop_nested_driver_calls(calls: pl.DataFrame) -> pl.DataFrame:
    """A driver launch made inside a runtime launch on the same thread is the same launch."""
    driver = pl.col("name").str.contains(DRIVER_LAUNCH)
    outer = calls.filter(~driver).select("global_tid", pl.col("start").alias("outer_start"),
                                         pl.col("end").alias("outer_end")).sort("outer_start")
    inner = calls.filter(driver).sort("start")
    if inner.is_empty() or outer.is_empty():
        return calls
    nested = inner.join_asof(outer, left_on="start", right_on="outer_start", by="global_tid",
                             strategy="backward", check_sortedness=False).filter(
        pl.col("start") <= pl.col("outer_end")).select("global_tid", "correlation_id")
    return calls.join(nested, on=["global_tid", "correlation_id"], how="anti").sort("start")


def _replays(kernels: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    """Kernels of graph replays with `graph` (by per-stream name sequences), `replay` and
    `pos` (their place on their stream within the replay)."""
    launches = runtime.filter(pl.col("name").str.contains(GRAPH_LAUNCH)).select("global_pid", "correlation_id").unique()
    replay = kernels.join(launches, on=["global_pid", "correlation_id"], how="semi")
    if replay.is_empty():
        return replay
    replay = replay.sort("start", "stream_id").with_columns(
        pl.int_range(pl.len()).over("global_pid", "correlation_id", "stream_id").alias("pos"))
    # Names as their categorical codes: a replay's sequence stays a short string.
    per_stream = replay.group_by("global_pid", "correlation_id", "stream_id").agg(
        pl.col("full_name").cast(pl.Categorical).to_physical().cast(pl.String).str.join(",").alias("names"))
    shape = per_stream.sort("stream_id").group_by("global_pid", "correlation_id").agg(
        pl.concat_str([pl.col("stream_id").cast(pl.String), pl.col("names")], separator="\x1e").str.join("\x1d")
        .hash().alias("shape"))
    first = replay.group_by("global_pid", "correlation_id").agg(pl.col("start").min().alias("first"))
    shape = shape.join(first, on=["global_pid", "correlation_id"]).sort("first")
    graphs = shape.group_by("shape", maintain_order=True).agg(pl.col("first").min()).with_row_index("graph")
    shape = shape.join(graphs.select("shape", "graph"), on="shape").with_columns(
        pl.col("graph").cast(pl.Int64),
        pl.col("first").rank("ordinal").over("graph").alias("replay_of_graph"),
    )
    return replay.join(shape.select("global_pid", "correlation_id", "graph", "replay_of_graph", "first"),
                       on=["global_pid", "correlation_id"])


def _align(rep: pl.DataFrame, launched: list[str | None]) -> list[int] | None:
    """Capture-launch index of each kernel of one replay (rows in start order), or None
    when the launches cannot be paired with the kernels."""
    if len(launched) != rep.height:
        return None
    queues: dict[int, deque] = {}
    for row, (stream, start, name) in enumerate(
            rep.select("stream_id", "start", pl.col("full_name").cast(pl.String)).iter_rows()):
        queues.setdefault(stream, deque()).append((row, start, name))
    order = [0] * rep.height
    for index, name in enumerate(launched):
        best = None
        for stream, queue in queues.items():
            if queue and (name is None or queue[0][2] == name) and (best is None or queue[0][1] < queues[best][0][1]):
                best = stream
        if best is None:
            return None
        row = queues[best].popleft()[0]
        order[row] = index
    return order


def derive(kernels: pl.DataFrame, runtime: pl.DataFrame,
           launch_names: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`kernels` with graph_node_id and graph_id set on replay kernels; the graph_nodes frame."""
    kernels = kernels.with_row_index("_row")
    replay = _replays(kernels, runtime)
    caps = captures(runtime, kernels, launch_names)
    if replay.is_empty():  # captures without replays (a capture-only trace) still show their nodes
        events = [_creation_events(cap, 2 * i + 1, None) for i, cap in enumerate(caps)]
        return kernels.drop("_row").with_columns(pl.lit(None, dtype=pl.Int64).alias("graph_node_id"),
                                                 pl.lit(None, dtype=pl.Int64).alias("graph_id")), \
            pl.concat([_node_frame(), *events])
    used: set[int] = set()
    maps, events = [], [_node_frame()]
    for graph in sorted(set(replay["graph"].to_list())):
        rep = replay.filter(pl.col("graph") == graph, pl.col("replay_of_graph") == 1).sort("start", "stream_id")
        exec_graph, capture_graph = 2 * graph + 2, 2 * graph + 1
        order, cap = None, None
        # The capture that made this graph: the latest one before its first replay that pairs up.
        for i in sorted(range(len(caps)), key=lambda i: caps[i]["begin"], reverse=True):
            if i in used or caps[i]["begin"] > int(rep["start"].min()):
                continue
            order = _align(rep, caps[i]["launched"])
            if order is not None:
                cap = caps[i]
                used.add(i)
                break
        if order is None:
            order = list(range(rep.height))   # start order: stable across replays, not capture order
        maps.append(rep.select("stream_id", "pos").with_columns(
            pl.lit(graph, dtype=pl.Int64).alias("graph"),
            (pl.lit(exec_graph << NODE_BITS, dtype=pl.Int64) + pl.Series(order, dtype=pl.Int64)).alias("graph_node_id"),
        ))
        if cap is not None:
            events.append(_creation_events(cap, capture_graph, exec_graph))
    for j, i in enumerate(i for i in range(len(caps)) if i not in used):  # captures never replayed here
        events.append(_creation_events(caps[i], 2 * (replay["graph"].max() + 1 + j) + 1, None))
    nodes = replay.select("_row", "stream_id", "pos", "graph").join(
        pl.concat(maps), on=["graph", "stream_id", "pos"], how="left")
    out = kernels.join(nodes.select("_row", "graph_node_id", (pl.col("graph") * 2 + 2).alias("graph_id")),
                       on="_row", how="left").sort("_row").drop("_row")
    return out, pl.concat(events)


def _creation_events(cap: dict, capture_graph: int, exec_graph: int | None) -> pl.DataFrame:
    n = len(cap["launch_start"])
    created = pl.DataFrame({
        "start": pl.Series(cap["launch_start"], dtype=pl.Int64),
        "global_tid": pl.Series([cap["tid"]] * n, dtype=pl.Int64),
        "graph_node_id": pl.Series([(capture_graph << NODE_BITS) + i for i in range(n)], dtype=pl.Int64),
        "original_graph_node_id": pl.Series([None] * n, dtype=pl.Int64),
        "event": pl.Series([NODE_CREATED] * n, dtype=pl.String),
        "kernel": pl.Series(cap["launched"], dtype=pl.String),   # the full name; kineto.py shortens it
    })
    if exec_graph is None:
        return created
    cloned = pl.DataFrame({
        "start": pl.Series([cap["instantiated"]] * n, dtype=pl.Int64),
        "global_tid": pl.Series([cap["tid"]] * n, dtype=pl.Int64),
        "graph_node_id": pl.Series([(exec_graph << NODE_BITS) + i for i in range(n)], dtype=pl.Int64),
        "original_graph_node_id": created["graph_node_id"],
        "event": pl.Series([NODE_CREATED] * n, dtype=pl.String),
        "kernel": created["kernel"],
    })
    return pl.concat([created, cloned])
