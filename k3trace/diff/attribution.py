"""Counterfactual attribution of a span delta (METRICS.md, "Diff of two builds").

The old build's step graph and the new one's are joined into one union graph (edits.py);
each player (the edits of one kind on the same kernels, across layers) switches its part
of it from the old build to the new. Replaying with no player applied is the old step,
with all of them the new step. A player's contribution is its Shapley value over the
players, so contributions are order-independent and sum exactly to replay(all) -
replay(none); the measured delta minus that is the residual, reported, never folded in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from k3trace.analyses.stepgraph import StepGraph
from k3trace.diff import edits as edit_script
from k3trace.diff import replay
from k3trace.diff.coupling import FLOOR_NS, pdl_coupled
from k3trace.diff.shapley import ShapleyValues, shapley


TOLERANCE_NS, TOLERANCE_SHARE = 20.0, 0.002


@dataclass(frozen=True)
class Attribution:
    players: pl.DataFrame      # player, kind, detail, family, label, layers, edits, kernels, contribution_ns, stderr_ns
    edits: pl.DataFrame        # elementary edits with their player
    coupled: pl.DataFrame      # group, player: players whose recorded time traded across PDL edges
    recorded: pl.DataFrame     # player, layer, recorded_ns: recorded duration change of the kernels it owns (recorded_change)
    base_span_ns: float        # replayed old span
    new_span_ns: float         # replayed with every edit applied (the new build's graph)
    exact: bool                # Shapley values exact (few players) or sampled
    orders: int                # sampled orders (0 when exact)
    evaluations: int           # replays run

    @property
    def modelled_ns(self) -> float:
        return self.new_span_ns - self.base_span_ns


def attribute(old: StepGraph, new: StepGraph, match: pl.DataFrame, *, seed: int = 0,
              coupling_floor_ns: float = FLOOR_NS) -> Attribution:
    """`coupling_floor_ns`: the smallest contribution a row of a read-together group may hold
    (coupling.py; the diff passes its span noise band)."""
    script = edit_script.build(old, new, match)
    n_players = script.players.height
    # Sample orders until each contribution is known to 20 ns or 0.2% of the change (the
    # change from the first round's replays of none and all: a replay of its own cost as
    # much Python as the round's 944 variants).
    result: ShapleyValues = shapley(
        replay.replayer(script), n_players, seed=seed,
        tolerance=lambda none, every: max(TOLERANCE_NS, TOLERANCE_SHARE * abs(every - none)))
    players = script.players.with_columns(
        pl.Series("contribution_ns", result.values, dtype=pl.Float64),
        pl.Series("stderr_ns", result.stderr, dtype=pl.Float64),
    )
    for name, value in (("base", result.none), ("all edits", result.all)):
        if not np.isfinite(value):
            raise ValueError(f"replayed span with {name} is not finite")
    coupled = pdl_coupled(script, np.asarray(result.values, dtype=np.float64),
                          np.asarray(result.stderr, dtype=np.float64), coupling_floor_ns)
    return Attribution(players=players, edits=script.edits, coupled=coupled, recorded=recorded_change(script),
                       base_span_ns=result.none,
                       new_span_ns=result.all,
                       exact=result.exact, orders=result.orders, evaluations=result.evaluations)


def recorded_change(script: edit_script.EditScript) -> pl.DataFrame:
    """player, layer, recorded_ns: the change in recorded duration (new - old, the step graphs'
    means over stable steps; 0 on the side a kernel is absent from) of the kernels whose
    duration or presence each player owns, summed per layer: a duration edit's kernels, or a
    replacement's removed and added ones. Beside a contribution it says how much of a kernel's
    own change the step took, and where along the depth the change landed: a router 3.2-3.9 us
    faster a call in five MoE layers and unchanged in two, of which the step took nothing."""
    union = script.union
    # Disjoint: durations are owned on matched kernels, presence on added and removed ones.
    owner = np.where(script.owner_duration >= 0, script.owner_duration, script.owner_presence)
    owned = np.nonzero(owner >= 0)[0]
    return pl.DataFrame({
        "player": owner[owned],
        "layer": pl.Series(script.edit_layer[owned].tolist(), dtype=pl.Int64),
        "recorded_ns": (union.dur_new - union.dur_old)[owned],
    }, schema={"player": pl.Int64, "layer": pl.Int64, "recorded_ns": pl.Float64}).group_by(
        "player", "layer").agg(pl.col("recorded_ns").sum()).sort("player", "layer", nulls_last=True)

