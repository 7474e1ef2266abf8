"""Several ranks: per-rank reports (the K3 loop run once per rank on the H200, distinct
processes with their own weights) analysed in parallel workers, and rank skew per step and
layer checked against the independent reference."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from k3trace.analyses import analyze_report
from k3trace.analyses.ranks import analyze_ranks, resolve_reports
from k3trace.cli import app
from k3trace.config import load_config
from tests import reference as R

RANKS = ["k3_rank0", "k3_rank1"]


@pytest.fixture(scope="module")
def rank_dir(trace_sqlite, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    for name in RANKS:
        shutil.copyfile(trace_sqlite(name), folder / f"{name}.sqlite")
    return folder


def test_resolve_reports(rank_dir):
    want = [rank_dir / f"{n}.sqlite" for n in RANKS]
    assert resolve_reports([rank_dir]) == want
    assert resolve_reports([rank_dir / "k3_rank*.sqlite"]) == want
    assert resolve_reports(want) == want


def test_parallel_workers_give_the_single_report_results(rank_dir, tmp_path):
    cfg = load_config()
    paths = resolve_reports([rank_dir])
    ranks = analyze_ranks(paths, cfg, workers=2, memory_per_worker=8 * 2**30)
    for path, a in zip(paths, ranks.ranks):
        assert a.to_json() == analyze_report(path, cfg).to_json()


def finish_times(ref) -> dict:
    """(ordinal, layer) -> last kernel end of the layer minus the step's first start (ns)."""
    out = {}
    for ordinal, step in enumerate(sorted(ref.stable, key=lambda s: s.first)):
        for k in step.kernels:
            if k.layer is not None:
                key = (ordinal, k.layer)
                out[key] = max(out.get(key, 0), k.end - step.first)
    return out


def test_rank_skew_against_the_reference(rank_dir):
    ranks = analyze_ranks(resolve_reports([rank_dir]), load_config(), workers=2)
    refs = [finish_times(R.compute(rank_dir / f"{n}.sqlite")) for n in RANKS]
    common = sorted(set(refs[0]) & set(refs[1]))
    got = {(r["ordinal"], r["layer"]): r for r in ranks.skew.iter_rows(named=True)}
    assert set(got) == set(common)
    for key in common:
        a, b = refs[0][key], refs[1][key]
        assert got[key]["skew_us"] == pytest.approx(abs(a - b) / 1e3, abs=1e-9)
        assert got[key]["last_rank"] == (0 if a > b else 1) or a == b
    # placeholders: the all-reduces of one GPU standing in for a rank have no kernels
    assert ranks.all_reduce["kernels_per_step"].to_list() == [0.0, 0.0]


def test_cli_folder_of_rank_reports(rank_dir, tmp_path):
    result = CliRunner().invoke(app, ["analyze", str(rank_dir), "--json", "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.stdout
    j = json.loads(result.stdout)
    assert len(j["ranks"]) == 2 and j["rank_skew"]["median_us"] > 0
    assert sum(j["rank_skew"]["last_rank_counts"].values()) > 0


def test_dask_engine(rank_dir):
    pytest.importorskip("dask.distributed")
    ranks = analyze_ranks(resolve_reports([rank_dir]), load_config(), engine="dask")
    assert len(ranks.ranks) == 2


def _worker_threads(_: int) -> tuple[int, int]:
    import polars as pl

    from k3trace import cores

    return cores.available(), pl.thread_pool_size()


def test_rank_workers_keep_to_their_share_of_the_cores(monkeypatch):
    """Workers started inside `cores.shared_by` analyse with the machine's cores split
    among them (polars' pool too, sized when the worker starts); the parent's environment is
    as before afterwards."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from k3trace import cores

    monkeypatch.setenv("K3TRACE_CORES", "8")
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    with cores.shared_by(3), ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        seen = set(pool.map(_worker_threads, range(4)))
    assert seen == {(8 // 3, 8 // 3)}
    assert os.environ["K3TRACE_CORES"] == "8" and "POLARS_MAX_THREADS" not in os.environ
    # A smaller polars pool asked for by the user is kept; more workers than cores get one each.
    monkeypatch.setenv("POLARS_MAX_THREADS", "1")
    with cores.shared_by(2) as share:
        assert share == 4 and os.environ["POLARS_MAX_THREADS"] == "1"
    with cores.shared_by(16) as share:
        assert share == 1 and os.environ["K3TRACE_CORES"] == "1"


def _whole_entries(cache, kind: str) -> list:
    return [p for p in (cache / kind).glob("*") if (p / "manifest.json").exists()]


def test_rank_workers_write_their_cache_entries_once_the_answer_is_ready(rank_dir, tmp_path):
    """The workers hold their entries until they end, then leave them to detached writers:
    the entries appear after analyze_ranks returns, and serve the next analysis. Waiting
    for the cache, they are there when it returns."""
    import time

    cfg, paths = load_config(), resolve_reports([rank_dir])
    cache = tmp_path / "held"
    ranks = analyze_ranks(paths, cfg, cache_dir=cache, workers=2)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (len(_whole_entries(cache, "analyses")) == len(paths)
                                               and len(_whole_entries(cache, "traces")) == len(paths)
                                               and not list(cache.rglob(".tmp-*"))):
        time.sleep(0.1)
    assert len(_whole_entries(cache, "analyses")) == len(_whole_entries(cache, "traces")) == len(paths)
    assert not list(cache.rglob(".tmp-*"))
    for path, a in zip(paths, ranks.ranks):
        phases: list[str] = []
        cached = analyze_report(path, cfg, cache_dir=cache, progress=phases.append)
        assert phases == ["cached analysis"] and cached.to_json() == a.to_json()
    waited = tmp_path / "waited"
    analyze_ranks(paths, cfg, cache_dir=waited, workers=2, wait_for_cache=True)
    assert len(_whole_entries(waited, "analyses")) == len(_whole_entries(waited, "traces")) == len(paths)
