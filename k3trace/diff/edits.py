"""The edit script between two builds' step graphs, and the union graph it is replayed on
(METRICS.md, "Diff of two builds").

Every kernel of either build is one union node: a matched pair, a removed (old only) or an
added (new only) kernel. Each node carries both builds' versions of what the replay needs:
its duration and its inputs (stream predecessor, cross-stream join, CPU release, each with
its lag), mapped onto union nodes. An edit owns some of those parameters and switches them
from the old version to the new one:

- replacement: one run of removed and added kernels between the same matched neighbours
  (fusion k->1, split 1->k, swap 1->1, k->m, addition, removal). It owns the presence of its
  kernels and the inputs of the matched kernels next to them whose predecessors changed
  because of it;
- duration: a matched kernel's new duration;
- dependency: a segment's matched kernels whose predecessors changed (moved to another
  stream, a new or dropped join, PDL switched on or off);
- gap: a matched kernel with the same predecessors and a new lag or CPU release.

With every edit applied the union graph *is* the new build's graph; with none it is the
old one. A kernel that is absent in a variant (a removed one after its edit, an added one
before) stays in the graph with no duration and no lags, so what depended on it still
waits for what it waited for: the order of both builds is kept, never invented.

Edits of the same kind on the same kernels aggregate across layers into one player of the
attribution game. Players whose mixtures would need a cycle (two builds that order two
kernels oppositely) are merged into one: within a strongly connected part of the union
graph all kernels switch inputs together, so every variant is a DAG.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from k3trace.analyses.critical_path import STREAM
from k3trace.analyses.stepgraph import SLOTS, STREAM_SLOT, StepGraph, side_stream
from k3trace.diff.matching import ADDED, MATCHED, ONLY_NEW, ONLY_OLD, REMOVED
from k3trace.text import layer_text

REPLACEMENT, DURATION, DEPENDENCY, GAP, STRUCTURE = "replacement", "duration", "dependency", "gap", "structure"
NONE = -1


@dataclass(frozen=True)
class UnionGraph:
    """Both builds' parameters per union node; [U] or [U, SLOTS] arrays, NaN-free.

    `present_old` / `present_new`: the node exists in that build. Inputs of the side a node
    does not exist on are empty (pred -1, launch -inf). `pdl_pred_old` / `pdl_pred_new`: the
    union node that released it through a chained PDL edge on its stream in that build, or -1.
    `start_old` / `start_new`: its recorded start in that build's representative step (ns;
    0 where absent), what a join inferred from timing is read against (coupling.py)."""

    names: list[str]
    family: list[str]
    layer: list[int | None]
    present_old: np.ndarray
    present_new: np.ndarray
    dur_old: np.ndarray
    dur_new: np.ndarray
    preds_old: np.ndarray
    lags_old: np.ndarray
    launch_old: np.ndarray
    preds_new: np.ndarray
    lags_new: np.ndarray
    launch_new: np.ndarray
    pdl_pred_old: np.ndarray
    pdl_pred_new: np.ndarray
    start_old: np.ndarray
    start_new: np.ndarray
    blocks: list[np.ndarray]   # replay order: strongly connected blocks in topological order

    @property
    def size(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class EditScript:
    union: UnionGraph
    owner_inputs: np.ndarray   # int [U]: player whose application switches the node's inputs, or -1
    owner_duration: np.ndarray  # int [U]: player switching the node's duration, or -1
    owner_presence: np.ndarray  # int [U]: player adding/removing the node, or -1
    players: pl.DataFrame      # player, kind, detail, family, label, layers (list), edits, kernels
    edits: pl.DataFrame        # one row per elementary edit: edit, player, kind, detail, family, layer, label
    edit_layer: np.ndarray     # object [U]: the layer of the node's edit (a replacement's: its run's first kernel's)


def _describe(names: list[str]) -> str:
    if len(names) <= 2:
        return " + ".join(names)
    return f"{len(names)} kernels"


def _replacement_label(removed: list[str], added: list[str]) -> tuple[str, str]:
    """(detail, label), e.g. ("fusion", "7 kernels -> vectorized_layer_norm_kernel")."""
    k, m = len(removed), len(added)
    if m == 0:
        return "removal", f"removed {_describe(removed)}"
    if k == 0:
        return "addition", f"added {_describe(added)}"
    shape = "swap" if k == m == 1 else "fusion" if m == 1 else "split" if k == 1 else f"{k}->{m}"
    return shape, f"{_describe(removed)} -> {_describe(added)}"


class _Players:
    """Edits grouped into players by key, with union-find merges."""

    def __init__(self) -> None:
        self.key_to_player: dict[tuple, int] = {}
        self.parent: list[int] = []
        self.meta: list[dict] = []
        self.edit_rows: list[dict] = []

    def edit(self, key: tuple, *, kind: str, detail: str, family: str, label: str, layer: int | None,
             kernels: int) -> int:
        player = self.key_to_player.get(key)
        if player is None:
            player = self.key_to_player[key] = len(self.parent)
            self.parent.append(player)
            self.meta.append({"kind": kind, "detail": detail, "family": family, "label": label})
        self.edit_rows.append({"edit": len(self.edit_rows), "player": player, "kind": kind, "detail": detail,
                               "family": family, "layer": layer, "label": label, "kernels": kernels})
        return player

    def find(self, p: int) -> int:
        while self.parent[p] != p:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        return p

    def merge(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _map(preds: np.ndarray, to_union: np.ndarray) -> np.ndarray:
    return np.where(preds >= 0, to_union[np.clip(preds, 0, None)], -1)


def _sccs(preds: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Strongly connected components of the graph with edges preds[u, :] -> u (iterative
    Tarjan), as blocks in topological order, and each node's block index."""
    # Python lists, not numpy arrays: the search touches one element at a time, and a numpy
    # scalar read or write costs several times a list's.
    n = len(preds)
    succ: list[list[int]] = [[] for _ in range(n)]
    for u, row in enumerate(preds.tolist()):
        for p in row:
            if p >= 0:
                succ[p].append(u)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    comps: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    comps.reverse()  # Tarjan emits components in reverse topological order
    block_of = np.empty(n, dtype=np.int64)
    for b, comp in enumerate(comps):
        block_of[comp] = b
    return [np.array(sorted(c), dtype=np.int64) for c in comps], block_of


def build(old: StepGraph, new: StepGraph, match: pl.DataFrame) -> EditScript:
    match = match.with_row_index("u")
    n = match.height
    old_of = match["old_idx"].fill_null(-1).to_numpy()
    new_of = match["new_idx"].fill_null(-1).to_numpy()
    kind = match["kind"].to_list()
    to_union_old = np.full(old.size, -1, dtype=np.int64)
    to_union_new = np.full(new.size, -1, dtype=np.int64)
    to_union_old[old_of[old_of >= 0]] = np.nonzero(old_of >= 0)[0]
    to_union_new[new_of[new_of >= 0]] = np.nonzero(new_of >= 0)[0]
    has_old, has_new = old_of >= 0, new_of >= 0

    def side(g: StepGraph, idx: np.ndarray, has: np.ndarray, to_union: np.ndarray):
        safe = np.clip(idx, 0, None)
        dur = np.where(has, g.duration[safe], 0.0)
        preds = np.where(has[:, None], _map(g.preds[safe], to_union), -1)
        lags = np.where(has[:, None], g.lags[safe], 0.0)
        launch = np.where(has, (g.launch_at + g.launch_lag)[safe], -np.inf)
        pdl = np.where(has, g.nodes["pdl"].fill_null(False).to_numpy()[safe], False)
        side = np.where(has, side_stream(g)[safe], False)
        # A chained PDL edge: the stream predecessor released it and the dependent's reported
        # start follows the primary's reported end (METRICS.md, "PDL"). A PDL edge a graph
        # replay put across its internal streams shows as overlap instead, a real one.
        binding = np.where(has, g.nodes["binding"].fill_null("").to_numpy()[safe], "")
        pdl_pred = np.where(pdl & (binding == STREAM), preds[:, STREAM_SLOT], -1)
        start = np.where(has, g.nodes["start"].to_numpy()[safe].astype(np.float64), 0.0)
        return dur, preds, lags, launch, pdl, side, pdl_pred, start

    dur_o, preds_o, lags_o, launch_o, pdl_o, side_o, pdl_pred_o, start_o = side(old, old_of, has_old, to_union_old)
    dur_n, preds_n, lags_n, launch_n, pdl_n, side_n, pdl_pred_n, start_n = side(new, new_of, has_new, to_union_new)
    blocks, _ = _sccs(np.concatenate([preds_o, preds_n], axis=1))

    names, family, layer = match["name"].to_list(), match["family"].to_list(), match["layer"].to_list()
    runs = match["run"].to_list()
    players = _Players()
    owner_in = np.full(n, NONE, dtype=np.int64)
    owner_dur = np.full(n, NONE, dtype=np.int64)
    owner_pres = np.full(n, NONE, dtype=np.int64)

    # Replacements: one edit per run, keyed across layers by family and the names involved.
    run_player: dict[int, int] = {}
    # A run's kernels can carry two labels (a fused kernel placed past the layer boundary by
    # its donor's labels): its edit, and what it recorded, belong to the run's layer.
    edit_layer = np.array(layer, dtype=object)
    by_run = match.filter(pl.col("run").is_not_null()).group_by("run", maintain_order=True).agg(
        "u", "kind", "name", pl.col("family").first(), pl.col("layer").first())
    for run, us, kinds, run_names, fam, lay in by_run.iter_rows():
        removed = [nm for k, nm in zip(kinds, run_names) if k == REMOVED]
        added = [nm for k, nm in zip(kinds, run_names) if k == ADDED]
        detail, label = _replacement_label(removed, added)
        p = players.edit((REPLACEMENT, fam, tuple(removed), tuple(added)), kind=REPLACEMENT, detail=detail,
                         family=fam, label=label, layer=lay, kernels=len(us))
        run_player[run] = p
        owner_pres[us] = p
        edit_layer[us] = lay
    structural = [u for u in range(n) if kind[u] in (ONLY_OLD, ONLY_NEW)]
    if structural:
        only_old = sorted({layer[u] for u in structural if kind[u] == ONLY_OLD}, key=lambda x: -1 if x is None else x)
        only_new = sorted({layer[u] for u in structural if kind[u] == ONLY_NEW}, key=lambda x: -1 if x is None else x)
        if not (has_old & has_new).any():
            label = (f"different workloads: no kernel matched ({int(has_old.sum())} old, {int(has_new.sum())} new "
                     f"kernels per step)")
        else:
            label = "; ".join(part for part in (
                f"layers only in old: {layer_text(only_old)}" if only_old else "",
                f"layers only in new: {layer_text(only_new)}" if only_new else "") if part)
        p = players.edit((STRUCTURE,), kind=STRUCTURE, detail="", family="-", label=label, layer=None,
                         kernels=len(structural))
        owner_pres[structural] = p

    def run_of(u: int) -> int | None:
        return run_player.get(runs[u]) if runs[u] is not None else (owner_pres[u] if owner_pres[u] >= 0 else None)

    # Matched kernels: durations, then inputs (replacement-owned, dependency or gap).
    # Which matched kernels changed, compared whole-array (per kernel, np.array_equal calls
    # took more than the rest of the loop); the loop below walks them in union order, since
    # that order numbers the players.
    matched = np.nonzero(has_old & has_new)[0]
    same_preds_of = (preds_o[matched] == preds_n[matched]).all(axis=1).tolist()
    same_lags_of = (lags_o[matched] == lags_n[matched]).all(axis=1).tolist()
    same_launch_of = (launch_o[matched] == launch_n[matched]).tolist()
    new_dur_of = (dur_o[matched] != dur_n[matched]).tolist()
    preds_o_l, preds_n_l = preds_o.tolist(), preds_n.tolist()
    dependency_nodes: dict[tuple[int | None, str], list[tuple[int, str]]] = {}
    for u, same_preds, same_lags, same_launch, new_dur in zip(matched.tolist(), same_preds_of, same_lags_of,
                                                              same_launch_of, new_dur_of):
        if new_dur:
            owner_dur[u] = players.edit((DURATION, family[u], names[u]), kind=DURATION, detail="", family=family[u],
                                        label=names[u], layer=layer[u], kernels=1)
        if same_preds and same_lags and same_launch:
            continue
        neighbours = [p for p in (*preds_o_l[u], *preds_n_l[u]) if p >= 0 and kind[p] != MATCHED]
        owners = sorted({o for o in (run_of(p) for p in neighbours) if o is not None})
        if owners:
            owner_in[u] = owners[0]
            for other in owners[1:]:
                players.merge(owners[0], other)
        elif not same_preds:
            detail = "stream order" if preds_o_l[u][0] != preds_n_l[u][0] else "join"
            if side_o[u] != side_n[u]:
                detail = "moved to a side stream" if side_n[u] else "moved to the main stream"
            dependency_nodes.setdefault((layer[u], family[u]), []).append((u, detail))
        elif pdl_o[u] != pdl_n[u]:
            dependency_nodes.setdefault((layer[u], family[u]), []).append((u, "PDL on" if pdl_n[u] else "PDL off"))
        else:
            detail = "launch" if same_lags else ""
            owner_in[u] = players.edit((GAP, family[u], names[u]), kind=GAP, detail=detail, family=family[u],
                                       label=names[u], layer=layer[u], kernels=1)
    # Dependency changes: one edit per segment, one player per family. Which join or stream
    # order a kernel shows shifts with timing and graph replays renumber their streams, so
    # per-kernel detail is a poor key; the family's fork/join structure is the change.
    by_family: dict[str, list[tuple[int, str]]] = {}
    for (_, fam), items in dependency_nodes.items():
        by_family.setdefault(fam, []).extend(items)
    for (lay, fam), items in dependency_nodes.items():
        every = by_family[fam]
        p = players.edit((DEPENDENCY, fam), kind=DEPENDENCY, detail=", ".join(sorted({d for _, d in every})),
                         family=fam, label=_dependency_label(every, names), layer=lay, kernels=len(items))
        owner_in[[u for u, _ in items]] = p
    # Kernels that order each other oppositely in the two builds must switch together.
    for block in blocks:
        if len(block) > 1:
            owners = sorted({int(o) for o in owner_in[block] if o >= 0})
            for other in owners[1:]:
                players.merge(owners[0], other)
    return _finish(players, owner_in, owner_dur, owner_pres, edit_layer, UnionGraph(
        names=names, family=family, layer=layer, present_old=has_old, present_new=has_new,
        dur_old=dur_o, dur_new=dur_n, preds_old=preds_o, lags_old=lags_o, launch_old=launch_o,
        preds_new=preds_n, lags_new=lags_n, launch_new=launch_n, pdl_pred_old=pdl_pred_o,
        pdl_pred_new=pdl_pred_n, start_old=start_o, start_new=start_n, blocks=blocks))


def _dependency_label(items: list[tuple[int, str]], names: list[str]) -> str:
    """e.g. `moved to a side stream: gemv_kernel, kda_conv_silu_kernel; 3 joins`."""
    by_detail: dict[str, list[str]] = {}
    for u, d in items:
        by_detail.setdefault(d, []).append(names[u])
    parts = []
    for d in sorted(by_detail, key=lambda d: (not d.startswith("moved"), d)):
        kernels = sorted(set(by_detail[d]))
        if d.startswith("moved") or len(by_detail) == 1:
            shown = ", ".join(kernels[:3]) + (f" +{len(kernels) - 3}" if len(kernels) > 3 else "")
            parts.append(f"{d}: {shown}")
        else:
            parts.append(f"{len(by_detail[d])} {d}")
    return "; ".join(parts)


def _finish(players: _Players, owner_in: np.ndarray, owner_dur: np.ndarray, owner_pres: np.ndarray,
            edit_layer: np.ndarray, union: UnionGraph) -> EditScript:
    """Renumber merged players 0..P-1 and tabulate them."""
    roots = sorted({players.find(p) for p in range(len(players.parent))})
    index = {r: i for i, r in enumerate(roots)}
    final = np.array([index[players.find(p)] for p in range(len(players.parent))] or [0], dtype=np.int64)

    def remap(owner: np.ndarray) -> np.ndarray:
        return np.where(owner >= 0, final[np.clip(owner, 0, None)], NONE)

    edits = pl.DataFrame(players.edit_rows, schema={
        "edit": pl.Int64, "player": pl.Int64, "kind": pl.String, "detail": pl.String, "family": pl.String,
        "layer": pl.Int64, "label": pl.String, "kernels": pl.Int64})
    edits = edits.with_columns(pl.Series("player", final[edits["player"].to_numpy()] if edits.height else [],
                                         dtype=pl.Int64))
    # A merged player is named by its members (their kinds and labels, largest first).
    members = edits.group_by("player", "kind", "detail", "family", "label").agg(
        pl.col("layer").unique().sort().alias("layers"), pl.len().alias("edits"), pl.col("kernels").sum())
    table = members.sort(["player", "edits", "label"], descending=[False, True, False]).group_by(
        "player", maintain_order=True).agg(
        pl.col("kind").unique(maintain_order=True).str.join(" + "),
        pl.col("detail").filter(pl.col("detail") != "").unique(maintain_order=True).str.join(", "),
        pl.col("family").unique(maintain_order=True).str.join(", "),
        pl.col("label").str.join(" | "),
        pl.col("layers").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
        pl.col("edits").sum(), pl.col("kernels").sum(),
    ).sort("player")
    return EditScript(union=union, owner_inputs=remap(owner_in), owner_duration=remap(owner_dur),
                      owner_presence=remap(owner_pres), players=table, edits=edits, edit_layer=edit_layer)


__all__ = ["DEPENDENCY", "DURATION", "EditScript", "GAP", "REPLACEMENT", "STRUCTURE", "SLOTS", "UnionGraph", "build"]
