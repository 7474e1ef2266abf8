"""Fused Triton kernels of the K3 decode path (kernels/README.md has the launch plan).

Every launcher takes `delay_ns` (the `delay:<kernel>:<ns>` variant), allocates nothing
when its outputs are given, and is CUDA-graph safe (fixed grids, no host syncs). Kernels
are PDL-launched: producer-independent loads before `gdc_wait`, `gdc_launch_dependents`
after the last dependent store; both compiled out under the Triton interpreter.

Modules: `common` (PDL switch, spin, dot), `norm`, `attn_res`, `kda`, `mla`, `moe`.
The float references live in `kernels.k3.reference`.
"""
