"""Counterfactual attribution of a span delta (METRICS.md): replay the old build's step
dependency graph with one change at a time and credit each change with the span it moves.

Changes: a matched kernel's new duration; a matched kernel's new binding gap; a removed
kernel taken out (no time, no gap before it); an added kernel at its aligned place with its
edges and gaps from the new build. All changes at once give the modelled delta; its
difference from the sum of single changes is the interaction term, and its difference from
the measured delta is the residual. Both are reported, never folded into a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import heapq

import numpy as np
import polars as pl

from k3trace.analyses import stepgraph
from k3trace.analyses.stepgraph import (
    EXTRA_SLOT, JOIN_SLOT, NEVER, NEW_JOIN_SLOT, NEW_STREAM_SLOT, SLOTS, STREAM_SLOT, StepGraph,
)
from k3trace.diff.matching import ADDED, MATCHED, REMOVED

DURATION, GAP, DEPENDENCY, REORDERED = "duration", "gap", "dependency", "reordered"
_OWN = (STREAM_SLOT, JOIN_SLOT)
_NEW = (NEW_STREAM_SLOT, NEW_JOIN_SLOT)
BATCH = 192  # variants replayed together (memory: BATCH x nodes x SLOTS floats)


@dataclass(frozen=True)
class UnionGraph:
    """The old graph plus the new build's added kernels, inert until a variant adds them."""

    graph: StepGraph
    present: np.ndarray        # bool [n]: node exists in the old build
    added_duration: np.ndarray  # float [n]: duration when added (0 for old nodes)
    added_lags: np.ndarray      # float [n, SLOTS]: edge lags when added
    added_out: list[tuple[int, int, float]]  # (successor, slot, lag) edges from added nodes
    new_edges: dict[int, tuple[np.ndarray, np.ndarray]]  # old node -> (new preds mapped, their lags)
    keep_old: dict[int, np.ndarray]  # old node -> which of its old edges the new build still implies
    reordered: set[int]        # old nodes whose new edges partly run backward (not replayable)


@dataclass(frozen=True)
class Attribution:
    changes: pl.DataFrame      # one row per change: kind, name, family, layer, delta_ns
    base_span_ns: float        # replayed old span
    modelled_ns: float         # all changes at once minus base
    interaction_ns: float      # modelled minus the sum of single-change contributions


def _union(old: StepGraph, new: StepGraph, match: pl.DataFrame) -> UnionGraph:
    added = match.filter(pl.col("kind") == ADDED).join(
        new.nodes.with_row_index("new_idx").select(pl.col("new_idx").cast(pl.Int64), "start"), on="new_idx"
    ).sort("start")
    n_old, n_add = old.size, added.height
    n = n_old + n_add
    to_union = {int(j): int(i) for i, j in match.filter(pl.col("kind") == MATCHED).select("old_idx", "new_idx").iter_rows()}
    for k, j in enumerate(added["new_idx"].to_list()):
        to_union[int(j)] = n_old + k
    preds = np.full((n, SLOTS), -1, dtype=np.int64)
    preds[:n_old] = old.preds
    lags = np.zeros((n, SLOTS))
    lags[:n_old] = old.lags
    added_lags = np.zeros((n, SLOTS))
    added_duration = np.zeros(n)
    launch_at = np.concatenate([old.launch_at, np.full(n_add, NEVER)])
    launch_lag = np.concatenate([old.launch_lag, np.zeros(n_add)])
    position = list(map(float, np.argsort(old.order)))  # old node -> its place in the old order
    position += [0.0] * n_add
    successors: dict[int, list[tuple[int, int]]] = {}
    for k_new in range(new.size):
        for slot in range(SLOTS):
            p = int(new.preds[k_new, slot])
            if p >= 0:
                successors.setdefault(p, []).append((k_new, slot))
    added_out: list[tuple[int, int, float]] = []
    for k, j in enumerate(added["new_idx"].to_list()):
        u = n_old + k
        added_duration[u] = new.duration[j]
        for slot in range(SLOTS):
            p = int(new.preds[j, slot])
            if p >= 0 and p in to_union:
                preds[u, slot] = to_union[p]
                added_lags[u, slot] = new.lags[j, slot]
        lags[u] = NEVER  # inert in the old build
        pred_places = [position[preds[u, s]] for s in range(SLOTS) if preds[u, s] >= 0]
        position[u] = (max(pred_places) if pred_places else -1.0) + 0.5 + k * 1e-6
        for k_new, slot in successors.get(j, []):
            succ = to_union.get(k_new)
            if succ is not None and succ < n_old and preds[succ, EXTRA_SLOT] < 0:
                preds[succ, EXTRA_SLOT] = u
                lags[succ, EXTRA_SLOT] = NEVER
                added_out.append((succ, EXTRA_SLOT, float(new.lags[k_new, slot])))
    # A matched kernel's incoming edges in the new build, mapped onto union nodes: inert in
    # the base, switched on (and its old edges off) by a gap or dependency change.
    new_edges: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    keep_old: dict[int, np.ndarray] = {}
    reordered: set[int] = set()
    ancestors = _ancestors(new)
    old_to_new = {i: j for j, i in to_union.items() if i < n_old}
    for i, j in match.filter(pl.col("kind") == MATCHED).select("old_idx", "new_idx").iter_rows():
        # An old edge survives a dependency change while its predecessor still has to run
        # first in the new build (directly or through others): a kernel's new edges alone
        # must not drop a constraint that the rest of the new build still imposes.
        keep_old[i] = np.array([
            old.preds[i, s] >= 0 and (old_to_new.get(int(old.preds[i, s])) is None
                                      or bool(ancestors[j] >> old_to_new[int(old.preds[i, s])] & 1))
            for s in _OWN
        ])
        mapped = np.array([to_union.get(int(new.preds[j, s]), -1) if new.preds[j, s] >= 0 else -1 for s in _OWN])
        preds[i, list(_NEW)] = mapped
        lags[i, list(_NEW)] = NEVER
        new_edges[i] = (mapped, new.lags[j, list(_OWN)])
    order = _topological(preds, np.array(position), reordered)
    for i in reordered:
        new_edges[i] = (preds[i, list(_NEW)].copy(), new_edges[i][1])
    nodes = pl.concat([old.nodes, new.nodes.with_row_index("i").filter(
        pl.col("i").is_in(added["new_idx"].to_list())).drop("i")], how="vertical_relaxed") if n_add else old.nodes
    graph = StepGraph(nodes=nodes, preds=preds, lags=lags, launch_at=launch_at, launch_lag=launch_lag,
                      duration=np.concatenate([old.duration, np.zeros(n_add)]), order=order)
    present = np.concatenate([np.ones(n_old, bool), np.zeros(n_add, bool)])
    return UnionGraph(graph, present, added_duration, added_lags, added_out, new_edges, keep_old, reordered)


def _topological(preds: np.ndarray, position: np.ndarray, reordered: set[int]) -> np.ndarray:
    """An order with every node after its predecessors, old and new, preferring the old
    step's order. Where the two builds disagree on order in a way no single order can
    hold (a cycle through new-build edges), the earliest such kernel's conflicting new edges
    are dropped and it is marked `reordered`: its effect stays in the residual."""
    n = len(position)
    while True:
        indegree = (preds >= 0).sum(axis=1)
        children: dict[int, list[int]] = {}
        for i, p in zip(*np.nonzero(preds >= 0)):
            children.setdefault(int(preds[i, p]), []).append(int(i))
        ready = [(position[i], i) for i in range(n) if indegree[i] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, i = heapq.heappop(ready)
            order.append(i)
            for c in children.get(i, []):
                indegree[c] -= 1
                if indegree[c] == 0:
                    heapq.heappush(ready, (position[c], c))
        if len(order) == n:
            return np.array(order, dtype=np.int64)
        left = set(range(n)) - set(order)
        stuck = min((i for i in left if any(preds[i, s] in left for s in _NEW)), key=lambda i: position[i])
        for s in _NEW:
            if preds[stuck, s] in left:
                preds[stuck, s] = -1
        reordered.add(stuck)


def _ancestors(g: StepGraph) -> list[int]:
    """Per node, a bitset (Python int) of every node that must finish before it starts."""
    anc = [0] * g.size
    for i in g.order:
        for p in g.preds[i]:
            if p >= 0:
                anc[i] |= anc[p] | (1 << int(p))
    return anc


def _change_list(old: StepGraph, new: StepGraph, match: pl.DataFrame, u: UnionGraph) -> list[dict]:
    changes: list[dict] = []
    for old_idx, new_idx, kind, layer, family, name in match.iter_rows():
        base = {"name": name, "family": family, "layer": layer}
        if kind == MATCHED:
            if new.duration[new_idx] != old.duration[old_idx]:
                changes.append({**base, "kind": DURATION, "node": old_idx, "value": new.duration[new_idx]})
            mapped, new_lags = u.new_edges[old_idx]
            same_preds = np.array_equal(mapped, old.preds[old_idx, list(_OWN)])
            if old_idx in u.reordered:
                changes.append({**base, "kind": REORDERED, "node": old_idx, "value": None})
            if not same_preds or not np.array_equal(new_lags, old.lags[old_idx, list(_OWN)]):
                changes.append({**base, "kind": GAP if same_preds else DEPENDENCY, "node": old_idx, "value": None})
        elif kind == REMOVED:
            changes.append({**base, "kind": REMOVED, "node": old_idx, "value": None})
    n_old = old.size
    added_idx = match.filter(pl.col("kind") == ADDED)
    for k, (layer, family, name) in enumerate(added_idx.join(
            new.nodes.with_row_index("new_idx").select(pl.col("new_idx").cast(pl.Int64), "start"), on="new_idx"
    ).sort("start").select("layer", "family", "name").iter_rows()):
        changes.append({"name": name, "family": family, "layer": layer, "kind": ADDED, "node": n_old + k, "value": None})
    return changes


def _apply(change: dict, dur: np.ndarray, lags: np.ndarray, present: np.ndarray, u: UnionGraph) -> None:
    node, kind = change["node"], change["kind"]
    if kind == DURATION:
        dur[node] = change["value"]
    elif kind in (GAP, DEPENDENCY):
        _, new_lags = u.new_edges[node]
        if (u.graph.preds[node, list(_NEW)] < 0).all():
            return  # the new build launched it straight from the CPU: keep the old edges
        lags[node, list(_OWN)] = np.where(u.keep_old[node], np.minimum(lags[node, list(_OWN)], 0.0), NEVER)
        lags[node, list(_NEW)] = np.where(u.graph.preds[node, list(_NEW)] >= 0, new_lags, NEVER)
    elif kind == REMOVED:
        dur[node] = 0.0
        lags[node] = np.where(lags[node] > NEVER / 2, 0.0, NEVER)
        present[node] = False
    elif kind == ADDED:
        dur[node] = u.added_duration[node]
        lags[node] = np.where(u.graph.preds[node] >= 0, u.added_lags[node], NEVER)
        present[node] = True
        for succ, slot, lag in u.added_out:
            if u.graph.preds[succ, slot] == node:
                lags[succ, slot] = lag


def attribute(old: StepGraph, new: StepGraph, match: pl.DataFrame) -> Attribution:
    u = _union(old, new, match)
    changes = _change_list(old, new, match, u)
    g = u.graph
    launch_at = g.launch_at.copy()
    for node in range(old.size, g.size):  # an added root kernel releases at the step start
        if (g.preds[node] < 0).all():
            launch_at[node] = 0.0
    g = StepGraph(nodes=g.nodes, preds=g.preds, lags=g.lags, launch_at=launch_at, launch_lag=g.launch_lag,
                  duration=g.duration, order=g.order)
    variants = [[]] + [[c] for c in changes] + [changes]
    spans = np.empty(len(variants))
    for lo in range(0, len(variants), BATCH):
        chunk = variants[lo:lo + BATCH]
        dur = np.tile(g.duration, (len(chunk), 1))
        lags = np.tile(g.lags, (len(chunk), 1, 1))
        present = np.tile(u.present, (len(chunk), 1))
        for v, applied in enumerate(chunk):
            for c in applied:
                _apply(c, dur[v], lags[v], present[v], u)
        start, end = stepgraph.replay(g, dur, lags)
        spans[lo:lo + len(chunk)] = stepgraph.span(start, end, present)
    base, single, every = spans[0], spans[1:-1], spans[-1]
    table = pl.DataFrame(
        {"kind": [c["kind"] for c in changes], "name": [c["name"] for c in changes],
         "family": [c["family"] for c in changes], "layer": [c["layer"] for c in changes],
         "delta_ns": single - base},
        schema={"kind": pl.String, "name": pl.String, "family": pl.String, "layer": pl.Int64, "delta_ns": pl.Float64},
    )
    modelled = float(every - base)
    return Attribution(changes=table, base_span_ns=float(base), modelled_ns=modelled,
                       interaction_ns=modelled - float(table["delta_ns"].sum()))
