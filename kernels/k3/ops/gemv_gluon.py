"""Variant linear_gluon (B = 1): the skinny GEMM as a Gluon kernel that owns its pipeline.

out[0, N] = x[0, K] @ w[K, N], w row-major (torch.mm's layout; a column slice is fine). One
program per BLOCK_N columns streams its whole K through a ring of STAGES shared-memory
slots, each filled by one TMA copy and tracked by its own mbarrier.

What the Triton kernel (`gemv.skinny_mm_kernel`) cannot do: issue its weight copies before
its PDL wait. Triton's software pipeliner puts its prologue after every statement before the
loop, so the copies start only once the producer has completed; here the first EARLY slots
are requested before `griddepcontrol.wait` (the weights are no kernel's output), while the
latency-bound kernels before the GEMM still run and HBM would idle. linear_early_weights
(one block into registers) and the L2 prefetches (bulk and per line) tried the same from
Triton and lost (kernels/README.md, rounds 3 and 8); none of them had the slots of the
GEMM's own pipeline full at the wait.

No MMA: with one token the product is a weighted column sum, so each thread multiplies its
part of the tile by x's rows and adds it into a [BLOCK_K, BLOCK_N] fp32 accumulator; the one
reduction over K comes once, in the epilogue (a reduction per block would put a cross-warp
barrier into every step of the stream). x's blocks load from L2 one block ahead. Sums run in
another order than the Triton kernel's: near, not bit for bit. Needs a Hopper GPU (TMA,
mbarriers); no interpreter.

Measured on the H200 (kernels/README.md, round 9): in the step the copies before the wait are
worth 1.2 us per KDA o_proj against the same kernel without them, and the KDA o_proj runs
-0.09 ms per step faster than the Triton kernel's; on the MoE front, the MLA o_proj and qkvg
it lost.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, mma_v2, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.k3.ops.common import current_trigger, pdl_launch


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.constexpr_function
def _fma_tile(block_n, num_warps):
    # A [BLOCK_K, BLOCK_N] tile: 8 bf16 (16 bytes) per thread along N, rows over the rest.
    tn = block_n // 8
    return gl.BlockedLayout([1, 8], [32 // tn, tn], [num_warps, 1], [1, 0])


@gluon.jit
def _x_column(x, i, kr, BLOCK_K: gl.constexpr, NK: gl.constexpr):
    # x's K block i (i > 0) as a [BLOCK_K, 1] column in the FMA tile's layout, zeros past the
    # end: loaded one block ahead, from L2 (every program reads the same few KB).
    return gl.load(x + i * BLOCK_K + kr, mask=(kr >= 0) & (i < NK), other=0.0)


@gluon.jit
def _request(w_desc, w_smem, bars, k_block, n0, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    s = k_block % STAGES
    mbarrier.expect(bars.index(s), w_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(w_desc, [k_block * BLOCK_K, n0], bars.index(s), w_smem.index(s))


@gluon.jit
def skinny_gl_kernel(x, w_desc, out, N, K: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, EARLY: gl.constexpr, USE_PDL: gl.constexpr):
    NK: gl.constexpr = K // BLOCK_K
    tile: gl.constexpr = _fma_tile(BLOCK_N, gl.num_warps())
    n0 = gl.program_id(0) * BLOCK_N

    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_K, BLOCK_N], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(EARLY):  # before the wait: the weights are no producer's output
        if i < NK:
            _request(w_desc, w_smem, bars, i, n0, BLOCK_K, STAGES)
    if USE_PDL:
        _gdc_wait()  # x is the producer's output
    if USE_PDL == 2:
        _gdc_launch_dependents()
    for i in gl.static_range(EARLY, STAGES):
        if i < NK:
            _request(w_desc, w_smem, bars, i, n0, BLOCK_K, STAGES)

    kr = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, tile))[:, None]
    xk = gl.load(x + kr)
    acc = gl.zeros([BLOCK_K, BLOCK_N], gl.float32, tile)
    for i in range(NK):
        xn = _x_column(x, i + 1, kr, BLOCK_K, NK)
        s = i % STAGES
        mbarrier.wait(bars.index(s), (i // STAGES) & 1)
        wt = w_smem.index(s).load(tile)
        acc += wt.to(gl.float32) * xk.to(gl.float32)
        # Every thread has read slot s (generic proxy) before its next TMA copy (async proxy).
        gl.thread_barrier()
        fence_async_shared()
        if i + STAGES < NK:
            _request(w_desc, w_smem, bars, i + STAGES, n0, BLOCK_K, STAGES)
        xk = xn
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    ns = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, tile))
    gl.store(out + ns, gl.sum(acc, axis=0).to(out.dtype.element_ty), mask=ns < N)
    if USE_PDL == 1:
        _gdc_launch_dependents()


@gluon.jit
def _ws_loader(w_desc, w_smem, ready, empty, n0, NK: gl.constexpr, BLOCK_K: gl.constexpr,
               STAGES: gl.constexpr, USE_PDL: gl.constexpr):
    # One warp: the copies never wait for the PDL producer (the weights are no kernel's
    # output), only for a free slot; the first STAGES go out as soon as the CTA starts.
    if USE_PDL == 2:
        # Under early triggers the consumers trigger after their wait; should the CTA's
        # trigger count every thread, this warp must not hold it back until its last copy.
        _gdc_launch_dependents()
    for i in range(NK):
        s = i % STAGES
        # A slot's first use needs no release: a fresh mbarrier's phase 1 counts as complete.
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [i * BLOCK_K, n0], ready.index(s), w_smem.index(s))


@gluon.jit
def _ws_consumer(x, out, N, w_smem, ready, empty, n0, NK: gl.constexpr, BLOCK_K: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MMA: gl.constexpr, USE_PDL: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    if USE_PDL:
        _gdc_wait()  # x is the producer's output
    if USE_PDL == 2:
        _gdc_launch_dependents()
    if MMA:
        # As Triton's skinny kernel: the token is row 0 of a 16-row MMA tile (mma.sync), the
        # weight tile loads from shared memory straight into the B operand's registers.
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        rows = gl.arange(0, 16, layout=gl.SliceLayout(1, a_l))[:, None]
        kc = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, a_l))[None, :]
        xk = gl.load(x + kc + rows * 0, mask=rows == 0, other=0.0)
        acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
        for i in range(NK):
            xn = gl.load(x + (i + 1) * BLOCK_K + kc + rows * 0, mask=(rows == 0) & (i + 1 < NK), other=0.0)
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            wt = w_smem.index(s).load(b_l)
            fence_async_shared()
            mbarrier.arrive(empty.index(s), count=1)
            acc = mma_v2(xk, wt, acc)
            xk = xn
        orow = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))[:, None]
        ocol = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))[None, :]
        gl.store(out + ocol + orow * 0, acc.to(out.dtype.element_ty), mask=(orow == 0) & (ocol < N))
    else:
        tile: gl.constexpr = _fma_tile(BLOCK_N, NW)
        kr = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, tile))[:, None]
        xk = gl.load(x + kr)
        acc = gl.zeros([BLOCK_K, BLOCK_N], gl.float32, tile)
        for i in range(NK):
            xn = _x_column(x, i + 1, kr, BLOCK_K, NK)
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            wt = w_smem.index(s).load(tile)
            # Generic-proxy reads of slot s ordered before the loader's next TMA write into it.
            fence_async_shared()
            mbarrier.arrive(empty.index(s), count=1)
            acc += wt.to(gl.float32) * xk.to(gl.float32)
            xk = xn
        ns = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, tile))
        gl.store(out + ns, gl.sum(acc, axis=0).to(out.dtype.element_ty), mask=ns < N)
    if USE_PDL == 1:
        _gdc_launch_dependents()


@gluon.jit
def skinny_ws_kernel(x, w_desc, out, N, K: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, MMA: gl.constexpr, USE_PDL: gl.constexpr):
    """skinny_gl_kernel warp-specialized: one loader warp streams the weights through the
    ring, the num_warps consumer warps wait, multiply and release slots."""
    NK: gl.constexpr = K // BLOCK_K
    n0 = gl.program_id(0) * BLOCK_N
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_K, BLOCK_N], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_ws_consumer, (x, out, N, w_smem, ready, empty, n0, NK, BLOCK_K, BLOCK_N, STAGES, MMA, USE_PDL)),
        (_ws_loader, (w_desc, w_smem, ready, empty, n0, NK, BLOCK_K, STAGES, USE_PDL)),
    ], [1], [24])


#: The step's skinny GEMMs at one token: (K, N, columns of the weight they slice).
GLUON_SHAPES = [(7168, 5120, 6016), (7168, 6144, 6144), (3584, 7168, 7168), (1536, 7168, 7168)]
#: (block_n, block_k, num_warps, stages, early) per (K, N); other shapes take the default.
GL_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int, int]] = {
    # o_proj: one call 13.8 us against the Triton kernel's 18.6 (early 4); in the step all 8
    # slots before the wait beat 4 (-0.06 against -0.04 ms), 12 slots (the whole K) lost.
    (1536, 7168): (64, 128, 4, 8, 8),
    # The MoE front's rest: 26.5 against 27.1 one call, but +0.03 ms in the step; kept for
    # bench_k3_step.py's `@glsub=front`, as is the whole front's (no router_fork).
    (7168, 5120): (64, 256, 8, 4, 4),
    (7168, 6016): (64, 256, 8, 4, 4),
}
GL_DEFAULT = (64, 128, 8, 8, 4)


def gl_weight_descriptor(w: torch.Tensor, block_k: int, block_n: int) -> TensorDescriptor:
    assert w.stride(1) == 1 and w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0
    layout = gl.NVMMASharedLayout.get_default_for([block_k, block_n], gl.bfloat16)
    return TensorDescriptor(w, list(w.shape), [w.stride(0), 1], [block_k, block_n], layout)


def skinny_gl(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *,
              config: tuple[int, int, int, int, int] | None = None, delay_ns: int = 0) -> torch.Tensor:
    """out = x @ w for one token (x [1, K] contiguous, w [K, N] bf16 with unit column stride,
    out [1, N]); `config` = (block_n, block_k, warps, stages, early), early <= stages the
    weight copies issued before the PDL wait. Under trigger_first it triggers after its wait
    (early), like pdl_early_trigger. No injected delay (the delay variants name Triton kernels)."""
    if delay_ns:
        raise ValueError("skinny_gl takes no injected delay: name another kernel in the delay variant")
    K, N = w.shape
    bn, bk, warps, stages, early = config or GL_CONFIGS.get((K, N), GL_DEFAULT)
    assert x.shape == (1, K) and x.is_contiguous() and out.shape == (1, N) and out.stride(1) == 1
    assert w.dtype == x.dtype == torch.bfloat16 and K % bk == 0 and 0 <= early <= stages
    use_pdl = current_trigger()
    skinny_gl_kernel[(triton.cdiv(N, bn),)](x, gl_weight_descriptor(w, bk, bn), out, N, K=K, BLOCK_K=bk,
                                            BLOCK_N=bn, STAGES=stages, EARLY=early, USE_PDL=min(use_pdl, 2),
                                            num_warps=warps, launch_pdl=pdl_launch())
    return out


#: Variant linear_ws: (block_n, block_k, consumer warps, stages, mma, maxnreg) per (K, N). Slower
#: than both other kernels in every form tried on the H200 (kernels/README.md, round 10): in the
#: step +0.24 ms on the KDA o_proj (+0.10 with FMA consumers); alone the mma form ran the up GEMM
#: 22.5 us back to back against Triton's 13.9, about 0.4 us of hand-off per K block. The
#: loader is one more warp (a warp group of four as allocated); maxnreg caps the launch's
#: registers per thread (the loader gives its share back to the consumers), so that a CTA can
#: sit beside the previous kernel's on its SM under PDL. mma 1: the consumers multiply by
#: mma.sync with the token as row 0 of 16, as Triton's skinny kernel does; 0: by FMA.
WS_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int, int, int]] = {}
WS_DEFAULT = (64, 128, 4, 8, 1, 128)


def skinny_ws(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *,
              config: tuple[int, int, int, int, int, int] | None = None, delay_ns: int = 0) -> torch.Tensor:
    """skinny_gl warp-specialized (variant linear_ws): out = x @ w for one token. `config` =
    (block_n, block_k, consumer warps, stages, mma, maxnreg). Every slot's first copy goes out
    when the CTA starts, whatever the PDL producer is doing; the consumers wait for it."""
    if delay_ns:
        raise ValueError("skinny_ws takes no injected delay: name another kernel in the delay variant")
    K, N = w.shape
    bn, bk, warps, stages, mma, maxnreg = config or WS_CONFIGS.get((K, N), WS_DEFAULT)
    assert x.shape == (1, K) and x.is_contiguous() and out.shape == (1, N) and out.stride(1) == 1
    assert w.dtype == x.dtype == torch.bfloat16 and K % bk == 0 and warps % 4 == 0
    use_pdl = current_trigger()
    skinny_ws_kernel[(triton.cdiv(N, bn),)](x, gl_weight_descriptor(w, bk, bn), out, N, K=K, BLOCK_K=bk,
                                            BLOCK_N=bn, STAGES=stages, MMA=mma, USE_PDL=min(use_pdl, 2),
                                            num_warps=warps, maxnreg=maxnreg, launch_pdl=pdl_launch())
    return out
