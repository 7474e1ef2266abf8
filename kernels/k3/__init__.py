"""The full Kimi K3 decode path (one TP8 rank): model, launch plan and fused Triton ops.

Pure modules (no torch): `config` (shapes, layer schedule), `variants`, `plan`.
Torch/Triton: `model` (K3Decode), `ops` (the kernels), `reference`, `reference_step`.
This package's import stays pure, so CPU tools can read the plan without torch.
"""

from __future__ import annotations


def model_spec(args):
    """(K3Config, Variant) for `kernels.record_loop`'s arguments: batch, layers (0 = all
    93), variant (a name, kernels.k3.variants), delay_kernel / delay_ns, no_fork; optional
    context. `--no-fork` maps to `no_attn_forks` (the MoE shared-expert fork is part of
    every K3 variant); `--delay-kernel/--delay-ns` add a `delay:<kernel>:<ns>`."""
    from dataclasses import replace

    from kernels.k3.config import FULL_DEPTH, K3Config
    from kernels.k3.variants import parse

    variant = parse(getattr(args, "variant", "") or "baseline")
    if getattr(args, "no_fork", False):
        variant = replace(variant, attn_forks=False)
    delay_kernel, delay_ns = getattr(args, "delay_kernel", ""), getattr(args, "delay_ns", 0)
    if delay_kernel and delay_ns:
        if variant.delay_kernel and (variant.delay_kernel, variant.delay_ns) != (delay_kernel, delay_ns):
            raise ValueError("one delay only: --variant delay:... and --delay-kernel/--delay-ns differ")
        variant = variant.with_delay(delay_kernel, delay_ns)
    cfg = K3Config(batch=args.batch, num_layers=getattr(args, "layers", 0) or FULL_DEPTH,
                   context=getattr(args, "context", 0) or K3Config.context, seed=getattr(args, "seed", 0))
    return cfg, variant


def build_model(args):
    """The object `kernels.record_loop` drives (`.step()`): a K3Decode on CUDA."""
    from kernels.k3.model import K3Decode

    cfg, variant = model_spec(args)
    return K3Decode(cfg, variant, getattr(args, "device", "cuda"))
