"""Whole commands, as a user waits for them: `k3trace analyze EXPORT --json` with an empty
cache, from the process's start to its exit (imports, the analysis, printing the answer and
the interpreter's exit all included), the working tree against a revision, alternating,
each run a fresh process; and a check that both print the same JSON (as parsed: the order
of a map's keys may differ from run to run).

    python bench/bench_command.py EXPORT [--against REV] [--repeat 8]

The other bench scripts time the work inside the process (imports excluded, bench/child.py)
and ratio it to the sqlite3 fetch; this one adds what they leave out. Where the code hands
its cache entries to a detached writer, the next run starts only once that writer is done
(waited for outside the timing), so that it never shares the cores with a measured run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, reference_tree, temp_folder, wait_for_entries


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("export", type=Path)
    p.add_argument("--against", default="main", help="revision to compare the working tree with")
    p.add_argument("--repeat", type=int, default=8)
    args = p.parse_args()
    work = temp_folder("k3bench-command-")
    try:
        sides = {args.against: reference_tree(args.against, work / "reference"), "working tree": ROOT}
        runs: dict[str, list[float]] = {name: [] for name in sides}
        waits: dict[str, list[float]] = {name: [] for name in sides}
        outputs: dict[str, bytes] = {}
        for i in range(args.repeat):
            for name in list(sides) if i % 2 == 0 else list(sides)[::-1]:
                env = {k: v for k, v in os.environ.items() if k != "K3TRACE_CACHE_WAIT"}
                env["PYTHONPATH"] = str(sides[name])
                cache = work / f"cache-{i}-{len(outputs)}"
                start = time.perf_counter()
                # Run from the work folder: `python -m` puts the current folder first on the
                # path, which would shadow PYTHONPATH's tree from a checkout.
                done = subprocess.run([sys.executable, "-m", "k3trace.cli", "analyze", str(args.export.resolve()),
                                       "--json", "--cache-dir", str(cache)], capture_output=True, env=env, check=True,
                                      cwd=work)
                runs[name].append(time.perf_counter() - start)
                outputs.setdefault(name, done.stdout)
                waits[name].append(wait_for_entries(cache))
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a, b = list(sides)
    same = "identical" if json.loads(outputs[a]) == json.loads(outputs[b]) else "DIFFERENT"
    print(f"k3trace analyze {args.export.name} --json, empty cache, whole process; medians of {args.repeat}; "
          f"output {same}")
    for name, seconds in runs.items():
        print(f"{name:>14}: median {statistics.median(seconds):6.3f} s  min {min(seconds):6.3f} s  "
              f"runs {' '.join(f'{s:.2f}' for s in seconds)}  (then its cache entries: "
              f"median {statistics.median(waits[name]):.2f} s more, untimed)")
    paired = [y - x for x, y in zip(runs[a], runs[b])]
    print(f"paired difference (working tree - {a}): median {statistics.median(paired):+.3f} s")


if __name__ == "__main__":
    main()
