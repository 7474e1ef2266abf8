"""Interval arithmetic on hand-made frames: the edge cases real traces rarely show."""

import polars as pl
import pytest

from k3trace import intervals


def frame(rows):
    return pl.DataFrame(rows, schema={"g": pl.Int64, "s": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row")


def test_union_merges_overlapping_and_nested_but_not_touching_groups():
    f = frame([(1, 0, 0, 10), (1, 0, 2, 5), (1, 1, 8, 12), (1, 0, 20, 25), (2, 0, 0, 4)])
    got = intervals.union(f, ["g"]).sort("g", "start").rows()
    assert got == [(1, 0, 12), (1, 20, 25), (2, 0, 4)]


def test_touching_intervals_join_in_union_but_do_not_overlap_in_coverage():
    f = frame([(1, 0, 0, 10), (1, 1, 10, 20)])
    assert intervals.union_length(f, ["g"])["length"].to_list() == [20]
    assert intervals.coverage(f, ["g"], "s").height == 0


def test_same_stream_overlap_is_one_stream():
    # PDL reported as overlap by some CUPTI versions: still a single stream.
    f = frame([(1, 0, 0, 10), (1, 0, 8, 15)])
    assert intervals.coverage(f, ["g"], "s").height == 0


def test_coverage_counts_distinct_streams():
    f = frame([(1, 0, 0, 10), (1, 1, 5, 15), (1, 2, 7, 9)])
    two = intervals.coverage(f, ["g"], "s", at_least=2).rows()
    three = intervals.coverage(f, ["g"], "s", at_least=3).rows()
    assert two == [(1, 5, 10)] and three == [(1, 7, 9)]


def test_groups_never_leak_into_each_other():
    # Same times in two groups: no cross-group overlap.
    f = frame([(1, 0, 0, 10), (2, 1, 0, 10)])
    assert intervals.coverage(f, ["g"], "s").height == 0
    assert sorted(intervals.union_length(f, ["g"]).rows()) == [(1, 10), (2, 10)]


def test_measure_within_partial_and_outside():
    f = frame([(1, 0, 0, 10), (1, 0, 12, 14), (2, 0, 0, 10)])
    mask = pl.DataFrame({"g": [1, 1, 2], "start": [5, 13, 20], "end": [11, 20, 30]})
    got = intervals.measure_within(f, mask, ["g"], "inside")["inside"].to_list()
    assert got == [5, 1, 0]


@pytest.mark.parametrize("fn", ["union", "coverage"])
def test_empty_frames(fn):
    f = frame([])
    out = intervals.union(f, ["g"]) if fn == "union" else intervals.coverage(f, ["g"], "s")
    assert out.height == 0
