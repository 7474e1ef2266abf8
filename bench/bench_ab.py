"""A/B of cold `analyze` between a revision and the working tree, for judging one change on
a shared, noisy machine: each round runs the sqlite3 fetch, then both sides in alternating
order (so that load from another job falls on both alike), every run a fresh process with
an empty cache (bench/child.py). Prints per side the median, minimum and every run.

    python bench/bench_ab.py EXPORT [--against REV] [--repeat 8]

A change worth keeping shows in the medians over several rounds, and again in a second
invocation: on this 2-core machine one run's noise is about +-10%.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from harness import reference_tree, run_child, temp_folder, waited_note


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("export", type=Path)
    p.add_argument("--against", default="HEAD", help="revision to compare the working tree with")
    p.add_argument("--repeat", type=int, default=8)
    args = p.parse_args()
    work = temp_folder("k3bench-ab-")
    try:
        sides = {args.against: reference_tree(args.against, work / "reference"), "working tree": None}
        runs: dict[str, list[float]] = {"sqlite3 fetch": [], **{name: [] for name in sides}}
        children = {name: [] for name in sides}
        for i in range(args.repeat):
            runs["sqlite3 fetch"].append(run_child(["fetch", str(args.export)]).seconds)
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for name in order:
                cache = work / f"cache-{i}"
                done = run_child(["analyze", str(args.export), "--cache-dir", str(cache)], pythonpath=sides[name])
                runs[name].append(done.seconds)
                children[name].append(done)
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    floor = statistics.median(runs["sqlite3 fetch"])
    for name, done in children.items():
        print(f"{name}: {waited_note(done)}")
    for name, seconds in runs.items():
        med = statistics.median(seconds)
        print(f"{name:>14}: median {med:6.3f} s (ratio {med / floor:4.2f})  min {min(seconds):6.3f} s  "
              f"runs {' '.join(f'{s:.2f}' for s in seconds)}")


if __name__ == "__main__":
    main()
