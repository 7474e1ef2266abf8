"""Reports in, normalised frames out (the lowest layer: imports nothing else of k3trace).

The names below load on first use (PEP 562): `k3trace.ingest.tools` and `cachefs` are
imported by the CLI at start-up, which must not pay for polars and pyarrow until a command
reads a report.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["Limits", "Progress", "Tools", "Trace", "load_report", "report_key"]

if TYPE_CHECKING:
    from k3trace.ingest.report import Limits, Progress, Trace, load_report, report_key
    from k3trace.ingest.tools import Tools


def __getattr__(name: str):
    if name == "Tools":
        return importlib.import_module("k3trace.ingest.tools").Tools
    if name in __all__:
        return getattr(importlib.import_module("k3trace.ingest.report"), name)
    raise AttributeError(f"module 'k3trace.ingest' has no attribute {name!r}")
