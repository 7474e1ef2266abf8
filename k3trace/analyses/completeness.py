"""Is the capture complete? An incomplete trace is reported, never silently analysed.

Three findings (issue: nsys 2023.4.4 on CUDA 13 dropped most records of an eager decode
without any diagnostic, ../shared/gpu/README.md):
- steps of the dominant signature holding fewer kernels than the dominant step;
- launch calls with no GPU record (calls made during stream capture excluded: they are
  recorded into a graph, not executed);
- step or layer NVTX ranges, and long stretches inside step ranges, with no CUDA record.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

import k3names
from k3trace.config import Config
from k3trace.ingest import Trace
from k3trace.model.launches import GRAPH_LAUNCH_CALL, LAUNCH_CALL, captured_calls


@dataclass(frozen=True)
class Completeness:
    ok: bool
    problems: tuple[str, ...]
    missing_launches: int
    incomplete_steps: int
    silent_ranges: int


def _where(steps: pl.Series, limit: int = 5) -> str:
    shown = ", ".join(str(s) for s in steps.head(limit).to_list())
    return shown + (f" and {steps.len() - limit} more" if steps.len() > limit else "")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def incomplete_steps(steps: pl.DataFrame, cfg: Config) -> tuple[int, list[str]]:
    short = steps.filter(pl.col("dominant"), pl.col("kernels") < pl.col("kernels_expected"))
    if short.is_empty():
        return 0, []
    expected = int(short["kernels_expected"][0])
    fraction = short.filter(pl.col("kernels") < cfg.min_kernel_fraction * pl.col("kernels_expected"))
    lost = int((short["kernels_expected"] - short["kernels"]).sum())
    problem = (
        f"{short.height} of {steps.filter(pl.col('dominant')).height} steps hold fewer kernels than the dominant "
        f"step ({int(short['kernels'].min())} to {int(short['kernels'].max())} of {expected}; "
        f"{fraction.height} below {cfg.min_kernel_fraction:.0%}): {lost} kernel records missing, in steps {_where(short['step'])}"
    )
    return short.height, [problem]


def missing_launches(trace: Trace, pid: int) -> tuple[int, list[str]]:
    calls = trace.runtime.filter(pl.col("global_pid") == pid).with_columns(captured_calls().alias("captured"))
    launches = calls.filter(pl.col("name").str.contains(LAUNCH_CALL), ~pl.col("captured"), pl.col("return_value") == 0)
    if launches.is_empty():
        return 0, []
    done = trace.kernels.filter(pl.col("global_pid") == pid).select("correlation_id").unique()
    last_gpu = trace.kernels["end"].max()
    # A launch after the last GPU record may have run after the window closed: not a loss.
    orphans = launches.join(done, on="correlation_id", how="anti").filter(pl.col("start") <= last_gpu)
    if orphans.is_empty():
        return 0, []
    share = orphans.height / launches.height
    span = f"between {_ms(orphans['start'].min())} and {_ms(orphans['start'].max())} into the capture"
    return orphans.height, [
        f"{orphans.height} of {launches.height} kernel launch calls ({share:.1%}) have no GPU record, {span}: "
        "the profiler dropped records; record again (fewer eager launches, or as CUDA-graph replays)"
    ]


def silent_ranges(trace: Trace, cfg: Config, pid: int) -> tuple[int, list[str]]:
    pattern = f"(?:{cfg.step_nvtx_pattern})|(?:{cfg.layer_pattern})"
    ranges = trace.nvtx.filter(pl.col("global_pid") == pid, pl.col("end").is_not_null(),
                               pl.col("text").str.contains(pattern))
    calls = trace.runtime.filter(pl.col("global_pid") == pid).select(pl.col("global_tid"), pl.col("start").alias("t")).sort("t")
    if ranges.is_empty():
        return 0, []
    # Calls on the range's thread inside it: count via two as-of lookups on a running index.
    indexed = calls.with_columns(pl.int_range(1, pl.len() + 1).over("global_tid").alias("n"))

    def calls_before(col: str) -> pl.Series:
        probe = ranges.with_row_index("_row").select("_row", "global_tid", pl.col(col).alias("t")).sort("t")
        hit = probe.join_asof(indexed, on="t", by="global_tid", strategy="backward", check_sortedness=False)
        return hit.sort("_row")["n"].fill_null(0)

    inside = calls_before("end") - calls_before("start")
    empty = ranges.with_columns(inside.alias("calls")).filter(pl.col("calls") == 0)
    problems = []
    if empty.height:
        problems.append(
            f"{empty.height} of {ranges.height} step/layer NVTX ranges hold no CUDA call "
            f"({_ms(float((empty['end'] - empty['start']).sum()))} in all, first at {_ms(empty['start'].min())}): "
            "records were dropped; record again"
        )
    steps = ranges.filter(pl.col("text").str.contains(cfg.step_nvtx_pattern))
    gaps = (
        calls.with_columns((pl.col("t") - pl.col("t").shift(1).over("global_tid")).alias("silence"),
                           pl.col("t").shift(1).over("global_tid").alias("from"))
        .filter(pl.col("silence") > cfg.silent_stretch_ns)
    )
    if not gaps.is_empty() and not steps.is_empty():
        in_step = gaps.sort("from").join_asof(
            steps.select("global_tid", pl.col("start").alias("from"), pl.col("end").alias("range_end")).sort("from"),
            on="from", by="global_tid", strategy="backward", check_sortedness=False,
        ).filter(pl.col("t") <= pl.col("range_end"))
        if in_step.height:
            problems.append(
                f"{in_step.height} stretches inside decode-step ranges have no CUDA record for more than "
                f"{_ms(cfg.silent_stretch_ns)} ({_ms(float(in_step['silence'].sum()))} in all, first at "
                f"{_ms(in_step['from'].min())}): records were dropped; record again"
            )
    return empty.height, problems


def launch_plan(trace: Trace, steps: pl.DataFrame, kernels: pl.DataFrame, pid: int) -> list[str]:
    """Against the workload's own launch plan, when it left one (an NVTX mark, k3names)."""
    marks = trace.nvtx.filter(pl.col("global_pid") == pid, pl.col("end").is_null(),
                              pl.col("text").str.starts_with(k3names.PLAN_MARK_PREFIX))
    planned = None
    for text in marks["text"].to_list():
        fields = k3names.parse_plan_mark(text) or {}
        if fields.get("kernels_per_step", "None").isdigit():
            planned = int(fields["kernels_per_step"])
    if planned is None:
        return []
    problems = []
    dominant = int(steps["kernels_expected"][0])
    if dominant != planned:
        problems.append(f"the workload's launch plan has {planned} kernels per step but the dominant step holds "
                        f"{dominant}: records were dropped or the plan is stale; record again")
    eager = kernels.filter(pl.col("eager_step").is_not_null()).group_by("eager_step").len()
    short = eager.filter(pl.col("len") < planned)
    if short.height:
        problems.append(f"{short.height} annotated eager steps hold fewer kernels than the plan's {planned} "
                        f"(as few as {int(short['len'].min())}): eager records were dropped; record again")
    return problems


def check(trace: Trace, steps: pl.DataFrame, kernels: pl.DataFrame, cfg: Config, pid: int) -> Completeness:
    n_short, p1 = incomplete_steps(steps, cfg)
    n_orphan, p2 = missing_launches(trace, pid)
    n_silent, p3 = silent_ranges(trace, cfg, pid)
    problems = tuple(p1 + p2 + p3 + launch_plan(trace, steps, kernels, pid))
    return Completeness(ok=not problems, problems=problems, missing_launches=n_orphan,
                        incomplete_steps=n_short, silent_ranges=n_silent)


def graph_level_tracing(trace: Trace) -> bool:
    """Graph launches whose kernels were not traced node by node (--cuda-graph-trace=graph)."""
    graph_calls = trace.runtime.filter(pl.col("name").str.contains(GRAPH_LAUNCH_CALL), pl.col("return_value") == 0)
    if graph_calls.is_empty() or not trace.kernels.filter(pl.col("graph_node_id").is_not_null()).is_empty():
        return False
    traced = graph_calls.join(trace.kernels, on=["global_pid", "correlation_id"], how="semi")
    return traced.is_empty()
