"""What the bench scripts share: runs in child processes (wall time measured inside the
child, peak RSS from the kernel's accounting of that child), the reference code of an earlier
commit to check the JSON against, and larger exports made by replicating a recording.

Not a test helper: nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().parent / "child.py"
#: main before issue 13's speed work: the code whose JSON the optimised code must equal.
BASELINE = "8caebc4"


@dataclass(frozen=True)
class ChildRun:
    seconds: float        # measured inside the child, imports excluded
    peak_rss: int         # bytes, the child's maximum resident set
    out: dict             # what the child printed (its last line, JSON)
    waited: float = 0.0   # after `seconds`, untimed: waiting for its detached cache writer


#: What the bench scripts print beside a time of `analyze` or `diff`.
DETACHED_NOTE = ("times run until the answer is ready (as the command returns); where the code has one, the "
                 "cache entries' detached writer finishes after it and is waited for outside the time, before "
                 "the next run")


def waited_note(runs: list["ChildRun"]) -> str:
    waits = sorted(r.waited for r in runs)
    return f"{DETACHED_NOTE} (that wait: median {waits[len(waits) // 2]:.2f} s)" if waits else DETACHED_NOTE


def run_child(args: list[str], *, pythonpath: Path | None = None, env: dict | None = None) -> ChildRun:
    """`bench/child.py ARGS` in a fresh interpreter; peak RSS from wait4, per child (not
    RUSAGE_CHILDREN, which keeps the maximum over every child so far)."""
    environ = dict(os.environ, **(env or {}))
    if pythonpath is not None:
        environ["PYTHONPATH"] = str(pythonpath)
    proc = subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, env=environ, text=True)
    stdout = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed with exit code {proc.returncode}")
    out = json.loads(stdout.strip().splitlines()[-1])
    return ChildRun(seconds=float(out.get("seconds", 0.0)), peak_rss=usage.ru_maxrss * 1024, out=out,
                    waited=float(out.get("waited", 0.0)))


def reference_tree(rev: str, into: Path) -> Path:
    """The k3trace (and k3names) sources of commit `rev`, unpacked under `into`: run with
    PYTHONPATH pointing there, a child imports that code instead of the working tree's."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "k3trace", "k3names"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def first_difference(a, b, where: str = "") -> str | None:
    """Where two JSON trees differ first (None when equal), e.g. `kernels[3].mean_us: 1.2 != 1.3`."""
    if type(a) is not type(b):
        return f"{where or '.'}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}.{key}: present on one side only"
            found = first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} != {b!r}"


def same_json(mine: Path, reference: Path) -> str:
    """`identical` or the first difference of two JSON files. Top-level fields the reference
    does not have at all are a feature added since, not a changed number: they are named,
    and the rest must be identical."""
    a, b = json.loads(mine.read_text()), json.loads(reference.read_text())
    added = sorted(set(a) - set(b)) if isinstance(a, dict) and isinstance(b, dict) else []
    found = first_difference({k: v for k, v in a.items() if k not in added} if added else a, b)
    if found is not None:
        return f"DIFFERENT at {found}"
    return f"identical (fields added since: {', '.join(added)})" if added else "identical"


def kernel_count(export: Path) -> int:
    with sqlite3.connect(export) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


#: Tables whose rows a copy of the recording repeats: timed rows, shifted in time; those with
#: a correlation id get one past the recording's largest (graph-node creation events are
#: not repeated: the graphs are captured once and replayed in every copy).
_REPEATED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
             "NVTX_EVENTS")


def replicate(export: Path, times: int, into: Path) -> Path:
    """A copy of `export` holding its recording `times` over, one after the other: every
    kernel, CUDA API call, sync record and NVTX range repeated with its times shifted past
    the previous copy's end (plus 1 ms) and its correlation id past the largest."""
    out = into / f"{export.stem}_x{times}.sqlite"
    if out.exists():
        return out
    tmp = out.with_suffix(".part")
    shutil.copyfile(export, tmp)
    with sqlite3.connect(tmp) as con:
        tables = [t for t in _REPEATED if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone()]
        cols = {t: [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')] for t in tables}
        lo = min(con.execute(f'SELECT min(start) FROM "{t}"').fetchone()[0] for t in tables)
        hi = max(con.execute(f'SELECT max(coalesce("end", start)) FROM "{t}"').fetchone()[0] for t in tables)
        corr = max(con.execute(f'SELECT coalesce(max(correlationId), 0) FROM "{t}"').fetchone()[0]
                   for t in tables if "correlationId" in cols[t]) + 1
        period = hi - lo + 1_000_000
        rows = {t: con.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0] or 0 for t in tables}
        for i in range(1, times):
            for t in tables:
                shifted = {"start": f"start + {i * period}", "end": f'"end" + {i * period}',
                           "correlationId": f"correlationId + {i * corr}"}
                select = ", ".join(shifted.get(c, f'"{c}"') for c in cols[t])
                names = ", ".join(f'"{c}"' for c in cols[t])
                con.execute(f'INSERT INTO "{t}" ({names}) SELECT {select} FROM "{t}" WHERE rowid <= {rows[t]}')
        con.commit()
    tmp.rename(out)
    return out


def wait_for_entries(cache: Path, analyses: int = 1, timeout: float = 120.0) -> float:
    """Seconds until `analyses` analysis entries are whole and no temporary entry is left
    under `cache`: the detached cache writers of a run, waited for outside its timing."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        whole = sum((p / "manifest.json").exists() for p in (cache / "analyses").glob("*"))
        if whole >= analyses and not list(cache.rglob(".tmp-*")):
            break
        time.sleep(0.02)
    return time.perf_counter() - start


def run_command(args: list[str], cache: Path, analyses: int = 1) -> float:
    """Seconds of the command `k3trace ARGS --json --cache-dir CACHE` from its process's
    start to its exit, as a user waits for it; then its `analyses` cache entries' detached
    writers waited for, untimed, so that they never share the cores with the next run."""
    env = {k: v for k, v in os.environ.items() if k != "K3TRACE_CACHE_WAIT"}
    cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # From the cache's folder: `python -m` puts the current folder first on the path.
    subprocess.run([sys.executable, "-m", "k3trace.cli", *args, "--json", "--cache-dir", str(cache)],
                   stdout=subprocess.DEVNULL, env=env, check=True, cwd=cache)
    seconds = time.perf_counter() - start
    wait_for_entries(cache, analyses, timeout=600.0)
    return seconds


def temp_folder(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
