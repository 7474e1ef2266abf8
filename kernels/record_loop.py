"""The decode loop `k3trace record` profiles: warm up, open the capture range, run an
annotated eager step and graph replays, close the range.

    python -m kernels.record_loop --workload small --steps 50 --capture inside

`--kineto FILE` records the same window with torch.profiler instead of nsys (layer and step
ranges are then record_function annotations too). `--capture before` captures the CUDA graph
before the profiler window opens (how serving
engines run: the report then holds no capture-time NVTX); `inside` captures it after the
window opened, so graph-node creation events carry the layer ranges.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import k3names
from kernels.streams import nvtx_range


def build(args: argparse.Namespace):
    if args.workload == "small":
        from kernels.small import SmallConfig, SmallDecode

        # Small-workload variants by name: `nofork`, `delay:<kernel>:<ns>` (or the flags).
        delay_kernel, delay_ns = args.delay_kernel, args.delay_ns
        if args.variant.startswith("delay:"):
            _, delay_kernel, ns = args.variant.split(":")
            delay_ns = int(ns)
        cfg = SmallConfig(batch=args.batch, layers=args.layers or 8,
                          aux_fork=not (args.no_fork or args.variant == "nofork"),
                          delay_kernel=delay_kernel, delay_ns=delay_ns)
        return SmallDecode(cfg)
    from kernels.k3 import build_model  # the full K3 decode path

    return build_model(args)


def graph_kernel_count(graph: torch.cuda.CUDAGraph) -> int | None:
    """Kernel nodes in the captured graph: the launch plan a complete replay must show."""
    try:
        from cuda.bindings import runtime as rt

        raw = graph.raw_cuda_graph()
        _, _, n = rt.cudaGraphGetNodes(raw, numNodes=0)
        _, nodes, n = rt.cudaGraphGetNodes(raw, numNodes=n)
        kinds = [rt.cudaGraphNodeGetType(node)[1] for node in nodes]
        return sum(k == rt.cudaGraphNodeType.cudaGraphNodeTypeKernel for k in kinds)
    except Exception as exc:  # bindings missing or API moved: the trace-side checks remain
        print(f"record_loop: graph kernel count unavailable ({exc!r})", file=sys.stderr)
        return None


def capture(model) -> torch.cuda.CUDAGraph:
    # keep_graph: the cudaGraph_t stays queryable, so its kernel nodes can be counted.
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        model.step()
    graph.instantiate()
    return graph


def time_replays(graph: torch.cuda.CUDAGraph, n: int) -> list[float]:
    """Per-replay wall time on the GPU in ms (CUDA events), steps issued back to back."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        graph.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)]


def _open_window(kineto: str):
    """Open the recording window: nsys's capture range, or a torch.profiler session when
    recording a Kineto trace (`--kineto FILE`; no nsys involved)."""
    if not kineto:
        torch.cuda.profiler.start()
        return None
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    return prof


def _close_window(prof, kineto: str) -> None:
    if prof is None:
        torch.cuda.profiler.stop()
        return
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(kineto)  # a `.gz` suffix writes it gzip-compressed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.record_loop")
    p.add_argument("--workload", choices=["small", "k3-decode"], default="small")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=0, help="0: the workload's own depth")
    p.add_argument("--context", type=int, default=0, help="k3-decode: tokens of history (0: its default)")
    p.add_argument("--seed", type=int, default=0, help="k3-decode: weight seed (a stand-in rank gets its own)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--eager-steps", type=int, default=1)
    p.add_argument("--capture", choices=["inside", "before"], default="inside")
    p.add_argument("--variant", default="baseline")
    p.add_argument("--no-fork", action="store_true")
    p.add_argument("--delay-kernel", default="")
    p.add_argument("--delay-ns", type=int, default=0)
    p.add_argument("--time-steps", type=int, default=0, help="also time N replays outside the window")
    p.add_argument("--timings-json", default="")
    p.add_argument("--kineto", default="", help="record with torch.profiler into this Chrome trace (.json[.gz]) "
                                                "instead of opening an nsys capture range")
    p.add_argument("--nvtx-style", choices=("k3", "vllm"), default="k3",
                   help="k3-decode: layer ranges in k3trace's style, or vLLM's layerwise module tree with its "
                        "execute_context_..._generation_... step ranges")
    args = p.parse_args(argv)

    model = build(args)
    step_range = lambda i: k3names.STEP_RANGE  # noqa: E731
    if args.nvtx_style != "k3":
        if not hasattr(model, "nvtx_style"):
            p.error("--nvtx-style vllm needs --workload k3-decode")
        model.nvtx_style = args.nvtx_style
        step_range = lambda i: f"execute_context_0(0)_generation_{args.batch}({i})"  # noqa: E731
    for _ in range(args.warmup):  # compiles every Triton kernel before anything is recorded
        model.step()
    torch.cuda.synchronize()

    graph = capture(model) if args.capture == "before" else None
    window = _open_window(args.kineto)
    for i in range(args.eager_steps):
        with nvtx_range(step_range(i)):
            model.step()
        torch.cuda.synchronize()
    if graph is None:
        graph = capture(model)
    kernels = graph_kernel_count(graph)
    plan = k3names.plan_mark(workload=args.workload, variant=args.variant, batch=args.batch,
                             kernels_per_step=kernels, capture=args.capture)
    torch.cuda.nvtx.mark(plan)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        with nvtx_range(step_range(args.eager_steps + i)):
            graph.replay()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / max(args.steps, 1) * 1e3
    _close_window(window, args.kineto)

    report = {"workload": args.workload, "variant": args.variant, "batch": args.batch,
              "kernels_per_step": kernels, "window_step_ms": wall}
    if args.time_steps:
        ms = sorted(time_replays(graph, args.time_steps))
        report["step_ms_median"] = ms[len(ms) // 2]
    print(json.dumps(report))
    if args.timings_json:
        with open(args.timings_json, "w") as fh:
            json.dump(report, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
