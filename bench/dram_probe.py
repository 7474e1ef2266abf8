"""Known DRAM traffic for Nsight Systems' GPU metrics: reads and copies of known bytes, with
idle gaps between them, inside nsys's capture range.

    nsys profile -t cuda,nvtx --gpu-metrics-device=0 --gpu-metrics-frequency=200000 \
        --capture-range=cudaProfilerApi --capture-range-end=stop -o probe \
        python3 bench/dram_probe.py [--mb 256] [--reps 12] [--json OUT]

Each rep is a read (`sum` over a bf16 buffer: the buffer's bytes read, 4 bytes written) and a
copy (the buffer into another: its bytes read and as many written), each in an NVTX range
`read.<i>` / `copy.<i>`, each followed by a spin of `--gap-us` in which no kernel touches DRAM.
The sampled DRAM read throughput integrated over a kernel's span, at the peak the metric is a
percentage of, must come to the bytes it read; the gaps must read near zero; the sample
timestamps' side of their interval (start or end) shows as a shift of the edges. That is how
k3trace's reading of GPU metrics is checked on real samples (tests/test_dram.py), the expected
bytes coming from the buffer sizes, not from k3trace.

Runs on a GPU only; the JSON (`--json`) records the buffer bytes and the spin length.
"""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256, help="each buffer, MiB (well above the 60 MB L2)")
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--gap-us", type=float, default=40.0, help="idle spin after each kernel")
    p.add_argument("--json")
    args = p.parse_args(argv)
    n = args.mb * 2**20 // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    out = torch.empty((), dtype=torch.float32, device="cuda")
    cycles = int(args.gap_us * 1e3 * 1.98)  # the H200's SM clock under load, GHz: the gap need not be exact
    for _ in range(3):  # warm: the first launches pay module loading
        torch.sum(src, dim=0, dtype=torch.float32, out=out)
        dst.copy_(src)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for i in range(args.reps):
        torch.cuda.nvtx.range_push(f"read.{i}")
        torch.sum(src, dim=0, dtype=torch.float32, out=out)
        torch.cuda.nvtx.range_pop()
        torch.cuda._sleep(cycles)
        torch.cuda.nvtx.range_push(f"copy.{i}")
        dst.copy_(src)
        torch.cuda.nvtx.range_pop()
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    info = {"buffer_bytes": n * 2, "reps": args.reps, "gap_us": args.gap_us, "spin_cycles": cycles,
            "device": torch.cuda.get_device_name()}
    print(json.dumps(info))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f)


if __name__ == "__main__":
    main()
