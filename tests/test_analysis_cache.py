"""The analysis cache: a second analyze of the same report and config reads the stored
result (what makes a warm analyze fast), a changed config or report recomputes, and a
damaged, partial or planted entry is recomputed rather than trusted (it holds data only:
JSON, Arrow IPC and .npy files, each checked against the entry's digests)."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

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


def only_entry(cache_dir):
    entries = [p for p in (cache_dir / "analyses").iterdir()]
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize("damage", ["garbage json", "flipped byte", "truncated frame", "no manifest",
                                    "empty manifest", "missing file"])
def test_damaged_entry_is_recomputed_and_replaced(trace_sqlite, cache_dir, damage):
    path = trace_sqlite("small_before")
    first, _ = run(path, cache_dir)
    entry = only_entry(cache_dir)
    frame = next(entry.glob("*.arrow"))
    if damage == "garbage json":
        (entry / "analysis.json").write_text("{not json")
    elif damage == "flipped byte":
        data = bytearray(frame.read_bytes())
        data[len(data) // 2] ^= 0xFF
        frame.write_bytes(bytes(data))
    elif damage == "truncated frame":
        frame.write_bytes(frame.read_bytes()[:100])
    elif damage == "no manifest":
        (entry / "manifest.json").unlink()
    elif damage == "empty manifest":
        (entry / "manifest.json").write_text("{}")
    else:
        frame.unlink()
    again, phases = run(path, cache_dir)
    assert "cached analysis" not in phases and again.to_json() == first.to_json()
    # the damaged entry was replaced: the next run reads it
    _, phases = run(path, cache_dir)
    assert phases == ["cached analysis"]


class Planted:
    """What a pickle in the cache could do: run code when loaded."""

    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['K3_PLANTED']).write_text('ran')",))


def test_planted_pickle_never_runs(trace_sqlite, cache_dir, tmp_path, monkeypatch):
    path = trace_sqlite("small_before")
    first, _ = run(path, cache_dir)
    entry = only_entry(cache_dir)
    marker = tmp_path / "ran"
    monkeypatch.setenv("K3_PLANTED", str(marker))
    (entry / "rest.pickle").write_bytes(pickle.dumps(Planted()))
    manifest = json.loads((entry / "manifest.json").read_text())
    again, phases = run(path, cache_dir)
    assert not marker.exists()
    assert "cached analysis" not in phases and again.to_json() == first.to_json()
    assert manifest["format"] >= 2 and not any(p.suffix == ".pickle" for p in cache_dir.rglob("*"))


def test_entries_hold_only_data_formats(trace_sqlite, cache_dir):
    run(trace_sqlite("small_before"), cache_dir)
    suffixes = {p.suffix for p in cache_dir.rglob("*") if p.is_file()}
    assert suffixes <= {".json", ".arrow", ".npy", ".parquet"}, suffixes


def test_copied_report_is_its_own_entry(trace_sqlite, cache_dir, tmp_path):
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(trace_sqlite("small_before"), copy)
    run(trace_sqlite("small_before"), cache_dir)
    _, phases = run(copy, cache_dir)
    assert "cached analysis" not in phases


def test_entries_saved_meanwhile_are_there_once_the_block_is_left(trace_sqlite, cache_dir):
    """Within `saved_meanwhile` (the diff's), each analysis' entry is written on a thread of
    its own; leaving the block waits for them, and they are the entries an inline save writes."""
    from k3trace.analyses.pipeline import saved_meanwhile

    before, after = trace_sqlite("small_before"), trace_sqlite("small_inside_a")
    with saved_meanwhile():
        first, _ = run(before, cache_dir)
        with saved_meanwhile():  # nested: the outer block's exit waits
            run(after, cache_dir)
    assert len(list((cache_dir / "analyses").iterdir())) == 2
    again, phases = run(before, cache_dir)
    assert phases == ["cached analysis"] and again.to_json() == first.to_json()
