"""Several ranks of one run: one report per rank, analysed in parallel, then compared.

Each report is analysed in its own worker process (one per report, memory capped per
worker), through a local process pool by default or Dask (the engine Nsight Systems' own
multi-report recipes use) when the reports outgrow one machine. Across ranks: the per-rank
step anatomy, rank skew per step and layer (which rank finished each layer last), and the
exposed time of the all-reduce segments.
"""

from __future__ import annotations

import glob
import multiprocessing
import multiprocessing.util
import os
import resource
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import polars as pl

from k3trace import cores, heap
from k3trace.analyses.pipeline import analyze_report
from k3trace.analyses.result import Analysis
from k3trace.config import Config
from k3trace.errors import ReportError
from k3trace.ingest import Tools, detached

#: Kernels of a collective (NCCL and the common custom all-reduce kernels).
ALL_REDUCE = r"(?i)nccl.*(allreduce|all_reduce)|all_?reduce|allreduce|cross_device_reduce|lamport|one_?shot"
REPORT_SUFFIXES = (".nsys-rep", ".qdstrm", ".sqlite", ".xz", ".gz")


@dataclass(frozen=True)
class RankSet:
    ranks: tuple[Analysis, ...]          # in rank order (sorted report names); `kernels`, `path` empty (schema only)
    skew: pl.DataFrame                   # per (step ordinal, layer): finish per rank, last rank, skew
    all_reduce: pl.DataFrame             # per rank: all-reduce kernels' busy and exposed time per step

    @property
    def skew_summary(self) -> dict:
        return skew_summary(self.skew)

    def to_json(self) -> dict:
        return {
            "ranks": [a.to_json() for a in self.ranks],
            "rank_skew": self.skew_summary,
            "all_reduce": self.all_reduce.to_dicts(),
        }


def resolve_reports(spec: Sequence[Path]) -> list[Path]:
    """Report paths from files, folders of reports (not parquetdir exports) and globs."""
    out: list[Path] = []
    for item in spec:
        text = str(item)
        if any(ch in text for ch in "*?["):
            out += sorted(Path(p) for p in glob.glob(text))
        elif item.is_dir() and not (item / "StringIds.parquet").exists():
            out += sorted(p for p in item.iterdir() if p.name.endswith(REPORT_SUFFIXES)
                          or (p.is_dir() and (p / "StringIds.parquet").exists()))
        else:
            out.append(item)
    if not out:
        raise ReportError(f"no reports found in {', '.join(map(str, spec))}",
                          "pass report files, a folder of per-rank reports, or a quoted glob")
    return out


#: The cache entries' frames a rank worker may hold for writing after the answer (below).
HELD_BYTES = 1 << 30


def _worker(limit_bytes: int | None, hold_cache: bool) -> None:
    """A rank worker's set-up: its address-space cap; and, unless the caller waits for the
    cache, its cache entries held until it ends (the pool's shutdown, once every rank is
    analysed), then written by one detached writer. Written between its analyses, they took
    the CPU the other workers' analyses were waiting for (8 ranks of 421k kernels on 2
    cores: 8.5-8.7 s to the answer, now 7.3; 6.9-7.0 s with no cache at all)."""
    # As the command's own process: polars' part of the tuning came with the environment;
    # the imports (this module's: the analysis' own) are frozen before the first report.
    heap.tune_allocator()
    heap.freeze_imports()
    if limit_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    if hold_cache:
        detached.hold(min(HELD_BYTES, limit_bytes // 4) if limit_bytes else HELD_BYTES)
        multiprocessing.util.Finalize(None, detached.release_held, exitpriority=10)


def _one(args: tuple[Path, Config, Path | None, Tools]) -> tuple[Analysis, pl.DataFrame]:
    """One rank's analysis, and its layers' finish per step (`layer_finish`)."""
    path, cfg, cache_dir, tools = args
    analysis = analyze_report(path, cfg, cache_dir=cache_dir, tools=tools)
    # The per-kernel frames stay in the worker: across ranks only the layers' finish times
    # are read of them, worked out here. Shipping them back pickled cost the parent as much
    # CPU as a quarter of the analyses (the kernels), and the path 45 MB a rank at 373k
    # kernels: 170 ms to pickle in the worker and 70 to unpickle in the parent.
    finish = layer_finish(analysis)
    return replace(analysis, kernels=analysis.kernels.clear(), path=analysis.path.clear()), finish


def analyze_ranks(paths: Sequence[Path], cfg: Config, *, cache_dir: Path | None = None, tools: Tools = Tools(),
                  workers: int | None = None, memory_per_worker: int | None = None,
                  engine: str = "local", scheduler: str | None = None, wait_for_cache: bool = False) -> RankSet:
    """Each report analysed in its own worker process. The local engine's workers write
    their cache entries once every rank is analysed, after this returns (`wait_for_cache`:
    before each worker takes its next report, as before)."""
    jobs = [(Path(p), cfg, cache_dir, tools) for p in paths]
    if engine == "dask":
        done = _with_dask(jobs, scheduler)
    elif engine == "local":
        count = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
        # spawn, not fork: polars' thread pool does not survive a fork of this process.
        context = multiprocessing.get_context("spawn")
        # Each worker on its share of the cores: spreading one analysis further only costs
        # the others CPU time (k3trace/cores.py).
        with cores.shared_by(count), ProcessPoolExecutor(count, mp_context=context, initializer=_worker,
                                                         initargs=(memory_per_worker, not wait_for_cache)) as pool:
            done = list(pool.map(_one, jobs))
    else:
        raise ReportError(f"unknown engine {engine!r}", "use --engine local or --engine dask")
    results = [analysis for analysis, _ in done]
    return RankSet(ranks=tuple(results), skew=rank_skew([finish for _, finish in done]),
                   all_reduce=all_reduce_exposure(results))


def _with_dask(jobs: list, scheduler: str | None) -> list[tuple[Analysis, pl.DataFrame]]:
    try:
        from dask.distributed import Client
    except ImportError:
        raise ReportError("--engine dask needs dask.distributed",
                          "pip install 'dask[distributed]', or use the default local engine") from None
    with Client(scheduler) if scheduler else Client(processes=True) as client:
        return client.gather(client.map(_one, jobs, pure=False))


def layer_finish(a: Analysis) -> pl.DataFrame:
    """Per stable step (by ordinal) and layer: when the layer's last kernel ended, relative to
    the step's first kernel (us). Ordinals align ranks that ran the same steps."""
    k = a.path.filter(pl.col("layer").is_not_null())
    start = a.path.group_by("step").agg(pl.col("start").min().alias("t0"))
    ordinal = a.step_times.select("step").sort("step").with_row_index("ordinal")
    return (
        k.group_by("step", "layer").agg(pl.col("end").max().alias("end"))
        .join(start, on="step").join(ordinal, on="step")
        .select(pl.col("ordinal").cast(pl.Int64), "layer", ((pl.col("end") - pl.col("t0")) / 1e3).alias("finish_us"))
    )


def rank_skew(finishes: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """From each rank's `layer_finish`, in rank order."""
    if len(finishes) < 2:
        return pl.DataFrame(schema={"ordinal": pl.Int64, "layer": pl.Int64, "last_rank": pl.Int64,
                                    "skew_us": pl.Float64})
    frames = [finish.with_columns(pl.lit(i, pl.Int64).alias("rank")) for i, finish in enumerate(finishes)]
    both = pl.concat(frames)
    common = both.group_by("ordinal", "layer").agg(pl.len().alias("n")).filter(pl.col("n") == len(finishes))
    return (
        both.join(common.select("ordinal", "layer"), on=["ordinal", "layer"])
        .group_by("ordinal", "layer")
        .agg(pl.col("rank").sort_by("finish_us").last().alias("last_rank"),
             (pl.col("finish_us").max() - pl.col("finish_us").min()).alias("skew_us"))
        .sort("ordinal", "layer")
    )


def skew_summary(skew: pl.DataFrame) -> dict:
    if skew.is_empty():
        return {"median_us": None, "p90_us": None, "last_rank_counts": {}}
    counts = skew.group_by("last_rank").len().sort("last_rank")
    return {
        "median_us": float(skew["skew_us"].median()),
        "p90_us": float(skew["skew_us"].quantile(0.9)),
        "last_rank_counts": {str(r): int(n) for r, n in counts.iter_rows()},
    }


def all_reduce_exposure(ranks: Sequence[Analysis]) -> pl.DataFrame:
    """Per rank: all-reduce kernels per step, their busy and exposed time (median over
    stable steps). Zero where the all-reduces are placeholders without kernels."""
    rows = []
    for i, a in enumerate(ranks):
        ar = a.kernel_table.filter(pl.col("name").str.contains(ALL_REDUCE))
        rows.append({"rank": i, "report": a.report, "kernels_per_step": float(ar["calls_per_step"].sum()),
                     "busy_us": float(ar["busy_per_step_us"].sum()),
                     "exposed_us": float(ar["exposed_per_step_us"].sum())})
    return pl.DataFrame(rows)
