"""Source `donor`: labels from another report of the same model (`--labels-from`), e.g. the
same engine run once with `--enforce-eager` (vLLM) or `--disable-cuda-graph` (SGLang), where
the layerwise NVTX fires on every launch. The donor's representative step, labelled by its
own chain, is aligned by kernel name with each unit of this report that has no label yet."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import polars as pl

from k3trace.errors import ReportError
from k3trace.model.labels import units
from k3trace.model.labels.aligned import MIN_COVERAGE, align

#: Sources whose labels a donor lends (name rules carry no layer, inference is a guess).
LENT = ("nvtx", "module", "graph_capture", "aligned_eager")


@dataclass(frozen=True)
class LabelDonor:
    report: str                 # the donor report's name
    kernels: pl.DataFrame       # its representative step in launch order: name, layer, family

    @classmethod
    def from_step(cls, report: str, step_kernels: pl.DataFrame) -> "LabelDonor":
        """The donor from one labelled step (columns name, launch_rank, layer, family, label_source)."""
        ordered = step_kernels.sort("launch_rank")
        lent = ordered.with_columns(
            pl.when(pl.col("label_source").is_in(list(LENT))).then(pl.col("layer")).alias("layer"),
            pl.when(pl.col("label_source").is_in(list(LENT))).then(pl.col("family")).alias("family"),
        ).select("name", "layer", "family")
        if lent["layer"].is_null().all():
            raise ReportError(
                f"--labels-from {report}: its steps carry no layer labels",
                "record the donor with layerwise NVTX and no CUDA graphs (vLLM --enforce-eager "
                "--enable-layerwise-nvtx-tracing, SGLang --disable-cuda-graph --enable-layerwise-nvtx-marker)")
        return cls(report=report, kernels=lent)

    def digest(self) -> str:
        """Identifies the donor's labels (for the analysis cache key)."""
        text = self.kernels.write_csv()
        return hashlib.sha256(f"{self.report}|{text}".encode()).hexdigest()[:16]


def donated(reps: dict[str, pl.DataFrame], wanted: set[str], donor: LabelDonor) -> tuple[pl.DataFrame, dict]:
    """Labels for the units in `wanted` aligned on the donor's step, and per unit the share
    of its kernels matched."""
    out = [pl.DataFrame(schema=units.mapping_schema())]
    names_d = donor.kernels["name"].to_list()
    layers_d, families_d = donor.kernels["layer"].to_list(), donor.kernels["family"].to_list()
    matched = {}
    for unit in sorted(wanted):
        rep = reps[unit]
        coverage, pairs = align(rep["name"].to_list(), names_d)
        matched[unit] = coverage
        if coverage < MIN_COVERAGE:
            continue
        layers: list = [None] * rep.height
        families: list = [None] * rep.height
        for i, j in pairs:
            layers[i], families[i] = layers_d[j], families_d[j]
        out.append(units.mapping(rep, layers, families))
    return pl.concat(out), matched
