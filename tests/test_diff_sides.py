"""The diff's analyses (`for_diff`): they leave out the parts a diff never reads
(DIFF_OMITS), never compute them, and give the diff every other field as the whole analysis
does; in the cache they are entries of their own, so that an `analyze` after a `diff` with
the same cache folder still answers with the whole analysis."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from k3trace.analyses import analyze, analyze_report, critical_path, kernels, layers, pdl, stepgraph
from k3trace.analyses.result import DIFF_OMITS, Analysis
from k3trace.cli import app
from k3trace.config import load_config
from k3trace.diff import diff
from k3trace.ingest import load_report
from k3trace.render.html import diff_page
from k3trace.render.terminal import diff_markdown

PAIR = ("k3_bs1_base_a", "k3_bs1_router_multipass")
runner = CliRunner()


def same(a, b) -> bool:
    """Deep equality over what an Analysis holds: frames, arrays, dataclasses, containers."""
    if isinstance(a, pl.DataFrame):
        return isinstance(b, pl.DataFrame) and a.schema == b.schema and a.equals(b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def for_diff(trace_sqlite, name: str) -> Analysis:
    return analyze(load_report(trace_sqlite(name)), load_config(), for_diff=True)


def kept_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(Analysis) if f.name not in (*DIFF_OMITS, "omitted")]


@pytest.mark.parametrize("name", [*PAIR, "hf_base_a"])
def test_leaves_out_only_the_omitted_parts(trace_sqlite, analysis, name):
    whole, lean = analysis(name), for_diff(trace_sqlite, name)
    assert whole.omitted == () and lean.omitted == DIFF_OMITS
    assert all(getattr(lean, f) is None for f in DIFF_OMITS)
    assert all(getattr(whole, f) is not None for f in DIFF_OMITS)
    for f in kept_fields():
        assert same(getattr(lean, f), getattr(whole, f)), f


def test_the_omitted_parts_are_never_computed(trace_sqlite, monkeypatch):
    def never(*_args, **_kwargs):
        raise AssertionError("computed a part the diff leaves out")

    for module, name in ((layers, "layer_steps"), (layers, "critical_per_step"), (layers, "layer_table"),
                         (kernels, "kernel_table"), (stepgraph, "slack"), (critical_path, "by_kernel"),
                         (critical_path, "per_step"), (pdl, "same_stream_pairs"), (pdl, "per_step"),
                         (pdl, "summary")):
        monkeypatch.setattr(module, name, never)
    assert for_diff(trace_sqlite, PAIR[0]).omitted == DIFF_OMITS
    with pytest.raises(AssertionError, match="computed a part"):
        analyze(load_report(trace_sqlite(PAIR[0])), load_config())


def test_what_reads_the_whole_analysis_says_so(trace_sqlite):
    lean = for_diff(trace_sqlite, "small_inside_a")
    with pytest.raises(ValueError, match="leaves out kernel_table"):
        lean.to_json()


def test_the_diff_reads_the_same_from_them(trace_sqlite, analysis):
    whole = diff([analysis(PAIR[0])], [analysis(PAIR[1])])
    lean = diff([for_diff(trace_sqlite, PAIR[0])], [for_diff(trace_sqlite, PAIR[1])])
    assert lean.to_json() == whole.to_json()
    assert diff_markdown(lean) == diff_markdown(whole)
    assert diff_page(lean) == diff_page(whole)


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_analyze_after_a_diff_in_the_same_cache_gives_the_whole_analysis(trace_sqlite, tmp_path):
    old, new = (str(trace_sqlite(n)) for n in PAIR)
    cache = tmp_path / "cache"
    fresh = json.loads(invoke("analyze", old, "--json", "--no-cache"))
    diffed = json.loads(invoke("diff", old, new, "--json", "--cache-dir", str(cache)))
    assert json.loads(invoke("diff", old, new, "--json", "--no-cache")) == diffed
    # Computed after the diff's entries, not read from them; then cached as a whole.
    for expect in ([], ["cached analysis"]):
        phases: list[str] = []
        again = analyze_report(trace_sqlite(PAIR[0]), load_config(), cache_dir=cache, progress=phases.append)
        assert "cached analysis" not in phases if not expect else phases == expect
        assert again.omitted == () and again.to_json() == fresh
    assert json.loads(invoke("analyze", old, "--json", "--cache-dir", str(cache))) == fresh
    # A diff then takes the whole entry where there is one, its own where not.
    for name, omitted in ((PAIR[0], ()), (PAIR[1], DIFF_OMITS)):
        phases = []
        side = analyze_report(trace_sqlite(name), load_config(), cache_dir=cache, progress=phases.append,
                              for_diff=True)
        assert phases == ["cached analysis"] and side.omitted == omitted
    assert json.loads(invoke("diff", old, new, "--json", "--cache-dir", str(cache))) == diffed
