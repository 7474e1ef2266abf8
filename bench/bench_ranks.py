"""Several ranks: `analyze` of N rank reports (a process pool, one report per worker)
against N cold analyses of one report spread over the machine's cores, measured side by
side in one run.

    python bench/bench_ranks.py EXPORT [--copies 8] [--repeat 2]

The N reports are copies of one export (in a temporary folder: each is its own cache
entry). Target (issue 13): wall time within 1.3 x (N x one analyze / cores). Measured two
ways, each run a fresh process with empty caches:
- the work inside the process (bench/child.py), imports excluded, as the other benches;
- whole commands, as the issue measured and as a user waits for them: `k3trace analyze
  REPORT --json` against `k3trace analyze REPORT... --json`, from the process's start to its
  exit; the cache entries' writers are waited for after each run, untimed.
On a machine of few cores the first ratio is about one analysis' own speed-up from its
cores: the ranks' workers keep to their share, so N analyses take N x one analysis' CPU
time / cores. The second also counts each command's start-up, which the ranks pay once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from pathlib import Path

from harness import run_child, run_command, temp_folder


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("export", type=Path)
    p.add_argument("--copies", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    cores = os.cpu_count() or 1
    work = temp_folder("k3bench-ranks-")
    try:
        reports = []
        for i in range(args.copies):
            reports.append(work / f"rank{i}{args.export.suffix}")
            shutil.copyfile(args.export, reports[-1])
        one, ranks, one_cmd, ranks_cmd = [], [], [], []
        for i in range(args.repeat):  # interleaved: noise hits both alike
            one.append(run_child(["analyze", str(reports[0]), "--cache-dir", str(work / f"one{i}")]).seconds)
            ranks.append(run_child(["ranks", *map(str, reports), "--cache-dir", str(work / f"ranks{i}")]).seconds)
            one_cmd.append(run_command(["analyze", str(reports[0])], work / f"one-command{i}"))
            ranks_cmd.append(run_command(["analyze", *map(str, reports)], work / f"ranks-command{i}",
                                         analyses=len(reports)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.copies} copies of {args.export.name} on {cores} cores; medians of {args.repeat}")
    for how, a, r in (("inside the process, imports excluded", statistics.median(one), statistics.median(ranks)),
                      ("whole commands, start to exit", statistics.median(one_cmd), statistics.median(ranks_cmd))):
        ideal = args.copies * a / cores
        print(f"{how}:")
        print(f"  analyze, cold (one report)       : {a:7.3f} s")
        print(f"  analyze of {args.copies} rank reports, cold : {r:7.3f} s   ratio {r / ideal:5.2f} of {args.copies} x one / "
              f"{cores} cores = {ideal:.3f} s  (target <= 1.3)")
        if cores > args.copies:  # one report per worker: no more workers than reports
            print(f"{'':38s}  ratio {r / a:5.2f} of {args.copies} x one / {args.copies} workers = {a:.3f} s")


if __name__ == "__main__":
    main()
