"""critical_path._last_ending_rows against the polars form it replaces (kept here only, as
the reference): each step's last-ending kernel, on bundled recordings' stable kernels
and on a frame where two kernels share a step's latest end (polars' choice stands)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from k3trace.analyses.critical_path import _last_ending_rows


def polars_last(edges: pl.DataFrame, row_of: np.ndarray) -> np.ndarray:
    last = edges.select("step", "end", "kernel_id").sort("end").group_by("step").agg(pl.col("kernel_id").last())
    return row_of[last["kernel_id"].to_numpy().astype(np.int64)]


def rows_of(edges: pl.DataFrame) -> np.ndarray:
    ids = edges["kernel_id"].to_numpy().astype(np.int64)
    row_of = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    row_of[ids] = np.arange(len(ids))
    return row_of


@pytest.mark.parametrize("name", ["small_inside_a", "k3_bs1_base_a", "k3_bs1_c6", "hf_sglang_before"])
def test_last_ending_as_polars(analysis, name):
    a = analysis(name)
    edges = a.kernels.filter(pl.col("step").is_in(a.steps.filter(pl.col("stable"))["step"].implode()))
    row_of = rows_of(edges)
    got = _last_ending_rows(edges, row_of)
    assert len(got) == edges["step"].n_unique()
    assert sorted(got) == sorted(polars_last(edges, row_of))


def test_last_ending_tie_goes_as_polars():
    edges = pl.DataFrame({"kernel_id": [0, 1, 2, 3, 4], "step": [0, 0, 0, 1, 1], "end": [5, 9, 9, 3, 7]})
    row_of = rows_of(edges)
    got = _last_ending_rows(edges, row_of)
    assert sorted(got) == sorted(polars_last(edges, row_of))
    assert 4 in got and (1 in got or 2 in got)
