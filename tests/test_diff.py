"""diff's result object: the step graph's slack, the JSON contract, the waterfall and the
Markdown table for pull requests (the attribution itself: test_diff_pairs.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from k3trace.analyses import stepgraph
from k3trace.diff import diff
from k3trace.render.terminal import diff_markdown


def test_side_stream_kernel_with_slack(analysis):
    """A kernel on a side stream moves the step only by what exceeds its slack: replaying
    the old graph with it grown by its slack plus x moves the span by x."""
    g = analysis("small_inside_a").graph
    slack = stepgraph.slack(g)
    i = int(np.argmax(slack))
    assert slack[i] > 1000  # some kernel has over a microsecond of slack
    base = stepgraph.span(*stepgraph.replay(g))
    grown = g.duration.copy()
    grown[i] += slack[i] + 2000
    assert stepgraph.span(*stepgraph.replay(g, grown)) - base == pytest.approx(2000, abs=1)
    grown[i] = g.duration[i] + slack[i] * 0.5
    assert stepgraph.span(*stepgraph.replay(g, grown)) == pytest.approx(base, abs=1)


def test_self_replay_lands_on_the_mean_step(analysis):
    # Lags calibrated on mean start/end times: the replayed span is the mean stable span.
    for name in ("small_inside_a", "k3_bs1_base_a", "hf_base_a"):
        a = analysis(name)
        replayed = float(stepgraph.span(*stepgraph.replay(a.graph))) / 1e3
        assert replayed == pytest.approx(a.step_times["span"].mean() / 1e3, abs=0.05)


def test_diff_json_contract(analysis):
    d = diff([analysis("k3_bs1_base_a")], [analysis("k3_bs1_router_multipass")])
    j = d.to_json()
    for key in ("itl_delta_us", "span_delta_us", "host_delta_us", "noise_band_us", "span_noise_band_us", "verdict",
                "verdict_itl", "verdict_span", "summary", "caveats", "attribution", "modelled_us", "residual_us",
                "mean_span_delta_us", "median_vs_mean_us", "explained", "shapley", "families"):
        assert key in j
    row = j["attribution"][0]
    assert set(row) >= {"edit", "kind", "detail", "family", "layers", "contribution_us", "stderr_us", "share"}
    assert isinstance(row["layers"], list) and all(isinstance(x, int) for x in row["layers"])
    contributions = [r["contribution_us"] for r in j["attribution"]]
    assert sorted(map(abs, contributions), reverse=True) == list(map(abs, contributions))
    assert sum(contributions) == pytest.approx(j["modelled_us"], abs=1e-6)
    assert j["mean_span_delta_us"] - j["modelled_us"] == pytest.approx(j["residual_us"], abs=1e-9)


def test_waterfall_goes_from_the_old_span_to_the_new(analysis):
    d = diff([analysis("hf_base_a")], [analysis("hf_norm_fused_a")])
    w = d.waterfall(top=5)
    assert w["kind"][0] == "absolute" and w["kind"][-1] == "total"
    assert w["value_us"][0] + w.filter(w["kind"] == "relative")["value_us"].sum() == pytest.approx(w["value_us"][-1])
    assert w["value_us"][-1] == pytest.approx(analysis("hf_norm_fused_a").step_stats["span"]["median"], abs=1e-6)


def test_markdown_for_a_pull_request(analysis):
    d = diff([analysis("k3_bs1_base_a")], [analysis("k3_bs1_router_multipass")])
    md = diff_markdown(d, top=3)
    lines = md.splitlines()
    assert lines[0].startswith("**k3trace diff**") and "SLOWER" in md
    tables = [[ln for ln in block.splitlines() if ln.startswith("|")] for block in md.split("\n\n")]
    table, segments = [t for t in tables if t]
    assert table[0] == "| edit | kind | family | layers | us/step | share | recorded us/step |"
    assert table[1].startswith("|---")
    assert "moe_router_kernel -> moe_router_group_kernel + moe_router_merge_kernel" in table[2]
    split = d.attribution.filter(pl.col("edit").str.starts_with("moe_router_kernel ->"))
    assert table[2].split(" | ")[-1].rstrip(" |") == f"{split['recorded_us'][0]:+.2f}"  # the replacement's own change
    assert all(ln.count("|") >= 8 for ln in table)  # no cell broke the table
    assert table[-1].startswith("| median vs mean step")
    # where along the model: the diff's segment kinds, by the size of their change
    assert segments[0] == "| segment | per step | time us | us/step |"
    assert [ln.split(" | ")[0].lstrip("| ") for ln in segments[2:]] == d.segments["kind"].head(3).to_list()
    assert all(ln.count("|") == 5 for ln in segments)


def test_gpu_work_unchanged_when_only_the_host_share_moved(analysis):
    d = diff([analysis("k3_bs1_base_a")], [analysis("k3_bs1_base_b")])
    # Force the situation from real numbers: a within-noise span with an ITL beyond noise.
    from dataclasses import replace

    from k3trace.diff.noise import SLOWER
    moved = replace(d, itl_delta_us=d.span_delta_us + 10.0, host_delta_us=10.0, verdict_itl=SLOWER)
    assert moved.summary().startswith("GPU work unchanged; ITL moved by +")
