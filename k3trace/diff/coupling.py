"""Edits whose recorded times traded across a PDL edge: the rows to read together.

Under PDL the profiler reports a dependent's start right after its primary's reported end
(METRICS.md, "PDL"). A primary that triggers its dependents early reports its end when the
dependent starts, before its own work is done, and the rest of its execution is recorded as
the dependent's duration. So a change that moves a trigger, or turns an edge programmatic
(a fusion whose successor now follows it by PDL instead of after a join), moves recorded
time from one kernel to the next: one row falls and its neighbour rises, each by more than
the change (a fusion at -1750 us beside a duration edit of the GEMM after it at +1920 us,
for a change of +170 us). The attribution keeps every row as METRICS.md defines it; this
finds the rows that traded, so that the report can name them together with their sum.

Two players are coupled when a kernel whose time one of them owns (its duration, or its
presence for a replacement's kernels) released, through a PDL edge in either build, a
kernel whose time the other owns; when their contributions have opposite signs, each
beyond its noise; and when the smaller is at least half the larger, so that their sum is
smaller than either row (read apart, both rows mislead). Pairs are taken by the time they
traded (the smaller contribution), largest first, each player in one pair at most: the
whole step is one PDL chain under early triggers, and closure over neighbours would join
every row into one group.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from k3trace.diff.edits import EditScript

#: What a coupled pair means, for the reports.
READ_TOGETHER = ("rows whose recorded time traded across a PDL edge (a dependent launched at its primary's trigger "
                 "records the rest of the primary's work as its own): read each pair as one change, their sum")
#: A contribution smaller than this (or than three of its standard errors) trades nothing
#: worth a note.
FLOOR_NS = 1_000.0


def pdl_coupled(script: EditScript, contribution_ns: np.ndarray, stderr_ns: np.ndarray,
                floor_ns: float = FLOOR_NS) -> pl.DataFrame:
    """group, player: the two members of each coupled pair, pairs numbered from 0 by the
    time they traded, largest first."""
    union = script.union
    c = np.asarray(contribution_ns, dtype=np.float64)
    owner = np.where(script.owner_duration >= 0, script.owner_duration, script.owner_presence)
    significant = np.abs(c) > np.maximum(3.0 * np.asarray(stderr_ns, dtype=np.float64), floor_ns)
    candidates: set[tuple[int, int]] = set()
    for pdl_pred in (union.pdl_pred_old, union.pdl_pred_new):
        dependents = np.flatnonzero(pdl_pred >= 0)
        a, b = owner[pdl_pred[dependents]], owner[dependents]
        keep = (a >= 0) & (b >= 0) & (a != b)
        candidates.update((int(min(x, y)), int(max(x, y))) for x, y in zip(a[keep], b[keep]))
    traded = []
    for x, y in candidates:
        small, large = sorted((abs(c[x]), abs(c[y])))
        if significant[x] and significant[y] and np.sign(c[x]) != np.sign(c[y]) and small >= large / 2:
            traded.append((small, x, y))
    rows: list[tuple[int, int]] = []
    taken: set[int] = set()
    for _, x, y in sorted(traded, key=lambda t: (-t[0], t[1], t[2])):
        if x not in taken and y not in taken:
            taken.update((x, y))
            group = len(rows) // 2
            rows += [(group, x), (group, y)]
    return pl.DataFrame(rows, schema={"group": pl.Int64, "player": pl.Int64}, orient="row")


__all__ = ["FLOOR_NS", "READ_TOGETHER", "pdl_coupled"]
