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


def attn_res(B: int, calls: int, n_rows: int) -> dict[str, float]:
    from kernels.k3.ops import attn_res as A

    H = 7168
    g = torch.Generator(device="cuda").manual_seed(2)
    bank = torch.randn(8, B, H, device="cuda", dtype=BF, generator=g)
    query = torch.randn(H, device="cuda", dtype=BF, generator=g)
    gamma = torch.randn(H, device="cuda", dtype=BF, generator=g)
    scores = A.alloc_attn_res_scores(bank)
    out = torch.empty(B, H, device="cuda", dtype=BF)
    res = {f"score + combine, {n_rows} rows": per_call_us(
        lambda i: (A.attn_res_score(bank, n_rows, query, scores),
                   A.attn_res_combine(bank, n_rows, scores, gamma, out)), calls)}
    if hasattr(A, "attn_res_fused"):
        counter = A.alloc_attn_res_counter(bank.device)
        res["attn_res_fused"] = per_call_us(
            lambda i: A.attn_res_fused(bank, n_rows, query, scores, gamma, out, counter=counter), calls)
    return res


#: change -> (layers it applies to at full depth, the case's old and new keys)
SAVINGS = {"router_fork": (92, "baseline: front GEMM -> router -> align",
                           "router_fork: [router GEMV -> router -> align] || rest of front"),
           "mla_combine_wide": (24, "combine", "mla_combine_wide"),
           "attn_res_fused": (186, "score + combine", "attn_res_fused")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--json", default="")
    args = p.parse_args()
    B = args.batch
    cases = {"router_fork": router_head(B, args.calls), "mla_combine_wide": mla_combine(B, 50),
             "attn_res_fused": attn_res(B, 50, 8), "attn_res_fused, 2 rows": attn_res(B, 50, 2)}
    for name, res in cases.items():
        print(f"{name} (B={B})")
        for k, v in res.items():
            print(f"    {k:64s} {v:8.2f} us")
    print("standalone saving x layers (full depth; attn_res at 8 bank rows):")
    for name, (layers, old, new) in SAVINGS.items():
        res = cases[name]
        o = next((v for k, v in res.items() if k.startswith(old)), None)
        n = next((v for k, v in res.items() if k.startswith(new)), None)
        if o is None or n is None:
            continue
        print(f"    {name:18s} {o:7.2f} -> {n:7.2f} us x {layers:3d} layers = {(o - n) * layers / 1e3:6.3f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"batch": B, "cases": cases}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
