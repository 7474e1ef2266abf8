"""Raw export tables -> the normalised frames of `schema.py`.

Export schemas by nsys version (METRICS.md, "Inputs"): 2022.x writes `EXPORT_META_DATA`,
2023.4+ `META_DATA_EXPORT`; 2026.x adds kernel columns (`graphId`, `qmd*`, clusters);
graph node events live in `CUDA_GRAPH_EVENTS` (2022-2024) or `CUDA_GRAPH_NODE_EVENTS`.
Only the columns below are read, so extra columns of newer versions cost nothing.
"""

from __future__ import annotations

import polars as pl

from k3trace.errors import ReportError
from k3trace.ingest import schema
from k3trace.ingest.tables import TableSource

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
GRAPH_TABLES = ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")

NVTX_DOMAIN_CREATE = 75


def _strings(src: TableSource) -> pl.DataFrame:
    return src.read("StringIds", ["id", "value"], text=["value"]).select(
        pl.col("id").cast(pl.Int64), pl.col("value").alias("string")
    )


def _resolve(frame: pl.DataFrame, strings: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
    lookup = strings.rename({"id": id_col, "string": out})
    return frame.with_columns(pl.col(id_col).cast(pl.Int64)).join(lookup, on=id_col, how="left")


def _cast(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    target = schema.TABLES[table]
    return frame.select(pl.col(name).cast(dtype) for name, dtype in target.items())


def kernels(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    launch = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
    raw = src.read(
        KERNEL_TABLE,
        ["start", "end", "deviceId", "streamId", "globalPid", "correlationId", "shortName", "demangledName",
         "graphNodeId", "graphId", *launch],
    )
    # Signatures per distinct (name id, grid, block), resolved and hashed there, joined back.
    keys = ["_name_id", *launch]
    raw = raw.with_columns(pl.coalesce("demangledName", "shortName").cast(pl.Int64).alias("_name_id"))
    distinct = _resolve(raw.select(keys).unique(), strings, "_name_id", "_full_name")
    signed = schema.with_kernel_signature(distinct.select("_full_name", *launch)).with_columns(
        distinct["_name_id"]).drop("_full_name")
    frame = _resolve(raw, strings, "shortName", "name").join(signed, on=keys, how="left", nulls_equal=True)
    frame = frame.rename(
        {"deviceId": "device_id", "streamId": "stream_id", "globalPid": "global_pid",
         "correlationId": "correlation_id", "graphNodeId": "graph_node_id", "graphId": "graph_id"}
    )
    # Rows are not guaranteed to be in time order (METRICS.md, "Inputs").
    return _cast(frame, "kernels").sort("start", "end")


def runtime(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    if RUNTIME_TABLE not in src.tables():
        return schema.empty("runtime")
    raw = src.read(RUNTIME_TABLE, ["start", "end", "globalTid", "correlationId", "nameId", "returnValue"])
    frame = _resolve(raw, strings, "nameId", "name").rename(
        {"globalTid": "global_tid", "correlationId": "correlation_id", "returnValue": "return_value"}
    )
    frame = frame.with_columns(schema.global_pid(pl.col("global_tid").cast(pl.Int64)).alias("global_pid"))
    return _cast(frame, "runtime").sort("start")


def nvtx(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    if NVTX_TABLE not in src.tables():
        return schema.empty("nvtx")
    raw = src.read(NVTX_TABLE, ["start", "end", "eventType", "text", "textId", "domainId", "globalTid"], text=["text"])
    raw = _resolve(raw, strings, "textId", "registered_text")
    raw = raw.with_columns(
        pl.coalesce("text", "registered_text").alias("text"),
        pl.col("domainId").cast(pl.Int64).fill_null(0),
        pl.col("globalTid").cast(pl.Int64),
    )
    domains = raw.filter(pl.col("eventType") == NVTX_DOMAIN_CREATE).select(
        "domainId", pl.col("text").alias("domain")
    ).unique("domainId", keep="last")
    frame = (
        raw.filter(pl.col("eventType") != NVTX_DOMAIN_CREATE)
        .join(domains, on="domainId", how="left")
        .with_columns(
            pl.col("domain").fill_null(""),
            schema.global_pid(pl.col("globalTid")).alias("global_pid"),
        )
        .rename({"eventType": "event_type", "globalTid": "global_tid"})
    )
    return _cast(frame, "nvtx").sort("start")


def graph_nodes(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    table = next((t for t in GRAPH_TABLES if t in src.tables()), None)
    if table is None:
        return schema.empty("graph_nodes")
    raw = src.read(table, ["start", "globalTid", "graphNodeId", "originalGraphNodeId", "nameId"])
    frame = _resolve(raw, strings, "nameId", "event").rename(
        {"globalTid": "global_tid", "graphNodeId": "graph_node_id", "originalGraphNodeId": "original_graph_node_id"}
    )
    return _cast(frame, "graph_nodes").sort("start")


def sync(src: TableSource) -> pl.DataFrame:
    if SYNC_TABLE not in src.tables():
        return schema.empty("sync")
    raw = src.read(SYNC_TABLE, ["start", "end", "globalPid", "streamId", "correlationId", "syncType"])
    frame = raw.rename({"globalPid": "global_pid", "streamId": "stream_id",
                        "correlationId": "correlation_id", "syncType": "sync_type"})
    return _cast(frame, "sync").sort("start")


def gpus(src: TableSource) -> pl.DataFrame:
    if "TARGET_INFO_GPU" not in src.tables():
        return schema.empty("gpus")
    raw = src.read("TARGET_INFO_GPU", ["id", "name", "smCount"], text=["name"])
    return _cast(raw.rename({"id": "device_id", "smCount": "sm_count"}), "gpus")


def streams(src: TableSource) -> pl.DataFrame:
    if "TARGET_INFO_CUDA_STREAM" not in src.tables():
        return schema.empty("streams")
    raw = src.read("TARGET_INFO_CUDA_STREAM", ["streamId", "processId", "priority"])
    return _cast(raw.rename({"streamId": "stream_id", "processId": "pid"}), "streams")


def export_metadata(src: TableSource) -> dict[str, str]:
    """The exporter's name/value rows (nsys version, schema version)."""
    table = next((t for t in META_TABLES if t in src.tables()), None)
    if table is None:
        return {}
    rows = src.read(table, ["name", "value"], text=["name", "value"])
    keep = ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION")
    return {n: v for n, v in rows.iter_rows() if n in keep and v is not None}


def check_is_export(src: TableSource, label: str) -> None:
    tables = src.tables()
    if "StringIds" not in tables:
        raise ReportError(
            f"{label} is not an Nsight Systems export (no StringIds table)",
            "pass an .nsys-rep, or its export made with `nsys export -t sqlite` or `-t parquetdir`",
        )
    if KERNEL_TABLE not in tables:
        raise ReportError(
            f"{label} holds no CUDA kernel records (table {KERNEL_TABLE} is missing)",
            "record with `nsys profile -t cuda,nvtx --cuda-graph-trace=node` around GPU work",
        )


def normalise(src: TableSource, label: str) -> dict[str, pl.DataFrame]:
    """Every normalised table of one report, keyed as in `schema.TABLES`."""
    check_is_export(src, label)
    strings = _strings(src)
    return {
        "kernels": kernels(src, strings),
        "runtime": runtime(src, strings),
        "nvtx": nvtx(src, strings),
        "graph_nodes": graph_nodes(src, strings),
        "sync": sync(src),
        "gpus": gpus(src),
        "streams": streams(src),
    }
