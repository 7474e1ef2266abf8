"""The critical path of each stable step (METRICS.md, "Critical path of a step").

Every kernel has up to three candidate releasers: the previous kernel on its stream, the
latest-ending kernel of another stream that ended before it started (a cross-stream
join), and its CPU launch. The one that released it last is its binding predecessor.
Walking binding predecessors back from the step's last-ending kernel gives the path;
kernel time on it counts only after the predecessor's end (a PDL overlap is not counted
twice), and the waits between are bubbles. Bubbles plus kernel parts sum to the span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from k3trace.config import Config
from k3trace.ordering import sort_positions, stable_positions

STREAM, JOIN, LAUNCH = "stream", "join", "launch"
#: Share of stable steps in which a launch must end a short tail after another stream's
#: producer for that producer to release it (a wait inside the run, not two ends that met).
TAIL_STEP_SHARE = 0.9


def dependency_edges(kernels: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """Stable-step kernels with their three candidate releasers and the binding one.

    Adds: stream_pred / join_pred (kernel_id), stream_release / join_release /
    launch_release (ns), release (ns), binding (stream|join|launch), pdl (bool: the binding
    edge is a PDL edge), pdl_start (bool: the kernel starts at its stream predecessor's end
    by PDL, whichever input released it).

    The orders are row positions (k3trace/ordering.py: where keys tie, polars' sort decides,
    as when the frame was sorted itself); the look-ups over them are numpy positions and one
    `searchsorted` per probe set, where joins and per-step as-of joins cost four times as much.
    """
    cols = kernels.select(
        "kernel_id", "step", "stream_id", "start", "end", "launch_start", "name", "signature", "family", "layer",
        "launch_rank",
    )
    c = _candidates(cols, cfg)
    start = cols["start"].to_numpy()
    stream_pred, stream_release, has_stream = c.stream_pred, c.stream_release, c.has_stream
    join_pred, join_release, has_join = c.join_pred, c.join_release, c.has_join
    launch_release, has_launch = c.launch_release, c.has_launch
    release, has_release = _latest((stream_release, has_stream), (join_release, has_join),
                                   (launch_release, has_launch))
    # Ties go to the stream edge, then the join: a launch that happened earlier never binds.
    by_stream_edge = has_stream & (stream_release == release)
    by_join = ~by_stream_edge & has_join & (join_release == release)
    by_launch = ~by_stream_edge & ~by_join & has_launch
    pdl_start = has_stream & (start - stream_release <= cfg.pdl_max_gap_ns)
    pdl = (by_stream_edge & pdl_start) | (by_join & (join_release > start))
    # Released by its CPU launch: the path goes on through the host to the kernel that ran
    # before on its stream (else the latest on another), and the wait between that one's
    # end and this start is a launch bubble. On an eager trace the path otherwise ended at
    # the first launch-bound kernel ("1 kernel, 1 bubble of 83 ms").
    via_stream = by_stream_edge | (by_launch & has_stream)
    via_join = by_join | (by_launch & ~has_stream & has_join)
    pred = np.where(via_stream, stream_pred, join_pred)
    path_release = np.where(by_launch, np.where(has_stream, stream_release, join_release), release)
    has_path_release = np.where(by_launch, has_stream | has_join, has_release)

    id_type = cols.schema["kernel_id"]
    binding = pl.select(pl.when(pl.Series(by_stream_edge)).then(pl.lit(STREAM))
                        .when(pl.Series(by_join)).then(pl.lit(JOIN))
                        .when(pl.Series(by_launch)).then(pl.lit(LAUNCH))).to_series()
    # The same columns, nulls and types as the polars expressions these replace (a third of
    # the function's time went to them): where a candidate is absent its column is null.
    out = cols.with_columns(
        _nullable("stream_pred", stream_pred, has_stream, id_type),
        _nullable("stream_release", stream_release, has_stream),
        _nullable("join_pred", join_pred, has_join, id_type),
        _nullable("join_release", join_release, has_join),
        pl.col("launch_start").alias("launch_release"),
        _nullable("release", release, has_release),
        binding.alias("binding"),
        pl.Series("pdl", pdl),
        pl.Series("pdl_start", pdl_start),
        _nullable("pred", pred, via_stream | via_join, id_type),
        _nullable("path_release", path_release, has_path_release),
    )
    return out if out["kernel_id"].is_sorted() else out.sort("kernel_id")


@dataclass(frozen=True)
class _Candidates:
    """Per kernel, in the frame's row order: the previous kernel on its stream, the latest
    other-stream kernel it may wait on (a join), its launch time; with whether each is there."""

    stream_pred: np.ndarray
    stream_release: np.ndarray
    has_stream: np.ndarray
    join_pred: np.ndarray
    join_release: np.ndarray
    has_join: np.ndarray
    launch_release: np.ndarray
    has_launch: np.ndarray


def _candidates(cols: pl.DataFrame, cfg: Config) -> _Candidates:
    """The scans behind `dependency_edges`, on their own: the orders and look-ups they build
    (half a GB at 2.2M kernels) are let go before the edges are (peak memory)."""
    # The scans run in (step, start, end) order, on arrays: the frame itself is never
    # sorted, and the results go back to its rows by position (peak memory).
    by_start = sort_positions(cols, "step", "start", "end")
    k = cols.select("kernel_id", "step", "stream_id", "start", "end", "launch_start", "launch_rank")
    # The stable kernels come in that order already (sorted by start, steps cut in time
    # order): then neither the gather into it nor the gathers back to the rows are needed.
    in_order = bool(np.array_equal(by_start, np.arange(len(by_start))))
    if not in_order:
        k = k[by_start]
    kid = k["kernel_id"].to_numpy()
    step, stream = k["step"].to_numpy(), k["stream_id"].to_numpy()
    start, end = k["start"].to_numpy(), k["end"].to_numpy()
    # Same stream: the previous kernel on the stream within the step.
    by_stream = sort_positions(k, "step", "stream_id", "start")
    same = np.zeros(len(kid), dtype=bool)
    same[1:] = (step[by_stream[1:]] == step[by_stream[:-1]]) & (stream[by_stream[1:]] == stream[by_stream[:-1]])
    prev = np.zeros(len(kid), dtype=np.int64)
    prev[by_stream[1:]] = by_stream[:-1]
    has_stream = np.zeros(len(kid), dtype=bool)
    has_stream[by_stream] = same
    lookup = _EndOrder.of(k, step, stream)
    join_at, has_join = lookup.latest_other_stream(step, stream, start)
    launch = k["launch_start"]
    rank = k["launch_rank"].fill_null(-1).to_numpy().astype(np.int64)
    has_launch = launch.is_not_null().to_numpy()
    launch_at = launch.fill_null(0).to_numpy()
    # Graph replays place programmatic (PDL) edges across internal streams too, and there
    # the dependent's reported start precedes its producer's end (its prologue ran first).
    # Where the usual candidates leave a wait, a producer on another stream ending within
    # `pdl_max_overlap_ns` after the start released it, even past the kernel's own end: a
    # record under early triggers ends where the kernel triggered its dependents, so a
    # producer that did its last work after triggering ends after a consumer that only
    # waited for it and triggered (the K3 gate|up GEMM, 0.85 us, starts 1.6 us before the
    # shared SiTU that holds the front GEMM's tail ends, and ends before it).
    usual, has_usual = _latest((end[prev], has_stream), (lookup.end[join_at], has_join), (launch_at, has_launch))
    waited = np.flatnonzero(has_usual & (start - usual > cfg.pdl_max_gap_ns))
    probe = start[waited] + cfg.pdl_max_overlap_ns
    ov_at, has_ov = lookup.latest_other_stream(step[waited], stream[waited], probe)
    has_ov &= lookup.end[ov_at] > start[waited]
    join_at[waited[has_ov]] = ov_at[has_ov]
    has_join[waited[has_ov]] = True
    # A PDL-launched kernel can also wait inside its run: launched as soon as its stream
    # predecessor triggered, it sits in `griddepcontrol.wait` until a producer on another
    # stream completes, and ends only a short tail after it (the K3 MoE gate|up GEMM, launched
    # at the router's end, waits there for the front GEMM and ends 0.3-0.5 us after it in
    # every layer, whether the router ends 7 us or 15 us before the front). Its stream
    # predecessor did not release it: the producer, started before it and ending within
    # `pdl_max_tail_ns` of its end, did. A wait does so in every replay of the graph; two
    # kernels that merely end close together do so in some (a KDA gate GEMM beside qkvg at
    # B = 8: 11-26 of 38 steps, tails spread to the limit), so the kernel's launch must show
    # it in `TAIL_STEP_SHARE` of the stable steps.
    launched_at_release = has_usual & (start - usual <= cfg.pdl_max_gap_ns)
    rest = np.flatnonzero(launched_at_release & (end - start > cfg.pdl_max_tail_ns))
    if cfg.pdl_max_tail_ns > 0 and len(rest):
        tail_at, has_tail = lookup.latest_other_stream(step[rest], stream[rest], end[rest] - 1)
        p_end = lookup.end[tail_at]
        has_tail &= (p_end > start[rest]) & (end[rest] - p_end <= cfg.pdl_max_tail_ns)
        has_tail &= lookup.start[tail_at] < start[rest]
        has_tail &= p_end > usual[rest]
        has_tail &= _every_replay(rank, rest, has_tail)
        join_at[rest[has_tail]] = tail_at[has_tail]
        has_join[rest[has_tail]] = True
    if in_order:
        return _Candidates(stream_pred=kid[prev], stream_release=end[prev], has_stream=has_stream,
                           join_pred=lookup.kernel_id[join_at], join_release=lookup.end[join_at],
                           has_join=has_join, launch_release=launch_at, has_launch=has_launch)
    row = np.empty(len(kid), dtype=np.int64)
    row[by_start] = np.arange(len(kid))
    return _Candidates(stream_pred=kid[prev][row], stream_release=end[prev][row], has_stream=has_stream[row],
                       join_pred=lookup.kernel_id[join_at][row], join_release=lookup.end[join_at][row],
                       has_join=has_join[row], launch_release=launch_at[row], has_launch=has_launch[row])


def _every_replay(rank: np.ndarray, rows: np.ndarray, holds: np.ndarray) -> np.ndarray:
    """Per row of `rows`: whether its launch (`rank`, the same kernel in every step; -1
    unknown) shows `holds` in at least TAIL_STEP_SHARE of the steps it ran in."""
    known = rank >= 0
    if not known.any():
        return np.zeros(len(rows), dtype=bool)
    size = int(rank.max()) + 1
    runs = np.bincount(rank[known], minlength=size)
    shown = np.bincount(rank[rows[holds & known[rows]]], minlength=size)
    r = rank[rows]
    return known[rows] & (shown[np.clip(r, 0, None)] >= TAIL_STEP_SHARE * runs[np.clip(r, 0, None)])


def _nullable(name: str, values: np.ndarray, valid: np.ndarray, dtype: pl.DataType = pl.Int64) -> pl.Series:
    series = pl.Series(name, values).cast(dtype)
    return series if valid.all() else pl.select(pl.when(pl.Series(valid)).then(series)).to_series().alias(name)


def _latest(*candidates: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per row the largest of the candidates present (`valid`), and whether any is."""
    # In place, where valid: no masked copy per candidate (each a fresh 20 MB at 2.5M
    # kernels, whose first touches cost more than the arithmetic).
    best = np.full(len(candidates[0][0]), np.iinfo(np.int64).min, dtype=np.int64)
    for values, valid in candidates:
        np.maximum(best, values, out=best, where=valid)
    return best, np.logical_or.reduce([valid for _, valid in candidates])


@dataclass(frozen=True)
class _EndOrder:
    """The step's kernels ordered by end, each with the position just before its run of
    same-stream neighbours in that order (where the latest other-stream end is found), and
    a search key that orders (step, end) on one integer line."""

    kernel_id: np.ndarray
    step: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    end: np.ndarray
    before_run: np.ndarray
    steps: np.ndarray       # distinct steps, ascending
    base: np.ndarray        # per distinct step: its earliest kernel start
    stride: int
    key: np.ndarray
    step_index: np.ndarray | None   # step - steps[0] -> its position in `steps`, where ids are dense

    @classmethod
    def of(cls, k: pl.DataFrame, step: np.ndarray, stream: np.ndarray) -> "_EndOrder":
        # Kernel ends across streams seldom tie (none at 373k kernels of a full-depth K3
        # recording, 246 pairs of 421k in another); where they do, in start order (`k`'s
        # rows): the latest other-stream kernel at a shared end is the one that started
        # last. (polars' sort, which ordered them before, is not stable: its fallback
        # took 0.2 s at 2.5M kernels.)
        order = stable_positions(k, "step", "end")
        s, st, end = step[order], stream[order], k["end"].to_numpy()[order]
        new_run = np.ones(len(order), dtype=bool)
        new_run[1:] = (st[1:] != st[:-1]) | (s[1:] != s[:-1])
        before_run = np.maximum.accumulate(np.where(new_run, np.arange(len(order)), 0)) - 1
        # In this order each step's kernels are one run, ending with its latest end: the
        # distinct steps, each row's step number and the steps' extents come from where
        # the step changes (no unique, search or group-by, each a sort's cost).
        new_step = np.ones(len(s), dtype=bool)
        new_step[1:] = s[1:] != s[:-1]
        firsts = np.flatnonzero(new_step)
        steps = s[firsts]
        g = np.cumsum(new_step) - 1
        # Each step gets a stretch of the line from its earliest start: every probe lies
        # within [start - 1, last end] of its step (a zero-length kernel probes at end - 1),
        # so a stride of the longest step + 2 keeps the stretches apart.
        if len(s):
            base = np.minimum.reduceat(k["start"].to_numpy()[order], firsts)
            last_end = end[np.append(firsts[1:], len(s)) - 1]
            stride = int((last_end - base).max()) + 2
        else:
            base, stride = np.zeros(0, dtype=np.int64), 2
        key = g * stride + (end - base[g])
        step_index = None
        # Step ids count up from 0 (graph replays, NVTX ranges, periods): a table indexed
        # by the id finds each probe's step, where a search over the steps costs log(n) per probe.
        if len(steps) and int(steps[-1]) - int(steps[0]) < 4 * len(steps) + 1024:
            step_index = np.zeros(int(steps[-1]) - int(steps[0]) + 1, dtype=np.int64)
            step_index[steps - steps[0]] = np.arange(len(steps))
        return cls(kernel_id=k["kernel_id"].to_numpy()[order], step=s, stream=st,
                   start=k["start"].to_numpy()[order], end=end, before_run=before_run,
                   steps=steps, base=base, stride=stride, key=key, step_index=step_index)

    def _step_positions(self, step: np.ndarray) -> np.ndarray:
        """Each probing kernel's step's position in `steps` (every probe's step is there)."""
        if self.step_index is None:
            return np.searchsorted(self.steps, step)
        return self.step_index[step - self.steps[0]]

    def latest_other_stream(self, step: np.ndarray, stream: np.ndarray,
                            probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per probing kernel: the position of the latest-ending kernel on *another* stream in
        its step with end <= probe, and whether there is one. The latest end <= probe is
        found first; if that kernel is on the probing kernel's own stream, the latest
        other-stream one sits just before its run."""
        g = self._step_positions(step)
        at = np.searchsorted(self.key, g * self.stride + (probe - self.base[g]), side="right") - 1
        found = at >= 0
        at = np.where(found, at, 0)
        found &= self.step[at] == step
        fallback = np.maximum(self.before_run[at], 0)
        other = self.stream[at] != stream
        use_fallback = found & ~other & (self.before_run[at] >= 0) & (self.step[fallback] == step)
        return np.where(other, at, fallback), (found & other) | use_fallback


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
    cursor = _last_ending_rows(edges)
    on_path = np.zeros(len(ids), dtype=bool)
    while cursor.size:
        on_path[cursor] = True
        cursor = pred_row[cursor]
        cursor = cursor[(cursor >= 0) & ~on_path[np.clip(cursor, 0, None)]]
    first = steps.select("step", pl.col("first_start").alias("step_start"))
    # Joined on the step column alone (a left join keeps the row order): joining the edges
    # would copy all their columns (peak memory).
    step_start = edges.select("step").join(first, on="step", how="left")["step_start"]
    out = edges.with_columns(pl.Series("on_path", on_path), step_start)
    # The path's earliest kernel waits on the launch from the step's start, not the call; a
    # launch-bound kernel from its host-side predecessor's end (`path_release`).
    released = pl.when(pl.col("pred").is_null()).then(pl.col("step_start")).otherwise(pl.col("path_release"))
    counted_from = pl.max_horizontal("start", released)
    return out.with_columns(
        pl.when(pl.col("on_path")).then(pl.col("end") - counted_from).otherwise(0).alias("critical_ns"),
        pl.when(pl.col("on_path")).then((pl.col("start") - released).clip(lower_bound=0)).otherwise(0).alias("bubble_ns"),
    ).drop("step_start")


def _last_ending_rows(edges: pl.DataFrame) -> np.ndarray:
    """Each step's last-ending kernel, as a row of `edges`; where several share the latest
    end, the last of them in row order (kernel id). Steps come in row order as runs where
    the kernels were recorded in step order (a scan of each run's maximum); else from
    their (step, end) order."""
    step, end = edges["step"].to_numpy(), edges["end"].to_numpy()
    if len(step) and bool(np.all(step[1:] >= step[:-1])):
        opens = np.append(True, step[1:] != step[:-1])
        firsts, run = np.flatnonzero(opens), np.cumsum(opens) - 1
        at_max = np.flatnonzero(end == np.maximum.reduceat(end, firsts)[run])
        return at_max[np.append(run[at_max][1:] != run[at_max][:-1], True)]
    order = stable_positions(edges, "step", "end")
    ordered = step[order]
    return order[np.flatnonzero(np.append(ordered[1:] != ordered[:-1], True))]


def per_step(path: pl.DataFrame) -> pl.DataFrame:
    # Only the columns summed go through the filter: the path's sixteen took 150 MB more at
    # 2.2M kernels, at the analysis' peak (the overlap side still runs then).
    on = path.select("step", "critical_ns", "bubble_ns", "pdl", "on_path").filter(pl.col("on_path"))
    return on.group_by("step").agg(
        pl.len().alias("path_kernels"),
        pl.col("critical_ns").sum(),
        pl.col("bubble_ns").sum(),
        (pl.col("bubble_ns") > 0).sum().alias("bubbles"),
        pl.col("pdl").sum().alias("pdl_edges_on_path"),
    ).sort("step")


def per_step_kernel(path: pl.DataFrame) -> pl.DataFrame:
    """Each stable step's time on the path per kernel (step, name, family, critical_ns): the
    one grouping of the path's rows that `by_family` and `by_kernel` both start from."""
    return path.group_by("step", "name", "family").agg(pl.col("critical_ns").sum())


def by_family(per: pl.DataFrame) -> pl.DataFrame:
    """Median over stable steps of the family's time on the path (us), from `per_step_kernel`.
    Every step has a kernel in it, and integer sums of the kernels' sums are the family's."""
    steps = per.select("step").unique()
    fams = per.select("family").unique()
    by_step = per.group_by("step", "family").agg(pl.col("critical_ns").sum())
    return (
        steps.join(fams, how="cross").join(by_step, on=["step", "family"], how="left").fill_null(0)
        .group_by("family").agg((pl.col("critical_ns").median() / 1e3).alias("critical_us"))
    )


def by_kernel(per: pl.DataFrame) -> pl.DataFrame:
    """The same per kernel (name and family), from `per_step_kernel`."""
    steps = per.select("step").unique()
    names = per.select("name", "family").unique()
    return (
        steps.join(names, how="cross").join(per, on=["step", "name", "family"], how="left").fill_null(0)
        .group_by("name", "family").agg((pl.col("critical_ns").median() / 1e3).alias("critical_us"))
    )
