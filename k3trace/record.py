"""`k3trace record`: run a decode loop under Nsight Systems with the flags node-level
analysis needs, turn the capture into a report, and hand it to analyze.

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
