"""PDL edges, inferred (METRICS.md, "PDL"): a same-stream pair whose gap is at most a few
ns (how nsys 2023.4 on CUDA 13 reports a PDL launch), or negative (how other CUPTI
versions report the overlapped prologue). Other same-stream gaps are reported as gaps."""

from __future__ import annotations

import polars as pl

from k3trace.config import Config
from k3trace.ordering import sort_positions


def same_stream_pairs(kernels: pl.DataFrame, cfg: Config, *, named: bool = True) -> pl.DataFrame:
    """Each kernel with its same-stream predecessor in the step: `gap_ns`, `pdl`, and the
    predecessor's `prev_name` and `prev_kernel_id` (only the columns these need are sorted).
    Not `named`: the step, times, gap and flag alone, which the per-step counts read (the
    names and ids through the sort took 120 MB more at 2.2M kernels, at the analysis' peak)."""
    named_columns = ("kernel_id", "name", "family") if named else ()
    needed = kernels.select(*named_columns, "step", "stream_id", "start", "end")
    ordered = needed[sort_positions(needed, "step", "stream_id", "start")]
    same = (pl.col("step") == pl.col("step").shift(1)) & (pl.col("stream_id") == pl.col("stream_id").shift(1))
    predecessor = [pl.col("name").shift(1).alias("prev_name"), pl.col("kernel_id").shift(1).alias("prev_kernel_id")]
    return (
        ordered.with_columns(
            pl.when(same).then(pl.col("start") - pl.col("end").shift(1)).alias("gap_ns"),
            *(predecessor if named else []),
        )
        .filter(pl.col("gap_ns").is_not_null())
        .with_columns((pl.col("gap_ns") <= cfg.pdl_max_gap_ns).alias("pdl"))
    )


def pairs_from_edges(edges: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """`same_stream_pairs(..., named=False)`'s step, gap and flag, read off the critical
    path's dependency edges (critical_path.dependency_edges), whose stream edge is the same
    pair: the kernel before on the stream within the step, `stream_release` its end. No
    sort of its own (the path's scans have made that one: 0.1 s of CPU at 2.5M kernels)."""
    return (
        edges.select("step", (pl.col("start") - pl.col("stream_release")).alias("gap_ns"))
        .filter(pl.col("gap_ns").is_not_null())
        .with_columns((pl.col("gap_ns") <= cfg.pdl_max_gap_ns).alias("pdl"))
    )


def per_step(pairs: pl.DataFrame) -> pl.DataFrame:
    return pairs.group_by("step").agg(
        pl.col("pdl").sum().alias("pdl_edges"),
        (~pl.col("pdl")).sum().alias("gaps"),
        pl.col("gap_ns").filter(~pl.col("pdl")).sum().alias("gap_ns"),
    ).sort("step")


def summary(steps: pl.DataFrame) -> dict[str, float]:
    if steps.is_empty():
        return {"edges_per_step": 0.0, "gaps_per_step": 0.0, "gap_us_per_step": 0.0}
    return {
        "edges_per_step": float(steps["pdl_edges"].median()),
        "gaps_per_step": float(steps["gaps"].median()),
        "gap_us_per_step": float(steps["gap_ns"].median()) / 1e3,
    }


def edge_table(kernels: pl.DataFrame, cfg: Config, steps: int) -> pl.DataFrame:
    """Per same-stream pair of kernel names (producer -> dependent, the dependent's family)
    over the stable steps: pairs per step, PDL edges per step, the PDL share, and the median
    gap of the pairs without PDL (us, null when all are PDL). Sorted by PDL edges."""
    pairs = same_stream_pairs(kernels, cfg)
    return (
        pairs.group_by(pl.col("prev_name").alias("producer"), pl.col("name").alias("dependent"), "family")
        .agg((pl.len() / steps).alias("pairs_per_step"), (pl.col("pdl").sum() / steps).alias("pdl_per_step"),
             pl.col("pdl").mean().alias("pdl_share"),
             (pl.col("gap_ns").filter(~pl.col("pdl")).median() / 1e3).alias("gap_us_median"))
        .sort(["pdl_per_step", "pairs_per_step", "producer", "dependent"], descending=[True, True, False, False])
    )
