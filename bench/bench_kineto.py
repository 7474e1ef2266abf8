"""Ingest speed and peak memory of a large torch.profiler (Kineto) trace, as ratios measured
side by side in one run.

    python bench/bench_kineto.py [--size-gb 1.0] [--repeat 1] [--trace BIG.json]

Targets (issue 11): reading a 1 GB Kineto trace into the normalised frames within 1.5x the
time `orjson.loads` takes on the same bytes (already in memory), at a peak resident memory
of at most 2x the file size; and the Parquet cache as for nsys inputs (warm load). Without
`--trace`, the trace is made from the bundled H200 fixture (k3trace/data, Kineto's own
layout) by repeating its events with shifted timestamps and correlation ids until the size
is reached. Each measurement runs in its own process, so peak RSS is that step's own.
orjson is not a k3trace dependency: `pip install orjson` to run this.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "k3trace" / "data" / "hf_base_kineto.pt.trace.json.gz"
_TS = re.compile(rb'"ts": (\d+)\.(\d{3})')
_CORR = re.compile(rb'"correlation": (\d+)')

ORJSON = """
import orjson, resource, sys, time
data = open(sys.argv[1], "rb").read()
t = time.perf_counter(); doc = orjson.loads(data); dt = time.perf_counter() - t
print(dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, len(doc["traceEvents"]))
"""
INGEST = """
import resource, sys, time
from pathlib import Path
from k3trace.ingest import kineto
t = time.perf_counter(); frames, _, _ = kineto.load(Path(sys.argv[1])); dt = time.perf_counter() - t
print(dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, frames["kernels"].height)
"""
BASELINE = """
import resource
import polars, numpy
from k3trace.ingest import kineto
print(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, 0)
"""
CACHED = """
import sys, time
from pathlib import Path
from k3trace.ingest import load_report
t = time.perf_counter(); load_report(Path(sys.argv[1]), cache_dir=Path(sys.argv[2])); dt = time.perf_counter() - t
print(dt, 0, 0)
"""


def synthesize(out: Path, size: int) -> None:
    """Kineto-layout trace of about `size` bytes: the fixture's events, repeated, shifted."""
    text = gzip.decompress(FIXTURE.read_bytes())
    start = text.index(b'"traceEvents": [') + len(b'"traceEvents": [')
    stop = text.rindex(b"]")
    head, body, tail = text[:start], text[start:stop].rstrip(), text[stop:]
    stamps = [int(a) for a, _ in _TS.findall(body)]
    shift_us = max(stamps) - min(stamps) + 1000
    shift_corr = max(int(c) for c in _CORR.findall(body)) + 1
    with open(out, "wb") as fh:
        fh.write(head)
        copy, written = 0, len(head)
        while written < size:
            if copy:
                fh.write(b",")
            chunk = _TS.sub(lambda m: b'"ts": %d.%s' % (int(m[1]) + copy * shift_us, m[2]), body)
            chunk = _CORR.sub(lambda m: b'"correlation": %d' % (int(m[1]) + copy * shift_corr), chunk)
            fh.write(chunk)
            written += len(chunk) + 1
            copy += 1
        fh.write(tail)


def measure(code: str, *args: str) -> tuple[float, int, int]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, check=True)
    seconds, rss, count = done.stdout.split()
    return float(seconds), int(rss), int(count)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--trace", type=Path, help="an existing Kineto trace (plain JSON) instead of a synthetic one")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="k3bench-kineto-"))
    trace = args.trace or work / "big.pt.trace.json"
    if args.trace is None:
        synthesize(trace, int(args.size_gb * 1e9))
    size = trace.stat().st_size
    base = measure(BASELINE)[1]
    ours, theirs = [], []
    for _ in range(args.repeat):
        ours.append(measure(INGEST, str(trace)))
        theirs.append(measure(ORJSON, str(trace)))
    ingest_s = statistics.median(r[0] for r in ours)
    orjson_s = statistics.median(r[0] for r in theirs)
    peak = max(r[1] for r in ours)
    cold = measure(CACHED, str(trace), str(work / "cache"))[0]
    warm = measure(CACHED, str(trace), str(work / "cache"))[0]
    print(json.dumps({"trace_bytes": size, "kernels": ours[0][2], "events": theirs[0][2]}))
    print(f"ingest (path -> frames)        {ingest_s:8.2f} s")
    print(f"orjson.loads (bytes in memory)  {orjson_s:8.2f} s")
    print(f"ratio ingest / orjson           {ingest_s / orjson_s:8.2f}   (goal <= 1.5)")
    print(f"peak RSS ingest                 {peak / 1e9:8.2f} GB = {peak / size:.2f}x the file "
          f"(goal <= 2; {base / 1e9:.2f} GB of it is the interpreter, polars and numpy)")
    print(f"peak RSS orjson                 {max(r[1] for r in theirs) / 1e9:8.2f} GB = "
          f"{max(r[1] for r in theirs) / size:.2f}x the file")
    print(f"load_report cold (writes cache) {cold:8.2f} s; warm (Parquet cache) {warm:8.2f} s = "
          f"{warm / ingest_s:.2f}x the cold ingest")


if __name__ == "__main__":
    main()
