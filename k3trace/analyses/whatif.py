"""What-if: the step time a kernel change would buy, predicted on one build's step graph
before the change is written (the diff's replay, run forward).

Every stable step is replayed with its own measured durations and gaps (calibrated so the
unchanged replay reproduces that step exactly), with the change applied, and the change in
span is taken per step: the median is the prediction and the spread across steps its
range. A kernel with slack buys nothing until its slack is used up; one on the critical path
buys up to its saving; a removed or fused kernel keeps the order of what it waited for.

Changes (each restricted by family and layers when given):
- scale:  durations x factor;              delta: durations + time (clipped at 0);
- remove: the kernels take no time and no gap (what depended on them still waits for what
  they waited for);
- fuse:   consecutive kernels matching the patterns in order, in one segment, become the
  first of them with the given duration;
- no_pdl: PDL edges (same-stream gaps of a few ns) get the trace's median non-PDL gap;
  pdl: the matching kernels' binding same-stream edges get a PDL gap (1 ns).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import polars as pl

from k3trace.analyses import stepgraph
from k3trace.analyses.critical_path import JOIN, LAUNCH, STREAM
from k3trace.analyses.dram import segment_windows
from k3trace.analyses.result import Analysis
from k3trace.analyses.stepgraph import JOIN_SLOT, STREAM_SLOT, StepGraph
from k3trace.errors import ReportError
from k3trace.text import layer_text

SCALE, DELTA, REMOVE, FUSE, NO_PDL, PDL = "scale", "delta", "remove", "fuse", "no_pdl", "pdl"
PDL_GAP_NS = 1.0
JSON_VERSION = 2
RESAMPLES = 400


@dataclass(frozen=True)
class Change:
    kind: str                           # scale | delta | remove | fuse | no_pdl | pdl
    patterns: tuple[str, ...] = ()      # kernel-name regexes (fuse: one per kernel, in order)
    value: float = 0.0                  # factor (scale), ns (delta, fuse)
    family: str | None = None
    layers: tuple[int, ...] | None = None
    stream: str | None = None           # main | side: the stream most kernels use, or any other

    def describe(self) -> str:
        what = ",".join(self.patterns) or "every PDL edge"
        v = {SCALE: f" x{self.value:g}", DELTA: f" {self.value / 1e3:+g} us", FUSE: f" -> {self.value / 1e3:g} us"}
        where = "".join([f" in {self.family}" if self.family else "",
                         f" layers {layer_text(self.layers)}" if self.layers else "",
                         f" on the {self.stream} stream" if self.stream else ""])
        return f"{self.kind} {what}{v.get(self.kind, '')}{where}"

    def to_json(self) -> dict[str, Any]:
        """The change as data: `factor` for scale, `time_us` for delta and fuse; `text` as described."""
        value = ({"factor": self.value} if self.kind == SCALE else
                 {"time_us": self.value / 1e3} if self.kind in (DELTA, FUSE) else {})
        return {"kind": self.kind, "patterns": list(self.patterns), **value, "family": self.family,
                "layers": list(self.layers) if self.layers else None, "stream": self.stream, "text": self.describe()}


@dataclass(frozen=True)
class StepModel:
    """Per stable step: durations, input lags and CPU releases that replay it exactly."""

    graph: StepGraph
    duration: np.ndarray   # [S, n]
    lags: np.ndarray       # [S, n, SLOTS]
    launch: np.ndarray     # [S, n]
    span: np.ndarray       # [S] measured (= replayed unchanged)


@dataclass(frozen=True)
class WhatIf:
    report: str
    changes: tuple[Change, ...]
    kernels_changed: int                # graph nodes any change touched
    base_span_us: float                 # median measured span
    delta_us: float                     # median over stable steps of the predicted change
    delta_p10_us: float
    delta_p90_us: float
    uncertainty_us: float               # half-width of the 95% interval of that median
    steps: int
    critical: pl.DataFrame              # name, family, critical_us_before, critical_us_after, change_us
    slack: pl.DataFrame                 # name, family, added_us, slack_us, slack_used_us
    opportunities: pl.DataFrame         # name, family, calls_per_step, gain_us_if_2x_faster
    notes: tuple[str, ...] = field(default_factory=tuple)
    segments: pl.DataFrame | None = None  # kind, per_step, time_us_before/_after, change_us_per_step (_segments)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION, "report": self.report, "changes": [c.to_json() for c in self.changes],
            "kernels_changed": self.kernels_changed, "base_span_us": self.base_span_us,
            "predicted_span_us": self.base_span_us + self.delta_us,
            "delta_us": self.delta_us, "delta_p10_us": self.delta_p10_us, "delta_p90_us": self.delta_p90_us,
            "uncertainty_us": self.uncertainty_us, "steps": self.steps,
            "critical": self.critical.to_dicts(), "slack": self.slack.to_dicts(),
            "opportunities": self.opportunities.to_dicts(), "notes": list(self.notes),
            **({"segments": self.segments.to_dicts()} if self.segments is not None else {}),
        }


@dataclass(frozen=True)
class Ranking:
    """`k3trace whatif REPORT` with no change: where to start, before any change is named."""
    report: str
    base_span_us: float                 # median measured span
    steps: int
    opportunities: pl.DataFrame         # name, family, calls_per_step, gain_us_if_2x_faster

    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "report": self.report, "changes": [], "base_span_us": self.base_span_us,
                "steps": self.steps, "opportunities": self.opportunities.to_dicts()}


def ranking(a: Analysis, family: str | None = None) -> Ranking:
    if family is not None and family not in set(a.graph.nodes["family"].to_list()):
        raise ReportError(f"no kernel of family {family!r} in {a.report}",
                          "pick a family from `k3trace analyze`'s families table")
    return Ranking(report=a.report, base_span_us=float(a.step_stats["span"]["median"]), steps=a.stable_steps,
                   opportunities=opportunities(a, family=family))


def step_model(a: Analysis) -> StepModel:
    """Each stable step's own parameters on the representative step's graph: the input that
    released a kernel in that step gets exactly the gap it had, the others at most their
    slack, so replaying a step unchanged gives back its measured span."""
    g = a.graph
    ranks = g.nodes["launch_rank"].to_numpy()
    p = a.path.select("step", "launch_rank", "start", "end", "binding").sort("step", "launch_rank")
    steps = p["step"].unique().sort().to_numpy()
    wide = {c: p.pivot(on="launch_rank", index="step", values=c).sort("step") for c in ("start", "end")}
    cols = [str(r) for r in ranks]
    start, end = (wide[c].select(cols).to_numpy().astype(np.float64) for c in ("start", "end"))
    binding = p.pivot(on="launch_rank", index="step", values="binding").sort("step").select(cols).to_numpy()
    t0 = start.min(axis=1, keepdims=True)
    start, end = start - t0, end - t0
    duration = end - start
    n = g.size
    lags = np.zeros((len(steps), n, 2))
    for slot, kind in ((STREAM_SLOT, STREAM), (JOIN_SLOT, JOIN)):
        pred = g.preds[:, slot]
        has = pred >= 0
        gap = np.where(has, start - end[:, np.clip(pred, 0, None)], 0.0)
        lags[:, :, slot] = np.where(binding == kind, gap, np.minimum(gap, 0.0))
    # A binding input the representative graph lacks falls to the other slot, else the launch.
    bound = np.zeros_like(duration, dtype=bool)
    for slot, kind in ((STREAM_SLOT, STREAM), (JOIN_SLOT, JOIN)):
        bound |= (binding == kind) & (g.preds[:, slot] >= 0)[None, :]
    for slot in (STREAM_SLOT, JOIN_SLOT):
        pred = g.preds[:, slot]
        fallback = ~bound & (pred >= 0)[None, :] & (binding != LAUNCH)
        gap = start - end[:, np.clip(pred, 0, None)]
        lags[:, :, slot] = np.where(fallback, gap, lags[:, :, slot])
        bound |= fallback
    # Released by no input: it started when the CPU let it go (the step's first kernel at 0).
    launch = np.where(bound, 0.0, start)
    span = end.max(axis=1) - start.min(axis=1)
    return StepModel(graph=g, duration=duration, lags=lags, launch=launch, span=span)


def _selection(g: StepGraph, change: Change, pattern: str) -> np.ndarray:
    nodes = g.nodes
    try:
        mask = nodes["name"].str.contains(pattern).fill_null(False).to_numpy()
    except Exception:  # noqa: BLE001 - polars' regex engine refuses what Python's accepts
        raise ReportError(f"kernel pattern {pattern!r} is not a valid regular expression",
                          "write it in Rust regex syntax (no look-around or backreferences)") from None
    if change.family:
        mask &= (nodes["family"] == change.family).fill_null(False).to_numpy()
    if change.layers:
        mask &= nodes["layer"].is_in(list(change.layers)).fill_null(False).to_numpy()
    if change.stream:
        main = ~stepgraph.side_stream(g)
        mask &= main if change.stream == "main" else ~main
    return mask


def _fuse_runs(g: StepGraph, change: Change) -> list[list[int]]:
    """Node runs (in launch order, one segment) matching the patterns one after another."""
    masks = [_selection(g, change, pat) for pat in change.patterns]
    order = np.argsort(g.nodes["launch_rank"].to_numpy())
    key = list(zip(g.nodes["layer"].to_list(), g.nodes["family"].to_list()))
    runs, i, k = [], 0, len(masks)
    while i + k <= len(order):
        idx = order[i:i + k]
        if all(masks[j][idx[j]] for j in range(k)) and len({key[x] for x in idx}) == 1:
            runs.append([int(x) for x in idx])
            i += k
        else:
            i += 1
    return runs


def apply(model: StepModel, changes: Sequence[Change], non_pdl_gap_ns: float
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(duration, lags, launch, present, touched) with the changes applied, per step."""
    g = model.graph
    dur, lags, launch = model.duration.copy(), model.lags.copy(), model.launch.copy()
    present = np.ones(g.size, dtype=bool)
    touched = np.zeros(g.size, dtype=bool)
    pdl = g.nodes["pdl_start"].fill_null(False).to_numpy()

    def drop(sel: np.ndarray) -> None:
        dur[:, sel] = 0.0
        lags[:, sel, :] = np.minimum(lags[:, sel, :], 0.0)
        launch[:, sel] = 0.0
        present[sel] = False

    for c in changes:
        if c.kind == FUSE:
            runs = _fuse_runs(g, c)
            for run in runs:
                dur[:, run[0]] = c.value
                drop(np.array(run[1:], dtype=np.int64))
                touched[run] = True
            continue
        sel = np.zeros(g.size, dtype=bool)
        for pat in c.patterns or (".",):
            sel |= _selection(g, c, pat)
        if c.kind == SCALE:
            dur[:, sel] *= c.value
        elif c.kind == DELTA:
            dur[:, sel] = np.maximum(dur[:, sel] + c.value, 0.0)
        elif c.kind == REMOVE:
            drop(sel)
        elif c.kind == NO_PDL:
            sel &= pdl
            lags[:, sel, STREAM_SLOT] = np.maximum(lags[:, sel, STREAM_SLOT], non_pdl_gap_ns)
        elif c.kind == PDL:
            sel &= (g.preds[:, STREAM_SLOT] >= 0)
            lags[:, sel, STREAM_SLOT] = np.minimum(lags[:, sel, STREAM_SLOT], PDL_GAP_NS)
        touched |= sel
    return dur, lags, launch, present, touched


def _borrowed_tail_notes(g: StepGraph, before: np.ndarray, after: np.ndarray, touched: np.ndarray,
                         on_span: np.ndarray) -> list[str]:
    """Where a shortened kernel's recorded time may not be its own. A kernel that triggers its
    PDL dependents before its last store lets them launch while it still runs, and nsys then
    books the rest of its run to the dependent (on the bundled c6 -> c7 pair, early triggers
    only: situ_mul 31 -> 254 us per step, the grouped GEMM before it 261 -> 118). The trace
    does not say where a kernel triggers, so the prediction can only be bounded: removing a
    dependent removes its predecessor's tail too (an upper bound), and shortening a kernel
    leaves its own tail in an unchanged dependent (a lower bound). Only changes that act on the
    recorded span count (`on_span`: remove, scale, fuse); a --delta states the saving itself."""
    shortened = on_span & (after < before)
    pdl = g.nodes["pdl_start"].fill_null(False).to_numpy()
    pred = g.preds[:, STREAM_SLOT]
    holds = shortened & pdl & (pred >= 0) & ~touched[np.clip(pred, 0, None)]
    lends = np.zeros(g.size, dtype=bool)
    dependents = np.nonzero(pdl & (pred >= 0) & ~touched)[0]
    lends[pred[dependents]] = True
    lends &= shortened
    if not (holds.any() or lends.any()):
        return []
    sides = [f"{int(holds.sum())} start at an unchanged PDL predecessor's end (its tail may be booked to them, and "
             "is then taken away here: the gain overstated)" if holds.any() else "",
             f"{int(lends.sum())} release an unchanged PDL dependent (their own tail may be booked to it, and is then "
             "kept here: the gain understated)" if lends.any() else ""]
    return [f"of the {int(shortened.sum())} kernels made shorter, " + " and ".join(x for x in sides if x)
            + ". A kernel that triggers its dependents before its last store has nsys book the rest of its run to "
            "them; where the trace's kernels trigger after their last store neither applies. Modelling the pair "
            "(`--fuse PRED,KERNEL=TIME` at the predecessor's standalone time) bounds it"]


def _segments(g: StepGraph, before: np.ndarray, after: np.ndarray) -> pl.DataFrame | None:
    """Where along the model the prediction moves the step: the diff's segment windows (a
    (layer, family)'s first kernel start to the next one's; docs/metrics.md, "Diff",
    "Segments") on the replayed steps, before and after the change. Per kind: windows per
    step, their median time before and after, and the median over steps of the kind's summed
    change. None where no node has a layer."""
    nodes = g.nodes
    if nodes["layer"].is_null().all():
        return None
    # The graph's nodes carry no run ids: a run is a stretch of one (layer, family) in launch order.
    order = np.argsort(nodes["launch_rank"].to_numpy(), kind="stable")
    keys = list(zip(nodes["layer"].to_list(), nodes["family"].to_list()))
    run = np.empty(g.size, dtype=np.int64)
    current, previous = -1, object()
    for i in order:
        if keys[i] != previous:
            current, previous = current + 1, keys[i]
        run[i] = current
    steps = before.shape[0]

    def windows(start: np.ndarray) -> pl.DataFrame:
        frame = pl.DataFrame({
            "step": np.repeat(np.arange(steps, dtype=np.int64), g.size),
            "layer": np.tile(nodes["layer"].to_numpy(), steps), "family": np.tile(nodes["family"].to_numpy(), steps),
            "segment": np.tile(run, steps), "start": np.rint(start).astype(np.int64).ravel()})
        return segment_windows(frame).select("step", "layer", "family", "kind", (pl.col("end") - pl.col("start")).alias("t"))

    joined = windows(before).join(windows(after), on=["step", "layer", "family", "kind"], suffix="_after")
    per_step = joined.group_by("kind", "step").agg(pl.len().alias("n"), (pl.col("t_after") - pl.col("t")).sum().alias("d"))
    return joined.group_by("kind").agg(
        (pl.len() / steps).alias("per_step"), (pl.col("t").median() / 1e3).alias("time_us_before"),
        (pl.col("t_after").median() / 1e3).alias("time_us_after"),
    ).join(per_step.group_by("kind").agg((pl.col("d").median() / 1e3).alias("change_us_per_step")), on="kind").sort(
        pl.col("change_us_per_step").abs(), "kind", descending=[True, False])


def _non_pdl_gap(a: Analysis) -> float:
    """Median same-stream gap of critical-path kernels released by their stream predecessor
    without PDL: what a plain launch costs where nothing else holds it back. Off the path such
    a kernel may start long after its release, waiting for SMs (at full depth on the K3
    campaign builds, the MoE's shared-expert GEMM on its side stream: 16 us median, which
    made --no-pdl predict +18.8 ms on an 11.9 ms step)."""
    released = a.path.filter(pl.col("binding") == STREAM, ~pl.col("pdl"))
    on_path = released.filter(pl.col("on_path"))
    gaps = (on_path if on_path.height else released).select((pl.col("start") - pl.col("release")).alias("gap"))["gap"]
    return float(gaps.median()) if gaps.len() else 1000.0


def _critical(g: StepGraph, dur: np.ndarray, lags: np.ndarray, launch: np.ndarray, present: np.ndarray
              ) -> np.ndarray:
    """Per node, its time on the replayed critical path of the mean step."""
    start, end = stepgraph.replay(g, dur, lags, launch)
    path = stepgraph.on_path(g, start, end, lags, launch, present)
    released = np.zeros(g.size)
    for i in np.nonzero(path)[0]:
        cands = [launch[i]] + [end[p] + lags[i, s] for s, p in enumerate(g.preds[i]) if p >= 0]
        released[i] = max(cands)
    return np.where(path, end - np.maximum(start, np.minimum(released, end)), 0.0)


def _by_kernel(g: StepGraph, values: dict[str, np.ndarray]) -> pl.DataFrame:
    frame = g.nodes.select("name", "family").with_columns(pl.Series(k, v) for k, v in values.items())
    return frame.group_by("name", "family").agg(pl.col(k).sum() for k in values)


def opportunities(a: Analysis, top: int = 15, family: str | None = None) -> pl.DataFrame:
    """For every kernel name (of `family`, if given): the step time gained if all its calls ran
    2x faster (replayed on the mean step): what to optimise first. Kernels with slack gain
    little or nothing."""
    g = a.graph
    groups = g.nodes.with_row_index("i").group_by("name", "family").agg("i", pl.len().alias("nodes"))
    if family is not None:
        groups = groups.filter(pl.col("family") == family)
    dur = np.tile(g.duration, (groups.height, 1))
    for v, idx in enumerate(groups["i"].to_list()):
        dur[v, idx] *= 0.5
    base = float(stepgraph.span(*stepgraph.replay(g)))
    gain = base - stepgraph.span(*stepgraph.replay(g, dur))
    calls = a.kernel_table.select("name", "family", "calls_per_step")
    return (groups.select("name", "family", pl.Series("gain_us_if_2x_faster", gain / 1e3))
            .join(calls, on=["name", "family"], how="left")
            .select("name", "family", "calls_per_step", "gain_us_if_2x_faster")
            .sort("gain_us_if_2x_faster", descending=True).head(top))


def what_if(a: Analysis, changes: Sequence[Change], *, seed: int = 0) -> WhatIf:
    if not changes:
        raise ReportError("no change given", "pass --scale, --delta, --fuse, --remove, --no-pdl or --pdl")
    if not a.config.infers_pdl and any(c.kind in (PDL, NO_PDL) for c in changes):
        raise ReportError(f"{a.report} has no PDL to add or take away (its platform has no programmatic "
                          "dependent launch)", "drop --pdl / --no-pdl; model a shorter launch gap with --delta")
    model = step_model(a)
    g = model.graph
    plain_gap_ns = _non_pdl_gap(a)
    dur, lags, launch, present, touched = apply(model, changes, plain_gap_ns)
    notes = []
    if not touched.any():
        raise ReportError("no kernel matches the change (" + "; ".join(c.describe() for c in changes) + ")",
                          "check the kernel-name pattern, --family and --layers against `k3trace analyze`")
    start, end = stepgraph.replay(g, dur, lags, launch)
    predicted = stepgraph.span(start, end, np.broadcast_to(present, start.shape))
    base_start, base_end = stepgraph.replay(g, model.duration, model.lags, model.launch)
    base = stepgraph.span(base_start, base_end)
    delta = (predicted - base) / 1e3
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(delta, size=(RESAMPLES, len(delta))), axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    # Critical time and slack on the mean step (mean of the per-step parameters).
    mean = [x.mean(axis=0) for x in (model.duration, model.lags, model.launch)]
    mean_new = [x.mean(axis=0) for x in (dur, lags, launch)]
    before = _critical(g, *mean, np.ones(g.size, dtype=bool))
    after = _critical(g, *mean_new, present)
    mean_graph = StepGraph(nodes=g.nodes, preds=g.preds, lags=mean[1], launch_at=mean[2], launch_lag=np.zeros(g.size),
                           duration=mean[0], order=g.order)
    slack_ns = stepgraph.slack(mean_graph)
    added = np.where(touched, mean_new[0] - mean[0], 0.0)
    critical = _by_kernel(g, {"critical_us_before": before / 1e3, "critical_us_after": after / 1e3}).with_columns(
        (pl.col("critical_us_after") - pl.col("critical_us_before")).alias("change_us")
    ).filter(pl.col("change_us").abs() > 1e-3).sort(pl.col("change_us").abs(), descending=True)
    slack = _by_kernel(g, {"added_us": added / 1e3, "slack_us": np.where(touched, slack_ns, 0.0) / 1e3,
                           "slack_used_us": np.where(added > 0, np.minimum(added, slack_ns), 0.0) / 1e3}
                       ).filter(pl.col("added_us") != 0).sort("added_us", descending=True)
    on_span = apply(model, [c for c in changes if c.kind in (REMOVE, SCALE, FUSE)], plain_gap_ns)[4]
    notes.extend(_borrowed_tail_notes(g, mean[0], mean_new[0], touched, on_span))
    if any(c.kind == NO_PDL for c in changes):
        notes.append(f"each PDL edge took a plain launch's gap, {plain_gap_ns / 1e3:.3f} us (the median on this "
                     "trace's critical path)")
        notes.append("PDL also hides a dependent's prologue inside its reported duration; without PDL that part "
                     "would run after the wait, which this prediction does not add")
    if a.step_stats["host"]["median"] and a.step_stats["host"]["median"] > 0.05 * a.step_stats["span"]["median"]:
        notes.append("the host share is over 5% of the span: the ITL may not follow the span")
    return WhatIf(
        report=a.report, changes=tuple(changes), kernels_changed=int(touched.sum()),
        base_span_us=float(np.median(model.span)) / 1e3, delta_us=float(np.median(delta)),
        delta_p10_us=float(np.percentile(delta, 10)), delta_p90_us=float(np.percentile(delta, 90)),
        uncertainty_us=float(hi - lo) / 2, steps=len(delta), critical=critical, slack=slack,
        opportunities=opportunities(a), notes=tuple(notes), segments=_segments(g, base_start, start),
    )


_TIME = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*(ns|us|ms)?\s*$")


def parse_time_ns(text: str) -> float:
    m = _TIME.match(text)
    if not m:
        raise ReportError(f"cannot read {text!r} as a time", "write e.g. `+1.2us`, `-300ns` or `0.5ms`")
    return float(m[1]) * {"ns": 1.0, "us": 1e3, "ms": 1e6, None: 1e3}[m[2]]


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """`4`, `4,8` or `1..7`."""
    if not text:
        return None
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", part)
        if not m:
            raise ReportError(f"cannot read layers {text!r}", "write e.g. `4`, `4,8` or `1..7`")
        lo, hi = int(m[1]), int(m[2] or m[1])
        out.extend(range(lo, hi + 1))
    return tuple(out)


def parse_change(kind: str, spec: str, family: str | None = None, layers: tuple[int, ...] | None = None,
                 stream: str | None = None) -> Change:
    """`PATTERN=FACTOR` (scale), `PATTERN=TIME` (delta), `A,B=TIME` (fuse), `PATTERN` (remove, pdl)."""
    if stream not in (None, "main", "side"):
        raise ReportError(f"unknown stream {stream!r}", "use --stream main or --stream side")
    if kind in (REMOVE, PDL):
        return Change(kind, (spec,), 0.0, family, layers, stream)
    pattern, sep, value = spec.rpartition("=")
    if not sep or not pattern:
        raise ReportError(f"--{kind} {spec!r} needs PATTERN=VALUE", f"e.g. --{kind} 'kda_step=0.7'")
    if kind == SCALE:
        try:
            factor = float(value)
        except ValueError:
            raise ReportError(f"--scale factor {value!r} is not a number", "e.g. --scale 'kda_step=0.7'") from None
        if not np.isfinite(factor) or factor < 0:
            raise ReportError(f"--scale factor {value!r} must be a finite number >= 0", "e.g. 0.7 for 30% faster")
        return Change(SCALE, (pattern,), factor, family, layers, stream)
    time = parse_time_ns(value)
    if kind == FUSE:
        if time < 0:
            raise ReportError(f"--fuse time {value!r} must not be negative", "give the fused kernel's duration")
        return Change(FUSE, tuple(p for p in pattern.split(",") if p), time, family, layers, stream)
    return Change(DELTA, (pattern,), time, family, layers, stream)
