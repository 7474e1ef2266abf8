"""Match kernels across two builds (METRICS.md, "Diff of two builds"): within the same
layer and family, align the two launch-ordered kernel-name sequences, so a fused kernel
that replaces two shows as one added and two removed kernels in that segment."""

from __future__ import annotations

import difflib

import polars as pl

from k3trace.analyses.stepgraph import StepGraph

MATCHED, ADDED, REMOVED = "matched", "added", "removed"


def _keyed(g: StepGraph) -> dict[tuple[int, str], list[tuple[int, str]]]:
    nodes = g.nodes.with_row_index("idx").sort("launch_rank")
    groups: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for idx, layer, family, name in nodes.select("idx", "layer", "family", "name").iter_rows():
        groups.setdefault((-1 if layer is None else int(layer), family), []).append((int(idx), name))
    return groups


def match_nodes(old: StepGraph, new: StepGraph) -> pl.DataFrame:
    """One row per old or new node: old_idx, new_idx (null when absent), kind, layer, family, name."""
    a, b = _keyed(old), _keyed(new)
    rows: list[tuple[int | None, int | None, str, int | None, str, str]] = []
    for key in sorted(set(a) | set(b), key=lambda k: (k[0], k[1])):
        olds, news = a.get(key, []), b.get(key, []),
        layer = None if key[0] < 0 else key[0]
        matcher = difflib.SequenceMatcher(a=[n for _, n in olds], b=[n for _, n in news], autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                rows.extend((olds[i][0], news[j][0], MATCHED, layer, key[1], olds[i][1])
                            for i, j in zip(range(i1, i2), range(j1, j2)))
                continue
            rows.extend((olds[i][0], None, REMOVED, layer, key[1], olds[i][1]) for i in range(i1, i2))
            rows.extend((None, news[j][0], ADDED, layer, key[1], news[j][1]) for j in range(j1, j2))
    return pl.DataFrame(
        rows, schema={"old_idx": pl.Int64, "new_idx": pl.Int64, "kind": pl.String, "layer": pl.Int64,
                      "family": pl.String, "name": pl.String}, orient="row",
    )
