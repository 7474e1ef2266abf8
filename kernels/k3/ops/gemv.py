"""Skinny GEMV for decode: out[B, N] = x[B, K] @ w_t[N, K]^T, for small N.

cuBLAS picks a `dot_kernel` + `reduce_1Block_kernel` pair for the KDA [f_a | b] projection
(7168 -> 140 at B = 1), which the first full-depth H200 trace showed at 28 us per layer, on
the critical path behind the side-stream join. Reading the weight transposed (each output's
K contiguous) lets one program stream a couple of rows with coalesced loads: ~2 MB at
bandwidth instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.k3.plan import SKINNY_MAX_B  # one MMA tile of tokens; torch.mm beyond
from kernels.k3.ops.attn_res import gemm_scores_shape, gram_of_columns
from kernels.k3.ops.common import (DOT_F32, INTERPRET_C, dot, l2_prefetch, launch, next_pow2, pdl_trigger, pdl_wait,
                                   prefetch_args, spin, to_dtype)


@triton.jit
def gemv_kernel(x, w_t, out, K, N, stride_x, stride_w, stride_out,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1).to(tl.int64)
    ns = n0 + tl.arange(0, BLOCK_N)
    nm = ns < N
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    pdl_wait(USE_PDL)  # x is the producer's output; the weights are not, but stream with it
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + ks) < K
        xv = tl.load(x + b * stride_x + k0 + ks, mask=km, other=0.0).to(tl.float32)
        wv = tl.load(w_t + ns[:, None].to(tl.int64) * stride_w + k0 + ks[None, :],
                     mask=nm[:, None] & km[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(wv * xv[None, :], axis=1)
    tl.store(out + b * stride_out + ns, to_dtype(acc, out.dtype.element_ty), mask=nm)
    spin(DELAY_NS)
    pdl_trigger(USE_PDL)


def gemv(x: torch.Tensor, w_t: torch.Tensor, out: torch.Tensor, *, block_n: int = 1, block_k: int = 0,
         num_warps: int = 8, delay_ns: int = 0) -> torch.Tensor:
    """out = x @ w_t.T with x [B, K] (row-strided ok), w_t [N, K] contiguous, out [B, N].

    One program per output (and token) reading its whole weight row in one load: a K-loop
    of dependent 4 KB loads measured 19 us at 7168 -> 140 on the H200, latency-bound."""
    B, K = x.shape
    N = w_t.shape[0]
    assert w_t.shape[1] == K and w_t.stride(1) == 1 and x.stride(1) == 1 and out.stride(1) == 1
    block_k = block_k or min(triton.next_power_of_2(K), 8192)
    launch(gemv_kernel, (triton.cdiv(N, block_n), B), x, w_t, out, K, N, x.stride(0), w_t.stride(0), out.stride(0),
           delay_ns=delay_ns, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return out


# --------------------------------------------------------------------------------------
# Skinny GEMM over torch.mm's weight layout (variant triton_linear)
# --------------------------------------------------------------------------------------
@triton.jit
def skinny_mm_kernel(x, w, out, B, K, N, stride_x, stride_w, stride_out, mix_w, gamma, eps,
                     sumsq, n_sumsq, ws, tickets, k_per, bank, n_rows, stride_br, query, scores, w_desc,
                     gate, stride_gate,
                     pf_rows, pf, pf_bytes, PF_ROWS: tl.constexpr, PF_LINES: tl.constexpr, PF_CHUNKS: tl.constexpr,
                     TMA: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, MIX_K: tl.constexpr, NSQ: tl.constexpr, EARLY_W: tl.constexpr,
                     SPLIT_K: tl.constexpr, GRAM: tl.constexpr, FOLD: tl.constexpr, R: tl.constexpr,
                     W: tl.constexpr, T: tl.constexpr, DOT_F32: tl.constexpr, GATE: tl.constexpr,
                     USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr, MIX_MMA: tl.constexpr):
    # out[B, N] = x[B, K] @ w[K, N], w row-major (N contiguous, as torch.mm takes it). One
    # program per BLOCK_N columns streams its whole K; the few tokens pad the MMA's M side.
    # MIX_K > 0 (variant moe_tail_fused, one token): x is the MIX_K expert rows of the down
    # GEMM; the operand is RMSNorm(sum_k mix_w[k] x[k]) * gamma, formed as it loads.
    # SPLIT_K > 1 (variant linear_split_k): program (n, s) streams K rows [s k_per, (s+1)
    # k_per) and leaves its fp32 partial in ws; the last of a column block's SPLIT_K
    # programs to finish adds the partials in split order (deterministic) and stores.
    # TMA (variant linear_tma): the weight tiles stream through w_desc, a host tensor
    # descriptor over w (block [BLOCK_K, BLOCK_N]; out-of-range rows and columns read 0).
    # GATE (variant mla_gate_in_o_proj): the operand is x * sigmoid(gate), rounded to x's
    # dtype as gate_mul stores it, formed as each K block of x loads.
    # PF_CHUNKS != 0 (bench_k3_ops.py's window_prefetch): after its stores each program asks
    # L2 for its share of the next GEMM's first weight bytes (common.l2_prefetch).
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = ns < N
    ms = tl.arange(0, BLOCK_M)
    mm = ms < B
    kr = tl.arange(0, BLOCK_K)
    w_cols = w + ns[None, :]
    x_rows = x + ms.to(tl.int64)[:, None] * stride_x
    g_rows = gate + ms.to(tl.int64)[:, None] * stride_gate
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if MIX_K > 0 and MIX_MMA > 0:  # the expert rows fill the MMA's BLOCK_M rows (x_rows; the rest zero)
        em = ms < MIX_K
        mw = tl.load(mix_w + ms, mask=em, other=0.0)  # written several kernels ago: before the wait
        sumsq = tl.zeros([BLOCK_K], dtype=tl.float32)
    elif MIX_K > 0:
        es = tl.arange(0, MIX_K)
        x_rows = x + es.to(tl.int64)[:, None] * stride_x
        # The router wrote the weights several kernels ago: read them before the wait.
        mw = tl.load(mix_w + es)
        sumsq = tl.zeros([BLOCK_K], dtype=tl.float32)
    k_first = 0
    if EARLY_W:
        # Variant linear_early_weights: the weights are no producer's output, so the first
        # K block of them loads before the wait, while the previous kernel still runs (an
        # early-triggered launch starts during it); x's first block joins it after the wait.
        k_first = BLOCK_K
        w0 = tl.load(w_cols + kr.to(tl.int64)[:, None] * stride_w, mask=(kr[:, None] < K) & nm[None, :],
                     other=0.0)
    # Variant linear_prefetch:<MB>: this program's first pf_rows weight rows into L2 before
    # the wait. Under early or first triggers this launch starts while the latency-bound
    # kernels before it run, and HBM would idle through them.
    prefetch_lines(w, stride_w, tl.program_id(0) * BLOCK_N, tl.program_id(1) * k_per, pf_rows, PF_ROWS, PF_LINES)
    pdl_wait(USE_PDL)  # x is the producer's output
    if EARLY_W:
        x0 = gated_rows(x_rows, g_rows, kr[None, :], mm[:, None] & (kr[None, :] < K), GATE)
        acc = dot(x0, w0, acc, DOT_F32)
    k_end = K
    if SPLIT_K > 1:
        k_first = tl.program_id(1) * k_per
        k_end = tl.minimum(k_first + k_per, K)
    if MIX_K > 0 and MIX_MMA > 0:
        # Variant moe_tail_mma: the expert rows are the MMA's M rows (the token's other 15
        # were padding anyway), so acc[e] = (y_e * gamma) @ w with no per-block mixing in the
        # operand's path; the weighted sum happens once, on the accumulator, in the epilogue.
        # The norm's sum of squares, sum_c (sum_e mw_e y_e[c])^2, is side work whose result
        # only the epilogue reads: MIX_MMA 1 reduces each block's mix over the rows, 2 keeps
        # the rows' Gram matrix (an MMA of the block with itself), mw^T G mw at the end.
        gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
        for k0 in range(k_first, k_end, BLOCK_K):
            ks = k0 + kr
            km = ks < K
            wt = tl.load(w_cols + ks.to(tl.int64)[:, None] * stride_w, mask=km[:, None] & nm[None, :], other=0.0)
            ys = tl.load(x_rows + ks[None, :], mask=em[:, None] & km[None, :], other=0.0)
            g = tl.load(gamma + ks, mask=km, other=0.0)
            if MIX_MMA == 1:
                mix = tl.sum(ys.to(tl.float32) * mw[:, None], 0)
                sumsq += mix * mix
            else:
                gram = dot(ys, tl.trans(ys), gram, DOT_F32)
            acc = dot(to_dtype(ys.to(tl.float32) * g.to(tl.float32)[None, :], wt.dtype), wt, acc, DOT_F32)
        acc = tl.sum(acc * mw[:, None], 0)[None, :] + tl.zeros_like(acc)  # every row the token's
    elif MIX_K > 0:
        for k0 in range(k_first, k_end, BLOCK_K):
            ks = k0 + kr
            if EVEN_K:
                wt = tl.load(w_cols + ks.to(tl.int64)[:, None] * stride_w, mask=nm[None, :], other=0.0)
                ys = tl.load(x_rows + ks[None, :])
                g = tl.load(gamma + ks)
            else:
                km = ks < K
                wt = tl.load(w_cols + ks.to(tl.int64)[:, None] * stride_w, mask=km[:, None] & nm[None, :],
                             other=0.0)
                ys = tl.load(x_rows + ks[None, :], mask=km[None, :], other=0.0)
                g = tl.load(gamma + ks, mask=km, other=0.0)
            mix = tl.sum(ys.to(tl.float32) * mw[:, None], 0)  # this K block of the routed latent
            sumsq += mix * mix
            # The norm's 1/rms is one scalar per token: it scales the accumulator at the end.
            xg = to_dtype(mix * g.to(tl.float32), wt.dtype)
            xt = tl.where(ms[:, None] == 0, xg[None, :], tl.zeros_like(xg)[None, :])
            acc = dot(xt, wt, acc, DOT_F32)
    else:
        acc = skinny_k_rows(acc, x_rows, w_cols, mm, nm, K, k_first, k_end, stride_w, BLOCK_K, EVEN_K, DOT_F32,
                            w_desc, tl.program_id(0) * BLOCK_N, TMA, g_rows, GATE)
    if MIX_K > 0:
        if MIX_MMA == 2:
            ssq = tl.sum(tl.sum(gram * mw[:, None] * mw[None, :], 1), 0)
        else:
            ssq = tl.sum(sumsq, 0)
        acc = acc * tl.rsqrt(ssq / K + eps)
    if NSQ > 0:
        # Variant latent_norm_folded: the weights carry gamma, x is the unnormalised latent;
        # each token's 1/rms (from the producer's per-chunk sums of squares) scales its row.
        cs = tl.arange(0, NSQ)
        sq = tl.load(sumsq + ms[:, None] * n_sumsq + cs[None, :], mask=mm[:, None] & (cs[None, :] < n_sumsq),
                     other=0.0)
        acc = acc * tl.rsqrt(tl.sum(sq, 1) / K + eps)[:, None]
    out_mask = mm[:, None] & nm[None, :]
    if SPLIT_K > 1:
        acc, last = split_k_reduce(acc, ws, tickets, tl.program_id(1), tl.program_id(0), ms, ns, out_mask, N,
                                   BLOCK_M, SPLIT_K)
        out_mask = out_mask & last  # only the column block's last arrival stores
    o = to_dtype(acc, out.dtype.element_ty)
    tl.store(out + ms.to(tl.int64)[:, None] * stride_out + ns[None, :], o, mask=out_mask)
    if GRAM:  # variant attn_res_in_o_proj (one token): the next aggregation's score, here
        o0 = tl.sum(tl.where(ms[:, None] == 0, o.to(tl.float32), 0.0), axis=0)  # token 0's row, exact
        gram_of_columns(o0, ns, nm, bank, n_rows, stride_br, query, scores, FOLD, R, W, T, DOT_F32)
    l2_prefetch(pf, pf_bytes, PF_CHUNKS)
    spin(DELAY_NS)
    pdl_trigger(USE_PDL)


@triton.jit
def prefetch_lines(w, stride_w, n0, k0, rows, PF_ROWS: tl.constexpr, PF_LINES: tl.constexpr):
    """Variant linear_prefetch: ask L2 for the PF_LINES 128-byte lines from column n0 of w's
    rows k0 .. k0 + rows, one `prefetch.global.L2` per line spread over the threads: a
    non-binding hint on the load/store path (the bulk prefetch, cp.async.bulk.prefetch,
    queued ahead of the GEMM's own TMA loads and cost more than its bytes: campaign22).
    Compiled out with PF_ROWS = 0 and under the interpreter."""
    if PF_ROWS > 0 and not INTERPRET_C:
        cols = n0 + tl.arange(0, PF_LINES) * 64  # 64 bf16 = one line
        for r0 in range(0, rows, PF_ROWS):
            rs = r0 + tl.arange(0, PF_ROWS)
            ptrs = w + (k0 + rs).to(tl.int64)[:, None] * stride_w + cols[None, :]
            on = (rs[:, None] < rows).to(tl.int32) + tl.zeros([PF_ROWS, PF_LINES], dtype=tl.int32)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [ptrs, on], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gated_rows(x_rows, g_rows, cols, mask, GATE: tl.constexpr):
    """x's K block at `cols`, or with GATE (variant mla_gate_in_o_proj) x * sigmoid(gate)
    rounded to x's dtype: gate_mul_kernel's arithmetic, so the operand is its output's bits."""
    xt = tl.load(x_rows + cols, mask=mask, other=0.0)
    if GATE:
        gt = tl.load(g_rows + cols, mask=mask, other=0.0).to(tl.float32)
        xt = to_dtype(xt.to(tl.float32) * tl.sigmoid(gt), xt.dtype)
    return xt


@triton.jit
def skinny_k_rows(acc, x_rows, w_cols, mm, nm, K, k_first, k_end, stride_w, BLOCK_K: tl.constexpr,
                  EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, w_desc=None, n0=0, TMA: tl.constexpr = False,
                  g_rows=None, GATE: tl.constexpr = False):
    """acc + x[:, k_first:k_end] @ w[k_first:k_end, cols]: the skinny GEMM's K stream
    (`x_rows`: the token rows' pointers [BLOCK_M, 1], `w_cols`: the columns' [1, BLOCK_N];
    TMA: the weight tiles from `w_desc` at column `n0` instead, the same values; GATE: the
    operand gated by `g_rows`' values, gated_rows)."""
    kr = tl.arange(0, BLOCK_K)
    for k0 in range(k_first, k_end, BLOCK_K):
        ks = k0 + kr
        if TMA:
            # One bulk copy per tile into shared memory, where the MMA reads it: no
            # per-thread address math or register staging for the 32 KB of each stage.
            wt = w_desc.load([k0, n0])
            xt = gated_rows(x_rows, g_rows, ks[None, :], mm[:, None] & (ks[None, :] < K), GATE)
        elif EVEN_K:
            wt = tl.load(w_cols + ks.to(tl.int64)[:, None] * stride_w, mask=nm[None, :], other=0.0)
            xt = gated_rows(x_rows, g_rows, ks[None, :], mm[:, None], GATE)
        else:
            km = ks < K
            wt = tl.load(w_cols + ks.to(tl.int64)[:, None] * stride_w, mask=km[:, None] & nm[None, :],
                         other=0.0)
            xt = gated_rows(x_rows, g_rows, ks[None, :], mm[:, None] & km[None, :], GATE)
        acc = dot(xt, wt, acc, DOT_F32)
    return acc


@triton.jit
def split_k_reduce(acc, ws, tickets, split, block, ms, ns, mask, N, BLOCK_M: tl.constexpr,
                   SPLIT_K: tl.constexpr):
    """Stores this program's fp32 partial (split `split` of column block `block`; `N` the
    partials' row pitch, `ns` absolute columns); returns (the sum of the column block's
    SPLIT_K partials in split order, whether this program arrived last and holds it). The
    CTA barrier orders every thread's partial stores before the single-thread acq_rel
    ticket; the barrier after it orders the last arrival's reads after every other
    program's release. The last arrival resets the ticket: the next launch takes tickets
    only after its PDL wait, when this grid has completed."""
    part = ws + (split * BLOCK_M + ms)[:, None] * N + ns[None, :]
    tl.store(part, acc, mask=mask)
    tl.debug_barrier()
    ticket = tl.atomic_add(tickets + block, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    last = ticket == SPLIT_K - 1
    total = tl.zeros_like(acc)
    if last:
        for s in tl.static_range(SPLIT_K):
            total += tl.load(ws + (s * BLOCK_M + ms)[:, None] * N + ns[None, :], mask=mask, other=0.0,
                             cache_modifier=".cg")
        tl.atomic_xchg(tickets + block, 0, sem="relaxed", scope="gpu")
    return total, last


#: (block_n, block_k, num_warps, num_stages) per (K, N): the best of bench/bench_k3_ops.py's
#: sweep on the H200 at B = 1 (2026-12-01); other shapes take the default.
SKINNY_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (7168, 6016): (64, 256, 8, 4),   # MoE front      22.8 us vs cuBLAS 25.6
    (7168, 5120): (64, 256, 8, 4),   # its rest (router_fork)
    (7168, 6144): (64, 256, 8, 4),   # KDA qkvg       22.8 us vs 26.6
    (3584, 7168): (64, 128, 4, 6),   # MoE up         14.5 us vs 18.0
    (7168, 3648): (32, 256, 4, 4),   # MLA q_a | kv_a | g_proj (mla_proj_merged) 17.9 us vs 18.2
}
SKINNY_DEFAULT = (64, 256, 8, 4)
#: Variant moe_tail_mma: how skinny_mm_mixnorm forms the norm's sum of squares (1: each K
#: block's mix reduced over the rows, 2: the rows' Gram matrix by MMA); bench_k3_step.py's
#: `BUILD@tailmma=2` times the other one.
TAIL_MMA = 1
#: Variant linear_tma_tuned: with TMA, the configs bench_k3_ops.py --cases linear_tma found
#: faster one call at a time on the H200 (round 7: the front's rest 25.07 -> 24.56 us).
TMA_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (7168, 5120): (64, 256, 4, 4),
}
#: Variant linear_split_k: (config, split) per (K, N), where splitting K over programs
#: beat the unsplit kernel in bench/bench_k3_ops.py's split sweep on the H200 at B = 1;
#: other shapes stay unsplit. In the step the split front was slower (kernels/README.md,
#: fourth round): its 240 programs starve the router GEMV beside it.
SKINNY_SPLITS: dict[tuple[int, int], tuple[tuple[int, int, int, int], int]] = {
    (7168, 5120): ((64, 128, 4, 4), 3),   # MoE front's rest  21.9 -> 20.0 us (3.68 TB/s)
    (7168, 3648): ((64, 128, 4, 4), 4),   # mla_proj_merged   18.0 -> 15.4 us
    # qkvg (7168, 6144) and up (3584, 7168) were slower split (23.4 against 22.7 us, 15.2 against 14.2)
}
#: Variant shared_front_leg: the S1 leg's GEMM over the front's shared columns as (config,
#: split), or None for the front's rest's own config, unsplit (its columns' sums bit for bit).
#: That config holds 120 KB of shared memory per program (compile audit, sm_90a): beside the
#: routed gate|up GEMM's two 80 KB programs per SM it finds no room, as the shared experts'
#: cuBLAS down GEMM after it on S1 likely found none for 17 us in c72's trace (kernels/README.md,
#: round twenty-one). A small config split over K fits beside them (64, 128, 4, 2 x4: 20 KB);
#: bench_k3_step.py's `@leg=BN,BK,WARPS,STAGES/SPLIT` sets one.
SHARED_LEG: tuple[tuple[int, int, int, int], int] | None = None
SPLIT_MAX = 16  # router_in_front splits its router columns up to 16 ways
#: Variant triton_mla_proj: the MLA's narrow GEMMs, always split (q_a / g_proj from the split
#: sweep, 21.3 -> 9.0 us against cuBLAS's 10.7; kv_a and q_b by the same rule, not swept).
MLA_SPLITS: dict[tuple[int, int], tuple[tuple[int, int, int, int], int]] = {
    (7168, 1536): ((128, 128, 8, 4), 8),   # q_a, g_proj: 12 column blocks x 8
    (7168, 576): ((64, 128, 4, 4), 8),     # kv_a: 9 x 8
    (1536, 2304): ((64, 128, 4, 4), 3),    # q_b: 36 x 3
}


@dataclass(frozen=True)
class SplitK:
    """Split-K buffers (variants linear_split_k, triton_mla_proj), shared by the skinny GEMMs
    of one stream (they run one after another: each takes tickets only after its PDL wait,
    when the previous skinny GEMM has completed); one set per stream."""
    partials: torch.Tensor  # fp32 [SPLIT_MAX * 16 * max N]
    tickets: torch.Tensor   # int32 [max N / 16], zero; each reduction resets its own


def alloc_split_k(max_n: int, device) -> SplitK:
    return SplitK(torch.empty(SPLIT_MAX * 16 * max_n, device=device, dtype=torch.float32),
                  torch.zeros(triton.cdiv(max_n, 16), device=device, dtype=torch.int32))


def weight_descriptor(w: torch.Tensor, block_k: int, block_n: int) -> TensorDescriptor:
    """A TMA descriptor over w [K, N] (unit column stride; a column slice of a wider weight
    is fine) in [block_k, block_n] tiles. TMA needs the base and the row pitch 16-byte
    aligned: every K3 weight and its column slices are (their offsets are multiples of 64
    columns)."""
    assert w.stride(1) == 1 and w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0
    return TensorDescriptor(w, shape=list(w.shape), strides=[w.stride(0), 1], block_shape=[block_k, block_n])


#: Rows per step of prefetch_lines' loop (with PF_LINES lines each, over the program's threads).
PF_ROWS = 256


def own_rows_prefetch(w: torch.Tensor, nbytes: int, block_n: int, k_per: int) -> dict:
    """prefetch_lines' arguments for about `nbytes` of w [K, N] in all: each program its own
    columns of its first rows (of its K split), no more rows than the split has."""
    K, N = w.shape
    rows = min(k_per, nbytes // max(1, N * w.element_size() * (-(-K // k_per))))
    if rows <= 0:
        return dict(pf_rows=0, PF_ROWS=0, PF_LINES=1)
    return dict(pf_rows=rows, PF_ROWS=min(PF_ROWS, next_pow2(rows)),
                PF_LINES=max(1, block_n * w.element_size() // 128))


def skinny_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *,
              config: tuple[int, int, int, int] | None = None, rms_of: tuple | None = None,
              early_weights: bool = False, split_k: SplitK | None = None, splits: int | None = None,
              gram: tuple | None = None, tma: bool = False, prefetch_bytes: int = 0,
              gate: torch.Tensor | None = None, next_weight: torch.Tensor | None = None, next_bytes: int = 0,
              delay_ns: int = 0) -> torch.Tensor:
    """out = x @ w for B <= SKINNY_MAX_B tokens; w [K, N] with unit column stride (a
    column slice of a wider weight is fine), x and out row-strided. `rms_of = (sumsq, eps)`
    (variant latent_norm_folded): out[b] = x[b] @ w / rms(x[b]), the RMS from sumsq fp32
    [B, chunks], the sums of squares of x's row in chunks (moe_weighted_sum writes them).
    `early_weights` (variant linear_early_weights): the first K block of w loads before the
    PDL wait; the same products in the same order (bit for bit). `split_k` (variant
    linear_split_k, triton_mla_proj): K split over `splits` programs per column block
    (default: this shape's SKINNY_SPLITS or MLA_SPLITS entry, else unsplit); fp32 partials
    summed in split order, deterministic but not the unsplit kernel's bits. `gram = (bank,
    n_rows, query, scores, fold)` (variant attn_res_in_o_proj, one token, out the attention
    output): the epilogue does the next aggregation's score kernel's work on its columns
    (fold: the output is added to bank[n_rows-1]; else `out` is that row), its partials
    into `scores` (attn_res.gemm_scores_shape with this GEMM's block_n). `tma` (variant
    linear_tma): the weight streams through a TMA tensor descriptor (w 16-byte aligned, its
    row pitch too) where block_n spans 128 bytes; the same products in the same order.
    `prefetch_bytes` (variant linear_prefetch:<MB>): before its PDL wait each program asks
    L2 for its own columns of its first K rows, about that many bytes in all (a hint: no
    value changes). `gate` (variant mla_gate_in_o_proj, like x): the product is
    (x * sigmoid(gate)) @ w, the operand rounded to x's dtype as gate_mul stores it.
    `next_weight`, `next_bytes` (bench_k3_ops.py's window_prefetch): once its stores are
    issued, the launch asks L2 for the first `next_bytes` of that weight (contiguous; the
    next GEMM's), spread over its programs (common.l2_prefetch, the form prefetch_lines
    picks); no value changes."""
    B, K = x.shape
    N = w.shape[1]
    assert B <= SKINNY_MAX_B and w.shape[0] == K and out.shape == (B, N)
    assert w.stride(1) == 1 and x.stride(1) == 1 and out.stride(1) == 1
    split_cfg, split_n = (None, 1)
    if split_k is not None:
        split_cfg, split_n = {**SKINNY_SPLITS, **MLA_SPLITS}.get((K, N), (None, 1))
    bn, bk, warps, stages = config or split_cfg or SKINNY_CONFIGS.get((K, N), SKINNY_DEFAULT)
    S = splits or split_n
    # TMA where a tile row is a whole 128-byte swizzle line: at block_n 32 (64-byte rows; the
    # merged MLA projection) its kernel spilled, so narrower tiles keep the pointer loads.
    tma = tma and bn * w.element_size() >= 128
    sumsq, eps = rms_of if rms_of is not None else (out, 0.0)
    n_sq = sumsq.shape[1] if rms_of is not None else 0
    assert rms_of is None or (sumsq.shape[0] == B and sumsq.is_contiguous() and sumsq.dtype == torch.float32)
    k_per = triton.cdiv(triton.cdiv(K, bk), S) * bk  # whole K blocks per split
    S = triton.cdiv(K, k_per)
    if S > 1:
        assert split_k is not None and S <= SPLIT_MAX and rms_of is None and not early_weights
        assert split_k.partials.numel() >= S * 16 * N and split_k.tickets.numel() >= triton.cdiv(N, bn)
    ws, tickets = (split_k.partials, split_k.tickets) if S > 1 else (out, out)
    bank, n_rows, query, scores, fold = gram if gram is not None else (out, 1, out, out, False)
    if gram is not None:
        assert B == 1 and S == 1 and rms_of is None and bank.shape[1:] == (1, N) and bank.stride(2) == 1
        assert 1 <= n_rows <= bank.shape[0] and query.shape == (N,) and query.dtype == bank.dtype
        assert scores.shape == gemm_scores_shape(N, bn, bank.shape[0]) and scores.is_contiguous()
        assert fold or out.data_ptr() == bank[n_rows - 1].data_ptr()
    R = next_pow2(bank.shape[0]) if gram is not None else 1
    if gate is not None:
        assert gate.shape == (B, K) and gate.stride(1) == 1
    launch(skinny_mm_kernel, (triton.cdiv(N, bn), S), x, w, out, B, K, N, x.stride(0), w.stride(0),
           out.stride(0), x, x, eps, sumsq, n_sq, ws, tickets, k_per, bank, n_rows,
           bank.stride(0) if gram is not None else 0, query, scores,
           weight_descriptor(w, bk, bn) if tma else w, gate if gate is not None else x,
           gate.stride(0) if gate is not None else 0, **own_rows_prefetch(w, prefetch_bytes, bn, k_per),
           **prefetch_args(next_weight, next_bytes, triton.cdiv(N, bn) * S, out), TMA=tma,
           BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk,
           EVEN_K=K % bk == 0, MIX_K=0, NSQ=next_pow2(n_sq) if n_sq else 0, EARLY_W=early_weights, SPLIT_K=S,
           GRAM=gram is not None, FOLD=bool(fold), R=R, W=next_pow2(R + 1), T=max(16, next_pow2(R + 1)),
           DOT_F32=DOT_F32, GATE=gate is not None, MIX_MMA=0, num_warps=warps, num_stages=stages, delay_ns=delay_ns)
    return out


def skinny_mm_mixnorm(y: torch.Tensor, topk_w: torch.Tensor, gamma: torch.Tensor, w: torch.Tensor,
                      out: torch.Tensor, eps: float = 1e-6, *,
                      config: tuple[int, int, int, int] | None = None, mma: int = 0,
                      delay_ns: int = 0) -> torch.Tensor:
    """Variant moe_tail_fused, one token: out = RMSNorm(sum_k topk_w[0, k] y[k]) * gamma @ w,
    i.e. moe_weighted_sum -> rmsnorm -> skinny_mm in one launch. y [top_k, K] (the down
    GEMM's rows), topk_w [1, top_k] fp32, gamma [K], w [K, N], out [1, N]. The sums run in
    another order than the three kernels' (fp32), and the operand is rounded once, after
    gamma, before 1/rms is applied to the accumulator: near, not bit for bit.

    `mma` (variant moe_tail_mma; top_k <= 16): the expert rows, each times gamma, are the
    MMA's rows and the weighted sum is taken once, on the accumulator; the norm's sum of
    squares from each block's mix (1) or from the rows' Gram matrix (2). Near as well: the
    rows are rounded after gamma, the sum is of fp32 products."""
    E, K = y.shape
    N = w.shape[1]
    assert topk_w.shape == (1, E) and topk_w.dtype == torch.float32 and topk_w.is_contiguous()
    assert E == next_pow2(E) and gamma.shape == (K,) and gamma.is_contiguous()
    assert w.shape[0] == K and out.shape == (1, N) and y.stride(1) == 1 and w.stride(1) == 1
    assert mma in (0, 1, 2) and (not mma or E <= 16)  # the rows are the MMA's 16
    bn, bk, warps, stages = config or SKINNY_CONFIGS.get((K, N), SKINNY_DEFAULT)
    launch(skinny_mm_kernel, (triton.cdiv(N, bn),), y, w, out, 1, K, N, y.stride(0), w.stride(0),
           out.stride(0), topk_w, gamma, eps, out, 0, out, out, K, out, 1, 0, out, out, w, out, 0, 0, PF_ROWS=0,
           PF_LINES=1, pf=out, pf_bytes=0, PF_CHUNKS=0, TMA=False, BLOCK_M=16,
           BLOCK_N=bn,
           BLOCK_K=bk, EVEN_K=K % bk == 0, MIX_K=E, NSQ=0, EARLY_W=False, SPLIT_K=1, GRAM=False, FOLD=False, R=1,
           W=2, T=16, DOT_F32=DOT_F32, GATE=False, MIX_MMA=mma, num_warps=warps, num_stages=stages,
           delay_ns=delay_ns)
    return out
