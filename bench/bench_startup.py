"""Start-up: `k3trace --help` and the imports a command pays before reading a report,
against a bare interpreter, measured side by side in one run (medians).

    python bench/bench_startup.py [--repeat 9]

Target (issue 13): `k3trace --help` within 0.15 s; the CLI imports neither polars, pyarrow,
numpy, plotly nor the ingest code until a command needs them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "k3trace"
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "k3trace.cli"]
HEAVY = ("polars", "pyarrow", "numpy", "plotly", "k3trace.ingest.report")
#: What `k3trace analyze REPORT` imports before it reads the report; with --json, all but
#: the terminal renderer (rich).
ANALYZE_JSON_IMPORTS = "import k3trace.cli, k3trace.analyses.pipeline; import adbc_driver_manager, adbc_driver_sqlite"
ANALYZE_IMPORTS = ANALYZE_JSON_IMPORTS + "; import k3trace.render.terminal"


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args()
    runs = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "k3trace --help": [*CLI, "--help"],
        "k3trace --version": [*CLI, "--version"],
        "k3trace analyze -h": [*CLI, "analyze", "-h"],
        "analyze's imports": [sys.executable, "-c", ANALYZE_IMPORTS],
        "analyze --json's": [sys.executable, "-c", ANALYZE_JSON_IMPORTS],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):  # interleaved: noise hits every command alike
        for name, cmd in runs.items():
            times[name].append(timed(cmd))
    bare = statistics.median(times["python -c pass"])
    loaded = subprocess.run([sys.executable, "-c", "import sys, k3trace.cli; print(' '.join(m for m in "
                             f"{HEAVY!r} if m in sys.modules))"], check=True, capture_output=True, text=True)
    print(f"medians of {args.repeat}")
    for name, values in times.items():
        t = statistics.median(values)
        target = "  (target <= 0.150 s)" if name == "k3trace --help" else ""
        print(f"{name:20s}: {t:6.3f} s   {t / bare:5.1f}x bare python, +{t - bare:.3f} s{target}")
    print(f"heavy modules imported by `import k3trace.cli`: {loaded.stdout.strip() or 'none'}")


if __name__ == "__main__":
    main()
