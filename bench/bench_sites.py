"""What the kernel table's call sites cost (`kernels.site_spread`: each kernel's call-site
medians, their lowest and highest) against the table's existing per-kernel aggregation
(`kernels._by_call`), side by side in one process, alternating, on a frame of a full-depth
recording's size: a step of 2,460 launches x 175 stable steps (about 430k kernels), durations
drawn at random (the aggregation's cost depends on the row count, not on the values). Prints
each one's best time and the ratio; asserts nothing.

    python bench/bench_sites.py [--steps 175] [--launches 2460] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl

from k3trace.analyses.kernels import _by_call, site_spread


def frame(steps: int, launches: int) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rank = np.arange(launches)
    n = steps * launches
    return pl.DataFrame({
        "step": np.repeat(np.arange(steps), launches), "launch_rank": np.tile(rank, steps),
        "name": np.tile(np.array([f"kernel_{i % 40}" for i in rank]), steps),
        "family": np.tile(np.array(["moe", "kda", "mla"])[rank % 3], steps),
        "duration": rng.integers(500, 30_000, n), "exposed": rng.integers(0, 500, n)})


def best_ms(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=175)
    p.add_argument("--launches", type=int, default=2460)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    k = frame(args.steps, args.launches)
    for round_ in (1, 2):  # alternating, so that a machine's drift shows as two different ratios
        table = best_ms(lambda: _by_call(k, args.steps), args.repeat)
        sites = best_ms(lambda: site_spread(k), args.repeat)
        print(f"round {round_}, {k.height:,} kernels: kernel table {table:.1f} ms, call sites {sites:.1f} ms, "
              f"ratio {sites / table:.2f}")


if __name__ == "__main__":
    main()
