"""What the critical-path walk's in-run wait rule (docs/metrics.md, "PDL": `pdl.max_tail_ns`)
costs: `critical_path.dependency_edges` with the rule on and off, side by side in one process,
alternating, on the stable kernels of a recording replicated step by step (default: the
bundled c72, 38 stable steps x 164 kernels, x 60 = about 370k kernels, a full-depth
recording's size). Prints each setting's median and the ratio; asserts nothing.

    python bench/bench_release_rules.py [--recording k3_bs1_c72] [--copies 60] [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import polars as pl

from k3trace.analyses import critical_path, pipeline
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.ingest import load_report


def stable_kernels(name: str) -> pl.DataFrame:
    """The frame `analyze` hands to `dependency_edges` (captured, not rebuilt)."""
    seen: list[pl.DataFrame] = []
    work = critical_path.dependency_edges

    def capture(kernels, cfg):
        seen.append(kernels)
        return work(kernels, cfg)

    critical_path.dependency_edges = capture
    try:
        pipeline.analyze(load_report(bundled_trace(name)), load_config())
    finally:
        critical_path.dependency_edges = work
    return seen[0]


def replicate(k: pl.DataFrame, copies: int) -> pl.DataFrame:
    """`copies` shifted copies: new steps, kernel ids and times after the last."""
    span = int(k["end"].max() - k["start"].min()) + 1
    steps = int(k["step"].max() - k["step"].min()) + 1
    ids = int(k["kernel_id"].max()) + 1
    parts = [k.with_columns(pl.col("step") + i * steps, pl.col("kernel_id") + i * ids,
                            *(pl.col(c) + i * span for c in ("start", "end", "launch_start")))
             for i in range(copies)]
    return pl.concat(parts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--recording", default="k3_bs1_c72")
    p.add_argument("--copies", type=int, default=60)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    kernels = replicate(stable_kernels(args.recording), args.copies)
    on = load_config()
    off = dataclasses.replace(on, pdl_max_tail_ns=0)
    times: dict[str, list[float]] = {"rule on": [], "rule off": []}
    for _ in range(args.repeat):
        for label, cfg in (("rule on", on), ("rule off", off)):
            start = time.perf_counter()
            critical_path.dependency_edges(kernels, cfg)
            times[label].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{kernels.height:,} kernels ({args.recording} x {args.copies}), dependency_edges, median of {args.repeat}:")
    for label, t in med.items():
        print(f"  {label}: {t:.3f} s")
    print(f"  ratio on / off: {med['rule on'] / med['rule off']:.2f}")


if __name__ == "__main__":
    main()
