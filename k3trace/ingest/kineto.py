"""torch.profiler (Kineto) Chrome-trace JSON -> the normalised frames of `schema.py`.

What vLLM (`VLLM_TORCH_PROFILER_DIR`, `--profiler-config`), SGLang (`/start_profile`) and
`torch.profiler.profile(...).export_chrome_trace()` write: `.json`, `.json.gz`,
`.pt.trace.json(.gz)`, CUDA or HIP. Recognised by content (a JSON object with a
`traceEvents` array, or a bare event array), whatever the suffix.

How Kineto's events map onto the nsys tables (ENGINES.md, "Kineto facts"):
- `kernel` events: one per kernel execution; `ts`/`dur` are microseconds with three
  decimals, so `round(ts * 1000)` is the exact nanosecond while `ts` < 2**43 us (101 days of
  the trace clock), within 1-2 ns beyond. `pid` is the device, `tid` the stream; the
  process is the one whose runtime call has the kernel's `correlation`.
- `cuda_runtime` / `cuda_driver` events (HIP traces use the same categories with `hip*`
  names): the runtime table. Kineto records no return value: calls are taken as successful.
- `user_annotation` (`record_function` ranges, per CPU thread) play NVTX's role: the nvtx
  table's default domain. `gpu_user_annotation` (their projection onto a GPU stream) goes
  there too, in domain `gpu_user_annotation`, on the device's own pseudo process so that
  nothing keyed on the CPU process mistakes it for a thread range.
- Times count from the earliest kernel, runtime/driver call or annotation in the file (as
  nsys's count from the session start).
- Processes and threads: nsys's global ids, `pid << 24 | tid`.
- Graph replays and the capture's launches: `kineto_graphs`.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO, Callable

import polars as pl

from k3trace.errors import ReportError
from k3trace.ingest import kineto_graphs, kineto_modules, mangled, schema
from k3trace.ingest.chrome_json import JsonError, read_events

#: The event fields read; everything else in an event is skipped while parsing.
EVENT_SCHEMA = pl.Schema(
    {
        "ph": pl.String,
        "cat": pl.String,
        "name": pl.String,
        "pid": pl.String,   # an int, or a label such as "Spans"
        "tid": pl.String,
        "ts": pl.Float64,
        "dur": pl.Float64,
        "args": pl.Struct(
            {
                "correlation": pl.Int64,
                "device": pl.Int64,
                "stream": pl.Int64,
                "grid": pl.List(pl.Int64),
                "block": pl.List(pl.Int64),
                "kernel": pl.String,   # HIP launch calls name the kernel they launch
                "name": pl.String,     # process_name / thread_name metadata
            }
        ),
    }
)

#: The platforms a trace can come from (`Trace.platform`).
CUDA, ROCM = "CUDA", "ROCm"
#: Top-level keys only a trace recorded through roctracer (HIP) carries.
_ROCM_KEYS = ("roctracer_version", "hip_runtime_version", "hip_driver_version")

KERNEL, RUNTIME, DRIVER = "kernel", "cuda_runtime", "cuda_driver"
ANNOTATION, GPU_ANNOTATION, SYNC = "user_annotation", "gpu_user_annotation", "cuda_sync"
#: Python frames (`with_stack`): only modules' forwards are kept (kineto_modules.py).
PYTHON = "python_function"
#: What a Kineto trace's export metadata names as its recorder (EXPORT_PRODUCT_VERSION's start).
KINETO_RECORDER = "torch.profiler/Kineto"
#: Older Kineto spelled some categories differently.
_CATEGORY_ALIASES = {"runtime": RUNTIME, "driver": DRIVER, "hip_runtime": RUNTIME}
_KEPT = (KERNEL, RUNTIME, DRIVER, ANNOTATION, GPU_ANNOTATION, SYNC, PYTHON)

NVTX_PUSH_POP = 59
_OPENERS: dict[bytes, Callable[..., BinaryIO]] = {b"\x1f\x8b": gzip.open, b"\xfd7zXZ": lzma.open, b"BZh": bz2.open}


def _category() -> pl.Expr:
    cat = pl.col("cat").str.to_lowercase()
    return cat.replace(_CATEGORY_ALIASES)


def _keep(frame: pl.DataFrame) -> pl.DataFrame:
    """One parsed chunk -> its complete (`X`) events of the kept categories as flat, compact
    columns: integer ns times, the args fields needed, repeated strings categorical (a
    long decode trace repeats a few hundred kernel names a million times)."""
    args = pl.col("args")
    grid, block = args.struct.field("grid"), args.struct.field("block")
    return frame.with_columns(_category().alias("cat")).filter(
        pl.col("cat").is_in(_KEPT), pl.col("ph") == "X",
        (pl.col("cat") != PYTHON) | pl.col("name").str.starts_with(kineto_modules.MODULE_EVENT),
    ).select(
        pl.col("cat").cast(pl.Categorical),
        pl.col("name").cast(pl.Categorical),
        pl.col("pid").cast(pl.Int64, strict=False),
        pl.col("tid").cast(pl.Int64, strict=False),
        _ns("ts").alias("start"),
        (_ns("ts") + _ns("dur").fill_null(0)).alias("end"),
        args.struct.field("correlation").alias("correlation_id"),
        args.struct.field("device").alias("device"),
        args.struct.field("stream").alias("stream"),
        *(grid.list.get(i, null_on_oob=True).cast(pl.Int32).alias(f"grid{axis}") for i, axis in enumerate("XYZ")),
        *(block.list.get(i, null_on_oob=True).cast(pl.Int32).alias(f"block{axis}") for i, axis in enumerate("XYZ")),
        args.struct.field("kernel").cast(pl.Categorical).alias("launched"),
    )


# -- detection -----------------------------------------------------------------------------

def _open(path: Path) -> tuple[BinaryIO, bool]:
    """The file's bytes, decompressed when it is gzip/xz/bz2 (by magic, not suffix)."""
    with open(path, "rb") as fh:
        magic = fh.read(6)
    for prefix, opener in _OPENERS.items():
        if magic.startswith(prefix):
            return opener(path, "rb"), True
    return open(path, "rb"), False


def looks_like_json(path: Path) -> bool:
    """True when the (decompressed) file starts like a JSON object or array."""
    if not path.is_file():
        return False
    try:
        stream, _ = _open(path)
        with stream:
            head = stream.read(4096)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return False
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text[:1] in (b"{", b"[")


# -- reading ------------------------------------------------------------------------------

def load(path: Path, label: str | None = None) -> tuple[dict[str, pl.DataFrame], dict[str, str], str]:
    """(frames keyed as schema.TABLES, export metadata, form) of a Kineto trace file."""
    label = label or path.name
    stream, compressed = _open(path)
    try:
        with stream:
            events, meta = read_events(stream, label, EVENT_SCHEMA, _keep)
    except JsonError as exc:
        raise ReportError(str(exc), "pass a trace written by torch.profiler (export_chrome_trace, "
                                    "tensorboard_trace_handler, vLLM or SGLang /start_profile), complete") from None
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise ReportError(f"{label}: cannot decompress ({exc})", "the file is truncated; copy it again") from None
    frames = normalise(events, meta, label)
    version = meta.get("schemaVersion", "?")
    export = {"EXPORT_PRODUCT_VERSION": f"{KINETO_RECORDER} (trace schema {version})",
              "PLATFORM": platform(meta)}
    return frames, export, ("compressed kineto" if compressed else "kineto")


def platform(meta: dict) -> str:
    """ROCm when the trace was written through roctracer (its version keys, or an AMD
    device), else CUDA."""
    props = meta.get("deviceProperties")
    names = [str(p.get("name") or "") for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    if any(key in meta for key in _ROCM_KEYS) or any(name.startswith("AMD") for name in names):
        return ROCM
    return CUDA


def _ns(col: str) -> pl.Expr:
    return (pl.col(col) * 1000.0).round(0).cast(pl.Int64)


def _ids(events: pl.DataFrame) -> pl.DataFrame:
    return events.with_columns(
        (pl.col("pid") * (1 << 24)).alias("global_pid"),
        (pl.col("pid") * (1 << 24) + (pl.col("tid") % (1 << 24))).alias("global_tid"),
    )


def normalise(events: pl.DataFrame, meta: dict, label: str) -> dict[str, pl.DataFrame]:
    events = _ids(events)
    # Kineto's clock is absolute (microseconds since boot); nsys reports count from the
    # session start. Rebase on the earliest event read, in integer ns (exact); Python frames
    # (which may open before any GPU work) do not move it.
    origin = events.filter(pl.col("cat") != PYTHON)["start"].min()
    if origin is not None:
        events = events.with_columns(pl.col("start") - origin, pl.col("end") - origin)
    kernels = events.filter(pl.col("cat") == KERNEL)
    if kernels.is_empty():
        raise ReportError(
            f"{label} holds no GPU kernel events (a CPU-only torch.profiler trace)",
            "record with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] around GPU work",
        )
    calls = events.filter(pl.col("cat").is_in((RUNTIME, DRIVER)))
    runtime = calls.select(
        "start", "end", "global_tid", "global_pid", "correlation_id", pl.col("name").cast(pl.String),
        pl.lit(0, dtype=pl.Int64).alias("return_value"),   # Kineto records no return codes
    ).sort("start")
    kernel_frame = _kernels(kernels, runtime)
    launch_names = calls.select("global_tid", "correlation_id", pl.col("launched").cast(pl.String))
    kernel_frame, graph_nodes = kineto_graphs.derive(kernel_frame, runtime, launch_names)
    return {
        "kernels": _cast(kernel_frame.drop("full_name"), "kernels").sort("start", "end"),
        "runtime": _cast(runtime, "runtime"),
        "nvtx": pl.concat([_annotations(events), _modules(events)]).sort("start"),
        "graph_nodes": _cast(graph_nodes.with_columns(short_names(graph_nodes["kernel"]).alias("kernel")),
                             "graph_nodes").sort("start"),
        "sync": _sync(events),
        "gpus": _gpus(meta),
        "streams": _cast(kernel_frame.select("stream_id", (pl.col("global_pid") // (1 << 24)).alias("pid"),
                                             pl.lit(None, dtype=pl.Int64).alias("priority")).unique("stream_id"),
                         "streams").sort("stream_id"),
        "gpu_metrics": schema.empty("gpu_metrics"),
    }


def _cast(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    return frame.select(pl.col(name).cast(dtype) for name, dtype in schema.TABLES[table].items())


def short_name(full: pl.Expr) -> pl.Expr:
    """nsys's `shortName` from a demangled kernel name: the function's own identifier,
    without return type, namespaces, template arguments or parameters
    (`void at::native::(anonymous namespace)::indexSelectSmallIndex<...>(...)` ->
    `indexSelectSmallIndex`); names that are already bare (`nvjet_*`, Triton) stay."""
    bare = full.str.replace_all(r"\(anonymous namespace\)", "anonymous").str.replace(r"^void\s+", "")
    head = bare.str.extract(r"^([^<(]*)", 1).str.split("::").list.last().str.strip_chars()
    return pl.when(head.str.len_chars() > 0).then(head).otherwise(full)


def _kernels(kernels: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    # A kernel's process is its launch call's; Kineto files the kernel under the device.
    cpu_pids = runtime.group_by("global_pid").len().sort("len", descending=True)
    fallback = int(cpu_pids["global_pid"][0]) if cpu_pids.height else 0
    launch_pid = runtime.select("correlation_id", pl.col("global_pid").alias("launch_pid")).unique(
        "correlation_id", keep="first")
    launch = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
    frame = kernels.select(
        "start", "end",
        pl.coalesce("device", "pid").alias("device_id"),
        pl.coalesce("stream", "tid").alias("stream_id"),
        "correlation_id",
        pl.col("name").alias("full_name"),
        *launch,
    ).join(launch_pid, on="correlation_id", how="left").with_columns(
        pl.col("launch_pid").fill_null(fallback).alias("global_pid")
    ).drop("launch_pid")
    # Signatures and short names per distinct launch (a few hundred rows), joined back.
    distinct = frame.select("full_name", *launch).unique(maintain_order=True)
    signed = schema.with_kernel_signature(distinct)
    signed = signed.with_columns(short_names(signed["full_name"].cast(pl.String)).alias("name"))
    return frame.join(signed, on=["full_name", *launch], how="left", nulls_equal=True).drop(launch)


def short_names(full: pl.Series) -> pl.Series:
    """`short_name` of each name, and of a mangled one (HIP module launches arrive mangled)
    the identifier read off its mangled form."""
    unmangled = pl.Series([mangled.short_name(n) if n else None for n in full], dtype=pl.String)
    return pl.select(pl.coalesce(unmangled, short_name(pl.lit(full)))).to_series()


def _annotations(events: pl.DataFrame) -> pl.DataFrame:
    ranges = events.filter(pl.col("cat").is_in((ANNOTATION, GPU_ANNOTATION)))
    on_gpu = pl.col("cat") == GPU_ANNOTATION
    frame = ranges.select(
        "start", "end", pl.lit(NVTX_PUSH_POP, dtype=pl.Int32).alias("event_type"),
        pl.col("name").cast(pl.String).alias("text"),
        pl.when(on_gpu).then(pl.lit(GPU_ANNOTATION)).otherwise(pl.lit("")).alias("domain"),
        "global_tid", "global_pid",
    )
    return _cast(frame, "nvtx").sort("start")


def _modules(events: pl.DataFrame) -> pl.DataFrame:
    ranges = kineto_modules.module_ranges(events.filter(pl.col("cat") == PYTHON))
    return _cast(ranges.with_columns(pl.lit(NVTX_PUSH_POP, dtype=pl.Int32).alias("event_type"),
                                     pl.lit(kineto_modules.DOMAIN).alias("domain")), "nvtx")


def _sync(events: pl.DataFrame) -> pl.DataFrame:
    rows = events.filter(pl.col("cat") == SYNC).select(
        "start", "end", "global_pid", pl.col("stream").alias("stream_id"), "correlation_id",
        pl.lit(None, dtype=pl.Int32).alias("sync_type"),
    )
    return _cast(rows, "sync").sort("start")


def _gpus(meta: dict) -> pl.DataFrame:
    props = meta.get("deviceProperties")
    rows = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    frame = pl.DataFrame(
        {"device_id": [p.get("id") for p in rows], "name": [p.get("name") for p in rows],
         "sm_count": [p.get("numSms") for p in rows], "memory_bandwidth": [None] * len(rows)},
        schema={"device_id": pl.Int32, "name": pl.String, "sm_count": pl.Int32, "memory_bandwidth": pl.Int64},
        strict=False,
    )  # Kineto records no DRAM peak (nor GPU metrics)
    return _cast(frame, "gpus")
