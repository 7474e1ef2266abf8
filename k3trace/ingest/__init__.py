"""Reports in, normalised frames out (the lowest layer: imports nothing else of k3trace)."""

from k3trace.ingest.report import Limits, Progress, Tools, Trace, load_report, report_key

__all__ = ["Limits", "Progress", "Tools", "Trace", "load_report", "report_key"]
