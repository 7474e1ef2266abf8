"""What reading nsys's DRAM metrics costs `analyze`: the same export with and without its
GPU_METRICS rows, cold (empty cache) and warm, side by side in one run.

    python bench/bench_dram.py REPORT.sqlite [--repeat 3]

REPORT: a recording with `--gpu-metrics` (kernels/scripts/h200_k3.sh `dram_metrics`: c72 at
full depth, 20 steps, about 2 million metric rows of which 10% are DRAM's; not committed).
The copy without metrics is made in a temporary folder (the GPU-metrics tables dropped, the
rest byte for byte). Each run is a fresh process (bench/child.py), its time measured inside
it; printed: medians and the ratio with / without, cold and warm, and each one's peak RSS.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
from pathlib import Path

from harness import run_child, temp_folder


def without_metrics(export: Path, into: Path) -> Path:
    out = into / "no_metrics.sqlite"
    shutil.copyfile(export, out)
    with sqlite3.connect(out) as con:
        for table in ("GPU_METRICS", "TARGET_INFO_GPU_METRICS"):
            con.execute(f"DROP TABLE IF EXISTS {table}")
    con = sqlite3.connect(out)
    con.execute("VACUUM")
    con.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    work = temp_folder("k3trace-bench-dram-")
    try:
        plain = without_metrics(args.report, work)
        runs: dict[tuple[str, str], list] = {}
        for i in range(args.repeat):  # interleaved: the machine's noise falls on both alike
            for name, export in (("with", args.report), ("without", plain)):
                cache = work / f"cache-{name}-{i}"
                runs.setdefault((name, "cold"), []).append(run_child(["analyze", str(export), "--cache-dir", str(cache)]))
                runs.setdefault((name, "warm"), []).append(run_child(["analyze", str(export), "--cache-dir", str(cache)]))
        for mode in ("cold", "warm"):
            t = {n: statistics.median(r.seconds for r in runs[(n, mode)]) for n in ("with", "without")}
            rss = {n: max(r.peak_rss for r in runs[(n, mode)]) / 2**20 for n in ("with", "without")}
            print(f"{mode}: with metrics {t['with']:.2f} s, without {t['without']:.2f} s, ratio "
                  f"{t['with'] / t['without']:.2f}; peak RSS {rss['with']:.0f} / {rss['without']:.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
