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

Two players trade when a kernel whose time one of them owns (its duration, or its presence
for a replacement's kernels) released, through a PDL edge in either build, a kernel whose
time the other owns; when their contributions have opposite signs, each beyond its noise;
and when the smaller is at least half the larger, so that their sum is smaller than either
row (read apart, both mislead). Groups start from the pair that traded the most time (the
smaller contribution), and take in PDL neighbours that trade with the group's sum by the
same rule (a removed kernel between two others trades with both: kda_conv_fused's conv
-1266 us between the qkvg GEMM +563 and kda_step +710); each row joins one group at most.
Closure over every neighbour would not do: under early triggers the whole step is one PDL
chain, and it would join every row into one group.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from k3trace.diff.edits import EditScript

#: What a read-together group means, for the reports.
READ_TOGETHER = ("rows whose recorded time traded across a PDL edge (a dependent launched at its primary's trigger "
                 "records the rest of the primary's work as its own): read each group as one change, its sum")
#: A contribution smaller than this (or than three of its standard errors) trades nothing
#: worth a note.
FLOOR_NS = 1_000.0


def _trades(a: float, b: float) -> bool:
    small, large = sorted((abs(a), abs(b)))
    return np.sign(a) * np.sign(b) < 0 and small >= large / 2


def pdl_coupled(script: EditScript, contribution_ns: np.ndarray, stderr_ns: np.ndarray,
                floor_ns: float = FLOOR_NS) -> pl.DataFrame:
    """group, player: the members of each group of rows that traded, groups numbered from 0
    by the time their first pair traded, largest first."""
    union = script.union
    c = np.asarray(contribution_ns, dtype=np.float64)
    owner = np.where(script.owner_duration >= 0, script.owner_duration, script.owner_presence)
    significant = np.abs(c) > np.maximum(3.0 * np.asarray(stderr_ns, dtype=np.float64), floor_ns)
    neighbours: dict[int, set[int]] = {}
    for pdl_pred in (union.pdl_pred_old, union.pdl_pred_new):
        dependents = np.flatnonzero(pdl_pred >= 0)
        a, b = owner[pdl_pred[dependents]], owner[dependents]
        keep = (a >= 0) & (b >= 0) & (a != b)
        for x, y in zip(a[keep].tolist(), b[keep].tolist()):
            if significant[x] and significant[y]:
                neighbours.setdefault(x, set()).add(y)
                neighbours.setdefault(y, set()).add(x)
    pairs = sorted(((min(abs(c[x]), abs(c[y])), x, y) for x in neighbours for y in neighbours[x]
                    if x < y and _trades(c[x], c[y])), key=lambda t: (-t[0], t[1], t[2]))
    rows: list[tuple[int, int]] = []
    taken: set[int] = set()
    for _, x, y in pairs:
        if x in taken or y in taken:
            continue
        group, total = [x, y], c[x] + c[y]
        while True:
            near = {z for m in group for z in neighbours[m]} - taken - set(group)
            fits = [(min(abs(total), abs(c[z])), z) for z in near if _trades(total, c[z])]
            if not fits:
                break
            _, z = max(fits, key=lambda t: (t[0], -t[1]))
            group.append(z)
            total += c[z]
        taken.update(group)
        index = len({g for g, _ in rows})
        rows += [(index, p) for p in sorted(group)]
    return pl.DataFrame(rows, schema={"group": pl.Int64, "player": pl.Int64}, orient="row")


__all__ = ["FLOOR_NS", "READ_TOGETHER", "pdl_coupled"]
