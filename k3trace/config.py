"""Analysis settings: the K3 defaults (`defaults.toml`), overridable from a TOML file."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3trace.errors import ReportError


@dataclass(frozen=True)
class NameRule:
    pattern: str
    family: str


@dataclass(frozen=True)
class Config:
    step_nvtx_pattern: str
    warmup_steps: int
    mad_k: float
    min_kernel_fraction: float
    layer_pattern: str
    families: tuple[str, ...]
    name_rules: tuple[NameRule, ...]
    fmha_pattern: str
    residual_pattern: str
    full_attention_families: tuple[str, ...]
    pdl_max_gap_ns: int
    pdl_max_overlap_ns: int
    silent_stretch_ns: int

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> "Config":
        steps, labels = data.get("steps", {}), data.get("labels", {})
        patterns, pdl, comp = data.get("patterns", {}), data.get("pdl", {}), data.get("completeness", {})
        cfg = cls(
            step_nvtx_pattern=steps["nvtx_pattern"],
            warmup_steps=int(steps["warmup"]),
            mad_k=float(steps["mad_k"]),
            min_kernel_fraction=float(steps["min_kernel_fraction"]),
            layer_pattern=labels["layer_pattern"],
            families=tuple(labels["families"]),
            name_rules=tuple(NameRule(r["pattern"], r["family"]) for r in labels["name_rules"]),
            fmha_pattern=patterns["fmha"],
            residual_pattern=patterns["residual"],
            full_attention_families=tuple(patterns["full_attention_families"]),
            pdl_max_gap_ns=int(pdl["max_gap_ns"]),
            pdl_max_overlap_ns=int(pdl["max_overlap_ns"]),
            silent_stretch_ns=int(float(comp["silent_stretch_ms"]) * 1e6),
        )
        for pattern in (cfg.step_nvtx_pattern, cfg.layer_pattern, cfg.fmha_pattern, cfg.residual_pattern,
                        *(r.pattern for r in cfg.name_rules)):
            re.compile(pattern)
        if not {"index", "family"} <= set(re.compile(cfg.layer_pattern).groupindex):
            raise ValueError("labels.layer_pattern needs the named groups (?P<index>...) and (?P<family>...)")
        return cfg


def _defaults() -> dict[str, Any]:
    return tomllib.loads(resources.files("k3trace").joinpath("defaults.toml").read_text())


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def load_config(path: Path | None = None) -> Config:
    """The K3 defaults, with the keys of `path` (if given) laid over them."""
    data = _defaults()
    if path is not None:
        try:
            data = _merge(data, tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ReportError(f"config {Path(path).name} cannot be read ({exc})", "pass a valid TOML file to --config") from None
    try:
        return Config.from_toml(data)
    except (KeyError, ValueError, TypeError, re.error) as exc:
        raise ReportError(f"config is invalid ({exc})", "compare it with k3trace's defaults.toml") from None
