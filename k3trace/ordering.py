"""Sort orders of frames, as row positions, for the numpy scans of the metrics.

Where the sort keys are unique (every time order in a trace but the rare tie) the sorted
order is the only one, and numpy finds it for a fraction of polars' multi-column sort:
the keys packed into one integer where their ranges fit (a step and a start time do) and
sorted by numpy's stable sort, which runs in near-linear time over the nearly sorted
orders of a trace (373k kernels: 2 ms, where polars' two-column sort takes 35 and numpy's
lexsort 9); else by lexsort. With ties, `sort_positions` lets polars' own sort decide, so
they fall exactly as they did when the metrics sorted the frames themselves;
`stable_positions` keeps them in row order, an order defined without polars' sort.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def _values(column: pl.Series, nulls: bool) -> np.ndarray | None:
    """An integer column as int64, nulls (where allowed) as one value below all others, as
    polars sorts them first; None where it is not such a column."""
    if not column.dtype.is_integer() or (column.null_count() and not nulls):
        return None
    low = column.min()
    if low is not None and (low <= np.iinfo(np.int64).min or column.max() > np.iinfo(np.int64).max):
        return None
    below = low - 1 if low is not None else 0
    return column.cast(pl.Int64).fill_null(below).to_numpy()


def _packed(values: list[np.ndarray]) -> tuple[np.ndarray, int] | None:
    """The leading keys packed into one int64 that orders rows as they do key by key, and
    how many keys it covers (None: not even the first one's range fits)."""
    key, width, used = None, 1, 0
    for v in values:
        low, high = int(v.min()), int(v.max())
        span = high - low + 1
        if width * span >= 1 << 62:
            break
        key = v - low if key is None else key * span + (v - low)
        width, used = width * span, used + 1
    return (key, used) if key is not None else None


def _lexsorted(frame: pl.DataFrame, keys: tuple[str, ...], *,
               nulls: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """(order, tied): the stable order of integer keys (nulls first, where `nulls`), and
    per neighbour pair in that order whether all keys are equal; None where the keys are
    not such."""
    if frame.height < 2:
        return None
    values = [_values(frame[k], nulls) for k in keys]
    if any(v is None for v in values):
        return None
    packed = _packed(values)
    if packed is not None:
        key, used = packed
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        tied = ordered[1:] == ordered[:-1]
        # Keys past the packed ones only break ties of those: without one, none is needed.
        if used == len(values) or not tied.any():
            return order, tied
    order = np.lexsort(values[::-1])
    tied = np.ones(len(order) - 1, dtype=bool)
    for v in values:
        ordered = v[order]
        tied &= ordered[1:] == ordered[:-1]
    return order, tied


def has_repeats(frame: pl.DataFrame, *keys: str) -> bool:
    """Do two rows share all of `keys`? (A struct's `is_duplicated` hashes rows at about
    240 bytes each: 600 MB for 2.5M kernels; this sorts at 8.)"""
    if _strictly_increasing(frame[keys[0]]):
        return False
    found = _lexsorted(frame, keys)
    if found is None:
        return frame.height > 1 and bool(frame.select(pl.struct(keys).is_duplicated().any()).item())
    return bool(found[1].any())


def _strictly_increasing(column: pl.Series) -> bool:
    """Does an integer column rise from row to row? Then no two rows share its value, and
    no order is needed to tell (an export's kernel starts, read in table order: a scan,
    where the packed sort took 170 ms at 2.2M kernels)."""
    values = _values(column, nulls=False)
    return values is not None and bool(np.all(values[1:] > values[:-1]))


def sorted_by(frame: pl.DataFrame, *keys: str) -> pl.DataFrame:
    """`frame.sort(*keys)`, without the sort where the first key already rises from row to
    row (an export's tables, read in table order, mostly do): that order is then the only
    one, and sorting would only copy every column (a frame of 2.2M kernels: 60 ms and 200
    MB of fresh memory)."""
    if _strictly_increasing(frame[keys[0]]):
        return frame.with_columns(pl.col(keys[0]).set_sorted())
    return frame.sort(*keys)


def sort_positions(frame: pl.DataFrame, *keys: str) -> np.ndarray:
    """Row positions of `frame` in the order `frame.sort(*keys)` puts them (nulls first)."""
    found = _lexsorted(frame, keys, nulls=True)
    if found is not None and not found[1].any():
        return found[0].astype(np.int64)
    return polars_positions(frame, *keys)


def stable_positions(frame: pl.DataFrame, *keys: str) -> np.ndarray:
    """Row positions of `frame` ordered by `keys` (nulls first), rows that tie in their
    row order: one defined order, where `sort_positions` hands ties to polars' sort."""
    found = _lexsorted(frame, keys, nulls=True)
    if found is not None:
        return found[0].astype(np.int64)
    if frame.height < 2:
        return np.arange(frame.height, dtype=np.int64)
    return (frame.select(*keys).with_row_index("_pos").sort(*keys, maintain_order=True)["_pos"]
            .to_numpy().astype(np.int64))


def polars_positions(frame: pl.DataFrame, *keys: str) -> np.ndarray:
    """The same from polars' sort alone (where keys tie). Only the keys go through the sort:
    the permutation is the one the whole frame gets."""
    return frame.select(*keys).with_row_index("_pos").sort(*keys)["_pos"].to_numpy().astype(np.int64)
