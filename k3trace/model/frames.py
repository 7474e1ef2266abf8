"""Frame plumbing the model shares."""

from __future__ import annotations

import polars as pl


def looked_up(frame: pl.DataFrame, table: pl.DataFrame, on: str | list[str]) -> pl.DataFrame:
    """`frame` with `table`'s other columns for each row, matched on `on` (unique in
    `table`; no match: nulls). A left join of the key columns alone, set beside the frame:
    the rows keep their order and the frame's own columns are not copied, where joining the
    whole frame would copy every one of them (at millions of kernels, peak memory)."""
    keys = [on] if isinstance(on, str) else list(on)
    found = frame.select(keys).join(table, on=keys, how="left")
    return frame.with_columns(found.drop(keys))
