"""Edits whose recorded times traded across a PDL edge: the rows to read together.

Under PDL the profiler reports a dependent's start right after its primary's reported end
(METRICS.md, "PDL"). A primary that triggers its dependents early reports its end when the
dependent starts, before its own work is done, and the rest of its execution is recorded as
the dependent's duration. So a change that moves a trigger, or turns an edge programmatic
(a fusion whose successor now follows it by PDL instead of after a join), moves recorded
time from one kernel to the next: one row falls and its neighbour rises, each by more than
the change (a fusion at -1747 us beside a duration edit of the GEMM after it at +1920 us,
where the step moved +104 us). The attribution keeps every row as METRICS.md defines it; this
finds the rows that traded, so that the report can name them together with their sum.

A group grows from a row, largest first, by PDL neighbours: rows whose time a kernel owned
by the group released through a chained PDL edge (on its stream, reported start right after
the primary's reported end) in either build, or that released one of its kernels (a row owns a kernel's time by its duration, or by its presence for a replacement's
kernels). Each step takes the neighbour of the opposite sign to the group's sum that brings
the sum closest to zero, as long as it does and is at least a quarter of the group's largest
row (a smaller row that happens to lower the sum is a change of its own): a removed kernel between two others trades
with both (kda_conv_fused: the conv -1266 us between the qkvg GEMM +563 and kda_step +710,
+7 us together). A group is kept when its sum is at most half its largest row, so that read
apart its rows mislead; rows within max(the floor, three standard errors) of zero never
join, and each row joins one group at most. Closure over every neighbour would not do:
under early triggers the whole step is one PDL chain, and it would join every row.

A replacement's kernels record only their start of work when they trigger early: the rest
of it lands in the kernels they release, whose code did not change. So when a replacement's
kernels release, in both builds, the kernels where a duration row's recorded change lies
(at least half of it, same sign as the row), that row is the replacement's own work and
the trace cannot tell them apart: such rows join the replacement's group whatever their
sum (attn_res_wide on the K3 path: the score -> combine pair in wider chunks, its own row
+10 us while the GEMMs it releases fell -74, -57 and -19 us; together -140, the step
-143). The same holds on the other side: the kernel that releases a replacement's kernel,
in the build where that edge is chained, reports its end where the replacement reports its
start, so its row moves with the replacement's launch (triton_linear: the latent RMSNorm
before the MoE up GEMM -1.7 us at 8 layers once the GEMM followed it by PDL; mla_q_skinny
at full depth: the pre-attention combine before q_a -49 us). Its rows join too. These
groups form first (`released`).

A cross-stream join is inferred from timing (METRICS.md, "Critical path": the latest-ending
kernel of another stream that ended before the kernel started), so a side leg that grows past
a main-stream kernel's start, or shrinks before it, moves that kernel's join without any
change of code: a dependency row appears that undoes part of the duration row that moved the
leg (shared_front_leg on the K3 path: S1's leg +132 us while the latent norm and the up GEMM
after it, which never wait on S1, had taken its old end as their join; their join row -117
us). A join row goes with the duration rows that own its kernels' join predecessors in either
build, of the opposite sign, into the released group (or with the row left alone) that
brings the sum closest to zero, kept when the sum is at most half its largest row
(`joined`), after the traded groups: a row that traded across a PDL edge stays in its pair.
Only kernels whose join timing alone moved count: the old join predecessor ends after the
kernel starts in the new build, or the new one ended after it started in the old.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from k3trace.analyses.stepgraph import JOIN_SLOT
from k3trace.diff.edits import DEPENDENCY, EditScript

#: What a read-together group means, for the reports.
READ_TOGETHER = ("rows whose recorded time moved across a PDL edge (a dependent launched at its primary's trigger "
                 "records the rest of the primary's work as its own), or a join inferred from timing that moved with "
                 "a leg's duration: read each group as one change, its sum")
#: Why a group's rows go together, per `reason`, in the order the groups form.
REASONS = {
    "released": ("a replacement's work recorded in the unchanged kernels beside it: those it releases hold the rest "
                 "of its work, the one that releases it ends where it starts"),
    "joined": ("a join inferred from timing moved because a leg's duration moved its end across the kernels' starts: "
               "the join row undoes part of the leg's row"),
    "traded": "one row fell and its PDL neighbour rose, each by more than their sum",
}
#: A duration row joins a replacement when at least this share of its recorded change lies
#: on the unchanged kernels beside the replacement's on their PDL chains.
RELEASED_SHARE = 0.5
#: A neighbour joins a group only when it is at least the group's largest row over this: a
#: small row that happens to lower the sum is its own change, not the group's trade.
JOIN_SHARE = 4.0
#: A contribution smaller than this (or than three of its standard errors) trades nothing
#: worth a note.
FLOOR_NS = 1_000.0


def released_by_replacements(script: EditScript, c: np.ndarray, significant: np.ndarray) -> dict[int, list[int]]:
    """replacement player -> the significant duration rows whose recorded change lies mostly
    (RELEASED_SHARE, same sign as the row) on the unchanged kernels beside the replacement's
    kernels on their PDL chains: those they release through a chained PDL edge in both
    builds, and those that release one of them in either build."""
    union, presence = script.union, script.owner_presence
    both = union.present_old & union.present_new
    delta = np.where(both, union.dur_new - union.dur_old, 0.0)

    def released_by(pred: np.ndarray) -> np.ndarray:
        return np.where(pred >= 0, presence[np.clip(pred, 0, None)], -1)

    def releases(pred: np.ndarray) -> np.ndarray:
        # A chained edge is the stream successor's, so a primary releases one kernel at most.
        dependents = np.flatnonzero(pred >= 0)
        out = np.full(union.size, -1, dtype=np.int64)
        out[pred[dependents]] = presence[dependents]
        return out

    by_old, by_new = released_by(union.pdl_pred_old), released_by(union.pdl_pred_new)
    after = np.where(both & (by_old >= 0) & (by_old == by_new), by_old, -1)
    # A primary reports its end where its dependent reports its start (METRICS.md, "PDL"), so
    # the row of the kernel that releases a replacement's kernel holds the replacement's start:
    # in the build where the edge is chained, whether it is in one build or both (mla_q_skinny:
    # the combine before q_a -49 us, its edge to the cuBLAS q_a plain in 10 of 24 layers).
    of_old, of_new = releases(union.pdl_pred_old), releases(union.pdl_pred_new)
    before = np.where(of_old >= 0, of_old, of_new)
    before = np.where(both & (before >= 0) & ((of_old < 0) | (of_new < 0) | (of_old == of_new)), before, -1)
    replacement = np.where(after >= 0, after, before)
    out: dict[int, list[int]] = {}
    for row in np.unique(script.owner_duration[script.owner_duration >= 0]).tolist():
        if not significant[row]:
            continue
        nodes = np.flatnonzero(script.owner_duration == row)
        total = float(delta[nodes].sum())
        for r in np.unique(replacement[nodes][replacement[nodes] >= 0]).tolist():
            moved = float(delta[nodes][replacement[nodes] == r].sum())
            if np.sign(moved) == np.sign(c[row]) != 0 and abs(moved) >= RELEASED_SHARE * abs(total):
                out.setdefault(r, []).append(row)
                break
    return out


def joined_by_durations(script: EditScript, c: np.ndarray, significant: np.ndarray) -> dict[int, list[int]]:
    """join row (a significant dependency player with a join among its details) -> the
    significant duration rows of the opposite sign that own one of its kernels' join
    predecessors in either build, largest first. Only kernels whose join timing alone moved
    count: the old join predecessor ends after the kernel starts in the new build, or the new
    one ended after it started in the old (under the same rule either build would have picked
    the other), not a join the code added or removed."""
    union, out = script.union, {}
    end_old, end_new = union.start_old + union.dur_old, union.start_new + union.dur_new
    present = union.present_old & union.present_new
    joins = script.players.filter((pl.col("kind") == DEPENDENCY) & pl.col("detail").str.contains("join"))
    for p in joins["player"].to_list():
        if not significant[p]:
            continue
        nodes = np.flatnonzero(script.owner_inputs == p)
        a, b = union.preds_old[nodes, JOIN_SLOT], union.preds_new[nodes, JOIN_SLOT]
        a_crossed = (a >= 0) & present[np.clip(a, 0, None)] & (end_new[np.clip(a, 0, None)] > union.start_new[nodes])
        b_crossed = (b >= 0) & present[np.clip(b, 0, None)] & (end_old[np.clip(b, 0, None)] > union.start_old[nodes])
        moved = (a != b) & (a_crossed | b_crossed)
        preds = np.concatenate([a[moved], b[moved]])
        owners = np.unique(script.owner_duration[preds[preds >= 0]])
        rows = [int(r) for r in owners if r >= 0 and r != p and significant[r] and np.sign(c[r]) == -np.sign(c[p])]
        if rows:
            out[p] = sorted(rows, key=lambda r: (-abs(c[r]), r))
    return out


def _join_groups(rows: list[tuple[int, int, str]], taken: set[int], joined: dict[int, list[int]],
                 c: np.ndarray) -> None:
    """Each join row, largest first, into the released group (or with the untaken duration
    row) of its joined_by_durations rows that brings the sum closest to zero, where the sum is
    then at most half the group's largest row. Traded groups stay as they are: their rows are
    read together for a reason of their own."""
    for j in sorted(joined, key=lambda p: (-abs(c[p]), p)):
        if j in taken:
            continue
        group_of = {p: g for g, p, reason in rows if reason == "released"}
        best = None
        for r in joined[j]:
            if r in taken and r not in group_of:
                continue
            members = [p for g, p, _ in rows if g == group_of[r]] if r in group_of else [r]
            total = sum(c[m] for m in members) + c[j]
            if abs(total) <= max(abs(c[x]) for x in (*members, j)) / 2 and (best is None or abs(total) < best[0]):
                best = (abs(total), r)
        if best is None:
            continue
        r = best[1]
        if r in group_of:
            rows.append((group_of[r], j, "joined"))
        else:
            index = len(rows) and max(g for g, _, _ in rows) + 1
            rows += [(index, r, "joined"), (index, j, "joined")]
            taken.add(r)
        taken.add(j)


def pdl_coupled(script: EditScript, contribution_ns: np.ndarray, stderr_ns: np.ndarray,
                floor_ns: float = FLOOR_NS) -> pl.DataFrame:
    """group, player, reason: the members of each group of rows read together, groups
    numbered from 0: the replacements' released rows first, then the traded rows, then the
    join rows with the rows whose duration moved their joins (into a released group, or a
    group of their own), each kind by its largest row, largest first."""
    union = script.union
    c = np.asarray(contribution_ns, dtype=np.float64)
    owner = np.where(script.owner_duration >= 0, script.owner_duration, script.owner_presence)
    significant = np.abs(c) > np.maximum(3.0 * np.asarray(stderr_ns, dtype=np.float64), floor_ns)
    rows: list[tuple[int, int, str]] = []
    taken: set[int] = set()
    released = released_by_replacements(script, c, significant)
    for r in sorted(released, key=lambda p: (-max(abs(c[x]) for x in released[p]), p)):
        group = [r, *released[r]]
        taken.update(group)
        index = len(rows) and rows[-1][0] + 1
        rows += [(index, p, "released") for p in sorted(group)]
    # The player pairs the PDL edges of both builds link (one row per distinct pair: the
    # edges are per kernel, the players per kernel name and kind across layers).
    pairs = []
    for pdl_pred in (union.pdl_pred_old, union.pdl_pred_new):
        dependents = np.flatnonzero(pdl_pred >= 0)
        a, b = owner[pdl_pred[dependents]], owner[dependents]
        keep = (a >= 0) & (b >= 0) & (a != b)
        pairs.append(np.stack([a[keep], b[keep]], axis=1))
    linked = np.unique(np.sort(np.concatenate(pairs), axis=1), axis=0)
    linked = linked[significant[linked[:, 0]] & significant[linked[:, 1]]]
    neighbours: dict[int, set[int]] = {}
    for x, y in linked.tolist():
        neighbours.setdefault(x, set()).add(y)
        neighbours.setdefault(y, set()).add(x)
    for seed in sorted(neighbours, key=lambda p: (-abs(c[p]), p)):
        if seed in taken:
            continue
        group, total = [seed], c[seed]
        while True:
            near = {z for m in group for z in neighbours[m]} - taken - set(group)
            largest = max(abs(c[p]) for p in group)
            closer = [(abs(total + c[z]), z) for z in near
                      if np.sign(c[z]) != np.sign(total) and abs(total + c[z]) < abs(total)
                      and abs(c[z]) >= largest / JOIN_SHARE]
            if not closer:
                break
            _, z = min(closer)
            group.append(z)
            total += c[z]
        if len(group) > 1 and abs(total) <= max(abs(c[p]) for p in group) / 2:
            taken.update(group)
            index = len(rows) and max(g for g, _, _ in rows) + 1
            rows += [(index, p, "traded") for p in sorted(group)]
    _join_groups(rows, taken, joined_by_durations(script, c, significant), c)
    return pl.DataFrame(rows, schema={"group": pl.Int64, "player": pl.Int64, "reason": pl.String}, orient="row")


__all__ = ["FLOOR_NS", "JOIN_SHARE", "READ_TOGETHER", "REASONS", "RELEASED_SHARE", "joined_by_durations",
           "pdl_coupled", "released_by_replacements"]
