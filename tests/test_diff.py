"""diff on real A/B pairs recorded on the H200 with a known cause (kernels/small.py):
an injected delay, a zero-change repeat, and the aux-stream fork switched off."""

from __future__ import annotations

import pytest

from k3trace.diff import diff
from k3trace.diff.noise import FASTER, SLOWER, WITHIN_NOISE


def test_injected_delay_is_attributed_to_the_named_kernel(analysis):
    d = diff([analysis("small_inside_a")], [analysis("small_delay_kda_step")])
    assert d.verdict == SLOWER
    top = d.attribution.row(0, named=True)
    attributed = float(d.attribution["delta_us_per_step"].sum())
    assert top["kernel"] == "kda_step_kernel"
    assert top["delta_us_per_step"] >= 0.9 * attributed
    assert attributed == pytest.approx(d.span_delta_us, rel=0.10)
    # 6 KDA layers x ~3.8 us of spin (the kernel's own median grew by that much)
    assert 20 < d.span_delta_us < 26


def test_zero_change_pair_is_within_noise(analysis):
    d = diff([analysis("small_inside_a")], [analysis("small_inside_b")])
    assert d.verdict == WITHIN_NOISE
    assert d.noise_band_us is not None and abs(d.itl_delta_us) <= d.noise_band_us


def test_repeats_give_the_noise_band(analysis):
    a, b, c = (analysis(n) for n in ("small_inside_a", "small_inside_b", "small_inside_c"))
    d = diff([a, b], [c, analysis("small_delay_kda_step")])
    assert d.noise_source == "repeats"
    periods = [x.step_stats["period"]["median"] for x in (a, b)]
    assert d.noise_band_us >= abs(periods[0] - periods[1])


def test_aux_stream_fork(analysis):
    # Old: every launch on one stream; new: the side-stream forks (seed 001's change).
    d = diff([analysis("small_nofork")], [analysis("small_inside_a")])
    assert d.verdict == FASTER and d.span_delta_us < -30
    fam = {r["family"]: r for r in d.families.iter_rows(named=True)}
    for family in ("kda", "moe", "mla"):
        assert fam[family]["two_stream_residency_us_old"] == 0
        assert fam[family]["two_stream_residency_us_new"] > 0
    # The residual is reported, and the parts add up to the measured delta.
    total = float(d.attribution["delta_us_per_step"].sum()) + d.interaction_us + d.residual_us
    assert total == pytest.approx(d.span_delta_us, abs=1e-6)


def test_side_stream_kernel_with_slack(analysis):
    """A kernel on a side stream moves the step only by what exceeds its slack: replaying
    the old graph with it grown by its slack plus x moves the span by x."""
    import numpy as np

    from k3trace.analyses import stepgraph

    a = analysis("small_inside_a")
    g = a.graph
    slack = stepgraph.slack(g)
    i = int(np.argmax(slack))
    assert slack[i] > 1000  # some kernel has over a microsecond of slack
    base = stepgraph.span(*stepgraph.replay(g))
    grown = g.duration.copy()
    grown[i] += slack[i] + 2000
    assert stepgraph.span(*stepgraph.replay(g, grown)) - base == pytest.approx(2000, abs=1)
    grown[i] = g.duration[i] + slack[i] * 0.5
    assert stepgraph.span(*stepgraph.replay(g, grown)) == pytest.approx(base, abs=1)


def test_diff_json_keys(analysis):
    j = diff([analysis("small_inside_a")], [analysis("small_delay_kda_step")]).to_json()
    for key in ("itl_delta_us", "span_delta_us", "host_delta_us", "noise_band_us", "verdict", "attribution",
                "unexplained_us", "families"):
        assert key in j
    row = j["attribution"][0]
    assert set(row) >= {"kernel", "family", "layer_scope", "delta_us_per_step", "share"}
    deltas = [abs(r["delta_us_per_step"]) for r in j["attribution"]]
    assert deltas == sorted(deltas, reverse=True)
    fam = j["families"][0]
    assert set(fam["old"]) >= {"device_busy_us", "two_stream_residency_us", "exposed_us"}
