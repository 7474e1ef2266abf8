"""The tables K3 engineers build by hand for a kernel change (../shared/seeds/), produced from
analyses and diffs: an epilogue kernel before/after with the pre-attention window (seed 000),
the family residency table with a noise band (seed 001), and per-change ITL deltas next to
standalone per-layer time x layer count (seed 003)."""

from __future__ import annotations

from typing import Sequence

import polars as pl

from k3trace.analyses import Analysis
from k3trace.diff import diff


def _kernel_mean_us(a: Analysis, kernels: Sequence[str]) -> float:
    """Per-layer time of the named kernels: sum of mean x calls, over the calls per step of
    the most-called one (one call per layer for the kernels these tables name)."""
    rows = a.kernel_table.filter(pl.col("name").is_in(list(kernels)))
    return float((rows["mean_us"] * rows["calls_per_step"]).sum() / max(rows["calls_per_step"].max() or 1, 1))


def epilogue_table(old: Analysis, new: Analysis, kernel: str) -> pl.DataFrame:
    """Seed 000: the kernel's mean, the pre-attention window, step span and ITL, old -> new."""
    def row(a: Analysis) -> dict:
        pre = a.pre_attention_summary or {}
        return {"kernel mean us": _kernel_mean_us(a, [kernel]),
                "pre-attention window us": pre.get("median"), "window samples": pre.get("count"),
                "stable step span us": a.step_stats["span"]["median"], "ITL (period) us": a.step_stats["period"]["median"]}

    o, n = row(old), row(new)
    return pl.DataFrame([{"metric": k, "old": o[k], "new": n[k],
                          "change": None if o[k] is None or n[k] is None else n[k] - o[k]} for k in o])


def residency_table(old: Sequence[Analysis], new: Sequence[Analysis],
                    zero_change: Sequence[Analysis] = ()) -> pl.DataFrame:
    """Seed 001: family x segments/step x device busy x two-stream residency x share of busy,
    old and new (medians over runs); the noise band of each from the zero-change runs
    (largest difference between two runs of one build)."""
    fields = ("segments_per_step", "device_busy_us", "two_stream_residency_us", "share_of_busy")

    def side(runs: Sequence[Analysis]) -> pl.DataFrame:
        return pl.concat([a.families.select("family", *fields) for a in runs]).group_by("family").agg(
            pl.col(f).median() for f in fields)

    table = side(old).join(side(new), on="family", how="full", suffix="_new", coalesce=True).fill_null(0.0)
    if len(zero_change) >= 2:
        rows = pl.concat([a.families.select("family", "device_busy_us", "two_stream_residency_us") for a in zero_change])
        band = rows.group_by("family").agg(
            (pl.col("device_busy_us").max() - pl.col("device_busy_us").min()).alias("busy_noise_us"),
            (pl.col("two_stream_residency_us").max() - pl.col("two_stream_residency_us").min()).alias("residency_noise_us"))
        table = table.join(band, on="family", how="left")
    return table.sort("device_busy_us", descending=True)


def change_table(changes: Sequence[tuple[str, Analysis, Analysis, Sequence[str], Sequence[str], int]]) -> pl.DataFrame:
    """Seed 003: per change (label, old, new, old kernels, new kernels, layers at full depth):
    the measured ITL delta with its noise band and verdict, and the standalone estimate:
    (new - old per-layer kernel time) x the number of layers the change touches."""
    rows = []
    for label, old, new, old_kernels, new_kernels, layers in changes:
        d = diff([old], [new])
        calls = max(int(new.kernel_table.filter(pl.col("name").is_in(list(new_kernels)))["calls_per_step"].max() or 1), 1)
        per_layer_old = _kernel_mean_us(old, old_kernels)
        per_layer_new = _kernel_mean_us(new, new_kernels)
        names = set(old_kernels) | set(new_kernels)
        edits = d.attribution.filter(pl.col("edit").map_elements(
            lambda e: any(n in e for n in names), return_dtype=pl.Boolean))
        rows.append({
            "change": label, "ITL delta us": d.itl_delta_us, "noise band us": d.noise_band_us, "verdict": d.verdict,
            "attributed to the edit us": float(edits["contribution_us"].sum()),
            "per-layer kernel us old": per_layer_old, "per-layer kernel us new": per_layer_new,
            "layers (full depth)": layers, "standalone x layers us": (per_layer_new - per_layer_old) * layers,
            "layers in trace": calls,
        })
    return pl.DataFrame(rows)


def noise_of(runs: Sequence[Analysis]) -> float | None:
    """Largest difference of median step period between runs of one build (us)."""
    periods = [a.step_stats["period"]["median"] for a in runs]
    return max(periods) - min(periods) if len(periods) > 1 else None

