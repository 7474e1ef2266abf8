"""Source `name_rule`: the config's kernel-name patterns, first match wins (family only).

The same rules name families inside other sources: an engine's attention module becomes
`kda` or `mla` by the kernels in it, and inferred segments by their signature kernels.
"""

from __future__ import annotations

import polars as pl

from k3trace.config import Config


def rule_family(names: pl.Expr, cfg: Config) -> pl.Expr:
    """The family of the first name rule matching each kernel name (null: none)."""
    expr = pl.lit(None, dtype=pl.String)
    for rule in reversed(cfg.name_rules):  # first matching rule wins
        expr = pl.when(names.str.contains(rule.pattern)).then(pl.lit(rule.family)).otherwise(expr)
    return expr


def rule_families(names: pl.Series, cfg: Config) -> pl.Series:
    """`rule_family` of every name in `names`, matched once per distinct name (a trace has a
    few hundred names over millions of kernels; each rule is a regular expression)."""
    distinct = names.unique().drop_nulls()
    families = pl.select(rule_family(pl.lit(distinct), cfg)).to_series()
    return names.replace_strict(distinct, families, default=None, return_dtype=pl.String).alias("rule_family")
