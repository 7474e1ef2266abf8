"""`k3trace record`: run a decode loop under Nsight Systems with the flags node-level
analysis needs, turn the capture into a report, and hand it to analyze; or, with
`--profiler torch`, record the built-in workload with torch.profiler (a Kineto trace).

Flags: CUDA + NVTX tracing; `--cuda-graph-trace=node` (kernel by kernel inside graph
replays); no CPU sampling or context switches (they cost overhead and some VMs refuse
them); a capture range the workload opens and closes with cudaProfilerStart/Stop.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from k3trace.errors import ReportError

NSYS_FLAGS = (
    "-t", "cuda,nvtx", "--cuda-graph-trace=node", "--sample=none", "--cpuctxsw=none",
    "--capture-range=cudaProfilerApi",
)


@dataclass(frozen=True)
class RecordPlan:
    nsys: str
    output: Path                      # report path without suffix
    command: tuple[str, ...]          # what runs under nsys
    capture_range_end: str = "stop"   # `repeat` for engines that open several windows
    extra_flags: tuple[str, ...] = field(default_factory=tuple)

    def argv(self) -> list[str]:
        return [self.nsys, "profile", *NSYS_FLAGS, f"--capture-range-end={self.capture_range_end}",
                *self.extra_flags, "-f", "true", "-o", str(self.output), *self.command]

    def shell(self) -> str:
        return shlex.join(self.argv())


def workload_command(workload: str, batch: int, steps: int, variant: str, layers: int = 0,
                     capture: str = "inside", python: str = sys.executable) -> tuple[str, ...]:
    """The built-in instrumented decode loop (kernels/record_loop.py)."""
    cmd = [python, "-m", "kernels.record_loop", "--workload", workload, "--batch", str(batch),
           "--steps", str(steps), "--variant", variant, "--capture", capture]
    if layers:
        cmd += ["--layers", str(layers)]
    return tuple(cmd)


#: Serving engines fork their workers: follow them (ENGINES.md).
ENGINE_FLAGS = ("--trace-fork-before-exec=true",)
#: `record --gpu-metrics`: nsys samples GPU 0's metrics beside the trace every 5 us (200 kHz),
#: among them the DRAM read and write throughput `analyze` reads (docs/metrics.md, "DRAM").
GPU_METRICS_FLAGS = ("--gpu-metrics-device=0", "--gpu-metrics-frequency=200000")


#: What `k3trace record --profiler torch` writes: torch.profiler's suffix, gzip-compressed.
KINETO_SUFFIX = ".pt.trace.json.gz"


@dataclass(frozen=True)
class TorchRecordPlan:
    """The built-in workload recorded by torch.profiler (CPU + CUDA activities) around the
    same window nsys would capture: for machines without Nsight Systems."""

    output: Path                      # trace path without suffix
    command: tuple[str, ...]          # the workload command (kernels/record_loop.py)

    def trace(self) -> Path:
        return self.output.with_name(self.output.name + KINETO_SUFFIX)

    def argv(self) -> list[str]:
        return [*self.command, "--kineto", str(self.trace())]

    def shell(self) -> str:
        return shlex.join(self.argv())


def run_torch(plan: TorchRecordPlan) -> Path:
    """Run the workload under torch.profiler; return the Kineto trace it wrote."""
    try:
        done = subprocess.run(plan.argv(), check=False)
    except OSError as exc:
        raise ReportError(f"cannot run the workload ({exc})", "check the Python environment (torch, CUDA)") from None
    if done.returncode != 0 or not plan.trace().exists():
        raise ReportError(f"the workload exited with {done.returncode} and wrote no torch.profiler trace",
                          "check that it runs on its own on a CUDA GPU (pip install -e '.[kernels]')")
    return plan.trace()


def run(plan: RecordPlan) -> Path:
    """Run nsys; return the report it left (.nsys-rep, or .qdstrm when no importer ran)."""
    try:
        done = subprocess.run(plan.argv(), check=False)
    except OSError as exc:
        raise ReportError(f"cannot run nsys ({exc})", "install Nsight Systems or set K3TRACE_NSYS") from None
    for suffix in (".nsys-rep", ".qdstrm"):
        candidate = plan.output.with_suffix(suffix)
        if candidate.exists():
            return candidate
    raise ReportError(f"nsys exited with {done.returncode} and wrote no report",
                      "check that the command runs on its own and opens a capture range (cudaProfilerStart)")
