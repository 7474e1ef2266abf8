"""Where a no_pdl build departs from its PDL build (kernels/README.md, round eleven), on the
5-layer GPU test model at B = 1, every mutable tensor compared bit for bit:

    python3 bench/probe_no_pdl.py                     # baseline, no_attn_forks: graph / eager x PDL / plain;
                                                      # then one eager step per prefix of layers
    python3 bench/probe_no_pdl.py C49 C49+mla_head_bmm   # the same for campaign builds (C49 expands)
    python3 bench/probe_no_pdl.py --plain kda_conv_fused triton_linear   # graph plain vs eager plain
    python3 bench/probe_no_pdl.py --modes kda_conv_fused no_attn_forks+kda_conv_fused
        # graph plain twice (is it repeatable?), eager plain vs eager PDL, graph plain vs eager PDL
"""

from __future__ import annotations

import torch

from kernels.k3.config import K3Config
from kernels.k3.model import K3Decode
from kernels.k3.variants import parse


def _model(layers: int, name: str) -> K3Decode:
    return K3Decode(K3Config(batch=1, num_layers=layers, block_size=4, n_expert_banks=2), parse(name), "cuda")


def _state(model: K3Decode) -> dict[str, torch.Tensor]:
    """Every mutable tensor and the output row, copied; the model's memory given back."""
    torch.cuda.synchronize()
    out = {"hidden": model.hidden().clone(), **{k: t.clone() for k, t in model.mutable_state().items()}}
    del model
    torch.cuda.empty_cache()
    return out


def outputs(layers: int, name: str) -> dict[str, torch.Tensor]:
    model = _model(layers, name)
    model.step()
    return _state(model)


def replayed(name: str, steps: int, graph_mode: bool) -> dict[str, torch.Tensor]:
    """The 5-layer model after `steps` steps, eager or captured once and replayed."""
    model = _model(5, name)
    start = model.snapshot()
    if graph_mode:
        side = torch.cuda.Stream()  # warm-up (compiles, cuBLAS workspaces) as the GPU tests' capture does
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model.step()
        model.restore(start)
        for _ in range(steps):
            graph.replay()
    else:
        model.restore(start)
        for _ in range(steps):
            model.step()
    return _state(model)


def compare(tag: str, a: dict, b: dict) -> None:
    differ = {k: float((a[k].float() - b[k].float()).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    print(f"{tag}: differs in {differ}", flush=True)


C49 = ("router_fork+mla_combine_wide+triton_linear+router_align_fused+mlp_residual_folded+pdl_early_trigger"
       "+attn_res_dot+kda_conv_fused+triton_o_proj+linear_tma+linear_tma_x+linear_tma_tuned+linear_gluon")


def main() -> None:
    import sys

    if sys.argv[1:2] == ["--plain"]:  # bisect: graph plain vs eager plain, one step, per build
        for name in sys.argv[2:]:
            full = name.replace("C49", C49) + "+no_pdl"
            compare(f"{name}: graph plain vs eager plain", replayed(full, 1, True), replayed(full, 1, False))
        return
    if sys.argv[1:2] == ["--modes"]:  # which side departs, and whether the departure repeats
        for name in sys.argv[2:]:
            full = name.replace("C49", C49)
            g_plain, g_again = replayed(full + "+no_pdl", 1, True), replayed(full + "+no_pdl", 1, True)
            e_plain, e_pdl = replayed(full + "+no_pdl", 1, False), replayed(full, 1, False)
            compare(f"{name}: graph plain vs graph plain", g_plain, g_again)
            compare(f"{name}: eager plain vs eager PDL", e_plain, e_pdl)
            compare(f"{name}: graph plain vs eager PDL", g_plain, e_pdl)
        return
    names = sys.argv[1:] or ["baseline", "no_attn_forks"]
    for name in (n.replace("C49", C49) for n in names):
        for steps in (1, 2):
            g_pdl, g_plain = replayed(name, steps, True), replayed(f"{name}+no_pdl", steps, True)
            e_pdl, e_plain = replayed(name, steps, False), replayed(f"{name}+no_pdl", steps, False)
            tag = name.replace(C49, "C49")
            compare(f"{tag}, {steps} steps: graph PDL vs graph plain", g_pdl, g_plain)
            compare(f"{tag}, {steps} steps: graph plain vs eager plain", g_plain, e_plain)
            compare(f"{tag}, {steps} steps: graph PDL vs eager PDL", g_pdl, e_pdl)
    if sys.argv[1:]:
        return
    for layers in (1, 2, 3, 4, 5):
        base, again, plain = outputs(layers, "baseline"), outputs(layers, "baseline"), outputs(layers, "no_pdl")
        same = [k for k in base if torch.equal(base[k], again[k])]
        differ = [k for k in base if not torch.equal(base[k], plain[k])]
        worst = {k: float((base[k].float() - plain[k].float()).abs().max()) for k in differ}
        print(f"layers {layers}: control equal {len(same)}/{len(base)}; no_pdl differs in {worst}", flush=True)


if __name__ == "__main__":
    main()
