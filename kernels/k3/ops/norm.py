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
def rmsnorm_kernel(x, weight, out, N, stride_x, stride_out, eps, rows, tail, stride_tail, TAIL_N,
                   BLOCK_N: tl.constexpr, CLEAR: tl.constexpr, SCATTER: tl.constexpr, BLOCK_T: tl.constexpr,
                   USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)  # producer-independent
    out_row = out + row.to(tl.int64) * stride_out
    if SCATTER:
        # Variant mla_kv_norm_insert: out is the MLA cache's rows; x's row m goes to row
        # rows[m] (the slot mapping, a step input: before the wait), the tail row after it.
        slot = tl.load(rows + row).to(tl.int64)
        mask = mask & (slot >= 0)  # slot < 0: a padded batch entry (CUDA-graph padding)
        out_row = out + slot * stride_out
    pdl_wait(USE_PDL)
    v = tl.load(x + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(v * v, 0) / N + eps)
    tl.store(out_row + cols, to_dtype(v * rstd * w, out.dtype.element_ty), mask=mask)
    if SCATTER:  # the rope part, a copy: what mla_cache_insert stored after the latent
        ts = tl.arange(0, BLOCK_T)
        tm = (ts < TAIL_N) & (slot >= 0)
        tl.store(out_row + N + ts, tl.load(tail + row.to(tl.int64) * stride_tail + ts, mask=tm, other=0.0),
                 mask=tm)
    if CLEAR:  # variant moe_down_atomic: x is the next layer's accumulator again, zero
        tl.store(x + row.to(tl.int64) * stride_x + cols, tl.zeros([BLOCK_N], x.dtype.element_ty), mask=mask)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6, *,
            clear_input: bool = False, rows: torch.Tensor | None = None, tail: torch.Tensor | None = None,
            delay_ns: int = 0) -> torch.Tensor:
    """out[m] = x[m] / rms(x[m]) * weight (fp32 math, rounded once to out's dtype).
    clear_input: x is zeroed once read (moe_down_atomic's accumulator, for its next use).
    rows, tail (variant mla_kv_norm_insert): out is a table of rows [S, N + T]; row m of the
    result goes to out[rows[m], :N] and tail[m] ([M, T], a copy) to out[rows[m], N:], skipped
    where rows[m] < 0."""
    M, N = x.shape
    scatter = rows is not None
    assert x.stride(1) == 1 and out.stride(1) == 1
    assert weight.shape == (N,) and weight.is_contiguous() and N <= MAX_N
    if scatter:
        assert tail is not None and tail.shape[0] == M and tail.stride(1) == 1 and rows.shape == (M,)
        assert out.shape[1] == N + tail.shape[1]
    else:
        assert tail is None and out.shape == (M, N)
    T = tail.shape[1] if scatter else 0
    BLOCK_N = next_pow2(N)
    launch(rmsnorm_kernel, (M,), x, weight, out, N, x.stride(0), out.stride(0), eps,
           rows if scatter else out, tail if scatter else out, tail.stride(0) if scatter else 0, T,
           BLOCK_N=BLOCK_N, CLEAR=clear_input, SCATTER=scatter, BLOCK_T=next_pow2(max(T, 1)),
           num_warps=8 if BLOCK_N >= 4096 else 4, delay_ns=delay_ns)
    return out
