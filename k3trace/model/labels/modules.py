"""Source `module`: serving engines' layerwise NVTX (../shared/design/ENGINES.md).

vLLM (`--enable-layerwise-nvtx-tracing`), SGLang (`--enable-layerwise-nvtx-marker`) and
TensorRT-LLM (`enable_layerwise_nvtx_marker`) push one `str(dict)` range per module over the
whole module tree, `{'Module': 'top.model.layers.3.self_attn', 'TrainableParams': ..., 'Inputs':
...}`, and after each module's forward a range holding its `Outputs`, popped at once. A kernel
gets the layer of the innermost range around its launch that carries `layers.<N>`; its family
is that of the layer's child module the range sits in (`[[labels.modules]]`), `other` for a
child matching no entry and for kernels the layer launches itself (norms, residual adds). An
`attention` child becomes `kda` or `mla` by the name rules of the kernels inside it.
torch.profiler's module stack arrives as the same ranges (ingest/kineto_modules.py), with
class names where the engines write attribute names.
"""

from __future__ import annotations

import polars as pl

from k3trace.config import Config
from k3trace.ingest import Trace
from k3trace.model.labels.rules import rule_family

#: The range an engine pushes and pops right after a module's forward, holding its outputs:
#: it encloses no launch (a few us long in nsys, zero in intent), so it labels nothing.
OUTPUT_RANGE = r"^\{'Module': '[^']*', 'Outputs'"
#: The family of a module-table entry that the kernels inside split into attention families.
ATTENTION = "attention"
OTHER = "other"

PREFIX_CONVENTIONS = (("vllm", r"^top\."), ("sglang", r"^model\.model\."), ("tensorrt-llm", r"^[A-Z][A-Za-z0-9_]*\."),
                      ("torch.profiler", r"^torch\."))


def module_ranges(trace: Trace, cfg: Config, pid: int) -> pl.DataFrame:
    """tid, range_start, range_end, layer, child (the layer's child module the range is in,
    null for the layer's own range), below (module names under the child), prefix."""
    ranges = trace.nvtx.filter(
        pl.col("global_pid") == pid, pl.col("end").is_not_null(), pl.col("end") > pl.col("start"),
        ~pl.col("text").str.contains(OUTPUT_RANGE),
    ).with_columns(pl.col("text").str.extract_groups(cfg.module_pattern).alias("_parts")).filter(
        pl.col("_parts").struct.field("index").is_not_null())
    parts = pl.col("_parts")
    names = parts.struct.field("rest").str.strip_chars_start(".").str.split(".")
    return ranges.select(
        pl.col("global_tid").alias("tid"), pl.col("start").alias("range_start"), pl.col("end").alias("range_end"),
        parts.struct.field("index").cast(pl.Int64).alias("layer"),
        pl.when(parts.struct.field("rest") != "").then(names.list.first()).alias("child"),
        names.list.slice(1).alias("below"),
        parts.struct.field("prefix").alias("prefix"),
    ).sort("range_start")


def child_families(ranges: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """layer, child -> module_family: the first `[[labels.modules]]` entry matching the child's
    name or any module name below it (DeepSeek's MoE is an `mlp` holding `experts`)."""
    named = (
        ranges.filter(pl.col("child").is_not_null())
        .select("layer", "child", pl.concat_list(pl.col("child"), pl.col("below")).alias("name"))
        .explode("name").unique()
    )
    rank = pl.lit(None, dtype=pl.Int64)
    for i, rule in reversed(list(enumerate(cfg.module_rules))):
        rank = pl.when(pl.col("name").str.contains(rule.pattern)).then(pl.lit(i)).otherwise(rank)
    families = pl.DataFrame({"rank": list(range(len(cfg.module_rules))),
                             "module_family": [r.family for r in cfg.module_rules]},
                            schema={"rank": pl.Int64, "module_family": pl.String})
    return (
        named.with_columns(rank.alias("rank")).group_by("layer", "child").agg(pl.col("rank").min())
        .join(families, on="rank", how="left")
        .select("layer", "child", pl.col("module_family").fill_null(OTHER))
    )


def resolve_families(labelled: pl.DataFrame, ranges: pl.DataFrame, cfg: Config) -> pl.DataFrame:
    """The module-labelled kernels (layer, child, name) with `family`: the child's module
    family, an attention child split by the name rules of the kernels inside it (the family
    most of them match among `attention_families`; none: `attention`)."""
    with_family = labelled.join(child_families(ranges, cfg), on=["layer", "child"], how="left").with_columns(
        pl.when(pl.col("child").is_null()).then(pl.lit(OTHER))
        .otherwise(pl.col("module_family").fill_null(OTHER)).alias("module_family"))
    # Name rules once per distinct kernel name inside each attention child, weighted by count.
    attention = (
        with_family.filter(pl.col("module_family") == ATTENTION).group_by("layer", "child", "name").len()
        .with_columns(rule_family(pl.col("name"), cfg).alias("rule"))
    )
    order = {family: i for i, family in enumerate(cfg.attention_families)}
    split = (
        attention.filter(pl.col("rule").is_in(list(cfg.attention_families)))
        .group_by("layer", "child", "rule").agg(pl.col("len").sum())
        .with_columns(pl.col("rule").replace_strict(order, return_dtype=pl.Int64).alias("order"))
        .sort("len", "order", descending=[True, False])
        .unique(["layer", "child"], keep="first")
        .select("layer", "child", pl.col("rule").alias("split"))
    )
    return with_family.join(split, on=["layer", "child"], how="left").with_columns(
        pl.when(pl.col("module_family") == ATTENTION).then(pl.coalesce("split", pl.lit(ATTENTION)))
        .otherwise(pl.col("module_family")).alias("family")
    ).drop("module_family", "split")


def convention(ranges: pl.DataFrame) -> str | None:
    """The engine whose module-path prefix the ranges carry (the most common prefix), or
    `module-path` for a plain one; None without module ranges."""
    if ranges.is_empty():
        return None
    prefix = ranges.group_by("prefix").len().sort("len", "prefix", descending=[True, False])["prefix"][0] or ""
    for name, pattern in PREFIX_CONVENTIONS:
        if pl.Series([prefix]).str.contains(pattern)[0]:
            return name
    return "module-path"
