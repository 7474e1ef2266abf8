"""torch.profiler's `nn.Module` stack as the module ranges an engine's layerwise NVTX pushes.

With `with_stack=True` (SGLang's `/start_profile` default) Kineto records every module's
forward as a `python_function` event `nn.Module: Qwen3DecoderLayer_12` on the calling
thread: the class and its instance number, no attribute path. The events nest as the calls
do, so each has a parent; the layer class is the outermost one with several instances under
one parent instance (36 `Qwen3DecoderLayer` under `Qwen3Model_0`), its instance number the
layer index (instances are numbered in call order). Every module inside a layer becomes an
NVTX range in domain `nn.Module` whose text is the path the module labels read,
`torch.layers.12.Qwen3Attention.RadixAttention` (layer, then class names downward), so a
kernel launched there (or a graph node created there, during a capture) gets the layer and
the family of the layer's child (`[[labels.modules]]`, which match class names too).
"""

from __future__ import annotations

import re
from collections import defaultdict

import polars as pl

#: Kineto's name of a module's forward: `nn.Module: <class>_<instance>`.
MODULE_EVENT = "nn.Module: "
DOMAIN = "nn.Module"
PREFIX = "torch."
_INSTANCE = re.compile(r"^(?P<cls>.+?)_(?P<n>\d+)$")


def module_ranges(events: pl.DataFrame) -> pl.DataFrame:
    """The module events inside a layer as NVTX rows (start, end, text, global_tid,
    global_pid); empty without a layer class (no module repeated under one parent)."""
    rows = events.select("start", "end", pl.col("name").cast(pl.String).str.strip_prefix(MODULE_EVENT).alias("module"),
                         "global_tid", "global_pid").sort("global_tid", "start", pl.col("end"), descending=[False, False, True])
    module, tid = rows["module"].to_list(), rows["global_tid"].to_list()
    start, end = rows["start"].to_list(), rows["end"].to_list()
    parent = _parents(tid, start, end)
    layer_class = _layer_class(module, parent)
    if layer_class is None:
        return rows.clear().select("start", "end", pl.lit("").alias("text"), "global_tid", "global_pid")
    texts: list[str | None] = []
    for i in range(len(module)):
        chain = []          # this module and its ancestors up to the layer, innermost first
        j = i
        while j is not None and _split(module[j])[0] != layer_class:
            chain.append(_split(module[j])[0])
            j = parent[j]
        texts.append(None if j is None else PREFIX + ".".join(["layers", _split(module[j])[1], *reversed(chain)]))
    return rows.with_columns(pl.Series("text", texts, dtype=pl.String)).filter(pl.col("text").is_not_null()).select(
        "start", "end", "text", "global_tid", "global_pid")


def _split(module: str) -> tuple[str, str]:
    """(class, instance number) of `Class_12`; a name without a number is its own class."""
    m = _INSTANCE.match(module)
    return (m["cls"], m["n"]) if m else (module, "0")


def _parents(tid: list, start: list, end: list) -> list[int | None]:
    """Each event's innermost enclosing event on its thread (rows sorted by thread, start,
    and end descending, so an enclosing event comes first)."""
    parent: list[int | None] = [None] * len(tid)
    stack: list[int] = []
    for i in range(len(tid)):
        while stack and (tid[stack[-1]] != tid[i] or end[stack[-1]] < end[i] or start[i] >= end[stack[-1]]):
            stack.pop()
        parent[i] = stack[-1] if stack else None
        stack.append(i)
    return parent


def _layer_class(module: list[str], parent: list[int | None]) -> str | None:
    """The outermost class with several instances under one parent instance (the most
    instances among equally deep ones): the decoder layers, not the experts a MoE block
    holds (up to 128 under one block in an eager transformers model, but deeper)."""
    depth = [0] * len(parent)
    for i, p in enumerate(parent):   # a parent comes before its children
        depth[i] = 0 if p is None else depth[p] + 1
    children: dict[tuple[str, str], set[str]] = defaultdict(set)
    level: dict[tuple[str, str], int] = {}
    for i, p in enumerate(parent):
        if p is not None:
            key = (module[p], _split(module[i])[0])
            children[key].add(module[i])
            level[key] = min(level.get(key, depth[i]), depth[i])
    # Per class, its repeated groups' shallowest depth and their largest size.
    shallowest: dict[str, int] = {}
    most: dict[str, int] = {}
    for (parent_module, cls), instances in children.items():
        if len(instances) >= 2:
            shallowest[cls] = min(shallowest.get(cls, level[(parent_module, cls)]), level[(parent_module, cls)])
            most[cls] = max(most.get(cls, 0), len(instances))
    return min(most, key=lambda cls: (shallowest[cls], -most[cls], cls), default=None)
