"""Speed of `analyze` on a large export, as ratios measured side by side in one run.

    python bench/bench_analyze.py LONG.sqlite [--repeat 3]

Targets (issue: analyze): cold analyze (empty cache) within 2x the time Python's sqlite3
takes to fetch the export's kernel rows; warm (cached) within 0.5x. Make the export on the
H200 with the small workload over a few thousand steps (kernels/scripts/h200_small.sh,
`small_long`: 2900 replays x 124 kernels = 360k kernels), then `k3trace scrub` it.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from k3trace.analyses import analyze_report
from k3trace.config import load_config

KERNEL_QUERY = ("SELECT start, end, streamId, shortName, correlationId, graphNodeId, deviceId, globalPid "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL")


def sqlite3_fetch(path: Path) -> float:
    t = time.perf_counter()
    con = sqlite3.connect(path)
    rows = con.execute(KERNEL_QUERY).fetchall()
    con.close()
    assert rows
    return time.perf_counter() - t


def cold(path: Path) -> float:
    folder = Path(tempfile.mkdtemp(prefix="k3bench-"))
    try:
        t = time.perf_counter()
        analyze_report(path, load_config(), cache_dir=folder)
        return time.perf_counter() - t
    finally:
        shutil.rmtree(folder)


def warm(path: Path, folder: Path) -> float:
    t = time.perf_counter()
    analyze_report(path, load_config(), cache_dir=folder)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("export", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with sqlite3.connect(args.export) as con:
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    cache = Path(tempfile.mkdtemp(prefix="k3bench-warm-"))
    try:
        warm(args.export, cache)  # fill the cache
        # Interleave the three measurements so machine noise hits them alike.
        base, c, w = [], [], []
        for _ in range(args.repeat):
            base.append(sqlite3_fetch(args.export))
            c.append(cold(args.export))
            w.append(warm(args.export, cache))
    finally:
        shutil.rmtree(cache)
    b, cm, wm = (statistics.median(x) for x in (base, c, w))
    print(f"export: {args.export.name}, {kernels:,} kernels; medians of {args.repeat}")
    print(f"sqlite3 fetch of kernel rows : {b:7.3f} s")
    print(f"analyze, cold (no cache)     : {cm:7.3f} s   ratio {cm / b:5.2f}  (target <= 2.0)")
    print(f"analyze, warm (cached)       : {wm:7.3f} s   ratio {wm / b:5.2f}  (target <= 0.5)")


if __name__ == "__main__":
    main()
