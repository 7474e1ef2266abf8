"""The split-KV FMHA compiled for the H200 (sm_90a) on the CPU: `triton.compile` and the ptxas
bundled with Triton need no GPU. What the launch rule (`mla.fmha_warps`) rests on: the plain
loop at 4 warps and fmha_prefetch's two tiles at 8 do not spill, the two tiles at 4 do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Compiles one FMHA config at the K3 shape (B = 1: 65 splits of four 32-token tiles) and
#: prints what ptxas says of it.
COMPILE = r"""
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.k3.ops.mla import mla_decode_fmha_kernel

warps, prefetch = int(sys.argv[1]), sys.argv[2] == "1"
sig = {"q": "*bf16", "cache": "*bf16", "block_table": "*i32", "seq_lens": "*i32", "partial": "*fp32",
       "lse": "*fp32", "sm_scale": "fp32", "stride_qb": "i32", "stride_qh": "i32", "stride_cache": "i32",
       "stride_bt": "i32"}
consts = dict(NH=12, DL=512, DR=64, PAGE=64, NUM_SPLITS=65, BLOCK_H=16, BLOCK_N=32, DOT_F32=False,
              FIRST_EARLY=False, EARLY_KV=False, PREFETCH=prefetch, USE_PDL=True, DELAY_NS=0)
sig.update({k: "constexpr" for k in consts})
k = triton.compile(ASTSource(mla_decode_fmha_kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": warps, "num_stages": 2})
tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
with tempfile.TemporaryDirectory() as work:
    ptx = os.path.join(work, "k.ptx")
    open(ptx, "w").write(k.asm["ptx"])
    v = subprocess.run([os.path.join(tools, "ptxas"), "-v", "--gpu-name", "sm_90a", ptx, "-o", os.devnull],
                       capture_output=True, text=True)
said = v.stdout + v.stderr
print(json.dumps({"registers": int(re.search(r"Used (\d+) registers", said).group(1)),
                  "spill_stores": int(re.search(r"(\d+) bytes spill stores", said).group(1))}))
"""


def compiled(warps: int, prefetch: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    done = subprocess.run([sys.executable, "-c", COMPILE, str(warps), "1" if prefetch else "0"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tools():
    try:
        import triton
    except ImportError:
        pytest.skip("needs triton")
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (bin_dir / "ptxas").exists():
        pytest.skip("this triton has no bundled ptxas")


def test_fmha_launch_warps_hold_the_tiles_without_spilling(tools):
    from kernels.k3.ops.mla import FMHA_BLOCK_N, fmha_warps

    plain, ahead = fmha_warps(FMHA_BLOCK_N, False), fmha_warps(FMHA_BLOCK_N, True)
    assert (plain, ahead) == (4, 8)
    assert compiled(plain, False)["spill_stores"] == 0
    assert compiled(ahead, True)["spill_stores"] == 0
    # Why the prefetching loop takes 8 warps: its two tiles spill at 4.
    assert compiled(4, True)["spill_stores"] > 0

