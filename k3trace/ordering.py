"""Sort orders of frames, as row positions, for the numpy scans of the metrics.

Where the sort keys are unique (every time order in a trace but the rare tie) the sorted
order is the only one, and numpy's lexsort finds it at a third of the cost of polars'
multi-column sort. With ties, polars' own sort decides, so they fall exactly as they did
when the metrics sorted the frames themselves.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def _lexsorted(frame: pl.DataFrame, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """(order, tied): numpy's lexsort of integer keys without nulls, and per neighbour pair
    in that order whether all keys are equal; None where the keys are not such."""
    columns = [frame[k] for k in keys]
    if frame.height < 2 or not all(c.dtype.is_integer() and c.null_count() == 0 for c in columns):
        return None
    values = [c.to_numpy() for c in columns]
    order = np.lexsort(values[::-1])
    tied = np.ones(len(order) - 1, dtype=bool)
    for v in values:
        ordered = v[order]
        tied &= ordered[1:] == ordered[:-1]
    return order, tied


def has_repeats(frame: pl.DataFrame, *keys: str) -> bool:
    """Do two rows share all of `keys`? (A struct's `is_duplicated` hashes rows at about
    240 bytes each: 600 MB for 2.5M kernels; this sorts at 8.)"""
    found = _lexsorted(frame, keys)
    if found is None:
        return frame.height > 1 and bool(frame.select(pl.struct(keys).is_duplicated().any()).item())
    return bool(found[1].any())


def sort_positions(frame: pl.DataFrame, *keys: str) -> np.ndarray:
    """Row positions of `frame` in the order `frame.sort(*keys)` puts them."""
    found = _lexsorted(frame, keys)
    if found is not None and not found[1].any():
        return found[0].astype(np.int64)
    return polars_positions(frame, *keys)


def polars_positions(frame: pl.DataFrame, *keys: str) -> np.ndarray:
    """The same from polars' sort alone: for keys that tie often (kernel ends across
    streams), where trying numpy first would only add its cost. Only the keys go through
    the sort: the permutation is the one the whole frame gets."""
    return frame.select(*keys).with_row_index("_pos").sort(*keys)["_pos"].to_numpy().astype(np.int64)
