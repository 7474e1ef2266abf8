"""Decode steps: from graph replays, from NVTX step ranges, or from the period of the
repeating kernel sequence, in that order of preference (METRICS.md, "Decode step").

Every kernel gets `step` (null outside any step), `eager_step` (the NVTX step range an
eager launch sat in: the annotated eager step labels graph replays by alignment) and
`launch_rank` (its position in launch order inside the step: capture order for graph
replays, call order for eager launches, start order when neither is known).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from k3trace.config import Config
from k3trace.errors import NoDecodeSteps, ReportError
from k3trace.ingest import Trace
from k3trace.model.frames import looked_up
from k3trace.model.launches import capture_nodes, kernels_with_launch

GRAPH, NVTX, PERIOD, PIECEWISE = "graph", "nvtx", "period", "piecewise"
#: A replay's graph: its nodes' ids carry it above the low 32 bits (nsys and the Kineto reader alike).
_GRAPH_OF_REPLAY = pl.col("graph_node_id").min() // (1 << 32)


@dataclass(frozen=True)
class StepAssignment:
    source: str                # graph | nvtx | period
    kernels: pl.DataFrame      # every kernel of the analysed process and device
    steps: pl.DataFrame        # step, first_start, last_end, kernels, signature
    lane: tuple[int, int]      # (global_pid, device_id) analysed
    other_lanes: int           # processes/devices with GPU work that were not analysed
    range_form: str | None = None   # the most common step-range text matched, digits as N
    range_forms: tuple[tuple[str, int], ...] = ()   # every form matched, with its count
    range_count: int = 0            # step ranges matched on the analysed process
    # Graph replays as steps with no step range, and attention kernels launched eagerly
    # outside them: likely pieces of a step (piecewise graphs), which only ranges can join.
    loose_attention: int = 0
    pieces: float = 0.0             # piecewise: median graph replays in a step range


def _dominant_lane(kernels: pl.DataFrame) -> tuple[tuple[int, int], int]:
    pid, device = kernels["global_pid"], kernels["device_id"]
    # One process on one device (the usual case): read off the columns' ends, no grouping.
    if (kernels.height and not pid.null_count() and not device.null_count()
            and pid.min() == pid.max() and device.min() == device.max()):
        return (int(pid[0]), int(device[0])), 0
    lanes = kernels.group_by("global_pid", "device_id").len().sort("len", "global_pid", descending=[True, False])
    if lanes.is_empty():
        raise ReportError("the report holds no kernel records",
                          "record GPU work with `nsys profile -t cuda,nvtx --cuda-graph-trace=node`")
    return (int(lanes["global_pid"][0]), int(lanes["device_id"][0])), lanes.height - 1


#: Step ranges of prefill alone (vLLM's with no generation, SGLang's EXTEND and PREFILL
#: batches). Where the kernels sit in these and no decode step is found, the report holds
#: no decode: the period of its kernel sequence would be a layer's, not a step's.
PREFILL_RANGES = r"execute_(\d+_)?context_[1-9]\d*.*_generation_0\b|step\[(EXTEND|PREFILL)[^\]]*\]"


def step_ranges(trace: Trace, cfg: Config, pid: int, pattern: str | None = None) -> pl.DataFrame:
    """NVTX ranges matching the step pattern (or `pattern`) on the analysed process, in time order."""
    return (
        trace.nvtx.filter(
            pl.col("global_pid") == pid, pl.col("end").is_not_null(),
            pl.col("text").str.contains(pattern or cfg.step_nvtx_pattern),
        )
        .sort("start")
        .select(pl.int_range(pl.len(), dtype=pl.Int64).alias("range_index"),
                pl.col("start").alias("range_start"), pl.col("end").alias("range_end"),
                pl.col("global_tid").alias("launch_tid"), "text")
    )


def range_forms(ranges: pl.DataFrame) -> tuple[tuple[str, int], ...]:
    """Which step-range forms matched, most common first: the range texts with their numbers
    as N (`execute_context_N(N)_generation_N(N)`, `[Executor] _forward_step N: ...`)."""
    forms = ranges.select(pl.col("text").str.replace_all(r"\d+", "N").alias("form")).group_by("form").len()
    return tuple((str(f), int(n)) for f, n in forms.sort("len", "form", descending=[True, False]).iter_rows())


def _in_ranges(kernels: pl.DataFrame, ranges: pl.DataFrame) -> pl.Series:
    """For each kernel, the index of the step range its launch call sits in (or null)."""
    keyed = kernels.select("kernel_id", "launch_tid", "launch_start").filter(pl.col("launch_start").is_not_null())
    if ranges.is_empty() or keyed.is_empty():
        return pl.Series("range_index", [None] * kernels.height, dtype=pl.Int64)
    hit = (
        keyed.sort("launch_start")
        .join_asof(ranges.sort("range_start"), left_on="launch_start", right_on="range_start",
                   by="launch_tid", strategy="backward", check_sortedness=False)
        .filter(pl.col("launch_start") <= pl.col("range_end"))
        .select("kernel_id", "range_index")
    )
    return kernels.select("kernel_id").join(hit, on="kernel_id", how="left").sort("kernel_id")["range_index"]


def assign_steps(trace: Trace, cfg: Config) -> StepAssignment:
    all_kernels = kernels_with_launch(trace)
    lane, others = _dominant_lane(all_kernels)
    # One lane (the usual case) is the whole frame: filtering would copy it.
    kernels = all_kernels if not others else all_kernels.filter(pl.col("global_pid") == lane[0],
                                                                pl.col("device_id") == lane[1])
    kernels = looked_up(kernels, capture_nodes(trace), "graph_node_id")
    ranges = step_ranges(trace, cfg, lane[0])
    # Only eager launches sit in a step range on their own (a replay's kernels share the
    # graph launch): look up just those, then join back.
    eager_kernels = kernels.select("kernel_id", "launch_tid", "launch_start", "graph_node_id").filter(
        pl.col("graph_node_id").is_null())
    in_range = eager_kernels.select("kernel_id").with_columns(_in_ranges(eager_kernels, ranges).alias("eager_step"))
    kernels = looked_up(kernels, in_range, "kernel_id")
    range_index = kernels["eager_step"]

    # The columns the step keys need, not the whole frame (peak memory: a copy of all).
    graph_kernels = kernels.select("correlation_id", "start", "graph_node_id").filter(
        pl.col("graph_node_id").is_not_null())
    pieces = pieces_per_range(kernels, ranges) if not graph_kernels.is_empty() else 0.0
    if pieces >= 2:
        # Piecewise CUDA graphs (vLLM's piecewise cudagraph mode): a step replays a graph per
        # piece of the model, with the attention launched eagerly between them. One replay
        # is a piece, not a step; the step range holds all of them, and every kernel, replayed
        # or eager, belongs to the range its launch sits in, in launch order.
        source = PIECEWISE
        every = _in_ranges(kernels.select("kernel_id", "launch_tid", "launch_start"), ranges)
        kernels = looked_up(kernels, pl.DataFrame({"kernel_id": kernels["kernel_id"].sort(), "step": every}),
                            "kernel_id").with_columns(
            pl.struct("launch_start", pl.coalesce("capture_node_id", "graph_node_id", pl.lit(0))).alias("order_key"))
        signature = None
    elif not graph_kernels.is_empty():
        source = GRAPH
        step_key = (
            graph_kernels.group_by("correlation_id")
            .agg(pl.col("start").min().alias("first_start"))
            .sort("first_start")
            .with_row_index("step")
            .select(pl.col("step").cast(pl.Int64), "correlation_id")
        )
        kernels = looked_up(kernels, step_key, "correlation_id").with_columns(
            pl.when(pl.col("graph_node_id").is_not_null()).then(pl.col("step")).alias("step"))
        # The captured node's id is its launch order in the graph (exec ids when no capture event).
        order = pl.coalesce("capture_node_id", "graph_node_id")
        kernels = kernels.with_columns(
            pl.when(pl.col("step").is_not_null()).then(order).otherwise(pl.col("launch_start")).alias("order_key")
        )
        signature = _GRAPH_OF_REPLAY.cast(pl.String)
    elif range_index.drop_nulls().len() > 0:
        source = NVTX
        kernels = kernels.with_columns(
            range_index.alias("step"), pl.col("launch_start").alias("order_key")
        )
        signature = None
    else:
        _refuse_prefill(trace, cfg, lane[0], eager_kernels)
        source = PERIOD
        kernels = kernels.with_columns(_period_steps(kernels).alias("step"), pl.col("start").alias("order_key"))
        signature = None

    kernels = (kernels if kernels["kernel_id"].is_sorted() else kernels.sort("kernel_id")).with_columns(
        pl.col("order_key").rank("ordinal").over("step").cast(pl.Int64).sub(1).alias("launch_rank")
    ).with_columns(
        pl.when(pl.col("step").is_null()).then(
            pl.col("launch_start").rank("ordinal").over("eager_step").cast(pl.Int64).sub(1)
        ).otherwise(pl.col("launch_rank")).alias("launch_rank")
    ).drop("order_key")

    steps = _step_table(kernels, signature)
    forms = range_forms(ranges)
    if steps.is_empty():
        captured = not trace.graph_nodes.is_empty()
        replays = "a graph capture but no replay of it" if captured else "no graph replays"
        raise NoDecodeSteps(
            f"{trace.source}: no decode steps found ({replays}, no NVTX ranges matching "
            f"{cfg.step_nvtx_pattern!r}, no repeating kernel sequence)",
            "record a decode loop of several steps, or set [steps] nvtx_pattern in a --config file"
            + ("; a profile of the capture alone can lend its labels to one of the replays (--labels-from)"
               if captured else ""),
        )
    loose = 0
    if source == GRAPH and ranges.is_empty():
        # Between the first replay's launch and the last one's: an eager warm-up before the
        # capture runs its attention eagerly too.
        launched = kernels.select("step", "graph_node_id", "launch_start", "name")
        first, last = (launched.filter(pl.col("graph_node_id").is_not_null())
                       .select(pl.col("launch_start").min().alias("first"), pl.col("launch_start").max().alias("last"))
                       .row(0))
        loose = (launched.filter(pl.col("step").is_null() & pl.col("graph_node_id").is_null()
                                 & pl.col("launch_start").is_between(first, last))
                 .filter(pl.col("name").str.contains(cfg.attention_pattern)).height)
    return StepAssignment(source=source, kernels=kernels, steps=steps, lane=lane, other_lanes=others,
                          range_form=forms[0][0] if forms else None, range_forms=forms, range_count=ranges.height,
                          loose_attention=loose, pieces=pieces if source == PIECEWISE else 0.0)


def _refuse_prefill(trace: Trace, cfg: Config, pid: int, eager_kernels: pl.DataFrame) -> None:
    """No decode step found, and most kernels were launched inside prefill step ranges."""
    prefill = step_ranges(trace, cfg, pid, PREFILL_RANGES)
    if prefill.is_empty():
        return
    inside = _in_ranges(eager_kernels, prefill).drop_nulls().len()
    if inside * 2 < eager_kernels.height:
        return
    n, text = prefill.height, prefill["text"][0]
    text = text if len(text) <= 80 else text[:77] + "..."
    raise NoDecodeSteps(
        f"{trace.source}: only prefill steps: {n} step range{'s' if n > 1 else ''} ({text!r}"
        f"{' ...' if n > 1 else ''}) hold {inside} of the {eager_kernels.height} kernels, and no decode step "
        "range or graph replay was found",
        "profile decode iterations, or set [steps] nvtx_pattern in a --config file to take these ranges as steps",
    )


def pieces_per_range(kernels: pl.DataFrame, ranges: pl.DataFrame) -> float:
    """Median graph replays per step range, over the ranges holding one, where those replays
    are of two or more graphs (0 otherwise). A replay's kernels share its launch: one row per
    replay, placed by that launch. One graph replayed again and again inside a range is a
    loop the range wraps (a user's range around the whole decode loop), not pieces of a step."""
    if ranges.is_empty():
        return 0.0
    launches = (kernels.filter(pl.col("graph_node_id").is_not_null())
                .group_by("correlation_id").agg(pl.col("kernel_id").min(), pl.col("launch_tid").first(),
                                                pl.col("launch_start").min(),
                                                _GRAPH_OF_REPLAY.alias("graph"))
                .sort("kernel_id"))
    per_range = (launches.with_columns(_in_ranges(launches, ranges).alias("range")).drop_nulls("range")
                 .group_by("range").agg(pl.len(), pl.col("graph").n_unique().alias("graphs")))
    if not per_range.height or per_range["graphs"].median() < 2:
        return 0.0
    return float(per_range["len"].median())


def _step_table(kernels: pl.DataFrame, signature: pl.Expr | None) -> pl.DataFrame:
    # Lazy, so that the filter carries only the columns the grouping reads (eager, it
    # gathered all two dozen of the kernels' columns).
    stepped = kernels.lazy().filter(pl.col("step").is_not_null())
    # Without graph ids a step's signature is its kernel-name sequence in launch order.
    sig = signature if signature is not None else (
        pl.col("name").sort_by("launch_rank").str.join("|").hash().cast(pl.String)
    )
    return (
        stepped.group_by("step")
        .agg(
            pl.col("start").min().alias("first_start"),
            pl.col("end").max().alias("last_end"),
            pl.len().alias("kernels"),
            sig.alias("signature"),
        )
        .sort("step")
        .collect()
    )


def _period_steps(kernels: pl.DataFrame) -> pl.Series:
    """Steps as periods of the repeating kernel-name sequence.

    Names that occur at a constant index distance vote for a base period p. A decode step
    can repeat its names inside itself (8 layers with MLA on 4 and 8 repeat every 4
    layers), so multiples of p compete: a step boundary is where the host hands over to the
    next step, so the winner is the period whose boundaries (at the best phase) show the
    longest idle gaps in their lower quartile, the smallest such period on a tie.
    """
    ordered = kernels.sort("start", "kernel_id")
    codes = ordered["name"].cast(pl.Categorical).to_physical().to_numpy()
    n = len(codes)
    none = pl.Series("step", [None] * kernels.height, dtype=pl.Int64)
    if n < 6:
        return none
    occ = pl.DataFrame({"code": codes, "pos": np.arange(n)}).with_columns(
        (pl.col("pos") - pl.col("pos").shift(1).over("code")).alias("gap")
    ).drop_nulls("gap")
    regular = (
        occ.group_by("code")
        .agg(pl.col("gap").mode().first().alias("period"), (pl.col("gap") == pl.col("gap").mode().first()).mean().alias("share"),
             pl.len().alias("count"))
        .filter(pl.col("count") >= 2, pl.col("share") >= 0.9, pl.col("period") > 1)
    )
    if regular.is_empty():
        return none
    base = int(regular.group_by("period").len().sort("len", "period", descending=[True, False])["period"][0])
    starts = ordered["start"].to_numpy()
    ends_cummax = np.maximum.accumulate(ordered["end"].to_numpy())
    idle = np.empty(n)
    idle[0] = 0
    idle[1:] = starts[1:] - ends_cummax[:-1]
    best: tuple[float, int, int] | None = None  # (score, period, phase)
    for period in (base * k for k in range(1, 9)):
        if n < 3 * period or (codes[period:] == codes[:-period]).mean() < 0.9:
            continue
        usable = (n // period) * period
        gaps = idle[:usable].reshape(-1, period)
        q25 = np.quantile(gaps, 0.25, axis=0)
        phase = int(np.argmax(q25))
        if best is None or q25[phase] > best[0] * 1.05:
            best = (float(q25[phase]), period, phase)
    if best is None:
        return none
    _, period, phase = best
    step = np.where(np.arange(n) >= phase, (np.arange(n) - phase) // period, -1)
    step_series = pl.Series("step", step, dtype=pl.Int64)
    by_kernel = pl.DataFrame({"kernel_id": ordered["kernel_id"], "step": step_series}).with_columns(
        pl.when(pl.col("step") >= 0).then(pl.col("step")).alias("step")
    )
    return kernels.select("kernel_id").join(by_kernel, on="kernel_id", how="left").sort("kernel_id")["step"]
