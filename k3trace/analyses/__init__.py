"""The metrics of one report (METRICS.md): `analyze` a trace, or `analyze_report` a path."""

from k3trace.analyses.pipeline import analyze, analyze_report
from k3trace.analyses.result import JSON_VERSION, Analysis

__all__ = ["JSON_VERSION", "Analysis", "analyze", "analyze_report"]
