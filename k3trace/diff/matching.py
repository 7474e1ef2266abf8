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

Where the segments leave too few kernels matched, the labels may be what differs, not the
kernels (an nsys report with layer NVTX against a torch.profiler trace of the same build,
whose layers are inferred): then the whole step is aligned as one sequence, the rows carry
the old build's labels, and the diff says so.
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


#: A node in alignment order: (index, name, alignment token, layer, family).
Node = tuple[int, str, object, "int | None", str]


def _keyed(g: StepGraph, *, whole_step: bool = False) -> dict[tuple[int, str], list[Node]]:
    """(layer, family) -> its nodes in launch order (`whole_step`: one segment of all); the
    token is the signature, or the short name where a reader has none."""
    nodes = g.nodes.with_row_index("idx").sort("launch_rank")
    # Columns as lists: iterating a Series or a frame's rows costs several times as much.
    signature = nodes["signature"].to_list() if "signature" in nodes.columns else [None] * nodes.height
    groups: dict[tuple[int, str], list[Node]] = {}
    for idx, layer, family, name, sig in zip(*(nodes[c].to_list() for c in ("idx", "layer", "family", "name")),
                                             signature):
        key = (0, "") if whole_step else (-1 if layer is None else int(layer), family)
        groups.setdefault(key, []).append((int(idx), name, name if sig is None else sig, layer, family))
    return groups


def match_nodes(old: StepGraph, new: StepGraph) -> pl.DataFrame:
    """One row per old or new node: old_idx, new_idx (null when absent), kind, layer, family
    (a matched kernel's are the old build's), name, run (the replacement edit's id for
    added/removed kernels, else null), and `across_labels`: true where the kernels were
    aligned over the whole step because the builds' labels share no segment (below)."""
    size = max(old.size, new.size, 1)
    frame = _aligned(_keyed(old), _keyed(new))
    if _matched(frame) >= MIN_MATCHED_SHARE * size:
        return frame.with_columns(pl.lit(False).alias("across_labels"))
    # The same kernels under labels that disagree (one build labelled by its NVTX ranges, the
    # other by its kernel sequence or an engine's module names) share no (layer, family)
    # segment: aligned over the whole step they match again.
    whole = _aligned(_keyed(old, whole_step=True), _keyed(new, whole_step=True))
    if _matched(whole) >= MIN_MATCHED_SHARE * size:
        return whole.with_columns(pl.lit(True).alias("across_labels"))
    none = pl.lit(None, dtype=pl.Int64)
    return pl.concat([
        frame.filter(pl.col("old_idx").is_not_null()).with_columns(
            none.alias("new_idx"), pl.lit(ONLY_OLD).alias("kind"), none.alias("run")),
        frame.filter(pl.col("new_idx").is_not_null()).with_columns(
            none.alias("old_idx"), pl.lit(ONLY_NEW).alias("kind"), none.alias("run")),
    ]).with_columns(pl.lit(False).alias("across_labels"))


def _matched(frame: pl.DataFrame) -> int:
    return int((frame["kind"] == MATCHED).sum())


def _aligned(a: dict[tuple[int, str], list[Node]], b: dict[tuple[int, str], list[Node]]) -> pl.DataFrame:
    """Each segment's two launch-ordered sequences aligned; segments of a layer that one build
    lacks are `only_old` / `only_new`."""
    rows: list[tuple] = []
    run = 0
    shared_layers = {k[0] for k in a} & {k[0] for k in b}
    for key in sorted(set(a) | set(b), key=lambda k: (k[0], k[1])):
        olds, news = a.get(key, []), b.get(key, [])
        if key[0] not in shared_layers:
            only = ONLY_OLD if olds else ONLY_NEW
            rows.extend((i if olds else None, None if olds else i, only, lay, fam, n, None)
                        for i, n, _, lay, fam in olds or news)
            continue
        matcher = difflib.SequenceMatcher(a=[t for _, _, t, _, _ in olds], b=[t for _, _, t, _, _ in news],
                                          autojunk=False)
        opcodes = matcher.get_opcodes()
        moved = _moved(olds, news, opcodes)
        for op, i1, i2, j1, j2 in opcodes:
            if op == "equal":
                rows.extend(_row(olds[i], news[j], MATCHED, None) for i, j in zip(range(i1, i2), range(j1, j2)))
                continue
            gone = [i for i in range(i1, i2) if i not in moved]
            came = [j for j in range(j1, j2) if j not in moved.values()]
            rows.extend(_row(olds[i], news[moved[i]], MATCHED, None) for i in range(i1, i2) if i in moved)
            rows.extend(_row(olds[i], None, REMOVED, run) for i in gone)
            rows.extend(_row(None, news[j], ADDED, run) for j in came)
            run += bool(gone or came)
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def _row(old: Node | None, new: Node | None, kind: str, run: int | None) -> tuple:
    """A match row; its labels are the old node's where there is one."""
    _, name, _, layer, family = old if old is not None else new
    return (old[0] if old is not None else None, new[0] if new is not None else None, kind, layer, family, name,
            run)


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
