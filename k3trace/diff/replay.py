"""Replay the union graph of two builds for many sets of applied edits at once.

A variant is a row of `applied` (bool [V, P]: which players' edits are switched to the new
build). Per union node the variant decides its inputs (old or new), its duration and
whether it is present; an absent node keeps its place with no duration, no lags and no CPU
release, so it passes its predecessors' constraints on (edits.py). The pass runs over
nodes in the union graph's topological order, vectorised over variants; a strongly
connected block (two builds ordering kernels oppositely) is relaxed as many times as it
has nodes, which is exact because within a block every variant uses one build's edges.
"""

from __future__ import annotations

import numpy as np

from k3trace.analyses.stepgraph import SLOTS
from k3trace.diff.edits import EditScript

#: Variants replayed together; memory is about 10 x BATCH x nodes x 8 bytes (at ~2,200
#: union nodes 180 MB, under the diff's peak while its analyses run). The pass's Python loop
#: over the nodes costs about as much for 1024 variants as for 256: the sampled Shapley
#: estimate of two full-depth exports (944 variants) in one pass, not four.
BATCH = 1024


def _gather(applied: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """[U, V]: applied[v, owner[u]], False where a node has no owner."""
    padded = np.concatenate([applied.astype(bool), np.zeros((applied.shape[0], 1), dtype=bool)], axis=1)
    return padded[:, np.where(owner >= 0, owner, applied.shape[1])].T


def spans(script: EditScript, applied: np.ndarray) -> np.ndarray:
    """Replayed step span (ns) of every variant."""
    out = np.empty(applied.shape[0])
    for lo in range(0, applied.shape[0], BATCH):
        out[lo:lo + BATCH] = _spans(script, applied[lo:lo + BATCH])
    return out


def _inputs(preds: np.ndarray, lag: np.ndarray, new_side: np.ndarray, use_new: np.ndarray, present: np.ndarray,
            end: np.ndarray) -> list[list[tuple[np.ndarray, np.ndarray | float]]]:
    """Per node, its inputs as (predecessor's end row, lag): the lag where the variant uses
    that build's inputs (0 for an absent node), -inf where it does not (the slot is unused).
    Most nodes take one build's inputs and are present in every variant: their lags are one
    number, and a slot no variant uses is left out (-inf never wins the maximum). Only the
    rest get a row of variants (as rows for every slot, they took 17 MB per 256 variants)."""
    node, slot = np.nonzero(preds >= 0)
    used = use_new[node] == new_side[slot][:, None]                              # [inputs, V]
    there = present[node]
    first = np.where(used[:, 0], np.where(there[:, 0], lag[node, slot], 0.0), -np.inf)
    constant = (used == used[:, :1]).all(axis=1) & (there == there[:, :1]).all(axis=1)
    varying = np.flatnonzero(~constant)
    rows = np.where(used[varying], np.where(there[varying], lag[node[varying], slot[varying]][:, None], 0.0),
                    -np.inf)
    lags: list[np.ndarray | float] = first.tolist()
    for i, row in zip(varying.tolist(), rows):
        lags[i] = row
    keep = ~constant | (first > -np.inf)
    out: list[list[tuple[np.ndarray, np.ndarray | float]]] = [[] for _ in range(len(preds))]
    for u, p, i in zip(node[keep].tolist(), preds[node, slot][keep].tolist(), np.flatnonzero(keep).tolist()):
        out[u].append((end[p], lags[i]))
    return out


def _spans(script: EditScript, applied: np.ndarray) -> np.ndarray:
    g = script.union
    v = applied.shape[0]
    both = (g.present_old & g.present_new)[:, None]
    switched = _gather(applied, script.owner_presence)
    # Present: removed kernels until their edit applies, added ones once it does.
    present = np.where(both, True, np.where(g.present_old[:, None], ~switched, switched))
    use_new = np.where(both, _gather(applied, script.owner_inputs), ~g.present_old[:, None])
    dur = np.where(both & _gather(applied, script.owner_duration) | ~g.present_old[:, None],
                   g.dur_new[:, None], g.dur_old[:, None])
    dur = np.where(present, dur, 0.0)
    launch = np.where(present, np.where(use_new, g.launch_new[:, None], g.launch_old[:, None]), -np.inf)
    # Both builds' input slots side by side: [old stream, old join, new stream, new join].
    preds = np.concatenate([g.preds_old, g.preds_new], axis=1)
    lag = np.concatenate([g.lags_old, g.lags_new], axis=1)
    new_side = np.array([False] * SLOTS + [True] * SLOTS)
    start = np.full((g.size, v), -np.inf)
    end = np.full((g.size, v), -np.inf)
    inputs = _inputs(preds, lag, new_side, use_new, present, end)
    reach = np.empty(v)
    # Rows as views, taken once: indexing a row costs as much as a ufunc over 256 variants.
    by_node = list(zip(start, end, launch, dur, inputs))
    for block in g.blocks:
        for _ in range(len(block)):
            for u in block.tolist():
                t, t_end, t_launch, t_dur, t_inputs = by_node[u]
                np.copyto(t, t_launch)
                for pred_end, lag_u in t_inputs:
                    np.maximum(t, np.add(pred_end, lag_u, out=reach), out=t)
                np.add(t, t_dur, out=t_end)
    first = np.where(present, start, np.inf).min(axis=0)
    last = np.where(present, end, -np.inf).max(axis=0)
    result = last - first
    if not np.isfinite(result).all():
        raise ValueError("replayed span is not finite: a variant left no kernel present")
    return result
