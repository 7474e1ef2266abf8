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

from typing import Callable, NamedTuple

import numpy as np

from k3trace.diff.edits import NONE, EditScript

#: Variants replayed together; memory is about 2 x BATCH x nodes x 8 bytes (every node's end
#: times and the switched durations: at ~2,600 union nodes 40 MB). The pass's Python loop
#: over the nodes costs about as much for 1024 variants as for 256: the sampled Shapley
#: estimate of two full-depth exports (944 variants) in one pass, not four.
BATCH = 1024


class _Branch(NamedTuple):
    """One version of a node: start = max(launch, end[pred] + lag over inputs), end = start + dur."""

    launch: float
    inputs: tuple[tuple[int, float], ...]   # (predecessor union node, lag)
    dur: float
    present: bool


class _Node(NamedTuple):
    """A node's branches: one, or (not applied, applied) chosen per variant by `player`'s
    column; `dur_player` (both builds' kernels only) switches dur_old to dur_new."""

    branches: tuple[_Branch, ...]
    player: int
    dur_player: int


def _branches(script: EditScript) -> list[_Node]:
    """Each union node's replay recipe, the same for every batch of variants (built from
    Python lists: per-element numpy indexing cost more than the replay's loop)."""
    g = script.union
    preds_old, preds_new = g.preds_old.tolist(), g.preds_new.tolist()
    lags_old, lags_new = g.lags_old.tolist(), g.lags_new.tolist()
    launch_old, launch_new = g.launch_old.tolist(), g.launch_new.tolist()
    dur_old, dur_new = g.dur_old.tolist(), g.dur_new.tolist()
    owner_in, owner_dur, owner_pres = (o.tolist() for o in (script.owner_inputs, script.owner_duration,
                                                             script.owner_presence))
    plan = []
    for u, (has_old, has_new) in enumerate(zip(g.present_old.tolist(), g.present_new.tolist())):
        old_in = tuple((p, lag) for p, lag in zip(preds_old[u], lags_old[u]) if p >= 0)
        new_in = tuple((p, lag) for p, lag in zip(preds_new[u], lags_new[u]) if p >= 0)
        if has_old and has_new:
            # Present in every variant; the duration is switched by its own player (a row).
            old = _Branch(launch_old[u], old_in, dur_old[u], True)
            if owner_in[u] < 0:
                plan.append(_Node((old,), NONE, owner_dur[u]))
            else:
                new = _Branch(launch_new[u], new_in, dur_old[u], True)
                plan.append(_Node((old, new), owner_in[u], owner_dur[u]))
            continue
        # One build's kernel: its own inputs always; the edit switches its presence. Absent, it
        # keeps its place with no launch, no lags and no duration.
        inputs, launch, dur = (old_in, launch_old[u], dur_old[u]) if has_old else (new_in, launch_new[u], dur_new[u])
        there = _Branch(launch, inputs, dur, True)
        gone = _Branch(-np.inf, tuple((p, 0.0) for p, _ in inputs), 0.0, False)
        p = owner_pres[u]
        if p < 0:
            plan.append(_Node((there if has_old else gone,), NONE, NONE))
        else:  # applied: a removed kernel goes, an added one comes
            plan.append(_Node((there, gone) if has_old else (gone, there), p, NONE))
    return plan


def replayer(script: EditScript) -> Callable[[np.ndarray], np.ndarray]:
    """`spans` of this script, its nodes' recipes built once for every call."""
    plan = _branches(script)
    # The blocks as lists of nodes, in one conversion (one per block, in every call, took a
    # sixth of a replay's time).
    flat = np.concatenate(script.union.blocks).tolist() if script.union.blocks else []
    bounds = np.cumsum([0] + [len(b) for b in script.union.blocks]).tolist()
    schedule = [flat[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]

    def run(applied: np.ndarray) -> np.ndarray:
        out = np.empty(applied.shape[0])
        for lo in range(0, applied.shape[0], BATCH):
            out[lo:lo + BATCH] = _spans(script, plan, schedule, applied[lo:lo + BATCH])
        return out

    return run


def spans(script: EditScript, applied: np.ndarray) -> np.ndarray:
    """Replayed step span (ns) of every variant."""
    return replayer(script)(applied)


def _start(t: np.ndarray, branch: _Branch, rows: list[np.ndarray], reach: np.ndarray) -> None:
    t.fill(branch[0])
    for pred, lag in branch[1]:
        np.maximum(t, np.add(rows[pred], lag, out=reach), out=t)


def _spans(script: EditScript, plan: list[_Node], schedule: list[list[int]], applied: np.ndarray) -> np.ndarray:
    # Per node, its branches are scalars and a variant only picks one (a player's column):
    # no [nodes, variants] array of launches, lags or presence is built (those and their
    # np.where took two thirds of a replay). max and + are exact, so computing each branch
    # apart and picking gives the same numbers as masking the unused inputs with -inf.
    g = script.union
    v = applied.shape[0]
    cols = np.ascontiguousarray(applied.T, dtype=bool)                 # [P, V]
    inverse = ~cols
    switched = np.flatnonzero((script.owner_duration >= 0) & g.present_old & g.present_new)
    dur_rows = dict(zip(switched.tolist(), np.where(
        cols[script.owner_duration[switched]], g.dur_new[switched, None], g.dur_old[switched, None])))
    end = np.empty((g.size, v))
    rows = list(end)   # views, taken once: indexing a row costs as much as a ufunc over 256 variants
    t, alt, reach = np.empty(v), np.empty(v), np.empty(v)
    first, last = np.full(v, np.inf), np.full(v, -np.inf)
    for members in schedule:
        if len(members) > 1:
            end[members] = -np.inf   # a block's nodes not yet relaxed read as no constraint
        for rounds in range(len(members), 0, -1):
            for u in members:
                (branches, player, dur_player), t_end = plan[u], rows[u]
                b0 = branches[0]
                _start(t, b0, rows, reach)
                if len(branches) == 1:
                    np.add(t, dur_rows[u] if dur_player >= 0 else b0.dur, out=t_end)
                    if rounds == 1 and b0.present:
                        np.minimum(first, t, out=first)
                        np.maximum(last, t_end, out=last)
                    continue
                b1, on = branches[1], cols[player]
                _start(alt, b1, rows, reach)
                np.copyto(t, alt, where=on)
                if dur_player >= 0:
                    np.add(t, dur_rows[u], out=t_end)
                else:
                    np.add(t, b0.dur, out=t_end)
                    if b1.dur != b0.dur:
                        np.add(t, b1.dur, out=t_end, where=on)
                if rounds == 1:
                    if b0.present and b1.present:
                        np.minimum(first, t, out=first)
                        np.maximum(last, t_end, out=last)
                    else:
                        mask = on if b1.present else inverse[player]
                        np.minimum(first, t, out=first, where=mask)
                        np.maximum(last, t_end, out=last, where=mask)
    result = last - first
    if not np.isfinite(result).all():
        raise ValueError("replayed span is not finite: a variant left no kernel present")
    return result
