"""The `k3trace` command: thin wrappers over the library. The only module that reads the
environment (K3TRACE_NSYS, XDG_CACHE_HOME) and the only one that exits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from k3trace.config import Config, load_config
from k3trace.errors import ReportError, printable
from k3trace.ingest import Tools

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Critical-path and two-stream analysis of LLM decode steps from Nsight Systems traces.")
err = Console(stderr=True)


def _stdout() -> Console:
    """Rich's console on stdout; piped, it is wide enough for kernel names (rich would use 80)."""
    return Console() if sys.stdout.isatty() else Console(width=200)


@dataclass(frozen=True)
class Environment:
    """What the commands take from the machine: resolved once, passed down."""

    cache_dir: Path | None
    tools: Tools

    @classmethod
    def resolve(cls, cache_dir: Optional[Path], no_cache: bool) -> "Environment":
        from k3trace.ingest import cachefs

        if no_cache:
            folder = None
        elif cache_dir is not None:
            folder = cache_dir
        else:
            base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            folder = Path(base) / "k3trace"
        if folder is not None:
            # An unusable cache is not bad input: say so once and run without it.
            why = cachefs.unusable(folder)
            if why is not None:
                note(f"cache folder {folder.name} cannot be used ({why}); running without the cache")
                folder = None
            else:  # what killed runs left behind
                for sub in (folder, folder / "traces", folder / "analyses"):
                    cachefs.clean_leftovers(sub)
        nsys = os.environ.get("K3TRACE_NSYS") or shutil.which("nsys")
        return cls(cache_dir=folder, tools=Tools(nsys=nsys))


def note(text: str) -> None:
    err.print(f"k3trace: note: {printable(text)}", markup=False, highlight=False, soft_wrap=True)


@contextmanager
def _progress(label: str) -> Iterator:
    """A spinner on stderr, shown only when ingest takes longer than a second."""
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=err, transient=True)
    label = printable(label)
    task = progress.add_task(f"{label}: starting", total=None)
    started = threading.Event()

    def start() -> None:
        started.set()
        progress.start()

    timer = threading.Timer(1.0, start)
    timer.daemon = True
    if err.is_terminal:  # a spinner in a log or a pipe is only noise (and a stray blank line)
        timer.start()
    try:
        yield lambda phase: progress.update(task, description=f"{label}: {phase}")
    finally:
        timer.cancel()
        if started.is_set():  # stopping a spinner never shown would print a blank line
            progress.stop()


def analysis_of(path: Path, cfg: Config, env: Environment, donor=None):
    from k3trace.analyses import analyze_report

    with _progress(path.name) as update:
        return analyze_report(path, cfg, cache_dir=env.cache_dir, tools=env.tools, progress=update, donor=donor)


def donor_of(path: Path | None, cfg: Config, env: Environment):
    """The label donor of `--labels-from`: that report, analysed, lends its labelled step."""
    from k3trace.analyses.pipeline import label_donor

    if path is None:
        return None
    try:
        return label_donor(analysis_of(path, cfg, env))
    except ReportError as exc:
        if exc.problem.startswith("--labels-from"):
            raise
        raise ReportError(f"--labels-from {exc.problem}", exc.fix) from None


def fail(exc: BaseException) -> None:
    if isinstance(exc, ReportError):
        err.print(f"k3trace: {printable(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(ReportError.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        err.print("k3trace: interrupted", markup=False, highlight=False)
        raise typer.Exit(130)
    if isinstance(exc, MemoryError):
        err.print("k3trace: out of memory; analyse a shorter capture, or give k3trace more memory",
                  markup=False, highlight=False)
        raise typer.Exit(1)
    err.print(f"k3trace: internal error: {type(exc).__name__}: {printable(str(exc))} "
              "(set K3TRACE_DEBUG=1 for the traceback)", markup=False, highlight=False, soft_wrap=True)
    if os.environ.get("K3TRACE_DEBUG"):
        raise exc
    raise typer.Exit(1)


def _terminated(signum, frame) -> None:
    # SIGTERM unwinds like Ctrl-C, so work folders and temporary files are removed.
    raise KeyboardInterrupt


@contextmanager
def one_line_errors() -> Iterator[None]:
    """The CLI boundary: every failure becomes one line (exit 2 for bad input)."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    except typer.Exit:
        raise
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001
        fail(exc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def output_file(path: Path, what: str) -> Path:
    """Check, before any work, that `path` can be written as a file: its folder exists and
    it is not a folder itself."""
    if path.is_dir():
        raise ReportError(f"{what} {path.name} is a folder", f"pass a file name for the {what}")
    parent = path.parent
    if not parent.is_dir():
        raise ReportError(f"the folder of {what} {path.name} does not exist",
                          f"create it first, or pass a {what} path in an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ReportError(f"the folder of {what} {path.name} is not writable", f"pass a writable {what} path")
    return path


CacheDir = typer.Option(None, "--cache-dir", help="Where normalised traces are cached (default: XDG cache).")
NoCache = typer.Option(False, "--no-cache", help="Neither read nor write the cache.")
ConfigOpt = typer.Option(None, "--config", help="TOML file overriding k3trace's K3 defaults.")
LabelsFrom = typer.Option(None, "--labels-from", help="A labelled report of the same model (e.g. an eager run with "
                                                      "layerwise NVTX) whose layer labels replays without any take.")


@dataclass(frozen=True)
class AnalyzeOptions:
    report: Path
    json: bool
    config: Config
    env: Environment
    labels_from: Path | None = None


def run_analyze(opts: AnalyzeOptions) -> None:
    from k3trace.render.terminal import render_analysis

    analysis = analysis_of(opts.report, opts.config, opts.env, donor_of(opts.labels_from, opts.config, opts.env))
    if opts.json:
        sys.stdout.write(json.dumps(analysis.to_json(), indent=2) + "\n")
    else:
        _stdout().print(render_analysis(analysis))


@dataclass(frozen=True)
class RanksOptions:
    reports: tuple[Path, ...]
    json: bool
    config: Config
    env: Environment
    workers: int | None
    memory_gb: float | None
    engine: str
    scheduler: str | None


def run_ranks(opts: RanksOptions) -> None:
    from k3trace.analyses.ranks import analyze_ranks
    from k3trace.render.terminal import render_ranks

    with _progress(f"{len(opts.reports)} rank reports") as update:
        update("analysing in parallel")
        result = analyze_ranks(opts.reports, opts.config, cache_dir=opts.env.cache_dir, tools=opts.env.tools,
                               workers=opts.workers, engine=opts.engine, scheduler=opts.scheduler,
                               memory_per_worker=int(opts.memory_gb * 2**30) if opts.memory_gb else None)
    if opts.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _stdout().print(render_ranks(result))


@app.command("analyze")
def analyze_cmd(
    reports: list[Path] = typer.Argument(..., help="Report(s): .nsys-rep, .qdstrm, SQLite or parquetdir export "
                                                    "(optionally compressed); several, a folder or a quoted glob: "
                                                    "one report per rank."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    config: Optional[Path] = ConfigOpt,
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
    workers: Optional[int] = typer.Option(None, "--workers", help="Rank reports analysed at once (default: CPUs)."),
    memory_gb: Optional[float] = typer.Option(None, "--memory-per-worker", help="Address-space cap per worker, GiB."),
    engine: str = typer.Option("local", "--engine", help="local (process pool) or dask."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler address (engine dask)."),
    labels_from: Optional[Path] = LabelsFrom,
) -> None:
    """A decode step's anatomy: steps, families, two-stream residency, exposed time, PDL."""
    with one_line_errors():
        from k3trace.analyses.ranks import resolve_reports

        env = Environment.resolve(cache_dir, no_cache)
        paths = resolve_reports(reports)
        if len(paths) > 1:
            if labels_from is not None:
                raise ReportError("--labels-from takes one report to analyze", "analyze the rank reports one by one")
            run_ranks(RanksOptions(tuple(paths), json_out, load_config(config), env, workers, memory_gb, engine,
                                   scheduler))
            return
        run_analyze(AnalyzeOptions(paths[0], json_out, load_config(config), env, labels_from))


@dataclass(frozen=True)
class DiffOptions:
    old: tuple[Path, ...]
    new: tuple[Path, ...]
    format: str
    html: Path | None
    fail_on: str | None
    config: Config
    env: Environment
    labels_from: Path | None = None


DIFF_FORMATS = ("terminal", "json", "markdown")
FAIL_ON = ("slower",)


def run_diff(opts: DiffOptions) -> None:
    from k3trace.diff import diff
    from k3trace.diff.noise import SLOWER
    from k3trace.render.terminal import diff_markdown, render_diff

    donor = donor_of(opts.labels_from, opts.config, opts.env)
    old = [analysis_of(p, opts.config, opts.env, donor) for p in opts.old]
    new = [analysis_of(p, opts.config, opts.env, donor) for p in opts.new]
    result = diff(old, new)
    if opts.html is not None:
        from k3trace.render.html import write_diff_page

        write_diff_page(result, opts.html)
    if opts.format == "json":
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    elif opts.format == "markdown":
        sys.stdout.write(diff_markdown(result))
    else:
        _stdout().print(render_diff(result))
    if opts.fail_on == "slower" and result.verdict_itl == SLOWER:
        raise typer.Exit(1)


@app.command("diff")
def diff_cmd(
    reports: list[Path] = typer.Argument(None, help="OLD NEW (one report each)."),
    old: list[Path] = typer.Option(None, "--old", help="Repeated runs of the old build (instead of OLD)."),
    new: list[Path] = typer.Option(None, "--new", help="Repeated runs of the new build (instead of NEW)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout (same as --format json)."),
    output_format: str = typer.Option("terminal", "--format", help="terminal, json or markdown (for a pull request)."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on",
                                          help="`slower`: exit 1 when the ITL got slower beyond the noise band."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    config: Optional[Path] = ConfigOpt,
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
    labels_from: Optional[Path] = LabelsFrom,
) -> None:
    """Which kernel change moved the ITL between two builds, against the noise band."""
    with one_line_errors():
        reports = reports or []
        if output_format not in DIFF_FORMATS:
            raise ReportError(f"unknown --format {output_format!r}", f"use one of {', '.join(DIFF_FORMATS)}")
        if fail_on is not None and fail_on not in FAIL_ON:
            raise ReportError(f"unknown --fail-on {fail_on!r}", f"use one of {', '.join(FAIL_ON)}")
        if json_out and output_format not in ("terminal", "json"):
            raise ReportError("--json and --format markdown were both given", "pass one of them")
        if reports and (old or new):
            raise ReportError("give either OLD NEW or --old/--new, not both", "see `k3trace diff --help`")
        if reports:
            if len(reports) != 2:
                raise ReportError(f"diff takes two reports, got {len(reports)}",
                                  "pass OLD NEW, or --old A1 --old A2 --new B1 --new B2 for repeated runs")
            old, new = [reports[0]], [reports[1]]
        if not old or not new:
            raise ReportError("diff needs an old and a new build", "pass OLD NEW, or --old ... --new ...")
        if html is not None:
            output_file(html, "HTML report")
        run_diff(DiffOptions(tuple(old), tuple(new), "json" if json_out else output_format, html, fail_on,
                             load_config(config), Environment.resolve(cache_dir, no_cache), labels_from))


@app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def record_cmd(
    ctx: typer.Context,
    workload: str = typer.Option("k3-decode", "--workload", help="Built-in workload: k3-decode or small."),
    batch: int = typer.Option(1, "--batch", help="Decode batch size."),
    steps: int = typer.Option(50, "--steps", help="Graph replays inside the capture window."),
    variant: str = typer.Option("baseline", "--variant", help="Workload variant (kernels/README.md)."),
    layers: int = typer.Option(0, "--layers", help="Model depth (0: all 93 K3 layers)."),
    capture: str = typer.Option("inside", "--capture", help="Graph capture inside or before the window."),
    output: Path = typer.Option(Path("k3trace-record"), "-o", "--output", help="Report path (no suffix)."),
    capture_range_end: str = typer.Option("stop", "--capture-range-end", help="stop, or repeat for engines."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command line and exit."),
    profiler: str = typer.Option("nsys", "--profiler", help="nsys, or torch: torch.profiler (Kineto trace), "
                                                             "for the built-in workload on machines without nsys."),
    cache_dir: Optional[Path] = CacheDir,
) -> None:
    """Record a decode loop under Nsight Systems (`-- CMD ...` profiles a serving engine)."""
    from k3trace import record

    with one_line_errors():
        env = Environment.resolve(cache_dir, False)
        external = tuple(ctx.args)
        if profiler not in ("nsys", "torch"):
            raise ReportError(f"unknown profiler {profiler!r}", "pass --profiler nsys or --profiler torch")
        command = external or record.workload_command(workload, batch, steps, variant, layers, capture)
        if profiler == "torch":
            if external:
                raise ReportError("--profiler torch records the built-in workload only",
                                  "start a serving engine's own torch.profiler (docs/recording.md, "
                                  "\"torch.profiler\") and pass its trace to `k3trace analyze`")
            torch_plan = record.TorchRecordPlan(output=output, command=command)
            if dry_run:
                typer.echo(torch_plan.shell())
                return
            trace = record.run_torch(torch_plan)
            err.print(f"recorded {trace}", markup=False)
            run_analyze(AnalyzeOptions(trace, False, load_config(None), env))
            return
        plan = record.RecordPlan(
            nsys=env.tools.nsys or "nsys", output=output, command=command, capture_range_end=capture_range_end,
            extra_flags=record.ENGINE_FLAGS if external else (),
        )
        if dry_run:
            typer.echo(plan.shell())
            return
        if env.tools.nsys is None:
            raise ReportError("nsys was not found", "put Nsight Systems' nsys on PATH or set K3TRACE_NSYS")
        report = record.run(plan)
        err.print(printable(f"recorded {report}"), markup=False)
        run_analyze(AnalyzeOptions(report, False, load_config(None), env))


@app.command("demo")
def demo_cmd(
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the diff's HTML report here."),
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
) -> None:
    """Analyze and diff the real H200 traces bundled with k3trace."""
    from k3trace.demo import DEMO_PAIR, THIRD_PARTY_PAIR, bundled_trace

    with one_line_errors():
        if html is not None:
            output_file(html, "HTML report")
        env = Environment.resolve(cache_dir, no_cache)
        old, new = (bundled_trace(name) for name in DEMO_PAIR)
        out = _stdout()
        out.rule(f"k3trace analyze {old.name}")
        run_analyze(AnalyzeOptions(old, False, load_config(None), env))
        out.rule(f"k3trace diff {old.name} {new.name}")
        run_diff(DiffOptions((old,), (new,), "terminal", html, None, load_config(None), env))
        old, new = (bundled_trace(name) for name in THIRD_PARTY_PAIR)
        out.rule(f"k3trace diff {old.name} {new.name} (transformers Llama: RMSNorm fused)")
        run_diff(DiffOptions((old,), (new,), "terminal", None, None, load_config(None), env))


@app.command("scrub")
def scrub_cmd(
    report: Path = typer.Argument(..., help="Report to scrub: .nsys-rep, .qdstrm or SQLite export (never modified)."),
    output: Path = typer.Option(..., "-o", "--output", help="Scrubbed SQLite file to write (.xz/.gz: compressed)."),
) -> None:
    """Remove the environment and host data a report carries, before sharing it."""
    from k3trace.scrub import scrub

    with one_line_errors():
        output_file(output, "scrubbed output")
        summary = scrub(report, output, Environment.resolve(None, True).tools)
    err.print(printable(f"wrote {output.name}: " + ", ".join(f"{k} {v}" for k, v in summary.items())), markup=False)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
