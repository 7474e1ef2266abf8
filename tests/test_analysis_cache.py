"""The analysis cache: a second analyze of the same report and config reads the stored
result (what makes a warm analyze fast), a changed config or report recomputes, and a
damaged entry is recomputed rather than trusted."""

from __future__ import annotations

import shutil

from k3trace.analyses import analyze_report
from k3trace.config import load_config


def run(path, cache_dir, cfg=None):
    phases: list[str] = []
    a = analyze_report(path, cfg or load_config(), cache_dir=cache_dir, progress=phases.append)
    return a, phases


def test_second_analyze_reads_the_cached_result(trace_sqlite, cache_dir):
    path = trace_sqlite("small_before")
    first, p1 = run(path, cache_dir)
    second, p2 = run(path, cache_dir)
    assert "cached analysis" not in p1 and p2 == ["cached analysis"]
    assert second.to_json() == first.to_json()
    assert second.kernels.equals(first.kernels) and second.path.equals(first.path)
    assert (second.graph.duration == first.graph.duration).all()


def test_changed_config_recomputes(trace_sqlite, cache_dir, tmp_path):
    path = trace_sqlite("small_before")
    run(path, cache_dir)
    toml = tmp_path / "k.toml"
    toml.write_text("[steps]\nmad_k = 3.0\n")
    a, phases = run(path, cache_dir, load_config(toml))
    assert "cached analysis" not in phases and a.config.mad_k == 3.0


def test_damaged_entry_is_recomputed(trace_sqlite, cache_dir):
    path = trace_sqlite("small_before")
    first, _ = run(path, cache_dir)
    entry = next((cache_dir / "analyses").iterdir())
    (entry / "rest.pickle").write_bytes(b"garbage")
    again, phases = run(path, cache_dir)
    assert "cached analysis" not in phases and again.to_json() == first.to_json()


def test_copied_report_is_its_own_entry(trace_sqlite, cache_dir, tmp_path):
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(trace_sqlite("small_before"), copy)
    run(trace_sqlite("small_before"), cache_dir)
    _, phases = run(copy, cache_dir)
    assert "cached analysis" not in phases
