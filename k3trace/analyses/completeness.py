"""Is the capture complete? An incomplete trace is reported, never silently analysed.

Findings (issue: nsys 2023.4.4 on CUDA 13 dropped most records of an eager decode without
any diagnostic, ../shared/gpu/README.md; issue 12: damaged exports):
- rows ingest excluded (damaged times, ids or names, duplicates), with the steps they hit;
- steps of the dominant signature holding fewer kernels than the dominant step;
- launch calls with no GPU record (calls made during stream capture excluded: they are
  recorded into a graph, not executed; calls so late that their GPU work could not have
  finished before the capture ended excluded too), and a capture whose GPU records stop
  while the host goes on launching;
- step or layer NVTX ranges, and long stretches inside step ranges, with no CUDA record.

And caveats, which are not losses but limit what a number means: percentiles over fewer
than `MIN_STEPS_FOR_PERCENTILES` stable steps, steps found by the period fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

import k3names
from k3trace.config import Config
from k3trace.ingest import Trace
from k3trace.model.labels.modules import OUTPUT_RANGE
from k3trace.model.launches import GRAPH_LAUNCH_CALL, LAUNCH_CALL, captured_calls

#: Fewer stable steps than this make p90/p99 (and the median's noise band) unreliable.
MIN_STEPS_FOR_PERCENTILES = 10


@dataclass(frozen=True)
class Completeness:
    ok: bool
    problems: tuple[str, ...]
    missing_launches: int
    incomplete_steps: int
    silent_ranges: int
    excluded_rows: int = 0                           # rows ingest excluded (all tables)
    affected_steps: int = 0                          # steps that lost excluded kernel rows
    truncated: bool = False                          # GPU records stop before the host's
    caveats: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> dict:
        """What a consumer of this analysis (the diff's verdict) carries: whether the capture
        is complete, how many problems, and the caveats, in JSON-able form."""
        return {"ok": self.ok, "problems": len(self.problems), "missing_launches": self.missing_launches,
                "incomplete_steps": self.incomplete_steps, "excluded_rows": self.excluded_rows,
                "truncated": self.truncated, "caveats": list(self.caveats)}


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


def _window_lost(orphans: pl.DataFrame, frontier: float, window_end: float, min_lag: float) -> np.ndarray:
    """For launches after the last recorded one (sorted by call start): True where the
    GPU work would have finished inside the capture had it been recorded.

    The GPU runs launches in order: orphan j's work would start no earlier than its call
    plus the least launch latency seen, nor before the work queued ahead of it (the last
    recorded GPU end, then the orphans before it, each taking its kind's median time).
    end_j = S_j + max_k<=j (A_k - S_{k-1}), a running max over prefix sums.
    """
    work = orphans["work"].to_numpy().astype(np.float64)
    ready = orphans["start"].to_numpy().astype(np.float64) + min_lag
    ready[0] = max(ready[0], frontier)
    prefix = np.cumsum(work)
    before = np.concatenate([[0.0], prefix[:-1]])
    end = prefix + np.maximum.accumulate(ready - before)
    return end <= window_end


def missing_launches(trace: Trace, pid: int) -> tuple[int, bool, list[str]]:
    """(launches lost, capture truncated, problems)."""
    calls = trace.runtime.filter(pl.col("global_pid") == pid).with_columns(captured_calls().alias("captured"))
    launches = calls.filter(pl.col("name").str.contains(LAUNCH_CALL), ~pl.col("captured"), pl.col("return_value") == 0)
    if launches.is_empty():
        return 0, False, []
    gpu = trace.kernels.filter(pl.col("global_pid") == pid).group_by("correlation_id").agg(
        pl.col("start").min().alias("gpu_start"), pl.col("end").max().alias("gpu_end"))
    launches = launches.join(gpu, on="correlation_id", how="left").with_columns(
        pl.col("name").str.contains(GRAPH_LAUNCH_CALL).alias("graph")).sort("start")
    # Launches whose GPU rows ingest excluded as damaged have records: counted there, not here.
    damaged = trace.rejected_kernels.filter(pl.col("global_pid") == pid).select("correlation_id").unique()
    launches = launches.join(damaged, on="correlation_id", how="anti")
    recorded = launches.filter(pl.col("gpu_start").is_not_null())
    orphans = launches.filter(pl.col("gpu_start").is_null())
    if orphans.is_empty():
        return 0, False, []
    if recorded.is_empty():
        lost = orphans
        tail_lost = 0
    else:
        # An orphan launched before a recorded launch lost its records (the GPU ran the later
        # one). One launched after the last recorded one is lost only if its work would have
        # finished before the capture ended: the window's last launches legitimately run after it.
        last_call = recorded["start"].max()
        work = recorded.group_by("graph").agg((pl.col("gpu_end") - pl.col("gpu_start")).median().alias("work"))
        tail = orphans.filter(pl.col("start") > last_call).join(work, on="graph", how="left").with_columns(
            pl.col("work").fill_null(float(work["work"].median())))
        window_end = max(float(trace.kernels["end"].max()), float(calls["end"].max()),
                         float(trace.nvtx["end"].max() or 0) if trace.nvtx.height else 0.0)
        min_lag = max(float((recorded["gpu_start"] - recorded["start"]).min()), 0.0)
        frontier = float(recorded["gpu_end"].max())
        in_window = (_window_lost(tail, frontier, window_end, min_lag) if tail.height
                     else np.zeros(0, dtype=bool))
        tail_lost = int(in_window.sum())
        lost = pl.concat([orphans.filter(pl.col("start") <= last_call), tail.filter(pl.Series(in_window))
                          .select(orphans.columns)])
    if lost.is_empty():
        return 0, False, []
    problems = []
    for is_graph, what in ((True, "CUDA graph launches"), (False, "kernel launch calls")):
        part, of = lost.filter(pl.col("graph") == is_graph), launches.filter(pl.col("graph") == is_graph)
        if part.is_empty():
            continue
        span = f"between {_ms(part['start'].min())} and {_ms(part['start'].max())} into the capture"
        problems.append(
            f"{part.height} of {of.height} {what} ({part.height / of.height:.1%}) have no GPU record, {span}: "
            "the profiler dropped records; record again (fewer eager launches, or as CUDA-graph replays)")
    truncated = tail_lost > 0 and not recorded.is_empty()
    if truncated:
        problems.append(
            f"the capture is truncated: GPU records stop at {_ms(float(recorded['gpu_end'].max()))} while "
            f"{tail_lost} later launches, up to {_ms(float(lost['start'].max()))}, should have run before the "
            "capture ended; record again and let the capture finish (nsys was stopped or its output cut)")
    return lost.height, truncated, problems


def _checked_ranges(trace: Trace, cfg: Config, pid: int) -> pl.DataFrame:
    """The ranges that must hold CUDA calls: step ranges, k3trace's layer ranges and an
    engine's layer module ranges (`...layers.3`, not its children: a module may launch
    nothing). A zero-length range (a marker pushed and popped at once) and an engine's
    output range (pushed and popped after a module's forward) hold nothing by design."""
    module = pl.col("text").str.extract_groups(cfg.module_pattern)
    live = trace.nvtx.filter(pl.col("global_pid") == pid, pl.col("end").is_not_null(), pl.col("end") > pl.col("start"),
                             ~pl.col("text").str.contains(OUTPUT_RANGE))
    return live.filter(
        pl.col("text").str.contains(cfg.step_nvtx_pattern) | pl.col("text").str.contains(cfg.layer_pattern)
        | (module.struct.field("rest") == "").fill_null(False),
    )


def silent_ranges(trace: Trace, cfg: Config, pid: int) -> tuple[int, list[str]]:
    ranges = _checked_ranges(trace, cfg, pid)
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
    # Silence runs from the end of the calls before (a blocking copy or synchronize can last
    # far longer than the stretch: SGLang's profile spends 463 ms in one hipMemcpyWithStream).
    ends = trace.runtime.filter(pl.col("global_pid") == pid).select(
        "global_tid", pl.col("start").alias("t"), pl.col("end").fill_null(pl.col("start"))).sort("t")
    gaps = (
        ends.with_columns(pl.col("end").cum_max().shift(1).over("global_tid").alias("from"))
        .with_columns((pl.col("t") - pl.col("from")).alias("silence"))
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
    eager = kernels.select("eager_step").filter(pl.col("eager_step").is_not_null()).group_by("eager_step").len()
    short = eager.filter(pl.col("len") < planned)
    if short.height:
        problems.append(f"{short.height} annotated eager steps hold fewer kernels than the plan's {planned} "
                        f"(as few as {int(short['len'].min())}): eager records were dropped; record again")
    return problems


def excluded_rows(trace: Trace, kernels: pl.DataFrame, pid: int) -> tuple[int, int, list[str]]:
    """(rows excluded at ingest, steps that lost kernel rows, problems)."""
    found = trace.findings.filter(pl.col("excluded"))
    if found.is_empty():
        return 0, 0, []
    steps = affected_steps(trace, kernels, pid)
    problems = []
    for (table,), group in found.group_by("table", maintain_order=True):
        total = int(group["total"][0])
        parts = ", ".join(f"{int(r['rows'])} {r['issue']}" for r in group.iter_rows(named=True))
        n = int(group["rows"].sum())
        where = ""
        if table == "kernels":
            where = f", from {steps.len()} steps" + (f" ({_where(steps)})" if steps.len() else "")
        problems.append(f"{n} of {total} {_RECORDS.get(table, table)} records were excluded as damaged "
                        f"({parts}){where}: the numbers leave them out; export the report again from the .nsys-rep")
    return int(found["rows"].sum()), steps.len(), problems


_RECORDS = {"kernels": "kernel", "runtime": "CUDA API call", "nvtx": "NVTX"}


def affected_steps(trace: Trace, kernels: pl.DataFrame, pid: int) -> pl.Series:
    """Steps that lost excluded kernel rows: the replay sharing the row's correlation id, or
    else the step whose launch calls span the row's launch call."""
    rejected = trace.rejected_kernels.filter(pl.col("global_pid") == pid)
    if rejected.is_empty():
        return pl.Series("step", [], dtype=pl.Int64)
    stepped = kernels.filter(pl.col("step").is_not_null())
    siblings = rejected.join(stepped.select("correlation_id", "step").unique(), on="correlation_id", how="inner")
    rest = rejected.join(siblings.select("correlation_id"), on="correlation_id", how="anti")
    calls = trace.runtime.filter(pl.col("global_pid") == pid).select("correlation_id", pl.col("start").alias("t"))
    windows = stepped.filter(pl.col("launch_start").is_not_null()).group_by("step").agg(
        pl.col("launch_start").min().alias("t"), pl.col("launch_start").max().alias("t_last")).sort("t")
    by_call = rest.join(calls, on="correlation_id", how="inner").sort("t").join_asof(
        windows, on="t", strategy="backward").filter(pl.col("t") <= pl.col("t_last"))
    return pl.concat([siblings["step"], by_call["step"]]).unique().sort()


def caveats(steps: pl.DataFrame, source: str) -> list[str]:
    """Limits on what the step statistics mean (not losses)."""
    out = []
    stable = int(steps["stable"].sum())
    if stable < MIN_STEPS_FOR_PERCENTILES:
        out.append(f"only {stable} stable step{'s' if stable != 1 else ''}: p90/p99 (and the diff's noise band) need "
                   f"at least {MIN_STEPS_FOR_PERCENTILES} and are not percentiles here; record more decode steps")
    if source == "period":
        out.append("steps come from the period of the repeating kernel sequence (no graph replays, no NVTX step "
                   "ranges): check that the trace is a decode loop, or mark steps with NVTX ranges "
                   "([steps] nvtx_pattern)")
    return out


def check(trace: Trace, steps: pl.DataFrame, kernels: pl.DataFrame, cfg: Config, pid: int,
          source: str = "graph") -> Completeness:
    n_excluded, n_affected, p0 = excluded_rows(trace, kernels, pid)
    n_short, p1 = incomplete_steps(steps, cfg)
    n_orphan, truncated, p2 = missing_launches(trace, pid)
    n_silent, p3 = silent_ranges(trace, cfg, pid)
    problems = tuple(p0 + p1 + p2 + p3 + launch_plan(trace, steps, kernels, pid))
    return Completeness(ok=not problems, problems=problems, missing_launches=n_orphan,
                        incomplete_steps=n_short, silent_ranges=n_silent, excluded_rows=n_excluded,
                        affected_steps=n_affected, truncated=truncated, caveats=tuple(caveats(steps, source)))


def graph_level_tracing(trace: Trace) -> bool:
    """Graph launches whose kernels were not traced node by node (--cuda-graph-trace=graph)."""
    graph_calls = trace.runtime.filter(pl.col("name").str.contains(GRAPH_LAUNCH_CALL), pl.col("return_value") == 0)
    # A column test, not a filter: filtering would copy every column of the kernels.
    if graph_calls.is_empty() or trace.kernels["graph_node_id"].is_not_null().any():
        return False
    traced = graph_calls.join(trace.kernels, on=["global_pid", "correlation_id"], how="semi")
    return traced.is_empty()
