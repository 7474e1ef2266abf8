"""The critical path of each stable step (METRICS.md, "Critical path of a step").

Every kernel has up to three candidate releasers: the previous kernel on its stream, the
latest-ending kernel of another stream that ended before it started (a cross-stream
join), and its CPU launch. The one that released it last is its binding predecessor.
Walking binding predecessors back from the step's last-ending kernel gives the path;
kernel time on it counts only after the predecessor's end (a PDL overlap is not counted
twice), and the waits between are bubbles. Bubbles plus kernel parts sum to the span.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from k3trace.config import Config

STREAM, JOIN, LAUNCH = "stream", "join", "launch"


def dependency_edges(kernels: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """Stable-step kernels with their three candidate releasers and the binding one.

    Adds: stream_pred / join_pred (kernel_id), stream_release / join_release /
    launch_release (ns), release (ns), binding (stream|join|launch), pdl (bool).
    """
    k = kernels.select(
        "kernel_id", "step", "stream_id", "start", "end", "launch_start", "name", "signature", "family", "layer",
        "launch_rank",
    ).sort("step", "start", "end")
    # Same stream: the previous kernel on the stream within the step.
    by_stream = k.sort("step", "stream_id", "start")
    same = (pl.col("step") == pl.col("step").shift(1)) & (pl.col("stream_id") == pl.col("stream_id").shift(1))
    stream_pred = by_stream.select(
        "kernel_id",
        pl.when(same).then(pl.col("kernel_id").shift(1)).alias("stream_pred"),
        pl.when(same).then(pl.col("end").shift(1)).alias("stream_release"),
    )
    lookup = _end_order(k)
    join_pred = _latest_other_stream(lookup, k, pl.col("start")).drop("start_probe_floor")
    out = k.join(stream_pred, on="kernel_id", how="left").join(join_pred, on="kernel_id", how="left")
    out = out.with_columns(pl.col("launch_start").alias("launch_release"))
    # Graph replays place programmatic (PDL) edges across internal streams too, and there
    # the dependent's reported start precedes its producer's end (its prologue ran first).
    # Where the usual candidates leave a wait, a producer on another stream ending within
    # `pdl_max_overlap_ns` after the start (and before the kernel's own end) released it.
    usual = pl.max_horizontal("stream_release", "join_release", "launch_release")
    waited = (pl.col("start") - usual) > cfg.pdl_max_gap_ns
    probe = pl.min_horizontal(pl.col("start") + cfg.pdl_max_overlap_ns, pl.col("end") - 1)
    overlap = _latest_other_stream(lookup, out.filter(waited), probe).filter(
        pl.col("join_release") > pl.col("start_probe_floor")
    ).select("kernel_id", pl.col("join_pred").alias("ov_pred"), pl.col("join_release").alias("ov_release"))
    out = out.join(overlap, on="kernel_id", how="left").with_columns(
        pl.coalesce("ov_pred", "join_pred").alias("join_pred"),
        pl.coalesce("ov_release", "join_release").alias("join_release"),
    ).drop("ov_pred", "ov_release")
    # Ties go to the stream edge, then the join: a launch that happened earlier never binds.
    release = pl.max_horizontal("stream_release", "join_release", "launch_release")
    out = out.with_columns(release.alias("release")).with_columns(
        pl.when(pl.col("stream_release") == pl.col("release")).then(pl.lit(STREAM))
        .when(pl.col("join_release") == pl.col("release")).then(pl.lit(JOIN))
        .when(pl.col("launch_release").is_not_null()).then(pl.lit(LAUNCH))
        .alias("binding"),
    ).with_columns(
        (
            ((pl.col("binding") == STREAM) & ((pl.col("start") - pl.col("stream_release")) <= cfg.pdl_max_gap_ns))
            | ((pl.col("binding") == JOIN) & (pl.col("join_release") > pl.col("start")))
        ).fill_null(False).alias("pdl"),
        pl.when(pl.col("binding") == STREAM).then(pl.col("stream_pred"))
        .when(pl.col("binding") == JOIN).then(pl.col("join_pred"))
        # Released by its CPU launch: the path goes on through the host to the kernel that ran
        # before on its stream (else the latest on another), and the wait between that one's
        # end and this start is a launch bubble. On an eager trace the path otherwise ended at
        # the first launch-bound kernel ("1 kernel, 1 bubble of 83 ms").
        .when(pl.col("binding") == LAUNCH).then(pl.coalesce("stream_pred", "join_pred")).alias("pred"),
        pl.when(pl.col("binding") == LAUNCH).then(pl.coalesce("stream_release", "join_release"))
        .otherwise(pl.col("release")).alias("path_release"),
    )
    return out.sort("kernel_id")


def _end_order(k: pl.DataFrame) -> pl.DataFrame:
    """The step's kernels ordered by end, each with the position just before its run of
    same-stream neighbours in that order (where the latest other-stream end is found)."""
    by_end = k.select("step", "stream_id", "kernel_id", "end").sort("step", "end").with_row_index("end_pos")
    new_run = (pl.col("stream_id") != pl.col("stream_id").shift(1)) | (pl.col("step") != pl.col("step").shift(1))
    return by_end.with_columns(
        (pl.when(new_run.fill_null(True)).then(pl.col("end_pos")).forward_fill().cast(pl.Int64) - 1).alias("before_run")
    ).select("end_pos", "step", pl.col("kernel_id").alias("cand"), pl.col("stream_id").alias("cand_stream"),
             pl.col("end").alias("cand_end"), "before_run")


def _latest_other_stream(lookup: pl.DataFrame, probing: pl.DataFrame, probe: pl.Expr) -> pl.DataFrame:
    """Per kernel of `probing`: the latest-ending kernel on *another* stream in its step with
    end <= probe. The as-of match is the latest end <= probe; if that kernel is on the
    probing kernel's own stream, the latest other-stream one sits just before its run."""
    probes = probing.select("kernel_id", "step", "stream_id", "start", probe.alias("_probe")).sort("_probe")
    cand = probes.join_asof(lookup, left_on="_probe", right_on="cand_end", by="step",
                            strategy="backward", check_sortedness=False)
    fallback = lookup.select(pl.col("end_pos").cast(pl.Int64).alias("before_run"), pl.col("step").alias("fb_step"),
                             pl.col("cand").alias("fb"), pl.col("cand_end").alias("fb_end"))
    other = pl.col("cand_stream") != pl.col("stream_id")
    return cand.join(fallback, on="before_run", how="left").select(
        "kernel_id",
        pl.when(other).then(pl.col("cand")).when(pl.col("fb_step") == pl.col("step")).then(pl.col("fb")).alias("join_pred"),
        pl.when(other).then(pl.col("cand_end")).when(pl.col("fb_step") == pl.col("step")).then(pl.col("fb_end"))
        .alias("join_release"),
        pl.col("start").alias("start_probe_floor"),
    )


def walk(edges: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Mark the path of every step at once (pointer chasing vectorised across steps).

    Returns edges + on_path, critical_ns (kernel time on the path, after the release),
    bubble_ns (wait before the kernel on the path; the path's first kernel waits from the
    step's first kernel start).
    """
    ids = edges["kernel_id"].to_numpy().astype(np.int64)
    row_of = np.full(int(ids.max()) + 1 if len(ids) else 1, -1, dtype=np.int64)
    row_of[ids] = np.arange(len(ids))
    pred = edges["pred"].fill_null(-1).to_numpy().astype(np.int64)
    pred_row = np.where(pred >= 0, row_of[np.clip(pred, 0, None)], -1)
    last = edges.sort("end").group_by("step").agg(pl.col("kernel_id").last())
    cursor = row_of[last["kernel_id"].to_numpy().astype(np.int64)]
    on_path = np.zeros(len(ids), dtype=bool)
    while cursor.size:
        on_path[cursor] = True
        cursor = pred_row[cursor]
        cursor = cursor[(cursor >= 0) & ~on_path[np.clip(cursor, 0, None)]]
    first = steps.select("step", pl.col("first_start").alias("step_start"))
    out = edges.with_columns(pl.Series("on_path", on_path)).join(first, on="step", how="left")
    # The path's earliest kernel waits on the launch from the step's start, not the call; a
    # launch-bound kernel from its host-side predecessor's end (`path_release`).
    released = pl.when(pl.col("pred").is_null()).then(pl.col("step_start")).otherwise(pl.col("path_release"))
    counted_from = pl.max_horizontal("start", released)
    return out.with_columns(
        pl.when(pl.col("on_path")).then(pl.col("end") - counted_from).otherwise(0).alias("critical_ns"),
        pl.when(pl.col("on_path")).then((pl.col("start") - released).clip(lower_bound=0)).otherwise(0).alias("bubble_ns"),
    ).drop("step_start")


def per_step(path: pl.DataFrame) -> pl.DataFrame:
    on = path.filter(pl.col("on_path"))
    return on.group_by("step").agg(
        pl.len().alias("path_kernels"),
        pl.col("critical_ns").sum(),
        pl.col("bubble_ns").sum(),
        (pl.col("bubble_ns") > 0).sum().alias("bubbles"),
        pl.col("pdl").sum().alias("pdl_edges_on_path"),
    ).sort("step")


def by_family(path: pl.DataFrame) -> pl.DataFrame:
    """Median over stable steps of the family's time on the path (us)."""
    steps = path.select("step").unique()
    fams = path.select("family").unique()
    per = path.group_by("step", "family").agg(pl.col("critical_ns").sum())
    return (
        steps.join(fams, how="cross").join(per, on=["step", "family"], how="left").fill_null(0)
        .group_by("family").agg((pl.col("critical_ns").median() / 1e3).alias("critical_us"))
    )


def by_kernel(path: pl.DataFrame) -> pl.DataFrame:
    steps = path.select("step").unique()
    names = path.select("name", "family").unique()
    per = path.group_by("step", "name", "family").agg(pl.col("critical_ns").sum())
    return (
        steps.join(names, how="cross").join(per, on=["step", "name", "family"], how="left").fill_null(0)
        .group_by("name", "family").agg((pl.col("critical_ns").median() / 1e3).alias("critical_us"))
    )
