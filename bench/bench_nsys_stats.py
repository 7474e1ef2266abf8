"""`k3trace analyze` against Nsight Systems' own per-kernel summary on the same export, as a
user waits for them: `k3trace analyze EXPORT --json` (empty cache) and `nsys stats --report
cuda_gpu_kern_sum EXPORT`, each a whole process from start to exit, alternating, medians.

    python bench/bench_nsys_stats.py EXPORT [--copies 6] [--repeat 3] [--nsys PATH]

`nsys stats` on an SQLite export runs its report's SQL (one GROUP BY over the kernel table:
per-kernel totals only) and prints a table; analyze computes everything it reports (steps,
labels, two-stream residency, the critical path, ...). Target (issue 13): analyze faster
than that summary on a 2.3M-kernel export (--copies 6 of a full-depth recording, made in a
temporary folder by harness.replicate). nsys: --nsys, else $K3TRACE_NSYS, else on PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import kernel_count, replicate, temp_folder, wait_for_entries


def timed(cmd: list[str], **kw) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, **kw)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("export", type=Path)
    p.add_argument("--copies", type=int, default=6)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--nsys", default=os.environ.get("K3TRACE_NSYS") or shutil.which("nsys"))
    args = p.parse_args()
    if not args.nsys:
        sys.exit("bench_nsys_stats: no nsys (pass --nsys PATH or set K3TRACE_NSYS)")
    work = temp_folder("k3bench-nsys-stats-")
    try:
        export = args.export.resolve() if args.copies == 1 else replicate(args.export.resolve(), args.copies, work)
        # The cache's wait variable unset: analyze returns with its answer, as a user sees it.
        env = {k: v for k, v in os.environ.items() if k != "K3TRACE_CACHE_WAIT"}
        ours, theirs = [], []
        for i in range(args.repeat):
            order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
            for side in order:
                if side == "ours":
                    cache = work / f"cache-{i}"
                    ours.append(timed([sys.executable, "-m", "k3trace.cli", "analyze", str(export), "--json",
                                       "--cache-dir", str(cache)], env=env, cwd=work))
                    # Its detached cache writer finishes outside the timing, before the next run.
                    wait_for_entries(cache)
                    shutil.rmtree(cache, ignore_errors=True)
                else:
                    out = work / f"stats-{i}"
                    theirs.append(timed([args.nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv",
                                         "--output", str(out), str(export)], cwd=work))
        kernels = kernel_count(export)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{args.export.name} x{args.copies}: {kernels:,} kernels; whole processes, alternating, medians of "
          f"{args.repeat}")
    print(f"k3trace analyze --json, empty cache : {a:7.3f} s  (runs {' '.join(f'{s:.2f}' for s in ours)})")
    print(f"nsys stats cuda_gpu_kern_sum        : {b:7.3f} s  (runs {' '.join(f'{s:.2f}' for s in theirs)})")
    print(f"ratio analyze / nsys stats          : {a / b:7.2f}  (target < 1)")


if __name__ == "__main__":
    main()
