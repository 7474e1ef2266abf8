"""Match kernels across two builds (METRICS.md, "Diff of two builds"): within the same
layer and family, align the two launch-ordered kernel sequences, so a fused kernel that
replaces seven shows as one run of seven removed and one added kernel in that segment.

Sequences are aligned on each kernel's `signature` (its full demangled name with grid and
block): PyTorch's elementwise kernels all share the short name
`vectorized_elementwise_kernel`, and aligned on short names the residual add of one build
pairs with the `pow` of an RMSNorm in the other. Each contiguous run of removed and added
kernels between the same matched neighbours gets one `run` id: the replacement edit.
Kernels of a layer that exists in one build only are `only_old` / `only_new`: those are
not edits of a kernel (the builds differ in depth or structure) and are reported apart. A
family new to (or gone from) a layer both builds have is an edit like any other run.
"""

from __future__ import annotations

import difflib

import polars as pl

from k3trace.analyses.stepgraph import StepGraph

MATCHED, ADDED, REMOVED = "matched", "added", "removed"
#: Below this share of matched kernels (of the larger build) the builds are different
#: workloads, not edits of one: every kernel is reported as in one build only.
MIN_MATCHED_SHARE = 0.25
ONLY_OLD, ONLY_NEW = "only_old", "only_new"
SCHEMA = {"old_idx": pl.Int64, "new_idx": pl.Int64, "kind": pl.String, "layer": pl.Int64, "family": pl.String,
          "name": pl.String, "run": pl.Int64}


def _keyed(g: StepGraph) -> dict[tuple[int, str], list[tuple[int, str, object]]]:
    """(layer, family) -> [(node, name, alignment token)] in launch order; the token is the
    signature, or the short name where a reader has none."""
    nodes = g.nodes.with_row_index("idx").sort("launch_rank")
    # Columns as lists: iterating a Series or a frame's rows costs several times as much.
    signature = nodes["signature"].to_list() if "signature" in nodes.columns else [None] * nodes.height
    groups: dict[tuple[int, str], list[tuple[int, str, object]]] = {}
    for idx, layer, family, name, sig in zip(*(nodes[c].to_list() for c in ("idx", "layer", "family", "name")),
                                             signature):
        groups.setdefault((-1 if layer is None else int(layer), family), []).append(
            (int(idx), name, name if sig is None else sig))
    return groups


def match_nodes(old: StepGraph, new: StepGraph) -> pl.DataFrame:
    """One row per old or new node: old_idx, new_idx (null when absent), kind, layer, family,
    name, run (the replacement edit's id for added/removed kernels, else null)."""
    a, b = _keyed(old), _keyed(new)
    rows: list[tuple] = []
    run = 0
    shared_layers = {k[0] for k in a} & {k[0] for k in b}
    for key in sorted(set(a) | set(b), key=lambda k: (k[0], k[1])):
        olds, news = a.get(key, []), b.get(key, [])
        layer = None if key[0] < 0 else key[0]
        if key[0] not in shared_layers:
            only = ONLY_OLD if olds else ONLY_NEW
            rows.extend((i if olds else None, None if olds else i, only, layer, key[1], n, None) for i, n, _ in olds or news)
            continue
        matcher = difflib.SequenceMatcher(a=[t for *_, t in olds], b=[t for *_, t in news], autojunk=False)
        opcodes = matcher.get_opcodes()
        moved = _moved(olds, news, opcodes)
        for op, i1, i2, j1, j2 in opcodes:
            if op == "equal":
                rows.extend((olds[i][0], news[j][0], MATCHED, layer, key[1], olds[i][1], None)
                            for i, j in zip(range(i1, i2), range(j1, j2)))
                continue
            gone = [i for i in range(i1, i2) if i not in moved]
            came = [j for j in range(j1, j2) if j not in moved.values()]
            rows.extend((olds[i][0], news[moved[i]][0], MATCHED, layer, key[1], olds[i][1], None)
                        for i in range(i1, i2) if i in moved)
            rows.extend((olds[i][0], None, REMOVED, layer, key[1], olds[i][1], run) for i in gone)
            rows.extend((None, news[j][0], ADDED, layer, key[1], news[j][1], run) for j in came)
            run += bool(gone or came)
    frame = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    matched = int((frame["kind"] == MATCHED).sum())
    if matched < MIN_MATCHED_SHARE * max(old.size, new.size, 1):
        none = pl.lit(None, dtype=pl.Int64)
        frame = pl.concat([
            frame.filter(pl.col("old_idx").is_not_null()).with_columns(
                none.alias("new_idx"), pl.lit(ONLY_OLD).alias("kind"), none.alias("run")),
            frame.filter(pl.col("new_idx").is_not_null()).with_columns(
                none.alias("old_idx"), pl.lit(ONLY_NEW).alias("kind"), none.alias("run")),
        ])
    return frame


def _moved(olds: list, news: list, opcodes: list) -> dict[int, int]:
    """Kernels the alignment left removed at one place and added at another of the same
    segment, with the same signature: one kernel launched elsewhere (reordered, or moved to
    a side stream and launched ahead), not a removal and an addition. Paired in order."""
    removed: dict[object, list[int]] = {}
    for op, i1, i2, _, _ in opcodes:
        if op in ("delete", "replace"):
            for i in range(i1, i2):
                removed.setdefault(olds[i][2], []).append(i)
    pairs: dict[int, int] = {}
    for op, _, _, j1, j2 in opcodes:
        if op in ("insert", "replace"):
            for j in range(j1, j2):
                waiting = removed.get(news[j][2])
                if waiting:
                    pairs[waiting.pop(0)] = j
    return pairs
