"""Whether HBM traffic beside it slows the step's latency-bound chain: hops alone and under load.

    python3 bench/loaded_hop.py [--hops 32] [--json OUT]

Three rounds of the campaign (five, nineteen, twenty-one; kernels/README.md) started a GEMM's
weight stream early, beside the short kernels between two GEMMs, and each time the short
kernels ran longer by about what the early stream hid. The reading left "likely, not verified"
in round five: a latency-bound kernel's few loads wait in memory queues that a streaming grid
keeps full, so dependent work beside a bandwidth-bound launch ends with it. This probe measures
that directly. Each form times a chain of the step's latency-bound kernels, launched as the step
launches them (PDL, early triggers), alone and while a streaming read runs on another stream:

- the chains: `hop_kernel` (bench/hop_floor.py; 7 programs, each reading the value its producer
  wrote a hop before: L2 hits), the 1-row RMSNorm at 7,168 columns, the attention residuals'
  score -> combine over 8 bank rows at c72's 1024-column chunk (the bank rows are reread each
  pair, as the step rereads rows written layers before), and the router with the align (one
  program, the top-16 of 896: in c72 it runs beside the MoE front's stream);
- the loads beside them (`stream_kernel`, one program per slice, plain loads summed so nothing
  is optimised away): an HBM stream over a buffer far past L2 at 132 and at 66 programs (every
  SM, half of them), the same with `evict_first` loads (the streamed lines leave L2 first, as a
  GEMM's weights could), and a stream that rereads 16 MB (L2 hits: the SMs and L2 loaded, HBM
  idle).

A chain's time comes from two globaltimer stamps (`stamp_kernel`, plain launches around it)
inside the graph, after a lead kernel that waits for the stream's first program to flag its
start and then spins while the stream ramps up; the figure is the marginal cost of a hop, (span
of 2 x hops - span of hops) / hops, the median over the loaded replays, so the stamps and the
first launch drop out. A replay is loaded when the stream started before the chain and ended
after it: a chain need not run beside the stream at all (round twenty-two, on the H100: a 1-warp
chain beside a stream with a program on every SM waited for the stream to end;
bench/loaded_order.py), and such a replay measures the chain alone. The stream's own rate alone
is printed beside it, and the share of loaded replays.

Runs on a GPU only; CI never runs it (the stream's sum is checked on a CPU under the Triton
interpreter, tests/kernels/test_loaded_hop.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.k3.ops.common import early_trigger, launch, pdl_off

#: Elements of one program's load per iteration: 8 KB of bf16, 16 a thread at 8 warps (36
#: registers on the H100), so that STREAM_PER_SM programs share each SM and leave room beside
#: them, as a GEMM's programs do. (The first form's 32 KB loads, one program an SM, 96 registers,
#: streamed at 2.73 TB/s where these reach 3.07.)
STREAM_BLOCK = 4096
#: Programs per SM of the full-width stream: 4 MB in flight on 132 SMs, enough for HBM's latency.
STREAM_PER_SM = 4
#: The HBM stream's buffer (bytes): far past the 50-60 MB L2, about 0.35 ms at 4.3 TB/s.
HBM_BYTES = 1536 << 20
#: The L2 stream's buffer: reread until it has read as many bytes as the HBM stream.
L2_BYTES = 16 << 20
#: Spin before the first stamp, so that the stream has reached its rate when the chain starts.
LEAD_NS = 20_000
#: How long the lead waits for the stream's start flag before it gives up (that replay is then
#: not a loaded one: the graph's two branches ran one after the other).
START_TIMEOUT_NS = 2_000_000


@triton.jit
def stream_kernel(buf, n_per, reps, sums, started, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr,
                  FLAG: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Program p sums its slice [p n_per, (p + 1) n_per) of buf, `reps` times over (each pass
    # rereads it: with a small buffer, from L2). n_per is a multiple of BLOCK. FLAG: program 0
    # first stores the time it started at `started`, which the chain's lead waits for.
    p = tl.program_id(0)
    if FLAG:  # noqa: SIM102 - a constexpr: without it the branch (and globaltimer) is not compiled
        if p == 0:
            tl.store(started, tl.extra.cuda.globaltimer())
    base = buf + p.to(tl.int64) * n_per
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(reps):
        for i in range(0, n_per, BLOCK):
            if EVICT_FIRST:
                v = tl.load(base + i + tl.arange(0, BLOCK), eviction_policy="evict_first")
            else:
                v = tl.load(base + i + tl.arange(0, BLOCK))
            acc += v.to(tl.float32)
    tl.store(sums + p, tl.sum(acc, 0))


def stream(buf: torch.Tensor, programs: int, sums: torch.Tensor, *, reps: int = 1,
           evict_first: bool = False, started: torch.Tensor | None = None) -> None:
    """sums[p] = reps x the sum of buf's p-th of `programs` equal slices (buf 1-D, its length
    a multiple of programs x STREAM_BLOCK, or of programs when smaller: then one block);
    `started` (int64, given): the GPU time its first program began."""
    n = buf.numel()
    assert buf.dim() == 1 and n % programs == 0
    n_per = n // programs
    block = min(STREAM_BLOCK, triton.next_power_of_2(n_per))
    assert n_per % block == 0, "each slice must be whole blocks"
    with pdl_off():  # a plain launch: it forks from main, it follows nothing
        launch(stream_kernel, (programs,), buf, n_per, reps, sums, sums if started is None else started,
               BLOCK=block, EVICT_FIRST=evict_first, FLAG=started is not None, num_warps=8)


@triton.jit
def stamp_kernel(stamps, slot, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    tl.store(stamps + slot, tl.extra.cuda.globaltimer())


@triton.jit
def lead_kernel(started, TIMEOUT_NS: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Wait until the stream beside it has started (its flag, zeroed before the fork, turns
    # non-zero), then spin DELAY_NS while it ramps up. Should the stream only start after the
    # chain's branch (nothing orders the two), the wait times out and span_us does not count
    # the replay as loaded.
    t0 = tl.extra.cuda.globaltimer()
    while (tl.load(started, volatile=True) == 0) & (tl.extra.cuda.globaltimer() - t0 < TIMEOUT_NS):
        pass
    t1 = tl.extra.cuda.globaltimer()
    while tl.extra.cuda.globaltimer() - t1 < DELAY_NS:
        pass


def chains(hops: int) -> dict[str, object]:
    """name -> fn(n): launches n hops of that chain (PDL, early triggers)."""
    from hop_floor import hop_chain  # bench/ is the script's directory

    from kernels.k3.ops import attn_res as A
    from kernels.k3.ops.norm import rmsnorm

    g = torch.Generator(device="cuda").manual_seed(5)
    H = 7168
    bufs = tuple(torch.zeros(7, device="cuda", dtype=torch.int32) for _ in range(2))
    rows = [torch.randn(1, H, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)]
    gamma = torch.ones(H, device="cuda", dtype=torch.bfloat16)
    bank = torch.randn(8, 1, H, device="cuda", dtype=torch.bfloat16, generator=g)
    query = torch.randn(H, device="cuda", dtype=torch.bfloat16, generator=g)
    scores = A.alloc_attn_res_scores(bank, block_h=A.WIDE_BLOCK_H)
    out = torch.empty(1, H, device="cuda", dtype=torch.bfloat16)

    def hop(n):
        with early_trigger(True):
            hop_chain(bufs, n, 7, read=True)

    def norm(n):
        with early_trigger(True):
            for h in range(n):
                rmsnorm(rows[h % 2], gamma, rows[(h + 1) % 2])

    def pair(n):
        with early_trigger(True):
            for _ in range(n // 2):
                A.attn_res_score(bank, 8, query, scores, gram_dot=True, block_h=A.WIDE_BLOCK_H)
                A.attn_res_combine(bank, 8, scores, gamma, out, one_shot=True, block_h=A.WIDE_BLOCK_H)

    # The router as c72 runs it beside the MoE front (router_align_fused): one program, the
    # top-16 of 896 sigmoid scores and the align's segments; each call rereads the same logits.
    from router_parts import router_chain  # bench/ is the script's directory

    return {"hop_kernel, 7 programs": hop, "rmsnorm, 1 x 7168": norm,
            "attn_res score -> combine, 8 rows, 1024 columns": pair,
            "moe_router + align, top-16 of 896 (1 program)": router_chain(16, True, False, 4),
            "the same, four a round (router_top4)": router_chain(16, True, True, 4),
            "the same, one bitonic network (router_bitonic)": router_chain(16, True, False, 4, True)}


def loads() -> dict[str, tuple[object, int]]:
    """name -> (fn(started), bytes it reads): the load beside the chain, launched on the current
    stream, storing its start time at `started` (None: alone)."""
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    big = torch.ones(HBM_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    small = torch.ones(L2_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    sums = torch.zeros(STREAM_PER_SM * sm, device="cuda", dtype=torch.float32)

    def hbm(programs, evict_first=False):
        n = big.numel() // (programs * STREAM_BLOCK) * programs * STREAM_BLOCK

        def load(started):
            stream(big[:n], programs, sums, evict_first=evict_first, started=started)

        return load, 2 * n

    n_small = small.numel() // (STREAM_PER_SM * sm * STREAM_BLOCK) * STREAM_PER_SM * sm * STREAM_BLOCK
    reps = max(1, HBM_BYTES // (n_small * 2))
    full = STREAM_PER_SM * sm
    return {"alone": (None, 0),
            f"HBM stream, {full} programs": hbm(full),
            f"HBM stream, {full // 2} programs": hbm(full // 2),
            f"HBM stream, {full} programs, evict_first": hbm(full, evict_first=True),
            f"L2 stream (16 MB reread), {full} programs":
                ((lambda started: stream(small[:n_small], full, sums, reps=reps, started=started)),
                 2 * n_small * reps)}


def stream_rate(fn, nbytes: int, replays: int = 10) -> float:
    """TB/s of one stream launch alone (event-timed graph replays, median)."""
    graph = torch.cuda.CUDAGraph()
    started = torch.zeros(1, device="cuda", dtype=torch.int64)
    fn(started)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn(started)
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return nbytes / statistics.median(times) / 1e12


def loaded_graph(chain, n: int, load) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The captured graph of a chain of n hops with `load` (or None) on a side stream from the
    graph's start, and its stamps (GPU ns): [chain start, chain end, load end, load start]
    (the load start 1 alone: the lead does not wait)."""
    stamps = torch.zeros(4, device="cuda", dtype=torch.int64)
    started = stamps[3:]
    started.fill_(0 if load is not None else 1)
    main = torch.cuda.Stream()
    side = torch.cuda.Stream()

    def body():
        if load is not None:
            started.zero_()  # in the graph: every replay waits for its own stream's start
            side.wait_stream(main)
            with torch.cuda.stream(side):
                load(started)
                with pdl_off():
                    launch(stamp_kernel, (1,), stamps, 2)  # the load's end
        with pdl_off():
            launch(lead_kernel, (1,), started, TIMEOUT_NS=START_TIMEOUT_NS, delay_ns=LEAD_NS)
            launch(stamp_kernel, (1,), stamps, 0)
        chain(n)
        with pdl_off():
            launch(stamp_kernel, (1,), stamps, 1)
        if load is not None:
            main.wait_stream(side)

    main.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(main):
        body()  # compile, warm
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=main):
        body()
    return graph, stamps


def spans_the_chain(stamps: list[int]) -> bool:
    """Whether a replay was loaded: its stamps [chain start, chain end, load end, load start]
    (loaded_graph's) put the load's start at or before the chain's and its end at or after the
    chain's; a load start of 0 is a flag that never turned (the lead timed out)."""
    chain_start, chain_end, load_end, load_start = stamps
    return 0 < load_start <= chain_start and load_end >= chain_end


def span_us(chain, n: int, load, replays: int) -> tuple[float, float]:
    """Median over the loaded replays of the chain's span (us) between its stamps, with `load`
    on a side stream from the graph's start; and the fraction of replays that were loaded: the
    load started before the chain's first stamp and ended after its last (all of them alone).
    No loaded replay: the span is NaN."""
    graph, stamps = loaded_graph(chain, n, load)
    spans = []
    for r in range(replays + 2):
        graph.replay()
        torch.cuda.synchronize()
        s = stamps.tolist()
        if r >= 2 and (load is None or spans_the_chain(s)):
            spans.append((s[1] - s[0]) / 1e3)
    return (statistics.median(spans) if spans else float("nan")), len(spans) / replays


def marginal_us(chain, hops: int, load, replays: int) -> tuple[float, float]:
    """A call's marginal us in the chain, (span of 2 x hops - span of hops) / hops, with `load`
    (or None) beside it; and the smaller of the two spans' loaded fractions."""
    one, cov1 = span_us(chain, hops, load, replays)
    two, cov2 = span_us(chain, 2 * hops, load, replays)
    return (two - one) / hops, min(cov1, cov2)


def probe_args(script: str) -> argparse.Namespace | None:
    """The probes' command line (--hops, --replays, --json); None, with a message, without a GPU."""
    p = argparse.ArgumentParser(prog=script)
    p.add_argument("--hops", type=int, default=32)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(f"{script} needs a CUDA device", file=sys.stderr)
        return None
    return args


def main() -> int:
    args = probe_args("loaded_hop.py")
    if args is None:
        return 2
    load_forms = loads()
    rates = {name: stream_rate(fn, nbytes) for name, (fn, nbytes) in load_forms.items() if fn is not None}
    for name, r in rates.items():
        print(f"    {name:48s} alone: {r:5.2f} TB/s")
    res: dict[str, dict[str, float]] = {}
    for cname, chain in chains(args.hops).items():
        alone = None
        for lname, (load, _) in load_forms.items():
            per_hop, loaded = marginal_us(chain, args.hops, load, args.replays)
            alone = per_hop if load is None else alone
            res.setdefault(cname, {})[lname] = per_hop
            res[cname][lname + " (loaded replays)"] = loaded
            print(f"    {cname:48s} {lname:44s} {per_hop:6.2f} us per hop  x{per_hop / alone:5.2f}"
                  f"  (loaded replays: {loaded:.0%})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"hops": args.hops, "stream_tb_s_alone": rates, "us_per_hop": res}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
