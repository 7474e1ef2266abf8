"""The names the K3 workload writes into a trace and k3trace reads back.

`kernels/` (the workload) and `k3trace` (the analyser) both import this module and
nothing else of each other, so a renamed range or family cannot drift between them.
"""

from __future__ import annotations

import re

#: One NVTX range per decode iteration, around every launch of that step.
STEP_RANGE = "decode_step"

#: The layer families of Kimi K3's decode path (METRICS.md, "Labels").
FAMILIES: tuple[str, ...] = ("kda", "mla", "moe", "attn_res", "dense", "other")

#: Families whose layers hold a full-attention FMHA (pre-attention window).
FULL_ATTENTION_FAMILIES: tuple[str, ...] = ("mla",)

#: An NVTX mark the workload emits once per recording with its launch plan, so a
#: trace can be checked for completeness against what the code meant to launch.
PLAN_MARK_PREFIX = "k3.plan "

#: NVTX range around the all-reduce placeholders (one GPU stands in for a TP rank).
ALL_REDUCE_RANGE = "all_reduce"

_LAYER_RE = re.compile(r"^layer\.(?P<index>\d+)\.(?P<family>[A-Za-z0-9_]+)$")


def layer_range(index: int, family: str) -> str:
    """The NVTX range name of one family segment of one layer, e.g. ``layer.3.mla``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return f"layer.{index}.{family}"


def parse_layer_range(name: str) -> tuple[int, str] | None:
    """``layer.3.mla`` -> ``(3, "mla")``; anything else -> None."""
    m = _LAYER_RE.match(name)
    return (int(m["index"]), m["family"]) if m else None


def plan_mark(**fields: object) -> str:
    """The text of the launch-plan mark, e.g. ``k3.plan kernels_per_step=812 batch=1``."""
    return PLAN_MARK_PREFIX + " ".join(f"{k}={v}" for k, v in sorted(fields.items()))


def parse_plan_mark(text: str) -> dict[str, str] | None:
    if not text.startswith(PLAN_MARK_PREFIX):
        return None
    pairs = (item.split("=", 1) for item in text[len(PLAN_MARK_PREFIX):].split())
    return {k: v for k, v in pairs}
