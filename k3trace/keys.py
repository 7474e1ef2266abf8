"""Group-bys keyed on one integer where the keys are two integer columns.

polars groups by several columns through a row encoding of the keys, per row; one integer
column it hashes directly: at 346k kernels `group_by("step", "layer").len()` takes 10.9 ms,
the same by one integer packing both 4.6 ms. The groups, and each group's rows in their
order, are the same either way; only the order of the groups in the result (arbitrary in
both) may differ.
"""

from __future__ import annotations

import polars as pl

_MAX_KEY = 1 << 62


def grouped_by_pair(frame: pl.DataFrame, a: str, b: str, *aggs: pl.Expr) -> pl.DataFrame:
    """`frame.group_by(a, b).agg(*aggs)` for integer columns `a` and `b`: the same columns,
    dtypes and groups. Grouped by one integer packing the two where neither holds a null
    and the packing fits in 62 bits, else by the two columns."""
    ka, kb = frame[a], frame[b]
    if (frame.is_empty() or not (ka.dtype.is_integer() and kb.dtype.is_integer())
            or ka.null_count() or kb.null_count()):
        return frame.group_by(a, b).agg(*aggs)
    lo_a, hi_a, lo_b, hi_b = int(ka.min()), int(ka.max()), int(kb.min()), int(kb.max())
    width = hi_b - lo_b + 1
    if (hi_a - lo_a + 1) * width >= _MAX_KEY or max(hi_a, hi_b) >= 1 << 63:
        return frame.group_by(a, b).agg(*aggs)
    key = (pl.col(a).cast(pl.Int64) - lo_a) * width + (pl.col(b).cast(pl.Int64) - lo_b)
    out = frame.group_by(key.alias("_pair")).agg(*aggs)
    return out.select(
        (pl.col("_pair") // width + lo_a).cast(ka.dtype).alias(a),
        (pl.col("_pair") % width + lo_b).cast(kb.dtype).alias(b),
        pl.exclude("_pair"),
    )
