"""Where one cold analysis spends its wall time: each stage of `analyze` timed in one
process (no cache), with the thread it ran on (the path and the overlap side run side by
side, so their times overlap). For finding the next thing to speed up, not a target.

    python bench/bench_stages.py EXPORT
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from pathlib import Path

from k3trace.analyses import critical_path, families, kernels, layers, pipeline, stepgraph, steptimes
from k3trace.config import load_config

TIMES: dict[str, list[tuple[str, float]]] = {}


def timed(module, name: str) -> None:
    """Replace `module.name` by a wrapper that records its wall time and thread."""
    work = getattr(module, name)

    @functools.wraps(work)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return work(*args, **kwargs)
        finally:
            TIMES.setdefault(name, []).append((threading.current_thread().name, time.perf_counter() - start))

    setattr(module, name, wrapper)


def main() -> None:
    for name in ("load_report", "assign_steps", "classify_steps", "label", "path_metrics", "overlap_metrics",
                 "step_overlap"):
        timed(pipeline, name)
    for module, names in ((critical_path, ("dependency_edges", "walk")), (stepgraph, ("build", "slack")),
                          (families, ("family_table",)), (kernels, ("kernel_table",)),
                          (layers, ("layer_steps",)), (steptimes, ("per_step",))):
        for name in names:
            timed(module, name)
    start = time.perf_counter()
    pipeline.analyze(pipeline.load_report(Path(sys.argv[1])), load_config(None))
    total = time.perf_counter() - start
    for name, runs in TIMES.items():
        print(f"{name:18s}", "  ".join(f"{thread[:12]}: {seconds:.3f} s" for thread, seconds in runs))
    print(f"{'total':18s} {total:.3f} s")


if __name__ == "__main__":
    main()
