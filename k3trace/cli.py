"""The `k3trace` command: thin wrappers over the library. The only module that reads the
environment (K3TRACE_NSYS, XDG_CACHE_HOME) and the only one that exits.

Start-up is kept light (`k3trace --help` in ~0.1 s, bench/bench_startup.py): the data stack
(polars, pyarrow, numpy, plotly) and the library modules built on it are imported inside
the commands that use them, never at module level."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Iterator, Optional

import functools
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

from k3trace import __version__, heap
from k3trace.errors import NoDecodeSteps, ReportError, printable

# Before anything loads polars (its allocator reads the option once, then).
heap.tune_allocator()

if TYPE_CHECKING:  # imported where used: `k3trace --help` needs neither (bench_startup.py)
    from rich.console import Console

    from k3trace.config import Config
    from k3trace.ingest.tools import Tools


def load_config(path: Path | None, warmup: int | None = None) -> Config:
    """k3trace.config.load_config, imported on first use (`--help` reads no config);
    `--warmup`, where given, over the file's [steps] warmup."""
    from dataclasses import replace

    from k3trace.config import load_config as load

    cfg = load(path)
    return cfg if warmup is None else replace(cfg, warmup_steps=warmup)


def _clicks() -> list:
    """The click modules whose errors can reach us: typer >= 0.22 carries its own copy, and
    the standalone one only where something imported it (importing it here costs `--help`
    about 10 ms of its start-up, for errors nothing would raise)."""
    try:
        from typer import _click as own
    except ImportError:  # pragma: no cover - older typer
        import click as own
    standalone = sys.modules.get("click")
    return [own] + ([standalone] if standalone is not None and standalone is not own else [])


def _usage_errors() -> tuple[type[BaseException], ...]:
    return tuple(c.ClickException for c in _clicks())


def _no_args() -> tuple[type[BaseException], ...]:
    return tuple(c.exceptions.NoArgsIsHelpError for c in _clicks())


def _aborts() -> tuple[type[BaseException], ...]:
    # typer 0.28's own click keeps Abort in typer.exceptions only.
    return (*(c.exceptions.Abort for c in _clicks() if hasattr(c.exceptions, "Abort")), typer.Abort)


class OneLineUsageErrors(TyperGroup):
    """Usage errors (an unknown option, a value outside its choices, a missing argument)
    end like bad input: one line naming the problem and what to do, exit code 2."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except _no_args() as exc:  # bare `k3trace`: the help, as click does
            exc.show()
            sys.exit(exc.exit_code)
        except _usage_errors() as exc:
            ctx = getattr(exc, "ctx", None)
            where = ctx.command_path if ctx is not None else "k3trace"
            problem = exc.format_message().strip().rstrip(".").replace("Value error, ", "")
            problem = problem[:1].lower() + problem[1:]
            err().print(f"k3trace: {printable(problem)}; see `{where} -h`", markup=False, highlight=False,
                      soft_wrap=True)
            sys.exit(exc.exit_code)
        except _aborts():
            err().print("k3trace: interrupted", markup=False, highlight=False)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


#: Set once analyze or diff has written its whole answer: the process then ends at once.
_answered = threading.Event()
#: Set where the command runs as the console script, in a process of its own (not called
#: from tests or other Python code): then its imports are frozen (heap.freeze_imports).
_console = threading.Event()


def _freeze_imports() -> None:
    if _console.is_set():
        heap.freeze_imports()


class _App(typer.Typer):
    """The command as the console script (and `python -m k3trace.cli`) runs it. Once
    analyze or diff has written its answer, the process ends without the interpreter's
    teardown: freeing every frame, array and module of an analysis one by one took 0.2-0.3 s
    after the answer at 373k kernels (whole command 2.01 -> 1.67 s); the kernel takes the
    memory back at once. Their cache entries were handed to the detached writer, their
    executors shut down and their files closed before (typer's CliRunner, the tests', calls
    the command without this)."""

    def __call__(self, *args, **kwargs):
        _answered.clear()  # only this invocation's answer ends the process early
        _console.set()
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as exc:
            if _answered.is_set():
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                os._exit(exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1)
            raise


app = _App(cls=OneLineUsageErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Critical-path and two-stream analysis of LLM decode steps from Nsight Systems traces.")


@functools.cache
def err() -> Console:
    """Rich's console on stderr, made on first use (rich's import is a third of `--help`'s)."""
    from rich.console import Console

    return Console(stderr=True)


#: Piped output this wide unless --width or COLUMNS says otherwise (rich would use 80).
PIPE_WIDTH = 200


def _version(value: bool) -> None:
    if value:
        typer.echo(f"k3trace {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Critical-path and two-stream analysis of LLM decode steps from Nsight Systems traces."""


def _stdout(width: int | None = None) -> Console:
    """Rich's console on stdout: `--width` when given; on a terminal, its width; piped,
    COLUMNS when set, else wide enough for kernel names. Names wrap, never cut."""
    from rich.console import Console

    if width is not None:
        return Console(width=width)
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) >= 40 else PIPE_WIDTH)


def wrote(path: Path, what: str, detail: str = "") -> None:
    """Every file a command writes is announced on stderr, with the path as given."""
    err().print(f"k3trace: wrote {what} {printable(str(path))}" + (f" ({printable(detail)})" if detail else ""),
              markup=False, highlight=False, soft_wrap=True)


class Workload(str, Enum):
    k3_decode = "k3-decode"
    small = "small"


class Capture(str, Enum):
    inside = "inside"
    before = "before"


class Profiler(str, Enum):
    nsys = "nsys"
    torch = "torch"


class Engine(str, Enum):
    local = "local"
    dask = "dask"


class DiffFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    markdown = "markdown"


class FailOn(str, Enum):
    slower = "slower"


class StreamRole(str, Enum):
    main = "main"
    side = "side"


#: The K3 workload's variant flags (kernels/k3/variants.py; k3trace does not import the
#: workload, a test keeps the two lists equal), joined with `+`; the small workload's names.
K3_VARIANT_FLAGS = ("mla_epilogue_split", "no_attn_forks", "router_multipass", "kda_norm_separate",
                    "residual_separate", "kda_cute",
                    # the bs1 campaign (kernels/README.md)
                    "router_fork", "mla_combine_wide", "attn_res_fused", "triton_linear", "situ_fused",
                    "fmha_short_splits", "router_align_fused", "mlp_residual_folded",
                    "pdl_early_trigger", "attn_res_dot", "attn_res_early_rows", "moe_tail_fused",
                    "latent_norm_folded", "linear_early_weights", "kda_conv_fused", "mla_proj_merged",
                    "moe_sum_norm_fused", "linear_split_k", "triton_o_proj",
                    "triton_mla_proj", "router_in_front", "attn_res_in_o_proj",
                    "linear_tma", "side_priority", "moe_down_mixed",
                    "attn_res_one_pass", "pdl_trigger_first", "linear_tma_x", "linear_tma_tuned",
                    "moe_tail_mma", "linear_gluon", "linear_ws", "moe_down_atomic",
                    "situ_in_gate_up", "shared_in_up", "fmha_one_tile", "fmha_early_kv",
                    "mla_head_bmm", "mla_gate_in_v", "g_proj_early",
                    "mla_q_skinny", "no_pdl", "moe_grouped_tuned", "attn_res_wide",
                    "mla_absorb_concat", "mla_kv_norm_insert", "mla_gate_in_o_proj", "prefetch_lines",
                    "moe_weights_ahead", "mla_o_proj_ahead", "kda_split_v", "shared_front_leg",
                    "router_top4", "router_bitonic", "moe_grouped_tma")
SMALL_VARIANTS = ("nofork",)
_DELAY = re.compile(r"delay:[A-Za-z_][A-Za-z0-9_]*:\d+")
_PREFETCH = re.compile(r"(prefetch|prefetch_leg|linear_prefetch|gemm_prefetch):\d+")
#: nsys profile --capture-range-end values.
_RANGE_END = re.compile(r"none|stop|stop-shutdown|repeat(:\d+)?|repeat-shutdown:\d+")


def check_variant(workload: str, variant: str) -> str:
    """A variant the workload knows, before anything runs (kernels/README.md, "Variants")."""
    if workload == Workload.small.value:
        if variant in ("baseline", *SMALL_VARIANTS) or _DELAY.fullmatch(variant):
            return variant
        raise ReportError(f"unknown variant {variant!r} for the small workload",
                          "use baseline, nofork or delay:<kernel>:<ns>")
    parts = variant.split("+")
    delays = [p for p in parts if _DELAY.fullmatch(p)]
    prefetches = [p.split(":")[0] for p in parts if _PREFETCH.fullmatch(p)]
    unknown = [p for p in parts if p not in ("baseline", *K3_VARIANT_FLAGS)
               and not _DELAY.fullmatch(p) and not _PREFETCH.fullmatch(p)]
    if unknown or len(delays) > 1 or len(prefetches) > len(set(prefetches)):
        what = (f"unknown variant {unknown[0]!r}" if unknown else
                "more than one delay in the variant" if len(delays) > 1 else "more than one prefetch in the variant")
        raise ReportError(f"{what} for k3-decode", f"use baseline, {', '.join(K3_VARIANT_FLAGS)}, "
                          "prefetch:<MB>, prefetch_leg:<MB>, linear_prefetch:<MB>, gemm_prefetch:<MB> or "
                          "delay:<kernel>:<ns>, joined with + (kernels/README.md)")
    return variant


def check_range_end(value: str) -> str:
    if not _RANGE_END.fullmatch(value):
        raise ReportError(f"unknown --capture-range-end {value!r}",
                          "use stop, stop-shutdown, repeat[:N], repeat-shutdown:N or none (nsys profile)")
    return value


@dataclass(frozen=True)
class Environment:
    """What the commands take from the machine: resolved once, passed down."""

    cache_dir: Path | None
    tools: Tools
    #: K3TRACE_CACHE_WAIT=1: analyze and diff wait for their cache writes before returning
    #: (tests; else a detached writer finishes them after the command returns).
    wait_for_cache: bool = False

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
        from k3trace.ingest.tools import Tools

        return cls(cache_dir=folder, tools=Tools(nsys=nsys), wait_for_cache=os.environ.get("K3TRACE_CACHE_WAIT") == "1")


def note(text: str) -> None:
    err().print(f"k3trace: note: {printable(text)}", markup=False, highlight=False, soft_wrap=True)


@contextmanager
def _progress(label: str) -> Iterator:
    """A spinner on stderr, shown only when ingest takes longer than a second."""
    # A spinner in a log or a pipe is only noise (and a stray blank line). Asked of the stream
    # itself: rich's console (15 ms of imports) loads only where the spinner may show.
    if not (sys.stderr is not None and sys.stderr.isatty()):
        yield lambda phase: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=err(), transient=True)
    label = printable(label)
    task = progress.add_task(f"{label}: starting", total=None)
    started = threading.Event()

    def start() -> None:
        started.set()
        progress.start()

    timer = threading.Timer(1.0, start)
    timer.daemon = True
    timer.start()
    try:
        yield lambda phase: progress.update(task, description=f"{label}: {phase}")
    finally:
        timer.cancel()
        if started.is_set():  # stopping a spinner never shown would print a blank line
            progress.stop()


def analysis_of(path: Path, cfg: Config, env: Environment, donor=None, for_diff: bool = False):
    from k3trace.analyses import analyze_report

    _freeze_imports()
    with _progress(path.name) as update:
        return analyze_report(path, cfg, cache_dir=env.cache_dir, tools=env.tools, progress=update, donor=donor,
                              for_diff=for_diff)


def capture_donor_of(path: Path, cfg: Config, env: Environment):
    from k3trace.ingest import load_report
    from k3trace.model.labels.capture import capture_donor

    return capture_donor(load_report(path, cache_dir=env.cache_dir, tools=env.tools), cfg)


def donor_of(path: Path | None, cfg: Config, env: Environment):
    """The label donor of `--labels-from`: that report, analysed, lends its labelled step."""
    from k3trace.analyses.pipeline import label_donor

    if path is None:
        return None
    try:
        try:
            return label_donor(analysis_of(path, cfg, env))
        except NoDecodeSteps:
            # A startup profile: the graph capture alone can lend its nodes' labels.
            donor = capture_donor_of(path, cfg, env)
            if donor is None:
                raise
            return donor
    except ReportError as exc:
        if exc.problem.startswith("--labels-from"):
            raise
        raise ReportError(f"--labels-from {exc.problem}", exc.fix) from None


def analyses_of(paths: tuple[Path, ...], cfg: Config, env: Environment, donor=None) -> list:
    """The sides of a diff: several reports analysed side by side in threads (polars and
    numpy release the GIL; measured on the two full-depth K3 exports: 3.25 s against 3.53 s
    one after the other), each on its share of the cores (k3trace/cores.py: its tables
    read in fewer parts), without progress spinners, which would write over each other;
    each without the parts a diff never reads (analyses.result.DIFF_OMITS)."""
    from concurrent.futures import ThreadPoolExecutor

    from k3trace.analyses import analyze_report

    if len(paths) == 1:
        return [analysis_of(paths[0], cfg, env, donor, for_diff=True)]
    _freeze_imports()
    with ThreadPoolExecutor(min(len(paths), os.cpu_count() or 1, 4)) as pool:
        return list(pool.map(lambda p: analyze_report(p, cfg, cache_dir=env.cache_dir, tools=env.tools,
                                                      donor=donor, for_diff=True), paths))


def fail(exc: BaseException) -> None:
    if isinstance(exc, ReportError):
        err().print(f"k3trace: {printable(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(ReportError.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        err().print("k3trace: interrupted", markup=False, highlight=False)
        raise typer.Exit(130)
    if isinstance(exc, MemoryError):
        err().print("k3trace: out of memory; analyse a shorter capture, or give k3trace more memory",
                  markup=False, highlight=False)
        raise typer.Exit(1)
    err().print(f"k3trace: internal error: {type(exc).__name__}: {printable(str(exc))} "
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
Warmup = typer.Option(None, "--warmup", min=0, help="Complete steps dropped as warm-up before the stable ones "
                                                    "(default 2; 0 for a short torch.profiler trace).")
Width = typer.Option(None, "--width", min=40, help="Terminal output width (default: the terminal's; piped: "
                                                   "COLUMNS, else 200). Names wrap, never cut.")
LabelsFrom = typer.Option(None, "--labels-from", help="A labelled report of the same model (e.g. an eager run with "
                                                      "layerwise NVTX) whose layer labels replays without any take.")


@dataclass(frozen=True)
class AnalyzeOptions:
    report: Path
    json: bool
    config: Config
    env: Environment
    html: Path | None = None
    width: int | None = None
    labels_from: Path | None = None


@contextmanager
def cache_writes(env: Environment) -> Iterator[None]:
    """The cache entries of the analyses made within the block are finished by a detached
    writer once it is left (the answer is printed first, and the command returns without
    waiting for them; pipeline.saved_detached); with K3TRACE_CACHE_WAIT=1 it waits."""
    from k3trace.analyses import pipeline

    try:
        with pipeline.saved_detached():
            yield
    finally:
        if env.wait_for_cache:
            pipeline.wait_detached()


def run_analyze(opts: AnalyzeOptions):
    with cache_writes(opts.env):
        return _run_analyze(opts)


def _run_analyze(opts: AnalyzeOptions):
    # The terminal renderer (rich's tables, 40 ms of imports) only for an answer printed as
    # text; imported before the analysis, so that it is frozen with the other imports.
    if not opts.json:
        from k3trace.render.terminal import render_analysis

    analysis = analysis_of(opts.report, opts.config, opts.env, donor_of(opts.labels_from, opts.config, opts.env))
    if opts.html is not None:
        from k3trace.render.html import write_analysis_page

        write_analysis_page(analysis, opts.html)
        wrote(opts.html, "HTML report")
    if opts.json:
        sys.stdout.write(json.dumps(analysis.to_json(), indent=2) + "\n")
    else:
        _stdout(opts.width).print(render_analysis(analysis))
    _answered.set()
    return analysis


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
    width: int | None = None


def run_ranks(opts: RanksOptions) -> None:
    from k3trace.analyses.ranks import analyze_ranks

    if not opts.json:  # as analyze's
        from k3trace.render.terminal import render_ranks

    with _progress(f"{len(opts.reports)} rank reports") as update:
        update("analysing in parallel")
        result = analyze_ranks(opts.reports, opts.config, cache_dir=opts.env.cache_dir, tools=opts.env.tools,
                               workers=opts.workers, engine=opts.engine, scheduler=opts.scheduler,
                               memory_per_worker=int(opts.memory_gb * 2**30) if opts.memory_gb else None,
                               wait_for_cache=opts.env.wait_for_cache)
    if opts.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _stdout(opts.width).print(render_ranks(result))


@app.command("analyze")
def analyze_cmd(
    reports: list[Path] = typer.Argument(..., help="Report(s): .nsys-rep, .qdstrm, SQLite or parquetdir export "
                                                    "(optionally compressed), or a torch.profiler (Kineto) JSON "
                                                    "trace; several, a folder or a quoted glob: "
                                                    "one report per rank."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    config: Optional[Path] = ConfigOpt,
    warmup: Optional[int] = Warmup,
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
    workers: Optional[int] = typer.Option(None, "--workers", help="Rank reports analysed at once (default: CPUs)."),
    memory_gb: Optional[float] = typer.Option(None, "--memory-per-worker", help="Address-space cap per worker, GiB."),
    engine: Engine = typer.Option(Engine.local, "--engine", help="local (process pool) or dask."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler address (engine dask)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report (one report)."),
    width: Optional[int] = Width,
    labels_from: Optional[Path] = LabelsFrom,
) -> None:
    """A decode step's anatomy: steps, families, two-stream residency, exposed time, PDL."""
    with one_line_errors():
        from k3trace.analyses.ranks import resolve_reports

        if html is not None:
            output_file(html, "HTML report")
        env = Environment.resolve(cache_dir, no_cache)
        paths = resolve_reports(reports)
        if len(paths) > 1:
            if html is not None:
                raise ReportError(f"--html writes the report of one trace, and {len(paths)} were given",
                                  "run `k3trace analyze REPORT --html FILE` once per rank")
            if labels_from is not None:
                raise ReportError("--labels-from takes one report to analyze", "analyze the rank reports one by one")
            run_ranks(RanksOptions(tuple(paths), json_out, load_config(config, warmup), env, workers, memory_gb,
                                   engine.value, scheduler, width))
            return
        run_analyze(AnalyzeOptions(paths[0], json_out, load_config(config, warmup), env, html, width, labels_from))


@dataclass(frozen=True)
class DiffOptions:
    old: tuple[Path, ...]
    new: tuple[Path, ...]
    format: str
    html: Path | None
    fail_on: str | None
    config: Config
    env: Environment
    width: int | None = None
    labels_from: Path | None = None


def run_diff(opts: DiffOptions) -> None:
    # The analyses' cache entries are finished by a detached writer once the answer is out.
    with cache_writes(opts.env):
        _run_diff(opts)


def _run_diff(opts: DiffOptions) -> None:
    from k3trace.diff import diff
    from k3trace.diff.noise import SLOWER

    if opts.format != "json":  # as analyze's
        from k3trace.render.terminal import diff_markdown, render_diff

    donor = donor_of(opts.labels_from, opts.config, opts.env)
    both = analyses_of(opts.old + opts.new, opts.config, opts.env, donor)
    old, new = both[:len(opts.old)], both[len(opts.old):]
    result = diff(old, new)
    if opts.html is not None:
        from k3trace.render.html import write_diff_page

        write_diff_page(result, opts.html)
        wrote(opts.html, "HTML report")
    if opts.format == "json":
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    elif opts.format == "markdown":
        sys.stdout.write(diff_markdown(result))
    else:
        _stdout(opts.width).print(render_diff(result))
    _answered.set()
    if opts.fail_on == "slower" and result.verdict == SLOWER:
        raise typer.Exit(1)


@app.command("diff")
def diff_cmd(
    reports: list[Path] = typer.Argument(None, help="OLD NEW (one report each)."),
    old: list[Path] = typer.Option(None, "--old", help="Repeated runs of the old build (instead of OLD)."),
    new: list[Path] = typer.Option(None, "--new", help="Repeated runs of the new build (instead of NEW)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout (same as --format json)."),
    output_format: DiffFormat = typer.Option(DiffFormat.terminal, "--format",
                                             help="terminal, json or markdown (for a pull request)."),
    fail_on: Optional[FailOn] = typer.Option(None, "--fail-on",
                                             help="`slower`: exit 1 when the ITL got slower beyond the noise band."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    config: Optional[Path] = ConfigOpt,
    warmup: Optional[int] = Warmup,
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
    width: Optional[int] = Width,
    labels_from: Optional[Path] = LabelsFrom,
) -> None:
    """Which kernel change moved the ITL between two builds, against the noise band."""
    with one_line_errors():
        reports = reports or []
        output_format = output_format.value
        fail_on = fail_on.value if fail_on is not None else None
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
                             load_config(config, warmup), Environment.resolve(cache_dir, no_cache), width,
                             labels_from))


@app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def record_cmd(
    ctx: typer.Context,
    workload: Workload = typer.Option(Workload.k3_decode, "--workload", help="Built-in workload."),
    batch: int = typer.Option(1, "--batch", min=1, help="Decode batch size."),
    steps: int = typer.Option(50, "--steps", min=1, help="Graph replays inside the capture window."),
    variant: str = typer.Option("baseline", "--variant", help="Workload variant (kernels/README.md): k3-decode: "
                                "baseline or flags joined with +, delay:<kernel>:<ns>; small: nofork, delay:..."),
    layers: int = typer.Option(0, "--layers", min=0, help="Model depth (0: all 93 K3 layers)."),
    capture: Capture = typer.Option(Capture.inside, "--capture", help="Graph capture inside or before the window."),
    output: Path = typer.Option(Path("k3trace-record"), "-o", "--output", help="Report path (no suffix)."),
    capture_range_end: str = typer.Option("stop", "--capture-range-end",
                                          help="stop, or repeat[:N] for engines (nsys profile's values)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command line and exit."),
    profiler: Profiler = typer.Option(Profiler.nsys, "--profiler", help="nsys, or torch: torch.profiler (Kineto "
                                      "trace), for the built-in workload on machines without nsys."),
    gpu_metrics: bool = typer.Option(False, "--gpu-metrics", help="Also sample GPU 0's metrics every 5 us (nsys "
                                     "--gpu-metrics-device=0 --gpu-metrics-frequency=200000): DRAM throughput."),
    config: Optional[Path] = ConfigOpt,
    cache_dir: Optional[Path] = CacheDir,
    width: Optional[int] = Width,
) -> None:
    """Record a decode loop under Nsight Systems (`-- CMD ...` profiles a serving engine)."""
    from k3trace import record

    with one_line_errors():
        external = tuple(ctx.args)
        if not external:
            check_variant(workload.value, variant)
        check_range_end(capture_range_end)
        cfg = load_config(config)  # a bad config fails before the recording, not after it
        env = Environment.resolve(cache_dir, False)
        command = external or record.workload_command(workload.value, batch, steps, variant, layers, capture.value)
        if profiler == Profiler.torch:
            if gpu_metrics:
                raise ReportError("--gpu-metrics needs nsys (torch.profiler samples no GPU metrics)",
                                  "record with --profiler nsys, or leave out --gpu-metrics")
            if external:
                raise ReportError("--profiler torch records the built-in workload only",
                                  "start a serving engine's own torch.profiler (docs/recording.md, "
                                  "\"torch.profiler\") and pass its trace to `k3trace analyze`")
            torch_plan = record.TorchRecordPlan(output=output, command=command)
            if dry_run:
                typer.echo(torch_plan.shell())
                return
            trace = record.run_torch(torch_plan)
            wrote(trace, "torch.profiler trace")
            run_analyze(AnalyzeOptions(trace, False, cfg, env, width=width))
            return
        plan = record.RecordPlan(
            nsys=env.tools.nsys or "nsys", output=output, command=command, capture_range_end=capture_range_end,
            extra_flags=(record.ENGINE_FLAGS if external else ()) + (record.GPU_METRICS_FLAGS if gpu_metrics else ()),
        )
        if dry_run:
            typer.echo(plan.shell())
            return
        if env.tools.nsys is None:
            raise ReportError("nsys was not found", "put Nsight Systems' nsys on PATH or set K3TRACE_NSYS")
        report = record.run(plan)
        wrote(report, "Nsight Systems report")
        run_analyze(AnalyzeOptions(report, False, cfg, env, width=width))


@app.command("whatif")
def whatif_cmd(
    report: Path = typer.Argument(..., help="The build to predict from."),
    scale: list[str] = typer.Option(None, "--scale", help="PATTERN=FACTOR: durations x factor (0.7: 30% faster)."),
    delta: list[str] = typer.Option(None, "--delta", help="PATTERN=TIME: durations + time, e.g. '+1.2us'."),
    fuse: list[str] = typer.Option(None, "--fuse", help="A,B,...=TIME: consecutive kernels become one of TIME."),
    remove: list[str] = typer.Option(None, "--remove", help="PATTERN: the kernels take no time."),
    no_pdl: bool = typer.Option(False, "--no-pdl", help="PDL edges become plain launch gaps."),
    pdl: list[str] = typer.Option(None, "--pdl", help="PATTERN: the kernels' same-stream edges become PDL."),
    family: Optional[str] = typer.Option(None, "--family", help="Only kernels of this family."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Only these layers: 4, 4,8 or 1..7."),
    stream: Optional[StreamRole] = typer.Option(None, "--stream", help="Only kernels on the main or a side stream."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    config: Optional[Path] = ConfigOpt,
    warmup: Optional[int] = Warmup,
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
    width: Optional[int] = Width,
) -> None:
    """The step time a kernel change would buy, predicted on this build's step graph."""
    from k3trace.analyses import whatif
    from k3trace.render.terminal import render_ranking, render_whatif

    with one_line_errors():
        stream = stream.value if stream is not None else None
        scope = {"family": family, "layers": whatif.parse_layers(layers), "stream": stream}
        changes = [whatif.parse_change(kind, spec, **scope) for kind, specs in (
            (whatif.SCALE, scale), (whatif.DELTA, delta), (whatif.FUSE, fuse), (whatif.REMOVE, remove),
            (whatif.PDL, pdl)) for spec in specs or ()]
        if no_pdl:
            changes.append(whatif.Change(whatif.NO_PDL, (), 0.0, family, scope["layers"], stream))
        if not changes and (layers is not None or stream is not None):
            raise ReportError("--layers and --stream restrict a change, and none was given",
                              "add --scale, --delta, --fuse, --remove, --no-pdl or --pdl, or leave them out for "
                              "the ranking of what to change first")
        analysis = analysis_of(report, load_config(config, warmup), Environment.resolve(cache_dir, no_cache))
        # No change named: the ranking of what to change first, which every prediction ends with.
        result = whatif.what_if(analysis, changes) if changes else whatif.ranking(analysis, family)
        if json_out:
            sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        else:
            _stdout(width).print(render_whatif(result) if changes else render_ranking(result))


def demo_pages(folder: Path) -> dict[str, tuple[Path, str]]:
    """The demo's HTML pages in `folder` (checked before any work), each with its index line."""
    from k3trace.demo import DEMO_PAIR, DRAM_TRACE, PDL_PAIR, THIRD_PARTY_PAIR

    if folder.exists() and not folder.is_dir():
        raise ReportError(f"--html {folder.name} is a file", "pass a folder for the demo's HTML pages")
    if not folder.is_dir() and not folder.parent.is_dir():
        raise ReportError(f"the folder {folder.parent.name or folder.parent} for --html {folder.name} does not exist",
                          "create it first, or pass a folder inside an existing one")
    output_file(folder / "index.html" if folder.is_dir() else folder, "HTML folder")
    (k_old, k_new), (h_old, h_new), (p_old, p_new) = DEMO_PAIR, THIRD_PARTY_PAIR, PDL_PAIR
    return {
        "diff": (folder / f"diff-{k_old}-{k_new}.html",
                 f"diff {k_old} -> {k_new}: the K3 attention forks onto the aux stream (seed 001)"),
        "third_party": (folder / f"diff-{h_old}-{h_new}.html",
                        f"diff {h_old} -> {h_new}: transformers Llama, RMSNorm's 8 kernels fused into one"),
        "pdl": (folder / f"diff-{p_old}-{p_new}.html",
                f"diff {p_old} -> {p_new}: the K3 path's PDL triggers moved early (rows read together)"),
        "analyze_old": (folder / f"analyze-{k_old}.html", f"analyze {k_old}: the K3 decode step, attention "
                                                          "single-stream"),
        "analyze_new": (folder / f"analyze-{k_new}.html", f"analyze {k_new}: the K3 decode step with the "
                                                          "aux-stream forks"),
        "dram": (folder / f"analyze-{DRAM_TRACE}.html", f"analyze {DRAM_TRACE}: the campaign build c72 with nsys's "
                                                        "DRAM metrics (where HBM idles)"),
    }


@app.command("demo")
def demo_cmd(
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the HTML reports into this folder "
                                        "(created if missing): the K3 traces analysed, the three diffs, an index."),
    cache_dir: Optional[Path] = CacheDir,
    no_cache: bool = NoCache,
    width: Optional[int] = Width,
) -> None:
    """Analyze and diff the real H200 traces bundled with k3trace."""
    from k3trace.demo import DEMO_PAIR, DRAM_TRACE, PDL_PAIR, THIRD_PARTY_PAIR, bundled_trace

    with one_line_errors():
        pages = demo_pages(html) if html is not None else {}
        page = {key: path for key, (path, _) in pages.items()}
        env = Environment.resolve(cache_dir, no_cache)
        cfg = load_config(None)
        out = _stdout(width)
        if html is not None:
            html.mkdir(exist_ok=True)
        old, new = (bundled_trace(name) for name in DEMO_PAIR)
        out.rule(f"k3trace analyze {old.name}")
        run_analyze(AnalyzeOptions(old, False, cfg, env, page.get("analyze_old"), width))
        out.rule(f"k3trace diff {old.name} {new.name}")
        run_diff(DiffOptions((old,), (new,), "terminal", page.get("diff"), None, cfg, env, width))
        third_old, third_new = (bundled_trace(name) for name in THIRD_PARTY_PAIR)
        out.rule(f"k3trace diff {third_old.name} {third_new.name} (transformers Llama: RMSNorm fused)")
        run_diff(DiffOptions((third_old,), (third_new,), "terminal", page.get("third_party"), None, cfg, env, width))
        pdl_old, pdl_new = (bundled_trace(name) for name in PDL_PAIR)
        out.rule(f"k3trace diff {pdl_old.name} {pdl_new.name} (K3: PDL triggers right after each wait)")
        run_diff(DiffOptions((pdl_old,), (pdl_new,), "terminal", page.get("pdl"), None, cfg, env, width))
        dram = bundled_trace(DRAM_TRACE)
        out.rule(f"k3trace analyze {dram.name} (K3 c72 with nsys's DRAM metrics: where HBM idles)")
        run_analyze(AnalyzeOptions(dram, False, cfg, env, page.get("dram"), width))
        if html is not None:
            from k3trace.render.html import write_analysis_page, write_index_page

            write_analysis_page(analysis_of(new, cfg, env), page["analyze_new"])
            wrote(page["analyze_new"], "HTML report")
            write_index_page(html / "index.html", [(path.name, line) for path, line in pages.values()])
            wrote(html / "index.html", "HTML index")


@app.command("scrub")
def scrub_cmd(
    report: Path = typer.Argument(..., help="Report to scrub: .nsys-rep, .qdstrm or SQLite export (never modified)."),
    output: Path = typer.Option(..., "-o", "--output", help="Scrubbed SQLite file to write (.xz/.gz: compressed)."),
    window: Optional[str] = typer.Option(None, "--window", help="GPU-metrics samples kept (only the DRAM metrics' "
                                         "ever are): `kernels` (within 50 us of GPU work) or START_MS:END_MS."),
) -> None:
    """Remove the environment and host data a report carries, before sharing it."""
    from k3trace.scrub import parse_window, scrub

    with one_line_errors():
        kept = parse_window(window)
        output_file(output, "scrubbed output")
        summary = scrub(report, output, Environment.resolve(None, True).tools, window=kept)
    wrote(output, "scrubbed report", ", ".join(f"{k} {v}" for k, v in summary.items()))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
