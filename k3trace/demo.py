"""The traces bundled with k3trace (k3trace/data): scrubbed SQLite exports recorded on an
H200 from kernels/, xz-compressed. `k3trace demo` analyses two and diffs three pairs of them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from k3trace.errors import ReportError

#: The K3 decode path (8 layers, B=1) with every attention launch on the main stream, and
#: the same with the aux-stream forks on (seed 001's change).
DEMO_PAIR = ("k3_bs1_no_attn_forks", "k3_bs1_base_a")
#: Code nobody here wrote: transformers' Llama (8 layers, bs1, one CUDA graph) with its
#: eight-kernel RMSNorm replaced by torch's fused rms_norm (kernels/hf_llama.py).
THIRD_PARTY_PAIR = ("hf_base_a", "hf_norm_fused_a")
#: The K3 path (8 layers, B=1, the bs1 campaign's c6 -> c7) with every Triton kernel's PDL
#: trigger moved from after its last store to right after its wait: recorded time trades
#: between PDL neighbours, and the diff names the rows to read together.
PDL_PAIR = ("k3_bs1_c6", "k3_bs1_c7")
#: The campaign build c72 (8 layers, B=1) recorded with nsys's DRAM metrics beside the trace
#: (`k3trace record --gpu-metrics`): where HBM streams and where it idles in the step.
DRAM_TRACE = "k3_bs1_c72_gm"


def bundled_trace(name: str) -> Path:
    path = Path(str(resources.files("k3trace").joinpath("data", f"{name}.sqlite.xz")))
    if not path.exists():
        raise ReportError(f"bundled trace {name} is missing", "reinstall k3trace (pip install -e .)")
    return path


def bundled_names() -> list[str]:
    folder = Path(str(resources.files("k3trace").joinpath("data")))
    return sorted(p.name.removesuffix(".sqlite.xz") for p in folder.glob("*.sqlite.xz"))
