"""Standalone time of what each bs1-campaign change touches, old and new side by side in one run.

    python3 bench/bench_k3_ops.py [--batch 1] [--json OUT]

The campaign table (kernels/README.md, "The bs1 campaign") sets, for every change, the ITL
delta `k3trace diff` reports beside the standalone saving measured here times the layers
it applies to. Each case is captured as a CUDA graph of `--calls` back-to-back calls (so
PDL chains between them as in a decode step) and replayed; the per-call time is the
median replay over calls. Weights rotate over enough copies that no call finds its weights
in the 60 MB L2. Runs on a GPU only; CI never runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from types import SimpleNamespace

import torch

BF = torch.bfloat16
F32 = torch.float32
I32 = torch.int32


def per_call_us(fn, calls: int, replays: int = 20) -> float:
    """Median per-call time of `fn(i)` for i in range(calls), captured as one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile, cuBLAS workspaces
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    times = []
    for _ in range(replays + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times[2:])


def single_call_us(fn, copies: int, replays: int = 40) -> float:
    """Median time of one `fn(i)` alone: one graph per weight copy i, replayed in rotation
    with events around each replay. Back to back (per_call_us) a call's serial tail hides
    under the next call's start; this is what a kernel on the step's critical path pays
    (plus the launch, alike for every form)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile, cuBLAS workspaces
        for i in range(min(2, copies)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = []
    for i in range(copies):  # no replay finds its weights in L2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(i)
        graphs.append(graph)
    times = []
    for it in range(replays + 4):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graphs[it % copies].replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times[4:])


def router_head(B: int, calls: int) -> dict[str, float]:
    """MoE front: baseline = front GEMM, then top-k and align after it on main; router_fork
    = router GEMV + top-k + align on a side stream beside the rest of the front GEMM."""
    from kernels.k3.ops.gemv import gemv
    from kernels.k3.ops.moe import moe_align, moe_router
    from kernels.streams import fork, join

    H, W, E, K, copies = 7168, 6016, 896, 16, 3
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, H, device="cuda", dtype=BF, generator=g)
    front = [torch.randn(H, W, device="cuda", dtype=BF, generator=g) * H ** -0.5 for _ in range(copies)]
    router_t = [f[:, :E].t().contiguous() for f in front]
    bias = torch.randn(E, device="cuda", dtype=F32, generator=g) * 0.05
    out = torch.empty(B, W, device="cuda", dtype=BF)
    logits = torch.empty(B, E, device="cuda", dtype=BF)
    rest = torch.empty(B, W - E, device="cuda", dtype=BF)
    ids = torch.empty(B, K, device="cuda", dtype=I32)
    wts = torch.empty(B, K, device="cuda", dtype=F32)
    P = B * K
    seg = (torch.empty(P, device="cuda", dtype=I32), torch.empty(min(P, E), device="cuda", dtype=I32),
           torch.empty(min(P, E) + 1, device="cuda", dtype=I32), torch.empty(1, device="cuda", dtype=I32))
    s2 = torch.cuda.Stream()

    def base(i):
        torch.mm(x, front[i % copies], out=out)
        moe_router(out[:, :E], bias, ids, wts)
        moe_align(ids, E, *seg)

    def forked(i):
        main = torch.cuda.current_stream()
        fork(main, s2, enabled=True)
        with torch.cuda.stream(s2):
            gemv(x, router_t[i % copies], logits)
            moe_router(logits, bias, ids, wts)
            moe_align(ids, E, *seg)
        torch.mm(x, front[i % copies][:, E:], out=rest)
        join(main, s2, enabled=True)

    def gemm_only(i):
        torch.mm(x, front[i % copies], out=out)

    return {"front GEMM alone": per_call_us(gemm_only, calls),
            "baseline: front GEMM -> router -> align": per_call_us(base, calls),
            "router_fork: [router GEMV -> router -> align] || rest of front": per_call_us(forked, calls)}


#: router_in_front's sweep: (config, (router splits, rest splits)).
FRONT_ROUTER_SWEEP = [(c, sp) for c in ((64, 128, 4, 4), (64, 128, 8, 4), (64, 256, 8, 3))
                      for sp in ((8, 2), (16, 2), (16, 3), (12, 2), (8, 3))]


def _moe_head(seed: int) -> tuple:
    """One token's MoE head at the K3 shapes: weight copies (past the L2), x, the front copies and
    their router columns transposed (the GEMV's), the router bias, the logits, the front's rest,
    the top-k ids and weights and the align's four outputs."""
    H, W, E, K = 7168, 6016, 896, 16
    copies = _copies(H * W * 2)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, H, device="cuda", dtype=BF, generator=g)
    front = [torch.randn(H, W, device="cuda", dtype=BF, generator=g) * H ** -0.5 for _ in range(copies)]
    router_t = [f[:, :E].t().contiguous() for f in front]
    bias = torch.randn(E, device="cuda", dtype=F32, generator=g) * 0.05
    logits = torch.empty(1, E, device="cuda", dtype=BF)
    rest = torch.empty(1, W - E, device="cuda", dtype=BF)
    ids, wts = torch.empty(1, K, device="cuda", dtype=I32), torch.empty(1, K, device="cuda", dtype=F32)
    seg = (torch.empty(K, device="cuda", dtype=I32), torch.empty(K, device="cuda", dtype=I32),
           torch.empty(K + 1, device="cuda", dtype=I32), torch.empty(1, device="cuda", dtype=I32))
    return copies, x, front, router_t, bias, logits, rest, ids, wts, seg


def front_router(B: int, calls: int) -> dict[str, float]:
    """The MoE head at one token as c20 runs it (router_fork + router_align_fused +
    triton_linear: [router GEMV -> router with the align] on S2 beside the skinny rest of the
    front on main, joined) against router_in_front (one launch), over its sweep; the front's
    rest alone for reference."""
    from kernels.k3.ops.gemv import alloc_split_k, gemv, skinny_mm
    from kernels.k3.ops.moe import (FRONT_ROUTER_CONFIG, FRONT_ROUTER_SPLITS, alloc_front_router_done,
                                    moe_front_router, moe_router)
    from kernels.streams import fork, join

    assert B == 1, "router_in_front is a one-token variant"
    H, E = 7168, 896
    copies, x, front, router_t, bias, logits, rest, ids, wts, seg = _moe_head(0)
    buf, done = alloc_split_k(H, "cuda"), alloc_front_router_done("cuda")
    s2 = torch.cuda.Stream()

    def forked(i):
        main = torch.cuda.current_stream()
        fork(main, s2, enabled=True)
        with torch.cuda.stream(s2):
            gemv(x, router_t[i % copies], logits)
            moe_router(logits, bias, ids, wts, align=seg)
        skinny_mm(x, front[i % copies][:, E:], rest)
        join(main, s2, enabled=True)

    res = {"front's rest alone (skinny)": per_call_us(lambda i: skinny_mm(x, front[i % copies][:, E:], rest), calls),
           "c20 head: [router GEMV -> router+align] || rest of front": per_call_us(forked, calls)}
    for cfg, sp in FRONT_ROUTER_SWEEP:
        us = _try_us(lambda i, c=cfg, s=sp: moe_front_router(x, front[i % copies], rest, logits, bias, ids, wts,
                                                             seg, buf, done, config=c, splits=s), calls)
        tag = " (default)" if (cfg, sp) == (FRONT_ROUTER_CONFIG, FRONT_ROUTER_SPLITS) else ""
        res[f"router_in_front {cfg} x{sp}{tag}"] = us
    return res


def o_proj_score(B: int, calls: int) -> dict[str, float]:
    """The KDA o_proj (skinny, triton_o_proj) and the pre-MLP aggregation after it, at one
    token and 8 bank rows: o_proj -> score (the residual folded) -> combine (attn_res_dot),
    against attn_res_in_o_proj's o_proj with the Gram epilogue -> combine over its partials;
    back to back and one call at a time."""
    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops.gemv import skinny_mm

    assert B == 1, "attn_res_in_o_proj is a one-token variant"
    H, K, n = 7168, 1536, 8
    copies = _copies(K * H * 2)
    g = torch.Generator(device="cuda").manual_seed(9)
    a = torch.randn(1, K, device="cuda", dtype=BF, generator=g)
    ws = [torch.randn(K, H, device="cuda", dtype=BF, generator=g) * K ** -0.5 for _ in range(copies)]
    bank = torch.randn(8, 1, H, device="cuda", dtype=BF, generator=g)
    query, gamma = torch.randn(H, device="cuda", dtype=BF, generator=g), torch.randn(H, device="cuda", dtype=BF, generator=g)
    o, x = torch.empty(1, H, device="cuda", dtype=BF), torch.empty(1, H, device="cuda", dtype=BF)
    scores = A.alloc_attn_res_scores(bank)
    gemm_scores = torch.empty(A.gemm_scores_shape(H, 64, 8), device="cuda", dtype=F32)

    def pair(i):
        skinny_mm(a, ws[i % copies], o)
        A.attn_res_score(bank, n, query, scores, addend=o, gram_dot=True)
        A.attn_res_combine(bank, n, scores, gamma, x, one_shot=True)

    def folded(i):
        skinny_mm(a, ws[i % copies], o, gram=(bank, n, query, gemm_scores, True))
        A.attn_res_combine(bank, n, gemm_scores, gamma, x, one_shot=True)

    return {"o_proj -> score -> combine": per_call_us(pair, calls),
            "attn_res_in_o_proj: o_proj + its Gram -> combine": per_call_us(folded, calls),
            "one call: o_proj -> score -> combine": single_call_us(pair, copies),
            "one call: attn_res_in_o_proj": single_call_us(folded, copies)}


def router_align(B: int, calls: int) -> dict[str, float]:
    """The router leg's top-k and align: two launches, or the router writing the segments
    (router_align_fused; one token)."""
    from kernels.k3.ops.moe import moe_align, moe_router

    E, K = 896, 16
    g = torch.Generator(device="cuda").manual_seed(6)
    logits = torch.randn(B, E, device="cuda", dtype=BF, generator=g)
    bias = torch.randn(E, device="cuda", dtype=F32, generator=g) * 0.05
    ids, wts = torch.empty(B, K, device="cuda", dtype=I32), torch.empty(B, K, device="cuda", dtype=F32)
    P = B * K
    seg = (torch.empty(P, device="cuda", dtype=I32), torch.empty(min(P, E), device="cuda", dtype=I32),
           torch.empty(min(P, E) + 1, device="cuda", dtype=I32), torch.empty(1, device="cuda", dtype=I32))
    res = {"router -> align": per_call_us(lambda i: (moe_router(logits, bias, ids, wts), moe_align(ids, E, *seg)),
                                          calls)}
    if B == 1:
        res["router_align_fused"] = per_call_us(lambda i: moe_router(logits, bias, ids, wts, align=seg), calls)
    return res


def add3_fold(B: int, calls: int) -> dict[str, float]:
    """The MLP output into the partial: add3 then the next score, or the score adding it
    (mlp_residual_folded)."""
    from kernels.k3.ops import attn_res as A

    H = 7168
    g = torch.Generator(device="cuda").manual_seed(7)
    bank = torch.randn(8, B, H, device="cuda", dtype=BF, generator=g)
    query = torch.randn(H, device="cuda", dtype=BF, generator=g)
    a, b = (torch.randn(B, H, device="cuda", dtype=BF, generator=g) * 1e-3 for _ in range(2))
    scores = A.alloc_attn_res_scores(bank)
    n = 4
    return {"add3 -> score": per_call_us(lambda i: (A.add3(bank[n - 1], a, b),
                                                   A.attn_res_score(bank, n, query, scores)), calls),
            "mlp_residual_folded": per_call_us(lambda i: A.attn_res_score(bank, n, query, scores, addend=a, addend2=b),
                                               calls)}


def mla_combine(B: int, calls: int) -> dict[str, float]:
    from kernels.k3.config import K3Config
    from kernels.k3.ops.mla import mla_decode_combine

    cfg = K3Config(batch=B)
    S, NH, DL = cfg.fmha_splits, cfg.mla_heads, cfg.kv_lora
    g = torch.Generator(device="cuda").manual_seed(1)
    partial = torch.randn(B, NH, S, DL, device="cuda", dtype=F32, generator=g)
    lse = torch.randn(B, NH, S, device="cuda", dtype=F32, generator=g)
    seq = torch.full((B,), cfg.seq_len, device="cuda", dtype=I32)
    out = torch.empty(NH, B, DL, device="cuda", dtype=BF).transpose(0, 1)
    return {f"combine, {S} splits": per_call_us(lambda i: mla_decode_combine(partial, lse, seq, out), calls),
            "mla_combine_wide": per_call_us(lambda i: mla_decode_combine(partial, lse, seq, out, wide=True),
                                            calls)}


def mla_fmha(B: int, calls: int) -> dict[str, float]:
    """Split-KV decode + the wide combine over the 8193-token paged cache: 128-token splits
    (baseline) against 64-token ones (fmha_short_splits)."""
    from kernels.k3.config import K3Config
    from kernels.k3.ops.mla import mla_decode_combine, mla_decode_fmha

    res = {}
    for name, tokens in (("fmha + wide combine, 128-token splits", 128), ("fmha_short_splits", 64)):
        cfg = K3Config(batch=B, fmha_split_tokens=tokens)
        S, NH, DL, ROW = cfg.fmha_splits, cfg.mla_heads, cfg.kv_lora, cfg.kv_a_width
        g = torch.Generator(device="cuda").manual_seed(5)
        pages = B * cfg.pages_per_request
        copies = 4  # distinct caches per call: 9.4 MB each at B = 1
        caches = [torch.randn(pages, cfg.page_size, ROW, device="cuda", dtype=BF, generator=g)
                  for _ in range(copies)]
        table = torch.randperm(pages, device="cuda", generator=g).to(I32).view(B, -1).contiguous()
        seq = torch.full((B,), cfg.seq_len, device="cuda", dtype=I32)
        q = torch.randn(B, NH, ROW, device="cuda", dtype=BF, generator=g)
        partial = torch.empty(B, NH, S, DL, device="cuda", dtype=F32)
        lse = torch.empty(B, NH, S, device="cuda", dtype=F32)
        out = torch.empty(NH, B, DL, device="cuda", dtype=BF).transpose(0, 1)

        def call(i):
            mla_decode_fmha(q, caches[i % copies], table, seq, partial, lse, cfg.sm_scale,
                            num_splits=S, page_size=cfg.page_size)
            mla_decode_combine(partial, lse, seq, out, wide=True)

        res[f"{name} ({S} splits)"] = per_call_us(call, calls)
    return res


def _kda_case(B: int) -> SimpleNamespace:
    """One KDA layer's step inputs at the K3 shapes; per-layer recurrent states and conv
    windows rotated past the L2."""
    from kernels.k3.config import K3Config

    cfg = K3Config(batch=B)
    NH, D, C = cfg.kda_heads, cfg.kda_head_dim, cfg.conv_channels
    g = torch.Generator(device="cuda").manual_seed(6)
    r = lambda *shape, dt=BF, s=1.0: torch.randn(*shape, device="cuda", dtype=dt, generator=g) * s  # noqa: E731
    copies = _copies(B * NH * D * D * 4)
    qkvg = r(B, C + NH * D)
    return SimpleNamespace(
        NH=NH, D=D, copies=copies, states=[r(B, NH, D, D, dt=F32, s=0.1) for _ in range(copies)],
        windows=[r(B, 3, C) for _ in range(copies)], qkvg=qkvg, conv_w=r(C, 4, s=0.5),
        conv_out=torch.empty(B, C, device="cuda", dtype=BF), fab=r(B, cfg.fab_width), fb=r(B, NH * D),
        A_log=r(NH, dt=F32, s=0.5), dt_bias=r(NH * D, dt=F32, s=0.5), slot=torch.arange(B, device="cuda", dtype=I32),
        norm_w=r(D), out=torch.empty(B, NH * D, device="cuda", dtype=BF), gate=qkvg[:, C:])


def kda_conv(B: int, calls: int) -> dict[str, float]:
    """The KDA conv + SiLU, then the delta-rule step (fused norm), against kda_conv_fused's
    one launch."""
    from kernels.k3.ops.kda import kda_conv_silu, kda_step

    k = _kda_case(B)

    def pair(i):
        kda_conv_silu(k.qkvg, k.windows[i % k.copies], k.conv_w, k.slot, k.conv_out)
        kda_step(k.conv_out, k.fab, k.fb, k.A_log, k.dt_bias, k.gate, k.states[i % k.copies], k.slot, k.norm_w, k.out)

    def fused(i):
        kda_step(k.qkvg, k.fab, k.fb, k.A_log, k.dt_bias, k.gate, k.states[i % k.copies], k.slot, k.norm_w, k.out,
                 conv=(k.windows[i % k.copies], k.conv_w))

    return {"conv -> kda_step": per_call_us(pair, calls), "kda_conv_fused": per_call_us(fused, calls)}


def kda_split(B: int, calls: int) -> dict[str, float]:
    """c72's KDA step (the conv inside, one program per head) against kda_split_v's (four per
    head, a barrier for the norm), and the V-split step with its separate norm kernel
    (kda_norm_separate's pair, the conv inside neither: its own launch in both) beside the
    fused step it replaced; back to back and one call at a time."""
    from kernels.k3.ops.kda import SplitScratch, kda_conv_silu, kda_gated_rmsnorm, kda_step

    k = _kda_case(B)
    split = SplitScratch.allocate(B, k.NH, k.D, "cuda")
    o = torch.empty(B, k.NH * k.D, device="cuda", dtype=F32)

    def step(i, **kw):
        kda_step(k.qkvg, k.fab, k.fb, k.A_log, k.dt_bias, k.gate, k.states[i % k.copies], k.slot, k.norm_w, k.out,
                 conv=(k.windows[i % k.copies], k.conv_w), **kw)

    def conv_then(i, **kw):
        kda_conv_silu(k.qkvg, k.windows[i % k.copies], k.conv_w, k.slot, k.conv_out)
        kda_step(k.conv_out, k.fab, k.fb, k.A_log, k.dt_bias, k.gate, k.states[i % k.copies], k.slot, k.norm_w,
                 k.out, **kw)

    def separate(i):
        conv_then(i, fuse_norm=False, o_scratch=o)
        kda_gated_rmsnorm(o, k.gate, k.norm_w, k.out)

    forms = {"kda_conv_fused": step, "kda_conv_fused+kda_split_v": lambda i: step(i, split=split),
             "conv -> kda_step": conv_then, "conv -> kda_step (split) -> norm": separate}
    res = {name: per_call_us(fn, calls) for name, fn in forms.items()}
    res.update({f"{name}, one call": single_call_us(fn, k.copies) for name, fn in forms.items()})
    return res


def mla_proj(B: int, calls: int) -> dict[str, float]:
    """x's three MLA projections (q_a, kv_a, g_proj) as three cuBLAS calls against
    mla_proj_merged's one skinny GEMM; and the FMHA + wide combine alone against the same
    beside g_proj on a side stream (the leg mla_proj_merged takes away)."""
    from kernels.k3.config import K3Config
    from kernels.k3.ops.gemv import skinny_mm
    from kernels.k3.ops.mla import mla_decode_combine, mla_decode_fmha
    from kernels.streams import fork, join

    cfg = K3Config(batch=B)
    H, widths = cfg.hidden, (cfg.q_lora, cfg.kv_a_width, cfg.mla_out_width)
    g = torch.Generator(device="cuda").manual_seed(7)
    copies = _copies(H * cfg.x_proj_width * 2)
    merged = [torch.randn(H, cfg.x_proj_width, device="cuda", dtype=BF, generator=g) * H ** -0.5
              for _ in range(copies)]
    apart = [[m[:, :widths[0]].contiguous(), m[:, widths[0]:-widths[2]].contiguous(), m[:, -widths[2]:].contiguous()]
             for m in merged]
    x = torch.randn(B, H, device="cuda", dtype=BF, generator=g)
    outs = [torch.empty(B, n, device="cuda", dtype=BF) for n in widths]
    out = torch.empty(B, cfg.x_proj_width, device="cuda", dtype=BF)

    def three(i):
        for w, o in zip(apart[i % copies], outs):
            torch.mm(x, w, out=o)

    S, NH, DL, ROW = cfg.fmha_splits, cfg.mla_heads, cfg.kv_lora, cfg.kv_a_width
    pages = B * cfg.pages_per_request
    caches = [torch.randn(pages, cfg.page_size, ROW, device="cuda", dtype=BF, generator=g) for _ in range(4)]
    table = torch.randperm(pages, device="cuda", generator=g).to(I32).view(B, -1).contiguous()
    seq = torch.full((B,), cfg.seq_len, device="cuda", dtype=I32)
    q = torch.randn(B, NH, ROW, device="cuda", dtype=BF, generator=g)
    partial, lse = torch.empty(B, NH, S, DL, device="cuda", dtype=F32), torch.empty(B, NH, S, device="cuda", dtype=F32)
    lat = torch.empty(NH, B, DL, device="cuda", dtype=BF).transpose(0, 1)
    s2 = torch.cuda.Stream()

    def attention(i):
        mla_decode_fmha(q, caches[i % 4], table, seq, partial, lse, cfg.sm_scale, num_splits=S,
                        page_size=cfg.page_size)
        mla_decode_combine(partial, lse, seq, lat, wide=True)

    def beside_gate(i):
        main = torch.cuda.current_stream()
        fork(main, s2, enabled=True)
        with torch.cuda.stream(s2):
            torch.mm(x, apart[i % copies][2], out=outs[2])
        attention(i)
        join(main, s2, enabled=True)

    return {"q_a, kv_a, g_proj: three cuBLAS calls": per_call_us(three, calls),
            "mla_proj_merged: one skinny GEMM": per_call_us(lambda i: skinny_mm(x, merged[i % copies], out), calls),
            "fmha + wide combine alone": per_call_us(attention, calls),
            "fmha + wide combine || g_proj (S2)": per_call_us(beside_gate, calls)}


def mla_round(B: int, calls: int) -> dict[str, float]:
    """The eleventh round's MLA changes at the K3 shapes, back to back and one call at a time
    (rotating 4 caches / weight copies past the L2): the FMHA + wide combine at 65 splits of
    128 tokens (c51) against one-tile splits of 64 (fmha_one_tile) with the rows before the
    wait (fmha_early_kv), each alone and beside g_proj on S2 as in the step; q_b's output ->
    absorb and combine's output -> V-up -> gate_mul by cuBLAS's BMM (c51) against
    head_bmm_kernel (mla_head_bmm) with the gate in its epilogue (mla_gate_in_v)."""
    from kernels.k3.config import K3Config
    from kernels.k3.ops.mla import FMHA_BLOCK_N, gate_mul, head_bmm, mla_decode_combine, mla_decode_fmha
    from kernels.streams import fork, join

    g = torch.Generator(device="cuda").manual_seed(11)
    res: dict[str, float] = {}
    cfg = K3Config(batch=B)
    NH, DL, ROW = cfg.mla_heads, cfg.kv_lora, cfg.kv_a_width
    pages = B * cfg.pages_per_request
    caches = [torch.randn(pages, cfg.page_size, ROW, device="cuda", dtype=BF, generator=g) for _ in range(4)]
    table = torch.randperm(pages, device="cuda", generator=g).to(I32).view(B, -1).contiguous()
    seq = torch.full((B,), cfg.seq_len, device="cuda", dtype=I32)
    q = torch.randn(B, NH, ROW, device="cuda", dtype=BF, generator=g)
    lat = torch.empty(NH, B, DL, device="cuda", dtype=BF).transpose(0, 1)
    x = torch.randn(B, cfg.hidden, device="cuda", dtype=BF, generator=g)
    g_w = [torch.randn(cfg.hidden, cfg.mla_out_width, device="cuda", dtype=BF, generator=g) * cfg.hidden ** -0.5
           for _ in range(4)]
    g_out = torch.empty(B, cfg.mla_out_width, device="cuda", dtype=BF)
    s2 = torch.cuda.Stream()
    forms = {"c51: fmha + wide combine, 65 x 128": (cfg, {}),
             "fmha_one_tile: 129 x 64": (cfg.with_(fmha_split_tokens=64), {"block_n": 64, "first_early": True}),
             "fmha_one_tile+fmha_early_kv": (cfg.with_(fmha_split_tokens=64),
                                            {"block_n": 64, "first_early": True, "early_kv": True})}
    for name, (c, kw) in forms.items():
        S = c.fmha_splits
        partial = torch.empty(B, NH, S, DL, device="cuda", dtype=F32)
        lse = torch.empty(B, NH, S, device="cuda", dtype=F32)
        bn = kw.get("block_n", FMHA_BLOCK_N)

        def attention(i, S=S, partial=partial, lse=lse, kw=kw, bn=bn):
            mla_decode_fmha(q, caches[i % 4], table, seq, partial, lse, cfg.sm_scale, num_splits=S,
                            page_size=cfg.page_size, **kw)
            mla_decode_combine(partial, lse, seq, lat, wide=True, block_n=bn)

        def beside_gate(i, attention=attention):
            main = torch.cuda.current_stream()
            fork(main, s2, enabled=True)
            with torch.cuda.stream(s2):
                torch.mm(x, g_w[i % 4], out=g_out)
            attention(i)
            join(main, s2, enabled=True)

        res[f"{name}"] = per_call_us(attention, calls)
        res[f"{name}, one call"] = single_call_us(attention, 4)
        res[f"{name} || g_proj (S2)"] = per_call_us(beside_gate, calls)
        res[f"{name} || g_proj (S2), one call"] = single_call_us(beside_gate, 4)
    # The per-head products: 1.5 MB of weights each; 48 copies (72 MB) rotate past the 60 MB L2.
    copies = 48
    w_uk = [torch.randn(NH, cfg.qk_nope, DL, device="cuda", dtype=BF, generator=g) * 0.1 for _ in range(copies)]
    w_uv = [torch.randn(NH, DL, cfg.v_head, device="cuda", dtype=BF, generator=g) * 0.05 for _ in range(copies)]
    q_b = torch.randn(B, NH, cfg.qk_head, device="cuda", dtype=BF, generator=g)
    q_nope = q_b[:, :, :cfg.qk_nope].transpose(0, 1)
    q_abs = torch.empty(NH, B, DL, device="cuda", dtype=BF)
    o = torch.empty(B, NH, cfg.v_head, device="cuda", dtype=BF)
    gated = torch.empty(B, cfg.mla_out_width, device="cuda", dtype=BF)
    a_lat = torch.randn(NH, B, DL, device="cuda", dtype=BF, generator=g)
    chains = {
        "c51: absorb (cuBLAS BMM)": lambda i: torch.bmm(q_nope, w_uk[i % copies], out=q_abs),
        "mla_head_bmm: absorb": lambda i: head_bmm(q_nope, w_uk[i % copies], q_abs),
        "c51: V-up (cuBLAS BMM) -> gate_mul": lambda i: (torch.bmm(a_lat, w_uv[i % copies], out=o.transpose(0, 1)),
                                                         gate_mul(o.view(B, -1), g_out, gated)),
        "mla_head_bmm: V-up -> gate_mul": lambda i: (head_bmm(a_lat, w_uv[i % copies], o.transpose(0, 1)),
                                                     gate_mul(o.view(B, -1), g_out, gated)),
        "mla_gate_in_v: V-up with the gate": lambda i: head_bmm(a_lat, w_uv[i % copies],
                                                                gated.view(B, NH, -1).transpose(0, 1), gate=g_out)}
    for name, fn in chains.items():
        res[name] = per_call_us(fn, calls)
        res[f"{name}, one call"] = single_call_us(fn, copies)
    return res


def mla_hops(B: int, calls: int) -> dict[str, float]:
    """Variants mla_absorb_concat, mla_kv_norm_insert and mla_gate_in_o_proj at the K3 shapes,
    back to back and one call at a time (weight copies rotated past the L2): the Q chain's tail
    (the absorb -> q_concat, or the absorb into the query rows with the rope part) and the KV
    leg (kv_a by cuBLAS -> RMSNorm -> insert, or the norm into the cache row), each alone, then
    both legs as the step runs them: the KV leg forked on S1 at the start, joined before a
    one-program reader of the query rows (the FMHA's place; q_concat, when there is one, reads
    them after the join). Last, the output tail: V-up -> gate_mul -> the skinny o_proj, or
    V-up -> the o_proj gating its own operand."""
    from kernels.k3.config import K3Config
    from kernels.k3.ops.gemv import skinny_mm
    from kernels.k3.ops.mla import gate_mul, head_bmm, mla_cache_insert, mla_kv_norm_insert, mla_q_concat
    from kernels.k3.ops.norm import rmsnorm
    from kernels.streams import fork, join

    cfg = K3Config(batch=B)
    g = torch.Generator(device="cuda").manual_seed(17)
    H, NH, DL, DR, KN = cfg.hidden, cfg.mla_heads, cfg.kv_lora, cfg.qk_rope, cfg.qk_nope
    copies = _copies(H * cfg.kv_a_width * 2)  # kv_a's 8.3 MB; the absorb's 1.5 MB rotate with it
    w_uk = [torch.randn(NH, KN, DL, device="cuda", dtype=BF, generator=g) * 0.1 for _ in range(copies)]
    w_kv = [torch.randn(H, cfg.kv_a_width, device="cuda", dtype=BF, generator=g) * H ** -0.5 for _ in range(copies)]
    gamma = torch.ones(DL, device="cuda", dtype=BF)
    q_b = torch.randn(B, NH, cfg.qk_head, device="cuda", dtype=BF, generator=g)
    q_nope, q_rope = q_b[:, :, :KN].transpose(0, 1), q_b[:, :, KN:]
    q_abs = torch.empty(NH, B, DL, device="cuda", dtype=BF)
    q_full = torch.empty(B, NH, DL + DR, device="cuda", dtype=BF)
    rows_out, rope_out = q_full[:, :, :DL].transpose(0, 1), q_full[:, :, DL:].transpose(0, 1)
    x = torch.randn(B, H, device="cuda", dtype=BF, generator=g)
    kv_a = torch.empty(B, cfg.kv_a_width, device="cuda", dtype=BF)
    kv_lat = torch.empty(B, DL, device="cuda", dtype=BF)
    cache = torch.zeros(B * cfg.pages_per_request, cfg.page_size, cfg.kv_a_width, device="cuda", dtype=BF)
    slots = (torch.arange(B, device="cuda", dtype=I32) * cfg.pages_per_request * cfg.page_size).contiguous()
    ones, sink = (torch.ones(NH * (DL + DR), device="cuda", dtype=BF),
                  torch.empty(B, NH * (DL + DR), device="cuda", dtype=BF))
    s1 = torch.cuda.Stream()

    def q_tail(i, fused):
        if fused:
            head_bmm(q_nope, w_uk[i % copies], rows_out, rope=(q_rope.transpose(0, 1), rope_out))
        else:
            head_bmm(q_nope, w_uk[i % copies], q_abs)

    def kv_leg(i, fused):
        torch.mm(x, w_kv[i % copies], out=kv_a)
        if fused:
            mla_kv_norm_insert(kv_a[:, :DL], gamma, kv_a[:, DL:], cache, slots, cfg.norm_eps)
        else:
            rmsnorm(kv_a[:, :DL], gamma, kv_lat, cfg.norm_eps)
            mla_cache_insert(kv_lat, kv_a[:, DL:], cache, slots)

    def both(i, absorb_concat, norm_insert):
        main = torch.cuda.current_stream()
        fork(main, s1, enabled=True)
        with torch.cuda.stream(s1):
            kv_leg(i, norm_insert)
        q_tail(i, absorb_concat)
        join(main, s1, enabled=True)
        if not absorb_concat:
            mla_q_concat(q_abs.transpose(0, 1), q_rope, q_full)
        rmsnorm(q_full.view(B, -1), ones, sink)  # the FMHA's place: a PDL kernel reading the rows

    forms = {"c69: absorb -> q_concat": lambda i: (q_tail(i, False), mla_q_concat(q_abs.transpose(0, 1), q_rope, q_full)),
             "mla_absorb_concat: absorb into the rows": lambda i: q_tail(i, True),
             "c69: kv_a -> norm -> insert": lambda i: kv_leg(i, False),
             "mla_kv_norm_insert: kv_a -> norm into the row": lambda i: kv_leg(i, True),
             "c69: both legs -> reader": lambda i: both(i, False, False),
             "mla_absorb_concat: both legs -> reader": lambda i: both(i, True, False),
             "mla_kv_norm_insert: both legs -> reader": lambda i: both(i, False, True),
             "mla_absorb_concat+mla_kv_norm_insert: both legs -> reader": lambda i: both(i, True, True)}
    # The output tail: V-up (head_bmm) -> [gate_mul] -> o_proj (skinny, 22 MB: its copies set
    # the rotation here).
    w_uv = [torch.randn(NH, DL, cfg.v_head, device="cuda", dtype=BF, generator=g) * 0.05 for _ in range(copies)]
    o_copies = _copies(cfg.mla_out_width * H * 2)
    w_o = [torch.randn(cfg.mla_out_width, H, device="cuda", dtype=BF, generator=g) * cfg.mla_out_width ** -0.5
           for _ in range(o_copies)]
    lat = torch.randn(NH, B, DL, device="cuda", dtype=BF, generator=g)
    gate = torch.randn(B, cfg.mla_out_width, device="cuda", dtype=BF, generator=g)
    o = torch.empty(B, NH, cfg.v_head, device="cuda", dtype=BF)
    gated = torch.empty(B, cfg.mla_out_width, device="cuda", dtype=BF)
    attn_out = torch.empty(B, H, device="cuda", dtype=BF)

    def out_tail(i, fused):
        head_bmm(lat, w_uv[i % copies], o.transpose(0, 1))
        if fused:
            skinny_mm(o.view(B, -1), w_o[i % o_copies], attn_out, gate=gate)
        else:
            gate_mul(o.view(B, -1), gate, gated)
            skinny_mm(gated, w_o[i % o_copies], attn_out)

    forms["c69: V-up -> gate_mul -> o_proj"] = lambda i: out_tail(i, False)
    forms["mla_gate_in_o_proj: V-up -> o_proj with the gate"] = lambda i: out_tail(i, True)
    res = {}
    for name, fn in forms.items():
        n = o_copies if "o_proj" in name else copies
        res[name] = per_call_us(fn, calls)
        res[f"{name}, one call"] = single_call_us(fn, n)
    return res


def mla_q_chain(B: int, calls: int) -> dict[str, float]:
    """Variant mla_q_skinny at the K3 shapes, back to back and one call at a time (weight
    copies rotated past the L2): the Q chain q_a -> RMSNorm -> q_b -> absorb with q_a and q_b
    by cuBLAS (c57: q_a split-K with its reduce kernel) against the split-K skinny GEMM
    (gemv.MLA_SPLITS), the absorb head_bmm_kernel in both."""
    from kernels.k3.config import K3Config
    from kernels.k3.ops.gemv import alloc_split_k, skinny_mm
    from kernels.k3.ops.mla import head_bmm
    from kernels.k3.ops.norm import rmsnorm

    cfg = K3Config(batch=B)
    g = torch.Generator(device="cuda").manual_seed(13)
    H, QA, NH = cfg.hidden, cfg.q_lora, cfg.mla_heads
    copies = _copies(H * QA * 2)
    w_qa = [torch.randn(H, QA, device="cuda", dtype=BF, generator=g) * H ** -0.5 for _ in range(copies)]
    w_qb = [torch.randn(QA, NH * cfg.qk_head, device="cuda", dtype=BF, generator=g) * QA ** -0.5 for _ in range(copies)]
    w_uk = [torch.randn(NH, cfg.qk_nope, cfg.kv_lora, device="cuda", dtype=BF, generator=g) * 0.1 for _ in range(copies)]
    gamma = torch.ones(QA, device="cuda", dtype=BF)
    x = torch.randn(B, H, device="cuda", dtype=BF, generator=g)
    qa, qa_n = torch.empty(B, QA, device="cuda", dtype=BF), torch.empty(B, QA, device="cuda", dtype=BF)
    qb = torch.empty(B, NH, cfg.qk_head, device="cuda", dtype=BF)
    q_abs = torch.empty(NH, B, cfg.kv_lora, device="cuda", dtype=BF)
    split = alloc_split_k(max(H, cfg.front_width), "cuda")

    def chain(i, skinny):
        k = i % copies
        if skinny:
            skinny_mm(x, w_qa[k], qa, split_k=split)
        else:
            torch.mm(x, w_qa[k], out=qa)
        rmsnorm(qa, gamma, qa_n, cfg.norm_eps)
        if skinny:
            skinny_mm(qa_n, w_qb[k], qb.view(B, -1), split_k=split)
        else:
            torch.mm(qa_n, w_qb[k], out=qb.view(B, -1))
        head_bmm(qb[:, :, :cfg.qk_nope].transpose(0, 1), w_uk[k], q_abs)

    res = {}
    for name, skinny in (("c57: q_a, q_b by cuBLAS", False), ("mla_q_skinny: split-K skinny", True)):
        res[name] = per_call_us(lambda i, s=skinny: chain(i, s), calls)
        res[f"{name}, one call"] = single_call_us(lambda i, s=skinny: chain(i, s), copies)
    return res


def _attn_res_inputs(B: int):
    """(bank, query, gamma, scores, out) of one aggregation at H = 7168."""
    from kernels.k3.ops import attn_res as A

    H = 7168
    g = torch.Generator(device="cuda").manual_seed(2)
    bank = torch.randn(8, B, H, device="cuda", dtype=BF, generator=g)
    query = torch.randn(H, device="cuda", dtype=BF, generator=g)
    gamma = torch.randn(H, device="cuda", dtype=BF, generator=g)
    return bank, query, gamma, A.alloc_attn_res_scores(bank), torch.empty(B, H, device="cuda", dtype=BF)


def attn_res(B: int, calls: int, n_rows: int) -> dict[str, float]:
    from kernels.k3.ops import attn_res as A

    bank, query, gamma, scores, out = _attn_res_inputs(B)
    res = {f"score + combine, {n_rows} rows": per_call_us(
        lambda i: (A.attn_res_score(bank, n_rows, query, scores),
                   A.attn_res_combine(bank, n_rows, scores, gamma, out)), calls)}
    for name, dot, early in (("attn_res_dot", True, False), ("attn_res_early_rows", False, True),
                             ("attn_res_dot+attn_res_early_rows", True, True)):
        res[name] = per_call_us(
            lambda i, dot=dot, early=early: (
                A.attn_res_score(bank, n_rows, query, scores, gram_dot=dot, early_rows=early),
                A.attn_res_combine(bank, n_rows, scores, gamma, out, one_shot=dot, early_rows=early)), calls)
    copies = A.alloc_partial_copies(bank)  # variant attn_res_one_pass (no addend: a copy out)
    res["attn_res_one_pass"] = per_call_us(
        lambda i: A.attn_res_one_pass(bank, n_rows, query, gamma, out, copies[0], copies[1]), calls)
    res["attn_res_dot, one call"] = single_call_us(
        lambda i: (A.attn_res_score(bank, n_rows, query, scores, gram_dot=True),
                   A.attn_res_combine(bank, n_rows, scores, gamma, out, one_shot=True)), 2)
    res["attn_res_one_pass, one call"] = single_call_us(
        lambda i: A.attn_res_one_pass(bank, n_rows, query, gamma, out, copies[0], copies[1]), 2)
    if hasattr(A, "attn_res_fused"):
        counter = A.alloc_attn_res_counter(bank.device)
        res["attn_res_fused"] = per_call_us(
            lambda i: A.attn_res_fused(bank, n_rows, query, scores, gamma, out, counter=counter), calls)
    return res


def attn_res_rows(B: int, calls: int) -> dict[str, float]:
    """attn_res_dot against the pair at every bank row count 1..8 (the old score loops over
    the rows, the new one does not), for the saving weighted by the step's row counts."""
    from kernels.k3.ops import attn_res as A

    bank, query, gamma, scores, out = _attn_res_inputs(B)
    res = {}
    for n in range(1, 9):
        for key, dot in (("pair", False), ("attn_res_dot", True)):
            res[f"{key}, {n} rows"] = per_call_us(
                lambda i, n=n, dot=dot: (A.attn_res_score(bank, n, query, scores, gram_dot=dot),
                                         A.attn_res_combine(bank, n, scores, gamma, out, one_shot=dot)), calls)
    return res


def moe_tail(B: int, calls: int) -> dict[str, float]:
    """The MoE tail at one token: weighted sum -> latent RMSNorm -> up GEMM (skinny), or the
    up GEMM forming its operand itself (moe_tail_fused), or the sum and the norm in one
    program (moe_sum_norm_fused). Up weights rotate past the L2."""
    from kernels.k3.ops.gemv import skinny_mm, skinny_mm_mixnorm
    from kernels.k3.ops.moe import moe_weighted_sum, moe_weighted_sum_norm, weighted_sum_chunks
    from kernels.k3.ops.norm import rmsnorm

    if B != 1:
        return {}
    K, N, E = 3584, 7168, 16
    g = torch.Generator(device="cuda").manual_seed(8)
    y = torch.randn(E, K, device="cuda", dtype=BF, generator=g)
    wts = torch.rand(1, E, device="cuda", dtype=F32, generator=g)
    gamma = torch.randn(K, device="cuda", dtype=BF, generator=g)
    ups = [torch.randn(K, N, device="cuda", dtype=BF, generator=g) for _ in range(_copies(K * N * 2))]
    lat, lat_n = torch.empty(1, K, device="cuda", dtype=BF), torch.empty(1, K, device="cuda", dtype=BF)
    sumsq = torch.empty(1, weighted_sum_chunks(K), device="cuda", dtype=F32)
    out = torch.empty(1, N, device="cuda", dtype=BF)
    return {"weighted sum -> norm -> up": per_call_us(
                lambda i: (moe_weighted_sum(y, wts, lat), rmsnorm(lat, gamma, lat_n),
                           skinny_mm(lat_n, ups[i % len(ups)], out)), calls),
            "moe_tail_fused": per_call_us(lambda i: skinny_mm_mixnorm(y, wts, gamma, ups[i % len(ups)], out),
                                          calls),
            # variant moe_tail_mma: the expert rows as the MMA's rows, the norm's sum of squares
            # by reduction (1) or Gram matrix (2)
            **{f"moe_tail_mma {m}": per_call_us(lambda i, m=m: skinny_mm_mixnorm(y, wts, gamma, ups[i % len(ups)],
                                                                                 out, mma=m), calls)
               for m in (1, 2)},
            "latent_norm_folded": per_call_us(lambda i: (moe_weighted_sum(y, wts, lat, sumsq=sumsq),
                                                         skinny_mm(lat, ups[i % len(ups)], out,
                                                                   rms_of=(sumsq, 1e-6))), calls),
            "moe_sum_norm_fused": per_call_us(lambda i: (moe_weighted_sum_norm(y, wts, gamma, lat_n),
                                                         skinny_mm(lat_n, ups[i % len(ups)], out)), calls)}


#: Variant linear_tma: the skinny GEMMs of the c20 step at one token, and the TMA configs
#: tried beside each one's committed config (block_n, block_k, warps, stages).
TMA_SHAPES = {"moe front (rest)": (7168, 5120, 6016, 92), "kda qkvg": (7168, 6144, 6144, 69),
              "moe up": (3584, 7168, 7168, 92), "o_proj": (1536, 7168, 7168, 93)}
TMA_SWEEP = [(64, 256, 8, 4), (64, 256, 4, 4), (64, 128, 4, 6), (64, 128, 4, 8), (128, 128, 8, 4),
             (128, 256, 8, 3), (32, 256, 4, 6), (64, 64, 4, 8)]


#: shared_front_leg's small S1 form (gemv.SHARED_LEG): 20 KB of shared memory per program at two
#: stages (compile audit), 96 programs, so that it fits beside the routed gate|up GEMM's programs.
LEG_SMALL = ((64, 128, 4, 2), 4)


def shared_front(B: int, calls: int) -> dict[str, float]:
    """Variant shared_front_leg at one token: the MoE head as c72 runs it ([router GEMV ->
    router with the align] on S2 beside the front's rest on main: the skinny GEMM by TMA at
    TMA_CONFIGS' front config, early triggers) against the rest cut in two, the latent columns
    on main and the shared experts' on S1, forked after them. The step joins S1 at the
    segment's end, past the routed chain; a graph must join here, so the head is timed with S1
    joined at its end (an upper bound) and without the shared GEMM (what main pays when S1
    streams beside later kernels). Each GEMM alone too; back to back and one call at a time."""
    from kernels.k3.ops.common import early_trigger
    from kernels.k3.ops.gemv import TMA_CONFIGS, alloc_split_k, gemv, skinny_mm
    from kernels.k3.ops.moe import moe_router
    from kernels.streams import fork, join

    if B != 1:
        return {}
    H, W, E, L = 7168, 6016, 896, 3584
    cfg = TMA_CONFIGS[(H, W - E)]
    copies, x, front, router_t, bias, logits, rest, ids, wts, seg = _moe_head(41)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    leg_cfg, leg_split = LEG_SMALL
    buf = alloc_split_k(H, "cuda")

    def mm(i, lo, hi, small: bool = False):
        if small:  # gemv.SHARED_LEG's form: a small config split over K
            skinny_mm(x, front[i % copies][:, E + lo:E + hi], rest[:, lo:hi], tma=True, config=leg_cfg,
                      split_k=buf, splits=leg_split)
        else:
            skinny_mm(x, front[i % copies][:, E + lo:E + hi], rest[:, lo:hi], tma=True, config=cfg)

    def head(i, cut: bool, shared: bool = True, small: bool = False):
        main = torch.cuda.current_stream()
        fork(main, s2, enabled=True)
        with torch.cuda.stream(s2):
            gemv(x, router_t[i % copies], logits)
            moe_router(logits, bias, ids, wts, align=seg)
        mm(i, 0, L if cut else W - E)
        if cut and shared:
            fork(main, s1, enabled=True)
            with torch.cuda.stream(s1):
                mm(i, L, W - E, small)
        join(main, s2, enabled=True)
        if cut and shared:
            join(main, s1, enabled=True)

    forms = {"front's rest alone": lambda i: mm(i, 0, W - E), "latent columns alone": lambda i: mm(i, 0, L),
             "shared columns alone": lambda i: mm(i, L, W - E),
             "c72 head: [router leg] || rest": lambda i: head(i, False),
             "shared_front_leg head: [router leg] || latent, S1 shared joined": lambda i: head(i, True),
             "shared_front_leg head without the shared GEMM": lambda i: head(i, True, False),
             f"shared columns alone at {LEG_SMALL}": lambda i: mm(i, L, W - E, True),
             f"shared_front_leg head, S1 at {LEG_SMALL}": lambda i: head(i, True, small=True)}
    res = {}
    with early_trigger():
        for tag, fn in forms.items():
            res[f"{tag}, back to back"] = per_call_us(fn, calls)
            res[f"{tag}, one call"] = single_call_us(fn, copies)
    del front, router_t
    torch.cuda.empty_cache()
    return res


def linear_tma(B: int, calls: int) -> dict[str, float]:
    """Variant linear_tma: each skinny GEMM at its committed config with pointer loads and
    with TMA, back to back and one call at a time, then TMA over TMA_SWEEP one call at a time
    (what the step's critical path pays). The front's rest is a column slice, as in the step."""
    from kernels.k3.ops.gemv import SKINNY_CONFIGS, SKINNY_DEFAULT, skinny_mm

    g = torch.Generator(device="cuda").manual_seed(5)
    res = {}
    for name, (K, N, wide, _) in TMA_SHAPES.items():
        n = _copies(K * wide * 2)
        ws = [(torch.randn(K, wide, device="cuda", dtype=BF, generator=g) * K ** -0.5)[:, wide - N:]
              for _ in range(n)]
        x = torch.randn(B, K, device="cuda", dtype=BF, generator=g)
        out = torch.empty(B, N, device="cuda", dtype=BF)
        now = SKINNY_CONFIGS.get((K, N), SKINNY_DEFAULT)
        for tma in (False, True):
            tag = f"{name} {'tma' if tma else 'pointer'} {now}"
            res[tag + " back to back"] = per_call_us(lambda i, t=tma: skinny_mm(x, ws[i % n], out, tma=t), calls)
            res[tag + " one call"] = single_call_us(lambda i, t=tma: skinny_mm(x, ws[i % n], out, tma=t), n)
        for cfg in TMA_SWEEP:
            if cfg == now:
                continue
            try:  # a tile TMA cannot take here must not end the whole case
                res[f"{name} tma {cfg} one call"] = _try_us(
                    lambda i, c=cfg: skinny_mm(x, ws[i % n], out, config=c, tma=True), calls, n)
            except Exception as exc:  # noqa: BLE001 - reported, then the sweep goes on
                torch.cuda.synchronize()
                print(f"linear_tma {name} {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                res[f"{name} tma {cfg} one call"] = float("inf")
        del ws
        torch.cuda.empty_cache()
    return res


#: Variant linear_prefetch:<MB> sizes the chains below are timed at.
PREFETCH_MB = (4, 8, 16)


def prefetch_chains(B: int, calls: int) -> dict[str, float]:
    """Variants linear_prefetch:<MB> and pdl_trigger_first, on two chains of the c24 step at
    one token (early triggers, TMA weights): the pre-MLP aggregation (8 bank rows, the
    attention output folded) -> the MoE front's rest GEMM, and the MoE tail's weighted sum
    -> latent norm -> up GEMM. Each with no prefetch and with each size, with and without
    first triggers; back to back (the next chain's first kernel launches at the GEMM's
    early trigger, as in the step) and one call at a time. GEMM weights rotate past L2."""
    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops.common import early_trigger, trigger_first
    from kernels.k3.ops.gemv import skinny_mm
    from kernels.k3.ops.moe import moe_weighted_sum
    from kernels.k3.ops.norm import rmsnorm

    if B != 1:
        return {}
    H, g = 7168, torch.Generator(device="cuda").manual_seed(11)
    bank, query, gamma, scores, x = _attn_res_inputs(1)
    attn_out = torch.randn(1, H, device="cuda", dtype=BF, generator=g)
    fronts = [(torch.randn(H, 6016, device="cuda", dtype=BF, generator=g) * H ** -0.5)[:, 896:]
              for _ in range(_copies(H * 6016 * 2))]
    front_out = torch.empty(1, 5120, device="cuda", dtype=BF)
    K, E = 3584, 16
    y = torch.randn(E, K, device="cuda", dtype=BF, generator=g)
    wts = torch.rand(1, E, device="cuda", dtype=F32, generator=g)
    lat_gamma = torch.randn(K, device="cuda", dtype=BF, generator=g)
    ups = [torch.randn(K, H, device="cuda", dtype=BF, generator=g) * K ** -0.5 for _ in range(_copies(K * H * 2))]
    lat, lat_n, up_out = (torch.empty(1, n, device="cuda", dtype=BF) for n in (K, K, H))

    def pre_mlp(i, mb, first):
        with trigger_first(first):
            A.attn_res_score(bank, 8, query, scores, addend=attn_out, gram_dot=True)
            A.attn_res_combine(bank, 8, scores, gamma, x, one_shot=True)
        skinny_mm(x, fronts[i % len(fronts)], front_out, tma=True, prefetch_bytes=mb << 20)

    def tail(i, mb, first):
        with trigger_first(first):
            moe_weighted_sum(y, wts, lat)
            rmsnorm(lat, lat_gamma, lat_n)
        skinny_mm(lat_n, ups[i % len(ups)], up_out, tma=True, prefetch_bytes=mb << 20)

    res = {}
    with early_trigger():
        for name, chain, copies in (("combine -> front", pre_mlp, len(fronts)), ("sum -> norm -> up", tail, len(ups))):
            for first in (False, True):
                for mb in (0, *PREFETCH_MB):
                    tag = f"{name}{' first' if first else ''} prefetch {mb} MB"
                    res[tag] = per_call_us(lambda i, m=mb, f=first: chain(i, m, f), calls)
                    res[tag + " one call"] = single_call_us(lambda i, m=mb, f=first: chain(i, m, f), copies)
    return res


#: window_prefetch's sizes (MB of the front's first weight rows asked of L2).
WINDOW_MB = (8, 16, 32)


def window_prefetch(B: int, calls: int) -> dict[str, float]:
    """Variant prefetch:<MB> on c72's longest latency window at one token: the o_proj
    (skinny, as the MLA layers' and triton_o_proj's) -> the pre-MLP score (the attention
    output folded, 1024-column chunks) -> the one-shot combine -> the MoE front's rest (TMA,
    tuned), early triggers. HBM idles through the score and the combine; these forms ask L2
    for the first MB of the front's weight (the rows every front program streams first)
    while it would:
    - the score, bulk (round three's form, where round three had it: after its wait);
    - the score, one `prefetch.global.L2` per line (prefetch_lines), after its stores;
    - the o_proj, per line, each of its 112 programs its share after its stores.
    One call at a time (what the step's path pays; every weight rotated past L2, the
    prefetched copy the one the front then reads) and back to back; each form twice."""
    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops import gemv as G
    from kernels.k3.ops.common import early_trigger, prefetch_lines

    if B != 1:
        return {}
    H, K = 7168, 1536
    g = torch.Generator(device="cuda").manual_seed(13)
    bank, query, gamma, _, x = _attn_res_inputs(1)
    scores = A.alloc_attn_res_scores(bank, A.WIDE_BLOCK_H)
    copies = max(_copies(H * 6016 * 2), _copies(K * H * 2))
    a = torch.randn(1, K, device="cuda", dtype=BF, generator=g)
    o_projs = [torch.randn(K, H, device="cuda", dtype=BF, generator=g) * K ** -0.5 for _ in range(copies)]
    fronts = [torch.randn(H, 6016, device="cuda", dtype=BF, generator=g) * H ** -0.5 for _ in range(copies)]
    o = torch.empty(1, H, device="cuda", dtype=BF)
    front_out = torch.empty(1, 5120, device="cuda", dtype=BF)
    config = G.TMA_CONFIGS.get((H, 5120))

    def chain(i, mb, issuer):
        front = fronts[i % copies]
        by_score = dict(prefetch=front, prefetch_bytes=mb << 20) if issuer == "score" else {}
        by_o_proj = dict(next_weight=front, next_bytes=mb << 20) if issuer == "o_proj" else {}
        G.skinny_mm(a, o_projs[i % copies], o, **by_o_proj)
        A.attn_res_score(bank, 8, query, scores, addend=o, gram_dot=True, block_h=A.WIDE_BLOCK_H, **by_score)
        A.attn_res_combine(bank, 8, scores, gamma, x, one_shot=True, block_h=A.WIDE_BLOCK_H)
        G.skinny_mm(x, front[:, 896:], front_out, tma=True, config=config)

    forms = [("no prefetch", 0, "", False)] + [
        (f"{who}, {form} {mb} MB", mb, who, form == "lines")
        for who, form in (("score", "bulk"), ("score", "lines"), ("o_proj", "lines")) for mb in WINDOW_MB]
    res = {}
    with early_trigger():
        for rnd in (1, 2):
            for tag, mb, who, lines in forms:
                with prefetch_lines(lines):
                    fn = (lambda i, m=mb, w=who: chain(i, m, w))
                    res[f"one call: {tag}, {rnd}"] = single_call_us(fn, copies)
                    res[f"back to back: {tag}, {rnd}"] = per_call_us(fn, calls)
    del o_projs, fronts
    torch.cuda.empty_cache()
    return res


def _skinny_shapes(g: torch.Generator):
    """Each skinny GEMM shape of the c44 step (TMA_SHAPES): its name, weight copies (rotated
    past the L2), x, out, and the Triton kernel as it runs there (TMA where K is the hidden
    size) with its tag. The weights are freed once the caller moves on."""
    from kernels.k3.ops.gemv import SKINNY_CONFIGS, SKINNY_DEFAULT, TMA_CONFIGS, skinny_mm

    for name, (K, N, wide, _) in TMA_SHAPES.items():
        n = _copies(K * wide * 2)
        ws = [(torch.randn(K, wide, device="cuda", dtype=BF, generator=g) * K ** -0.5)[:, wide - N:]
              for _ in range(n)]
        x = torch.randn(1, K, device="cuda", dtype=BF, generator=g)
        out = torch.empty(1, N, device="cuda", dtype=BF)
        tma = K == 7168
        cfg = TMA_CONFIGS.get((K, N)) if tma else None
        tag = f"{name} triton {cfg or SKINNY_CONFIGS.get((K, N), SKINNY_DEFAULT)}{' tma' if tma else ''}"
        yield name, n, ws, x, out, tag, (lambda i: skinny_mm(x, ws[i % n], out, tma=tma, config=cfg))
        del ws
        torch.cuda.empty_cache()


#: Variant linear_gluon: configs (block_n, block_k, warps, stages, early) tried at each shape.
GLUON_SWEEP = [(64, 128, 8, 8, 0), (64, 128, 8, 8, 4), (64, 128, 8, 8, 8), (64, 128, 4, 8, 4), (64, 256, 8, 4, 2),
               (64, 256, 8, 4, 4), (128, 128, 8, 6, 3), (64, 64, 4, 16, 8)]


def linear_gluon(B: int, calls: int) -> dict[str, float]:
    """Variant linear_gluon at one token: each skinny GEMM of the c44 step as it runs there
    (the Triton kernel, TMA where K is the hidden size) against the Gluon kernel over
    GLUON_SWEEP, back to back and one call at a time; then the chain the front sits in
    (pre-MLP aggregation -> front's rest, early triggers, back to back as in the step),
    where the Gluon kernel's weight copies before its wait can overlap the aggregation."""
    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops.common import early_trigger
    from kernels.k3.ops.gemv import TMA_CONFIGS, skinny_mm
    from kernels.k3.ops.gemv_gluon import skinny_gl

    if B != 1:
        return {}
    g = torch.Generator(device="cuda").manual_seed(12)
    res = {}
    with early_trigger():
        for name, n, ws, x, out, tag, triton_call in _skinny_shapes(g):
            res[tag + " back to back"] = per_call_us(triton_call, calls)
            res[tag + " one call"] = single_call_us(triton_call, n)
            for c in GLUON_SWEEP:
                try:  # a config the GPU cannot hold must not end the case
                    res[f"{name} gluon {c} back to back"] = per_call_us(lambda i, c=c: skinny_gl(x, ws[i % n], out, config=c),
                                                                        calls)
                    res[f"{name} gluon {c} one call"] = single_call_us(lambda i, c=c: skinny_gl(x, ws[i % n], out, config=c), n)
                except Exception as exc:  # noqa: BLE001 - reported, then the sweep goes on
                    torch.cuda.synchronize()
                    print(f"linear_gluon {name} {c}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        bank, query, gamma, scores, x = _attn_res_inputs(1)
        attn_out = torch.randn(1, 7168, device="cuda", dtype=BF, generator=g)
        fronts = [(torch.randn(7168, 6016, device="cuda", dtype=BF, generator=g) * 7168 ** -0.5)[:, 896:]
                  for _ in range(_copies(7168 * 6016 * 2))]
        front_out = torch.empty(1, 5120, device="cuda", dtype=BF)

        def pre_mlp(i, c):
            A.attn_res_score(bank, 8, query, scores, addend=attn_out, gram_dot=True)
            A.attn_res_combine(bank, 8, scores, gamma, x, one_shot=True)
            if c is None:
                skinny_mm(x, fronts[i % len(fronts)], front_out, tma=True, config=TMA_CONFIGS.get((7168, 5120)))
            else:
                skinny_gl(x, fronts[i % len(fronts)], front_out, config=c)

        for c in (None, (64, 128, 8, 8, 0), (64, 128, 8, 8, 4), (64, 128, 8, 8, 8), (64, 256, 8, 4, 4)):
            tag = f"combine -> front {'triton' if c is None else f'gluon {c}'}"
            res[tag] = per_call_us(lambda i, c=c: pre_mlp(i, c), calls)
            res[tag + " one call"] = single_call_us(lambda i, c=c: pre_mlp(i, c), len(fronts))
    return res


#: Variant linear_ws: configs (block_n, block_k, consumer warps, stages, mma, maxnreg) tried.
WS_SWEEP = [(64, 128, 4, 8, 1, 128), (64, 128, 4, 8, 0, 128), (64, 128, 4, 4, 1, 128), (64, 128, 4, 6, 1, 128),
            (64, 64, 4, 16, 1, 128), (64, 256, 4, 4, 1, 128), (128, 128, 4, 6, 1, 128), (32, 128, 4, 8, 1, 128),
            (64, 128, 4, 8, 1, 80), (64, 128, 8, 8, 1, 128)]


def linear_ws(B: int, calls: int) -> dict[str, float]:
    """Variant linear_ws at one token: each skinny GEMM of the c44 step as it runs there (the
    Triton kernel, TMA where K is the hidden size), the Gluon kernel at its committed config,
    and the warp-specialized one over WS_SWEEP, back to back and one call at a time."""
    from kernels.k3.ops.common import early_trigger
    from kernels.k3.ops.gemv_gluon import skinny_gl, skinny_ws

    if B != 1:
        return {}
    g = torch.Generator(device="cuda").manual_seed(13)
    res = {}
    with early_trigger():
        for name, n, ws, x, out, tag, triton_call in _skinny_shapes(g):
            res[tag + " back to back"] = per_call_us(triton_call, calls)
            res[tag + " one call"] = single_call_us(triton_call, n)
            res[f"{name} gluon back to back"] = per_call_us(lambda i: skinny_gl(x, ws[i % n], out), calls)
            res[f"{name} gluon one call"] = single_call_us(lambda i: skinny_gl(x, ws[i % n], out), n)
            for c in WS_SWEEP:
                try:  # a config the GPU cannot hold must not end the case
                    res[f"{name} ws {c} back to back"] = per_call_us(lambda i, c=c: skinny_ws(x, ws[i % n], out, config=c),
                                                                     calls)
                    res[f"{name} ws {c} one call"] = single_call_us(lambda i, c=c: skinny_ws(x, ws[i % n], out, config=c), n)
                except Exception as exc:  # noqa: BLE001 - reported, then the sweep goes on
                    torch.cuda.synchronize()
                    print(f"linear_ws {name} {c}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return res


#: moe_down_mix configs swept one call at a time: (BLOCK_N, BLOCK_K, warps, stages).
DOWN_MIX_SWEEP = [(bn, bk, w, st) for bn in (16, 32, 64) for bk in (64, 128) for w in (4, 8) for st in (3, 4, 6)]


def moe_down(B: int, calls: int) -> dict[str, float]:
    """Variant moe_down_mixed at the K3 down shape (896 experts of 3584 x 384, top-16): the
    grouped down GEMM + the weighted sum against moe_down_mix, with and without the routed
    SiTU in front (situ_fused), back to back and one call at a time; then moe_down_mix over
    DOWN_MIX_SWEEP one call at a time. Each call routes to another draw of 16 experts, so the
    calls stream distinct weights (44 MB each) as the step's layers do."""
    from kernels.k3.ops import moe

    assert B == 1, "moe_down_mixed is a one-token variant"
    g = torch.Generator(device="cuda").manual_seed(6)
    E, N, K, top_k = 896, 3584, 384, 16
    w2 = torch.randn(E, N, K, device="cuda", dtype=BF, generator=g) * K ** -0.5
    n = 16  # 16 draws x 44 MB: no call finds its weights in L2
    ids = [torch.randperm(E, generator=torch.Generator().manual_seed(60 + i))[:top_k].to("cuda", torch.int32)[None]
           for i in range(n)]
    aligned = []
    for i in range(n):
        al = (torch.empty(top_k, device="cuda", dtype=torch.int32), torch.empty(top_k, device="cuda", dtype=torch.int32),
              torch.empty(top_k + 1, device="cuda", dtype=torch.int32), torch.empty(1, device="cuda", dtype=torch.int32))
        moe.moe_align(ids[i], E, *al)
        aligned.append(al)
    tw = torch.rand(1, top_k, device="cuda", generator=g)
    gu = torch.randn(top_k, 2 * K, device="cuda", dtype=BF, generator=g)
    h = torch.empty(top_k, K, device="cuda", dtype=BF)
    y = torch.empty(top_k, N, device="cuda", dtype=BF)
    out = torch.empty(1, N, device="cuda", dtype=BF)

    def pair(i, act=False):
        if act:
            moe.situ_mul(gu, h)
        moe.moe_grouped_gemm(h, w2, *aligned[i % n], y, top_k=top_k, x_is_per_token=False)
        moe.moe_weighted_sum(y, tw, out)

    def mixed(i, act=False, config=None):
        moe.moe_down_mix(gu if act else h, w2, ids[i % n], tw, out, act_in=act, config=config)

    moe.situ_mul(gu, h)
    res = {}
    for tag, act in (("", False), (" (situ in front)", True)):
        res[f"grouped down + weighted sum{tag} back to back"] = per_call_us(lambda i, a=act: pair(i, a), calls)
        res[f"grouped down + weighted sum{tag} one call"] = single_call_us(lambda i, a=act: pair(i, a), n)
        res[f"moe_down_mix{tag} back to back {moe.DOWN_MIX_CONFIG}"] = per_call_us(lambda i, a=act: mixed(i, a), calls)
        res[f"moe_down_mix{tag} one call {moe.DOWN_MIX_CONFIG}"] = single_call_us(lambda i, a=act: mixed(i, a), n)
    for cfg in DOWN_MIX_SWEEP:
        if cfg != moe.DOWN_MIX_CONFIG:
            res[f"moe_down_mix sweep {cfg} one call"] = _try_us(lambda i, c=cfg: mixed(i, config=c), calls, n)
    del w2
    torch.cuda.empty_cache()
    return res


def _routed_chain(seed: int):
    """The routed chain at the K3 shapes, one token, as c51 runs it: gate|up GEMM -> situ_mul ->
    down GEMM -> weighted sum -> latent norm, or (atomic) the down GEMM's atomic sum -> norm,
    or (act_out) SiTU in the gate|up epilogue; each call i routed to another draw of 16
    experts (132 MB of weights). Returns (chain(i, atomic, act_out, gu_blocks, down_blocks), draws)."""
    from kernels.k3.ops import moe, norm
    from kernels.k3.ops.common import trigger_first

    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I, top_k = 896, 3584, 384, 16
    w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=BF, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, I, device="cuda", dtype=BF, generator=g) * I ** -0.5
    n = 16
    aligned = []
    for i in range(n):
        ids = torch.randperm(E, generator=torch.Generator().manual_seed(90 + i))[:top_k].to("cuda", torch.int32)[None]
        al = (torch.empty(top_k, device="cuda", dtype=torch.int32), torch.empty(top_k, device="cuda", dtype=torch.int32),
              torch.empty(top_k + 1, device="cuda", dtype=torch.int32), torch.empty(1, device="cuda", dtype=torch.int32))
        moe.moe_align(ids, E, *al)
        aligned.append(al)
    x = torch.randn(1, H, device="cuda", dtype=BF, generator=g)
    tw = torch.rand(1, top_k, device="cuda", generator=g)
    gamma = torch.randn(H, device="cuda", dtype=BF, generator=g)
    gu = torch.empty(top_k, 2 * I, device="cuda", dtype=BF)
    h = torch.empty(top_k, I, device="cuda", dtype=BF)
    y = torch.empty(top_k, H, device="cuda", dtype=BF)
    lat, lat_n = torch.empty(1, H, device="cuda", dtype=BF), torch.empty(1, H, device="cuda", dtype=BF)
    acc = torch.zeros(1, H, device="cuda", dtype=torch.float32)

    def chain(i, atomic, act_out, gu_blocks=None, down_blocks=None, ahead=False):
        # ahead (variant moe_weights_ahead): situ_mul and the norm trigger first; the blocks
        # passed are then moe.AHEAD_CONFIGS', each GEMM's first ones loaded before its wait.
        al = aligned[i % n]
        if act_out:
            moe.moe_grouped_gemm(x, w13, *al, h, top_k=top_k, act_out=True, **(gu_blocks or {}))
        else:
            moe.moe_grouped_gemm(x, w13, *al, gu, top_k=top_k, **(gu_blocks or {}))
            with trigger_first(ahead):
                moe.situ_mul(gu, h)
        if atomic:
            moe.moe_grouped_gemm(h, w2, *al, acc, top_k=top_k, x_is_per_token=False, sum_weights=tw,
                                 **(down_blocks or {}))
            with trigger_first(ahead):
                norm.rmsnorm(acc, gamma, lat_n, clear_input=True)
        else:
            moe.moe_grouped_gemm(h, w2, *al, y, top_k=top_k, x_is_per_token=False, **(down_blocks or {}))
            moe.moe_weighted_sum(y, tw, lat)
            norm.rmsnorm(lat, gamma, lat_n)

    return chain, n


def moe_hops(B: int, calls: int) -> dict[str, float]:
    """Variants moe_down_atomic and situ_in_gate_up at the K3 routed shapes, one token: the
    chain from the gate|up GEMM to the latent norm as the step runs it (early triggers), in
    four forms: as c49 (gate|up GEMM -> situ_mul -> down GEMM -> weighted sum -> norm), with
    the down GEMM's atomic sum (the sum's launch gone), with SiTU in the gate|up epilogue
    (situ_mul's gone), and both; back to back and one call at a time (_routed_chain)."""
    from kernels.k3.ops.common import early_trigger

    if B != 1:
        return {}
    chain, n = _routed_chain(31)
    res = {}
    with early_trigger():
        for tag, atomic, act_out in (("c49", False, False), ("moe_down_atomic", True, False),
                                     ("situ_in_gate_up", False, True), ("both", True, True)):
            res[f"gate|up -> norm, {tag}, back to back"] = per_call_us(lambda i, a=atomic, o=act_out: chain(i, a, o),
                                                                     calls)
            res[f"gate|up -> norm, {tag}, one call"] = single_call_us(lambda i, a=atomic, o=act_out: chain(i, a, o), n)
    del chain  # its weights
    torch.cuda.empty_cache()
    return res


def grouped_tuned(B: int, calls: int) -> dict[str, float]:
    """Variant moe_grouped_tuned at one token: c64's routed chain (gate|up -> situ_mul -> down
    GEMM's atomic sum -> norm, early triggers) with the down GEMM at the defaults and at
    moe.GROUPED_CONFIGS' blocks, each form twice in turn (the one-call figures of this chain
    moved by several us between two timings of one form in round twelve's sweep)."""
    from kernels.k3.ops import moe
    from kernels.k3.ops.common import early_trigger

    if B != 1:
        return {}
    chain, n = _routed_chain(43)
    tuned = dict(zip(("block_n", "block_k", "num_warps", "num_stages"), moe.GROUPED_CONFIGS[(3584, 384)]))
    res = {}
    with early_trigger():
        for rnd in (1, 2):
            for tag, down in (("c64: down GEMM at (64, 128, 4, 4)", None), ("moe_grouped_tuned: down GEMM at "
                                                                            + str(moe.GROUPED_CONFIGS[(3584, 384)]), tuned)):
                res[f"{tag}, back to back, {rnd}"] = per_call_us(lambda i, d=down: chain(i, True, False, None, d), calls)
                res[f"{tag}, one call, {rnd}"] = single_call_us(lambda i, d=down: chain(i, True, False, None, d), n)
    del chain  # its weights
    torch.cuda.empty_cache()
    return res


def _routed_chain_ab(chain, n: int, forms: tuple, calls: int) -> dict[str, float]:
    """The routed chain with the down GEMM's atomic sum (early triggers) in each (tag, chain
    keywords) form, twice in turn, back to back and one call at a time."""
    from kernels.k3.ops.common import early_trigger

    res = {}
    with early_trigger():
        for rnd in (1, 2):
            for tag, kw in forms:
                res[f"{tag}, back to back, {rnd}"] = per_call_us(lambda i, k=kw: chain(i, True, False, **k), calls)
                res[f"{tag}, one call, {rnd}"] = single_call_us(lambda i, k=kw: chain(i, True, False, **k), n)
    return res


def weights_ahead(B: int, calls: int) -> dict[str, float]:
    """Variant moe_weights_ahead at one token: c72's routed chain (gate|up -> situ_mul -> the
    down GEMM's atomic sum -> norm, early triggers, the down GEMM at moe.GROUPED_CONFIGS'
    blocks) against the same chain with the grouped GEMMs at moe.AHEAD_CONFIGS, their first
    blocks loaded before their wait, situ_mul and the norm triggering first; each form twice
    in turn, back to back (each call's gate|up GEMM following the last call's norm) and one
    call at a time."""
    from kernels.k3.ops import moe

    if B != 1:
        return {}
    chain, n = _routed_chain(47)
    tuned = dict(zip(("block_n", "block_k", "num_warps", "num_stages"), moe.GROUPED_CONFIGS[(3584, 384)]))
    ahead = [dict(zip(("block_n", "block_k", "num_warps", "num_stages", "preload"), moe.AHEAD_CONFIGS[shape]))
             for shape in ((768, 3584), (3584, 384))]
    forms = (("c72", dict(down_blocks=tuned)),
             ("moe_weights_ahead", dict(gu_blocks=ahead[0], down_blocks=ahead[1], ahead=True)))
    res = _routed_chain_ab(chain, n, forms, calls)
    del chain  # its weights
    torch.cuda.empty_cache()
    return res


def grouped_tma(B: int, calls: int) -> dict[str, float]:
    """Variant moe_grouped_tma at one token: c72's routed chain (gate|up -> situ_mul -> the down
    GEMM's atomic sum -> norm, early triggers, the down GEMM at moe.GROUPED_CONFIGS' blocks)
    with pointer loads and with both grouped GEMMs' weight tiles by TMA, back to back (132 MB
    of experts a chain, each call routed to another draw of 16) and one call at a time. Each
    form twice in turn."""
    from kernels.k3.ops import moe

    if B != 1:
        return {}
    chain, n = _routed_chain(53)
    tuned = dict(zip(("block_n", "block_k", "num_warps", "num_stages"), moe.GROUPED_CONFIGS[(3584, 384)]))
    forms = (("c72", dict(down_blocks=tuned)),
             ("moe_grouped_tma", dict(gu_blocks={"tma": True}, down_blocks={**tuned, "tma": True})))
    res = _routed_chain_ab(chain, n, forms, calls)
    del chain  # its weights
    torch.cuda.empty_cache()
    return res


def attn_res_wide(B: int, calls: int) -> dict[str, float]:
    """Variant attn_res_wide at one token: c68's pair (attn_res_dot's score with the attention
    output folded in -> one-shot combine, early triggers) at the default column chunk and at
    WIDE_BLOCK_H. Call i reads the bank rows of the step's aggregation i (the full-depth
    schedule, 1..8 rows), so a figure is the mean over the step's 186 aggregations (one call
    at a time: each row count alone, weighted by its count). Each form twice in turn. The
    bank (115 kB) stays in L2, as in the step, where the previous layer wrote it. Then the
    pair followed by the GEMM it releases in the step (the MoE front's rest), back to back."""
    from kernels.k3.config import K3Config
    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops.common import early_trigger
    from kernels.k3.ops.gemv import skinny_mm

    if B != 1:
        return {}
    cfg = K3Config()
    rows = [cfg.bank_rows(l, site) for l in cfg.layers for site in ("attn", "mlp")]
    bank, query, gamma, _, x = _attn_res_inputs(1)
    g = torch.Generator(device="cuda").manual_seed(5)
    addend = torch.randn(1, bank.shape[-1], device="cuda", dtype=BF, generator=g)
    H = bank.shape[-1]
    fronts = [(torch.randn(H, 6016, device="cuda", dtype=BF, generator=g) * H ** -0.5)[:, 896:]
              for _ in range(_copies(H * 6016 * 2))]
    front_out = torch.empty(1, 5120, device="cuda", dtype=BF)
    res = {}
    with early_trigger():
        for rnd in (1, 2):
            for tag, block_h in (("c68: pair at the default chunk", 0), (f"attn_res_wide: pair at {A.WIDE_BLOCK_H} columns", A.WIDE_BLOCK_H)):
                scores = A.alloc_attn_res_scores(bank, block_h)

                def pair(i, s=scores, bh=block_h):
                    n = rows[i % len(rows)]
                    A.attn_res_score(bank, n, query, s, addend=addend, gram_dot=True, block_h=bh)
                    A.attn_res_combine(bank, n, s, gamma, x, one_shot=True, block_h=bh)

                res[f"{tag}, back to back, {rnd}"] = per_call_us(pair, len(rows))
                # As in the step: the GEMM the pair releases (the MoE front's rest by TMA, its
                # weights rotated past L2) launches at the combine's early trigger.
                res[f"{tag} -> the MoE front's rest, back to back, {rnd}"] = per_call_us(
                    lambda i, p=pair: (p(i), skinny_mm(x, fronts[i % len(fronts)], front_out, tma=True)), len(rows))
                # One call at a time: each row count alone, weighted by its share of the step.
                alone = {n: single_call_us(lambda i, n=n: pair(rows.index(n)), 1) for n in set(rows)}
                res[f"{tag}, one call, {rnd}"] = sum(alone[n] for n in rows) / len(rows)
    del fronts  # their weights
    torch.cuda.empty_cache()
    return res


#: moe_grouped_tuned's candidates: (block_n, block_k, num_warps, num_stages).
GROUPED_SWEEP = ([(bn, bk, 4, st) for bn in (32, 64, 128) for bk in (64, 128, 256) for st in (3, 4, 6)]
                 + [(128, bk, 8, st) for bk in (64, 128, 256) for st in (3, 4, 6)])


def grouped_chain_sweep(B: int) -> dict[str, dict]:
    """moe_grouped_tuned's candidates at one token: c51's routed chain (gate|up -> situ_mul ->
    down GEMM's atomic sum -> norm, early triggers) one call at a time, with one grouped
    GEMM's blocks changed and the other's at the defaults (64, 128, 4, 4)."""
    from kernels.k3.ops.common import early_trigger

    if B != 1:
        return {}
    chain, n = _routed_chain(41)
    res = {}
    with early_trigger():
        for name, shape, key in (("gate_up", "768x3584", "gu_blocks"), ("down", "3584x384", "down_blocks")):
            rows = {}
            for c in GROUPED_SWEEP:
                blocks = dict(zip(("block_n", "block_k", "num_warps", "num_stages"), c))
                rows[",".join(map(str, c))] = _try_us(lambda i, b=blocks: chain(i, True, False, **{key: b}), 0, n)
            best = sorted(rows, key=rows.get)
            res[name] = {"shape": shape, "default_us": rows["64,128,4,4"], "best": best[:3],
                         "best_us": [rows[k] for k in best[:3]], "all": rows}
    del chain  # its weights
    torch.cuda.empty_cache()
    return res


def shared_up(B: int, calls: int) -> dict[str, float]:
    """Variant shared_in_up at one token: the MoE up GEMM (skinny, 3584 x 7168) and the shared
    experts' down GEMM (cuBLAS, 768 x 7168) each alone, one after the other, and as one skinny
    GEMM over their weights stacked along K (4352 x 7168); back to back and one call at a time."""
    from kernels.k3.ops.common import early_trigger
    from kernels.k3.ops.gemv import skinny_mm

    if B != 1:
        return {}
    g = torch.Generator(device="cuda").manual_seed(37)
    H, L, S = 7168, 3584, 768
    n = _copies((L + S) * H * 2)
    cats = [torch.randn(L + S, H, device="cuda", dtype=BF, generator=g) * L ** -0.5 for _ in range(n)]
    x = torch.randn(1, L + S, device="cuda", dtype=BF, generator=g)
    out, out2 = torch.empty(1, H, device="cuda", dtype=BF), torch.empty(1, H, device="cuda", dtype=BF)
    forms = {"up alone": lambda i: skinny_mm(x[:, :L], cats[i % n][:L], out),
             "shared down alone (cuBLAS)": lambda i: torch.mm(x[:, L:], cats[i % n][L:], out=out2),
             "up then shared down": lambda i: (skinny_mm(x[:, :L], cats[i % n][:L], out),
                                               torch.mm(x[:, L:], cats[i % n][L:], out=out2)),
             "stacked (shared_in_up)": lambda i: skinny_mm(x, cats[i % n], out)}
    res = {}
    with early_trigger():
        for tag, fn in forms.items():
            res[f"{tag} back to back"] = per_call_us(fn, calls)
            res[f"{tag} one call"] = single_call_us(fn, n)
    del cats
    torch.cuda.empty_cache()
    return res


def _copies(nbytes: int) -> int:
    return max(2, -(-240_000_000 // nbytes))  # > 4x the L2 in flight across the calls


#: (K, N) of the dense GEMMs a bs1 step streams, with the layers that run each.
LINEAR_SHAPES = {"moe front (rest, router_fork)": (7168, 5120, 92), "moe front": (7168, 6016, 92),
                 "kda qkvg": (7168, 6144, 69), "moe up": (3584, 7168, 92), "kda o_proj": (1536, 7168, 69),
                 "mla q_a / g_proj": (7168, 1536, 48), "mla o_proj": (1536, 7168, 24),
                 "mla q_a | kv_a | g_proj (mla_proj_merged)": (7168, 3648, 24),
                 "shared down": (768, 7168, 92)}
SKINNY_SWEEP = [(bn, bk, w, st) for bn in (16, 32, 64, 128) for bk in (128, 256) for w in (4, 8)
                for st in (4, 6, 8)]


def _try_us(fn, calls: int, copies: int = 0) -> float:
    """per_call_us (copies = 0) or single_call_us over `copies` weight copies, or inf for a
    config the GPU cannot hold (shared memory)."""
    from triton.runtime.errors import OutOfResources

    try:
        return single_call_us(fn, copies) if copies else per_call_us(fn, calls)
    except OutOfResources:
        torch.cuda.synchronize()
        return float("inf")


def _linear_shapes(B: int, only: tuple[str, ...]):
    """Per dense shape (those whose name contains one of `only`, when given): its name, K, N,
    layers, an input, weight copies rotated past the L2 (`ws[i % n]`) and an output."""
    g = torch.Generator(device="cuda").manual_seed(3)
    for name, (K, N, layers) in LINEAR_SHAPES.items():
        if only and not any(o in name for o in only):
            continue
        n = _copies(K * N * 2)
        ws = [torch.randn(K, N, device="cuda", dtype=BF, generator=g) * K ** -0.5 for _ in range(n)]
        x = torch.randn(B, K, device="cuda", dtype=BF, generator=g)
        yield name, K, N, layers, x, ws, n, torch.empty(B, N, device="cuda", dtype=BF)
        del ws
        torch.cuda.empty_cache()


def linear_sweep(B: int, calls: int, only: tuple[str, ...] = (), latency: bool = False) -> dict[str, dict]:
    """torch.mm (cuBLAS) against the skinny Triton GEMM over its config sweep, per shape;
    `latency`: each form timed one call at a time (single_call_us), not back to back, with
    the config the table holds now beside the best."""
    from kernels.k3.ops.gemv import SKINNY_CONFIGS, SKINNY_DEFAULT, skinny_mm

    res = {}
    for name, K, N, layers, x, ws, n, out in _linear_shapes(B, only):
        copies = n if latency else 0
        cublas = _try_us(lambda i: torch.mm(x, ws[i % n], out=out), calls, copies)
        best = None
        for cfg in SKINNY_SWEEP:
            us = _try_us(lambda i, c=cfg: skinny_mm(x, ws[i % n], out, config=c), calls, copies)
            if best is None or us < best[1]:
                best = (cfg, us)
        tb = K * N * 2 / (best[1] * 1e-6) / 1e12
        res[name] = {"K": K, "N": N, "layers": layers, "cublas_us": cublas, "best_config": best[0],
                     "skinny_us": best[1], "skinny_tb_s": tb, "cublas_tb_s": K * N * 2 / (cublas * 1e-6) / 1e12}
        if latency:
            now = SKINNY_CONFIGS.get((K, N), SKINNY_DEFAULT)
            res[name].update(table_config=now, table_us=_try_us(
                lambda i: skinny_mm(x, ws[i % n], out, config=now), calls, copies))
    return res


SPLIT_CONFIGS = [(64, 256, 8, 4), (64, 128, 4, 4), (128, 256, 8, 3), (32, 256, 4, 4), (64, 256, 4, 3),
                 (128, 128, 8, 4)]
SPLITS = (2, 3, 4, 6, 8)


def split_sweep(B: int, calls: int, only: tuple[str, ...] = ()) -> dict[str, dict]:
    """Variant linear_split_k: per shape, the unsplit skinny GEMM at its own config (or the
    default) against the best (config, split) over SPLIT_CONFIGS x SPLITS."""
    from kernels.k3.ops.gemv import SKINNY_CONFIGS, SKINNY_DEFAULT, alloc_split_k, skinny_mm

    res = {}
    for name, K, N, layers, x, ws, n, out in _linear_shapes(B, only):
        buf = alloc_split_k(N, "cuda")
        mine = SKINNY_CONFIGS.get((K, N), SKINNY_DEFAULT)  # the unsplit kernel's own choice (its sweep)
        unsplit = min((_try_us(lambda i, c=c: skinny_mm(x, ws[i % n], out, config=c), calls), c)
                      for c in {mine, SKINNY_DEFAULT})
        split = min((_try_us(lambda i, c=c, s=s: skinny_mm(x, ws[i % n], out, config=c, split_k=buf, splits=s),
                             calls), c, s) for c in SPLIT_CONFIGS for s in SPLITS)
        res[name] = {"K": K, "N": N, "layers": layers, "unsplit_us": unsplit[0], "unsplit_config": unsplit[1],
                     "split_us": split[0], "split_config": split[1], "splits": split[2],
                     "split_tb_s": K * N * 2 / (split[0] * 1e-6) / 1e12}
    return res


def grouped_sweep(B: int, calls: int) -> dict[str, dict]:
    """The routed-expert grouped GEMMs over block shapes (the default is block_n 64,
    block_k 128, 4 warps, 4 stages)."""
    from kernels.k3.ops.moe import moe_align, moe_grouped_gemm, moe_router

    E, K, I, L, routings = 896, 16, 384, 3584, 4
    g = torch.Generator(device="cuda").manual_seed(4)
    w13 = torch.randn(E, 2 * I, L, device="cuda", dtype=BF, generator=g) * L ** -0.5
    w2 = torch.randn(E, L, I, device="cuda", dtype=BF, generator=g) * I ** -0.5
    P = B * K
    segs = []
    for r in range(routings):  # different experts per call: no weight stays in L2
        ids = torch.empty(B, K, device="cuda", dtype=I32)
        wts = torch.empty(B, K, device="cuda", dtype=F32)
        moe_router(torch.randn(B, E, device="cuda", dtype=BF, generator=g),
                   torch.zeros(E, device="cuda", dtype=F32), ids, wts)
        seg = (torch.empty(P, device="cuda", dtype=I32), torch.empty(min(P, E), device="cuda", dtype=I32),
               torch.empty(min(P, E) + 1, device="cuda", dtype=I32), torch.empty(1, device="cuda", dtype=I32))
        moe_align(ids, E, *seg)
        segs.append(seg)
    lat = torch.randn(B, L, device="cuda", dtype=BF, generator=g)
    h = torch.randn(P, I, device="cuda", dtype=BF, generator=g)
    gu, y = torch.empty(P, 2 * I, device="cuda", dtype=BF), torch.empty(P, L, device="cuda", dtype=BF)
    res = {}
    for name, args, kw in (("gate_up", (lat, w13), dict(out=gu, x_is_per_token=True)),
                           ("down", (h, w2), dict(out=y, x_is_per_token=False))):
        rows = {}
        for bn in (32, 64, 128):
            for bk in (64, 128, 256):
                for stages in (3, 4):
                    us = _try_us(lambda i: moe_grouped_gemm(*args, *segs[i % routings],
                                                                block_n=bn, block_k=bk, num_stages=stages, **kw),
                                     calls)
                    rows[f"{bn}/{bk}/4/{stages}"] = us
        default = rows["64/128/4/4"]
        best = min(rows, key=rows.get)
        res[name] = {"default_us": default, "best_config": best, "best_us": rows[best], "all": rows}
    return res


#: change -> (layers it applies to at full depth, the case's old and new keys); the case is
#: the change's own unless CASE_OF names another.
SAVINGS = {"router_fork": (92, "baseline: front GEMM -> router -> align",
                           "router_fork: [router GEMV -> router -> align] || rest of front"),
           "mla_combine_wide": (24, "combine", "mla_combine_wide"),
           "attn_res_fused": (186, "score + combine", "attn_res_fused"),
           "attn_res_dot": (186, "score + combine", "attn_res_dot"),
           "attn_res_early_rows": (186, "attn_res_dot", "attn_res_dot+attn_res_early_rows"),
           "moe_tail_fused": (92, "weighted sum -> norm -> up", "moe_tail_fused"),
           "latent_norm_folded": (92, "weighted sum -> norm -> up", "latent_norm_folded"),
           "fmha_short_splits": (24, "fmha + wide combine", "fmha_short_splits"),
           "router_align_fused": (92, "router -> align", "router_align_fused"),
           "mlp_residual_folded": (92, "add3 -> score", "mlp_residual_folded"),
           "kda_conv_fused": (69, "conv -> kda_step", "kda_conv_fused"),
           "kda_split_v": (69, "kda_conv_fused, one call", "kda_conv_fused+kda_split_v, one call"),
           "moe_sum_norm_fused": (92, "weighted sum -> norm -> up", "moe_sum_norm_fused"),
           "mla_proj_merged": (24, "q_a, kv_a, g_proj", "mla_proj_merged"),
           "router_in_front": (92, "c20 head", "router_in_front (64, 128, 4, 4) x(8, 2) (default)"),
           "attn_res_in_o_proj": (93, "o_proj -> score -> combine", "attn_res_in_o_proj:"),
           "moe_down_mixed": (92, "grouped down + weighted sum one call", "moe_down_mix one call"),
           "attn_res_one_pass": (186, "attn_res_dot, one call", "attn_res_one_pass, one call"),
           "fmha_one_tile": (24, "c51: fmha + wide combine, 65 x 128 || g_proj (S2), one call",
                             "fmha_one_tile: 129 x 64 || g_proj (S2), one call"),
           "fmha_early_kv": (24, "fmha_one_tile: 129 x 64 || g_proj (S2), one call",
                             "fmha_one_tile+fmha_early_kv || g_proj (S2), one call"),
           "mla_head_bmm (absorb)": (24, "c51: absorb (cuBLAS BMM), one call", "mla_head_bmm: absorb, one call"),
           "mla_head_bmm (V-up)": (24, "c51: V-up (cuBLAS BMM) -> gate_mul, one call",
                                   "mla_head_bmm: V-up -> gate_mul, one call"),
           "mla_gate_in_v": (24, "mla_head_bmm: V-up -> gate_mul, one call", "mla_gate_in_v: V-up with the gate, one call"),
           "mla_q_skinny": (24, "c57: q_a, q_b by cuBLAS, one call", "mla_q_skinny: split-K skinny, one call"),
           "mla_absorb_concat": (24, "c69: both legs -> reader, one call", "mla_absorb_concat: both legs -> reader, one call"),
           "mla_kv_norm_insert": (24, "c69: both legs -> reader, one call", "mla_kv_norm_insert: both legs -> reader, one call"),
           "mla_absorb_concat+mla_kv_norm_insert": (24, "c69: both legs -> reader, one call",
                                                    "mla_absorb_concat+mla_kv_norm_insert: both legs -> reader, one call"),
           "mla_gate_in_o_proj": (24, "c69: V-up -> gate_mul -> o_proj, one call",
                                  "mla_gate_in_o_proj: V-up -> o_proj with the gate, one call"),
           "shared_front_leg": (92, "c72 head: [router leg] || rest, one call",
                                "shared_front_leg head without the shared GEMM, one call")}


CASE_OF = {"attn_res_dot": "attn_res_fused", "attn_res_early_rows": "attn_res_fused",
           "attn_res_one_pass": "attn_res_fused",
           "latent_norm_folded": "moe_tail_fused", "moe_sum_norm_fused": "moe_tail_fused",
           "fmha_one_tile": "mla_round", "fmha_early_kv": "mla_round", "mla_head_bmm (absorb)": "mla_round",
           "mla_head_bmm (V-up)": "mla_round", "mla_gate_in_v": "mla_round",
           "mla_absorb_concat": "mla_hops", "mla_kv_norm_insert": "mla_hops",
           "mla_absorb_concat+mla_kv_norm_insert": "mla_hops", "mla_gate_in_o_proj": "mla_hops",
           "kda_split_v": "kda_split"}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--json", default="")
    p.add_argument("--sweep", action="store_true", help="also sweep the dense and grouped GEMM configs")
    p.add_argument("--latency", action="store_true",
                   help="the dense sweep times one call at a time (what the step's critical path pays)")
    p.add_argument("--sweep-shapes", nargs="*", default=(),
                   help="sweep only the dense shapes whose name contains one of these (no grouped sweep)")
    p.add_argument("--cases", nargs="*", default=None, help="run only these standalone cases (none: no case)")
    p.add_argument("--grouped-chain", action="store_true",
                   help="sweep the routed grouped GEMMs' blocks in the routed chain, one call at a time (moe_grouped_tuned)")
    p.add_argument("--split-sweep", nargs="*", default=None,
                   help="sweep split-K configs (linear_split_k) for the dense shapes whose name contains one of these")
    args = p.parse_args()
    B = args.batch
    runs = {"router_fork": lambda: router_head(B, args.calls), "mla_combine_wide": lambda: mla_combine(B, 50),
            "fmha_short_splits": lambda: mla_fmha(B, args.calls),
            "router_align_fused": lambda: router_align(B, args.calls),
            "mlp_residual_folded": lambda: add3_fold(B, args.calls),
            "attn_res_fused": lambda: attn_res(B, 50, 8), "attn_res_fused, 2 rows": lambda: attn_res(B, 50, 2),
            "attn_res_rows": lambda: attn_res_rows(B, 50), "moe_tail_fused": lambda: moe_tail(B, args.calls),
            "kda_conv_fused": lambda: kda_conv(B, args.calls), "mla_proj_merged": lambda: mla_proj(B, args.calls),
            "kda_split": lambda: kda_split(B, args.calls),
            "router_in_front": lambda: front_router(B, args.calls),
            "attn_res_in_o_proj": lambda: o_proj_score(B, args.calls),
            "linear_tma": lambda: linear_tma(B, args.calls), "moe_down_mixed": lambda: moe_down(B, args.calls),
            "linear_prefetch": lambda: prefetch_chains(B, args.calls),
            "linear_gluon": lambda: linear_gluon(B, args.calls),
            "linear_ws": lambda: linear_ws(B, args.calls),
            "moe_hops": lambda: moe_hops(B, args.calls),
            "shared_up": lambda: shared_up(B, args.calls),
            "shared_front_leg": lambda: shared_front(B, args.calls),
            "mla_round": lambda: mla_round(B, args.calls),
            "mla_q_skinny": lambda: mla_q_chain(B, args.calls),
            "mla_hops": lambda: mla_hops(B, args.calls),
            "moe_grouped_tuned": lambda: grouped_tuned(B, args.calls),
            "moe_weights_ahead": lambda: weights_ahead(B, args.calls),
            "moe_grouped_tma": lambda: grouped_tma(B, args.calls),
            "attn_res_wide": lambda: attn_res_wide(B, args.calls),
            "window_prefetch": lambda: window_prefetch(B, args.calls)}
    cases = {name: run() for name, run in runs.items() if args.cases is None or name in args.cases}
    for name, res in cases.items():
        print(f"{name} (B={B})")
        for k, v in res.items():
            print(f"    {k:64s} {v:8.2f} us")
    sweeps = {}
    if args.sweep or args.sweep_shapes:
        key = "linear_latency" if args.latency else "linear"
        sweeps[key] = linear_sweep(B, args.calls, tuple(args.sweep_shapes), latency=args.latency)
        for name, r in sweeps[key].items():
            print(f"linear {name:30s} K={r['K']:5d} N={r['N']:5d}: cuBLAS {r['cublas_us']:7.2f} us "
                  f"({r['cublas_tb_s']:.2f} TB/s), skinny {r['skinny_us']:7.2f} us ({r['skinny_tb_s']:.2f} TB/s) "
                  f"at {r['best_config']}; x{r['layers']} = {(r['cublas_us'] - r['skinny_us']) * r['layers'] / 1e3:+.3f} ms saved"
                  + (f"; the table's {r['table_config']} {r['table_us']:7.2f} us" if "table_us" in r else ""))
    if args.split_sweep is not None:
        sweeps["split"] = split_sweep(B, args.calls, tuple(args.split_sweep))
        for name, r in sweeps["split"].items():
            print(f"split {name:40s} K={r['K']:5d} N={r['N']:5d}: unsplit {r['unsplit_us']:7.2f} us at "
                  f"{r['unsplit_config']}, split {r['split_us']:7.2f} us ({r['split_tb_s']:.2f} TB/s) at "
                  f"{r['split_config']} x{r['splits']}; x{r['layers']} = "
                  f"{(r['unsplit_us'] - r['split_us']) * r['layers'] / 1e3:+.3f} ms saved")
    if args.sweep:
        sweeps["grouped"] = grouped_sweep(B, args.calls)
        for name, r in sweeps["grouped"].items():
            print(f"grouped {name}: default {r['default_us']:.2f} us, best {r['best_us']:.2f} us at {r['best_config']}")
    if args.grouped_chain:
        sweeps["grouped_chain"] = grouped_chain_sweep(B)
        for name, r in sweeps["grouped_chain"].items():
            print(f"grouped chain, {name} ({r['shape']}): default {r['default_us']:.2f} us, best "
                  + ", ".join(f"{c} {us:.2f}" for c, us in zip(r["best"], r["best_us"])))
    print("standalone saving x layers (full depth; attn_res at 8 bank rows):")
    for name, (layers, old, new) in SAVINGS.items():
        res = cases.get(CASE_OF.get(name, name), {})
        o = next((v for k, v in res.items() if k.startswith(old)), None)
        n = next((v for k, v in res.items() if k.startswith(new)), None)
        if o is None or n is None:
            continue
        print(f"    {name:18s} {o:7.2f} -> {n:7.2f} us x {layers:3d} layers = {(o - n) * layers / 1e3:6.3f} ms")
    from kernels.k3.config import K3Config

    cfg = K3Config(batch=B)
    rows = [cfg.bank_rows(l, site) for l in cfg.layers for site in ("attn", "mlp")]
    r = cases.get("attn_res_rows")
    if r:
        saved = sum(r[f"pair, {n} rows"] - r[f"attn_res_dot, {n} rows"] for n in rows)
        print(f"    attn_res_dot over the step's {len(rows)} aggregations (their own row counts): {saved / 1e3:6.3f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"batch": B, "cases": cases, "sweeps": sweeps}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
