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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.k3.ops.common import cdiv, launch, next_pow2, pdl_trigger, pdl_wait, spin, to_dtype

EPS = 1e-6


def _block_h(H: int) -> int:
    # 512 columns x 8 rows: 4K fp32 per program; 14 chunks per token at H = 7168.
    return min(512, next_pow2(H))


def attn_res_scores_shape(B: int, H: int, r_max: int = 8) -> tuple[int, int, int, int]:
    R = next_pow2(r_max)
    return (B, cdiv(H, _block_h(H)), R, next_pow2(R + 1))


def alloc_attn_res_scores(bank: torch.Tensor) -> torch.Tensor:
    R_MAX, B, H = bank.shape
    return torch.empty(attn_res_scores_shape(B, H, R_MAX), device=bank.device, dtype=torch.float32)


@triton.jit
def attn_res_score_kernel(bank, addend, query, scores, n_rows, H,
                          stride_br, stride_bb, stride_ab,
                          R: tl.constexpr, W: tl.constexpr, BLOCK_H: tl.constexpr,
                          HAS_ADDEND: tl.constexpr,
                          USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    nc = tl.num_programs(1)
    hs = c * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < H
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    q = tl.load(query + hs, mask=hm, other=0.0).to(tl.float32)  # a weight: before the wait
    # Bank rows wait too: at a block boundary the previous kernel wrote the row that is
    # now the last completed block, so no row is safe to read early.
    pdl_wait(USE_PDL)
    last = n_rows - 1
    n_old = n_rows - 1 if HAS_ADDEND else n_rows
    base = bank + b.to(tl.int64) * stride_bb
    x = tl.load(base + rs[:, None] * stride_br + hs[None, :],
                mask=(rs[:, None] < n_old) & hm[None, :], other=0.0).to(tl.float32)
    if HAS_ADDEND:
        pp = base + last * stride_br + hs
        part = tl.load(pp, mask=hm, other=0.0).to(tl.float32) \
            + tl.load(addend + b.to(tl.int64) * stride_ab + hs, mask=hm, other=0.0).to(tl.float32)
        part = to_dtype(part, bank.dtype.element_ty)
        tl.store(pp, part, mask=hm)
        # Score the rounded value: exactly what residual_add + score would read back.
        x = tl.where(rs[:, None] == last, part.to(tl.float32)[None, :], x)
    acc = tl.zeros([R, W], dtype=tl.float32)
    acc = tl.where(ws[None, :] == R, tl.sum(x * q[None, :], 1)[:, None], acc)
    for s in range(n_rows):
        xs = tl.sum(tl.where(rs[:, None] == s, x, 0.0), 0)  # row s (exact: one non-zero term)
        acc = tl.where(ws[None, :] == s, tl.sum(x * xs[None, :], 1)[:, None], acc)
    tl.store(scores + ((b * nc + c) * R + rs[:, None]) * W + ws[None, :], acc)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def attn_res_combine_kernel(bank, scores, gamma, out, n_rows, H, NC,
                            stride_br, stride_bb, stride_ob, eps,
                            R: tl.constexpr, W: tl.constexpr, BLOCK_H: tl.constexpr,
                            USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    hs = c * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < H
    rs = tl.arange(0, R)
    ws = tl.arange(0, W)
    g = tl.load(gamma + hs, mask=hm, other=0.0).to(tl.float32)  # a weight: before the wait
    pdl_wait(USE_PDL)
    G = tl.zeros([R, W], dtype=tl.float32)
    for i in range(NC):
        G += tl.load(scores + ((b * NC + i) * R + rs[:, None]) * W + ws[None, :])
    diag = rs[:, None] == ws[None, :]
    sumsq = tl.sum(tl.where(diag, G, 0.0), 1)
    dots = tl.sum(tl.where(ws[None, :] == R, G, 0.0), 1)
    valid = rs < n_rows
    logit = tl.where(valid, dots * tl.rsqrt(sumsq / H + 1e-6), -float("inf"))
    p = tl.where(valid, tl.exp(logit - tl.max(logit, 0)), 0.0)
    p = p / tl.sum(p, 0)
    # ||sum_r p_r x_r||^2 = p^T G p: the output RMS without seeing the other chunks.
    p_w = tl.sum(tl.where(diag, p[:, None], 0.0), 0)
    sq = tl.sum(p * tl.sum(G * p_w[None, :], 1), 0)
    rstd = tl.rsqrt(tl.maximum(sq, 0.0) / H + eps)
    base = bank + b.to(tl.int64) * stride_bb + hs
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for r in range(n_rows):
        pr = tl.sum(tl.where(rs == r, p, 0.0), 0)
        acc += pr * tl.load(base + r * stride_br, mask=hm, other=0.0).to(tl.float32)
    tl.store(out + b.to(tl.int64) * stride_ob + hs, to_dtype(acc * rstd * g, out.dtype.element_ty),
             mask=hm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


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
                   addend: torch.Tensor | None = None, delay_ns: int = 0) -> torch.Tensor:
    """Partial scores of rows 0..n_rows-1 into `scores`; with `addend`, first
    bank[n_rows-1] += addend in place (the folded residual add)."""
    _check_bank(bank, n_rows)
    R_MAX, B, H = bank.shape
    assert scores.shape == attn_res_scores_shape(B, H, R_MAX) and scores.is_contiguous()
    assert scores.dtype == torch.float32 and query.shape == (H,) and query.is_contiguous()
    _, NC, R, W = scores.shape
    if addend is not None:
        assert addend.shape == (B, H) and addend.stride(1) == 1
    launch(attn_res_score_kernel, (B, NC), bank, addend if addend is not None else bank, query,
           scores, n_rows, H, bank.stride(0), bank.stride(1),
           addend.stride(0) if addend is not None else 0,
           R=R, W=W, BLOCK_H=_block_h(H), HAS_ADDEND=addend is not None, num_warps=4,
           delay_ns=delay_ns)
    return scores


def attn_res_combine(bank: torch.Tensor, n_rows: int, scores: torch.Tensor, gamma: torch.Tensor,
                     out: torch.Tensor, *, eps: float = EPS, delay_ns: int = 0) -> torch.Tensor:
    """out = RMSNorm(sum_r softmax(score)_r bank[r]) * gamma."""
    _check_bank(bank, n_rows)
    R_MAX, B, H = bank.shape
    assert scores.shape == attn_res_scores_shape(B, H, R_MAX) and scores.is_contiguous()
    assert gamma.shape == (H,) and gamma.is_contiguous()
    assert out.shape == (B, H) and out.stride(1) == 1
    _, NC, R, W = scores.shape
    launch(attn_res_combine_kernel, (B, NC), bank, scores, gamma, out, n_rows, H, NC,
           bank.stride(0), bank.stride(1), out.stride(0), eps,
           R=R, W=W, BLOCK_H=_block_h(H), num_warps=4, delay_ns=delay_ns)
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
