"""diff(): which kernel change moved the ITL between two builds, and by how much.

Each side is one report or several repeated runs of one build. Central values per side are
the median over runs of each run's stable-step median. The span delta is attributed
counterfactually on the old build's representative step graph (attribution.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import polars as pl

from k3trace.analyses import Analysis
from k3trace.diff import noise
from k3trace.diff.attribution import Attribution, attribute
from k3trace.diff.matching import ADDED, REMOVED, match_nodes

JSON_VERSION = 1
FAMILY_FIELDS = ("segments_per_step", "device_busy_us", "two_stream_residency_us", "share_of_busy", "exposed_us",
                 "critical_us")


@dataclass(frozen=True)
class Diff:
    old: tuple[Analysis, ...]
    new: tuple[Analysis, ...]
    itl_delta_us: float
    span_delta_us: float
    host_delta_us: float
    noise_band_us: float | None
    noise_source: str | None        # repeats | resampling | None
    verdict: str
    matching: pl.DataFrame          # old_idx, new_idx, kind, layer, family, name
    changes: pl.DataFrame           # one row per change with its replayed delta
    attribution: pl.DataFrame       # grouped by kernel and family, sorted by |delta|
    base_span_us: float
    modelled_us: float
    interaction_us: float
    residual_us: float
    families: pl.DataFrame          # family, <field>_old, <field>_new
    pre_attention: dict[str, dict[str, float | int] | None]

    def waterfall(self, top: int = 12) -> pl.DataFrame:
        """Old span -> top contributions -> the rest -> interaction -> residual -> new span,
        as (label, kind, value_us) rows for a waterfall chart."""
        old_span = statistics.median(a.step_stats["span"]["median"] for a in self.old)
        head = self.attribution.head(top)
        rest = float(self.attribution["delta_us_per_step"].sum() - head["delta_us_per_step"].sum())
        rows = [("old span", "absolute", old_span)]
        rows += [(f"{r['kernel'][:40]} ({r['family']})", "relative", r["delta_us_per_step"])
                 for r in head.iter_rows(named=True)]
        rows += [(f"{max(self.attribution.height - top, 0)} other kernels", "relative", rest),
                 ("interaction", "relative", self.interaction_us), ("residual (not modelled)", "relative", self.residual_us),
                 ("new span", "total", old_span + self.span_delta_us)]
        return pl.DataFrame(rows, schema={"label": pl.String, "kind": pl.String, "value_us": pl.Float64}, orient="row")

    def segment_changes(self) -> pl.DataFrame:
        """Per (layer, family): matched kernels, and the names added or removed there."""
        m = self.matching
        return (
            m.group_by("layer", "family")
            .agg(
                (pl.col("kind") == "matched").sum().alias("matched"),
                pl.col("name").filter(pl.col("kind") == ADDED).alias("added"),
                pl.col("name").filter(pl.col("kind") == REMOVED).alias("removed"),
            )
            .filter((pl.col("added").list.len() > 0) | (pl.col("removed").list.len() > 0))
            .sort("layer", "family", nulls_last=True)
        )

    @property
    def unexplained_us(self) -> float:
        """Measured span delta minus the sum of single-change contributions."""
        return self.interaction_us + self.residual_us

    def to_json(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "old": [a.report for a in self.old],
            "new": [a.report for a in self.new],
            "itl_delta_us": self.itl_delta_us,
            "span_delta_us": self.span_delta_us,
            "host_delta_us": self.host_delta_us,
            "noise_band_us": self.noise_band_us,
            "noise_source": self.noise_source,
            "verdict": self.verdict,
            "attribution": self.attribution.select(
                "kernel", "family", "layer_scope", "delta_us_per_step", "share", "kinds", "changes"
            ).to_dicts(),
            "attributed_us": float(self.attribution["delta_us_per_step"].sum()),
            "interaction_us": self.interaction_us,
            "modelled_us": self.modelled_us,
            "residual_us": self.residual_us,
            "unexplained_us": self.unexplained_us,
            "replayed_old_span_us": self.base_span_us,
            "matching": {kind: int(n) for kind, n in self.matching.group_by("kind").len().iter_rows()},
            "families": [
                {"name": r["family"], "old": {f: r[f"{f}_old"] for f in FAMILY_FIELDS},
                 "new": {f: r[f"{f}_new"] for f in FAMILY_FIELDS}}
                for r in self.families.iter_rows(named=True)
            ],
            "pre_attention_window_us": self.pre_attention,
        }


def layer_scope(layers: list[int | None]) -> str:
    """`4` / `4, 8` / `4..92 (24 layers)` / `-` when the kernels carry no layer."""
    known = sorted({int(x) for x in layers if x is not None})
    if not known:
        return "-"
    if len(known) <= 3:
        return ", ".join(map(str, known))
    return f"{known[0]}..{known[-1]} ({len(known)} layers)"


def _median_of_runs(runs: Sequence[Analysis], key: str) -> float:
    return statistics.median(a.step_stats[key]["median"] for a in runs)


def _representative(runs: Sequence[Analysis]) -> Analysis:
    spans = [a.step_stats["span"]["median"] for a in runs]
    target = statistics.median(spans)
    return runs[int(np.argmin([abs(s - target) for s in spans]))]


def _families(old: Sequence[Analysis], new: Sequence[Analysis]) -> pl.DataFrame:
    def side(runs: Sequence[Analysis], suffix: str) -> pl.DataFrame:
        rows = pl.concat([a.families.select("family", *FAMILY_FIELDS) for a in runs])
        return rows.group_by("family").agg(pl.col(f).median().alias(f"{f}_{suffix}") for f in FAMILY_FIELDS)

    joined = side(old, "old").join(side(new, "new"), on="family", how="full", coalesce=True)
    return joined.fill_null(0.0).sort("device_busy_us_old", descending=True)


def _grouped(attr: Attribution, span_delta_ns: float) -> pl.DataFrame:
    rows = []
    for (name, family), group in attr.changes.group_by("name", "family", maintain_order=True):
        delta = float(group["delta_ns"].sum())
        kinds = {k: int(n) for k, n in group.group_by("kind").len().iter_rows()}
        rows.append({
            "kernel": name, "family": family, "layer_scope": layer_scope(group["layer"].to_list()),
            "delta_us_per_step": delta / 1e3,
            "share": delta / span_delta_ns if abs(span_delta_ns) > 0 else None,
            "kinds": ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())), "changes": group.height,
        })
    schema = {"kernel": pl.String, "family": pl.String, "layer_scope": pl.String, "delta_us_per_step": pl.Float64,
              "share": pl.Float64, "kinds": pl.String, "changes": pl.Int64}
    frame = pl.DataFrame(rows, schema=schema)
    return frame.sort(pl.col("delta_us_per_step").abs(), descending=True)


def _noise(old: Sequence[Analysis], new: Sequence[Analysis]) -> tuple[float | None, str | None]:
    """Zero-change spread of the repeats; never narrower than the within-run resampling
    band (two repeats can agree by chance to the nanosecond)."""
    a, b = _representative(old), _representative(new)
    periods = [x.step_times["period"].drop_nulls().cast(pl.Float64).to_numpy() / 1e3 for x in (a, b)]
    resampled = noise.from_resampling(periods[0], periods[1])
    if len(old) > 1 or len(new) > 1:
        spread = noise.from_repeats([x.step_stats["period"]["median"] for x in old],
                                    [x.step_stats["period"]["median"] for x in new])
        return max(v for v in (spread, resampled) if v is not None), "repeats"
    return resampled, ("resampling" if resampled is not None else None)


def diff(old: Sequence[Analysis], new: Sequence[Analysis]) -> Diff:
    old, new = tuple(old), tuple(new)
    itl = _median_of_runs(new, "period") - _median_of_runs(old, "period")
    span_delta = _median_of_runs(new, "span") - _median_of_runs(old, "span")
    host = _median_of_runs(new, "host") - _median_of_runs(old, "host")
    band, source = _noise(old, new)
    g_old, g_new = _representative(old).graph, _representative(new).graph
    match = match_nodes(g_old, g_new)
    attr = attribute(g_old, g_new, match)
    return Diff(
        old=old, new=new,
        itl_delta_us=itl, span_delta_us=span_delta, host_delta_us=host,
        noise_band_us=band, noise_source=source, verdict=noise.verdict(itl, band),
        matching=match, changes=attr.changes, attribution=_grouped(attr, span_delta * 1e3),
        base_span_us=attr.base_span_ns / 1e3, modelled_us=attr.modelled_ns / 1e3,
        interaction_us=attr.interaction_ns / 1e3, residual_us=span_delta - attr.modelled_ns / 1e3,
        families=_families(old, new),
        pre_attention={"old": _representative(old).pre_attention_summary,
                       "new": _representative(new).pre_attention_summary},
    )


__all__ = ["ADDED", "REMOVED", "Diff", "diff"]
