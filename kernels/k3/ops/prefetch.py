"""Variant prefetch_leg:<MB>: a side-stream kernel that asks L2 for the first MB of the next
GEMM's weight while the main stream runs latency-bound kernels (HBM otherwise idle).

The in-kernel form (variant prefetch:<MB>, common.l2_prefetch) cost more than it saved:
a grid is not complete, for its dependent's PDL wait, until its bulk prefetches land, and
one program of a latency-bound kernel issued them slowly. Here the prefetches ride in a
grid of their own on a third stream that nothing on the critical path waits for (the
stream joins main once, at the end of the step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.k3.ops.common import l2_prefetch, launch, pdl_trigger, pdl_wait, prefetch_args, spin

PROGRAMS = 32  # issuing programs: one warp each, beside whatever runs on the SMs


@triton.jit
def l2_prefetch_kernel(pf, pf_bytes, PF_CHUNKS: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    pdl_wait(USE_PDL)
    l2_prefetch(pf, pf_bytes, PF_CHUNKS)
    spin(DELAY_NS)
    pdl_trigger(USE_PDL)


def l2_prefetch_weight(weight: torch.Tensor, nbytes: int, *, delay_ns: int = 0) -> None:
    """Bulk-prefetch the first `nbytes` of `weight` (contiguous) into L2; changes no value.
    A no-op kernel under the interpreter (common.l2_prefetch compiles out there)."""
    launch(l2_prefetch_kernel, (PROGRAMS,), **prefetch_args(weight, nbytes, PROGRAMS, weight),
           num_warps=1, delay_ns=delay_ns)
