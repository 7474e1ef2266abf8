"""Save and load an Analysis: its frames as lz4 Arrow IPC files, everything else pickled,
written to a temporary folder and renamed into place (atomic)."""

from __future__ import annotations

import os
import pickle
import shutil
import uuid
from dataclasses import fields
from pathlib import Path

import polars as pl

from k3trace.analyses.result import Analysis

FORMAT = 1


def save(analysis: Analysis, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        rest = {}
        for f in fields(analysis):
            value = getattr(analysis, f.name)
            if isinstance(value, pl.DataFrame):
                value.write_ipc(tmp / f"{f.name}.arrow", compression="lz4")
            else:
                rest[f.name] = value
        with open(tmp / "rest.pickle", "wb") as fh:
            pickle.dump(rest, fh, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            os.rename(tmp, folder)
        except OSError:
            pass  # written by another process first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load(folder: Path) -> Analysis | None:
    if not (folder / "rest.pickle").exists():
        return None
    try:
        with open(folder / "rest.pickle", "rb") as fh:
            rest = pickle.load(fh)
        frames = {p.stem: pl.read_ipc(p) for p in folder.glob("*.arrow")}
        return Analysis(**rest, **frames)
    except (OSError, EOFError, pickle.UnpicklingError, TypeError, AttributeError, pl.exceptions.PolarsError):
        return None  # a damaged or stale entry is recomputed, never trusted
