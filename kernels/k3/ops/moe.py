"""Routed MoE decode: router top-k, align (group pairs by expert), grouped GEMM, SiTU, sum.

Per rank: E = 896 experts, top-16 (sizes come from shapes / arguments, so tests can run
64 experts top-4). A "pair" is p = b * top_k + k, token b's k-th routed expert.

Router (sigmoid + correction bias): s = sigmoid(logit); the top-k of s + bias are selected
(highest first, ties to the lower expert id) and weighted by s, renormalised, times
`scale`. Selection runs on a packed int64 key = order-preserving bits of (s + bias) << 16 |
(65535 - id), so one max-reduction per round yields both the winner and the tie-break,
and the single-CTA and multi-pass routers agree bit for bit (weights are summed in
selection order in both).

Grouped GEMM: one program per (segment, N-block); a segment is one expert's run of pairs
in `sorted_pairs`, so each weight tile is read once for all of them. The weight stream is
the step's dominant cost (~130 MB per MoE layer at B = 1): swap-AB dot (weights are the
M side, the handful of pairs the N side), K loop software-pipelined (num_stages), several
programs per expert along N so all SMs stream.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.k3.ops.common import (
    DOT_F32,
    cdiv,
    dot,
    l2_prefetch,
    launch,
    next_pow2,
    pdl_trigger,
    pdl_wait,
    prefetch_args,
    spin,
    tanh,
    to_dtype,
)
from kernels.k3.ops.gemv import SPLIT_MAX, SplitK, skinny_k_rows, split_k_reduce
from kernels.k3.ops.norm import MAX_N

ID_BITS = 16  # expert ids < 65536 in the packed key
ROUTER_GROUP = 128  # multipass: experts per pass-1 program (7 groups at E = 896)


# --------------------------------------------------------------------------------------
# Router
# --------------------------------------------------------------------------------------
@triton.jit
def _packed_key(key, ids):
    # Order-preserving map of fp32 to [0, 2^32), then the inverted id in the low 16 bits:
    # a larger packed key = a larger score, or the same score and a lower id.
    bits = key.to(tl.int32, bitcast=True)
    b64 = bits.to(tl.int64)
    ordered = tl.where(bits >= 0, b64 + 2147483648, -1 - b64)
    return ordered * 65536 + (65535 - ids).to(tl.int64)


@triton.jit
def _pick_max(k1, s1, k2, s2):
    gt = k1 > k2
    return tl.where(gt, k1, k2), tl.where(gt, s1, s2)


@triton.jit
def _compare_exchange(k1, s1, k2, s2):
    # (the larger, the smaller) of two (key, score) pairs
    gt = k1 > k2
    return tl.where(gt, k1, k2), tl.where(gt, s1, s2), tl.where(gt, k2, k1), tl.where(gt, s2, s1)


@triton.jit
def _merge_top4(a1, x1, a2, x2, a3, x3, a4, x4, b1, y1, b2, y2, b3, y3, b4, y4):
    # The top 4 of two descending 4-lists, descending: a1..a4, b4..b1 is bitonic, so the
    # pairwise maxima against b reversed are the top half (bitonic too), which two
    # half-cleaners sort. Keys are distinct (the id is in the low bits), so this is the
    # same set and order as four argmax rounds, whatever order the reduction combines in.
    m1, t1 = _pick_max(a1, x1, b4, y4)
    m2, t2 = _pick_max(a2, x2, b3, y3)
    m3, t3 = _pick_max(a3, x3, b2, y2)
    m4, t4 = _pick_max(a4, x4, b1, y1)
    m1, t1, m3, t3 = _compare_exchange(m1, t1, m3, t3)
    m2, t2, m4, t4 = _compare_exchange(m2, t2, m4, t4)
    m1, t1, m2, t2 = _compare_exchange(m1, t1, m2, t2)
    m3, t3, m4, t4 = _compare_exchange(m3, t3, m4, t4)
    return m1, t1, m2, t2, m3, t3, m4, t4


@triton.jit
def _select_topk(packed, s, K: tl.constexpr, KP: tl.constexpr, BY4: tl.constexpr = False,
                 SORTED: tl.constexpr = False, base=0):
    """K rounds of argmax over packed keys (-1 = empty). Returns the keys and scores in
    selection order and their sum, accumulated in that order (bit-stable across paths).

    BY4 (variant router_top4): each round's reduction keeps the top 4, so a quarter of the
    rounds (cross-warp exchanges) for more compares each. Same keys, scores and sum, bit for
    bit. On an H100 the router with the align took 5.84 against 6.21 us a call alone
    (kernels/README.md, round twenty-three), though top-16 took 6.0 us against top-1's 1.35.

    SORTED (variant router_bitonic): no rounds. One bitonic top-k network over the keys
    (sort blocks of KP, then halve by pairwise maxima), whose exchanges are mostly shuffles and
    run for all keys at once, not one reduction after another. Keys are distinct, so the KP it
    keeps, descending, are the rounds' picks in their order; the scores are gathered from s at
    each pick's position (its id - base: s must be laid out by id) and summed in that order:
    bit for bit. Needs a power-of-two packed (BLOCK_E) >= KP."""
    kk = tl.arange(0, KP)
    if SORTED:
        keys = tl.topk(packed, KP)
        pos = tl.where(keys >= 0, (65535 - (keys & 65535)).to(tl.int32) - base, 0)
        vals = tl.gather(s, pos, 0)
        tot = tl.zeros([], dtype=tl.float32)
        for i in tl.static_range(K):  # the rounds' order: a sum tree would round differently
            tot += tl.sum(tl.where(kk == i, vals, 0.0))  # + 0.0 leaves a positive score's bits
        return keys, vals, tot
    keys = tl.full([KP], -1, tl.int64)
    vals = tl.zeros([KP], dtype=tl.float32)
    tot = tl.zeros([], dtype=tl.float32)
    if BY4:
        none = tl.full(packed.shape, -1, tl.int64)
        zero = tl.zeros(s.shape, dtype=tl.float32)
        for r in range((K + 3) // 4):
            top = tl.reduce((packed, s, none, zero, none, zero, none, zero), 0, _merge_top4)
            for j in tl.static_range(4):
                pm, ps = top[2 * j], top[2 * j + 1]
                at = (kk == 4 * r + j) & (4 * r + j < K)
                keys = tl.where(at, pm, keys)
                vals = tl.where(at, ps, vals)
                tot += tl.where(4 * r + j < K, ps, 0.0)  # + 0.0 leaves a positive sum's bits
                packed = tl.where(packed == pm, -1, packed)
        return keys, vals, tot
    for i in range(K):
        pm, ps = tl.reduce((packed, s), 0, _pick_max)
        keys = tl.where(kk == i, pm, keys)
        vals = tl.where(kk == i, ps, vals)
        tot += ps
        packed = tl.where(packed == pm, -1, packed)
    return keys, vals, tot


@triton.jit
def _store_topk(keys, vals, tot, topk_ids, topk_w, b, scale, K: tl.constexpr, KP: tl.constexpr):
    kk = tl.arange(0, KP)
    ids = (65535 - (keys & 65535)).to(tl.int32)
    tl.store(topk_ids + b * K + kk, ids, mask=kk < K)
    tl.store(topk_w + b * K + kk, vals / tot * scale, mask=kk < K)


@triton.jit
def moe_router_kernel(logits, bias, topk_ids, topk_w, E, stride_l, scale,
                      sorted_pairs, seg_expert, seg_start, num_segs,
                      K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr, ALIGN: tl.constexpr,
                      BY4: tl.constexpr, SORTED: tl.constexpr, USE_PDL: tl.constexpr,
                      DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    es = tl.arange(0, BLOCK_E)
    em = es < E
    bv = tl.load(bias + es, mask=em, other=0.0).to(tl.float32)  # a weight: before the wait
    pdl_wait(USE_PDL)
    s = tl.sigmoid(tl.load(logits + b.to(tl.int64) * stride_l + es, mask=em, other=0.0).to(tl.float32))
    _route_token(s, bv, es, em, b, topk_ids, topk_w, scale, sorted_pairs, seg_expert, seg_start, num_segs,
                 E, K, KP, ALIGN, BY4, SORTED)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def _route_token(s, bv, es, em, b, topk_ids, topk_w, scale, sorted_pairs, seg_expert, seg_start, num_segs,
                 E, K: tl.constexpr, KP: tl.constexpr, ALIGN: tl.constexpr, BY4: tl.constexpr = False,
                 SORTED: tl.constexpr = False):
    """Token b's top-k of s + bias (s = sigmoid(logits) [BLOCK_E]), stored; with ALIGN also
    moe_align's segments of it."""
    packed = tl.where(em, _packed_key(s + bv, es), -1)
    keys, vals, tot = _select_topk(packed, s, K, KP, BY4, SORTED)  # s is laid out by id: es from 0
    _store_topk(keys, vals, tot, topk_ids, topk_w, b, scale, K, KP)
    if ALIGN:
        # Variant router_align_fused (one token): its K experts are distinct, so moe_align's
        # segments are the ids sorted, one pair each. The same key as moe_align's sort
        # (expert * BLOCK_P + pair, BLOCK_P = KP at B = 1): the same arrays, bit for bit.
        kk = tl.arange(0, KP)
        ids = (65535 - (keys & 65535)).to(tl.int32)
        skey = tl.sort(tl.where(kk < K, ids * KP + kk, E * KP + kk))
        tl.store(sorted_pairs + kk, skey % KP, mask=kk < K)
        tl.store(seg_expert + kk, skey // KP, mask=kk < K)
        tl.store(seg_start + kk, kk, mask=kk < K)
        tl.store(seg_start + K, K)
        tl.store(num_segs, K)


@triton.jit
def moe_router_group_kernel(logits, bias, scratch, E, stride_l,
                            K: tl.constexpr, KP: tl.constexpr, GS: tl.constexpr, BY4: tl.constexpr,
                            SORTED: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Pass 1: the top-K candidates of one group of GS experts -> scratch[b, g, :, (key, s)].
    b = tl.program_id(0)
    g = tl.program_id(1)
    ng = tl.num_programs(1)
    es = g * GS + tl.arange(0, GS)
    em = es < E
    bv = tl.load(bias + es, mask=em, other=0.0).to(tl.float32)
    pdl_wait(USE_PDL)
    s = tl.sigmoid(tl.load(logits + b.to(tl.int64) * stride_l + es, mask=em, other=0.0).to(tl.float32))
    packed = tl.where(em, _packed_key(s + bv, es), -1)
    keys, vals, _ = _select_topk(packed, s, K, KP, BY4, SORTED, g * GS)
    kk = tl.arange(0, KP)
    dst = scratch + ((b * ng + g) * K + kk) * 2
    tl.store(dst, keys, mask=kk < K)
    tl.store(dst + 1, vals.to(tl.int32, bitcast=True).to(tl.int64), mask=kk < K)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def moe_router_merge_kernel(scratch, topk_ids, topk_w, NC, scale,
                            K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, BY4: tl.constexpr,
                            USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Pass 2: the global top-K is inside the union of the groups' top-K (same total order).
    b = tl.program_id(0)
    cs = tl.arange(0, BLOCK_C)
    cm = cs < NC
    pdl_wait(USE_PDL)
    src = scratch + (b * NC + cs) * 2
    packed = tl.load(src, mask=cm, other=-1)
    s = tl.load(src + 1, mask=cm, other=0).to(tl.int32).to(tl.float32, bitcast=True)
    keys, vals, tot = _select_topk(packed, s, K, KP, BY4)  # candidates are not laid out by id
    _store_topk(keys, vals, tot, topk_ids, topk_w, b, scale, K, KP)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def router_scratch_shape(B: int, num_experts: int, top_k: int,
                         group_size: int = ROUTER_GROUP) -> tuple[int, int, int, int]:
    return (B, cdiv(num_experts, group_size), top_k, 2)


def moe_router(logits: torch.Tensor, bias: torch.Tensor, topk_ids: torch.Tensor,
               topk_w: torch.Tensor, *, scale: float = 1.0, multipass: bool = False,
               scratch: torch.Tensor | None = None, group_size: int = ROUTER_GROUP,
               align: tuple[torch.Tensor, ...] | None = None, by4: bool = False,
               sort: bool = False, delay_ns: int = 0) -> None:
    """Sigmoid + bias top-k routing. multipass=True: pass 1 per (token, group of
    `group_size` experts), pass 2 merges; `scratch` (int64, `router_scratch_shape`) is
    allocated when not given (pass it under graph capture). Same ids and weights.

    align=(sorted_pairs, seg_expert, seg_start, num_segs), one token, single pass (variant
    router_align_fused): also writes what `moe_align` would, bit for bit.

    by4 (variant router_top4): every selection round keeps the top 4, not 1; the same ids,
    weights and segments, bit for bit.

    sort (variant router_bitonic): the selection is one bitonic top-k network, no rounds (the
    single pass and multipass's groups; its merge keeps its rounds, as its candidates are not
    laid out by id); the same ids, weights and segments, bit for bit. It takes precedence
    over by4 where both are given."""
    B, E = logits.shape
    _, K = topk_ids.shape
    assert E < (1 << ID_BITS) and logits.stride(1) == 1 and bias.shape == (E,)
    assert topk_ids.shape == (B, K) and topk_w.shape == (B, K)
    assert topk_ids.is_contiguous() and topk_w.is_contiguous()
    assert topk_ids.dtype == torch.int32 and topk_w.dtype == torch.float32 and K <= E
    KP = next_pow2(K)
    if align is not None:
        assert B == 1 and not multipass and len(align) == 4 and K == KP
        sp, se, ss, ns = align
        assert sp.shape == (K,) and se.shape == (K,) and ss.shape == (K + 1,) and ns.shape == (1,)
        assert all(t.dtype == torch.int32 and t.is_contiguous() for t in align)
    if not multipass:
        sp, se, ss, ns = align if align is not None else (topk_ids,) * 4  # unused without ALIGN
        launch(moe_router_kernel, (B,), logits, bias, topk_ids, topk_w, E, logits.stride(0),
               float(scale), sp, se, ss, ns, K=K, KP=KP, BLOCK_E=next_pow2(E),
               ALIGN=align is not None, BY4=by4, SORTED=sort, num_warps=4, delay_ns=delay_ns)
        return
    assert group_size == next_pow2(group_size) and group_size >= K
    shape = router_scratch_shape(B, E, K, group_size)
    if scratch is None:
        scratch = torch.empty(shape, device=logits.device, dtype=torch.int64)
    assert scratch.shape == shape and scratch.dtype == torch.int64 and scratch.is_contiguous()
    NG = shape[1]
    # The delay applies to the last kernel of the pair (the one whose stores the consumer reads).
    launch(moe_router_group_kernel, (B, NG), logits, bias, scratch, E, logits.stride(0),
           K=K, KP=KP, GS=group_size, BY4=by4, SORTED=sort, num_warps=4)
    launch(moe_router_merge_kernel, (B,), scratch, topk_ids, topk_w, NG * K, float(scale),
           K=K, KP=KP, BLOCK_C=next_pow2(NG * K), BY4=by4, num_warps=4, delay_ns=delay_ns)


# --------------------------------------------------------------------------------------
# The front GEMM with the router inside (variant router_in_front, one token)
# --------------------------------------------------------------------------------------
#: (block_n, block_k, num_warps, num_stages) and (router splits, rest splits): the best of
#: bench_k3_ops.py's router_in_front sweep on the H200 (24.1 us against 27.0 for c20's
#: forked head, alone), which was also the faster of the two best in the step (8 warps:
#: +0.35 ms). The router columns split finer than the rest, so their programs end early.
FRONT_ROUTER_CONFIG = (64, 128, 4, 4)
FRONT_ROUTER_SPLITS = (8, 2)


@triton.jit
def moe_front_router_kernel(x, w, rest, logits, bias, topk_ids, topk_w, sorted_pairs, seg_expert,
                            seg_start, num_segs, ws, tickets, done, K, N, E, stride_w, scale,
                            k_per_r, k_per_f,
                            NB_R: tl.constexpr, NB_F: tl.constexpr, S_R: tl.constexpr, S_F: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                            TOP_K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr,
                            DOT_F32: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Programs 0 .. NB_R*S_R-1 stream the router columns [0, E) (K split S_R ways: short
    # programs, scheduled first, so they end while the rest still streams); the others
    # the rest [E, N) (K split S_F ways). The last router program to complete its column
    # block's logits, of all NB_R, routes: the top-k and the align run inside the GEMM,
    # and the grouped GEMM after it waits for this one grid (no side stream, no join).
    BLOCK_M: tl.constexpr = 16
    pid = tl.program_id(0)
    router = pid < NB_R * S_R
    q = tl.where(router, pid, pid - NB_R * S_R)
    nb = tl.where(router, NB_R, NB_F)
    block = tl.where(router, q % nb, NB_R + q % nb)  # absolute column block (E % BLOCK_N == 0)
    split = q // nb
    k_first = split * tl.where(router, k_per_r, k_per_f)
    k_end = tl.minimum(k_first + tl.where(router, k_per_r, k_per_f), K)
    ns = block * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = ns < N
    ms = tl.arange(0, BLOCK_M)
    mm = ms < 1
    mask = mm[:, None] & nm[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    pdl_wait(USE_PDL)  # x is the producer's output
    acc = skinny_k_rows(acc, x + ms[:, None] * 0, w + ns[None, :], mm, nm, K, k_first, k_end, stride_w,
                        BLOCK_K, EVEN_K, DOT_F32)
    routes = pid < 0
    if router:
        total, last = split_k_reduce(acc, ws, tickets, split, block, ms, ns, mask, N, BLOCK_M, S_R)
        if last:
            tl.store(logits + ms[:, None] * 0 + ns[None, :], to_dtype(total, logits.dtype.element_ty), mask=mask)
            # The split-K ticket's pattern again, over the column blocks: the last one routes.
            tl.debug_barrier()
            arrived = tl.atomic_add(done, 1, sem="acq_rel", scope="gpu")
            tl.debug_barrier()
            routes = arrived == NB_R - 1
    else:
        if S_F > 1:
            total, last = split_k_reduce(acc, ws, tickets, split, block, ms, ns, mask, N, BLOCK_M, S_F)
            mask = mask & last
        else:
            total = acc
        tl.store(rest + ms[:, None] * 0 + (ns - E)[None, :], to_dtype(total, rest.dtype.element_ty), mask=mask)
    if routes:
        es = tl.arange(0, BLOCK_E)
        em = es < E
        bv = tl.load(bias + es, mask=em, other=0.0).to(tl.float32)
        lg = tl.load(logits + es, mask=em, other=0.0, cache_modifier=".cg")
        _route_token(tl.sigmoid(lg.to(tl.float32)), bv, es, em, 0, topk_ids, topk_w, scale,
                     sorted_pairs, seg_expert, seg_start, num_segs, E, TOP_K, KP, True)
        tl.atomic_xchg(done, 0, sem="relaxed", scope="gpu")
    spin(DELAY_NS)
    pdl_trigger(USE_PDL)


def alloc_front_router_done(device) -> torch.Tensor:
    """moe_front_router's arrival counter (int32, zero; each launch's last router program
    resets it). One per stream of serialised launches."""
    return torch.zeros(1, device=device, dtype=torch.int32)


def moe_front_router(x: torch.Tensor, front: torch.Tensor, rest: torch.Tensor, logits: torch.Tensor,
                     bias: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                     align: tuple[torch.Tensor, ...], split_k: SplitK, done: torch.Tensor, *,
                     scale: float = 1.0, config: tuple[int, int, int, int] | None = None,
                     splits: tuple[int, int] | None = None, delay_ns: int = 0) -> None:
    """Variant router_in_front, one token: rest = x @ front[:, E:], logits = x @ front[:, :E]
    (E = logits' width, the router columns first), then the single-pass router with the
    align (router_align_fused) on those logits, in one launch. The logits' fp32 sums run
    split over K (another order than one program's): near the GEMV's, not its bits; the
    routing from them is what moe_router(logits, ..., align=align) gives (bit for bit)."""
    B, K = x.shape
    N = front.shape[1]
    E = logits.shape[1]
    TK = topk_ids.shape[1]
    # Looked up at the call, not bound at import: bench_k3_step.py times candidates in the step.
    bn, bk, warps, stages = config or FRONT_ROUTER_CONFIG
    bn = math.gcd(bn, E)  # column blocks must not straddle the router's edge (small test E)
    s_r, s_f = splits or FRONT_ROUTER_SPLITS
    assert B == 1 and front.shape[0] == K and front.stride(1) == 1 and x.stride(1) == 1
    assert bn >= 16 and rest.shape == (1, N - E) and rest.stride(1) == 1 and logits.is_contiguous()
    assert bias.shape == (E,) and topk_ids.shape == (1, TK) and topk_w.shape == (1, TK) and TK == next_pow2(TK)
    assert topk_ids.dtype == torch.int32 and topk_w.dtype == torch.float32
    assert len(align) == 4 and all(t.dtype == torch.int32 and t.is_contiguous() for t in align)
    assert done.shape == (1,) and done.dtype == torch.int32
    k_blocks = cdiv(K, bk)
    k_per_r, k_per_f = (cdiv(k_blocks, s) * bk for s in (s_r, s_f))  # whole K blocks per split
    s_r, s_f = cdiv(K, k_per_r), cdiv(K, k_per_f)
    assert max(s_r, s_f) <= SPLIT_MAX and split_k.partials.numel() >= max(s_r, s_f) * 16 * N
    nb_r, nb_f = E // bn, cdiv(N - E, bn)
    assert split_k.tickets.numel() >= nb_r + nb_f
    launch(moe_front_router_kernel, (nb_r * s_r + nb_f * s_f,), x, front, rest, logits, bias, topk_ids, topk_w,
           *align, split_k.partials, split_k.tickets, done, K, N, E, front.stride(0), float(scale),
           k_per_r, k_per_f, NB_R=nb_r, NB_F=nb_f, S_R=s_r, S_F=s_f, BLOCK_N=bn, BLOCK_K=bk,
           EVEN_K=K % bk == 0, TOP_K=TK, KP=TK, BLOCK_E=next_pow2(E), DOT_F32=DOT_F32, num_warps=warps,
           num_stages=stages, delay_ns=delay_ns)


# --------------------------------------------------------------------------------------
# Align: counting sort of the (token, k) pairs by expert (one program).
# --------------------------------------------------------------------------------------
@triton.jit
def moe_align_kernel(topk_ids, sorted_pairs, seg_expert, seg_start, num_segs, P, E, G,
                     BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr,
                     USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    ps = tl.arange(0, BLOCK_P)
    pm = ps < P
    pdl_wait(USE_PDL)
    e = tl.load(topk_ids + ps, mask=pm, other=0)
    e = tl.where(pm, e, E)  # padding -> bin E, which sorts last and is not a segment
    # Stable by construction: the key orders by expert, then by pair index.
    skey = tl.sort(e * BLOCK_P + ps)
    tl.store(sorted_pairs + ps, skey % BLOCK_P, mask=pm)
    counts = tl.histogram(e, BLOCK_E)
    es = tl.arange(0, BLOCK_E)
    nz = (counts > 0) & (es < E)
    start = tl.cumsum(counts, 0) - counts
    nzi = nz.to(tl.int32)
    seg = tl.cumsum(nzi, 0) - nzi
    nseg = tl.sum(nzi, 0)
    tl.store(seg_expert + seg, es, mask=nz)
    tl.store(seg_start + seg, start, mask=nz)
    gs = tl.arange(0, BLOCK_G)
    tail = gs >= nseg
    tl.store(seg_expert + gs, tl.full([BLOCK_G], -1, tl.int32), mask=tail & (gs < G))
    tl.store(seg_start + gs, tl.full([BLOCK_G], 0, tl.int32) + P, mask=tail & (gs <= G))
    tl.store(num_segs, nseg)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def moe_align(topk_ids: torch.Tensor, num_experts: int, sorted_pairs: torch.Tensor,
              seg_expert: torch.Tensor, seg_start: torch.Tensor, num_segs: torch.Tensor, *,
              delay_ns: int = 0) -> None:
    """Group the B*top_k pairs by expert (ascending expert, then pair index).

    sorted_pairs[P]: pair ids; segment i < num_segs[0] covers
    sorted_pairs[seg_start[i]:seg_start[i+1]], all routed to seg_expert[i]. Entries past
    num_segs: seg_expert = -1, seg_start = P. G = min(P, num_experts)."""
    B, K = topk_ids.shape
    P = B * K
    G = min(P, num_experts)
    assert topk_ids.is_contiguous() and topk_ids.dtype == torch.int32
    assert sorted_pairs.shape == (P,) and seg_expert.shape == (G,) and seg_start.shape == (G + 1,)
    assert num_segs.shape == (1,)
    for t in (sorted_pairs, seg_expert, seg_start, num_segs):
        assert t.dtype == torch.int32 and t.is_contiguous()
    BLOCK_P = next_pow2(P)
    assert num_experts * BLOCK_P + BLOCK_P < 2 ** 31
    launch(moe_align_kernel, (1,), topk_ids, sorted_pairs, seg_expert, seg_start, num_segs,
           P, num_experts, G, BLOCK_P=BLOCK_P, BLOCK_E=next_pow2(num_experts + 1),
           BLOCK_G=next_pow2(G + 1), num_warps=4, delay_ns=delay_ns)


# --------------------------------------------------------------------------------------
# Grouped GEMM over segments
# --------------------------------------------------------------------------------------
@triton.jit
def _situ(g, u):
    # SiTU of the gate and up halves (situ_mul and the fused down GEMM share it).
    return (4.0 * tanh(g * 0.25) * tl.sigmoid(g)) * (25.0 * tanh(u * 0.04))


@triton.jit
def moe_grouped_gemm_kernel(x, w, sorted_pairs, seg_expert, seg_start, num_segs, out,
                            N, K, stride_x, stride_we, stride_wn, stride_out, sum_w, stride_sum,
                            TOP_K: tl.constexpr, X_PER_TOKEN: tl.constexpr, ACT_IN: tl.constexpr,
                            SUM_OUT: tl.constexpr, ACT_OUT: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
                            USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr, PRELOAD: tl.constexpr = 0,
                            w_desc=None, TMA: tl.constexpr = False):
    # TMA (variant moe_grouped_tma): the weight tiles stream through w_desc, a host tensor
    # descriptor over the bank as [E * N, K] rows in [BLOCK_N, BLOCK_K] tiles (EVEN_N and
    # EVEN_K, not with ACT_OUT's interleaved rows): one bulk copy per tile, no per-thread
    # address math or register staging. The same tiles, so the same sums, bit for bit.
    g = tl.program_id(0)
    if ACT_OUT:
        # Variant situ_in_gate_up: w's N rows are gate | up; the tile takes BLOCK_N / 2 gate rows
        # and the matching up rows, interleaved (even: gate, odd: up), so that the epilogue
        # holds both halves of its outputs and stores SiTU of them ([P, N / 2]).
        HALF: tl.constexpr = BLOCK_N // 2
        i = tl.arange(0, BLOCK_N)
        hc = tl.program_id(1) * HALF + i // 2
        ns = (i % 2) * (N // 2) + hc
        nm = hc < N // 2
    else:
        ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = ns < N
    kr = tl.arange(0, BLOCK_K)
    if PRELOAD > 0:
        # Variant moe_weights_ahead: this program's expert and its first PRELOAD weight blocks
        # load before the wait, while the producer (a short kernel, or the GEMM before it) still
        # runs. EVEN_N and EVEN_K only. Unsound: it assumed the routing finished before this
        # launch (the router leg joins main before the gate|up GEMM), but in the captured step
        # it is not, and the held blocks can be a stale expert's (kernels/README.md, round
        # twenty-one): the model leaves the reference with it, and is c72 bit for bit without.
        active = g < tl.load(num_segs)
        e = tl.load(seg_expert + g, mask=active, other=0).to(tl.int64)
        w_rows = w + e * stride_we + ns[:, None] * stride_wn
        w0 = tl.load(w_rows + kr[None, :], mask=active, other=0.0)
        if PRELOAD > 1:
            w1 = tl.load(w_rows + BLOCK_K + kr[None, :], mask=active, other=0.0)
        if PRELOAD > 2:
            w2 = tl.load(w_rows + 2 * BLOCK_K + kr[None, :], mask=active, other=0.0)
        pdl_wait(USE_PDL)
    else:
        pdl_wait(USE_PDL)  # which expert is the producer's output: nothing to prefetch
        active = g < tl.load(num_segs)
    if active:
        e = tl.load(seg_expert + g).to(tl.int64)  # int64: E * N * K overflows int32
        start = tl.load(seg_start + g)
        end = tl.load(seg_start + g + 1)
        w_rows = w + e * stride_we + ns[:, None] * stride_wn
        for m0 in range(start, end, BLOCK_M):  # one iteration unless > BLOCK_M pairs
            ms = m0 + tl.arange(0, BLOCK_M)
            mm = ms < end
            pair = tl.load(sorted_pairs + ms, mask=mm, other=0)
            xr = pair // TOP_K if X_PER_TOKEN else pair
            x_rows = x + xr.to(tl.int64)[:, None] * stride_x
            # Swap-AB: acc[n, m] = sum_k w[n, k] x[m, k]; weights fill the MMA's M side.
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            if PRELOAD > 0:
                # The held blocks first, in the K loop's order (the same sums, bit for bit).
                acc = dot(w0, tl.trans(tl.load(x_rows + kr[None, :], mask=mm[:, None], other=0.0)), acc, DOT_F32)
                if PRELOAD > 1:
                    acc = dot(w1, tl.trans(tl.load(x_rows + BLOCK_K + kr[None, :], mask=mm[:, None], other=0.0)),
                              acc, DOT_F32)
                if PRELOAD > 2:
                    acc = dot(w2, tl.trans(tl.load(x_rows + 2 * BLOCK_K + kr[None, :], mask=mm[:, None], other=0.0)),
                              acc, DOT_F32)
            for k0 in range(PRELOAD * BLOCK_K, K, BLOCK_K):
                ks = k0 + kr
                if TMA:
                    wt = w_desc.load([(e * N).to(tl.int32) + tl.program_id(1) * BLOCK_N, k0])
                elif EVEN_N and EVEN_K:
                    wt = tl.load(w_rows + ks[None, :])
                else:
                    wt = tl.load(w_rows + ks[None, :], mask=nm[:, None] & (ks[None, :] < K),
                                 other=0.0)
                xm = mm[:, None] if EVEN_K else mm[:, None] & (ks[None, :] < K)
                if ACT_IN:
                    # Variant situ_fused: x is the gate|up row, SiTU applied here and
                    # rounded as situ_mul would have stored it (bit-identical h).
                    gt = tl.load(x_rows + ks[None, :], mask=xm, other=0.0).to(tl.float32)
                    ut = tl.load(x_rows + K + ks[None, :], mask=xm, other=0.0).to(tl.float32)
                    xt = to_dtype(_situ(gt, ut), x.dtype.element_ty)
                else:
                    xt = tl.load(x_rows + ks[None, :], mask=xm, other=0.0)
                acc = dot(wt, tl.trans(xt), acc, DOT_F32)
            if ACT_OUT:
                # Rounded to the stored dtype first, as situ_mul reads gate|up: the same h.
                g_u = tl.permute(tl.reshape(to_dtype(acc, out.dtype.element_ty).to(tl.float32),
                                            [HALF, 2, BLOCK_M]), [0, 2, 1])
                gate, up = tl.split(g_u)
                hs = tl.program_id(1) * HALF + tl.arange(0, HALF)
                tl.store(out + pair.to(tl.int64)[None, :] * stride_out + hs[:, None],
                         to_dtype(_situ(gate, up), out.dtype.element_ty), mask=(hs < N // 2)[:, None] & mm[None, :])
            elif SUM_OUT:
                # Variant moe_down_atomic: out is the fp32 [B, N] weighted sum; each pair adds
                # its row times its router weight (written several kernels ago) into its token's.
                pw = tl.load(sum_w + pair, mask=mm, other=0.0)
                tok = (pair // TOP_K).to(tl.int64)
                tl.atomic_add(out + tok[None, :] * stride_sum + ns[:, None], acc * pw[None, :],
                              mask=nm[:, None] & mm[None, :], sem="relaxed")
            else:
                tl.store(out + pair.to(tl.int64)[None, :] * stride_out + ns[:, None],
                         to_dtype(acc, out.dtype.element_ty), mask=nm[:, None] & mm[None, :])
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


#: Variant moe_grouped_tuned: moe_grouped_gemm's (block_n, block_k, num_warps, num_stages) by
#: expert weight shape (N, K); a shape not here keeps the defaults. The down GEMM (K = 384) in
#: six K blocks of 64, not three of 128, so its 4-stage pipeline fills: in the step -0.08 ms at
#: B = 1, -0.12 at B = 8, -4.1 at B = 64 (kernels/README.md, round twelve); the gate|up GEMM's
#: candidates lost or tied at B = 1.
GROUPED_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int]] = {(3584, 384): (64, 64, 4, 4)}
#: Variant moe_weights_ahead: (block_n, block_k, num_warps, num_stages, blocks loaded before the
#: wait) by expert weight shape: the down GEMM (K = 384) holds all of its K in three blocks of 128;
#: the gate|up GEMM (K = 3584) its first two of 28. Picked by bench/compile_audit.py (sm_90a, no
#: device): at 64 columns and 4 stages the down GEMM took 132 KB of shared memory (its empty K
#: loop's buffers beside the held blocks), one CTA per SM, 7 waves; one stage at 32 columns takes
#: 36 KB and 96 registers, 5 CTAs per SM (c72's: 40 KB, 5). The gate|up GEMM at 3 stages keeps 2
#: CTAs per SM (96 KB; 116 KB at 4).
AHEAD_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int, int]] = {(3584, 384): (32, 128, 4, 1, 3),
                                                                       (768, 3584): (64, 128, 4, 3, 2)}


def grouped_config(w: torch.Tensor, ahead: bool = False) -> dict[str, int]:
    """moe_grouped_gemm's block keywords for expert bank `w` [E, N, K] from GROUPED_CONFIGS, or
    with its blocks loaded before the wait from AHEAD_CONFIGS (ahead)."""
    config = (AHEAD_CONFIGS if ahead else GROUPED_CONFIGS).get((w.shape[1], w.shape[2]))
    if config is None:
        return {}
    return dict(zip(("block_n", "block_k", "num_warps", "num_stages", "preload"), config))


def moe_grouped_gemm(x: torch.Tensor, w: torch.Tensor, sorted_pairs: torch.Tensor,
                     seg_expert: torch.Tensor, seg_start: torch.Tensor, num_segs: torch.Tensor,
                     out: torch.Tensor, *, top_k: int = 16, x_is_per_token: bool = True,
                     act_in: bool = False, act_out: bool = False, sum_weights: torch.Tensor | None = None,
                     block_n: int = 64,
                     block_k: int = 128, num_warps: int = 4, num_stages: int = 4,
                     preload: int = 0, tma: bool = False, delay_ns: int = 0) -> torch.Tensor:
    """out[pair] = x[pair // top_k if x_is_per_token else pair] @ w[expert(pair)].T.

    w is the expert bank [E, N, K] (K contiguous). Grid (G, cdiv(N, block_n)) with
    G = seg_expert.shape[0]; programs of segments past num_segs exit at once.
    act_in=True (variant situ_fused): x is the [P, 2K] gate|up output and the GEMM reads
    situ_mul(x) (the same bf16 values) without the separate launch.
    sum_weights [B, top_k] fp32 (variant moe_down_atomic, the down GEMM): out is fp32 [B, N],
    zero on entry, and out[b] += sum_k sum_weights[b, k] * (row of pair b * top_k + k) by
    atomic adds: moe_weighted_sum's result unrounded, its launch gone; the order of the adds
    varies, so the last bits do from run to run.
    act_out=True (variant situ_in_gate_up, the gate|up GEMM): out is [P, N / 2], situ_mul of
    the [P, N] product, bit for bit, without situ_mul's launch.
    preload (variant moe_weights_ahead; 0 to 3, all of K at most): each program loads its
    expert's first `preload` weight blocks before its PDL wait, the routing having been written
    before the launch; not with act_in or act_out; the same sums, bit for bit.
    tma (variant moe_grouped_tma): the weight tiles by TMA bulk copies (a descriptor over w as
    [E * N, K]) where the blocks divide N and K, a tile row spans 128 bytes and act_out is off
    (its interleaved gate|up rows are no tile); elsewhere pointer loads. Bit for bit."""
    _, N, K = w.shape
    P = sorted_pairs.shape[0]
    G = seg_expert.shape[0]
    assert w.stride(2) == 1 and x.stride(1) == 1 and x.shape[1] == (2 * K if act_in else K)
    assert not (act_out and (act_in or sum_weights is not None)) and (not act_out or N % 2 == 0)
    if act_out:
        assert out.shape == (P, N // 2) and out.stride(1) == 1
    elif sum_weights is None:
        assert out.shape == (P, N) and out.stride(1) == 1
    else:
        assert sum_weights.shape == (P // top_k, top_k) and sum_weights.is_contiguous()
        assert sum_weights.dtype == out.dtype == torch.float32 and out.shape == (P // top_k, N) and out.stride(1) == 1
    assert x.shape[0] * (top_k if x_is_per_token else 1) == P
    BLOCK_N = max(16, min(block_n, next_pow2(N)))
    BLOCK_K = max(16, min(block_k, next_pow2(K)))
    preload = min(preload, cdiv(K, BLOCK_K))
    assert 0 <= preload <= 3 and not (preload and (act_in or act_out or N % BLOCK_N or K % BLOCK_K))
    tma = (tma and not preload and not act_out and N % BLOCK_N == 0 and K % BLOCK_K == 0
           and BLOCK_K * w.element_size() >= 128 and w.is_contiguous())
    launch(moe_grouped_gemm_kernel, (G, cdiv(N, BLOCK_N)), x, w, sorted_pairs, seg_expert,
           seg_start, num_segs, out, N, K, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
           out if sum_weights is None else sum_weights, out.stride(0),
           TOP_K=top_k, X_PER_TOKEN=x_is_per_token, ACT_IN=act_in, SUM_OUT=sum_weights is not None, ACT_OUT=act_out,
           BLOCK_M=16, BLOCK_N=BLOCK_N,
           BLOCK_K=BLOCK_K, EVEN_N=N % BLOCK_N == 0, EVEN_K=K % BLOCK_K == 0, DOT_F32=DOT_F32,
           num_warps=num_warps, num_stages=num_stages, PRELOAD=preload,
           w_desc=bank_descriptor(w, BLOCK_N, BLOCK_K) if tma else None, TMA=tma, delay_ns=delay_ns)
    return out


def bank_descriptor(w: torch.Tensor, block_n: int, block_k: int) -> TensorDescriptor:
    """A TMA descriptor over the expert bank w [E, N, K] (contiguous) as [E * N, K] rows in
    [block_n, block_k] tiles: expert e's column block n0 is the tile at row e * N + n0."""
    E, N, K = w.shape
    assert w.data_ptr() % 16 == 0 and (K * w.element_size()) % 16 == 0 and E * N < 2**31
    return TensorDescriptor(w.view(E * N, K), shape=[E * N, K], strides=[K, 1], block_shape=[block_n, block_k])


#: moe_down_mix's (BLOCK_N, BLOCK_K, num_warps, num_stages) at the K3 down shape (N = 3584,
#: K = 384): 112 programs of 32 columns, each streaming its columns of all 16 experts.
DOWN_MIX_CONFIG = (32, 128, 4, 4)


@triton.jit
def moe_down_mix_kernel(h, w, topk_ids, topk_w, out, N, K, stride_h, stride_we, stride_wn, stride_out,
                        TOP_K: tl.constexpr, KP: tl.constexpr, ACT_IN: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                        DOT_F32: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Variant moe_down_mixed: program (b, n-block) streams its columns of token b's TOP_K
    # experts' down weights in one flat loop (expert-major, K blocks inside: one software
    # pipeline). Swap-AB as in moe_grouped_gemm, but the operand tile (KP >= 16 rows, the
    # MMA's least) holds expert k's row in row k only, so acc[:, k] collects y_k = w[e_k] h_k in fp32 and the weighted sum is one
    # reduction over acc's columns at the end: its launch and dependent hop go.
    b = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = ns < N
    kr = tl.arange(0, BLOCK_K)
    ms = tl.arange(0, KP)
    nkb = tl.cdiv(K, BLOCK_K)
    # The router wrote the weights several kernels ago: read them before the wait.
    wv = tl.load(topk_w + b * TOP_K + ms, mask=ms < TOP_K, other=0.0)
    pdl_wait(USE_PDL)  # h is the producer's output
    rows = h + (b * TOP_K + ms).to(tl.int64)[:, None] * stride_h
    acc = tl.zeros([BLOCK_N, KP], dtype=tl.float32)
    for it in range(TOP_K * nkb):
        k = it // nkb
        ks = (it - k * nkb) * BLOCK_K + kr
        e = tl.load(topk_ids + b * TOP_K + k).to(tl.int64)  # int64: E * N * K overflows int32
        w_rows = w + e * stride_we + ns[:, None] * stride_wn + ks[None, :]
        if EVEN_N and EVEN_K:
            wt = tl.load(w_rows)
        else:
            wt = tl.load(w_rows, mask=nm[:, None] & (ks[None, :] < K), other=0.0)
        xm = (ms[:, None] == k) & (ks[None, :] < K)
        if ACT_IN:  # with situ_fused: h is the gate|up row, SiTU'd and rounded as situ_mul stores it
            gt = tl.load(rows + ks[None, :], mask=xm, other=0.0).to(tl.float32)
            ut = tl.load(rows + K + ks[None, :], mask=xm, other=0.0).to(tl.float32)
            xt = tl.where(xm, to_dtype(_situ(gt, ut), h.dtype.element_ty), 0.0).to(h.dtype.element_ty)
        else:
            xt = tl.load(rows + ks[None, :], mask=xm, other=0.0)
        acc = dot(wt, tl.trans(xt), acc, DOT_F32)
    mix = tl.sum(acc * wv[None, :], 1)
    tl.store(out + b * stride_out + ns, to_dtype(mix, out.dtype.element_ty), mask=nm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def moe_down_mix(h: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                 out: torch.Tensor, *, act_in: bool = False,
                 config: tuple[int, int, int, int] | None = None, delay_ns: int = 0) -> torch.Tensor:
    """out[b] = sum_k topk_w[b, k] * h[b * top_k + k] @ w[topk_ids[b, k]].T: the down GEMM
    and moe_weighted_sum in one launch (variant moe_down_mixed; fp32 sums in another order
    than the pair's, and no bf16 rounding of the expert rows in between).

    w is the expert bank [E, N, K] (K contiguous); h [B * top_k, K], or with `act_in`
    (situ_fused) the [B * top_k, 2K] gate|up rows. `config`: (BLOCK_N, BLOCK_K, warps,
    stages), default DOWN_MIX_CONFIG. Grid (B, cdiv(N, BLOCK_N)); each program reads its
    columns of all top_k experts, so it pays where one token's experts are distinct (B = 1)."""
    _, N, K = w.shape
    B, top_k = topk_ids.shape
    assert topk_w.shape == (B, top_k) and topk_ids.is_contiguous() and topk_w.is_contiguous()
    assert topk_w.dtype == torch.float32 and w.stride(2) == 1 and h.stride(1) == 1
    assert h.shape == (B * top_k, 2 * K if act_in else K)
    assert out.shape == (B, N) and out.stride(1) == 1
    block_n, block_k, warps, stages = config or DOWN_MIX_CONFIG
    BLOCK_N = max(16, min(block_n, next_pow2(N)))
    BLOCK_K = max(16, min(block_k, next_pow2(K)))
    launch(moe_down_mix_kernel, (B, cdiv(N, BLOCK_N)), h, w, topk_ids, topk_w, out, N, K,
           h.stride(0), w.stride(0), w.stride(1), out.stride(0), TOP_K=top_k, KP=max(16, next_pow2(top_k)),
           ACT_IN=act_in,
           BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, EVEN_N=N % BLOCK_N == 0, EVEN_K=K % BLOCK_K == 0,
           DOT_F32=DOT_F32, num_warps=warps, num_stages=stages, delay_ns=delay_ns)
    return out


# --------------------------------------------------------------------------------------
# SiTU-mul and the weighted sum
# --------------------------------------------------------------------------------------
ELT_BLOCK = 512


@triton.jit
def situ_mul_kernel(gu, out, n, stride_gu, stride_out, BLOCK: tl.constexpr,
                    USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = cs < n
    pdl_wait(USE_PDL)
    g = tl.load(gu + row * stride_gu + cs, mask=cm, other=0.0).to(tl.float32)
    u = tl.load(gu + row * stride_gu + n + cs, mask=cm, other=0.0).to(tl.float32)
    y = _situ(g, u)
    tl.store(out + row * stride_out + cs, to_dtype(y, out.dtype.element_ty), mask=cm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def situ_mul(gu: torch.Tensor, out: torch.Tensor, *, delay_ns: int = 0) -> torch.Tensor:
    """out = 4 tanh(g/4) sigmoid(g) * 25 tanh(u/25), g | u = the two halves of gu's row."""
    M, two_n = gu.shape
    n = two_n // 2
    assert two_n == 2 * n and out.shape == (M, n) and gu.stride(1) == 1 and out.stride(1) == 1
    launch(situ_mul_kernel, (M, cdiv(n, ELT_BLOCK)), gu, out, n, gu.stride(0), out.stride(0),
           BLOCK=ELT_BLOCK, num_warps=4, delay_ns=delay_ns)
    return out


@triton.jit
def moe_weighted_sum_kernel(y, topk_w, out, N, stride_y, stride_out, pf, pf_bytes, sumsq,
                            TOP_K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                            PF_CHUNKS: tl.constexpr, SUMSQ: tl.constexpr,
                            USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nm = ns < N
    kk = tl.arange(0, KP)
    # The router wrote the weights several kernels ago: read them before the wait.
    wv = tl.load(topk_w + b * TOP_K + kk, mask=kk < TOP_K, other=0.0)
    pdl_wait(USE_PDL)
    l2_prefetch(pf, pf_bytes, PF_CHUNKS)  # the up GEMM's weight (variant prefetch:<MB>)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(TOP_K):
        wk = tl.sum(tl.where(kk == k, wv, 0.0), 0)
        acc += wk * tl.load(y + (b * TOP_K + k) * stride_y + ns, mask=nm, other=0.0).to(tl.float32)
    rounded = to_dtype(acc, out.dtype.element_ty)
    tl.store(out + b * stride_out + ns, rounded, mask=nm)
    if SUMSQ:  # variant latent_norm_folded: this chunk's sum of squares of what it stored
        r = tl.where(nm, rounded.to(tl.float32), 0.0)
        tl.store(sumsq + b * tl.num_programs(1) + tl.program_id(1), tl.sum(r * r, 0))
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def moe_weighted_sum_norm_kernel(y, topk_w, gamma, out, N, stride_y, stride_out, eps,
                                 TOP_K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                                 USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Variant moe_sum_norm_fused: one program per token does moe_weighted_sum (the same fp32
    # sums in k order, rounded to the latent's dtype) and then rmsnorm over the whole row
    # (the same block and warps as rmsnorm_kernel, so the same reduction): one launch, and
    # one dependent hop, fewer before the up GEMM.
    b = tl.program_id(0).to(tl.int64)
    ns = tl.arange(0, BLOCK)
    nm = ns < N
    kk = tl.arange(0, KP)
    wv = tl.load(topk_w + b * TOP_K + kk, mask=kk < TOP_K, other=0.0)  # older: the router's
    g = tl.load(gamma + ns, mask=nm, other=0.0).to(tl.float32)
    pdl_wait(USE_PDL)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(TOP_K):  # unrolled: the 16 row loads issue together
        wk = tl.sum(tl.where(kk == k, wv, 0.0), 0)
        acc += wk * tl.load(y + (b * TOP_K + k) * stride_y + ns, mask=nm, other=0.0).to(tl.float32)
    v = to_dtype(acc, out.dtype.element_ty).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(v * v, 0) / N + eps)
    tl.store(out + b * stride_out + ns, to_dtype(v * rstd * g, out.dtype.element_ty), mask=nm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def moe_weighted_sum_norm(y: torch.Tensor, topk_w: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor,
                          eps: float = 1e-6, *, delay_ns: int = 0) -> torch.Tensor:
    """out[b] = rmsnorm(sum_k topk_w[b, k] * y[b * top_k + k]) * gamma: moe_weighted_sum then
    rmsnorm in one launch, bit for bit (the sum is rounded to out's dtype before the norm,
    as the pair's intermediate row is)."""
    B, K = topk_w.shape
    P, N = y.shape
    assert P == B * K and out.shape == (B, N) and topk_w.is_contiguous() and gamma.shape == (N,)
    assert y.stride(1) == 1 and out.stride(1) == 1 and topk_w.dtype == torch.float32 and gamma.is_contiguous()
    BLOCK = next_pow2(N)
    assert BLOCK <= MAX_N, "the whole row sits in one program's registers"
    launch(moe_weighted_sum_norm_kernel, (B,), y, topk_w, gamma, out, N, y.stride(0), out.stride(0), eps,
           TOP_K=K, KP=next_pow2(K), BLOCK=BLOCK, num_warps=8 if BLOCK >= 4096 else 4, delay_ns=delay_ns)
    return out


def weighted_sum_chunks(N: int) -> int:
    """Programs per token of moe_weighted_sum: the sumsq partials it writes per token."""
    return cdiv(N, ELT_BLOCK)


def moe_weighted_sum(y: torch.Tensor, topk_w: torch.Tensor, out: torch.Tensor, *,
                     prefetch: torch.Tensor | None = None, prefetch_bytes: int = 0,
                     sumsq: torch.Tensor | None = None, delay_ns: int = 0) -> torch.Tensor:
    """out[b] = sum_k topk_w[b, k] * y[b * top_k + k] (fp32, in k order). `prefetch`: the
    first `prefetch_bytes` of this weight into L2 (common.l2_prefetch). `sumsq` fp32
    [B, weighted_sum_chunks(N)] (variant latent_norm_folded): each program's sum of squares
    of the bf16 values it stored, from which the up GEMM takes the latent RMSNorm's 1/rms."""
    B, K = topk_w.shape
    P, N = y.shape
    assert P == B * K and out.shape == (B, N) and topk_w.is_contiguous()
    assert y.stride(1) == 1 and out.stride(1) == 1 and topk_w.dtype == torch.float32
    assert sumsq is None or (sumsq.shape == (B, weighted_sum_chunks(N)) and sumsq.is_contiguous()
                             and sumsq.dtype == torch.float32)
    launch(moe_weighted_sum_kernel, (B, cdiv(N, ELT_BLOCK)), y, topk_w, out, N, y.stride(0),
           out.stride(0), **prefetch_args(prefetch, prefetch_bytes, B * cdiv(N, ELT_BLOCK), out),
           sumsq=out if sumsq is None else sumsq, SUMSQ=sumsq is not None, TOP_K=K, KP=next_pow2(K), BLOCK=ELT_BLOCK, num_warps=4,
           delay_ns=delay_ns)
    return out
