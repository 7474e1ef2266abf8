"""Save and load an Analysis without pickle: its frames as lz4 Arrow IPC files, its arrays
as .npy (no object arrays), everything else as JSON, in one digest-checked cache entry
(ingest/cachefs.py). Loading builds only the dataclasses named in `_TYPES`: a cache entry
can hold data, never code, and a damaged or edited one is removed and recomputed."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from k3trace.analyses.anatomy import Anatomy
from k3trace.analyses.completeness import Completeness
from k3trace.analyses.dram import DramReading
from k3trace.analyses.result import PATH_COLUMNS, Analysis
from k3trace.analyses.stepgraph import StepGraph
from k3trace.config import Config, ModuleRule, NameRule
from k3trace.model.labels import LabelSummary
from k3trace.ingest import cachefs, detached

FORMAT = 3
#: The path's columns that repeat the kernels' for the same kernel: its rows are the
#: stable-step kernels, so the entry holds only its own columns and the key, and the rest
#: is taken back from the stored kernels on load (at 373k kernels its file's write and read
#: cost half as much).
_PATH_SHARED = ("kernel_id", "step", "stream_id", "start", "end", "name", "family", "layer", "launch_rank")
_TYPES: dict[str, type] = {t.__name__: t for t in (Analysis, StepGraph, Completeness, Config, NameRule,
                                                  ModuleRule, LabelSummary, DramReading, Anatomy)}


class _Encoder:
    """Values -> JSON-able trees; frames and arrays go to files named in the tree."""

    def __init__(self) -> None:
        self.files: dict[str, Callable[[Path], None]] = {}

    def _file(self, suffix: str, write: Callable[[Path], None]) -> str:
        name = f"{len(self.files)}.{suffix}"
        self.files[name] = write
        return name

    def encode(self, value: Any) -> Any:
        if isinstance(value, pl.DataFrame):
            return {"frame": self._file("arrow", detached.Frame(value, "ipc"))}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise TypeError("object arrays are not stored")

            def write(p: Path, v=value) -> None:
                with open(p, "wb") as fh:
                    np.save(fh, v, allow_pickle=False)
            return {"array": self._file("npy", write)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = type(value).__name__
            if _TYPES.get(name) is not type(value):
                raise TypeError(f"{name} is not a stored type")
            return {"dataclass": name,
                    "fields": {f.name: self.encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
        if isinstance(value, tuple):
            return {"tuple": [self.encode(v) for v in value]}
        if isinstance(value, list):
            return {"list": [self.encode(v) for v in value]}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise TypeError("only str keys are stored")
            return {"dict": {k: self.encode(v) for k, v in value.items()}}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        if isinstance(value, np.generic):
            return {"value": value.item()}
        raise TypeError(f"{type(value).__name__} is not stored")


def _decode(node: Any, folder: Path) -> Any:
    if "dataclass" in node:
        cls = _TYPES[node["dataclass"]]
        given = node["fields"]
        if set(given) != {f.name for f in dataclasses.fields(cls)}:
            raise TypeError(f"{cls.__name__} fields changed")
        return cls(**{k: _decode(v, folder) for k, v in given.items()})
    (kind, payload), = node.items()
    if kind == "value":
        if payload is not None and not isinstance(payload, (bool, int, float, str)):
            raise TypeError("not a scalar")
        return payload
    if kind == "frame":
        return pl.read_ipc(io.BytesIO((folder / Path(payload).name).read_bytes()))
    if kind == "array":
        with open(folder / Path(payload).name, "rb") as fh:
            return np.load(io.BytesIO(fh.read()), allow_pickle=False)
    if kind == "tuple":
        return tuple(_decode(v, folder) for v in payload)
    if kind == "list":
        return [_decode(v, folder) for v in payload]
    if kind == "dict":
        return {str(k): _decode(v, folder) for k, v in payload.items()}
    raise TypeError(f"unknown node {kind}")


def save(analysis: Analysis, folder: Path) -> bool:
    """Write the entry (atomic; False when the cache could not take it)."""
    enc = _Encoder()
    shared = _path_shared(analysis)
    if shared:
        analysis = dataclasses.replace(analysis, path=analysis.path.drop(_PATH_SHARED[1:]))
    try:
        tree = enc.encode(analysis)
    except (TypeError, ValueError):
        return False  # a field this format cannot hold: not cached, never pickled
    writers = dict(enc.files)
    tree = {"analysis": tree, "path_from_kernels": shared}
    writers["analysis.json"] = lambda p: p.write_text(json.dumps(tree))
    return cachefs.write_entry(folder, writers, {"root": "analysis.json"}, FORMAT)


def _path_shared(analysis: Analysis) -> bool:
    """Whether the path's shared columns can be left to the kernels: both frames in
    kernel_id order (as analyze() makes them), the shared columns of the same types."""
    path, kernels = analysis.path, analysis.kernels
    return (tuple(path.columns) == PATH_COLUMNS and set(_PATH_SHARED) <= set(kernels.columns)
            and all(path.schema[c] == kernels.schema[c] for c in _PATH_SHARED)
            and path["kernel_id"].is_sorted() and kernels["kernel_id"].is_sorted())


def _path_with_kernels(own: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """The stored path columns with the shared ones from the kernels of the same ids (a
    filter keeps the kernels' order: kernel_id order, the path's; a semi join costs 3x)."""
    shared = kernels.select(_PATH_SHARED).filter(pl.col("kernel_id").is_in(own["kernel_id"].implode()))
    if not shared["kernel_id"].equals(own["kernel_id"]):
        raise ValueError("the path's kernels are not the stored kernels")
    return pl.concat([shared, own.drop("kernel_id")], how="horizontal").select(PATH_COLUMNS)


def load(folder: Path) -> Analysis | None:
    entry = cachefs.read_entry(folder, FORMAT)
    if entry is None:
        return None
    try:
        tree = json.loads((folder / "analysis.json").read_text())
        analysis = _decode(tree["analysis"], folder)
        if not isinstance(analysis, Analysis):
            raise TypeError("not an analysis")
        if tree["path_from_kernels"] is True:
            analysis = dataclasses.replace(analysis, path=_path_with_kernels(analysis.path, analysis.kernels))
        return analysis
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pl.exceptions.PolarsError):
        cachefs.discard(folder)  # a damaged or stale entry is recomputed, never trusted
        return None
