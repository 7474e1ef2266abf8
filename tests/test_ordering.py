"""Sort orders as row positions (k3trace/ordering.py) are the ones polars' sort gives."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from k3trace.ordering import has_repeats, polars_positions, sort_positions, sorted_by, stable_positions


def _frame(seed: int, n: int = 5000, nulls: bool = False, span: int = 1 << 40) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    step = pl.Series("step", rng.integers(-3, 40, n))
    if nulls:
        dropped = pl.Series(rng.random(n) < 0.1)
        step = pl.select(pl.when(dropped).then(None).otherwise(step)).to_series().alias("step")
    start = np.sort(rng.choice(span, n, replace=False))  # nearly sorted, as a trace's times are
    start[::7] = rng.choice(span, len(start[::7]), replace=False)
    return pl.DataFrame({"step": step, "start": start, "end": start + rng.integers(0, 1000, n),
                         "rank": rng.permutation(n)})


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("keys", [("step", "rank"), ("step", "start", "end"), ("start",),
                                  ("step", "end", "rank")])
def test_positions_equal_polars_sort(seed, keys):
    for nulls in (False, True):
        frame = _frame(seed, nulls=nulls)
        expected = frame.select(*keys).with_row_index("_pos").sort(*keys)
        got = frame.select(*keys)[sort_positions(frame, *keys)]
        assert got.equals(expected.drop("_pos"))
        if not expected.select(pl.struct(*keys).is_duplicated().any()).item():
            assert (sort_positions(frame, *keys) == expected["_pos"].to_numpy()).all()


def test_ties_fall_back_to_polars():
    frame = pl.DataFrame({"step": [1, 1, 0, 0, 1], "end": [5, 5, 3, 3, 2]})
    assert (sort_positions(frame, "step", "end") == polars_positions(frame, "step", "end")).all()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("keys", [("step", "end"), ("step",), ("step", "start", "end")])
def test_stable_positions_keep_ties_in_row_order(seed, keys):
    for nulls in (False, True):
        frame = _frame(seed, nulls=nulls).with_columns(pl.col("end") // 500)  # many ties
        expected = frame.select(*keys).with_row_index("_pos").sort(*keys, maintain_order=True)["_pos"]
        assert (stable_positions(frame, *keys) == expected.to_numpy()).all()
    text = pl.DataFrame({"step": ["b", "a", "b", "a"], "end": [1, 1, 1, 0]})
    assert list(stable_positions(text, "step", "end")) == [3, 1, 0, 2]


def test_keys_too_wide_to_pack():
    frame = pl.DataFrame({"a": [2**62, -2**62, 0, 5], "b": [3, 2, 1, 0]})
    assert frame[sort_positions(frame, "a", "b")].equals(frame.sort("a", "b"))


def test_has_repeats():
    frame = _frame(0)
    assert not has_repeats(frame, "start", "end", "step")
    assert has_repeats(pl.concat([frame, frame.head(1)]), "start", "end", "step")


def test_sorted_by_skips_only_a_rising_first_key():
    rising = pl.DataFrame({"start": [1, 2, 5], "end": [9, 3, 6]})
    assert sorted_by(rising, "start", "end").equals(rising)
    tied = pl.DataFrame({"start": [1, 1, 0], "end": [9, 3, 6]})
    assert sorted_by(tied, "start", "end").equals(tied.sort("start", "end"))
