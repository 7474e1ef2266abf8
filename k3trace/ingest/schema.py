"""The normalised tables every report becomes, whatever nsys version exported it.

Times are GPU/CPU timestamps in nanoseconds as nsys recorded them (one clock per report).
Strings are resolved (`StringIds` joins done) and valid UTF-8 (invalid bytes replaced).
Bump `SCHEMA_VERSION` when a table changes: it is part of the cache key.
"""

from __future__ import annotations

import hashlib

import polars as pl

from k3trace.ingest.spelling import canonical

SCHEMA_VERSION = 5

#: One row per kernel execution (CUPTI_ACTIVITY_KIND_KERNEL).
KERNELS = pl.Schema(
    {
        "start": pl.Int64,
        "end": pl.Int64,
        "device_id": pl.Int32,
        "stream_id": pl.Int64,
        "global_pid": pl.Int64,
        "correlation_id": pl.Int64,
        "name": pl.String,           # shortName, e.g. `kda_step_kernel`
        "graph_node_id": pl.Int64,   # exec-graph node for graph replays; null when eager
        "graph_id": pl.Int64,        # nsys 2026+ only; null before
        "signature": pl.Int64,       # kernel_signature(): demangled name + grid + block
    }
)

#: One row per CUDA runtime/driver API call (CUPTI_ACTIVITY_KIND_RUNTIME).
RUNTIME = pl.Schema(
    {
        "start": pl.Int64,
        "end": pl.Int64,
        "global_tid": pl.Int64,
        "global_pid": pl.Int64,
        "correlation_id": pl.Int64,
        "name": pl.String,           # e.g. `cudaGraphLaunch_v10000`, `cuLaunchKernelEx`
        "return_value": pl.Int64,
    }
)

#: NVTX ranges and marks (NVTX_EVENTS); `end` is null for marks.
NVTX = pl.Schema(
    {
        "start": pl.Int64,
        "end": pl.Int64,
        "event_type": pl.Int32,      # 59 push/pop range, 60 start/end range, 34 mark
        "text": pl.String,           # from `text` or resolved from `textId`
        "domain": pl.String,         # domain name; "" for the default domain
        "global_tid": pl.Int64,
        "global_pid": pl.Int64,
    }
)

#: CUDA-graph node events (CUDA_GRAPH_EVENTS / CUDA_GRAPH_NODE_EVENTS): node creation
#: during capture (no original) and instantiation clones (original = the captured node).
GRAPH_NODES = pl.Schema(
    {
        "start": pl.Int64,
        "global_tid": pl.Int64,
        "graph_node_id": pl.Int64,
        "original_graph_node_id": pl.Int64,
        "event": pl.String,          # e.g. `Graph Node Creation`
        "kernel": pl.String,         # the kernel a capture's launch created the node for, where the
                                     # trace names it (Kineto of HIP); null in nsys exports
    }
)

#: Synchronisation records (CUPTI_ACTIVITY_KIND_SYNCHRONIZATION).
SYNC = pl.Schema(
    {
        "start": pl.Int64,
        "end": pl.Int64,
        "global_pid": pl.Int64,
        "stream_id": pl.Int64,
        "correlation_id": pl.Int64,
        "sync_type": pl.Int32,
    }
)

#: GPUs (TARGET_INFO_GPU; absent from some 2026 exports). `memory_bandwidth`: the DRAM peak
#: nsys records for the GPU, bytes/s (the reference of the DRAM metrics' percentages; null
#: where unknown, as in torch.profiler traces).
GPUS = pl.Schema({"device_id": pl.Int32, "name": pl.String, "sm_count": pl.Int32, "memory_bandwidth": pl.Int64})

#: nsys's GPU-metrics samples (GPU_METRICS, `--gpu-metrics-device`), of the DRAM metrics
#: only (the other metrics' rows are never read): one row per metric per sample. `value` is
#: the percent of the DRAM peak over the interval that starts at `timestamp` and runs to the
#: metric's next sample (docs/metrics.md, "DRAM"). `type_id` names the sampled GPU in the
#: export; `device_id` is the CUDA device it is (the type id's low byte).
GPU_METRICS = pl.Schema({"timestamp": pl.Int64, "type_id": pl.Int64, "device_id": pl.Int32,
                         "metric": pl.String,   # `dram_read` or `dram_write`
                         "value": pl.Int64})

#: Streams (TARGET_INFO_CUDA_STREAM).
STREAMS = pl.Schema({"stream_id": pl.Int64, "pid": pl.Int64, "priority": pl.Int64})

#: What ingest found wrong with the rows of a report (validate.py): rows excluded from the
#: tables above, or values cut (`excluded` false), with the table's row count.
FINDINGS = pl.Schema({"table": pl.String, "issue": pl.String, "rows": pl.Int64, "total": pl.Int64,
                      "excluded": pl.Boolean})

#: Kernel rows excluded at ingest, with what is left of their identity (any column may be
#: null): where the analysis looks up which steps lost them.
REJECTED_KERNELS = pl.Schema({"global_pid": pl.Int64, "correlation_id": pl.Int64, "graph_node_id": pl.Int64,
                              "start": pl.Int64, "issue": pl.String})

TABLES: dict[str, pl.Schema] = {
    "kernels": KERNELS,
    "runtime": RUNTIME,
    "nvtx": NVTX,
    "graph_nodes": GRAPH_NODES,
    "sync": SYNC,
    "gpus": GPUS,
    "streams": STREAMS,
    "gpu_metrics": GPU_METRICS,
}

# nsys packs the process id into the upper bits of a global thread id: pid << 24 | tid.
_PID_MASK = ~((1 << 24) - 1)


def global_pid(global_tid: pl.Expr) -> pl.Expr:
    """The globalPid of a globalTid (same encoding the kernel table's globalPid uses)."""
    return (global_tid & _PID_MASK).cast(pl.Int64)


def with_kernel_signature(distinct: pl.DataFrame) -> pl.DataFrame:
    """`distinct` (one row per distinct launch: full kernel name first, then grid and block
    dimensions) plus `signature`, a stable 63-bit id of what was launched.

    Short names repeat across unrelated kernels (PyTorch's elementwise kernels are all
    `vectorized_elementwise_kernel`; GEMMs of every shape share one `nvjet_*` name), so the
    diff aligns builds on this instead. The name is hashed in the spelling both demanglers
    share (spelling.py: nsys and torch.profiler write the same kernel differently).
    blake2b over each row's text: the same id in every process, polars version and report.
    Callers hash distinct rows only (a few hundred per trace) and join the result back.
    """
    name, *launch = distinct.columns
    names = [canonical(n) if n is not None else "" for n in distinct[name].cast(pl.String).to_list()]
    shapes = distinct.select(pl.concat_str([pl.col(c).cast(pl.String).fill_null("") for c in launch],
                                           separator="|")).to_series().to_list()
    texts = [f"{n}|{shape}" for n, shape in zip(names, shapes)]
    digests = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") >> 1 for t in texts]
    return distinct.with_columns(pl.Series("signature", digests, dtype=pl.Int64))


#: Frames a Trace carries besides TABLES (cached with them).
EXTRA: dict[str, pl.Schema] = {"findings": FINDINGS, "rejected_kernels": REJECTED_KERNELS}


def empty(table: str) -> pl.DataFrame:
    return pl.DataFrame(schema={**TABLES, **EXTRA}[table])
