"""analyze(): one report's decode-step anatomy, every number as METRICS.md defines it;
analyze_report(): the same from a path, with the result cached beside the trace cache."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import functools
import hashlib
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import polars as pl

import k3trace
from k3trace import cores, heap
from k3trace.analyses import anatomy, completeness, critical_path, dram, families, kernels, layers, pdl, pre_attention
from k3trace.analyses import stepgraph, steptimes, streams
from k3trace.analyses import store
from k3trace.analyses.overlap import step_overlap
from k3trace.analyses.result import DIFF_OMITS, KERNEL_COLUMNS, PATH_COLUMNS, Analysis
from k3trace.config import Config
from k3trace.errors import ReportError
from k3trace.ingest import Limits, Progress, Tools, Trace, detached, load_report, report_key
from k3trace.ingest.kineto import ROCM
from k3trace.model.labels import LabelDonor, label
from k3trace.model.stable import classify_steps
from k3trace.model.steps import assign_steps


T = TypeVar("T")


@functools.cache
def _code_version() -> str:
    """k3trace's version and a digest of its sources: any change to the analysis code
    invalidates cached results (a development checkout changes without a version bump)."""
    root = Path(k3trace.__file__).parent
    digest = hashlib.sha256(k3trace.__version__.encode())
    for source in sorted(root.rglob("*.py")) + [root / "defaults.toml"]:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def analyze_report(path: Path, cfg: Config, *, cache_dir: Path | None = None, tools: Tools = Tools(),
                   progress: Progress = lambda _: None, donor: LabelDonor | None = None,
                   for_diff: bool = False) -> Analysis:
    """`analyze(load_report(path))`, reusing a cached result for the same report, config,
    label donor and k3trace version. `for_diff`: as `analyze(..., for_diff=True)`; a cached
    whole analysis serves too."""
    with cores.analysing():
        return _analyze_report(path, cfg, cache_dir=cache_dir, tools=tools, progress=progress, donor=donor,
                               for_diff=for_diff)


def _analyze_report(path: Path, cfg: Config, *, cache_dir: Path | None, tools: Tools, progress: Progress,
                    donor: LabelDonor | None, for_diff: bool) -> Analysis:
    path = Path(path)
    limits = Limits(max_decompressed_bytes=cfg.max_decompressed_bytes, max_ratio=cfg.max_compression_ratio)
    if cache_dir is None or not path.exists():
        return analyze(load_report(path, cache_dir=cache_dir, tools=tools, progress=progress, limits=limits), cfg,
                       donor=donor, for_diff=for_diff)
    lent = donor.digest() if donor is not None else "-"
    ident = f"{report_key(path)}|{cfg!r}|{lent}|{_code_version()}|{store.FORMAT}"
    whole_entry = _entry_folder(cache_dir, ident)
    # A diff's analysis has an entry of its own: an `analyze` of the same report never
    # finds it, and computes (and caches) the whole analysis; a diff takes either.
    folder = _entry_folder(cache_dir, f"{ident}|for_diff") if for_diff else whole_entry
    for entry in dict.fromkeys((whole_entry, folder)):
        cached = store.load(entry)
        if cached is not None:
            progress("cached analysis")
            return cached
    if detached.active():  # both entries go to the detached writer
        result = analyze(load_report(path, cache_dir=cache_dir, tools=tools, progress=progress, limits=limits), cfg,
                         donor=donor, for_diff=for_diff)
        store.save(result, folder)
        return result
    # The trace's cache entry is written while the analysis runs, on the other core.
    with ThreadPoolExecutor(1) as writer:
        trace = load_report(path, cache_dir=cache_dir, tools=tools, progress=progress, limits=limits, writer=writer)
        result = analyze(trace, cfg, donor=donor, for_diff=for_diff)
    progress("writing cache")
    _saves.save(result, folder)
    return result


def _entry_folder(cache_dir: Path, ident: str) -> Path:
    return cache_dir / "analyses" / hashlib.sha256(ident.encode()).hexdigest()[:24]


class _Saves:
    """Where analyze_report's cache entries are written: before it returns, or within
    `saved_meanwhile` on a writer thread while the caller goes on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def save(self, result: Analysis, folder: Path) -> None:
        with self._lock:
            if self._writer is not None:
                self._pending.append(self._writer.submit(store.save, result, folder))
                return
        store.save(result, folder)

    @contextlib.contextmanager
    def meanwhile(self) -> Iterator[None]:
        with self._lock:
            outermost = self._writer is None
            if outermost:
                self._writer = ThreadPoolExecutor(1)
        if not outermost:  # inside another one: its exit waits
            yield
            return
        try:
            yield
        finally:
            with self._lock:
                writer, pending, self._writer, self._pending = self._writer, self._pending, None, []
            writer.shutdown(wait=True)
        for done in pending:
            done.result()  # a write's error surfaces here, as it would have inline


_saves = _Saves()


def saved_meanwhile() -> contextlib.AbstractContextManager[None]:
    """Within the block, analyze_report hands its analysis cache entry to a writer thread and
    returns at once; leaving the block waits for the entries. For callers with work of their
    own to do next: the diff where no detached writer can be started (`saved_detached`),
    whose replays run mostly on one core in Python, while the writes (compression and
    digests, outside the GIL) take the other (at two full-depth exports the two entries
    take about 0.3 s, the diff's own work about as long)."""
    return _saves.meanwhile()


def saved_detached() -> contextlib.AbstractContextManager[None]:
    """Within the block, analyze_report queues its cache entries (the trace's and the
    analysis'); leaving the block forks one writer that finishes them while the caller goes
    on, and returns at once (k3trace/ingest/detached.py: how, and where it falls back to
    writing them here). For commands whose answer is ready when the block is left:
    `k3trace analyze` and `diff` return without waiting for their cache writes. The entries
    appear once written, atomically; `wait_detached()` waits for them. Where no detached
    writer can be started, as `saved_meanwhile`."""
    return detached.writes_detached() if detached.can_fork() else saved_meanwhile()


def wait_detached() -> None:
    """Wait for the cache writers that `saved_detached` blocks of this process started."""
    detached.wait()


def label_donor(analysis: Analysis) -> LabelDonor:
    """`analysis` as a label donor (`--labels-from`): its representative stable step."""
    step = analysis.representative_step()
    return LabelDonor.from_step(analysis.report, analysis.kernels.filter(pl.col("step") == step))


#: The labelled kernels' columns that the metrics of the stable steps read.
STABLE_COLUMNS = ("kernel_id", "step", "stream_id", "start", "end", "launch_start", "name", "signature", "family",
                  "layer", "launch_rank", "segment")


def analyze(trace: Trace, cfg: Config, *, donor: LabelDonor | None = None, for_diff: bool = False) -> Analysis:
    """The report's analysis. `for_diff`: without the parts a diff never reads (DIFF_OMITS:
    None, named in `omitted`); every other field is the same."""
    if trace.kernels.is_empty():
        raise ReportError(f"{trace.source}: the report holds no kernel records",
                          "record GPU work with `nsys profile -t cuda,nvtx --cuda-graph-trace=node`")
    if completeness.graph_level_tracing(trace):
        raise ReportError(
            f"{trace.source}: CUDA graphs were traced at graph level (no per-kernel records of the replays)",
            "record again with `nsys profile --cuda-graph-trace=node`",
        )
    if trace.platform == ROCM:
        cfg = cfg.without_pdl()
    assignment = assign_steps(trace, cfg)
    steps = classify_steps(assignment.steps, cfg)
    labelling = label(trace, assignment, cfg, donor)
    summary = labelling.summary
    # From here on only these columns of the kernels are read: the launch and capture
    # columns, and the assignment's unlabelled frame, are let go (peak memory).
    labelled = labelling.kernels.select(*KERNEL_COLUMNS, "launch_start", "signature")
    assignment = replace(assignment, kernels=labelled)
    del labelling
    stable_ids = steps.filter(pl.col("stable")).select("step")
    if stable_ids.is_empty():
        complete = steps.filter(pl.col("drop_reason").is_null() | pl.col("drop_reason").is_in(["warm-up", "outlier"]))
        raise ReportError(
            f"{trace.source}: none of the {steps.height} decode steps is stable "
            f"({', '.join(f'{r}: {n}' for r, n in steps.group_by('drop_reason').len().iter_rows())})",
            # A torch.profiler trace often holds one or two steps, past warm-up already
            # (the profiler's schedule discards its own warm-up steps).
            f"record more steps (the first {cfg.warmup_steps} complete ones are dropped as warm-up), or pass "
            + (f"--warmup 0 to analyse {'it' if complete.height == 1 else 'them'}, warm-up included"
               if complete.height <= 1 or cfg.warmup_steps == 0 else
               f"--warmup N (0 to {complete.height - 1}) to analyse the {complete.height} complete ones from step "
               "N + 1, warm-up included"),
        )
    # Only the columns the metrics read: every sort, join and filter below gathers each
    # column it carries, and the labelled frame holds twice as many.
    # (A membership filter, not a semi join: the same rows in the same order, for 3 ms less.)
    stable_kernels = labelled.select(STABLE_COLUMNS).filter(pl.col("step").is_in(stable_ids["step"].implode()))
    n = stable_ids.height
    # Side by side: their numpy scans and sorts leave the other core idle (cold analyze at
    # 373k kernels 1.38 -> 1.28 s, at 2.2M 8.7 -> 7.1 s, measured beside an early cache
    # write since reverted), for 240 MB more peak memory at 2.2M (both working sets alive
    # at once). They share only read-only frames. Not while another analysis runs (the
    # diff's two sides fill the cores already). The smaller pieces, which need neither
    # side's results, go to whichever side is free first (which one that is depends on the
    # trace and on the machine's load).
    whole = not for_diff
    extras = _Tasks({
        "checked": lambda: completeness.check(trace, steps, labelled, cfg, assignment.lane[0], assignment.source),
        "windows": lambda: pre_attention.windows(stable_kernels, cfg),
        # A diff's sides too (the diff reads none of it): None, and no cost, without metrics;
        # tens of ms at full depth with them.
        "dram": lambda: dram.read_dram(trace.gpu_metrics, trace.gpus, steps, stable_kernels, assignment.lane[1]),
    })
    with ThreadPoolExecutor(1) as side:
        spreading = (side.submit(extras.after, overlap_metrics, stable_kernels, steps, n, whole)
                     if cores.alone() and cores.available() > 1 else None)
        on_path = extras.after(path_metrics, stable_kernels, labelled, steps, cfg, whole)
        spread = (extras.after(overlap_metrics, stable_kernels, steps, n, whole) if spreading is None
                  else spreading.result())
    checked, windows = extras.result("checked"), extras.result("windows")
    dram_reading, dram_notes = extras.result("dram")
    pdl_steps = on_path.pdl_steps
    notes = []
    if assignment.other_lanes:
        notes.append(f"analysed process {assignment.lane[0]} on device {assignment.lane[1]}; "
                     f"{assignment.other_lanes} other process/device lanes with GPU work were left out")
    for r in trace.findings.filter(~pl.col("excluded")).iter_rows(named=True):
        notes.append(f"{r['rows']} of {r['total']} {r['table']} rows had {r['issue']} "
                     "(names that differ only past the cut read as one)")
    notes.extend(label_notes(summary))
    if assignment.loose_attention * 2 >= steps.height:   # one a piece, but for the last piece of a step
        notes.append(f"{assignment.loose_attention} attention kernels were launched eagerly between the graph "
                     "replays: if these are piecewise CUDA graphs, each replay taken as a step is a piece of one; "
                     "record with the engine's step ranges (docs/recording.md), and the range is the step")
    notes.extend(dram_notes)
    if not cfg.infers_pdl:
        notes.append(f"a {trace.platform} trace: no PDL edges are inferred (HIP has no programmatic dependent "
                     "launch); kernels reported back to back count as same-stream gaps")
    path, graph, step_times = on_path.path, on_path.graph, spread.step_times
    family_rows = spread.families.join(on_path.by_family, on="family", how="left")
    layer_rows = layers.layer_table(spread.layers, on_path.layer_critical) if whole else None
    kernel_rows = (
        spread.kernels
        .join(on_path.by_kernel, on=["name", "family"], how="left")
        .join(on_path.slack, on=["name", "family"], how="left")
    ) if whole else None
    # Sorted: a grouping's order varies from run to run, and with it the JSON's key order.
    dropped = steps.filter(~pl.col("stable")).group_by("drop_reason").len().sort("drop_reason")
    return Analysis(
        report=trace.source,
        nsys_version=trace.nsys_version,
        step_source=assignment.source,
        config=cfg,
        steps=steps,
        kernels=labelled.select(KERNEL_COLUMNS),
        step_times=step_times,
        families=family_rows,
        kernel_table=kernel_rows,
        path=path,
        path_steps=on_path.path_steps,
        graph=graph,
        pre_attention=windows,
        pdl_steps=pdl_steps,
        label_sources=summary.sources,
        label_summary=summary,
        layers=layer_rows,
        step_range={"form": assignment.range_form, "forms": dict(assignment.range_forms),
                    "ranges": assignment.range_count,
                    **({"graph_replays_per_step": assignment.pieces} if assignment.pieces else {})},
        completeness=checked,
        step_stats={col: steptimes.quantiles_us(step_times[col])
                    for col in ("period", "span", "host", "busy", "residency")},
        pre_attention_summary=pre_attention.summary(windows),
        pdl_summary=pdl.summary(pdl_steps) if whole else None,
        dropped={str(r): int(c) for r, c in dropped.iter_rows()},
        notes=tuple(notes),
        omitted=() if whole else DIFF_OMITS,
        dram=dram_reading,
        anatomy=anatomy.segment_anatomy(path, graph.nodes) if whole else None,
    )


@dataclass(frozen=True)
class PathMetrics:
    path: pl.DataFrame          # stable-step kernels with their edges, on_path, critical/bubble time
    graph: stepgraph.StepGraph
    by_family: pl.DataFrame     # family, critical_us
    # Those below are None for a diff (the parts of DIFF_OMITS they go into).
    slack: pl.DataFrame | None        # name, family, slack_us
    by_kernel: pl.DataFrame | None    # name, family, critical_us
    path_steps: pl.DataFrame | None
    layer_critical: pl.DataFrame | None  # step, layer, critical_ns
    pdl_steps: pl.DataFrame | None       # step, pdl_edges, gaps, gap_ns (pdl.per_step)


def path_metrics(stable_kernels: pl.DataFrame, labelled: pl.DataFrame, steps: pl.DataFrame,
                 cfg: Config, whole: bool = True) -> PathMetrics:
    """The critical path of every stable step and the representative step's graph
    (`whole=False`: without what only the kernel, layer and path-step tables read)."""
    edges = critical_path.dependency_edges(stable_kernels, cfg)
    # The per-step PDL counts come off the edges' same-stream pairs (the sort is theirs).
    pdl_steps = pdl.per_step(pdl.pairs_from_edges(edges, cfg)) if whole else None
    # Its numpy scans leave their freed arrays resident in malloc's heap (at 2.2M kernels
    # 300 MB more at the peak, which comes while the other side still runs).
    heap.trim()
    path = critical_path.walk(edges, steps)
    del edges
    graph = stepgraph.build(path)
    # Which capture stream each node ran on (graph replays run on internal streams of their
    # own): what the diff's "moved to a side stream" and whatif's --stream go by.
    rep_step = int(path.filter(pl.col("kernel_id") == graph.nodes["kernel_id"][0])["step"][0])
    # Only recorded or eager-aligned roles: inferred rows (packed by time) would call a chain
    # that changed internal stream after a join "moved"; edits.py then falls back to the
    # internal stream most kernels use, which is right for one-capture-stream graphs.
    roles = streams.stream_roles(labelled, path, rep_step)
    if roles.source != streams.INFERRED:
        graph = replace(graph, nodes=graph.nodes.join(roles.rows.select("kernel_id", "role"), on="kernel_id",
                                                      how="left"))
    slack = graph.nodes.with_columns(pl.Series("slack_ns", stepgraph.slack(graph))).group_by("name", "family").agg(
        (pl.col("slack_ns").min() / 1e3).alias("slack_us")) if whole else None
    # The edge columns the graph was built from are not kept (peak memory).
    path = path.select(PATH_COLUMNS)
    # The path's rows are grouped once: the family and kernel medians start from the same
    # per-step sums (the second grouping and the uniques run over thousands of rows, not 373k).
    per = critical_path.per_step_kernel(path)
    metrics = PathMetrics(path=path, graph=graph, by_family=critical_path.by_family(per), slack=slack,
                          by_kernel=critical_path.by_kernel(per) if whole else None,
                          path_steps=critical_path.per_step(path) if whole else None,
                          layer_critical=layers.critical_per_step(path) if whole else None,
                          pdl_steps=pdl_steps)
    heap.trim()
    return metrics


class _Tasks:
    """Named calls that two threads share: each thread, done with its own work, runs those
    no thread has taken yet (in the order given), so neither waits idle for the other while
    some are left. A call's error is raised where its result is asked for."""

    def __init__(self, calls: dict[str, Callable[[], object]]) -> None:
        self._lock = threading.Lock()
        self._left = list(calls.items())
        self._done: dict[str, Future] = {name: Future() for name in calls}

    def after(self, work: Callable[..., T], *args) -> T:
        """`work(*args)`, then the calls left."""
        try:
            return work(*args)
        finally:
            self.drain()

    def drain(self) -> None:
        while True:
            with self._lock:
                if not self._left:
                    return
                name, call = self._left.pop(0)
            try:
                self._done[name].set_result(call())
            except BaseException as exc:
                self._done[name].set_exception(exc)

    def result(self, name: str):
        self.drain()
        return self._done[name].result()


@dataclass(frozen=True)
class OverlapMetrics:
    families: pl.DataFrame      # the family table, before its critical-path column
    step_times: pl.DataFrame
    # None for a diff (DIFF_OMITS):
    layers: layers.LayerSteps | None  # the layer table's per-step busy time and counts
    kernels: pl.DataFrame | None      # the kernel table, before its critical-path and slack columns


def overlap_metrics(stable_kernels: pl.DataFrame, steps: pl.DataFrame, n: int,
                    whole: bool = True) -> OverlapMetrics:
    """What the stable steps' kernels and their overlap across streams give, path aside
    (the layer table's part too: done here, it runs beside the path's work, not after;
    `whole=False`: without the layer and kernel tables' parts)."""
    overlap = step_overlap(stable_kernels)
    heap.trim()  # as after the path's scans: the coverage's arrays
    return OverlapMetrics(
        families=families.family_table(overlap, n), step_times=steptimes.per_step(steps, overlap),
        layers=layers.layer_steps(overlap) if whole else None,
        kernels=kernels.kernel_table(overlap, n) if whole else None)


def label_notes(summary) -> list[str]:
    """What the report says about where its labels came from, when it is not NVTX."""
    src = summary.sources
    notes = []
    for unit in summary.inferred:
        if unit["layers"]:
            notes.append(
                f"layers inferred from the repeating kernel sequence: {unit['layers']} layers of {unit['kinds']} "
                f"kinds, {unit['confidence']:.0%} of the step's kernel time in layers another layer repeats "
                f"({unit['prologue_kernels']} kernels before the first, {unit['epilogue_kernels']} after the last); "
                "check them against a labelled recording (--labels-from)")
        else:
            notes.append(f"no layer structure found in a replay of {unit['kernels']} kernels: its layers are unknown")
    if summary.donor is not None:
        notes.append(f"labels lent by {summary.donor} for {src['donor']} kernels"
                     + (f" ({summary.donor_coverage:.0%} of a step's kernels matched)"
                        if summary.donor_coverage is not None else ""))
    layered = sum(n for s, n in src.items() if s not in ("name_rule", "unlabelled"))
    if layered == 0:
        notes.append("no layer labels: families come from kernel-name rules only, layers are unknown")
    return notes
