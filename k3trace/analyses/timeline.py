"""One stable step laid out for a timeline: kernels on stream-role rows (streams.py), the
critical path in order, its waits (bubbles), PDL edges, and each layer's extent. Times
are us from the step's first kernel start. Renderers draw this; they compute nothing."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from k3trace.analyses.result import Analysis
from k3trace.analyses.streams import StreamRoles, stream_roles


@dataclass(frozen=True)
class Timeline:
    report: str
    step: int
    roles: StreamRoles
    kernels: pl.DataFrame    # kernel_id, name, family, layer, stream_id, capture_stream, row, role, start_us,
                             # end_us, duration_us, on_path, pdl, pred, critical_us, bubble_us
    path: pl.DataFrame       # the critical path in order: kernel_id, name, role, start_us, end_us
    bubbles: pl.DataFrame    # waits on the critical path: role, start_us, end_us, wait_us, before (kernel name)
    pdl_edges: pl.DataFrame  # producer, dependent, producer_role, dependent_role, producer_end_us, dependent_start_us
    layers: pl.DataFrame     # layer, families, start_us, end_us: first kernel start to last kernel end
    span_us: float

    @property
    def rows(self) -> list[str]:
        return self.roles.labels


def step_timeline(a: Analysis, step: int | None = None) -> Timeline:
    step = a.representative_step() if step is None else step
    k = a.path.filter(pl.col("step") == step)
    if k.is_empty():
        raise ValueError(f"step {step} is not a stable step of {a.report}")
    t0 = k["start"].min()
    roles = stream_roles(a.kernels, a.path, step)
    us = [((pl.col(c) - t0) / 1e3).alias(f"{c}_us") for c in ("start", "end")]
    kernels = k.join(roles.rows, on="kernel_id", how="left").sort("start", "end").select(
        "kernel_id", "name", "family", "layer", "stream_id", "capture_stream", "row", "role", *us,
        ((pl.col("end") - pl.col("start")) / 1e3).alias("duration_us"), "on_path", "pdl", "pred",
        (pl.col("critical_ns") / 1e3).alias("critical_us"), (pl.col("bubble_ns") / 1e3).alias("bubble_us"),
    )
    path = kernels.filter(pl.col("on_path")).select("kernel_id", "name", "role", "start_us", "end_us")
    bubbles = kernels.filter(pl.col("on_path"), pl.col("bubble_us") > 0).select(
        "role", (pl.col("start_us") - pl.col("bubble_us")).alias("start_us"), pl.col("start_us").alias("end_us"),
        pl.col("bubble_us").alias("wait_us"), pl.col("name").alias("before"))
    producers = kernels.select(pl.col("kernel_id").alias("pred"), pl.col("name").alias("producer"),
                               pl.col("role").alias("producer_role"), pl.col("end_us").alias("producer_end_us"))
    pdl_edges = kernels.filter(pl.col("pdl")).join(producers, on="pred", how="inner").select(
        "producer", pl.col("name").alias("dependent"), "producer_role", pl.col("role").alias("dependent_role"),
        "producer_end_us", pl.col("start_us").alias("dependent_start_us"))
    layers = kernels.filter(pl.col("layer").is_not_null()).group_by("layer").agg(
        pl.col("family").unique(maintain_order=True).alias("families"),
        pl.col("start_us").min(), pl.col("end_us").max()).sort("layer")
    return Timeline(report=a.report, step=step, roles=roles, kernels=kernels, path=path, bubbles=bubbles,
                    pdl_edges=pdl_edges, layers=layers, span_us=float(kernels["end_us"].max()))
