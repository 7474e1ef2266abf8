"""Where the time of one `moe_front_router` launch goes (variant router_in_front), from
globaltimer stamps each program stores, and the single-call latency of the MoE head's forms.

    python3 bench/probe_front_router.py        # on the H200 only

The stamped kernel is derived from the real one's source at run time (four stores inserted:
after the PDL wait, after the K stream, after the split-K reductions, at the end), so the
two cannot drift apart. Per launch it prints the latest of each stamp over the router
programs and over the rest, relative to the first program's start. `bench_k3_ops.py` times
calls back to back, where one call's serial tail hides under the next call's stream; the
single-call figures here (one call per graph replay, launch overhead included alike) are
what a kernel on the step's critical path pays.
"""

from __future__ import annotations

import importlib.util
import inspect
import statistics
import sys
import tempfile
from pathlib import Path

import torch

BF, F32, I32 = torch.bfloat16, torch.float32, torch.int32
H, W, E, TK = 7168, 6016, 896, 16
STAMPS = [("    pdl_wait(USE_PDL)  # x is the producer's output\n", 0),
          ("                        BLOCK_K, EVEN_K, DOT_F32)\n", 1),
          ("    if routes:\n", 2),
          ("    spin(DELAY_NS)\n", 3)]


def stamped_kernel():
    """moe_front_router_kernel with `stamps` [grid, 4] int64 as its first argument."""
    from kernels.k3.ops import moe

    src = inspect.getsource(moe)
    body = src[src.index("@triton.jit\ndef moe_front_router_kernel"):src.index("def alloc_front_router_done")]
    body = body.replace("def moe_front_router_kernel(", "def stamped_front_router_kernel(stamps, ", 1)
    for anchor, slot in STAMPS:
        store = f"    tl.store(stamps + pid * 4 + {slot}, tl.extra.cuda.globaltimer())\n"
        assert body.count(anchor) == 1, anchor
        # after the wait and the stream: the store follows the line; before the route and the end: it precedes
        body = body.replace(anchor, anchor + store if slot < 2 else store + anchor)
    header = "import triton\nimport triton.language as tl\nfrom kernels.k3.ops.moe import *  # noqa\n" \
             "from kernels.k3.ops.moe import _route_token, skinny_k_rows, split_k_reduce, pdl_wait, pdl_trigger, " \
             "spin, to_dtype\n\n"
    path = Path(tempfile.mkdtemp()) / "stamped_front_router.py"  # triton.jit reads the source from a file
    path.write_text(header + body)
    spec = importlib.util.spec_from_file_location("stamped_front_router", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.stamped_front_router_kernel


def head_inputs(copies: int = 4):
    g = torch.Generator(device="cuda").manual_seed(0)
    fronts = [torch.randn(H, W, device="cuda", dtype=BF, generator=g) * H ** -0.5 for _ in range(copies)]
    return dict(x=torch.randn(1, H, device="cuda", dtype=BF, generator=g), fronts=fronts,
                router_t=[f[:, :E].t().contiguous() for f in fronts],
                bias=torch.randn(E, device="cuda", dtype=F32, generator=g) * 0.05,
                logits=torch.empty(1, E, device="cuda", dtype=BF), rest=torch.empty(1, W - E, device="cuda", dtype=BF),
                ids=torch.empty(1, TK, device="cuda", dtype=I32), wts=torch.empty(1, TK, device="cuda", dtype=F32),
                seg=(torch.empty(TK, device="cuda", dtype=I32), torch.empty(TK, device="cuda", dtype=I32),
                     torch.empty(TK + 1, device="cuda", dtype=I32), torch.empty(1, device="cuda", dtype=I32)))


def stamps(config, splits, kernel, d: dict, launches: int = 12) -> dict[str, float]:
    from kernels.k3.ops import moe
    from kernels.k3.ops.gemv import alloc_split_k

    buf, done = alloc_split_k(H, "cuda"), moe.alloc_front_router_done("cuda")
    real, rows, st = moe.launch, [], {}

    def stamped(_kernel, grid, *args, **kw):  # the launcher's own arguments, the stamped kernel
        st["t"] = torch.zeros(grid[0], 4, device="cuda", dtype=torch.int64)
        real(kernel, grid, st["t"], *args, **kw)

    moe.launch = stamped
    try:
        for i in range(launches):
            torch.cuda.synchronize()
            moe.moe_front_router(d["x"], d["fronts"][i % len(d["fronts"])], d["rest"], d["logits"], d["bias"],
                                 d["ids"], d["wts"], d["seg"], buf, done, config=config, splits=splits)
            torch.cuda.synchronize()
            t = st["t"].cpu().double() / 1e3
            t -= t[:, 0].min()
            bn, bk = config[:2]
            k_per = -(-(-(-H // bk)) // splits[0]) * bk  # the launcher's whole K blocks per split
            nr = (E // bn) * -(-H // k_per)  # router programs: column blocks x splits
            rows.append({"router stream done": t[:nr, 1].max().item(), "router logits done": t[:nr, 2].max().item(),
                         "router end (routed)": t[:nr, 3].max().item(), "rest stream done": t[nr:, 1].max().item(),
                         "rest end": t[nr:, 3].max().item()})
    finally:
        moe.launch = real
    return {k: statistics.median(r[k] for r in rows[2:]) for k in rows[0]}


def single_call(d: dict) -> dict[str, float]:
    from kernels.k3.ops import moe
    from kernels.k3.ops.gemv import alloc_split_k, gemv, skinny_mm
    from kernels.streams import fork, join
    from bench_k3_ops import single_call_us

    buf, done, s2 = alloc_split_k(H, "cuda"), moe.alloc_front_router_done("cuda"), torch.cuda.Stream()
    x, fronts, n = d["x"], d["fronts"], len(d["fronts"])

    def forked(i):
        main = torch.cuda.current_stream()
        fork(main, s2, enabled=True)
        with torch.cuda.stream(s2):
            gemv(x, d["router_t"][i], d["logits"])
            moe.moe_router(d["logits"], d["bias"], d["ids"], d["wts"], align=d["seg"])
        skinny_mm(x, fronts[i][:, E:], d["rest"])
        join(main, s2, enabled=True)

    forms = {"front's rest alone (skinny)": lambda i: skinny_mm(x, fronts[i][:, E:], d["rest"]),
             "router leg alone (GEMV -> router + align)": lambda i: (
                 gemv(x, d["router_t"][i], d["logits"]),
                 moe.moe_router(d["logits"], d["bias"], d["ids"], d["wts"], align=d["seg"])),
             "c20 head: [router leg] || rest, joined": forked,
             "router_in_front (default)": lambda i: moe.moe_front_router(
                 x, fronts[i], d["rest"], d["logits"], d["bias"], d["ids"], d["wts"], d["seg"], buf, done)}
    return {name: single_call_us(fn, n) for name, fn in forms.items()}


def main() -> int:
    d = head_inputs()
    for name, us in single_call(d).items():
        print(f"single call  {name:45s} {us:7.2f} us")
    kernel = stamped_kernel()
    for config, splits in [((64, 128, 4, 4), (8, 2)), ((64, 128, 4, 4), (16, 2)), ((64, 128, 8, 4), (8, 2))]:
        row = stamps(config, splits, kernel, d)
        print(f"stamps {config} x{splits}: " + ", ".join(f"{k} {v:.2f} us" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
