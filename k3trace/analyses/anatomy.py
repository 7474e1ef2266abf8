"""A typical segment, kernel by kernel (docs/metrics.md, "Segment anatomy").

A segment is one layer's kernels of one family in one stable step. Its kernels, in launch
order, spell a sequence of names; the segments of a family that spell the same sequence are
one kind (a family usually has one; a layer that forks differently, or the first dense layer,
makes another). For each kind and each position in its sequence: the kernel's stream role, its
start and end as offsets from the segment's first kernel start, its duration (medians over the
kind's segments), how often it sits on the critical path and its mean time there. What an
engineer reads off a timeline by hand, one layer at a time, here over every layer at once.

Recorded times under PDL: a kernel launched at its producer's early trigger records from its
launch, so its start and duration hold the producer's tail (docs/metrics.md, "PDL"); the
offsets say when each kernel was launched and ended, not when its own work began.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

SEQUENCE_SEP = "\x1f"  # between names in a kind's sequence (never in a kernel name)


@dataclass(frozen=True)
class Anatomy:
    kinds: pl.DataFrame    # family, kind (0 = the family's most frequent), kernels, segments_per_step,
                           # share (of the family's segments), span_us (median first start -> last end)
    kernels: pl.DataFrame  # family, kind, position, name, role, start_us, end_us, duration_us (medians),
                           # on_path_share, critical_us (mean per segment)

    def dominant(self) -> pl.DataFrame:
        """The kernels of each family's most frequent kind."""
        return self.kernels.filter(pl.col("kind") == 0)


#: Stable steps the medians are taken over, evenly spaced through the recording: a long
#: recording's thousands of steps repeat the same segments, and the anatomy's grouping costs
#: per kernel (about 50 ms per 100k kernels on one core).
MAX_STEPS = 32


def segment_anatomy(path: pl.DataFrame, roles: pl.DataFrame | None = None, max_steps: int = MAX_STEPS) -> Anatomy:
    """`path`: the stable-step kernels with their critical-path columns (Analysis.path);
    `roles`: kernel_id -> role for the kernels of one step (the representative step's graph
    nodes), read per position from that step's first segment of each kind; None: no roles.
    Over at most `max_steps` stable steps, evenly spaced, and those of `roles` among them."""
    # The steps first: one pass over an integer column, then only their rows are copied.
    own = path.filter(pl.col("kernel_id") == roles["kernel_id"][0])["step"] if roles is not None and roles.height else None
    picked = spaced_steps(path["step"], max_steps, also=own)
    k = path.filter(pl.col("step").is_in(picked.implode()), pl.col("layer").is_not_null(),
                    pl.col("family").is_not_null()).select(
        "kernel_id", "step", "layer", "family", "name", "launch_rank", "start", "end", "on_path", "critical_ns")
    # One integer per segment (step, layer, family): grouping and windows on it, not on three
    # columns of which one is a string.
    k = k.with_columns(pl.col("family").cast(pl.Categorical).to_physical().cast(pl.Int64).alias("fam"))
    layers, fams = int(k["layer"].max() or 0) + 1, int(k["fam"].max() or 0) + 1
    k = k.with_columns((pl.col("step") * (layers * fams) + pl.col("layer") * fams + pl.col("fam")).alias("segment"))
    k = k.sort("segment", "launch_rank").with_columns(
        pl.int_range(pl.len()).over("segment").alias("position"),
        (pl.col("start") - pl.col("start").min().over("segment")).alias("start_off")).with_columns(
        (pl.col("end") - pl.col("start") + pl.col("start_off")).alias("end_off"))
    segments = k.group_by("segment").agg(
        pl.col("family").first(), pl.col("name").str.join(SEQUENCE_SEP).alias("sequence"), pl.len().alias("kernels"),
        pl.col("end_off").max().alias("span"))
    steps = k["step"].n_unique()
    counts = segments.group_by("family", "sequence").agg(pl.len().alias("segments"), pl.col("kernels").first(),
                                                        (pl.col("span").median() / 1e3).alias("span_us"))
    # Most frequent first; ties by the sequence itself, so that the numbering never varies.
    counts = counts.sort("family", "segments", "sequence", descending=[False, True, False]).with_columns(
        pl.int_range(pl.len()).over("family").alias("kind"),
        (pl.col("segments") / pl.col("segments").sum().over("family")).alias("share"),
        (pl.col("segments") / steps).alias("segments_per_step"))
    k = k.join(segments.select("segment", "sequence"), on="segment").join(
        counts.select("family", "sequence", "kind"), on=["family", "sequence"])
    kernels = k.group_by("family", "kind", "position").agg(
        pl.col("name").first(),
        (pl.col("start_off").median() / 1e3).alias("start_us"),
        (pl.col("end_off").median() / 1e3).alias("end_us"),
        ((pl.col("end") - pl.col("start")).median() / 1e3).alias("duration_us"),
        pl.col("on_path").cast(pl.Float64).mean().alias("on_path_share"),
        (pl.col("critical_ns").mean() / 1e3).alias("critical_us"))
    kernels = kernels.join(_position_roles(k, roles), on=["family", "kind", "position"], how="left")
    return Anatomy(
        kinds=counts.select("family", "kind", "kernels", "segments_per_step", "share", "span_us").sort("family", "kind"),
        kernels=kernels.select("family", "kind", "position", "name", "role", "start_us", "end_us", "duration_us",
                               "on_path_share", "critical_us").sort("family", "kind", "position"))


def spaced_steps(steps: pl.Series, most: int, also: pl.Series | None = None) -> pl.Series:
    """At most `most` of the distinct steps, evenly spaced from the first to the last (index
    round(i (n - 1) / (most - 1))), plus those of `also` (the step roles were read on)."""
    unique = steps.unique().sort()
    if unique.len() <= most:
        return unique
    picked = (unique.gather([round(i * (unique.len() - 1) / (most - 1)) for i in range(most)]) if most > 1
              else unique.head(most))
    return picked if also is None else pl.concat([picked, also.cast(picked.dtype)]).unique().sort()


def _position_roles(k: pl.DataFrame, roles: pl.DataFrame | None) -> pl.DataFrame:
    """family, kind, position -> role: that of the position's kernel in the first segment
    (lowest layer) of the kind within the step the roles come from."""
    if roles is None or "role" not in roles.columns:
        return pl.DataFrame(schema={"family": pl.String, "kind": pl.Int64, "position": pl.Int64, "role": pl.String})
    known = k.join(roles.select("kernel_id", "role"), on="kernel_id").filter(pl.col("role").is_not_null())
    first = known.group_by("family", "kind").agg(pl.col("layer").min())
    return known.join(first, on=["family", "kind", "layer"]).select(
        "family", pl.col("kind").cast(pl.Int64), pl.col("position").cast(pl.Int64), "role")
