"""Every Triton kernel of a K3 decode step, compiled for the H200 (sm_90a) on a machine without
a GPU: registers, spills, shared memory, and what they leave of an SM (CTAs per SM, waves).

A spilling kernel, or one whose grid takes two waves where it could take one, is a finding
before any device time is spent. Compile with the launch's own arguments: Triton specializes
on their alignment, and a kernel compiled without it can spill where the real one does not
(fmha_prefetch's two tiles: 664 bytes of stack at 4 warps unspecialized, none as launched). The
model runs one eager step on the CPU at the K3 shapes. Every Triton and Gluon launch is
Triton's own specialization of its arguments and compilation for sm_90a, as a warm-up:
nothing is executed. torch's own ops (cuBLAS's GEMMs on the GPU) run on the CPU, for their
shapes only. Each (kernel, sub-op, specialization) is compiled once; `cuobjdump -res-usage`
on the cubin gives what the compiled kernel uses.

    python3 bench/compile_audit.py [--variant BUILD] [--batch 1] [--layers 4] [--json OUT]
    python3 bench/compile_audit.py --variant 'BUILD@glsub=kda.o_proj,moe.up@glcfg=...'   # bench_k3_step's overrides

The H200 runs Triton 3.6; the Gluon kernels need its `gl.thread_barrier` (gone in 3.7), so audit
under 3.6 where this machine's Triton is newer: `pip install --target DIR triton==3.6.0` and
`PYTHONPATH=DIR python3 bench/compile_audit.py ...`.

Runs without TRITON_INTERPRET (it re-executes itself without it) and needs Triton's bundled
cuobjdump. The occupancy is an estimate from the H200's per-SM limits (65,536 registers in
256-register units per warp, 2,048 threads, 228 KB of shared memory with 1 KB per CTA
reserved, 32 CTAs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SM_REGS, SM_THREADS, SM_SMEM, CTA_SMEM_RESERVED, SM_CTAS, SMS = 65536, 2048, 233472, 1024, 32, 132
#: A global load turned into an asynchronous copy to shared memory (cp.async or TMA) in TTGIR.
ASYNC_COPY = re.compile(r"= (?:ttg\.async_copy_global_to_local|ttng\.async_tma_copy_global_to_local)\b")


def ctas_per_sm(regs: int, warps: int, smem: int) -> int:
    """CTAs of this kernel one H200 SM holds at once (an estimate from the per-SM limits)."""
    warp_regs = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = SM_REGS // (warp_regs * warps)
    by_threads = SM_THREADS // (32 * warps)
    by_smem = SM_SMEM // (smem + CTA_SMEM_RESERVED)
    return max(0, min(by_regs, by_threads, by_smem, SM_CTAS))


def resource_usage(cubin: bytes, cuobjdump: str) -> dict[str, int]:
    """REG, SHARED, STACK (per thread: the stack frame ptxas spills registers into) and LOCAL
    of the cubin's kernel."""
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"\b(REG|SHARED|LOCAL|STACK):(\d+)", text)}


class _H200:
    """The active Triton driver's stand-in: the H200's target, so that a kernel's own `run`
    specializes and compiles for sm_90a on a machine without one (warm-up: nothing launched)."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


class Auditor:
    """Records each compiled kernel of the step: Triton's own specialization of the launch's
    arguments and its compiler, run as a warm-up (compile, never launch)."""

    def __init__(self):
        import triton

        self.cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        self.subop = "-"
        self.rows: dict[tuple, dict] = {}

    def failed(self, kernel, error: Exception) -> None:
        key = (kernel.fn.__name__, self.subop, "failed")
        if key not in self.rows:
            reason = str(error).strip().splitlines()[-1][:120]
            self.rows[key] = {"kernel": kernel.fn.__name__, "subop": self.subop, "not_compiled": reason, "launches": 0}
        self.rows[key]["launches"] += 1

    def record(self, kernel, grid, compiled) -> None:
        key = (kernel.fn.__name__, self.subop, compiled.hash)
        if key in self.rows:
            self.rows[key]["launches"] += 1
            return
        ctas = math.prod(grid) if isinstance(grid, (tuple, list)) else None
        use = resource_usage(compiled.asm["cubin"], self.cuobjdump)
        smem = max(use.get("shared", 0), compiled.metadata.shared)
        warps = compiled.metadata.num_warps
        per_sm = ctas_per_sm(use["reg"], warps, smem)
        self.rows[key] = {"kernel": kernel.fn.__name__, "subop": self.subop, "grid": list(grid) if ctas else None,
                          "ctas": ctas, "warps": warps, "stages": compiled.metadata.num_stages,
                          "registers": use["reg"], "stack_bytes": use.get("stack", 0) + use.get("local", 0),
                          "shared_kb": round(smem / 1024, 1),
                          # Loads Triton turned into asynchronous copies (software-pipelined).
                          "async_copies": len(ASYNC_COPY.findall(compiled.asm.get("ttgir", ""))),
                          "ctas_per_sm": per_sm,
                          "waves": math.ceil(ctas / (per_sm * SMS)) if per_sm and ctas else None,
                          "launches": 1}


@contextmanager
def compiling_for_h200(auditor: Auditor):
    """Within: every Triton and Gluon launch is compiled for the H200 and recorded by the
    auditor instead of run (its outputs are left as they were)."""
    from triton.compiler.errors import CompilationError
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def compile_only(kernel, *args, grid, warmup, **kwargs):
        try:
            compiled = run(kernel, *args, grid=grid, warmup=True, **kwargs)
        except CompilationError as e:  # e.g. a Gluon API this Triton lacks: say so, go on
            auditor.failed(kernel, e)
            return
        auditor.record(kernel, grid, compiled)

    driver.set_active(_H200())
    JITFunction.run = compile_only
    try:
        yield auditor
    finally:
        JITFunction.run = run
        driver._active = None


@contextmanager
def named_by_subop(auditor: Auditor):
    """The model's sub-op names each launch the auditor records."""
    import kernels.k3.model as model_module

    triton_call = model_module.K3Decode._triton

    def named(model, subop, fn, *args, **kwargs):
        auditor.subop = subop
        try:
            return triton_call(model, subop, fn, *args, **kwargs)
        finally:
            auditor.subop = "-"

    model_module.K3Decode._triton = named
    try:
        yield
    finally:
        model_module.K3Decode._triton = triton_call


def audit(variant: str, batch: int, layers: int) -> list[dict]:
    import torch

    from kernels.k3.config import K3Config
    from kernels.k3.model import K3Decode
    from kernels.k3.variants import parse

    torch.manual_seed(0)
    # One expert bank: the shapes are those of every bank, and 7.4 GB of CPU memory is enough.
    cfg = K3Config(batch=batch, num_layers=layers, n_expert_banks=1)
    model = K3Decode(cfg, parse(variant), "cpu")
    auditor = Auditor()
    with compiling_for_h200(auditor), named_by_subop(auditor), torch.no_grad():
        model.step()
    return sorted(auditor.rows.values(), key=lambda r: (-r.get("stack_bytes", -1), r["kernel"], r["subop"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="baseline",
                   help="a K3 build (variant flags joined by +), with bench_k3_step.py's @key=value overrides")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=4, help="4: a dense, KDA, MLA and MoE layers each")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels must compile, not interpret
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])],
                              env=env, cwd=ROOT).returncode
    from kernels.k3.variants import parse

    # BUILD@glsub=...@glcfg=...: the step bench's overrides, so a build audits as it is timed.
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_k3_step import overrides, parse_build

    build, spec = parse_build(args.variant)
    try:
        parse(build)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with overrides(spec, ""):
        rows = audit(build, args.batch, args.layers)
    import polars as pl

    pl.Config.set_tbl_rows(100)
    pl.Config.set_tbl_width_chars(200)
    pl.Config.set_fmt_str_lengths(40)
    import triton

    print(f"{args.variant} at B = {args.batch}, {args.layers} layers, compiled for sm_90a by Triton "
          f"{triton.__version__} (occupancy estimated from the H200's per-SM limits)")
    compiled = [r for r in rows if "not_compiled" not in r]
    if compiled:  # every launch may have failed to compile under this Triton
        print(pl.DataFrame(compiled).drop("grid"))
    for r in rows:
        if "not_compiled" in r:
            print(f"not compiled here: {r['kernel']} ({r['subop']}): {r['not_compiled']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
