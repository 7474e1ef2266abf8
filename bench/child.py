"""One measured run, in its own interpreter (bench/harness.py starts it): prints one JSON
line with `seconds`, the wall time of the work itself (imports excluded). With PYTHONPATH
set to a reference tree it runs that commit's code: the calls below exist there too.

    child.py fetch EXPORT
    child.py analyze EXPORT [--cache-dir D] [--json-out FILE]
    child.py diff OLD NEW [--cache-dir D] [--json-out FILE]
    child.py ranks REPORT... [--cache-dir D]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import time
from pathlib import Path

#: The floor: Python's sqlite3 fetching the kernel rows an analysis needs.
KERNEL_QUERY = ("SELECT start, end, streamId, shortName, correlationId, graphNodeId, deviceId, globalPid "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL")


def fetch(export: Path) -> None:
    con = sqlite3.connect(export)
    rows = con.execute(KERNEL_QUERY).fetchall()
    con.close()
    assert rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("fetch", "analyze", "diff", "ranks"))
    p.add_argument("paths", type=Path, nargs="+")
    p.add_argument("--cache-dir", type=Path)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if args.what == "fetch":
        t = time.perf_counter()
        fetch(args.paths[0])
        print(json.dumps({"seconds": time.perf_counter() - t}))
        return
    # As the console command does before polars loads, where the code has it.
    with contextlib.suppress(ImportError):
        from k3trace.heap import tune_allocator

        tune_allocator()
    from k3trace.analyses import pipeline
    from k3trace.config import load_config

    # ingest imports its SQLite driver on first use: start-up cost, measured by
    # bench_startup.py. Only the modules the code under test imports: code that reads
    # through the DB-API module loads pyarrow with it; the code since reads through the
    # driver manager and never loads pyarrow (its detached cache writer relies on that).
    with contextlib.suppress(ImportError):
        import adbc_driver_manager  # noqa: F401
        import adbc_driver_sqlite  # noqa: F401
        import k3trace.ingest.tables as tables

        if "adbc_driver_sqlite.dbapi" in Path(tables.__file__).read_text():
            import adbc_driver_sqlite.dbapi  # noqa: F401
    cfg = load_config()
    # As the commands do once their imports are done, where the code has it.
    with contextlib.suppress(ImportError):
        from k3trace.heap import freeze_imports

        freeze_imports()
    # As the commands run it: where the code has it, `analyze` and `diff` return with their
    # answer while a detached writer finishes the cache entries (pipeline.saved_detached);
    # the time stops there, and the writer is waited for after it (`waited`), so that it
    # never shares the cores with the next measured run.
    detached = getattr(pipeline, "saved_detached", None)
    if args.what == "analyze":
        from k3trace.analyses import analyze_report

        import_done = time.perf_counter()
        with detached() if detached else contextlib.nullcontext():
            result = analyze_report(args.paths[0], cfg, cache_dir=args.cache_dir)
    elif args.what == "diff":
        from k3trace.cli import Environment, analyses_of
        from k3trace.diff import diff
        from k3trace.ingest import Tools

        import_done = time.perf_counter()
        # Before the detached writer: the analyses' cache entries were written while the
        # diff was worked out, and the time includes waiting for them.
        with (detached or getattr(pipeline, "saved_meanwhile", contextlib.nullcontext))():
            old, new = analyses_of(tuple(args.paths[:2]), cfg, Environment(cache_dir=args.cache_dir, tools=Tools()))
            result = diff([old], [new])
    else:
        from k3trace.analyses.ranks import analyze_ranks

        import_done = time.perf_counter()
        result = analyze_ranks(args.paths, cfg, cache_dir=args.cache_dir)
    seconds = time.perf_counter() - import_done
    waited = time.perf_counter()
    getattr(pipeline, "wait_detached", lambda: None)()
    if args.what == "ranks" and args.cache_dir is not None:
        # The rank workers' detached writers are not this process's children.
        from harness import wait_for_entries

        wait_for_entries(args.cache_dir, len(args.paths), timeout=600.0)
    waited = time.perf_counter() - waited
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result.to_json(), indent=1, sort_keys=True))
    print(json.dumps({"seconds": seconds, "waited": waited}))


if __name__ == "__main__":
    main()
