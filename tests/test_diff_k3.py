"""diff on the K3 decode path's A/B pairs recorded on the H200 (kernels/k3 variants, 8 layers,
B=1; the seeds' changes): each pair has a known cause the diff must find."""

from __future__ import annotations

import polars as pl
import pytest

from k3trace.diff import diff
from k3trace.diff.noise import FASTER, SLOWER, WITHIN_NOISE


def mean_us(a, kernel):
    return float(a.kernel_table.filter(pl.col("name") == kernel)["mean_us"].mean())


def test_injected_delay(analysis):
    # delay:kda_step_kernel:3000 on the 6 KDA layers of the 8-layer model
    d = diff([analysis("k3_bs1_base_a")], [analysis("k3_bs1_delay_kda_step")])
    attributed = float(d.attribution["delta_us_per_step"].sum())
    top = d.attribution.row(0, named=True)
    assert d.verdict == SLOWER and top["kernel"] == "kda_step_kernel"
    assert top["delta_us_per_step"] >= 0.9 * attributed
    assert attributed == pytest.approx(d.span_delta_us, rel=0.10)
    assert 6 * 2.5 < d.span_delta_us < 6 * 3.5


def test_zero_change_pair(analysis):
    d = diff([analysis("k3_bs1_base_a")], [analysis("k3_bs1_base_b")])
    assert d.verdict == WITHIN_NOISE


def test_aux_stream_forks(analysis):
    # Seed 001: forks on (baseline) against every attention launch on the main stream.
    d = diff([analysis("k3_bs1_no_attn_forks")], [analysis("k3_bs1_base_a")])
    assert d.verdict == FASTER and d.span_delta_us < -20
    fam = {r["family"]: r for r in d.families.iter_rows(named=True)}
    for family in ("kda", "mla"):
        assert fam[family]["two_stream_residency_us_new"] > fam[family]["two_stream_residency_us_old"] + 1
    # the KDA side-stream GEMV (now overlapped) is where the time went
    kda = d.attribution.filter(pl.col("family") == "kda")
    assert kda["delta_us_per_step"].sum() < 0.5 * d.span_delta_us


def test_mla_epilogue_split(analysis):
    # Seed 000: the q-concat/cache epilogue split across warps with an early trigger.
    old, new = analysis("k3_bs1_base_a"), analysis("k3_bs1_mla_split")
    assert mean_us(new, "mla_q_concat_kernel") < mean_us(old, "mla_q_concat_kernel")
    assert new.pre_attention_summary["median"] < old.pre_attention_summary["median"]
    assert old.pre_attention_summary["count"] == 2 * old.stable_steps  # MLA layers 4 and 8


def test_fusion_changes_show_as_added_and_removed(analysis):
    # Seed 003: gated RMSNorm separate (old) -> fused into kda_step (new)
    d = diff([analysis("k3_bs1_kda_norm_separate")], [analysis("k3_bs1_base_a")])
    removed = d.matching.filter(pl.col("kind") == "removed")
    assert set(removed["name"]) == {"kda_gated_rmsnorm_kernel"} and removed.height == 6
    row = d.attribution.filter(pl.col("kernel") == "kda_gated_rmsnorm_kernel").row(0, named=True)
    assert row["delta_us_per_step"] < 0 and "removed 6" in row["kinds"]
    # single-CTA router (new) replacing the two-pass one (old): one added, two removed per layer
    d = diff([analysis("k3_bs1_router_multipass")], [analysis("k3_bs1_base_a")])
    kinds = d.matching.filter(pl.col("kind") != "matched").group_by("kind", "name").len()
    assert sorted(kinds.rows()) == [("added", "moe_router_kernel", 7), ("removed", "moe_router_group_kernel", 7),
                                    ("removed", "moe_router_merge_kernel", 7)]
    assert d.verdict == FASTER
