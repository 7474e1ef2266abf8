"""analyze(): one report's decode-step anatomy, every number as METRICS.md defines it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from k3trace.analyses import completeness, critical_path, families, kernels, pdl, pre_attention, stepgraph, steptimes
from k3trace.analyses.completeness import Completeness
from k3trace.analyses.overlap import StepOverlap, step_overlap
from k3trace.config import Config
from k3trace.errors import ReportError
from k3trace.ingest import Trace
from k3trace.model.labels import label_kernels, source_counts
from k3trace.model.stable import classify_steps
from k3trace.model.steps import assign_steps

JSON_VERSION = 1


@dataclass(frozen=True)
class Analysis:
    """Everything `k3trace analyze` reports, as frames plus the scalar summaries."""

    report: str
    nsys_version: str
    step_source: str
    config: Config
    steps: pl.DataFrame            # every step, classified (stable / drop_reason)
    kernels: pl.DataFrame          # every kernel of the analysed process, labelled
    overlap: StepOverlap           # stable-step kernels with exposed time
    step_times: pl.DataFrame       # stable steps: period, span, host, busy, residency
    families: pl.DataFrame
    kernel_table: pl.DataFrame
    pre_attention: pl.DataFrame    # per (step, full-attention layer)
    pdl_steps: pl.DataFrame
    path: pl.DataFrame             # stable-step kernels with dependency edges and on_path/critical/bubble
    path_steps: pl.DataFrame       # per stable step: path kernels, bubbles, PDL edges on the path
    graph: stepgraph.StepGraph     # the representative step's replayable dependency graph
    label_sources: dict[str, int]
    completeness: Completeness
    step_stats: dict[str, dict[str, float | None]]   # period/span/host/busy/residency quantiles, us
    pre_attention_summary: dict[str, float | int] | None
    pdl_summary: dict[str, float]
    dropped: dict[str, int]                          # dropped steps by reason
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def stable_steps(self) -> int:
        return self.step_times.height

    def representative_step(self) -> int:
        """The stable step whose span is closest to the median span."""
        st = self.step_times
        med = st["span"].median()
        return int(st.with_columns((pl.col("span") - med).abs().alias("d")).sort("d", "step")["step"][0])

    def step_timeline(self, step: int | None = None) -> pl.DataFrame:
        """One stable step's kernels for a timeline: times relative to the step start (us),
        stream row, family, layer, and whether each sits on the critical path."""
        step = self.representative_step() if step is None else step
        k = self.path.filter(pl.col("step") == step)
        t0 = k["start"].min()
        return k.sort("start").select(
            "name", "family", "layer", "stream_id", "on_path", "pdl", "binding",
            ((pl.col("start") - t0) / 1e3).alias("start_us"), ((pl.col("end") - t0) / 1e3).alias("end_us"),
            ((pl.col("end") - pl.col("start")) / 1e3).alias("duration_us"),
            (pl.col("critical_ns") / 1e3).alias("critical_us"), (pl.col("bubble_ns") / 1e3).alias("bubble_us"),
        )

    def pre_attention_by_layer(self) -> pl.DataFrame:
        """The pre-attention window per full-attention layer: median over stable steps (us)."""
        return self.pre_attention.group_by("layer").agg(
            (pl.col("window_ns").median() / 1e3).alias("median_us"),
            (pl.col("window_ns").quantile(0.9) / 1e3).alias("p90_us"),
            pl.len().alias("steps"),
        ).sort("layer")

    def per_layer(self, family: str) -> pl.DataFrame:
        """Per layer of one family: median over stable steps of the layer's kernel time (us),
        the standalone per-layer cost that seed 003 multiplies by the layer count."""
        k = self.overlap.kernels.filter(pl.col("family") == family, pl.col("layer").is_not_null())
        per = k.group_by("step", "layer").agg(pl.col("duration").sum())
        return per.group_by("layer").agg((pl.col("duration").median() / 1e3).alias("kernel_time_us")).sort("layer")

    def critical_summary(self) -> dict[str, Any]:
        ps = self.path_steps
        return {
            "kernels_on_path_median": float(ps["path_kernels"].median()),
            "bubble_us_median": float(ps["bubble_ns"].median()) / 1e3,
            "bubbles_median": float(ps["bubbles"].median()),
            "pdl_edges_on_path_median": float(ps["pdl_edges_on_path"].median()),
            "families": self.families.select("family", "critical_us").rename({"family": "name"}).to_dicts(),
        }

    def to_json(self) -> dict[str, Any]:
        q = self.step_stats
        return {
            "version": JSON_VERSION,
            "report": self.report,
            "nsys_version": self.nsys_version,
            "steps": {
                "count": self.stable_steps,
                "dropped": int(sum(self.dropped.values())),
                "dropped_by_reason": self.dropped,
                "total": self.steps.height,
                "source": self.step_source,
                "mad_k": self.config.mad_k,
                "warmup": self.config.warmup_steps,
                "kernels_per_step": int(self.steps["kernels_expected"][0]),
                "period_median_us": q["period"]["median"],
                "span_median_us": q["span"]["median"],
                "busy_median_us": q["busy"]["median"],
                "period_us": q["period"],
                "span_us": q["span"],
                "host_us": q["host"],
            },
            "residency_median_us": q["residency"]["median"],
            "families": self.families.select(
                "family", "segments_per_step", "device_busy_us", "two_stream_residency_us", "share_of_busy", "exposed_us",
                "critical_us",
            ).rename({"family": "name"}).to_dicts(),
            "pre_attention_window_us": self.pre_attention_summary,
            "kernels": self.kernel_table.select(
                "name", "family", "calls_per_step", "mean_us", "median_us", "hidden_share", "busy_per_step_us",
                "exposed_per_step_us", "critical_us", "slack_us",
            ).to_dicts(),
            "labels": {"sources": self.label_sources},
            "pdl": self.pdl_summary,
            "critical_path": self.critical_summary(),
            "completeness": {"ok": self.completeness.ok, "problems": list(self.completeness.problems)},
            "notes": list(self.notes),
        }


def analyze(trace: Trace, cfg: Config) -> Analysis:
    if trace.kernels.is_empty():
        raise ReportError(f"{trace.source}: the report holds no kernel records",
                          "record GPU work with `nsys profile -t cuda,nvtx --cuda-graph-trace=node`")
    if completeness.graph_level_tracing(trace):
        raise ReportError(
            f"{trace.source}: CUDA graphs were traced at graph level (no per-kernel records of the replays)",
            "record again with `nsys profile --cuda-graph-trace=node`",
        )
    assignment = assign_steps(trace, cfg)
    steps = classify_steps(assignment.steps, cfg)
    labelled = label_kernels(trace, assignment, cfg)
    stable_ids = steps.filter(pl.col("stable")).select("step")
    if stable_ids.is_empty():
        raise ReportError(
            f"{trace.source}: none of the {steps.height} decode steps is stable "
            f"({', '.join(f'{r}: {n}' for r, n in steps.group_by('drop_reason').len().iter_rows())})",
            "record more steps (warm-up is dropped) or lower [steps] warmup in a --config file",
        )
    stable_kernels = labelled.join(stable_ids, on="step", how="semi")
    overlap = step_overlap(stable_kernels)
    n = stable_ids.height
    pairs = pdl.same_stream_pairs(stable_kernels, cfg)
    notes = []
    if assignment.other_lanes:
        notes.append(f"analysed process {assignment.lane[0]} on device {assignment.lane[1]}; "
                     f"{assignment.other_lanes} other process/device lanes with GPU work were left out")
    counts = source_counts(labelled)
    if counts["nvtx"] + counts["graph_capture"] + counts["aligned_eager"] == 0:
        notes.append("no layer NVTX ranges: families come from kernel-name rules only, layers are unknown")
    step_times = steptimes.per_step(steps, overlap)
    path = critical_path.walk(critical_path.dependency_edges(stable_kernels, cfg), steps)
    graph = stepgraph.build(path)
    slack = graph.nodes.with_columns(pl.Series("slack_ns", stepgraph.slack(graph))).group_by("name", "family").agg(
        (pl.col("slack_ns").min() / 1e3).alias("slack_us"))
    family_rows = families.family_table(overlap, n).join(critical_path.by_family(path), on="family", how="left")
    kernel_rows = (
        kernels.kernel_table(overlap, n)
        .join(critical_path.by_kernel(path), on=["name", "family"], how="left")
        .join(slack, on=["name", "family"], how="left")
    )
    pdl_steps = pdl.per_step(pairs)
    windows = pre_attention.windows(stable_kernels, cfg)
    dropped = steps.filter(~pl.col("stable")).group_by("drop_reason").len()
    return Analysis(
        report=trace.source,
        nsys_version=trace.nsys_version,
        step_source=assignment.source,
        config=cfg,
        steps=steps,
        kernels=labelled,
        overlap=overlap,
        step_times=step_times,
        families=family_rows,
        kernel_table=kernel_rows,
        path=path,
        path_steps=critical_path.per_step(path),
        graph=graph,
        pre_attention=windows,
        pdl_steps=pdl_steps,
        label_sources=counts,
        completeness=completeness.check(trace, steps, labelled, cfg, assignment.lane[0]),
        step_stats={col: steptimes.quantiles_us(step_times[col])
                    for col in ("period", "span", "host", "busy", "residency")},
        pre_attention_summary=pre_attention.summary(windows),
        pdl_summary=pdl.summary(pdl_steps),
        dropped={str(r): int(c) for r, c in dropped.iter_rows()},
        notes=tuple(notes),
    )
