"""A label donor from a graph capture alone (`--labels-from` a report with no decode step).

Engines capture their decode graphs at startup, and a profile of the startup holds the
capture but no replay: no step to lend, yet every node was created inside the ranges that
label it (layer NVTX, or torch.profiler's module stack). Where the capture's launch calls
name their kernels (torch.profiler on HIP), its nodes in creation order are a labelled
kernel sequence: the donor a later profile's replays are aligned with (donor.py). With
several captures (one per batch size), the one with the most labelled nodes lends.
"""

from __future__ import annotations

import polars as pl

from k3trace.config import Config
from k3trace.ingest import Trace
from k3trace.ingest.kineto_graphs import NODE_BITS
from k3trace.ingest.schema import global_pid
from k3trace.model.labels import modules, own
from k3trace.model.labels.donor import LabelDonor
from k3trace.model.labels.ranges import innermost


def capture_donor(trace: Trace, cfg: Config) -> LabelDonor | None:
    """The donor of the trace's best-labelled capture, or None when no capture names its
    kernels or no node of it is labelled."""
    created = trace.graph_nodes.filter(pl.col("original_graph_node_id").is_null(), pl.col("kernel").is_not_null())
    if created.is_empty():
        return None
    nodes = created.select("graph_node_id", pl.col("kernel").alias("name"), pl.col("global_tid").alias("tid"),
                           pl.col("start").alias("at"), (pl.col("graph_node_id") // (1 << NODE_BITS)).alias("graph"),
                           global_pid(pl.col("global_tid")).alias("pid"))
    best = None
    for (graph, pid), part in nodes.group_by("graph", "pid", maintain_order=True):
        labelled = _labelled(part.sort("at"), trace, cfg, int(pid))
        count = int(labelled["layer"].is_not_null().sum())
        if count and (best is None or count >= best[0]):
            best = (count, labelled)
    if best is None:
        return None
    return LabelDonor(report=trace.source, kernels=best[1].select("name", "layer", "family"))


def _labelled(nodes: pl.DataFrame, trace: Trace, cfg: Config, pid: int) -> pl.DataFrame:
    """`nodes` (creation order) with layer and family: k3trace's own layer ranges first, then
    module ranges, as the label chain reads them at a node's creation."""
    found = [innermost(nodes, own.layer_ranges(trace, cfg, pid), "graph_node_id", ["layer", "family"])]
    ranges = modules.module_ranges(trace, cfg, pid)
    by_module = innermost(nodes, ranges, "graph_node_id", ["layer", "child"])
    if not by_module.is_empty():
        named = by_module.join(nodes.select("graph_node_id", "name"), on="graph_node_id")
        found.append(modules.resolve_families(named, ranges, cfg).select(found[0].columns))
    # The first source that labels a node keeps it (the chain's order).
    first = pl.concat(found).unique("graph_node_id", keep="first", maintain_order=True)
    return nodes.join(first, on="graph_node_id", how="left").sort("at")
