"""When a short chain actually runs beside a streaming read: its stamps against the stream's.

    python3 bench/loaded_order.py

bench/loaded_hop.py counts a replay as loaded only when the stream started before the chain and
ended after it. On the H100 (round twenty-two, kernels/README.md) its 7-program hop chain never
was beside a stream of one program or more per SM, while the 1-row RMSNorm chain always was.
This prints, for one replay of each (chain, stream width), when the chain started and ended and
when the stream ended, in us after the stream's first program started; a chain that ends with
the stream waited for it. The hop kernel runs at 1 warp (as bench/hop_floor.py launches it) and
at 4, the norm as the step launches it.

Runs on a GPU only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hop_floor
import loaded_hop as L

from kernels.k3.ops.common import early_trigger, launch
from kernels.k3.ops.norm import rmsnorm

HOPS = 32


def stamps_of(chain, programs: int, big: torch.Tensor, sums: torch.Tensor) -> list[float]:
    """[chain start, chain end, stream end] in us after the stream's start, one graph replay
    (the third; the first two warm it)."""
    n = big.numel() // (programs * L.STREAM_BLOCK) * programs * L.STREAM_BLOCK
    def load(started):
        L.stream(big[:n], programs, sums, started=started)

    graph, stamps = L.loaded_graph(chain, HOPS, load)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
    s = stamps.tolist()
    return [(s[i] - s[3]) / 1e3 for i in range(3)]


def main() -> int:
    if not torch.cuda.is_available():
        print("loaded_order.py needs a CUDA device", file=sys.stderr)
        return 2
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    big = torch.ones(L.HBM_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    sums = torch.zeros(L.STREAM_PER_SM * sm, device="cuda", dtype=torch.float32)
    bufs = tuple(torch.zeros(7, device="cuda", dtype=torch.int32) for _ in range(2))
    rows = [torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    gamma = torch.ones(7168, device="cuda", dtype=torch.bfloat16)

    def hop(warps):
        def chain(n):
            with early_trigger(True):
                for h in range(n):
                    launch(hop_floor.hop_kernel, (7,), bufs[h % 2], bufs[(h + 1) % 2], READ=True,
                           num_warps=warps)
        return chain

    def norm(n):
        with early_trigger(True):
            for h in range(n):
                rmsnorm(rows[h % 2], gamma, rows[(h + 1) % 2])

    for programs in (sm // 2, sm, L.STREAM_PER_SM * sm):
        for name, chain in (("hop, 1 warp", hop(1)), ("hop, 4 warps", hop(4)), ("rmsnorm", norm)):
            start, end, stream_end = stamps_of(chain, programs, big, sums)
            print(f"    {name:14s} stream {programs:4d} programs: chain {start:7.1f} -> {end:7.1f} us,"
                  f" stream ends {stream_end:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
