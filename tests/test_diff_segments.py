"""`k3trace diff`'s segments table (k3trace/diff/segments.py): per segment kind, old and new, the
windows per step, their median time and what they add to a step. Against the raw rows
(tests/reference.py's labels, the windows by test_dram's plain loop) on a pair of our K3
builds (c69 -> c70, 8 layers) and on a pair of transformers Llama builds (code nobody here
wrote: the eager RMSNorm replaced by a fused one, hf_base_a -> hf_norm_fused_a)."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

import polars as pl
import pytest

from test_dram import raw_windows

PAIRS = [("k3_bs1_c69", "k3_bs1_c70"), ("hf_base_a", "hf_norm_fused_a")]


@pytest.fixture(scope="module")
def sides(analysis, reference_of):
    """name -> (its analysis, tests/reference.py's reading of it)."""
    return lambda name: (analysis(name), reference_of(name))


def raw_kinds(ref) -> dict[str, tuple[float, float]]:
    """kind -> (windows per stable step, median window time in us) over every stable step."""
    spans = defaultdict(list)
    for kind, lo, hi in raw_windows(ref):
        spans[kind].append(hi - lo)
    return {kind: (len(v) / len(ref.stable), statistics.median(v) / 1e3) for kind, v in spans.items()}


@pytest.mark.parametrize("old_name, new_name", PAIRS)
def test_segments_against_the_raw_windows(sides, old_name, new_name):
    from k3trace.diff.segments import segment_table, windows_total

    (a, ref_a), (b, ref_b) = sides(old_name), sides(new_name)
    table = segment_table([a], [b], max_steps=10**9)
    old, new = raw_kinds(ref_a), raw_kinds(ref_b)
    assert len(old) >= 2 and set(table["kind"]) == set(old) | set(new)
    for r in table.iter_rows(named=True):
        (po, to), (pn, tn) = old.get(r["kind"], (0.0, 0.0)), new.get(r["kind"], (0.0, 0.0))
        assert (r["per_step_old"], r["per_step_new"]) == pytest.approx((po, pn), rel=1e-12)
        assert (r["time_us_old"], r["time_us_new"]) == pytest.approx((to, tn), rel=1e-9, abs=1e-9)
        assert r["us_per_step_delta"] == pytest.approx(pn * tn - po * to, rel=1e-9, abs=1e-9)
    deltas = table["us_per_step_delta"].abs().to_list()
    assert deltas == sorted(deltas, reverse=True)
    total = windows_total(table)
    assert total["delta"] == pytest.approx(sum(p * t for p, t in new.values()) - sum(p * t for p, t in old.values()))


def test_llama_norm_fusion_shows_in_every_segment(sides):
    """The fused RMSNorm runs at the start of every attention and MLP segment of the Llama: each kind of
    segment is shorter, and the segments' change is most of the span's."""
    from k3trace.diff import diff

    (a, _), (b, _) = sides("hf_base_a"), sides("hf_norm_fused_a")
    d = diff([a], [b])
    seg = d.segments
    main = seg.filter(pl.col("per_step_old") >= 7)  # the 8 decoder layers' attention and MLP segments
    assert main.height >= 2 and (main["time_us_new"] < main["time_us_old"]).all()
    assert d.segments_total["delta"] < 0 and d.span_delta_us < 0
    assert d.segments_total["delta"] == pytest.approx(d.span_delta_us, rel=0.25)


def test_diff_carries_it_and_a_report_without_layers_has_none(sides, tmp_path):
    from rich.console import Console

    from k3trace.diff import diff
    from k3trace.diff.segments import segment_table
    from k3trace.render.html import write_diff_page
    from k3trace.render.terminal import diff_segments

    (a, _), (b, _) = sides("k3_bs1_c69"), sides("k3_bs1_c70")
    d = diff([a], [b])
    j = d.to_json()["segments"]
    assert len(j["kinds"]) == d.segments.height and j["total_us_per_step"]["delta"] == d.segments_total["delta"]
    console = Console(width=160, record=True)
    console.print(diff_segments(d))
    assert "moe > kda" in console.export_text()
    write_diff_page(d, tmp_path / "d.html")
    assert "Segments, old vs new" in (tmp_path / "d.html").read_text()
    bare = [dataclasses.replace(x, kernels=x.kernels.with_columns(pl.lit(None, pl.Int64).alias("layer"))) for x in (a, b)]
    assert segment_table(bare[:1], bare[1:]) is None
    assert "segments" not in diff(bare[:1], bare[1:]).to_json()
