"""The attribution's machinery on hand-built step graphs (edge cases) and on real pairs
(the union replay is each build's own graph at its two ends)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest

from k3trace.analyses import stepgraph
from k3trace.analyses.stepgraph import StepGraph
from k3trace.diff import edits, replay
from k3trace.diff.attribution import attribute
from k3trace.diff.matching import match_nodes
from k3trace.diff.shapley import shapley


def graph(kernels: list[tuple]) -> StepGraph:
    """kernels: (name, stream, duration_ns, stream_pred or None, join_pred or None, lag_ns),
    in launch order; indices refer to this list. Released at step start when predless."""
    n = len(kernels)
    preds = np.full((n, 2), -1, dtype=np.int64)
    lags = np.zeros((n, 2))
    for i, (_, _, _, sp, jp, lag) in enumerate(kernels):
        if sp is not None:
            preds[i, 0], lags[i, 0] = sp, lag
        if jp is not None:
            preds[i, 1], lags[i, 1] = jp, lag
    nodes = pl.DataFrame({
        "launch_rank": list(range(n)), "name": [k[0] for k in kernels], "signature": [hash(k[0]) >> 2 for k in kernels],
        "family": ["f"] * n, "layer": [1] * n, "stream_id": [k[1] for k in kernels], "start": [0] * n,
        "duration": [float(k[2]) for k in kernels], "binding": ["stream"] * n, "pdl": [False] * n,
    })
    g = StepGraph(nodes=nodes, preds=preds, lags=lags, launch_at=np.zeros(n), launch_lag=np.zeros(n),
                  duration=np.array([float(k[2]) for k in kernels]), order=np.arange(n))
    return g


def span(g: StepGraph) -> float:
    return float(stepgraph.span(*stepgraph.replay(g)))


def brute_force_shapley(value, p: int) -> np.ndarray:
    phi = np.zeros(p)
    orders = list(itertools.permutations(range(p)))
    for order in orders:
        applied = np.zeros(p, dtype=bool)
        before = value(applied[None])[0]
        for i in order:
            applied[i] = True
            after = value(applied[None])[0]
            phi[i] += after - before
            before = after
    return phi / len(orders)


def nonadditive(applied: np.ndarray) -> np.ndarray:
    """A max-plus value like a replay's: two parallel legs and a serial tail."""
    w = np.array([5.0, -3.0, 2.0, 4.0, -1.0])
    legs = np.maximum(10 + applied[:, :2] @ w[:2], 9 + applied[:, 2:4] @ w[2:4])
    return legs + applied[:, 4] * w[4] + 2 * (applied[:, 0] & applied[:, 3])


def test_exact_shapley_is_the_mean_over_all_orders():
    got = shapley(nonadditive, 5)
    assert got.exact
    np.testing.assert_allclose(got.values, brute_force_shapley(nonadditive, 5), atol=1e-12)
    assert got.values.sum() == pytest.approx(got.all - got.none)


def test_sampled_shapley_adds_up_exactly_and_estimates_the_values():
    rng = np.random.default_rng(3)
    w = rng.normal(size=14)

    def value(applied):
        return np.maximum(applied[:, :7] @ w[:7], applied[:, 7:] @ w[7:]) + applied[:, 0] * applied[:, 1]

    exact = shapley(value, 14, exact_max=14)
    sampled = shapley(value, 14, exact_max=10, budget=30_000, seed=1)
    assert not sampled.exact and sampled.orders > 0
    assert sampled.values.sum() == pytest.approx(sampled.all - sampled.none, abs=1e-9)
    assert np.all(np.abs(sampled.values - exact.values) <= 4 * sampled.stderr + 1e-9)
    other = shapley(value, 14, exact_max=10, budget=30_000, seed=2)
    assert other.values.sum() == pytest.approx(sampled.values.sum(), abs=1e-9)  # order-independent total


def test_two_parallel_kernels_that_both_got_faster_share_the_saving():
    # a -> (b on stream 1 | c on stream 2) -> d: both legs 10 us -> 6 us. Either alone moves
    # nothing (the other leg still binds); a one-at-a-time attribution would give both 0.
    old = graph([("a", 1, 1000, None, None, 0), ("b", 1, 10_000, 0, None, 0), ("c", 2, 10_000, None, 0, 0),
                 ("d", 1, 1000, 1, 2, 0)])
    new = graph([("a", 1, 1000, None, None, 0), ("b", 1, 6000, 0, None, 0), ("c", 2, 6000, None, 0, 0),
                 ("d", 1, 1000, 1, 2, 0)])
    attr = attribute(old, new, match_nodes(old, new))
    by = dict(zip(attr.players["label"], attr.players["contribution_ns"]))
    assert by["b"] == pytest.approx(-2000) and by["c"] == pytest.approx(-2000)
    assert attr.modelled_ns == pytest.approx(span(new) - span(old)) == pytest.approx(-4000)


def test_kernel_on_a_leg_with_slack_moves_the_step_by_the_excess_only():
    old = graph([("a", 1, 1000, None, None, 0), ("long", 1, 10_000, 0, None, 0), ("side", 2, 4000, None, 0, 0),
                 ("d", 1, 1000, 1, 2, 0)])
    new = graph([("a", 1, 1000, None, None, 0), ("long", 1, 10_000, 0, None, 0), ("side", 2, 13_000, None, 0, 0),
                 ("d", 1, 1000, 1, 2, 0)])
    attr = attribute(old, new, match_nodes(old, new))
    assert float(attr.players.filter(pl.col("label") == "side")["contribution_ns"][0]) == pytest.approx(3000)


def test_fusion_is_one_edit_and_its_successor_inherits_the_order():
    old = graph([("a", 1, 1000, None, None, 100), ("x", 1, 2000, 0, None, 100), ("y", 1, 2000, 1, None, 100),
                 ("z", 1, 2000, 2, None, 100), ("b", 1, 1000, 3, None, 100)])
    new = graph([("a", 1, 1000, None, None, 100), ("xyz", 1, 3000, 0, None, 100), ("b", 1, 1000, 1, None, 100)])
    match = match_nodes(old, new)
    attr = attribute(old, new, match)
    assert attr.players.height == 1
    row = attr.players.row(0, named=True)
    assert row["kind"] == "replacement" and row["detail"] == "fusion" and row["label"] == "3 kernels -> xyz"
    assert row["contribution_ns"] == pytest.approx(span(new) - span(old)) == pytest.approx(-3200)


def test_reordered_kernels_switch_together_and_replay_without_a_cycle():
    # The two builds launch p and q in opposite orders on one stream (a cycle in the union).
    old = graph([("a", 1, 1000, None, None, 0), ("p", 1, 3000, 0, None, 0), ("q", 1, 500, 1, None, 0),
                 ("b", 1, 1000, 2, None, 0)])
    new = graph([("a", 1, 1000, None, None, 0), ("q", 1, 500, 0, None, 0), ("p", 1, 2000, 1, None, 0),
                 ("b", 1, 1000, 2, None, 0)])
    script = edits.build(old, new, match_nodes(old, new))
    assert any(len(b) > 1 for b in script.union.blocks)
    inputs = {int(o) for o in script.owner_inputs if o >= 0}
    assert len(inputs) == 1  # p's and q's new inputs are one player
    p = script.players.height
    every = np.array(list(itertools.product([False, True], repeat=p)), dtype=bool)
    spans = replay.spans(script, every)
    assert np.isfinite(spans).all()
    assert spans[0] == pytest.approx(span(old)) and spans[-1] == pytest.approx(span(new))


def test_layers_in_one_build_only_are_one_structure_row():
    old = graph([("a", 1, 1000, None, None, 0), ("b", 1, 1000, 0, None, 0)])
    extra = graph([("a", 1, 1000, None, None, 0), ("b", 1, 1000, 0, None, 0), ("c", 1, 5000, 1, None, 0)])
    extra = StepGraph(nodes=extra.nodes.with_columns(pl.Series("layer", [1, 1, 2])), preds=extra.preds,
                      lags=extra.lags, launch_at=extra.launch_at, launch_lag=extra.launch_lag,
                      duration=extra.duration, order=extra.order)
    attr = attribute(old, extra, match_nodes(old, extra))
    assert attr.players["kind"].to_list() == ["structure"]
    assert attr.players["label"][0] == "layers only in new: 2"
    assert float(attr.players["contribution_ns"][0]) == pytest.approx(5000)


@pytest.mark.parametrize("pair", [("hf_base_a", "hf_norm_fused_a"), ("k3_bs1_no_attn_forks", "k3_bs1_base_a"),
                                  ("hf_base_a", "hf_mlp_side_stream_a"), ("k3_bs1_base_a", "k3_bs1_router_multipass")])
def test_union_replay_is_each_build_at_its_ends(analysis, pair):
    g_old, g_new = analysis(pair[0]).graph, analysis(pair[1]).graph
    script = edits.build(g_old, g_new, match_nodes(g_old, g_new))
    p = script.players.height
    ends = replay.spans(script, np.array([[False] * p, [True] * p]))
    assert ends[0] == pytest.approx(span(g_old), abs=1e-6)
    assert ends[1] == pytest.approx(span(g_new), abs=1e-6)
    assert all(math.isfinite(v) for v in ends)


def test_a_build_against_itself_has_no_edits(analysis):
    a = analysis("hf_base_a")
    attr = attribute(a.graph, a.graph, match_nodes(a.graph, a.graph))
    assert attr.players.height == 0 and attr.modelled_ns == 0 and attr.exact
