"""Analysis settings: the K3 defaults (`defaults.toml`), overridable from a TOML file."""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from k3trace.errors import ReportError


@dataclass(frozen=True)
class NameRule:
    pattern: str
    family: str


@dataclass(frozen=True)
class ModuleRule:
    """A layer's child module whose name (or a name below it) matches `pattern` gets `family`."""
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
    module_pattern: str
    module_rules: tuple[ModuleRule, ...]
    attention_families: tuple[str, ...]
    attention_pattern: str
    layer_start_pattern: str
    kernel_families: tuple[str, ...]
    first_layer: int
    fmha_pattern: str
    residual_pattern: str
    full_attention_families: tuple[str, ...]
    pdl_max_gap_ns: int
    pdl_max_overlap_ns: int
    pdl_max_tail_ns: int
    silent_stretch_ns: int

    max_decompressed_bytes: int
    max_compression_ratio: float

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> "Config":
        steps, labels = data["steps"], data["labels"]
        inference = labels["inference"]
        patterns, pdl, comp, inp = data["patterns"], data["pdl"], data["completeness"], data["input"]
        cfg = cls(
            step_nvtx_pattern=_pattern(steps, "steps.nvtx_pattern", "nvtx_pattern"),
            warmup_steps=_int(steps, "steps.warmup", "warmup", lo=0),
            mad_k=_number(steps, "steps.mad_k", "mad_k", lo=0, lo_open=True),
            min_kernel_fraction=_number(steps, "steps.min_kernel_fraction", "min_kernel_fraction", lo=0, hi=1),
            layer_pattern=_pattern(labels, "labels.layer_pattern", "layer_pattern"),
            families=tuple(_strings(labels, "labels.families", "families")),
            name_rules=tuple(_rules(labels.get("name_rules"))),
            module_pattern=_pattern(labels, "labels.module_pattern", "module_pattern"),
            module_rules=tuple(ModuleRule(r.pattern, r.family)
                               for r in _rules(labels.get("modules"), "labels.modules")),
            attention_families=tuple(_strings(labels, "labels.attention_families", "attention_families")),
            attention_pattern=_pattern(inference, "labels.inference.attention_pattern", "attention_pattern"),
            layer_start_pattern=_pattern(inference, "labels.inference.layer_start_pattern", "layer_start_pattern"),
            kernel_families=tuple(_strings(inference, "labels.inference.kernel_families", "kernel_families")),
            first_layer=_int(inference, "labels.inference.first_layer", "first_layer", lo=0),
            fmha_pattern=_pattern(patterns, "patterns.fmha", "fmha"),
            residual_pattern=_pattern(patterns, "patterns.residual", "residual"),
            full_attention_families=tuple(_strings(patterns, "patterns.full_attention_families",
                                                   "full_attention_families")),
            pdl_max_gap_ns=_int(pdl, "pdl.max_gap_ns", "max_gap_ns", lo=0),
            pdl_max_overlap_ns=_int(pdl, "pdl.max_overlap_ns", "max_overlap_ns", lo=0),
            pdl_max_tail_ns=_int(pdl, "pdl.max_tail_ns", "max_tail_ns", lo=0),
            silent_stretch_ns=int(_number(comp, "completeness.silent_stretch_ms", "silent_stretch_ms", lo=0,
                                          lo_open=True, hi=1e9) * 1e6),
            max_decompressed_bytes=int(_number(inp, "input.max_decompressed_gib", "max_decompressed_gib", lo=0,
                                               lo_open=True, hi=1 << 20) * 2**30),
            max_compression_ratio=_number(inp, "input.max_compression_ratio", "max_compression_ratio", lo=1),
        )
        if not {"index", "family"} <= set(re.compile(cfg.layer_pattern).groupindex):
            raise ValueError("labels.layer_pattern needs the named groups (?P<index>...) and (?P<family>...)")
        if not {"prefix", "index", "rest"} <= set(re.compile(cfg.module_pattern).groupindex):
            raise ValueError("labels.module_pattern needs the named groups (?P<prefix>...), (?P<index>...) "
                             "and (?P<rest>...)")
        return cfg

    @property
    def infers_pdl(self) -> bool:
        """Whether a short same-stream gap (or an overlap) reads as a PDL edge."""
        return self.pdl_max_gap_ns >= 0

    def without_pdl(self) -> "Config":
        """For a platform without programmatic dependent launch (HIP): roctracer reports a
        graph replay's kernels back to back (gaps of 0-2 ns on the MI300X), which the CUDA
        threshold would read as PDL edges; here no gap or overlap is one."""
        return replace(self, pdl_max_gap_ns=_NO_PDL_GAP_NS, pdl_max_overlap_ns=0, pdl_max_tail_ns=0)


#: No same-stream gap is this short: `without_pdl`'s threshold (a TOML file cannot set a
#: negative one).
_NO_PDL_GAP_NS = -(1 << 62)


def _polars_regex_error(pattern: str) -> str | None:
    """Why polars (Rust's regex engine, which runs every pattern) rejects `pattern`: Python's
    `re` accepts look-around and backreferences that it does not."""
    import polars as pl

    try:
        pl.Series([""], dtype=pl.String).str.contains(pattern)
    except pl.exceptions.PolarsError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith("error:")]
        return lines[0].removeprefix("error:").strip() if lines else "not a valid regular expression"
    return None


def _pattern(section: dict, name: str, key: str) -> str:
    value = section[key]
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string (a regular expression), not {type(value).__name__}")
    why = _polars_regex_error(value)
    if why is None:
        try:
            re.compile(value)
        except re.error as exc:
            why = str(exc)
    if why is not None:
        raise ValueError(f"{name} = {value!r} is not a regular expression k3trace can run: {why}")
    return value


def _number(section: dict, name: str, key: str, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False) -> float:
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} = {value} is not a finite number")
    below = lo is not None and (value <= lo if lo_open else value < lo)
    if below or (hi is not None and value > hi):
        low = "" if lo is None else (f"> {lo:g}" if lo_open else f">= {lo:g}")
        high = "" if hi is None else f"<= {hi:g}"
        raise ValueError(f"{name} = {value:g} is out of range (must be {' and '.join(x for x in (low, high) if x)})")
    return value


def _int(section: dict, name: str, key: str, *, lo: int | None = None) -> int:
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} = {value} is out of range (must be >= {lo})")
    return value


def _strings(section: dict, name: str, key: str) -> list[str]:
    value = section[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings")
    return value


def _rules(value: Any, name: str = "labels.name_rules") -> list[NameRule]:
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise ValueError(f"{name} must be a list of tables ([[{name}]])")
    out = []
    for i, rule in enumerate(value):
        where = f"{name}[{i}]"
        _known_keys(rule, {"pattern": None, "family": None}, where + ".")
        if not isinstance(rule.get("family"), str):
            raise ValueError(f"{where}.family must be a string")
        out.append(NameRule(_pattern(rule, f"{where}.pattern", "pattern"), rule["family"]))
    return out


def _known_keys(given: dict[str, Any], known: dict[str, Any], prefix: str = "") -> None:
    """Refuse keys the defaults do not have, naming the nearest valid one (a typo such as
    `[step]` for `[steps]` would otherwise be ignored silently)."""
    for key, value in given.items():
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else f" (valid: {', '.join(prefix + k for k in known)})"
            kind = "section" if isinstance(value, dict) else "key"
            raise ValueError(f"unknown {kind} {prefix}{key}{hint}")
        if isinstance(value, dict) and isinstance(known[key], dict):
            _known_keys(value, known[key], f"{prefix}{key}.")


def _defaults() -> dict[str, Any]:
    return tomllib.loads(resources.files("k3trace").joinpath("defaults.toml").read_text())


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


#: Largest config file read (a config is a few hundred bytes).
MAX_CONFIG_BYTES = 1 << 20


def _read_text(path: Path) -> str:
    """The file's text: regular files only (a FIFO would block), bounded, UTF-8."""
    import stat

    label = path.name
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ReportError(f"config {label} is not a regular file", "pass a TOML file to --config")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ReportError(f"config {label} is {st.st_size / 2**20:.1f} MiB, not a config",
                              "pass a TOML file to --config")
        data = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"config {label} cannot be read ({exc.strerror or exc})",
                          "pass a readable TOML file to --config") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"config {label} is not UTF-8 text (byte {exc.start})",
                          "save the TOML file as UTF-8") from None


def load_config(path: Path | None = None) -> Config:
    """The K3 defaults, with the keys of `path` (if given) laid over them."""
    data = _defaults()
    if path is not None:
        text = _read_text(Path(path))
        try:
            override = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ReportError(f"config {Path(path).name} cannot be read ({exc})", "pass a valid TOML file to --config") from None
    label = Path(path).name if path is not None else "defaults.toml"
    try:
        if path is not None:
            _known_keys(override, data)
            data = _merge(data, override)
        return Config.from_toml(data)
    except (KeyError, ValueError, TypeError, re.error) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ReportError(f"config {label}: {what}", "compare it with k3trace's defaults.toml") from None
