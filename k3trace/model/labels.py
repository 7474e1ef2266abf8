"""Layer and family labels from four sources, in order (METRICS.md, "Labels"):

1. `nvtx`: the layer range open on the launching thread when an eager kernel was launched;
2. `graph_capture`: for graph replays, the layer range open when the kernel's graph node
   was created during capture (exec node -> originalGraphNodeId -> creation event);
3. `aligned_eager`: the capture happened before the window opened, so its NVTX is not in
   the report: align the replay's kernel names (in capture order) with an annotated eager
   step of the same code and copy its labels, node by node;
4. `name_rule`: the config's kernel-name patterns (family only).
Kernels none of them labels are `unlabelled`.
"""

from __future__ import annotations

import difflib

import polars as pl

from k3trace.config import Config
from k3trace.ingest import Trace
from k3trace.model.steps import StepAssignment

NVTX_SOURCE, GRAPH_SOURCE, ALIGNED_SOURCE, RULE_SOURCE = "nvtx", "graph_capture", "aligned_eager", "name_rule"
UNLABELLED = "unlabelled"
SOURCES = (NVTX_SOURCE, GRAPH_SOURCE, ALIGNED_SOURCE, RULE_SOURCE, UNLABELLED)


def layer_ranges(trace: Trace, cfg: Config, pid: int) -> pl.DataFrame:
    ranges = trace.nvtx.filter(
        pl.col("global_pid") == pid, pl.col("end").is_not_null(), pl.col("text").str.contains(cfg.layer_pattern)
    )
    parts = pl.col("text").str.extract_groups(cfg.layer_pattern)
    return ranges.select(
        pl.col("global_tid").alias("tid"), pl.col("start").alias("range_start"), pl.col("end").alias("range_end"),
        parts.struct.field("index").cast(pl.Int64).alias("layer"), parts.struct.field("family").alias("family"),
    ).sort("range_start")


def _enclosing(points: pl.DataFrame, ranges: pl.DataFrame, tid: str, at: str) -> pl.DataFrame:
    """kernel_id -> (layer, family) of the layer range enclosing time `at` on thread `tid`.

    Layer ranges do not nest in each other (sub-op ranges inside them do not match the
    pattern), so the latest range starting at or before the point is the only candidate.
    """
    keyed = points.filter(pl.col(at).is_not_null()).select("kernel_id", pl.col(tid).alias("tid"), pl.col(at).alias("at"))
    if keyed.is_empty() or ranges.is_empty():
        return pl.DataFrame(schema={"kernel_id": points.schema["kernel_id"], "layer": pl.Int64, "family": pl.String})
    return (
        keyed.sort("at")
        .join_asof(ranges, left_on="at", right_on="range_start", by="tid", strategy="backward", check_sortedness=False)
        .filter(pl.col("at") <= pl.col("range_end"))
        .select("kernel_id", "layer", "family")
    )


def _aligned_eager(kernels: pl.DataFrame) -> pl.DataFrame:
    """graph_node_id -> (layer, family) copied from the best-aligned annotated eager step."""
    eager = kernels.filter(pl.col("graph_node_id").is_null(), pl.col("eager_step").is_not_null())
    replays = kernels.filter(pl.col("graph_node_id").is_not_null(), pl.col("step").is_not_null())
    empty = pl.DataFrame(schema={"graph_node_id": pl.Int64, "layer": pl.Int64, "family": pl.String})
    if eager.is_empty() or replays.is_empty() or eager["layer"].is_null().all():
        return empty
    candidates = [g.sort("launch_rank") for _, g in eager.group_by("eager_step", maintain_order=True)]
    mappings = [empty]
    # One representative replay per graph: node ids repeat in every replay of that graph.
    replays = replays.with_columns((pl.col("graph_node_id") // (1 << 32)).alias("graph"))
    for _, graph in replays.group_by("graph"):
        per_step = graph.group_by("step").len().sort("len", "step", descending=[True, False])
        rep = graph.filter(pl.col("step") == per_step["step"][0]).sort("launch_rank")
        names = rep["name"].to_list()
        best, best_score = None, 0.0
        for cand in candidates:
            matcher = difflib.SequenceMatcher(a=names, b=cand["name"].to_list(), autojunk=False)
            score = matcher.ratio()
            if score > best_score:
                best, best_score = (matcher, cand), score
        if best is None or best_score < 0.5:
            continue
        matcher, cand = best
        pairs = [(i + k, j + k) for i, j, n in matcher.get_matching_blocks() for k in range(n)]
        if not pairs:
            continue
        ri, ci = zip(*pairs)
        mappings.append(pl.DataFrame({
            "graph_node_id": rep["graph_node_id"].gather(list(ri)),
            "layer": cand["layer"].gather(list(ci)),
            "family": cand["family"].gather(list(ci)),
        }).filter(pl.col("family").is_not_null()))
    return pl.concat(mappings)


def _name_rules(names: pl.Expr, cfg: Config) -> pl.Expr:
    expr = pl.lit(None, dtype=pl.String)
    for rule in reversed(cfg.name_rules):  # first matching rule wins
        expr = pl.when(names.str.contains(rule.pattern)).then(pl.lit(rule.family)).otherwise(expr)
    return expr


def label_kernels(trace: Trace, assignment: StepAssignment, cfg: Config) -> pl.DataFrame:
    """The step assignment's kernels with `layer`, `family`, `label_source`."""
    kernels = assignment.kernels
    ranges = layer_ranges(trace, cfg, assignment.lane[0])
    # Source 1 is about eager launches; a replay's kernels share one graph launch.
    by_launch = _enclosing(kernels.filter(pl.col("graph_node_id").is_null()), ranges, "launch_tid",
                           "launch_start").rename({"layer": "l1", "family": "f1"})
    # Source 2 once per graph node (every replay repeats the same nodes), then joined back.
    nodes = (
        kernels.filter(pl.col("graph_node_id").is_not_null())
        .unique("graph_node_id")
        .select(pl.col("graph_node_id").alias("kernel_id"), "created_tid", "created_at")
    )
    by_node = _enclosing(nodes, ranges, "created_tid", "created_at").rename(
        {"kernel_id": "graph_node_id", "layer": "l2", "family": "f2"})
    out = (
        kernels.join(by_launch, on="kernel_id", how="left")
        .join(by_node, on="graph_node_id", how="left")
        .with_columns(
            pl.coalesce("l1", "l2").alias("layer"), pl.coalesce("f1", "f2").alias("family"),
            pl.when(pl.col("f1").is_not_null()).then(pl.lit(NVTX_SOURCE))
            .when(pl.col("f2").is_not_null()).then(pl.lit(GRAPH_SOURCE)).alias("label_source"),
        )
        .drop("l1", "f1", "l2", "f2")
    )
    if out.filter(pl.col("graph_node_id").is_not_null(), pl.col("family").is_null()).height:
        aligned = _aligned_eager(out).rename({"layer": "l3", "family": "f3"}).unique("graph_node_id")
        out = out.join(aligned, on="graph_node_id", how="left").with_columns(
            pl.when(pl.col("family").is_null() & pl.col("f3").is_not_null()).then(pl.lit(ALIGNED_SOURCE))
            .otherwise(pl.col("label_source")).alias("label_source"),
            pl.coalesce("layer", "l3").alias("layer"), pl.coalesce("family", "f3").alias("family"),
        ).drop("l3", "f3")
    rule = _name_rules(pl.col("name"), cfg)
    out = out.with_columns(
        pl.when(pl.col("family").is_null() & rule.is_not_null()).then(pl.lit(RULE_SOURCE))
        .otherwise(pl.col("label_source")).alias("label_source"),
        pl.coalesce("family", rule).alias("family"),
    ).with_columns(
        pl.col("label_source").fill_null(UNLABELLED),
        pl.col("family").fill_null(UNLABELLED),
    )
    return with_segments(out.sort("kernel_id"))


def with_segments(kernels: pl.DataFrame) -> pl.DataFrame:
    """`segment`: an id of the contiguous run of one (layer, family) in launch order within
    a step (or an eager step); a new segment starts whenever the pair changes. Ids are
    unique across the trace (counted per step where needed), not restarted per step."""
    group = pl.coalesce(pl.col("step"), -1 - pl.col("eager_step")).alias("seg_group")
    ordered = kernels.with_columns(group).sort("seg_group", "launch_rank")
    changed = (
        (pl.col("seg_group") != pl.col("seg_group").shift(1))
        | (pl.col("layer").fill_null(-1) != pl.col("layer").fill_null(-1).shift(1))
        | (pl.col("family") != pl.col("family").shift(1))
    ).fill_null(True)
    return (
        ordered.with_columns(changed.cast(pl.Int64).cum_sum().sub(1).alias("segment"))
        .drop("seg_group")
        .sort("kernel_id")
    )


def source_counts(kernels: pl.DataFrame) -> dict[str, int]:
    counts = dict(kernels.group_by("label_source").len().iter_rows())
    return {source: int(counts.get(source, 0)) for source in SOURCES}
