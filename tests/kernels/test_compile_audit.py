"""bench/compile_audit.py: K3 kernels compiled for the H200 (sm_90a) on a machine without one.

The audit must compile a kernel as it is launched: Triton specializes on the arguments
(alignment, divisibility), and the code it generates depends on it. The split-KV FMHA is
the case that showed it: compiled as launched, its loop copies the next tile's rows
asynchronously; compiled from its signature alone, it loads them one tile after another
(what a withdrawn variant, fmha_prefetch, was built on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The FMHA of one MLA layer at B = 1 (65 splits over 8193 tokens): as `mla_decode_fmha`
#: launches it (the audit), and from its signature alone with the same constants.
COMPILE = r"""
import importlib.util, json, re
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.k3.config import K3Config
from kernels.k3.ops import mla

spec = importlib.util.spec_from_file_location("compile_audit", "bench/compile_audit.py")
audit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(audit)
cfg = K3Config(batch=1)
B, NH, DL, ROW, S = 1, cfg.mla_heads, cfg.kv_lora, cfg.kv_a_width, cfg.fmha_splits
pages = cfg.pages_per_request
args = (torch.zeros(B, NH, ROW, dtype=torch.bfloat16), torch.zeros(pages, cfg.page_size, ROW, dtype=torch.bfloat16),
        torch.zeros(B, pages, dtype=torch.int32), torch.full((B,), cfg.seq_len, dtype=torch.int32),
        torch.zeros(B, NH, S, DL), torch.zeros(B, NH, S))
auditor = audit.Auditor()
with audit.compiling_for_h200(auditor):
    mla.mla_decode_fmha(*args, cfg.sm_scale, num_splits=S, page_size=cfg.page_size)
(launched,) = auditor.rows.values()
sig = {"q": "*bf16", "cache": "*bf16", "block_table": "*i32", "seq_lens": "*i32", "partial": "*fp32",
       "lse": "*fp32", "sm_scale": "fp32", "stride_qb": "i32", "stride_qh": "i32", "stride_cache": "i32",
       "stride_bt": "i32"}
consts = dict(NH=NH, DL=DL, DR=ROW - DL, PAGE=cfg.page_size, NUM_SPLITS=S, BLOCK_H=16, BLOCK_N=mla.FMHA_BLOCK_N,
              DOT_F32=False, FIRST_EARLY=False, EARLY_KV=False, USE_PDL=True, DELAY_NS=0)
sig.update({k: "constexpr" for k in consts})
bare = triton.compile(ASTSource(mla.mla_decode_fmha_kernel, sig, constexprs=consts),
                      target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
print(json.dumps({"launched": launched, "bare_async_copies": len(audit.ASYNC_COPY.findall(bare.asm["ttgir"]))}))
"""


@pytest.fixture(scope="module")
def audit(bench_script):
    return bench_script("compile_audit")


@pytest.mark.parametrize("regs, warps, smem_kb, want", [
    (206, 4, 55, 2),    # the FMHA: registers allow 2 (26,624 each), shared memory 4
    (255, 8, 1, 1),     # kda_step: one CTA takes the 65,536 registers
    (48, 4, 40, 5),     # the routed down GEMM at 4 stages: shared memory, 5 x 41 KB of 228
    (48, 4, 30, 7),     # at 3 stages: 7 x 31 KB
    (32, 8, 1, 8),      # the GEMV: threads, 8 x 256 of 2,048
    (14, 4, 0, 16),     # gate_mul: threads, 16 x 128
    (22, 1, 0, 32),     # q_concat: the 32-CTA limit
])
def test_ctas_per_sm_follow_the_h200s_limits(audit, regs, warps, smem_kb, want):
    # sm_90: 65,536 registers allocated per warp in units of 256, 2,048 threads, 228 KB of
    # shared memory with 1 KB reserved per CTA, 32 CTAs (CUDA C++ Programming Guide, compute
    # capability 9.0; the occupancy calculator's rules).
    assert audit.ctas_per_sm(regs, warps, smem_kb * 1024) == want


def test_the_fmha_is_audited_as_launched(audit):
    try:
        import triton
    except ImportError:
        pytest.skip("needs triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this triton has no bundled cuobjdump")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    done = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    row = got["launched"]
    assert (row["kernel"], row["grid"], row["ctas"]) == ("mla_decode_fmha_kernel", [1, 65], 65)
    assert (row["warps"], row["stages"], row["stack_bytes"]) == (4, 2, 0)  # the launch's; no spills
    assert row["ctas_per_sm"] == audit.ctas_per_sm(row["registers"], 4, row["shared_kb"] * 1024) and row["waves"] == 1
    # As launched the loop's rows are copied asynchronously; from the signature alone, not.
    assert row["async_copies"] >= 2 and got["bare_async_copies"] == 0
