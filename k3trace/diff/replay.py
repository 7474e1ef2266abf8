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

#: Variants replayed together; memory is about 10 x BATCH x nodes x 8 bytes.
BATCH = 256


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
    active = use_new[:, :, None] == new_side[None, None, :]                    # [U, V, 2 * SLOTS]
    lags = np.where(active, np.where(present[:, :, None], lag[:, None, :], 0.0), -np.inf)
    lags = np.ascontiguousarray(lags.transpose(0, 2, 1))                       # [U, 2 * SLOTS, V]
    start = np.full((g.size, v), -np.inf)
    end = np.full((g.size, v), -np.inf)
    slots = [np.nonzero(row >= 0)[0] for row in preds]

    def relax(u: int) -> None:
        used = slots[u]
        t = launch[u]
        if used.size:
            t = np.maximum(t, (end[preds[u, used]] + lags[u, used]).max(axis=0))
        start[u] = t
        end[u] = t + dur[u]

    for block in g.blocks:
        for _ in range(len(block)):
            for u in block:
                relax(int(u))
    first = np.where(present, start, np.inf).min(axis=0)
    last = np.where(present, end, -np.inf).max(axis=0)
    result = last - first
    if not np.isfinite(result).all():
        raise ValueError("replayed span is not finite: a variant left no kernel present")
    return result
