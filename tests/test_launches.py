"""Kernels find their launching call by (process, correlation id): the one-integer key
(k3trace/model/launches.py) matches what the join on the two columns finds."""

from __future__ import annotations

import polars as pl
import pytest

from k3trace.model import launches
from k3trace.model.frames import looked_up


def _by_two_columns(kernels: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    return looked_up(kernels, calls.unique(launches._CALL, keep="first"), launches._CALL)


def _by_key(kernels: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    kernel_key, call_key = launches._call_keys(kernels, calls)
    calls = calls.with_columns(call_key).drop(launches._CALL).drop_nulls("_call").unique("_call", keep="first")
    return kernels.with_columns(kernels.select(kernel_key).join(calls, on="_call", how="left").drop("_call"))


CALLS = pl.DataFrame({"global_pid": [5, None, 7, 5, 7, 9], "correlation_id": [1, 2, 1, 1, None, 3],
                      "launch_tid": [10, 11, 12, 13, 14, 15], "launch_start": [1, 2, 3, 4, 5, 6],
                      "launch_call": list("abcdef")})


def test_one_integer_key_finds_the_two_columns_calls():
    """Several processes, a repeated call (the first wins), calls with a null process or id."""
    kernels = pl.DataFrame({"global_pid": [5, 5, 7, 7, 9], "correlation_id": [1, 2, 1, 3, 3]}).with_row_index("kernel_id")
    assert _by_key(kernels, CALLS).equals(_by_two_columns(kernels, CALLS))


@pytest.mark.parametrize("correlation_id", [-1, 1 << 32])
def test_ids_past_32_bits_keep_the_two_column_join(correlation_id):
    kernels = pl.DataFrame({"global_pid": [5], "correlation_id": [correlation_id]}).with_row_index("kernel_id")
    assert launches._call_keys(kernels, CALLS) is None
