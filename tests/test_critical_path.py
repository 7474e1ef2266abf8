"""critical_path._last_ending_rows against a plain reading of the rows: each step's
last-ending kernel, on bundled recordings' stable kernels and on frames where kernels share
a step's latest end (the last of them in row order) or come out of step order."""

from __future__ import annotations

import polars as pl
import pytest

from k3trace.analyses.critical_path import _last_ending_rows


def last_ending(edges: pl.DataFrame) -> list[int]:
    """Per step, the row of the latest end; of rows sharing it, the last (a loop over rows)."""
    best: dict[int, tuple[int, int]] = {}
    for row, (step, end) in enumerate(edges.select("step", "end").iter_rows()):
        if step not in best or end >= best[step][0]:
            best[step] = (end, row)
    return sorted(row for _, row in best.values())


@pytest.mark.parametrize("name", ["small_inside_a", "k3_bs1_base_a", "k3_bs1_c6", "hf_sglang_before"])
def test_last_ending_rows(analysis, name):
    a = analysis(name)
    edges = a.kernels.filter(pl.col("step").is_in(a.steps.filter(pl.col("stable"))["step"].implode()))
    got = _last_ending_rows(edges)
    assert len(got) == edges["step"].n_unique()
    assert sorted(got) == last_ending(edges)
    # The same rows when the steps do not come in row order (the sorted path).
    shuffled = edges.sample(fraction=1.0, shuffle=True, seed=3)
    assert sorted(_last_ending_rows(shuffled)) == last_ending(shuffled)


@pytest.mark.parametrize(("steps", "rows"), [([0, 0, 0, 1, 1], [2, 4]), ([1, 0, 0, 1, 0], [0, 4])])
def test_a_shared_latest_end_goes_to_the_last_row(steps, rows):
    edges = pl.DataFrame({"kernel_id": [0, 1, 2, 3, 4], "step": steps, "end": [5, 9, 9, 3, 9]})
    assert sorted(_last_ending_rows(edges)) == rows
