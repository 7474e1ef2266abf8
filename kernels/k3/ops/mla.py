"""MLA decode: q-concat + latent-cache insert, split-KV flash decoding, combine, gate.

Absorbed MLA: every head attends over the shared latent cache. A query row is
[q_nope_abs (DL = 512) | q_rope (DR = 64)] = 576 wide, a cache row [kv_latent | k_rope];
K is the whole row and V its first DL columns. The cache is paged (`cache` viewed as
[num_slots, 576], slot = page * PAGE + offset, PAGE = 64; `block_table[b, i]` is request
b's i-th page). Widths come from tensor shapes, so the tiny test model (64 + 16) works.

q-concat variants (seed 000, bit-identical outputs):
- split_rows=False (baseline): one 1-warp program per 576-wide row (NQ query rows + one
  cache row per token); every program waits first and triggers after its store.
- split_rows=True: each row split over 3 one-warp programs (192 elements each). Cache-row
  programs read only producer-independent data (slot_mapping; kv_latent / k_rope come from
  the joined side stream), so they never wait and never trigger (a no-wait program that
  triggered would release the consumer on our producer's behalf); `cache_wait=True` makes
  them wait when that premise does not hold. Query programs trigger right after their
  wait: the FMHA launches and runs its prologue while the last round trip is in flight
  (its own gdc_wait still waits for this grid to finish).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.k3.ops.common import DOT_F32, cdiv, dot, launch, next_pow2, pdl_trigger, pdl_wait, spin, to_dtype
from kernels.k3.ops.norm import rmsnorm

SPLIT = 3
FMHA_BLOCK_N = 32


# --------------------------------------------------------------------------------------
# q-concat (+ cache insert)
# --------------------------------------------------------------------------------------
@triton.jit
def _row_values(src_l, src_r, es, em, DL: tl.constexpr):
    # Element e of a 576-row: src_l[e] for e < DL, else src_r[e - DL]. A pure copy.
    is_l = es < DL
    a = tl.load(src_l + es, mask=em & is_l, other=0.0)
    r = tl.load(src_r + (es - DL), mask=em & (es >= DL), other=0.0)
    return tl.where(is_l, a, r)


@triton.jit
def mla_q_concat_kernel(q_nope, q_rope, q_out, kv_latent, k_rope, cache, slot_mapping,
                        stride_qnb, stride_qnh, stride_qrb, stride_qrh, stride_qob, stride_qoh,
                        stride_kl, stride_kr, stride_cache,
                        NQ: tl.constexpr, DL: tl.constexpr, DR: tl.constexpr,
                        SPLIT: tl.constexpr, PART: tl.constexpr, BLOCK: tl.constexpr,
                        HAS_CACHE: tl.constexpr, CACHE_WAIT: tl.constexpr,
                        USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1)
    r = pid // SPLIT
    lane = tl.arange(0, BLOCK)
    es = (pid % SPLIT) * PART + lane
    em = (lane < PART) & (es < DL + DR)
    if r < NQ:
        pdl_wait(USE_PDL)
        if SPLIT > 1:
            pdl_trigger(USE_PDL)  # early trigger: right after the wait
        val = _row_values(q_nope + b * stride_qnb + r * stride_qnh,
                          q_rope + b * stride_qrb + r * stride_qrh, es, em, DL)
        tl.store(q_out + b * stride_qob + r * stride_qoh + es, val, mask=em)
        spin(DELAY_NS)
        if SPLIT == 1:
            pdl_trigger(USE_PDL)
    else:
        if HAS_CACHE:
            # Split: nothing here depends on the producer, so no wait (and no trigger).
            if SPLIT == 1 or CACHE_WAIT:
                pdl_wait(USE_PDL)
            slot = tl.load(slot_mapping + b).to(tl.int64)
            val = _row_values(kv_latent + b * stride_kl, k_rope + b * stride_kr, es, em, DL)
            # slot < 0 marks a padded batch entry (CUDA-graph batch padding): skip it.
            tl.store(cache + slot * stride_cache + es, val, mask=em & (slot >= 0))
            spin(DELAY_NS)
            if SPLIT == 1:
                pdl_trigger(USE_PDL)


def _cache_rows(cache: torch.Tensor, width: int) -> torch.Tensor:
    rows = cache.view(-1, width)
    assert rows.stride(1) == 1
    return rows


def _launch_concat(B, NQ, DL, DR, split, q_nope, q_rope, q_out, kv_latent, k_rope, cache,
                   slot_mapping, has_cache, cache_wait, delay_ns):
    row = DL + DR
    part = cdiv(row, split)
    dummy_q = q_out if NQ else cache
    launch(mla_q_concat_kernel, (B, (NQ + int(has_cache)) * split),
           q_nope if NQ else dummy_q, q_rope if NQ else dummy_q, dummy_q,
           kv_latent if has_cache else dummy_q, k_rope if has_cache else dummy_q,
           cache if has_cache else dummy_q, slot_mapping if has_cache else dummy_q,
           q_nope.stride(0) if NQ else 0, q_nope.stride(1) if NQ else 0,
           q_rope.stride(0) if NQ else 0, q_rope.stride(1) if NQ else 0,
           q_out.stride(0) if NQ else 0, q_out.stride(1) if NQ else 0,
           kv_latent.stride(0) if has_cache else 0, k_rope.stride(0) if has_cache else 0,
           cache.stride(0) if has_cache else 0,
           NQ=NQ, DL=DL, DR=DR, SPLIT=split, PART=part, BLOCK=next_pow2(part),
           HAS_CACHE=has_cache, CACHE_WAIT=cache_wait, num_warps=1, delay_ns=delay_ns)


def mla_q_concat(q_nope_abs: torch.Tensor, q_rope: torch.Tensor, q_out: torch.Tensor, *,
                 cache: torch.Tensor | None = None, kv_latent: torch.Tensor | None = None,
                 k_rope: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None,
                 split_rows: bool = False, cache_wait: bool = False,
                 delay_ns: int = 0) -> torch.Tensor:
    """q_out[b, h] = [q_nope_abs[b, h] | q_rope[b, h]]; with `cache`, also
    cache_row[slot_mapping[b]] = [kv_latent[b] | k_rope[b]].

    With split_rows, the cache-row programs skip the PDL wait: kv_latent / k_rope must then
    be at least two launches old (written on a joined side stream, or by a KV chain issued
    before the Q chain). If the kernel launched right before this one wrote them (e.g. the
    kv_a RMSNorm immediately precedes on one stream), pass cache_wait=True."""
    B, NQ, DL = q_nope_abs.shape
    DR = q_rope.shape[2]
    assert q_rope.shape == (B, NQ, DR) and q_out.shape == (B, NQ, DL + DR)
    assert q_nope_abs.stride(2) == 1 and q_rope.stride(2) == 1 and q_out.stride(2) == 1
    rows = None
    if cache is not None:
        assert kv_latent.shape == (B, DL) and k_rope.shape == (B, DR) and slot_mapping.shape == (B,)
        assert kv_latent.stride(1) == 1 and k_rope.stride(1) == 1
        rows = _cache_rows(cache, DL + DR)
    _launch_concat(B, NQ, DL, DR, SPLIT if split_rows else 1, q_nope_abs, q_rope, q_out,
                   kv_latent, k_rope, rows, slot_mapping, cache is not None, cache_wait, delay_ns)
    return q_out


def mla_cache_insert(kv_latent: torch.Tensor, k_rope: torch.Tensor, cache: torch.Tensor,
                     slot_mapping: torch.Tensor, *, delay_ns: int = 0) -> torch.Tensor:
    """cache_row[slot_mapping[b]] = [kv_latent[b] | k_rope[b]] (the forked variant's write,
    on S1 behind the kv_a RMSNorm: one waiting 1-warp program per row)."""
    B, DL = kv_latent.shape
    DR = k_rope.shape[1]
    assert k_rope.shape == (B, DR) and slot_mapping.shape == (B,)
    assert kv_latent.stride(1) == 1 and k_rope.stride(1) == 1
    rows = _cache_rows(cache, DL + DR)
    _launch_concat(B, 0, DL, DR, 1, None, None, None, kv_latent, k_rope, rows, slot_mapping,
                   True, True, delay_ns)
    return cache


def mla_kv_norm_insert(kv_latent_in: torch.Tensor, weight: torch.Tensor, k_rope: torch.Tensor,
                       cache: torch.Tensor, slot_mapping: torch.Tensor, eps: float = 1e-6, *,
                       delay_ns: int = 0) -> torch.Tensor:
    """Variant mla_kv_norm_insert: cache_row[slot_mapping[b]] = [RMSNorm(kv_latent_in[b]) |
    k_rope[b]] in one launch, the kv_a RMSNorm storing where mla_cache_insert would copy its
    output to (the same bits: one rounding of the same fp32 math, then copies)."""
    B, DL = kv_latent_in.shape
    DR = k_rope.shape[1]
    assert k_rope.shape == (B, DR) and slot_mapping.shape == (B,)
    rmsnorm(kv_latent_in, weight, _cache_rows(cache, DL + DR), eps, rows=slot_mapping, tail=k_rope,
            delay_ns=delay_ns)
    return cache


# --------------------------------------------------------------------------------------
# Split-KV decode attention over the paged latent cache, and its combine.
# --------------------------------------------------------------------------------------
@triton.jit
def _split_range(seq_len, sp, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    # Splits own whole BLOCK_N tiles; trailing splits may be empty.
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = sp * split_len
    return start, tl.minimum(start + split_len, seq_len), split_len


@triton.jit
def _fmha_tile(q_l, q_r, kv, kr, tm, m, l, acc, qk_scale, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
               DOT_F32: tl.constexpr):
    """One BLOCK_N tile of the online softmax: (m, l, acc) updated by the tile's valid tokens.
    A tile with none (an empty split's first tile) leaves them as they were."""
    s = dot(q_l, tl.trans(kv), tl.zeros([BLOCK_H, BLOCK_N], tl.float32), DOT_F32)
    s = dot(q_r, tl.trans(kr), s, DOT_F32)
    s = tl.where(tm[None, :], s * qk_scale, -float("inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # nothing valid yet: no NaN from -inf - -inf
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = dot(to_dtype(p, kv.dtype), kv, acc * alpha[:, None], DOT_F32)
    return m_new, l, acc


@triton.jit
def mla_decode_fmha_kernel(q, cache, block_table, seq_lens, partial, lse, sm_scale,
                           stride_qb, stride_qh, stride_cache, stride_bt,
                           NH: tl.constexpr, DL: tl.constexpr, DR: tl.constexpr,
                           PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr,
                           BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr,
                           FIRST_EARLY: tl.constexpr, EARLY_KV: tl.constexpr,
                           USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    sp = tl.program_id(1)
    # Lengths and page tables are written by the host before the step: before the wait.
    seq_len = tl.load(seq_lens + b)
    start, end, _ = _split_range(seq_len, sp, NUM_SPLITS, BLOCK_N)
    hs = tl.arange(0, BLOCK_H)
    hm = hs < NH
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    if FIRST_EARLY:
        # Variant fmha_one_tile: the first tile's page look-ups (host data) before the wait;
        # with 64-token splits of one tile each that is the whole split's addressing.
        # fmha_early_kv: its cache rows too. Safe only where the step's new row was written
        # by a kernel that completed before our producer started (the KV leg's cache insert,
        # joined before q_concat), never by our producer itself (plan.fmha_early_kv checks).
        ts0 = start + tl.arange(0, BLOCK_N)
        tm0 = ts0 < end
        page0 = tl.load(block_table + b.to(tl.int64) * stride_bt + ts0 // PAGE, mask=tm0, other=0)
        rows0 = cache + (page0.to(tl.int64) * PAGE + ts0 % PAGE) * stride_cache
        if EARLY_KV:
            kv0 = tl.load(rows0[:, None] + dl[None, :], mask=tm0[:, None], other=0.0)
            kr0 = tl.load(rows0[:, None] + DL + dr[None, :], mask=tm0[:, None], other=0.0)
    pdl_wait(USE_PDL)
    qb = q + b.to(tl.int64) * stride_qb + hs[:, None] * stride_qh
    q_l = tl.load(qb + dl[None, :], mask=hm[:, None], other=0.0)
    q_r = tl.load(qb + DL + dr[None, :], mask=hm[:, None], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634  # softmax in base 2
    m = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DL], dtype=tl.float32)
    first = start
    if FIRST_EARLY:
        if not EARLY_KV:
            kv0 = tl.load(rows0[:, None] + dl[None, :], mask=tm0[:, None], other=0.0)
            kr0 = tl.load(rows0[:, None] + DL + dr[None, :], mask=tm0[:, None], other=0.0)
        m, l, acc = _fmha_tile(q_l, q_r, kv0, kr0, tm0, m, l, acc, qk_scale, BLOCK_H, BLOCK_N, DOT_F32)
        first = start + BLOCK_N
    for n0 in range(first, end, BLOCK_N):
        ts = n0 + tl.arange(0, BLOCK_N)
        tm = ts < end
        page = tl.load(block_table + b.to(tl.int64) * stride_bt + ts // PAGE, mask=tm, other=0)
        rows = cache + (page.to(tl.int64) * PAGE + ts % PAGE) * stride_cache
        kv = tl.load(rows[:, None] + dl[None, :], mask=tm[:, None], other=0.0)
        kr = tl.load(rows[:, None] + DL + dr[None, :], mask=tm[:, None], other=0.0)
        m, l, acc = _fmha_tile(q_l, q_r, kv, kr, tm, m, l, acc, qk_scale, BLOCK_H, BLOCK_N, DOT_F32)
    # Empty split (start >= end): zeros and lse = -inf, which the combine skips.
    has = l > 0.0
    o = acc / tl.where(has, l, 1.0)[:, None]
    lse_v = tl.where(has, m * 0.6931471805599453 + tl.log(tl.where(has, l, 1.0)), -float("inf"))
    row = (b * NH + hs) * NUM_SPLITS + sp
    tl.store(partial + row.to(tl.int64)[:, None] * DL + dl[None, :], o, mask=hm[:, None])
    tl.store(lse + row, lse_v, mask=hm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def mla_decode_combine_kernel(partial, lse, seq_lens, out, stride_ob, stride_oh,
                              NH: tl.constexpr, DL: tl.constexpr, NUM_SPLITS: tl.constexpr,
                              BLOCK_N: tl.constexpr,
                              USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(seq_lens + b)
    _, _, split_len = _split_range(seq_len, 0, NUM_SPLITS, BLOCK_N)
    n_valid = tl.cdiv(seq_len, tl.maximum(split_len, 1))  # the non-empty splits
    dl = tl.arange(0, DL)
    pdl_wait(USE_PDL)
    row = (b * NH + h) * NUM_SPLITS
    m = tl.full([], -float("inf"), tl.float32)
    l = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([DL], dtype=tl.float32)
    for s in range(n_valid):
        ls = tl.load(lse + row + s)
        m_new = tl.maximum(m, ls)
        a = tl.exp(m - m_new)
        w = tl.exp(ls - m_new)
        acc = acc * a + w * tl.load(partial + (row + s).to(tl.int64) * DL + dl)
        l = l * a + w
        m = m_new
    o = acc / tl.where(l > 0.0, l, 1.0)  # seq_len 0 (padded entry): zeros, not NaN
    tl.store(out + b.to(tl.int64) * stride_ob + h * stride_oh + dl, to_dtype(o, out.dtype.element_ty))
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def mla_decode_combine_wide_kernel(partial, lse, seq_lens, out, stride_ob, stride_oh,
                                   NH: tl.constexpr, DL: tl.constexpr, NUM_SPLITS: tl.constexpr,
                                   BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                                   USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Variant mla_combine_wide: one program per (token, head, BLOCK_D columns), every split
    # loaded at once. The baseline walks the splits one dependent load after another in a
    # program per head (~14 us at 65 splits on the H200, on the critical path).
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    seq_len = tl.load(seq_lens + b)
    _, _, split_len = _split_range(seq_len, 0, NUM_SPLITS, BLOCK_N)
    n_valid = tl.cdiv(seq_len, tl.maximum(split_len, 1))  # the non-empty splits
    ss = tl.arange(0, BLOCK_S)
    sm = ss < n_valid
    pdl_wait(USE_PDL)
    row = (b * NH + h) * NUM_SPLITS
    ls = tl.load(lse + row + ss, mask=sm, other=-float("inf"))
    m = tl.max(tl.where(sm, ls, -float("inf")), 0)
    m = tl.where(n_valid > 0, m, 0.0)  # no split: every weight 0, output 0
    w = tl.where(sm, tl.exp(ls - m), 0.0)
    l = tl.sum(w, 0)
    p = tl.load(partial + (row + ss).to(tl.int64)[:, None] * DL + d[None, :], mask=sm[:, None], other=0.0)
    o = tl.sum(p * w[:, None], 0) / tl.where(l > 0.0, l, 1.0)
    tl.store(out + b.to(tl.int64) * stride_ob + h * stride_oh + d, to_dtype(o, out.dtype.element_ty))
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


COMBINE_WIDE_D = 64  # columns per program: 8 programs per head at DL = 512


def mla_decode_fmha(q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, partial: torch.Tensor, lse: torch.Tensor,
                    sm_scale: float, *, num_splits: int, page_size: int = 64,
                    block_n: int = FMHA_BLOCK_N, first_early: bool = False, early_kv: bool = False,
                    delay_ns: int = 0) -> None:
    """Split-KV flash decoding: grid (B, num_splits), all heads of a token per program
    (they share the latent K/V). partial[b, h, s] = softmax-normalised output of split s,
    lse[b, h, s] its natural-log sum-exp (-inf when the split is empty).

    block_n: tokens per tile (the combine must be given the same). first_early (variant
    fmha_one_tile): the first tile's page look-ups before the PDL wait; early_kv (variant
    fmha_early_kv): its cache rows too, which the caller may ask for only where no kernel
    between the wait's producer and this one writes the cache. Same sums either way."""
    B, NH, ROW = q.shape
    DL = partial.shape[3]
    DR = ROW - DL
    assert partial.shape == (B, NH, num_splits, DL) and partial.is_contiguous()
    assert lse.shape == (B, NH, num_splits) and lse.is_contiguous()
    assert partial.dtype == torch.float32 and lse.dtype == torch.float32
    assert q.stride(2) == 1 and DL == next_pow2(DL) and DR == next_pow2(DR) and DR >= 16
    assert block_table.dtype == torch.int32 and block_table.stride(1) == 1 and seq_lens.shape == (B,)
    assert not early_kv or first_early, "early_kv loads the first tile early: it needs first_early"
    rows = _cache_rows(cache, ROW)
    launch(mla_decode_fmha_kernel, (B, num_splits), q, rows, block_table, seq_lens, partial, lse,
           float(sm_scale), q.stride(0), q.stride(1), rows.stride(0), block_table.stride(0),
           NH=NH, DL=DL, DR=DR, PAGE=page_size, NUM_SPLITS=num_splits,
           BLOCK_H=max(16, next_pow2(NH)), BLOCK_N=block_n, DOT_F32=DOT_F32,
           FIRST_EARLY=first_early, EARLY_KV=early_kv,
           # A 64-token tile (64 x 576 bf16) held for both products spills at 4 warps on sm_90.
           num_warps=8 if block_n >= 64 else 4, num_stages=2, delay_ns=delay_ns)


def mla_decode_combine(partial: torch.Tensor, lse: torch.Tensor, seq_lens: torch.Tensor,
                       out: torch.Tensor, *, wide: bool = False, block_n: int = FMHA_BLOCK_N,
                       delay_ns: int = 0) -> torch.Tensor:
    """out[b, h] = sum_s exp(lse_s - LSE) * partial[b, h, s] over the non-empty splits.

    wide=True (variant mla_combine_wide): the same sum over (token, head, 64-column)
    programs, all splits at once; fp32 sums in another order, so not bit-identical."""
    B, NH, S, DL = partial.shape
    assert out.shape == (B, NH, DL) and out.stride(2) == 1 and lse.shape == (B, NH, S)
    if wide:
        bd = min(COMBINE_WIDE_D, DL)
        assert DL % bd == 0
        launch(mla_decode_combine_wide_kernel, (B, NH, cdiv(DL, bd)), partial, lse, seq_lens, out,
               out.stride(0), out.stride(1), NH=NH, DL=DL, NUM_SPLITS=S, BLOCK_S=next_pow2(S),
               BLOCK_D=bd, BLOCK_N=block_n, num_warps=4, delay_ns=delay_ns)
        return out
    launch(mla_decode_combine_kernel, (B, NH), partial, lse, seq_lens, out, out.stride(0),
           out.stride(1), NH=NH, DL=DL, NUM_SPLITS=S, BLOCK_N=block_n, num_warps=2,
           delay_ns=delay_ns)
    return out


# --------------------------------------------------------------------------------------
# Output gate
# --------------------------------------------------------------------------------------
GATE_BLOCK = 512


@triton.jit
def gate_mul_kernel(o, g, out, N, stride_o, stride_g, stride_out, BLOCK: tl.constexpr,
                    USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nm = ns < N
    pdl_wait(USE_PDL)
    x = tl.load(o + b * stride_o + ns, mask=nm, other=0.0).to(tl.float32)
    gv = tl.load(g + b * stride_g + ns, mask=nm, other=0.0).to(tl.float32)
    tl.store(out + b * stride_out + ns, to_dtype(x * tl.sigmoid(gv), out.dtype.element_ty), mask=nm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def gate_mul(o: torch.Tensor, g: torch.Tensor, out: torch.Tensor, *, delay_ns: int = 0) -> torch.Tensor:
    """out = o * sigmoid(g) (MLA output gate; g is the g_proj output, possibly a view)."""
    B, N = o.shape
    assert g.shape == (B, N) and out.shape == (B, N)
    assert o.stride(1) == 1 and g.stride(1) == 1 and out.stride(1) == 1
    launch(gate_mul_kernel, (B, cdiv(N, GATE_BLOCK)), o, g, out, N, o.stride(0), g.stride(0),
           out.stride(0), BLOCK=GATE_BLOCK, num_warps=4, delay_ns=delay_ns)
    return out


# --------------------------------------------------------------------------------------
# Per-head products (variant mla_head_bmm): the absorb and V-up BMMs in the PDL chain
# --------------------------------------------------------------------------------------
@triton.jit
def head_bmm_kernel(a, w, out, g, stride_ah, stride_ab, stride_oh, stride_ob, stride_gb, B,
                    r_src, r_dst, stride_rsh, stride_rsb, stride_rdh, stride_rdb,
                    K: tl.constexpr, N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GATE: tl.constexpr, ROPE: tl.constexpr, DOT_F32: tl.constexpr,
                    USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # One program per (head, BLOCK_N output columns), every token of the batch in its MMA
    # rows. The weights are static, so the first K block of them is loaded before the wait.
    h = tl.program_id(0)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    bs = tl.arange(0, BLOCK_B)
    bm = bs < B
    ks = tl.arange(0, BLOCK_K)
    wh = w + h.to(tl.int64) * K * N
    w0 = tl.load(wh + ks[:, None] * N + ns[None, :])
    pdl_wait(USE_PDL)
    if ROPE > 0:
        # mla_absorb_concat: `out` is the FMHA's query rows, and each head's first program
        # also copies the head's rope part (ROPE wide) after the latent (q_concat's copy). Its
        # loads issue here, beside the first MMA's.
        if tl.program_id(1) == 0:
            rs = tl.arange(0, ROPE)
            rope = tl.load(r_src + h.to(tl.int64) * stride_rsh + bs[:, None].to(tl.int64) * stride_rsb + rs[None, :],
                           mask=bm[:, None], other=0.0)
            tl.store(r_dst + h.to(tl.int64) * stride_rdh + bs[:, None].to(tl.int64) * stride_rdb + rs[None, :],
                     rope, mask=bm[:, None])
    ah = a + h.to(tl.int64) * stride_ah + bs[:, None].to(tl.int64) * stride_ab
    acc = dot(tl.load(ah + ks[None, :], mask=bm[:, None], other=0.0), w0,
              tl.zeros([BLOCK_B, BLOCK_N], tl.float32), DOT_F32)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        wk = tl.load(wh + (k0 + ks)[:, None] * N + ns[None, :])
        acc = dot(tl.load(ah + (k0 + ks)[None, :], mask=bm[:, None], other=0.0), wk, acc, DOT_F32)
    if GATE:
        # mla_gate_in_v: the output gate, out = (a @ w) * sigmoid(g), rounded once.
        gv = tl.load(g + bs[:, None].to(tl.int64) * stride_gb + h * N + ns[None, :], mask=bm[:, None], other=0.0)
        acc = acc * tl.sigmoid(gv.to(tl.float32))
    o = out + h.to(tl.int64) * stride_oh + bs[:, None].to(tl.int64) * stride_ob + ns[None, :]
    tl.store(o, to_dtype(acc, out.dtype.element_ty), mask=bm[:, None])
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


#: Output columns per program: 8 column blocks per head of the absorb (N = 512), 8 of V-up's
#: (N = 128), so 96 programs of about 16 KB of weights each at the K3 shapes.
HEAD_BMM_N = {512: 64, 128: 16}
#: K per block: the whole K where a program's weight tile stays within 16 KB.
HEAD_BMM_TILE_BYTES = 16384


def head_bmm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, gate: torch.Tensor | None = None,
             rope: tuple[torch.Tensor, torch.Tensor] | None = None, delay_ns: int = 0) -> torch.Tensor:
    """out[h] = a[h] @ w[h] for a [NH, B, K], w [NH, K, N] (contiguous), out [NH, B, N]; a
    and out may be strided views (the token and head axes in either order). With `gate`
    ([B, NH * N], variant mla_gate_in_v) out = (a @ w) * sigmoid(gate), gate_mul's product
    in this kernel's epilogue. fp32 accumulation, one bf16 rounding: near torch.bmm (and
    its gate_mul), not bit for bit. B <= 16 (the batch rides in the MMA's rows).
    With `rope` = (src, dst), both [NH, B, R] views (variant mla_absorb_concat: q_b's rope
    part and the query rows' tail), the kernel also copies src into dst."""
    NH, B, K = a.shape
    N = w.shape[2]
    assert w.shape == (NH, K, N) and w.is_contiguous() and out.shape == (NH, B, N)
    assert a.stride(2) == 1 and out.stride(2) == 1 and B <= 16
    bn = HEAD_BMM_N.get(N, min(64, next_pow2(N)))
    bk = min(K, max(16, HEAD_BMM_TILE_BYTES // (2 * bn)))
    assert N % bn == 0 and K % bk == 0 and bk == next_pow2(bk)
    if gate is not None:
        assert gate.shape == (B, NH * N) and gate.stride(1) == 1
    r_src, r_dst = rope if rope is not None else (out, out)
    R = r_src.shape[2] if rope is not None else 0
    if rope is not None:
        assert r_src.shape == r_dst.shape == (NH, B, R) and R == next_pow2(R)
        assert r_src.stride(2) == 1 and r_dst.stride(2) == 1
    launch(head_bmm_kernel, (NH, N // bn), a, w, out, gate if gate is not None else out,
           a.stride(0), a.stride(1), out.stride(0), out.stride(1), gate.stride(0) if gate is not None else 0, B,
           r_src, r_dst, r_src.stride(0), r_src.stride(1), r_dst.stride(0), r_dst.stride(1),
           K=K, N=N, BLOCK_B=16, BLOCK_N=bn, BLOCK_K=bk, GATE=gate is not None, ROPE=R, DOT_F32=DOT_F32,
           num_warps=4, delay_ns=delay_ns)
    return out
