"""RMSNorm over the last dimension (q_a 1536, kv_a 512, latent 3584, hidden 7168).

One program per row with the whole row in registers: N <= 16384, so the tile stays
<= 16K fp32 and the row is read once. The input may be a row-strided view (kv_a's latent
part of the 576-wide kv_a output, a slice of the MoE front GEMM).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.k3.ops.common import launch, next_pow2, pdl_trigger, pdl_wait, spin, to_dtype

MAX_N = 16384


@triton.jit
def rmsnorm_kernel(x, weight, out, N, stride_x, stride_out, eps,
                   BLOCK_N: tl.constexpr, CLEAR: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)  # producer-independent
    pdl_wait(USE_PDL)
    v = tl.load(x + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(v * v, 0) / N + eps)
    tl.store(out + row.to(tl.int64) * stride_out + cols, to_dtype(v * rstd * w, out.dtype.element_ty),
             mask=mask)
    if CLEAR:  # variant moe_down_atomic: x is the next layer's accumulator again, zero
        tl.store(x + row.to(tl.int64) * stride_x + cols, tl.zeros([BLOCK_N], x.dtype.element_ty), mask=mask)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6, *,
            clear_input: bool = False, delay_ns: int = 0) -> torch.Tensor:
    """out[m] = x[m] / rms(x[m]) * weight (fp32 math, rounded once to out's dtype).
    clear_input: x is zeroed once read (moe_down_atomic's accumulator, for its next use)."""
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1 and out.shape == (M, N)
    assert weight.shape == (N,) and weight.is_contiguous() and N <= MAX_N
    BLOCK_N = next_pow2(N)
    launch(rmsnorm_kernel, (M,), x, weight, out, N, x.stride(0), out.stride(0), eps,
           BLOCK_N=BLOCK_N, CLEAR=clear_input, num_warps=8 if BLOCK_N >= 4096 else 4, delay_ns=delay_ns)
    return out
