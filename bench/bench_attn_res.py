"""Attention-residual aggregation: the score -> combine pair vs the fused single launch.

    python3 bench/bench_attn_res.py [--batches 1 8] [--rows 2 8] [--calls 100] [--replays 20]

Per configuration (B, n_rows, with / without the folded residual add) it captures one CUDA
graph of `calls` back-to-back aggregations (each PDL-launched, as in the model) per path,
replays it, and reports the median per-call time in microseconds. H = 7168 (one TP8 rank of
K3). Runs on a GPU only; CI never runs it.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

H = 7168


def _graph(fn, calls: int) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def _per_call_us(graph: torch.cuda.CUDAGraph, calls: int, replays: int) -> float:
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def bench_attn_res(batches=(1, 8), rows=(2, 8), calls: int = 100, replays: int = 20) -> list[dict]:
    """Per-call us of the pair and the fused launch for each (B, n_rows, addend)."""
    from kernels.k3.ops import attn_res

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for B in batches:
        g = torch.Generator(device="cuda").manual_seed(B)
        bank = torch.randn(8, B, H, device="cuda", generator=g).to(torch.bfloat16)
        query = torch.randn(H, device="cuda", generator=g).to(torch.bfloat16)
        gamma = torch.randn(H, device="cuda", generator=g).to(torch.bfloat16)
        # Tiny addend: the bank row it is folded into drifts slowly over the replays.
        addend = (torch.randn(B, H, device="cuda", generator=g) * 1e-3).to(torch.bfloat16)
        scores = attn_res.alloc_attn_res_scores(bank)
        out = torch.empty(B, H, device="cuda", dtype=torch.bfloat16)
        counter = attn_res.alloc_attn_res_counter("cuda")
        for n_rows in rows:
            for add in (None, addend):
                def pair(n_rows=n_rows, add=add):
                    attn_res.attn_res_score(bank, n_rows, query, scores, addend=add)
                    attn_res.attn_res_combine(bank, n_rows, scores, gamma, out)

                def fused(n_rows=n_rows, add=add):
                    attn_res.attn_res_fused(bank, n_rows, query, scores, gamma, out, addend=add,
                                            counter=counter)

                t_pair = _per_call_us(_graph(pair, calls), calls, replays)
                t_fused = _per_call_us(_graph(fused, calls), calls, replays)
                results.append(dict(B=B, n_rows=n_rows, addend=add is not None,
                                    fused=attn_res.attn_res_fused_fits(B, H, sms),
                                    pair_us=t_pair, fused_us=t_fused))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--calls", type=int, default=100, help="aggregations per captured graph")
    ap.add_argument("--replays", type=int, default=20)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attn_res needs a CUDA GPU", file=sys.stderr)
        return 2
    res = bench_attn_res(a.batches, a.rows, a.calls, a.replays)
    print(f"{torch.cuda.get_device_name(0)}; H = {H}; {a.calls} calls per graph, median of "
          f"{a.replays} replays; per-call us")
    print(f"{'B':>3} {'n_rows':>6} {'addend':>6} {'path':>6} {'pair us':>8} {'fused us':>9} {'speedup':>8}")
    for r in res:
        print(f"{r['B']:>3} {r['n_rows']:>6} {'yes' if r['addend'] else 'no':>6} "
              f"{'fused' if r['fused'] else 'pair':>6} {r['pair_us']:>8.2f} {r['fused_us']:>9.2f} "
              f"{r['pair_us'] / r['fused_us']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
