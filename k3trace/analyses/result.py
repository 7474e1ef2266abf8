"""The result of `analyze`: frames plus scalar summaries, with a versioned `to_json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from k3trace.analyses import stepgraph
from k3trace.analyses.anatomy import Anatomy
from k3trace.analyses.completeness import Completeness
from k3trace.analyses.dram import DramReading
from k3trace.config import Config
from k3trace.ingest.kineto import KINETO_RECORDER
from k3trace.model.labels import LabelSummary

JSON_VERSION = 2

#: Columns kept of every labelled kernel (the rest is intermediate).
KERNEL_COLUMNS = ("kernel_id", "start", "end", "stream_id", "correlation_id", "name", "graph_node_id", "step",
                  "eager_step", "launch_rank", "layer", "family", "label_source", "segment")
#: Columns kept of the stable-step kernels with their dependency edges.
PATH_COLUMNS = ("kernel_id", "step", "stream_id", "start", "end", "name", "family", "layer", "launch_rank",
                "binding", "pdl", "pdl_start", "pred", "release", "on_path", "critical_ns", "bubble_ns")
#: The parts of an analysis that a diff never reads: it and its pages read the step times
#: and quantiles, the family table, the graph, the path and kernels, the pre-attention
#: windows and the completeness. The diff's analyses leave these out (`Analysis.omitted`).
DIFF_OMITS = ("kernel_table", "layers", "path_steps", "pdl_steps", "pdl_summary", "anatomy")


@dataclass(frozen=True)
class Analysis:
    """Everything `k3trace analyze` reports, as frames plus the scalar summaries."""

    report: str
    nsys_version: str
    step_source: str
    config: Config
    steps: pl.DataFrame            # every step, classified (stable / drop_reason)
    kernels: pl.DataFrame          # every kernel of the analysed process, labelled (KERNEL_COLUMNS)
    step_times: pl.DataFrame       # stable steps: period, span, host, busy, residency
    families: pl.DataFrame
    kernel_table: pl.DataFrame | None  # None where omitted (DIFF_OMITS), as the four below
    pre_attention: pl.DataFrame    # per (step, full-attention layer)
    pdl_steps: pl.DataFrame | None
    path: pl.DataFrame             # stable-step kernels: edges, on_path, critical/bubble (PATH_COLUMNS)
    path_steps: pl.DataFrame | None  # per stable step: path kernels, bubbles, PDL edges on the path
    graph: stepgraph.StepGraph     # the representative step's replayable dependency graph
    label_sources: dict[str, int]
    label_summary: LabelSummary
    layers: pl.DataFrame | None    # per layer: index, families, kernels_per_step, device_busy_us, critical_us
    step_range: dict[str, Any]     # the step-range form matched (`form`, null when none) and `ranges`
    completeness: Completeness
    step_stats: dict[str, dict[str, float | None]]   # period/span/host/busy/residency quantiles, us
    pre_attention_summary: dict[str, float | int] | None
    pdl_summary: dict[str, float] | None
    dropped: dict[str, int]                          # dropped steps by reason
    notes: tuple[str, ...] = field(default_factory=tuple)
    omitted: tuple[str, ...] = ()                    # the fields left out (None): DIFF_OMITS for a diff's side
    dram: DramReading | None = None                  # from the report's DRAM metrics; None without them
    anatomy: Anatomy | None = None                   # each family's typical segment, kernel by kernel

    def _whole(self, what: str) -> None:
        """A part that reads the omitted fields fails with a clear message, not a None's AttributeError."""
        if self.omitted:
            raise ValueError(f"{what} reads the whole analysis of {self.report}, and this one (made for a diff) "
                             f"leaves out {', '.join(self.omitted)}")

    @property
    def recorded_with(self) -> str:
        """The recorder as a header names it: `nsys <version>`, or torch.profiler's own string
        (a Kineto trace carries no nsys version; `nsys_version` holds that string there)."""
        v = self.nsys_version
        return v if v.startswith(KINETO_RECORDER) else f"nsys {v}"

    @property
    def stable_steps(self) -> int:
        return self.step_times.height

    def trust(self) -> dict[str, Any]:
        """This side's completeness in brief, for a verdict built on it (the diff): the
        report, whether its capture is complete, the problem and caveat texts."""
        return {"report": self.report, **self.completeness.summary(),
                "problem_texts": list(self.completeness.problems)}

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
        k = self.path.filter(pl.col("family") == family, pl.col("layer").is_not_null())
        per = k.group_by("step", "layer").agg((pl.col("end") - pl.col("start")).sum().alias("duration"))
        return per.group_by("layer").agg((pl.col("duration").median() / 1e3).alias("kernel_time_us")).sort("layer")

    def critical_summary(self) -> dict[str, Any]:
        self._whole("critical_summary")
        ps = self.path_steps
        return {
            "kernels_on_path_median": float(ps["path_kernels"].median()),
            "bubble_us_median": float(ps["bubble_ns"].median()) / 1e3,
            "bubbles_median": float(ps["bubbles"].median()),
            "pdl_edges_on_path_median": float(ps["pdl_edges_on_path"].median()),
            "families": self.families.select("family", "critical_us").rename({"family": "name"}).to_dicts(),
        }

    def to_json(self) -> dict[str, Any]:
        self._whole("to_json")
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
                "nvtx_range": self.step_range,
                "period_us": q["period"],
                "span_us": q["span"],
                "host_us": q["host"],
            },
            "residency_median_us": q["residency"]["median"],
            "families": self.families.select(
                "family", "segments_per_step", "device_busy_us", "two_stream_residency_us", "share_of_busy", "exposed_us",
                "critical_us",
            ).rename({"family": "name"}).to_dicts(),
            "pre_attention_window_us": None if self.pre_attention_summary is None else {
                **self.pre_attention_summary, "by_layer": self.pre_attention_by_layer().to_dicts()},
            "kernels": self.kernel_table.select(
                "name", "family", "calls_per_step", "mean_us", "median_us", "hidden_share", "busy_per_step_us",
                "exposed_per_step_us", "critical_us", "slack_us", "sites", "site_median_min_us",
                "site_median_max_us",
            ).to_dicts(),
            "layers": self.layers.to_dicts(),
            "segment_anatomy": {"kinds": self.anatomy.kinds.to_dicts(), "kernels": self.anatomy.kernels.to_dicts()},
            "labels": self.label_summary.to_json(),
            "pdl": {**self.pdl_summary, "inferred": self.config.infers_pdl},   # not on HIP
            "critical_path": self.critical_summary(),
            "completeness": {"ok": self.completeness.ok, "problems": list(self.completeness.problems),
                             "excluded_rows": self.completeness.excluded_rows,
                             "affected_steps": self.completeness.affected_steps,
                             "truncated": self.completeness.truncated},
            "caveats": list(self.completeness.caveats),
            "notes": list(self.notes),
            # Only where the report has DRAM metrics: the JSON of any other report is as it was.
            **({"dram": self.dram.to_json()} if self.dram is not None else {}),
        }
