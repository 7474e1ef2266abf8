"""Speed of `diff` on two large exports against one cold analyze, measured side by side.

    python bench/bench_diff.py OLD.sqlite NEW.sqlite [--repeat 3]

Target (issue 9): diff of two 430k-kernel full-depth exports within 2x one cold analyze, Shapley sampling included. The
exports: full-depth K3 decode at B=1, ~175 steps each (kernels/scripts/h200_k3.sh `long`:
k3_full_bs1_base and k3_full_bs1_mla_split, 431k kernels each), not committed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from k3trace.analyses import analyze_report
from k3trace.cli import Environment, analyses_of
from k3trace.config import load_config
from k3trace.ingest import Tools
from k3trace.diff import diff


def timed(fn) -> float:
    folder = Path(tempfile.mkdtemp(prefix="k3bench-"))
    try:
        t = time.perf_counter()
        fn(folder)
        return time.perf_counter() - t
    finally:
        shutil.rmtree(folder)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    cfg = load_config()
    analyze_s, diff_s, replay_s = [], [], []
    for _ in range(args.repeat):
        analyze_s.append(timed(lambda d: analyze_report(args.old, cfg, cache_dir=d)))

        def full(d: Path) -> None:
            env = Environment(cache_dir=d, tools=Tools())
            old, new = analyses_of((args.old, args.new), cfg, env)  # what `k3trace diff` runs
            t = time.perf_counter()
            result = diff([old], [new])
            replay_s.append(time.perf_counter() - t)
            assert result.verdict

        diff_s.append(timed(full))
    a, d, r = (statistics.median(x) for x in (analyze_s, diff_s, replay_s))
    print(f"old: {args.old.name}, new: {args.new.name}; medians of {args.repeat}")
    print(f"analyze, cold (one export)        : {a:7.3f} s")
    print(f"diff, cold (both exports)         : {d:7.3f} s   ratio {d / a:5.2f}  (target <= 2.0)")
    print(f"  of which matching + attribution : {r:7.3f} s")


if __name__ == "__main__":
    main()
