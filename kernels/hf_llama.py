"""A third-party decode loop to validate k3trace on code nobody here wrote: a Hugging Face
transformers Llama-style decoder (random weights, bf16, bs1, StaticCache) captured as one
CUDA graph and replayed, with one module changed per variant.

    python -m kernels.hf_llama --variant norm_fused --steps 60 --timings-json out.json

Variants (each changes one module, the rest is transformers' own code):
  base             unchanged
  norm_fused       LlamaRMSNorm's seven eager ops -> torch's fused rms_norm (a fusion k -> 1)
  mlp_spin         a `torch.cuda._sleep` spin of known length appended to every MLP (a kernel added)
  mlp_side_stream  the MLP's up projection on a side stream, joined before the product (a fork)
  side_spin        mlp_side_stream plus a spin on the side stream after up_proj (slack absorbs part)
  side_work        a spin of --side-cycles on a side stream forked at the MLP's start and joined
                   only at its output (work beside the whole MLP, as an engine's shared experts
                   on an aux stream); two lengths make a pair whose side leg ends before, then
                   after, main-stream kernels that never wait on it

Layer labels come from forward hooks that push NVTX ranges `layer.<i>.attn` (input norm,
attention, residual add) and `layer.<i>.mlp` (post-attention norm, MLP, residual add); the
graph is captured inside the profiler window so its node-creation events carry them. Each
replay sits in a `decode_step` range. `--kineto FILE` writes a torch.profiler trace of the
same loop instead of driving nsys's capture range.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

VARIANTS = ("base", "norm_fused", "mlp_spin", "mlp_side_stream", "side_spin", "side_work")
SPIN_CYCLES = 4000  # about 2 us at the H200's 1.98 GHz


#: Open record_function ranges: under torch.profiler (which does not record NVTX) every NVTX
#: range is also a record_function, Kineto's `user_annotation`, so labels survive there too.
_ANNOTATIONS: list = []


def _nvtx_push(text: str) -> None:
    if torch.cuda.is_available():  # the CPU build has no NVTX; the eager CPU path only checks the script
        torch.cuda.nvtx.range_push(text)
    if torch.autograd._profiler_enabled():
        annotation = torch.profiler.record_function(text)
        annotation.__enter__()
        _ANNOTATIONS.append(annotation)
    else:
        _ANNOTATIONS.append(None)


def _nvtx_pop() -> None:
    if torch.cuda.is_available():
        torch.cuda.nvtx.range_pop()
    annotation = _ANNOTATIONS.pop() if _ANNOTATIONS else None
    if annotation is not None:
        annotation.__exit__(None, None, None)


def build_model(args: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 4, num_hidden_layers=args.layers,
                      num_attention_heads=args.hidden // 128, num_key_value_heads=max(args.hidden // 512, 1),
                      vocab_size=32000, max_position_embeddings=args.context * 2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dtype=torch.bfloat16, device=args.device).eval()
    return cfg, model


def apply_variant(model, variant: str, device: str, side_cycles: int = SPIN_CYCLES) -> None:
    """Change one module of transformers' Llama in place (instances only, not the class)."""
    from transformers.models.llama import modeling_llama as ml

    if variant == "norm_fused":
        def fused_norm(self, x):
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)
        for m in model.modules():
            if isinstance(m, ml.LlamaRMSNorm):
                m.forward = fused_norm.__get__(m)
    if variant in ("mlp_spin", "mlp_side_stream", "side_spin"):
        side = torch.cuda.Stream(device=device) if device.startswith("cuda") else None

        def mlp_forward(self, x):
            if variant == "mlp_spin" or side is None:
                out = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
                if variant == "mlp_spin" and device.startswith("cuda"):
                    torch.cuda._sleep(SPIN_CYCLES)
                return out
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                up = self.up_proj(x)
                if variant == "side_spin":
                    torch.cuda._sleep(SPIN_CYCLES)
            gate = self.act_fn(self.gate_proj(x))
            main.wait_stream(side)
            return self.down_proj(gate * up)
        for m in model.modules():
            if isinstance(m, ml.LlamaMLP):
                m.forward = mlp_forward.__get__(m)
    if variant == "side_work" and device.startswith("cuda"):
        side_w = torch.cuda.Stream(device=device)
        plain = ml.LlamaMLP.forward

        def mlp_beside(self, x):
            main = torch.cuda.current_stream()
            side_w.wait_stream(main)
            with torch.cuda.stream(side_w):
                torch.cuda._sleep(side_cycles)
            out = plain(self, x)
            main.wait_stream(side_w)
            return out
        for m in model.modules():
            if isinstance(m, ml.LlamaMLP):
                m.forward = mlp_beside.__get__(m)


def add_layer_ranges(model) -> None:
    """NVTX `layer.<i>.attn` from the decoder layer's start to its post-attention norm,
    `layer.<i>.mlp` from there to its end; `layer.<L>.head` around the final norm and LM head."""
    def switch(text: str):
        def hook(*_):  # a pre-hook's return value would replace the module's arguments
            _nvtx_pop()
            _nvtx_push(text)
        return hook

    layers = model.model.layers
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda *_, i=i: _nvtx_push(f"layer.{i}.attn"))
        layer.post_attention_layernorm.register_forward_pre_hook(switch(f"layer.{i}.mlp"))
        layer.register_forward_hook(lambda *_: _nvtx_pop())
    n = len(layers)
    model.model.norm.register_forward_pre_hook(lambda *_: _nvtx_push(f"layer.{n}.head"))
    model.register_forward_hook(lambda *_: _nvtx_pop())


#: The serving engines' layerwise NVTX (../shared/design/ENGINES.md): a `str(dict)` range per
#: module, over the whole module tree, with these prefixes for the module path; each module's
#: forward is followed by a zero-length range holding its outputs.
ENGINE_PREFIX = {"vllm": "top", "sglang": "model", "trtllm": "LlamaForCausalLM"}
#: The engines' per-step ranges (the step number and token counts vary per step).
ENGINE_STEP = {
    "k3": lambda i: "decode_step",
    "vllm": lambda i: f"execute_context_0(0)_generation_1({i})",
    "sglang": lambda i: "scheduler.run_batch",
    "trtllm": lambda i: f"[Executor] _forward_step {i}: 0 ctx reqs, 1 gen reqs",
    "none": None,
}


def _shapes(values) -> list:
    if isinstance(values, torch.Tensor):
        return [list(values.shape)]
    if isinstance(values, (list, tuple)):
        return [s for v in values for s in _shapes(v)]
    return []


def add_engine_ranges(model, style: str) -> None:
    """Module-tree NVTX in an engine's format, written here from its documented layout (not
    copied): pre-hook pushes {'Module': path, 'TrainableParams': ..., 'Inputs': ...}, post-hook
    pops it and marks the outputs with a zero-length range."""
    for name, module in model.named_modules(prefix=ENGINE_PREFIX[style]):
        if isinstance(module, (torch.nn.Identity, torch.nn.Dropout)):
            continue
        params = {n: list(p.shape) for n, p in module.named_parameters(recurse=False)}

        def pre(mod, args, name=name, params=params):
            _nvtx_push(str({"Module": name, "TrainableParams": params, "Inputs": _shapes(args)}))

        def post(mod, args, output, name=name):
            _nvtx_pop()
            _nvtx_push(str({"Module": name, "Outputs": _shapes(output)}))
            _nvtx_pop()

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def make_step(model, cfg, args):
    from transformers import StaticCache

    cache = StaticCache(config=cfg, max_cache_len=args.context + args.steps + args.eager_steps + 8)
    ids = torch.zeros((1, 1), dtype=torch.long, device=args.device)
    pos = torch.zeros((1, 1), dtype=torch.long, device=args.device)

    def step():
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True).logits
            ids.copy_(logits[:, -1:].argmax(-1))
            pos.add_(1)  # the cache advances its own write position on the device
        return logits

    return step


def run(args: argparse.Namespace) -> dict:
    cfg, model = build_model(args)
    apply_variant(model, args.variant, args.device, args.side_cycles)
    if args.nvtx_style == "k3":
        add_layer_ranges(model)
    elif args.nvtx_style != "none":
        add_engine_ranges(model, args.nvtx_style)
    step_range = ENGINE_STEP[args.nvtx_style]
    step = make_step(model, cfg, args)
    if not args.device.startswith("cuda"):  # CPU: the eager path only (tests of this script)
        for _ in range(args.steps):
            step()
        return {"variant": args.variant, "steps": args.steps, "device": "cpu"}
    prof = None

    def open_window():
        nonlocal prof
        if args.kineto:
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        else:
            torch.cuda.profiler.start()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # PyTorch's recipe: warm up on a side stream before capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    # The eager warm-up stays outside the window: recorded under nsys 2023.4.4 on the H200, its
    # first cuBLAS launches ended kernel tracing for the rest of the capture (11 kernels kept).
    if args.capture == "inside":
        open_window()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    if args.capture == "before":  # how engines run: the graph was captured at start-up
        open_window()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    begin.record()
    for i in range(args.eager_steps):  # annotated eager steps inside the window, before the replays
        if step_range:
            _nvtx_push(step_range(i))
        step()
        if step_range:
            _nvtx_pop()
    for i in range(args.eager_steps, args.eager_steps + args.steps):
        if step_range:
            _nvtx_push(step_range(i))
        if args.no_graph:
            step()
        else:
            graph.replay()
        if step_range:
            _nvtx_pop()
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    if prof is not None:
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(args.kineto)
    else:
        torch.cuda.profiler.stop()
    return {"variant": args.variant, "steps": args.steps, "layers": args.layers, "hidden": args.hidden,
            "gpu_ms_per_step": begin.elapsed_time(end) / args.steps, "wall_ms_per_step": wall * 1e3 / args.steps,
            "spin_cycles": SPIN_CYCLES if "spin" in args.variant else args.side_cycles if args.variant == "side_work" else 0,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}


def _graph_time_us(fn, calls: int = 200) -> float:
    """Per-call device time of `fn` replayed as a CUDA graph of `calls` back-to-back calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        begin.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[2]


def microbench(args: argparse.Namespace) -> dict:
    """Standalone per-call times of the changed modules (the truth the diff is checked against)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(args.hidden).to(dtype=torch.bfloat16, device=args.device)
    x = torch.randn((1, 1, args.hidden), dtype=torch.bfloat16, device=args.device)
    eager = _graph_time_us(lambda: norm(x))
    fused = _graph_time_us(lambda: torch.nn.functional.rms_norm(x, (args.hidden,), norm.weight, norm.variance_epsilon))
    spin = _graph_time_us(lambda: torch.cuda._sleep(SPIN_CYCLES), calls=50)
    return {"rmsnorm_eager_us": eager, "rmsnorm_fused_us": fused, "spin_us": spin, "spin_cycles": SPIN_CYCLES,
            "norms_per_step": 2 * args.layers + 1, "mlps_per_step": args.layers}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=VARIANTS, default="base")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nvtx-style", choices=tuple(ENGINE_STEP), default="k3",
                   help="layer/step NVTX: k3trace's layer.<i>.<family>, an engine's module-tree format, or none")
    p.add_argument("--eager-steps", type=int, default=0, help="annotated eager steps inside the window first")
    p.add_argument("--no-graph", action="store_true", help="eager decode only (an engine's --enforce-eager)")
    p.add_argument("--capture", choices=("inside", "before"), default="inside",
                   help="capture the graph inside the profiler window (labels recorded) or before it")
    p.add_argument("--microbench", action="store_true",
                   help="time RMSNorm eager vs fused and one spin standalone (CUDA graphs of 200 calls)")
    p.add_argument("--kineto", help="write a torch.profiler Chrome trace here instead of an nsys capture range")
    p.add_argument("--side-cycles", type=int, default=SPIN_CYCLES,
                   help="side_work: the side stream's spin, in clock cycles (about 2 us per 4000 at 1.98 GHz)")
    p.add_argument("--timings-json")
    args = p.parse_args(argv)
    out = microbench(args) if args.microbench else run(args)
    print(json.dumps(out))
    if args.timings_json:
        with open(args.timings_json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
