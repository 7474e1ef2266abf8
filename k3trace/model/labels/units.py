"""What the alignment and inference sources work on: one representative step per *unit*, a
unit being one CUDA graph (its replays repeat the same nodes) or one eager step signature
(the same kernel-name sequence), and how a unit's labels go back to all its steps."""

from __future__ import annotations

import polars as pl

_NODE_BITS = 32


def with_units(kernels: pl.DataFrame, steps: pl.DataFrame, whole_steps: bool = False) -> pl.DataFrame:
    """`unit`: `g<graph>` for replay kernels, `s<signature>` for eager kernels in a step,
    null outside steps. `whole_steps` (piecewise graphs: a step replays several graphs, one
    of them several times, with eager kernels between): every kernel of a step is in its
    step's unit, and is labelled by its rank in the step, never by its graph node."""
    sig = steps.select("step", pl.col("signature").alias("_sig"))
    return kernels.join(sig, on="step", how="left").with_columns(
        pl.when(pl.col("step").is_null()).then(None)
        .when(pl.col("graph_node_id").is_not_null() & (not whole_steps))
        .then(pl.format("g{}", pl.col("graph_node_id") // (1 << _NODE_BITS)))
        .otherwise(pl.format("s{}", pl.col("_sig"))).alias("unit")
    ).drop("_sig")


def representatives(kernels: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """unit -> the kernels of its fullest step (the lowest such step on a tie), in launch
    order (capture order for replays)."""
    # The steps are chosen on their keys alone, and only their kernels are gathered whole
    # (a filter of the kernels first copied every column of every step).
    stepped = kernels.select("unit", "step").filter(pl.col("unit").is_not_null())
    if stepped.is_empty():
        return {}
    per_step = stepped.group_by("unit", "step").len().sort(["unit", "len", "step"], descending=[False, True, False])
    chosen = per_step.unique("unit", keep="first").select("unit", "step")
    rep = kernels.join(chosen, on=["unit", "step"], how="semi").sort("unit", "launch_rank")
    return {str(unit): group for (unit,), group in rep.group_by("unit", maintain_order=True)}


def needing(kernels: pl.DataFrame) -> set[str]:
    """Units none of whose kernels carries a layer label yet."""
    # The two columns read, selected before the filter: filtering the kernels whole copied
    # every column (2.2M kernels of a transformers Llama: 670 MB more at the peak).
    stepped = kernels.select("unit", "layer").filter(pl.col("unit").is_not_null())
    labelled = stepped.filter(pl.col("layer").is_not_null()).select("unit").unique()
    return set(stepped.select("unit").unique().join(labelled, on="unit", how="anti")["unit"].to_list())


def mapping_schema() -> dict[str, pl.DataType]:
    return {"unit": pl.String, "launch_rank": pl.Int64, "graph_node_id": pl.Int64, "layer": pl.Int64,
            "family": pl.String}


def mapping(rep: pl.DataFrame, layers: list, families: list) -> pl.DataFrame:
    """A representative step's labels, keyed so they reach every step of its unit."""
    return pl.DataFrame({
        "unit": rep["unit"], "launch_rank": rep["launch_rank"],
        # A graph's unit maps by node; a step's (eager or piecewise) by rank in the step.
        "graph_node_id": rep["graph_node_id"] if str(rep["unit"][0]).startswith("g") else [None] * rep.height,
        "layer": pl.Series(layers, dtype=pl.Int64), "family": pl.Series(families, dtype=pl.String),
    }, schema=mapping_schema()).filter(pl.col("family").is_not_null())
