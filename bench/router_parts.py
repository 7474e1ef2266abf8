"""Where the single-pass router's time goes: its marginal cost a call, alone, by part.

    python3 bench/router_parts.py [--hops 32] [--json OUT]

The router with the align (one program, the top-16 of 896; c72 runs it on S2 beside the MoE
front) took 6.2 us a call in a PDL chain on an H100 where the 1-row RMSNorm took 1.4 and the
bare hop 0.7 (round twenty-three, bench/loaded_hop.py); four picks a selection round
(router_top4) took 5.8. This splits the rest: top-1 against top-4 and top-16 (the rounds),
with and without the align, one and four picks a round, at 1 to 8 warps (the cross-warp
exchange each round pays); and the selection as one bitonic top-k network (router_bitonic). Each figure is loaded_hop's marginal us of a call (span of 2 x hops
minus span of hops, over hops; median of graph replays), launched as the step launches it
(PDL, early triggers).

Runs on a GPU only; the forms it times are the ones tests/kernels/test_k3_ops.py checks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.k3.ops.common import early_trigger, launch, next_pow2
from kernels.k3.ops.moe import moe_router_kernel

E = 896


def router_chain(k: int, align: bool, by4: bool, warps: int, sort: bool = False):
    """fn(n): n router calls on the same logits, as moe_router launches them, at `warps`."""
    g = torch.Generator(device="cuda").manual_seed(7)
    logits = torch.randn(1, E, device="cuda", dtype=torch.float32, generator=g)
    bias = torch.zeros(E, device="cuda", dtype=torch.float32)
    ids = torch.empty(1, k, device="cuda", dtype=torch.int32)
    weights = torch.empty(1, k, device="cuda", dtype=torch.float32)
    seg = tuple(torch.empty(n, device="cuda", dtype=torch.int32) for n in (k, k, k + 1, 1))

    def chain(n):
        with early_trigger(True):
            for _ in range(n):
                launch(moe_router_kernel, (1,), logits, bias, ids, weights, E, logits.stride(0), 1.0, *seg,
                       K=k, KP=next_pow2(k), BLOCK_E=next_pow2(E), ALIGN=align, BY4=by4,
                       SORTED=sort, num_warps=warps)
    return chain


FORMS = {  # name -> (top k, align, four a round, warps[, one bitonic network])
    "top-16 + align, 4 warps (c72)": (16, True, False, 4),
    "top-16 + align, 4 warps, four a round (c88)": (16, True, True, 4),
    "top-16, no align, 4 warps": (16, False, False, 4),
    "top-4, no align, 4 warps": (4, False, False, 4),
    "top-1, no align, 4 warps": (1, False, False, 4),
    "top-16 + align, 1 warp": (16, True, False, 1),
    "top-16 + align, 2 warps": (16, True, False, 2),
    "top-16 + align, 8 warps": (16, True, False, 8),
    "top-16 + align, 2 warps, four a round": (16, True, True, 2),
    "top-16 + align, 8 warps, four a round": (16, True, True, 8),
    "top-16 + align, 4 warps, bitonic (router_bitonic)": (16, True, False, 4, True),
    "top-16, no align, 4 warps, bitonic": (16, False, False, 4, True),
    "top-16 + align, 2 warps, bitonic": (16, True, False, 2, True),
    "top-16 + align, 8 warps, bitonic": (16, True, False, 8, True),
}


def main() -> int:
    from loaded_hop import marginal_us, probe_args  # bench/ is the script's directory

    args = probe_args("router_parts.py")
    if args is None:
        return 2
    res = {name: marginal_us(router_chain(*form), args.hops, None, args.replays)[0] for name, form in FORMS.items()}
    for name, us in res.items():
        print(f"    {name:48s} {us:6.2f} us a call")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"hops": args.hops, "us_per_call": res}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
