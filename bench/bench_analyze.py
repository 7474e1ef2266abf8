"""Speed and memory of `analyze` on a large export and on 6x (optionally 24x) copies of it,
as ratios measured side by side in one run; and a check that the JSON equals that of the
code before the speed work (harness.BASELINE) on every export measured.

    python bench/bench_analyze.py LONG.sqlite [--repeat 3] [--scales 1,6] [--big] [--reference REV]

Each run is a fresh process (bench/child.py): its time is measured inside it, imports
excluded (bench_startup.py measures those), and its peak RSS by the kernel. Targets (issue
13): cold analyze (empty cache) within 2x the time Python's sqlite3 takes to fetch the
export's kernel rows at ~400k kernels and 1.5x at 2.3M; warm (cached) within 0.5x; peak
memory within 0.8 KiB per kernel at 2.3M, growing no more than linearly. The export: a
full-depth K3 decode at B=1 (kernels/scripts/h200_k3.sh `long`), not committed; the larger
ones are made from it in a temporary folder (harness.replicate): `--big` adds 24x (10M
kernels, about 1 GB of SQLite and 8 GB of memory).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from harness import BASELINE, kernel_count, reference_tree, replicate, run_child, same_json, temp_folder, waited_note


def measure(export: Path, repeat: int, work: Path, reference: Path | None) -> dict:
    mine_json, ref_json = work / "mine.json", work / "reference.json"
    warm_cache = work / "warm-cache"
    first = run_child(["analyze", str(export), "--cache-dir", str(warm_cache), "--json-out", str(mine_json)])
    out = {"kernels": kernel_count(export), "check": "not checked"}
    if reference is not None:
        ref = run_child(["analyze", str(export), "--json-out", str(ref_json)], pythonpath=reference)
        out.update(check=same_json(mine_json, ref_json), ref_s=ref.seconds, ref_rss=ref.peak_rss)
    fetch, cold, warm = [], [], [first]
    # Interleaved so that machine noise (another job on the 2 cores) hits all three alike.
    for i in range(repeat):
        fetch.append(run_child(["fetch", str(export)]))
        cache = work / f"cold-{i}"
        cold.append(run_child(["analyze", str(export), "--cache-dir", str(cache)]))
        shutil.rmtree(cache, ignore_errors=True)
        warm.append(run_child(["analyze", str(export), "--cache-dir", str(warm_cache)]))
    shutil.rmtree(warm_cache, ignore_errors=True)
    med = lambda runs, key: statistics.median(getattr(r, key) for r in runs)  # noqa: E731
    out.update(fetch_s=med(fetch, "seconds"), fetch_rss=med(fetch, "peak_rss"), cold_s=med(cold, "seconds"),
               cold_rss=max(r.peak_rss for r in cold), warm_s=med(warm[1:], "seconds"), note=waited_note(cold))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("export", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--scales", default="1,6", help="copies of the recording per export, comma-separated")
    p.add_argument("--big", action="store_true", help="also 24 copies (about 10M kernels)")
    p.add_argument("--reference", default=BASELINE, help="commit whose JSON must be matched ('none': skip)")
    args = p.parse_args()
    scales = [int(s) for s in args.scales.split(",")] + ([24] if args.big else [])
    work = temp_folder("k3bench-analyze-")
    try:
        reference = None if args.reference == "none" else reference_tree(args.reference, work / "reference")
        rows = []
        for scale in scales:
            export = args.export if scale == 1 else replicate(args.export, scale, work)
            row = measure(export, args.repeat, work, reference)
            rows.append((scale, row))
            if scale != 1:
                export.unlink()
            print_row(args.export.name, scale, row, args.repeat, args.reference)
        if len(rows) > 1:
            (_, a), (_, b) = rows[0], rows[-1]
            slope = (b["cold_rss"] - a["cold_rss"]) / (b["kernels"] - a["kernels"]) / 1024
            print(f"peak memory growth {scales[0]}x -> {scales[-1]}x: {slope:.2f} KiB per added kernel "
                  f"(time {a['cold_s'] / a['kernels'] * 1e6:.2f} -> {b['cold_s'] / b['kernels'] * 1e6:.2f} us per kernel)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_row(name: str, scale: int, r: dict, repeat: int, rev: str) -> None:
    target = 2.0 if r["kernels"] < 1_000_000 else 1.5
    kib = r["cold_rss"] / r["kernels"] / 1024
    print(f"{name} x{scale}: {r['kernels']:,} kernels; medians of {repeat}; JSON vs {rev}: {r['check']}")
    print(f"  cold: {r['note']}")
    print(f"  sqlite3 fetch of kernel rows : {r['fetch_s']:7.3f} s   peak {r['fetch_rss'] / 2**20:6.0f} MiB")
    print(f"  analyze, cold (empty cache)  : {r['cold_s']:7.3f} s   ratio {r['cold_s'] / r['fetch_s']:5.2f}  "
          f"(target <= {target})   peak {r['cold_rss'] / 2**20:6.0f} MiB = {kib:.2f} KiB/kernel (target <= 0.8)")
    print(f"  analyze, warm (cached)       : {r['warm_s']:7.3f} s   ratio {r['warm_s'] / r['fetch_s']:5.2f}  "
          "(target <= 0.5)")
    if "ref_s" in r:
        print(f"  before ({rev}), no cache  : {r['ref_s']:7.3f} s   ratio {r['ref_s'] / r['fetch_s']:5.2f}  "
              f"          peak {r['ref_rss'] / 2**20:6.0f} MiB")


if __name__ == "__main__":
    main()
