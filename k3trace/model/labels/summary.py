"""What the label chain reports: kernels and kernel time per source, the engine convention
the trace follows, and what was inferred or lent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

NVTX_SOURCE, MODULE_SOURCE, GRAPH_SOURCE = "nvtx", "module", "graph_capture"
ALIGNED_SOURCE, DONOR_SOURCE, INFERRED_SOURCE, RULE_SOURCE = "aligned_eager", "donor", "inferred", "name_rule"
UNLABELLED = "unlabelled"
#: The chain, in order: a kernel's label comes from the first source that knows it.
SOURCES = (NVTX_SOURCE, MODULE_SOURCE, GRAPH_SOURCE, ALIGNED_SOURCE, DONOR_SOURCE, INFERRED_SOURCE, RULE_SOURCE,
           UNLABELLED)

#: Step-range forms by engine (ENGINES.md), tried in order on the matched range text.
STEP_CONVENTIONS = (("vllm", r"^execute_"), ("sglang", r"^scheduler\.run_batch|^step\[DECODE"),
                    ("tensorrt-llm", r"_forward_step"), ("k3trace", r"decode_step"))
#: Conventions whose module paths number layers from 0 (an inferred layer then does too).
ZERO_BASED = ("vllm", "sglang", "tensorrt-llm", "module-path", "torch.profiler")


@dataclass(frozen=True)
class LabelSummary:
    sources: dict[str, int]                 # kernels per source
    time_share: dict[str, float]            # share of all kernel time per source
    convention: str                         # k3trace, vllm, sglang, tensorrt-llm, torch.profiler, module-path, none
    evidence: str                           # what the convention was read from
    inferred: tuple[dict[str, Any], ...] = field(default_factory=tuple)   # per inferred unit
    donor: str | None = None                # the --labels-from report
    donor_coverage: float | None = None     # share of the units' kernels the donor matched

    def to_json(self) -> dict[str, Any]:
        return {"sources": self.sources, "time_share": self.time_share, "convention": self.convention,
                "convention_evidence": self.evidence, "inferred": [dict(i) for i in self.inferred],
                "donor": self.donor, "donor_coverage": self.donor_coverage}


def source_stats(kernels: pl.DataFrame) -> tuple[dict[str, int], dict[str, float]]:
    """(`source_counts`, `source_time_share`) from one grouping of the kernels by source."""
    per = kernels.group_by("label_source").agg(pl.len().alias("n"),
                                               (pl.col("end") - pl.col("start")).sum().alias("t"))
    counts = {s: n for s, n, _ in per.iter_rows()}
    total = float(per["t"].sum() or 0) or 1.0
    got = {s: float(t) for s, _, t in per.iter_rows()}
    return ({source: int(counts.get(source, 0)) for source in SOURCES},
            {source: got.get(source, 0.0) / total for source in SOURCES})


def source_counts(kernels: pl.DataFrame) -> dict[str, int]:
    return source_stats(kernels)[0]


def source_time_share(kernels: pl.DataFrame) -> dict[str, float]:
    return source_stats(kernels)[1]


def step_convention(range_form: str | None) -> str | None:
    if range_form is None:
        return None
    for name, pattern in STEP_CONVENTIONS:
        if pl.Series([range_form]).str.contains(pattern)[0]:
            return name
    return None


def convention(own_ranges: int, module_convention: str | None, module_ranges: int,
               range_form: str | None) -> tuple[str, str]:
    """(convention, evidence): module ranges first, then k3trace's own layer ranges, then
    the step ranges' form."""
    if module_convention is not None:
        return module_convention, f"{module_ranges} module-path layer ranges"
    if own_ranges:
        return "k3trace", f"{own_ranges} layer.<index>.<family> ranges"
    by_steps = step_convention(range_form)
    if by_steps is not None:
        return by_steps, f"step ranges {range_form!r}"
    return "none", "no layer or step ranges"
