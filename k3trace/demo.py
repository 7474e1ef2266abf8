"""The traces bundled with k3trace (k3trace/data): scrubbed SQLite exports recorded on an
H200 from kernels/, xz-compressed. `k3trace demo` analyses and diffs one pair of them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from k3trace.errors import ReportError

#: baseline, and the same workload with 4 us injected into every KDA step kernel.
DEMO_PAIR = ("small_inside_a", "small_delay_kda_step")


def bundled_trace(name: str) -> Path:
    path = Path(str(resources.files("k3trace").joinpath("data", f"{name}.sqlite.xz")))
    if not path.exists():
        raise ReportError(f"bundled trace {name} is missing", "reinstall k3trace (pip install -e .)")
    return path


def bundled_names() -> list[str]:
    folder = Path(str(resources.files("k3trace").joinpath("data")))
    return sorted(p.name.removesuffix(".sqlite.xz") for p in folder.glob("*.sqlite.xz"))
