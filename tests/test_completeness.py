"""An incomplete capture is reported, never silently analysed: real recordings with records
removed the way a lossy profiler drops them, and the step-source fallbacks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.ingest import load_report
from report_copies import altered_copy

ALL = ["small_inside_a", "small_inside_b", "small_inside_c", "small_before", "small_delay_kda_step",
       "small_delay_gate", "small_nofork"]


def copy_with(trace_sqlite, tmp_path: Path, *sql: str, name: str = "small_inside_a") -> Path:
    return altered_copy(trace_sqlite(name), tmp_path / f"{name}.sqlite", sql)


def run(path: Path):
    return analyze(load_report(path), load_config())


@pytest.mark.parametrize("name", ALL)
def test_bundled_recordings_are_complete(trace_sqlite, name):
    c = run(trace_sqlite(name)).completeness
    assert c.ok and c.problems == ()


def replay_ids(path: Path) -> list[int]:
    with sqlite3.connect(path) as con:
        return [r[0] for r in con.execute(
            "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL "
            "GROUP BY correlationId ORDER BY min(start)")]


def test_steps_with_lost_kernels(trace_sqlite, tmp_path):
    ids = replay_ids(trace_sqlite("small_inside_a"))
    lossy = [ids[10], ids[20], ids[30]]
    # drop 10 kernel records from each of three replays
    sql = [f"DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid IN (SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL "
           f"WHERE correlationId = {c} ORDER BY start LIMIT 10 OFFSET 50)" for c in lossy]
    a = run(copy_with(trace_sqlite, tmp_path, *sql))
    assert not a.completeness.ok and a.completeness.incomplete_steps == 3
    problem = a.completeness.problems[0]
    assert problem.startswith("3 of 60 steps hold fewer kernels") and "30 kernel records missing" in problem
    assert "steps 10, 20, 30" in problem
    # the damaged steps are never stable
    assert set(a.steps.filter(a.steps["drop_reason"] == "incomplete")["step"].to_list()) == {10, 20, 30}


def test_launches_without_gpu_records(trace_sqlite, tmp_path):
    # The eager step's kernels vanish but its launch calls stay (the nsys 2023.4 failure mode).
    sql = ["DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NULL AND rowid IN "
           "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NULL ORDER BY start LIMIT 100)"]
    a = run(copy_with(trace_sqlite, tmp_path, *sql))
    text = " | ".join(a.completeness.problems)
    assert a.completeness.missing_launches == 100
    assert "100 of" in text and "have no GPU record" in text
    assert "annotated eager steps hold fewer kernels than the plan's 124" in text


def test_ranges_with_no_records(trace_sqlite, tmp_path):
    # Runtime records lost inside the eager step's layer ranges.
    sql = ["DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start > (SELECT start FROM NVTX_EVENTS WHERE text = 'layer.3.kda' "
           "ORDER BY start LIMIT 1) AND start < (SELECT end FROM NVTX_EVENTS WHERE text = 'layer.5.moe' ORDER BY start LIMIT 1)"]
    a = run(copy_with(trace_sqlite, tmp_path, *sql))
    assert a.completeness.silent_ranges > 0
    assert any("NVTX ranges hold no CUDA call" in p for p in a.completeness.problems)


def test_nvtx_steps_when_graph_ids_are_missing(trace_sqlite, tmp_path):
    # Without graph node ids, the decode_step ranges around each replay give the steps.
    path = copy_with(trace_sqlite, tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET graphNodeId = NULL")
    a = run(path)
    base = run(trace_sqlite("small_inside_a"))
    assert a.step_source == "nvtx"
    # 60 replays + the annotated eager step, which is an NVTX step of its own here
    assert a.steps.height == 61
    assert a.step_stats["span"]["median"] == pytest.approx(base.step_stats["span"]["median"], rel=0.01)


def test_period_steps_when_neither_graph_nor_nvtx(trace_sqlite, tmp_path):
    path = copy_with(trace_sqlite, tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET graphNodeId = NULL",
                     "DELETE FROM NVTX_EVENTS")
    a = run(path)
    base = run(trace_sqlite("small_inside_a"))
    assert a.step_source == "period"
    assert int(a.steps["kernels_expected"][0]) == 124
    # The period found is the replay's: same median step period within 1%.
    assert a.step_stats["period"]["median"] == pytest.approx(base.step_stats["period"]["median"], rel=0.01)


def test_a_blocking_call_is_no_silent_stretch(trace_sqlite, tmp_path):
    """6 ms inside the annotated eager step with no runtime call start: dropped records when
    the thread was outside any call then, not when one call (a synchronous copy, a
    synchronize) ran through it; SGLang's public profile spends 463 ms in one
    hipMemcpyWithStream."""
    with sqlite3.connect(trace_sqlite("small_inside_a")) as con:
        step_start, step_end, tid = con.execute(
            "SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
            "WHERE coalesce(n.text, s.value) LIKE 'decode_step%' ORDER BY n.end - n.start DESC LIMIT 1").fetchone()
        first = con.execute("SELECT rowid, end FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid = ? AND start > ? "
                            "ORDER BY start LIMIT 1 OFFSET 5", (tid, step_start)).fetchone()
    window = 6_000_000
    assert step_end - first[1] > window + 1_000_000   # the stretch lies inside the step range
    quiet = (f"DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid = {tid} AND start > {first[1]} "
             f"AND start < {first[1] + window}")
    dropped = run(copy_with(trace_sqlite, tmp_path, quiet)).completeness.problems
    assert any("stretches inside decode-step ranges have no CUDA record" in p for p in dropped)
    (tmp_path / "blocked").mkdir()
    blocked = run(copy_with(trace_sqlite, tmp_path / "blocked", quiet,
                            f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET end = {first[1] + window} WHERE rowid = {first[0]}"))
    assert not any("stretches inside decode-step ranges" in p for p in blocked.completeness.problems)
