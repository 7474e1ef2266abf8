"""Block attention residuals: score the bank rows, softmax, weighted sum, RMSNorm.

The bank is `[R_MAX, B, H]` bf16; rows 0..n_rows-1 are valid and row n_rows-1 is the
running partial of the current block. `n_rows` is a host int: it is fixed per layer and
site, so graphs stay static (one specialisation per value is fine).

Two kernels, both gridded over (token, H-chunk) so B=1 is not one program:

- `attn_res_score` writes, per (token, chunk), the chunk's partial Gram matrix of the
  valid rows, G[r, s] = <x_r, x_s>, and the partial query dots <x_r, query>. The row
  sums of squares (for the score RMSNorm) are G's diagonal.
- `attn_res_combine` sums the partials of all chunks (a few KB, L2-resident), forms
  score_r = <x_r, query> / rms(x_r), p = softmax(score), and writes its chunk of
  RMSNorm(sum_r p_r x_r) * gamma. The output RMS comes from ||sum p_r x_r||^2 = p^T G p,
  so no program needs the whole output row: that is what the Gram matrix buys.

Scores layout: fp32 `[B, NC, R_MAX, W]`, NC = cdiv(H, BLOCK_H), W = next_pow2(R_MAX+1);
column s < R_MAX holds G[r, s], column R_MAX the query dot. Allocate it with
`alloc_attn_res_scores`.

Residual folding (variant `residual_separate` turns it off): with `addend`, the score
kernel first does `bank[n_rows-1] += addend` (fp32 add, one bf16 rounding, written back)
and scores the rounded partial; `residual_add` then score is bit-identical.

Fused (`attn_res_fused`): one launch does both. Program (b, c) loads its x tile, computes
and stores its partial exactly as `attn_res_score_kernel` does, meets the other B*NC
programs of the launch at a grid-wide barrier, sums the NC partials in index order exactly
as `attn_res_combine_kernel` does and combines its own chunk from the x tile it still holds
in registers (no second read of the bank). With `addend` the row it combines is the
rounded partial it stored, which is what the combine kernel reads back. Outputs (`out`,
`scores`, the bank) are meant to be bit-identical to score -> combine: same per-program
arithmetic in the same order (the tests check it with torch.equal; on a GPU that also
relies on the compiler laying out the [R, W] reductions as it does in the pair).

The barrier needs every program co-resident: the fused kernel is launched only when
B*NC <= the SM count (132 on the H200; `attn_res_fused_fits`), else `attn_res_fused`
launches the pair (B = 64: 896 programs, so B = 64 keeps the pair). Barrier counter: one
int32 in global memory (`alloc_attn_res_counter`, zero-initialised), the
cooperative-groups grid.sync scheme: program (0, 0) adds 2^31 - (nprog - 1), every other
program adds 1 (release, gpu scope), so each launch adds exactly 2^31: the sign bit flips
once, when the last program arrives, and the low 31 bits return to 0. A program spins
(acquire, gpu scope) until the sign bit differs from the value it saw on arrival. The
counter is never reset, cannot overflow and works for any grid size; it only alternates
between 0 and INT32_MIN, one flip per launch. One counter per stream of serialised
launches: two fused launches that may run at the same time must not share one. Every
counter access comes after the PDL wait, so a PDL-early launch cannot touch it while the
previous launch's programs still spin.

The Triton interpreter (CPU tests) runs programs one at a time, so a spin barrier would
hang there: under `INTERPRET` the launcher runs the same kernel twice, PHASE=1 (score part,
store) then PHASE=2 (re-load the rows from the bank, combine). On a GPU PHASE=0 does both
with the barrier. The three phases share the same jit helpers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.k3.ops.common import (DOT_F32, INTERPRET, cdiv, dot, grid_barrier, l2_prefetch, launch, next_pow2,
                                   pdl_trigger, pdl_wait, prefetch_args, spin, to_dtype)

EPS = 1e-6


#: The score and combine kernels' column chunk and warps (score, combine): bench_k3_step.py's
#: `@attnres=BLOCK_H,SCORE_WARPS,COMBINE_WARPS` times others in the step.
BLOCK_H_MAX = 512
PAIR_WARPS = (4, 4)
#: Variant attn_res_wide (B = 1): the pair's chunk, 7 programs per token at H = 7168 (-0.15 ms
#: in the step against 512; 256 and 2048 were slower; kernels/README.md, round twelve).
WIDE_BLOCK_H = 1024


def _block_h(H: int) -> int:
    # 512 columns x 8 rows: 4K fp32 per program; 14 chunks per token at H = 7168.
    return min(BLOCK_H_MAX, next_pow2(H))


def attn_res_scores_shape(B: int, H: int, r_max: int = 8, block_h: int = 0) -> tuple[int, int, int, int]:
    """`block_h`: the pair's column chunk (0: the default, _block_h)."""
    R = next_pow2(r_max)
    return (B, cdiv(H, block_h or _block_h(H)), R, next_pow2(R + 1))


def gemm_scores_shape(H: int, block_n: int, r_max: int = 8) -> tuple[int, int, int, int]:
    """Variant attn_res_in_o_proj: one partial per column block of the GEMM that makes the
    partial row (one token)."""
    R = next_pow2(r_max)
    return (1, cdiv(H, block_n), R, next_pow2(R + 1))


def alloc_attn_res_scores(bank: torch.Tensor, block_h: int = 0) -> torch.Tensor:
    R_MAX, B, H = bank.shape
    return torch.empty(attn_res_scores_shape(B, H, R_MAX, block_h), device=bank.device, dtype=torch.float32)


@triton.jit
def _folded(pp, a, a2, cols, m, HAS_ADDEND2: tl.constexpr):
    # The partial row at `pp` plus the addend row `a` (and `a2`) at `cols`, one rounding to
    # the bank's dtype: add3's order, the two addends first, then the partial.
    add = tl.load(a + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_ADDEND2:
        add += tl.load(a2 + cols, mask=m, other=0.0).to(tl.float32)
    part = tl.load(pp + cols, mask=m, other=0.0).to(tl.float32) + add
    return to_dtype(part, pp.dtype.element_ty)


@triton.jit
def attn_res_score_kernel(bank, addend, addend2, query, scores, n_rows, H,
                          stride_br, stride_bb, stride_ab, stride_ab2, pf, pf_bytes,
                          R: tl.constexpr, W: tl.constexpr, BLOCK_H: tl.constexpr,
                          HAS_ADDEND: tl.constexpr, HAS_ADDEND2: tl.constexpr,
                          GRAM_DOT: tl.constexpr, EARLY_ROWS: tl.constexpr, T: tl.constexpr,
                          DOT_F32: tl.constexpr, PF_CHUNKS: tl.constexpr,
                          USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    nc = tl.num_programs(1)
    hs = c * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < H
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    q = tl.load(query + hs, mask=hm, other=0.0)  # a weight: before the wait
    last = n_rows - 1
    n_old = n_rows - 1 if HAS_ADDEND else n_rows
    base = bank + b.to(tl.int64) * stride_bb
    if GRAM_DOT:
        # Variant attn_res_dot: a [T, BLOCK_H] bf16 tile, rows 0..R-1 the bank rows, row R the
        # query, so one tensor-core product X X^T holds the Gram matrix and (column R) the
        # query dots: the same layout as the reduction loop below stores, in one MMA chain
        # instead of n_rows cross-warp reductions (6 us of the 9.6 us aggregation at B = 1).
        ts = tl.arange(0, T)
        row_ptr = base + ts[:, None] * stride_br + hs[None, :]
    else:
        ts = rs
        row_ptr = base + rs[:, None] * stride_br + hs[None, :]
    if EARLY_ROWS:
        # Variant attn_res_early_rows: only the previous kernel can have written the last row
        # (the partial: o_proj, add3, residual_add); every other row was written two or more
        # kernels back, which had completed before the previous kernel passed its own wait,
        # so they load before ours (from L2: .cg, never a stale L1 line).
        x = tl.load(row_ptr, mask=(ts[:, None] < n_rows - 1) & hm[None, :], other=0.0, cache_modifier=".cg")
        pdl_wait(USE_PDL)
        if not HAS_ADDEND:
            x = tl.where(ts[:, None] == last,
                         tl.load(base + last * stride_br + hs, mask=hm, other=0.0)[None, :], x)
    else:
        # Bank rows wait too: at a block boundary the previous kernel wrote the row that is
        # now the last completed block.
        pdl_wait(USE_PDL)
        x = tl.load(row_ptr, mask=(ts[:, None] < n_old) & hm[None, :], other=0.0)
    if PF_CHUNKS > 0:  # the next GEMM's weight (variant prefetch:<MB>), bulk: where round three had it
        l2_prefetch(pf, pf_bytes, PF_CHUNKS)
    if HAS_ADDEND:
        pp = base + last * stride_br
        part = _folded(pp, addend + b.to(tl.int64) * stride_ab, addend2 + b.to(tl.int64) * stride_ab2,
                       hs, hm, HAS_ADDEND2)
        tl.store(pp + hs, part, mask=hm)
        # Score the rounded value: exactly what residual_add / add3 + score would read back.
        x = tl.where(ts[:, None] == last, part[None, :], x)
    if GRAM_DOT:
        x = tl.where(ts[:, None] == R, q[None, :], x)
        G = dot(x, tl.trans(x), tl.zeros([T, T], dtype=tl.float32), DOT_F32)
        tl.store(scores + ((b * nc + c) * R + ts[:, None]) * W + ts[None, :], G,
                 mask=(ts[:, None] < R) & (ts[None, :] < W))
    else:
        x = x.to(tl.float32)
        acc = tl.zeros([R, W], dtype=tl.float32)
        acc = tl.where(ws[None, :] == R, tl.sum(x * q.to(tl.float32)[None, :], 1)[:, None], acc)
        for s in range(n_rows):
            xs = tl.sum(tl.where(rs[:, None] == s, x, 0.0), 0)  # row s (exact: one non-zero term)
            acc = tl.where(ws[None, :] == s, tl.sum(x * xs[None, :], 1)[:, None], acc)
        tl.store(scores + ((b * nc + c) * R + rs[:, None]) * W + ws[None, :], acc)
    if PF_CHUNKS < 0:  # prefetch_lines: its loop last, when the tiles are dead (before it, x spilled)
        l2_prefetch(pf, pf_bytes, PF_CHUNKS)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def gram_of_columns(o, ns, nm, bank, n_rows, stride_br, query, scores, FOLD: tl.constexpr,
                    R: tl.constexpr, W: tl.constexpr, T: tl.constexpr, DOT_F32: tl.constexpr):
    """Variant attn_res_in_o_proj, in the epilogue of the GEMM whose output `o` [BLOCK_N]
    (fp32 of the stored bf16, token 0, columns `ns`) is the partial row's new content:
    FOLD: bank[n_rows-1] += o (the folded residual add, one bf16 rounding, stored), else o
    is that row already. Then attn_res_score_kernel's GRAM_DOT partial over these columns
    (rows 0..R-1 the bank, row R the query) into scores[0, program, :R, :W]."""
    last = n_rows - 1
    if FOLD:
        pp = bank + last * stride_br + ns
        part = to_dtype(tl.load(pp, mask=nm, other=0.0).to(tl.float32) + o, bank.dtype.element_ty)
        tl.store(pp, part, mask=nm)
    else:
        part = o.to(bank.dtype.element_ty)  # exact: o holds bf16 values
    ts = tl.arange(0, T)
    x = tl.load(bank + ts[:, None] * stride_br + ns[None, :], mask=(ts[:, None] < last) & nm[None, :], other=0.0)
    x = tl.where(ts[:, None] == last, part[None, :], x)
    x = tl.where(ts[:, None] == R, tl.load(query + ns, mask=nm, other=0.0)[None, :], x)
    G = dot(x, tl.trans(x), tl.zeros([T, T], dtype=tl.float32), DOT_F32)
    tl.store(scores + (tl.program_id(0) * R + ts[:, None]) * W + ts[None, :], G,
             mask=(ts[:, None] < R) & (ts[None, :] < W))


@triton.jit
def _weights_from_gram(G, n_rows, H, eps, R: tl.constexpr, W: tl.constexpr, Q: tl.constexpr):
    # The softmax weights p over the valid rows and the output's 1/rms, from the summed
    # partials G [R, W] (Gram matrix, query dots in column Q); the combine and the fused
    # kernel share it, so their outputs stay bit for bit alike.
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    diag = rs[:, None] == ws[None, :]
    sumsq = tl.sum(tl.where(diag, G, 0.0), 1)
    dots = tl.sum(tl.where(ws[None, :] == Q, G, 0.0), 1)
    valid = rs < n_rows
    logit = tl.where(valid, dots * tl.rsqrt(sumsq / H + 1e-6), -float("inf"))
    p = tl.where(valid, tl.exp(logit - tl.max(logit, 0)), 0.0)
    p = p / tl.sum(p, 0)
    # ||sum_r p_r x_r||^2 = p^T G p: the output RMS without seeing the other chunks.
    p_w = tl.sum(tl.where(diag, p[:, None], 0.0), 0)
    sq = tl.sum(p * tl.sum(G * p_w[None, :], 1), 0)
    rstd = tl.rsqrt(tl.maximum(sq, 0.0) / H + eps)
    return p, rstd


@triton.jit
def attn_res_combine_kernel(bank, scores, gamma, out, n_rows, H, NC,
                            stride_br, stride_bb, stride_ob, eps,
                            R: tl.constexpr, W: tl.constexpr, BLOCK_H: tl.constexpr,
                            ONE_SHOT: tl.constexpr, EARLY_ROWS: tl.constexpr, NCP: tl.constexpr,
                            USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    hs = c * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < H
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    g = tl.load(gamma + hs, mask=hm, other=0.0).to(tl.float32)  # a weight: before the wait
    base = bank + b.to(tl.int64) * stride_bb + hs
    last = n_rows - 1
    if EARLY_ROWS:
        # As in the score kernel: only the last row (the partial the score kernel may have
        # just added to) is the previous kernel's; the others load before the wait.
        x = tl.load(base[None, :] + rs[:, None] * stride_br, mask=(rs[:, None] < last) & hm[None, :],
                    other=0.0, cache_modifier=".cg").to(tl.float32)
    pdl_wait(USE_PDL)
    if ONE_SHOT and EARLY_ROWS:
        # The partials summed in index order, their NC loads unrolled so they still issue
        # back to back. Not the one [NCP, R, W] load below: beside the early tile, Triton 3.6
        # (the H200's) compiles that to 32 registers and ~11 KB of spills per thread, the
        # cause of this variant's 85 us in round three (3.7.1 has no spill either way).
        G = tl.zeros([R, W], dtype=tl.float32)
        for i in tl.static_range(NCP):
            if i < NC:
                G += tl.load(scores + ((b * NC + i) * R + rs[:, None]) * W + ws[None, :])
    elif ONE_SHOT:
        # Variant attn_res_dot: every chunk's partial in one [NCP, R, W] load (one L2 round
        # trip instead of NC dependent ones).
        ns = tl.arange(0, NCP)
        G = tl.sum(tl.load(scores + ((b * NC + ns[:, None, None]) * R + rs[None, :, None]) * W
                           + ws[None, None, :], mask=ns[:, None, None] < NC, other=0.0), 0)
    else:
        G = tl.zeros([R, W], dtype=tl.float32)
        for i in range(NC):
            G += tl.load(scores + ((b * NC + i) * R + rs[:, None]) * W + ws[None, :])
    if EARLY_ROWS:
        x = tl.where(rs[:, None] == last,
                     tl.load(base + last * stride_br, mask=hm, other=0.0).to(tl.float32)[None, :], x)
    elif ONE_SHOT:
        x = tl.load(base[None, :] + rs[:, None] * stride_br, mask=(rs[:, None] < n_rows) & hm[None, :],
                    other=0.0).to(tl.float32)
    p, rstd = _weights_from_gram(G, n_rows, H, eps, R, W, R)
    if ONE_SHOT:
        acc = tl.sum(p[:, None] * x, 0)
    elif EARLY_ROWS:  # the rows from the tile, in the loop's order: bit for bit the loads below
        acc = _fused_mix(x, p, n_rows, R, BLOCK_H)
    else:
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for r in range(n_rows):
            pr = tl.sum(tl.where(rs == r, p, 0.0), 0)
            acc += pr * tl.load(base + r * stride_br, mask=hm, other=0.0).to(tl.float32)
    tl.store(out + b.to(tl.int64) * stride_ob + hs, to_dtype(acc * rstd * g, out.dtype.element_ty),
             mask=hm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


# ---- fused score + combine (one launch, grid-wide barrier) -------------------------------
@triton.jit
def _fused_gram(x, q, n_rows, R: tl.constexpr, W: tl.constexpr):
    # attn_res_score_kernel's partial, term for term: column R the query dots, column s < R
    # the Gram column G[:, s].
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    acc = tl.zeros([R, W], dtype=tl.float32)
    acc = tl.where(ws[None, :] == R, tl.sum(x * q[None, :], 1)[:, None], acc)
    for s in range(n_rows):
        xs = tl.sum(tl.where(rs[:, None] == s, x, 0.0), 0)  # row s (exact: one non-zero term)
        acc = tl.where(ws[None, :] == s, tl.sum(x * xs[None, :], 1)[:, None], acc)
    return acc


@triton.jit
def _fused_weights(scores, b, n_rows, H, eps, NC: tl.constexpr, R: tl.constexpr, W: tl.constexpr):
    # attn_res_combine_kernel's softmax weights p and output rstd from the NC partials,
    # summed in index order (unrolled: the NC loads issue back to back instead of one L2
    # round trip per iteration; the adds keep their order). .cg: the partials were written
    # by other programs of this launch after it started; read them from L2, never L1.
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    G = tl.zeros([R, W], dtype=tl.float32)
    for i in tl.static_range(NC):
        G += tl.load(scores + ((b * NC + i) * R + rs[:, None]) * W + ws[None, :], cache_modifier=".cg")
    return _weights_from_gram(G, n_rows, H, eps, R, W, R)


@triton.jit
def _fused_mix(x, p, n_rows, R: tl.constexpr, BLOCK_H: tl.constexpr):
    # sum_r p_r x_r with the rows taken from the tile (exact extraction), accumulated in row
    # order as attn_res_combine_kernel accumulates the rows it loads.
    rs = tl.arange(0, R)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for r in range(n_rows):
        pr = tl.sum(tl.where(rs == r, p, 0.0), 0)
        acc += pr * tl.sum(tl.where(rs[:, None] == r, x, 0.0), 0)
    return acc


@triton.jit
def attn_res_fused_kernel(bank, addend, query, scores, gamma, out, counter, n_rows, H,
                          stride_br, stride_bb, stride_ab, stride_ob, eps,
                          NC: tl.constexpr, R: tl.constexpr, W: tl.constexpr, BLOCK_H: tl.constexpr,
                          HAS_ADDEND: tl.constexpr, PHASE: tl.constexpr,
                          USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # PHASE 0 (GPU): score part, barrier, combine. Interpreter only: PHASE 1 = score part,
    # PHASE 2 = re-load the (already updated) rows and combine.
    b = tl.program_id(0)
    c = tl.program_id(1)
    hs = c * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < H
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    base = bank + b.to(tl.int64) * stride_bb
    if PHASE != 2:
        q = tl.load(query + hs, mask=hm, other=0.0).to(tl.float32)  # weights: before the wait
    if PHASE != 1:
        g = tl.load(gamma + hs, mask=hm, other=0.0).to(tl.float32)
    pdl_wait(USE_PDL)
    if PHASE != 2:
        last = n_rows - 1
        n_old = n_rows - 1 if HAS_ADDEND else n_rows
        x = tl.load(base + rs[:, None] * stride_br + hs[None, :],
                    mask=(rs[:, None] < n_old) & hm[None, :], other=0.0).to(tl.float32)
        if HAS_ADDEND:
            pp = base + last * stride_br + hs
            part = tl.load(pp, mask=hm, other=0.0).to(tl.float32) \
                + tl.load(addend + b.to(tl.int64) * stride_ab + hs, mask=hm, other=0.0).to(tl.float32)
            part = to_dtype(part, bank.dtype.element_ty)
            tl.store(pp, part, mask=hm)
            # The rounded value: what the combine kernel of the pair reads back.
            x = tl.where(rs[:, None] == last, part.to(tl.float32)[None, :], x)
        acc = _fused_gram(x, q, n_rows, R, W)
        tl.store(scores + ((b * NC + c) * R + rs[:, None]) * W + ws[None, :], acc)
    if PHASE == 0:
        grid_barrier(counter)
    if PHASE == 2:
        x = tl.load(base + rs[:, None] * stride_br + hs[None, :],
                    mask=(rs[:, None] < n_rows) & hm[None, :], other=0.0).to(tl.float32)
    if PHASE != 1:
        p, rstd = _fused_weights(scores, b, n_rows, H, eps, NC, R, W)
        mix = _fused_mix(x, p, n_rows, R, BLOCK_H)
        tl.store(out + b.to(tl.int64) * stride_ob + hs,
                 to_dtype(mix * rstd * g, out.dtype.element_ty), mask=hm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


# ---- one pass: every program its own whole-row Gram matrix (no partials, no barrier) ------
@triton.jit
def attn_res_one_pass_kernel(bank, part_in, part_out, addend, addend2, query, gamma, out, n_rows, H,
                             stride_br, stride_bb, stride_pb, stride_ab, stride_ab2, stride_ob, eps,
                             R: tl.constexpr, T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                             HAS_ADDEND: tl.constexpr, HAS_ADDEND2: tl.constexpr, DOT_F32: tl.constexpr,
                             USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Variant attn_res_one_pass: program (b, c) streams token b's whole valid rows (from L2:
    # ~150 KB at 8 rows) through one tensor-core product for the full Gram matrix and query
    # dots, takes the softmax weights and the output RMS from it, and writes its own chunk of
    # the output: score + combine in one launch with no cross-program exchange, so neither
    # the partials' round trip nor a grid barrier. With an addend the running partial comes
    # from `part_in` (the previous aggregation's copy, complete before this launch) so that
    # no program reads a bank row another program of this launch writes; program c stores
    # its chunk of the folded partial to the bank row and to `part_out`, the next
    # aggregation's `part_in`. Without one it copies its chunk of the bank's last row there.
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    ts = tl.arange(0, T)
    hs = c * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < H
    g = tl.load(gamma + hs, mask=hm, other=0.0).to(tl.float32)  # a weight: before the wait
    last = n_rows - 1
    n_old = n_rows - 1 if HAS_ADDEND else n_rows
    base = bank + b * stride_bb
    pin, pout = part_in + b * stride_pb, part_out + b * stride_pb
    a, a2 = addend + b * stride_ab, addend2 + b * stride_ab2
    pdl_wait(USE_PDL)
    # Rows 0..R-1 the bank (the last one the folded partial), row R the query: the layout
    # attn_res_dot's score tile has, over all of H instead of one chunk.
    G = tl.zeros([T, T], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        km = ks < H
        x = tl.load(base + ts[:, None] * stride_br + ks[None, :], mask=(ts[:, None] < n_old) & km[None, :],
                    other=0.0)
        if HAS_ADDEND:
            x = tl.where(ts[:, None] == last, _folded(pin, a, a2, ks, km, HAS_ADDEND2)[None, :], x)
        x = tl.where(ts[:, None] == R, tl.load(query + ks, mask=km, other=0.0)[None, :], x)
        G = dot(x, tl.trans(x), G, DOT_F32)
    p, rstd = _weights_from_gram(G, n_rows, H, eps, T, T, R)
    x = tl.load(base + ts[:, None] * stride_br + hs[None, :], mask=(ts[:, None] < n_old) & hm[None, :],
                other=0.0)
    if HAS_ADDEND:
        part = _folded(pin, a, a2, hs, hm, HAS_ADDEND2)
        tl.store(base + last * stride_br + hs, part, mask=hm)
        x = tl.where(ts[:, None] == last, part[None, :], x)
    else:
        part = tl.load(base + last * stride_br + hs, mask=hm, other=0.0)
    tl.store(pout + hs, part, mask=hm)
    mix = tl.sum(p[:, None] * x.to(tl.float32), 0)
    tl.store(out + b * stride_ob + hs, to_dtype(mix * rstd * g, out.dtype.element_ty), mask=hm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


#: attn_res_one_pass: output columns per program (14 programs at H = 7168; each reads the
#: whole valid rows, so fewer, wider programs read less in all) and the Gram loop's K block.
ONE_PASS_BLOCK_H, ONE_PASS_BLOCK_K = 512, 512


def alloc_partial_copies(bank: torch.Tensor) -> torch.Tensor:
    """attn_res_one_pass's two copies of the running partial [2, B, H] (bank dtype): an
    aggregation reads one and writes the other, alternating."""
    _, B, H = bank.shape
    return torch.empty(2, B, H, device=bank.device, dtype=bank.dtype)


def attn_res_one_pass(bank: torch.Tensor, n_rows: int, query: torch.Tensor, gamma: torch.Tensor,
                      out: torch.Tensor, part_in: torch.Tensor, part_out: torch.Tensor, *,
                      addend: torch.Tensor | None = None, addend2: torch.Tensor | None = None,
                      eps: float = EPS, delay_ns: int = 0) -> torch.Tensor:
    """attn_res_score (with the folded addends) then attn_res_combine in one launch, each
    program forming the whole Gram matrix itself (variant attn_res_one_pass: fp32 sums in
    another order than the pair's). With `addend` the running partial is read from
    `part_in`, which must hold bank[n_rows - 1] (the previous aggregation's `part_out`);
    bank[n_rows - 1] and `part_out` receive the folded partial. Without it `part_out` gets a
    copy of bank[n_rows - 1]."""
    _check_bank(bank, n_rows)
    R_MAX, B, H = bank.shape
    assert query.shape == (H,) and query.is_contiguous() and query.dtype == bank.dtype
    assert gamma.shape == (H,) and gamma.is_contiguous()
    assert out.shape == (B, H) and out.stride(1) == 1
    for t in (part_in, part_out):
        assert t.shape == (B, H) and t.stride(1) == 1 and t.dtype == bank.dtype
    assert part_in.stride(0) == part_out.stride(0) and part_in.data_ptr() != part_out.data_ptr()
    assert addend2 is None or addend is not None
    for t in (addend, addend2):
        if t is not None:
            assert t.shape == (B, H) and t.stride(1) == 1
    R = next_pow2(R_MAX)
    launch(attn_res_one_pass_kernel, (B, cdiv(H, ONE_PASS_BLOCK_H)), bank, part_in, part_out,
           addend if addend is not None else bank, addend2 if addend2 is not None else bank, query, gamma,
           out, n_rows, H, bank.stride(0), bank.stride(1), part_in.stride(0),
           addend.stride(0) if addend is not None else 0, addend2.stride(0) if addend2 is not None else 0,
           out.stride(0), eps, R=R, T=max(16, next_pow2(R + 1)), BLOCK_H=ONE_PASS_BLOCK_H,
           BLOCK_K=ONE_PASS_BLOCK_K, HAS_ADDEND=addend is not None, HAS_ADDEND2=addend2 is not None,
           DOT_F32=DOT_F32, num_warps=4, num_stages=3, delay_ns=delay_ns)
    return out


@triton.jit
def residual_add_kernel(partial, a, b_in, H, stride_p, stride_a, stride_b,
                        BLOCK: tl.constexpr, HAS_B: tl.constexpr,
                        USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    hm = hs < H
    pdl_wait(USE_PDL)
    add = tl.load(a + row * stride_a + hs, mask=hm, other=0.0).to(tl.float32)
    if HAS_B:
        add += tl.load(b_in + row * stride_b + hs, mask=hm, other=0.0).to(tl.float32)
    pp = partial + row * stride_p + hs
    v = tl.load(pp, mask=hm, other=0.0).to(tl.float32) + add
    tl.store(pp, to_dtype(v, partial.dtype.element_ty), mask=hm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def _check_bank(bank: torch.Tensor, n_rows: int) -> None:
    assert bank.dim() == 3 and bank.stride(2) == 1
    assert 1 <= n_rows <= bank.shape[0], f"n_rows {n_rows} outside 1..{bank.shape[0]}"


def attn_res_score(bank: torch.Tensor, n_rows: int, query: torch.Tensor, scores: torch.Tensor, *,
                   addend: torch.Tensor | None = None, addend2: torch.Tensor | None = None,
                   gram_dot: bool = False, early_rows: bool = False,
                   prefetch: torch.Tensor | None = None, prefetch_bytes: int = 0, block_h: int = 0,
                   delay_ns: int = 0) -> torch.Tensor:
    """Partial scores of rows 0..n_rows-1 into `scores` (chunks of `block_h` columns, 0: the
    default; variant attn_res_wide); with `addend`, first
    bank[n_rows-1] += addend in place (the folded residual add), with `addend2` too
    bank[n_rows-1] += addend + addend2 (add3 folded: variant mlp_residual_folded).
    `gram_dot` (variant attn_res_dot): the partials by one tensor-core product, same layout,
    fp32 sums in another order; `early_rows` (variant attn_res_early_rows): every row but
    the last loads before the PDL wait, same arithmetic. `prefetch`: the first
    `prefetch_bytes` of this weight into L2 (variant prefetch:<MB>; common.l2_prefetch)."""
    _check_bank(bank, n_rows)
    R_MAX, B, H = bank.shape
    assert scores.shape == attn_res_scores_shape(B, H, R_MAX, block_h) and scores.is_contiguous()
    assert scores.dtype == torch.float32 and query.shape == (H,) and query.is_contiguous()
    _, NC, R, W = scores.shape
    assert addend2 is None or addend is not None
    assert not gram_dot or query.dtype == bank.dtype, "gram_dot: the query joins the bank's bf16 tile"
    for a in (addend, addend2):
        if a is not None:
            assert a.shape == (B, H) and a.stride(1) == 1
    launch(attn_res_score_kernel, (B, NC), bank, addend if addend is not None else bank,
           addend2 if addend2 is not None else bank, query, scores, n_rows, H, bank.stride(0),
           bank.stride(1), addend.stride(0) if addend is not None else 0,
           addend2.stride(0) if addend2 is not None else 0,
           **prefetch_args(prefetch, prefetch_bytes, B * NC, scores), R=R, W=W, BLOCK_H=block_h or _block_h(H),
           HAS_ADDEND=addend is not None, HAS_ADDEND2=addend2 is not None, GRAM_DOT=gram_dot, EARLY_ROWS=early_rows,
           T=max(16, W), DOT_F32=DOT_F32, num_warps=PAIR_WARPS[0], delay_ns=delay_ns)
    return scores


def attn_res_combine(bank: torch.Tensor, n_rows: int, scores: torch.Tensor, gamma: torch.Tensor,
                     out: torch.Tensor, *, eps: float = EPS, one_shot: bool = False,
                     early_rows: bool = False, block_h: int = 0, delay_ns: int = 0) -> torch.Tensor:
    """out = RMSNorm(sum_r softmax(score)_r bank[r]) * gamma, in chunks of `block_h` columns
    (0: the default; the score kernel's, variant attn_res_wide). `one_shot` (variant
    attn_res_dot): the partials and the rows each in one load, the mix a tree sum;
    `early_rows`: every row but the last loads before the PDL wait, same arithmetic (with
    `one_shot`, the partials summed in index order: fp32 sums in another order).
    `scores` holds the score kernel's partials, or (one token, one_shot) the GEMM
    epilogue's, one per column block (gemm_scores_shape: variant attn_res_in_o_proj)."""
    _check_bank(bank, n_rows)
    R_MAX, B, H = bank.shape
    block_h = block_h or _block_h(H)
    gemm = scores.shape[1] != attn_res_scores_shape(B, H, R_MAX, block_h)[1]  # attn_res_in_o_proj's partials
    assert scores.shape[0] == B and scores.shape[2:] == attn_res_scores_shape(B, H, R_MAX)[2:]
    assert scores.is_contiguous() and (not gemm or (B == 1 and one_shot))
    assert gamma.shape == (H,) and gamma.is_contiguous()
    assert out.shape == (B, H) and out.stride(1) == 1
    _, NC, R, W = scores.shape
    launch(attn_res_combine_kernel, (B, cdiv(H, block_h)), bank, scores, gamma, out, n_rows, H, NC,
           bank.stride(0), bank.stride(1), out.stride(0), eps,
           R=R, W=W, BLOCK_H=block_h, ONE_SHOT=one_shot, EARLY_ROWS=early_rows,
           NCP=next_pow2(NC), num_warps=8 if NC > 32 else PAIR_WARPS[1], delay_ns=delay_ns)
    return out


#: SMs of the H200: the co-residency bound used when the bank is not on a CUDA device
#: (the offline sm_90 compile test passes meta tensors).
H200_SMS = 132
_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SMS
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def attn_res_fused_fits(B: int, H: int, sm_count: int) -> bool:
    """Whether `attn_res_fused` launches the fused kernel: its B*NC programs (one per token
    and H-chunk) must all be co-resident for the barrier, so at most one per SM."""
    return B * cdiv(H, _block_h(H)) <= sm_count


def alloc_attn_res_counter(device) -> torch.Tensor:
    """The fused kernel's barrier counter: one zeroed int32, reused by every launch (never
    reset). One per stream of serialised launches (one per K3Decode)."""
    return torch.zeros(1, device=device, dtype=torch.int32)


def attn_res_fused(bank: torch.Tensor, n_rows: int, query: torch.Tensor, scores: torch.Tensor,
                   gamma: torch.Tensor, out: torch.Tensor, *, addend: torch.Tensor | None = None,
                   eps: float = EPS, counter: torch.Tensor | None = None,
                   sm_count: int | None = None, delay_ns: int = 0) -> torch.Tensor:
    """attn_res_score then attn_res_combine (with the folded `addend`) in one launch: same
    outputs, bit for bit (`out`, `scores`, the bank row). When the B*NC programs do not
    fit one per SM (`sm_count`, default: the device's, 132 off CUDA) it launches that pair
    instead (`delay_ns` then goes to the combine kernel, the one the consumer reads).
    `counter`: from `alloc_attn_res_counter`, needed for the fused launch."""
    _check_bank(bank, n_rows)
    R_MAX, B, H = bank.shape
    if not attn_res_fused_fits(B, H, _sm_count(bank.device) if sm_count is None else sm_count):
        attn_res_score(bank, n_rows, query, scores, addend=addend)
        return attn_res_combine(bank, n_rows, scores, gamma, out, eps=eps, delay_ns=delay_ns)
    assert scores.shape == attn_res_scores_shape(B, H, R_MAX) and scores.is_contiguous()
    assert scores.dtype == torch.float32 and query.shape == (H,) and query.is_contiguous()
    assert gamma.shape == (H,) and gamma.is_contiguous()
    assert out.shape == (B, H) and out.stride(1) == 1
    if counter is None:
        raise ValueError("attn_res_fused needs counter= (alloc_attn_res_counter)")
    assert counter.dtype == torch.int32 and counter.numel() == 1 and counter.device == bank.device
    if addend is not None:
        assert addend.shape == (B, H) and addend.stride(1) == 1
    _, NC, R, W = scores.shape
    args = (bank, addend if addend is not None else bank, query, scores, gamma, out, counter,
            n_rows, H, bank.stride(0), bank.stride(1),
            addend.stride(0) if addend is not None else 0, out.stride(0), eps)
    meta = dict(NC=NC, R=R, W=W, BLOCK_H=_block_h(H), HAS_ADDEND=addend is not None, num_warps=4)
    if INTERPRET:  # programs run one at a time there: a spin barrier would never release
        launch(attn_res_fused_kernel, (B, NC), *args, PHASE=1, **meta)
        launch(attn_res_fused_kernel, (B, NC), *args, PHASE=2, **meta, delay_ns=delay_ns)
    else:
        launch(attn_res_fused_kernel, (B, NC), *args, PHASE=0, **meta, delay_ns=delay_ns)
    return out


_ADD_BLOCK = 1024


def residual_add(partial: torch.Tensor, addend: torch.Tensor, *, delay_ns: int = 0) -> torch.Tensor:
    """partial += addend (fp32 add, one rounding); `partial` may be a bank-row view."""
    B, H = partial.shape
    assert addend.shape == (B, H) and partial.stride(1) == 1 and addend.stride(1) == 1
    launch(residual_add_kernel, (B, cdiv(H, _ADD_BLOCK)), partial, addend, addend, H,
           partial.stride(0), addend.stride(0), 0, BLOCK=_ADD_BLOCK, HAS_B=False, num_warps=4,
           delay_ns=delay_ns)
    return partial


def add3(partial: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, delay_ns: int = 0) -> torch.Tensor:
    """partial += (a + b) in fp32, one rounding (routed + shared expert outputs)."""
    B, H = partial.shape
    assert a.shape == (B, H) and b.shape == (B, H)
    assert partial.stride(1) == 1 and a.stride(1) == 1 and b.stride(1) == 1
    launch(residual_add_kernel, (B, cdiv(H, _ADD_BLOCK)), partial, a, b, H,
           partial.stride(0), a.stride(0), b.stride(0), BLOCK=_ADD_BLOCK, HAS_B=True, num_warps=4,
           delay_ns=delay_ns)
    return partial


def attn_res_logits(scores: torch.Tensor, n_rows: int, H: int) -> torch.Tensor:
    """Debug/test helper (torch, not graph-critical): the [B, n_rows] score logits that
    attn_res_combine derives from the partials."""
    G = scores.sum(1)
    R = G.shape[1]
    sumsq = torch.diagonal(G[:, :, :R], dim1=1, dim2=2)
    return (G[:, :, R] * torch.rsqrt(sumsq / H + 1e-6))[:, :n_rows]
