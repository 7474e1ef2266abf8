"""diff(): which kernel change moved the ITL between two builds, and by how much.

Each side is one report or several repeated runs of one build. Central values per side are
the median over runs of each run's stable-step median. The span delta is attributed to
edits (replacements, duration, dependency and gap changes) by Shapley values over the
replayed union of both builds' step graphs (attribution.py, edits.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import polars as pl

from k3trace.analyses import Analysis
from k3trace.diff import noise
from k3trace.diff.attribution import Attribution, attribute
from k3trace.diff.coupling import FLOOR_NS, REASONS
from k3trace.diff.edits import STRUCTURE
from k3trace.diff.matching import ADDED, MATCHED, ONLY_NEW, ONLY_OLD, REMOVED, match_nodes
from k3trace.diff.segments import segment_table, windows_total

JSON_VERSION = 3
FAMILY_FIELDS = ("segments_per_step", "device_busy_us", "two_stream_residency_us", "share_of_busy", "exposed_us",
                 "critical_us")
#: The replay explains a change when it lands within this share of the measured span delta
#: (or within the span's noise band, whichever is larger).
EXPLAINED_SHARE = 0.02
#: A row's recorded change the step did not take (Diff.not_taken): at least this many us a
#: step (or the span's noise band), and the step took less than this share of it.
NOT_TAKEN_FLOOR_US, NOT_TAKEN_SHARE = 1.0, 0.25


@dataclass(frozen=True)
class Diff:
    old: tuple[Analysis, ...]
    new: tuple[Analysis, ...]
    itl_delta_us: float | None      # None where a run has one step (no period)
    span_delta_us: float
    host_delta_us: float | None     # likewise
    noise_band_us: float | None     # of the ITL (step period)
    span_noise_band_us: float | None
    noise_source: str | None        # repeats | resampling | None
    verdict_itl: str                # faster | slower | within_noise
    verdict_span: str
    matching: pl.DataFrame          # old_idx, new_idx, kind, layer, family, name, run
    attribution: pl.DataFrame       # one row per edit group, by |contribution| (see _table)
    edits: pl.DataFrame             # elementary edits: edit, player, kind, detail, family, layer, label, kernels
    base_span_us: float             # replayed old step
    modelled_us: float              # replayed new step minus replayed old step (= sum of contributions)
    mean_span_delta_us: float       # mean-span delta of the two replayed runs (what the replay models)
    residual_us: float              # mean_span_delta_us minus modelled: what the step graph misses
    exact: bool                     # Shapley values exact, or sampled (stderr_us per row)
    orders: int
    families: pl.DataFrame          # family, <field>_old, <field>_new
    pre_attention: dict[str, dict[str, float | int] | None]
    pdl_coupled: pl.DataFrame       # group, player, reason, edit, kind, family, layers, contribution_us (coupling.py)
    dram: pl.DataFrame | None = None  # where every run of both builds has DRAM metrics: _dram's rows
    segments: pl.DataFrame | None = None  # per segment kind old / new time and us per step (segments.py)

    @property
    def verdict(self) -> str:
        """The ITL verdict (what a user feels per token); the GPU span's where a run of one
        step leaves no step period to compare."""
        return self.verdict_span if self.verdict_itl == noise.NO_PERIOD else self.verdict_itl

    @property
    def segments_total(self) -> dict[str, float] | None:
        """The segment windows' us per step summed: old, new, delta (segments.windows_total)."""
        return None if self.segments is None else windows_total(self.segments)

    @property
    def skew_us(self) -> float:
        """Measured (median) span delta minus the replayed runs' mean-span delta: a change in
        the shape of the step-time distribution (and, with repeats, in which run is replayed),
        not in any kernel. The replay models means, since means of kernel times add up."""
        return self.span_delta_us - self.mean_span_delta_us

    @property
    def explained_tolerance_us(self) -> float:
        return max(EXPLAINED_SHARE * abs(self.span_delta_us), self.span_noise_band_us or 0.0)

    @property
    def explained(self) -> bool:
        """Whether replaying every edit reproduces the measured span delta."""
        return abs(self.residual_us) <= self.explained_tolerance_us

    @property
    def structure(self) -> str | None:
        """Layers present in one build only, kept out of the kernel edits."""
        rows = self.attribution.filter(pl.col("kind") == STRUCTURE)
        return rows["edit"][0] if rows.height else None

    @property
    def across_labels(self) -> bool:
        """Whether kernels were matched over the whole step, the labels disagreeing (matching.py)."""
        return bool(self.matching["across_labels"].any())

    @property
    def incomplete(self) -> list[str]:
        """Reports of either side whose capture is incomplete."""
        return [a.report for a in (*self.old, *self.new) if not a.completeness.ok]

    def summary(self) -> str:
        """The verdict in one sentence, span and host share apart."""
        words = {noise.FASTER: "faster", noise.SLOWER: "slower", noise.WITHIN_NOISE: "within noise"}
        if self.itl_delta_us is None:
            return (f"GPU step span {self.span_delta_us:+.2f} us ({words[self.verdict_span]}); no ITL: a run of one "
                    "step has no step period")
        if self.verdict_span == noise.WITHIN_NOISE and self.verdict_itl != noise.WITHIN_NOISE:
            return (f"GPU work unchanged; ITL moved by {self.itl_delta_us:+.2f} us of host/launch time "
                    f"(span {self.span_delta_us:+.2f} us is within noise)")
        host = "-" if self.host_delta_us is None else f"{self.host_delta_us:+.2f} us"
        return (f"ITL {self.itl_delta_us:+.2f} us/step ({words[self.verdict_itl]}); GPU step span "
                f"{self.span_delta_us:+.2f} us ({words[self.verdict_span]}); host share {host}")

    def caveats(self) -> list[str]:
        """What the reader must know before trusting the verdict or the ranking."""
        out = []
        if self.noise_source == "resampling":
            out.append("noise band from resampling steps within each run: it misses run-to-run drift; "
                       "record repeats and pass --old A1 --old A2 --new B1 --new B2")
        elif self.noise_source is None:
            out.append("too few stable steps for a noise band")
        if self.itl_delta_us is None:
            out.append("a run of one stable step has no step period: no ITL to compare, and the verdict is the GPU "
                       "span's; record at least two decode steps per run")
        if self.span_noise_band_us is not None and abs(self.skew_us) > self.span_noise_band_us:
            out.append(f"the median step moved {self.skew_us:+.2f} us more than the mean step: the step-time "
                       f"distribution changed shape (the edits add up to the mean's change)")
        if not self.explained:
            out.append(f"the step-graph replay does not explain this change: it reproduces "
                       f"{self.modelled_us:+.2f} of {self.mean_span_delta_us:+.2f} us ({self.residual_us:+.2f} us "
                       f"unexplained, tolerance {self.explained_tolerance_us:.2f} us); the ranking is partial")
        if self.structure:
            out.append(f"the builds differ in structure ({self.structure}): that part is one row, not kernel edits")
        if self.across_labels:
            out.append("the builds' layer/family labels share no segment, so kernels were aligned over the whole "
                       "step; edits carry the old build's labels (label both alike, or pass --labels-from)")
        if self.incomplete:
            out.append("incomplete capture on " + ", ".join(self.incomplete) + ": the verdict and the edits rest on "
                       "damaged data (see each side's completeness); record again")
        if not self.exact:
            out.append(f"contributions sampled over {self.orders} orders of applying the edits (stderr per row)")
        return out

    def waterfall(self, top: int = 12) -> pl.DataFrame:
        """Old span -> top edits -> the rest -> residual -> new span, as (label, kind, value_us),
        with `change_us` (the same steps measured from the old span: 0, each edit's
        contribution, ..., the span delta) and, on edit rows, the edit's fields (`edit`,
        `edit_kind`, `detail`, `family`, `layers`, `stderr_us`; null elsewhere)."""
        old_span = statistics.median(a.step_stats["span"]["median"] for a in self.old)
        head = self.attribution.head(top)
        rest = float(self.attribution["contribution_us"].sum() - head["contribution_us"].sum())
        none = (None, None, None, None, None, None)
        rows = [("old span", "absolute", old_span, 0.0, *none)]
        rows += [(f"{r['edit'][:48]} ({r['family']})", "relative", r["contribution_us"], r["contribution_us"],
                  r["edit"], r["kind"], r["detail"], r["family"], r["layers"], r["stderr_us"])
                 for r in head.iter_rows(named=True)]
        rows += [(f"{max(self.attribution.height - top, 0)} other edits", "relative", rest, rest, *none),
                 ("residual (not modelled)", "relative", self.residual_us, self.residual_us, *none),
                 ("median vs mean step", "relative", self.skew_us, self.skew_us, *none),
                 ("new span", "total", old_span + self.span_delta_us, self.span_delta_us, *none)]
        return pl.DataFrame(rows, schema={
            "label": pl.String, "kind": pl.String, "value_us": pl.Float64, "change_us": pl.Float64,
            "edit": pl.String, "edit_kind": pl.String, "detail": pl.String, "family": pl.String,
            "layers": pl.List(pl.Int64), "stderr_us": pl.Float64}, orient="row")

    def not_taken(self) -> pl.DataFrame:
        """Rows whose kernels' own recorded change is real (at least max(1 us, the span's noise
        band) a step) but of which the replayed step took less than NOT_TAKEN_SHARE: a kernel
        made faster beside the other stream, or ahead of a wait that holds the step anyway.
        What an engineer measures standalone and does not see in the ITL; largest first."""
        floor = max(NOT_TAKEN_FLOOR_US, self.span_noise_band_us or 0.0)
        return self.attribution.filter(
            pl.col("recorded_us").abs() >= floor,
            pl.col("contribution_us").abs() < NOT_TAKEN_SHARE * pl.col("recorded_us").abs(),
        ).sort(pl.col("recorded_us").abs(), descending=True).select(
            "edit", "kind", "family", "layers", "recorded_us", "contribution_us", "recorded_by_layer")

    def read_together(self) -> list[dict[str, Any]]:
        """The groups of attribution rows whose recorded time moved across PDL edges, or whose
        join inferred from timing moved with a leg (coupling.py): a replacement's released rows
        first, then traded rows, then joined ones, each kind by its largest row: each its `rows` (edit, kind, family, layers, contribution_us, by
        |contribution|), `sum_us`, what the trace supports for them together, `reasons` (of
        coupling.REASONS, in its order: "released", "joined", "traded") and `reason`, the
        first of them."""
        out = []
        for (_,), rows in self.pdl_coupled.group_by("group", maintain_order=True):
            rows = rows.sort(pl.col("contribution_us").abs(), descending=True)
            reasons = [r for r in REASONS if r in set(rows["reason"])]
            out.append({"rows": rows.select("edit", "kind", "family", "layers", "contribution_us").to_dicts(),
                        "sum_us": float(rows["contribution_us"].sum()), "reason": reasons[0], "reasons": reasons})
        return out

    def edit_breakdown(self) -> dict[int, dict[str, Any]]:
        """Per attribution row (player): `kinds`, its elementary edits counted by kind
        ({"duration": 6, "gap": 1}), and `details`, the distinct details of them as a list
        (the row's `kind` and `detail` join these into text)."""
        out: dict[int, dict[str, Any]] = {}
        for player, kind, detail in self.edits.select("player", "kind", "detail").iter_rows():
            row = out.setdefault(int(player), {"kinds": {}, "details": set()})
            row["kinds"][kind] = row["kinds"].get(kind, 0) + 1
            row["details"].update(x for x in (detail or "").split(", ") if x)
        return {p: {"kinds": r["kinds"], "details": sorted(r["details"])} for p, r in out.items()}

    def segment_changes(self) -> pl.DataFrame:
        """Per (layer, family): matched kernels, and the names added or removed there."""
        m = self.matching
        return (
            m.group_by("layer", "family")
            .agg(
                (pl.col("kind") == MATCHED).sum().alias("matched"),
                pl.col("name").filter(pl.col("kind") == ADDED).alias("added"),
                pl.col("name").filter(pl.col("kind") == REMOVED).alias("removed"),
            )
            .filter((pl.col("added").list.len() > 0) | (pl.col("removed").list.len() > 0))
            .sort("layer", "family", nulls_last=True)
        )

    def to_json(self) -> dict[str, Any]:
        breakdown = self.edit_breakdown()
        return {
            "version": JSON_VERSION,
            "old": [a.report for a in self.old],
            "new": [a.report for a in self.new],
            "itl_delta_us": self.itl_delta_us,
            "span_delta_us": self.span_delta_us,
            "host_delta_us": self.host_delta_us,
            "noise_band_us": self.noise_band_us,
            "span_noise_band_us": self.span_noise_band_us,
            "noise_source": self.noise_source,
            "verdict": self.verdict,
            "verdict_itl": self.verdict_itl,
            "verdict_span": self.verdict_span,
            "summary": self.summary(),
            "caveats": self.caveats(),
            "attribution": [
                {**row, **breakdown.get(player, {"kinds": {}, "details": []})}
                for player, row in zip(self.attribution["player"].to_list(), self.attribution.select(
                    "edit", "kind", "detail", "family", "layers", "contribution_us", "stderr_us", "share", "edits",
                    "kernels", "recorded_us", "recorded_by_layer").to_dicts())],
            "not_taken": self.not_taken().select("edit", "kind", "family", "layers", "recorded_us",
                                                 "contribution_us").to_dicts(),
            "replayed_old_span_us": self.base_span_us,
            "modelled_us": self.modelled_us,
            "mean_span_delta_us": self.mean_span_delta_us,
            "residual_us": self.residual_us,
            "median_vs_mean_us": self.skew_us,
            "explained": self.explained,
            "explained_tolerance_us": self.explained_tolerance_us,
            "shapley": {"exact": self.exact, "orders": self.orders},
            "structure": self.structure,
            "matched_across_labels": self.across_labels,
            "incomplete": self.incomplete,
            "sides": {"old": [a.trust() for a in self.old], "new": [a.trust() for a in self.new]},
            "matching": {kind: int(n) for kind, n in self.matching.group_by("kind").len().iter_rows()},
            "families": [
                {"name": r["family"], "old": {f: r[f"{f}_old"] for f in FAMILY_FIELDS},
                 "new": {f: r[f"{f}_new"] for f in FAMILY_FIELDS}}
                for r in self.families.iter_rows(named=True)
            ],
            "pre_attention_window_us": self.pre_attention,
            "read_together": self.read_together(),
            **({"dram": self.dram.to_dicts()} if self.dram is not None else {}),
            **({"segments": {"kinds": self.segments.to_dicts(), "total_us_per_step": self.segments_total}}
               if self.segments is not None else {}),
        }


def _median_of_runs(runs: Sequence[Analysis], key: str) -> float | None:
    """The median over runs of each run's median; None where a run has none (a run of one
    step has no period and no host share)."""
    values = [a.step_stats[key]["median"] for a in runs]
    return None if any(v is None for v in values) else statistics.median(values)


def _delta(new: float | None, old: float | None) -> float | None:
    return None if new is None or old is None else new - old


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


#: _dram's per-run values: (column, its Analysis.dram source).
DRAM_FIELDS = ("per_step", "time_us", "read_mb", "idle_us")


def _dram(old: Sequence[Analysis], new: Sequence[Analysis]) -> pl.DataFrame | None:
    """Where HBM idled in each build (docs/metrics.md, "DRAM"), only where every run of both
    has DRAM metrics: per segment kind its windows per step, median time, bytes read and
    idle-equivalent (time - bytes/peak), old and new, and that idle-equivalent times the
    windows per step (`idle_us_per_step`: what the kind adds to the step's); a first row,
    kind `step`, the step's own (span, bytes, idle-equivalent). Each value is the median over
    the runs of each run's median."""
    if not old or not new or any(a.dram is None for a in (*old, *new)):
        return None

    def run_rows(a: Analysis) -> pl.DataFrame:
        d = a.dram
        us_per_mb = 1e12 / d.peak_bytes_per_s  # us a MB takes at the peak
        s = d.summary()
        step = pl.DataFrame({"kind": ["step"], "per_step": [1.0], "time_us": [s["span_us"]],
                             "read_mb": [s["read_gb_per_step"] * 1e3], "idle_us": [s["idle_equivalent_us"]]})
        kinds = d.kinds.select("kind", pl.col("per_step").cast(pl.Float64), "time_us", "read_mb",
                               (pl.col("time_us") - pl.col("read_mb") * us_per_mb).alias("idle_us"))
        return pl.concat([step, kinds])

    def side(runs: Sequence[Analysis], suffix: str) -> pl.DataFrame:
        rows = pl.concat([run_rows(a) for a in runs])
        return rows.group_by("kind", maintain_order=True).agg(
            pl.col(f).median().alias(f"{f}_{suffix}") for f in DRAM_FIELDS)

    joined = side(old, "old").join(side(new, "new"), on="kind", how="full", coalesce=True, maintain_order="left")
    per_step = {sfx: pl.col(f"idle_us_{sfx}") * pl.col(f"per_step_{sfx}") for sfx in ("old", "new")}
    return joined.with_columns(
        per_step["old"].alias("idle_us_per_step_old"), per_step["new"].alias("idle_us_per_step_new"),
        (per_step["new"].fill_null(0.0) - per_step["old"].fill_null(0.0)).alias("idle_us_per_step_delta"),
    ).sort(pl.col("kind") != "step", "kind")


def _table(attr: Attribution, span_delta_us: float, recorded: pl.DataFrame) -> pl.DataFrame:
    """One row per player: the edit's name, kind, family, layers, contribution and its share of
    the measured span delta, and the recorded change of the kernels it owns (a duration edit's,
    a replacement's added and removed ones: `recorded_us`, and per layer); sorted by |contribution|."""
    share = (pl.col("contribution_us") / span_delta_us) if abs(span_delta_us) > 0 else pl.lit(None, pl.Float64)
    return attr.players.select(
        "player", pl.col("label").alias("edit"), "kind", "detail", "family",
        "layers",
        (pl.col("contribution_ns") / 1e3).alias("contribution_us"), (pl.col("stderr_ns") / 1e3).alias("stderr_us"),
        "edits", "kernels",
    ).with_columns(share.alias("share")).join(recorded, on="player", how="left").with_columns(
        pl.col("recorded_by_layer").fill_null(pl.lit([], dtype=recorded.schema["recorded_by_layer"])),
    ).sort(pl.col("contribution_us").abs(), "player", descending=[True, False])


def _recorded_by_player(recorded: pl.DataFrame) -> pl.DataFrame:
    """player, recorded_us (null where it owns no kernel's duration or presence), recorded_by_layer
    (layer, recorded_us)."""
    return recorded.group_by("player").agg(
        (pl.col("recorded_ns").sum() / 1e3).alias("recorded_us"),
        pl.struct("layer", (pl.col("recorded_ns") / 1e3).alias("recorded_us")).sort_by("layer").alias(
            "recorded_by_layer"))


def _noise(old: Sequence[Analysis], new: Sequence[Analysis], key: str) -> tuple[float | None, str | None]:
    """Zero-change spread of the repeats; never narrower than the within-run resampling
    band (two repeats can agree by chance to the nanosecond)."""
    a, b = _representative(old), _representative(new)
    values = [x.step_times[key].drop_nulls().cast(pl.Float64).to_numpy() / 1e3 for x in (a, b)]
    resampled = noise.from_resampling(values[0], values[1])
    if len(old) > 1 or len(new) > 1:
        spread = noise.from_repeats([x.step_stats[key]["median"] for x in old],
                                    [x.step_stats[key]["median"] for x in new])
        return max(v for v in (spread, resampled) if v is not None), "repeats"
    return resampled, ("resampling" if resampled is not None else None)


def diff(old: Sequence[Analysis], new: Sequence[Analysis], *, seed: int = 0) -> Diff:
    old, new = tuple(old), tuple(new)
    itl = _delta(_median_of_runs(new, "period"), _median_of_runs(old, "period"))
    span_delta = _median_of_runs(new, "span") - _median_of_runs(old, "span")
    host = _delta(_median_of_runs(new, "host"), _median_of_runs(old, "host"))
    band, source = _noise(old, new, "period")
    span_band, _ = _noise(old, new, "span")
    rep_old, rep_new = _representative(old), _representative(new)
    g_old, g_new = rep_old.graph, rep_new.graph
    mean_delta = (rep_new.step_times["span"].mean() - rep_old.step_times["span"].mean()) / 1e3
    match = match_nodes(g_old, g_new)
    # A coupled pair's rows must each lie beyond the span's noise band (coupling.py).
    attr = attribute(g_old, g_new, match, seed=seed,
                     coupling_floor_ns=max(FLOOR_NS, (span_band or 0.0) * 1e3))
    table = _table(attr, span_delta, _recorded_by_player(attr.recorded))
    coupled = attr.coupled.join(table.select("player", "edit", "kind", "family", "layers", "contribution_us"),
                                on="player").sort("group", "player")
    modelled = attr.modelled_ns / 1e3
    values = (itl, span_delta, host, modelled, attr.base_span_ns, mean_delta)
    if not all(math.isfinite(v) for v in values if v is not None):  # a bug, never a number to print
        raise ValueError(f"diff produced a non-finite value: {values}")
    return Diff(
        old=old, new=new,
        itl_delta_us=itl, span_delta_us=span_delta, host_delta_us=host,
        noise_band_us=band, span_noise_band_us=span_band, noise_source=source,
        verdict_itl=noise.verdict(itl, band), verdict_span=noise.verdict(span_delta, span_band),
        matching=match, attribution=table, edits=attr.edits,
        base_span_us=attr.base_span_ns / 1e3, modelled_us=modelled, mean_span_delta_us=mean_delta,
        residual_us=mean_delta - modelled,
        exact=attr.exact, orders=attr.orders,
        families=_families(old, new),
        pre_attention={"old": _representative(old).pre_attention_summary,
                       "new": _representative(new).pre_attention_summary},
        pdl_coupled=coupled,
        dram=_dram(old, new),
        segments=segment_table(old, new),
    )


__all__ = ["ADDED", "MATCHED", "ONLY_NEW", "ONLY_OLD", "REMOVED", "Diff", "diff"]
