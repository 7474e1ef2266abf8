"""families.segment_windows against the polars grouping it replaces (kept here only, as
the reference), on the stable kernels of bundled recordings: in their own row order (the
segment ids in order: numpy runs) and shuffled (the grouping)."""

from __future__ import annotations

import polars as pl
import pytest

from k3trace.analyses.families import segment_windows
from k3trace.analyses.overlap import step_overlap


def grouped(k: pl.DataFrame) -> pl.DataFrame:
    return k.group_by("segment").agg(pl.col("step").first(), pl.col("family").first(), pl.col("start").min(),
                                     pl.col("end").max(), pl.col("exposed").sum(), pl.col("duration").sum())


def overlap_kernels(analysis, name: str) -> pl.DataFrame:
    a = analysis(name)
    stable = a.steps.filter(pl.col("stable"))["step"].implode()
    return step_overlap(a.kernels.filter(pl.col("step").is_in(stable))).kernels.select(
        "step", "segment", "start", "end", "exposed", "duration", "family")


@pytest.mark.parametrize("name", ["small_inside_a", "k3_bs1_base_a", "k3_bs1_c6", "hf_base_a", "hf_vllm_inside"])
@pytest.mark.parametrize("shuffled", [False, True])
def test_segment_windows_as_grouped(analysis, name, shuffled):
    k = overlap_kernels(analysis, name)
    if shuffled:
        k = k.sample(fraction=1.0, shuffle=True, seed=7)
    else:
        assert k["segment"].is_sorted()  # the numpy path is the one under test
    got = segment_windows(k).sort("segment")
    want = grouped(k).sort("segment").select(got.columns)
    assert got.height > 0 and got.equals(want)
