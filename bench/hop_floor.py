"""What one dependent launch costs on this GPU: chains of near-empty kernels, beside real ones.

    python3 bench/hop_floor.py [--hops 32] [--json OUT]

c69's step runs about 1,380 kernels on its critical path and sits 3.0 ms above its HBM floor,
about 2.2 us per path kernel (kernels/README.md, round fifteen). How much of that any kernel
pays just to follow another, and how much is our kernels' own work, decides what the campaign
can still win by fusing (fewer hops) against by trimming kernels (shorter hops). Each form
here is a CUDA graph of `--hops` launches of `hop_kernel`, each reading (or not) one value
per program that the launch before it wrote, and storing one; the time per hop is the
replay's time over the hops, the median over replays:

- grids of 1, 7 (the attention-residual pair at c69's chunk) and 132 programs (one per SM);
- plain launches (the graph's edge is a full dependency), PDL with the trigger after the
  store, and PDL with the trigger right after the wait (c69's pdl_early_trigger);
- the same chain of the K3 kernels that hop most on c69's path, as the step launches them
  (early triggers): the 1-row RMSNorm at 7,168 columns (the hidden's size), and the
  attention residuals' score -> combine at c69's chunk (two hops each, 8 bank rows);
- the other way to follow a producer: one launch that carries the whole chain
  (`chained_kernel`), its programs meeting at a grid-wide barrier on a counter in global
  memory between stages, each stage reading a value another program wrote in the stage
  before. That is the dependency a persistent layer kernel would pay instead of a launch
  (kernels/README.md, round seventeen: the campaign's next step if it is cheaper). Its
  figure is the marginal cost of a stage, (time of 2 x hops - time of hops) / hops, so the
  one launch drops out. Beside it the real pair both ways at the fused kernel's chunk (512
  columns, 14 programs): score -> combine launched, and attn_res_fused (score, barrier,
  combine in one launch).

Runs on a GPU only; CI never runs it (the kernel's chain is checked on a CPU under the Triton
interpreter, tests/kernels/test_hop_floor.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.k3.ops.common import (INTERPRET, early_trigger, grid_barrier, launch, pdl_off, pdl_trigger,  # noqa: E402
                                   pdl_wait, spin)

GRIDS = (1, 7, 132)
MODES = ("plain", "pdl", "pdl early")
#: The chained kernel's grids: one program per SM and two (all co-resident at 1 or 4 warps).
CHAINED_GRIDS = (1, 7, 132, 264)
CHAINED_WARPS = (1, 4)


@triton.jit
def hop_kernel(src, dst, READ: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # dst[p] = src[p] + 1 (READ) or p: one value per program, after the wait, as every K3
    # kernel orders its loads of its producer's output.
    p = tl.program_id(0)
    pdl_wait(USE_PDL)
    if READ:
        v = tl.load(src + p) + 1
    else:
        v = p
    tl.store(dst + p, v)
    spin(DELAY_NS)
    pdl_trigger(USE_PDL)


def hop_chain(bufs: tuple[torch.Tensor, torch.Tensor], hops: int, grid: int, read: bool) -> None:
    """`hops` launches of hop_kernel, each reading the buffer the one before it wrote."""
    for h in range(hops):
        src, dst = bufs[h % 2], bufs[(h + 1) % 2]
        launch(hop_kernel, (grid,), src, dst, READ=read, num_warps=1)


@triton.jit
def _stage(bufs, n, p, nprog, h):
    # Stage h: dst[p] = src[(p + 1) % nprog] + 1, src / dst the two halves of bufs in turn.
    # The neighbour's value makes the dependency cross programs, as a layer's does (a GEMM's
    # every column block feeds the norm after it). `.cg` reads L2: a line this SM cached two
    # stages ago would be stale.
    v = tl.load(bufs + (h % 2) * n + (p + 1) % nprog, cache_modifier=".cg") + 1
    tl.store(bufs + ((h + 1) % 2) * n + p, v)


@triton.jit
def chained_kernel(bufs, counter, n, HOPS: tl.constexpr, STAGE: tl.constexpr,
                   USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # HOPS dependent stages in one launch, a grid barrier after each. STAGE >= 0 (the
    # interpreter, which runs programs one at a time, so a spin barrier never releases):
    # that stage alone, the launch boundary standing in for the barrier.
    p = tl.program_id(0)
    nprog = tl.num_programs(0)
    pdl_wait(USE_PDL)
    if STAGE >= 0:
        _stage(bufs, n, p, nprog, STAGE)
    else:
        for h in range(HOPS):
            _stage(bufs, n, p, nprog, h)
            grid_barrier(counter)
    spin(DELAY_NS)
    pdl_trigger(USE_PDL)


def chained(bufs: torch.Tensor, counter: torch.Tensor, hops: int, grid: int, warps: int = 1) -> None:
    """`hops` stages of `_stage` over `grid` programs: one launch on a GPU, one per stage
    under the interpreter. bufs: int32 [2, n >= grid]; counter: int32 [1], zeroed once."""
    assert bufs.dim() == 2 and bufs.shape[0] == 2 and bufs.shape[1] >= grid and bufs.dtype == torch.int32
    n = bufs.shape[1]
    if INTERPRET:
        for h in range(hops):
            launch(chained_kernel, (grid,), bufs, counter, n, HOPS=hops, STAGE=h, num_warps=warps)
    else:
        launch(chained_kernel, (grid,), bufs, counter, n, HOPS=hops, STAGE=-1, num_warps=warps)


def chained_us(hops: int) -> dict[str, float]:
    """us per stage of the chained kernel: the marginal cost, one launch of 2 x hops against
    one of hops, so the launch itself drops out."""
    bufs = torch.zeros(2, max(CHAINED_GRIDS), device="cuda", dtype=torch.int32)
    counter = torch.zeros(1, device="cuda", dtype=torch.int32)
    res = {}
    for grid in CHAINED_GRIDS:
        for warps in CHAINED_WARPS:
            t = {h: per_replay_us(lambda h=h: chained(bufs, counter, h, grid, warps)) for h in (hops, 2 * hops)}
            res[f"{grid:3d} programs x {warps} warps, one launch, grid barrier per stage"] = \
                (t[2 * hops] - t[hops]) / hops
    return res


def _mode(mode: str):
    """The launch style of a form, as a context around its launches."""
    if mode == "plain":
        return pdl_off(True)
    return early_trigger(mode == "pdl early")


def per_replay_us(fn) -> float:
    """Median replay time of a graph of `fn()`'s launches (bench_k3_ops.py's timing, one call)."""
    from bench_k3_ops import per_call_us  # bench/ is the script's directory

    return per_call_us(lambda i: fn(), 1, replays=30)


def k3_chains(hops: int) -> dict[str, float]:
    """us per hop of the K3 latency-bound kernels, chained as the step launches them."""
    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops.norm import rmsnorm

    g = torch.Generator(device="cuda").manual_seed(5)
    H = 7168
    rows = [torch.randn(1, H, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)]
    gamma = torch.ones(H, device="cuda", dtype=torch.bfloat16)

    def norms():
        with early_trigger(True):
            for h in range(hops):
                rmsnorm(rows[h % 2], gamma, rows[(h + 1) % 2])

    bank = torch.randn(8, 1, H, device="cuda", dtype=torch.bfloat16, generator=g)
    query = torch.randn(H, device="cuda", dtype=torch.bfloat16, generator=g)
    scores = A.alloc_attn_res_scores(bank, block_h=A.WIDE_BLOCK_H)
    out = torch.empty(1, H, device="cuda", dtype=torch.bfloat16)

    def pairs():
        with early_trigger(True):
            for _ in range(hops // 2):
                A.attn_res_score(bank, 8, query, scores, gram_dot=True, block_h=A.WIDE_BLOCK_H)
                A.attn_res_combine(bank, 8, scores, gamma, out, one_shot=True, block_h=A.WIDE_BLOCK_H)

    counter = A.alloc_attn_res_counter("cuda")
    narrow = A.alloc_attn_res_scores(bank)

    def narrow_pairs():
        with early_trigger(True):
            for _ in range(hops // 2):
                A.attn_res_score(bank, 8, query, narrow)
                A.attn_res_combine(bank, 8, narrow, gamma, out)

    def fused():
        with early_trigger(True):
            for _ in range(hops // 2):
                A.attn_res_fused(bank, 8, query, narrow, gamma, out, counter=counter)

    pair_hops = hops // 2 * 2
    return {"rmsnorm, 1 x 7168 (pdl early)": per_replay_us(norms) / hops,
            "attn_res score -> combine, 1024-column chunks (pdl early)": per_replay_us(pairs) / pair_hops,
            "attn_res score -> combine, 512-column chunks (pdl early)": per_replay_us(narrow_pairs) / pair_hops,
            "attn_res_fused (score, barrier, combine), 512 columns, per half": per_replay_us(fused) / pair_hops}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hops", type=int, default=32)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("hop_floor.py needs a CUDA device", file=sys.stderr)
        return 2
    bufs = tuple(torch.zeros(max(GRIDS), device="cuda", dtype=torch.int32) for _ in range(2))
    res: dict[str, float] = {}
    for grid in GRIDS:
        for read in (False, True):
            for mode in MODES:
                def chain(grid=grid, read=read, mode=mode):
                    with _mode(mode):
                        hop_chain(bufs, args.hops, grid, read)
                key = f"{grid:3d} programs, {'reads its producer' if read else 'no read          '}, {mode}"
                res[key] = per_replay_us(chain) / args.hops
    res.update(chained_us(args.hops))
    res.update(k3_chains(args.hops))
    for k, v in res.items():
        print(f"    {k:72s} {v:6.2f} us per hop")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"hops": args.hops, "us_per_hop": res}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
