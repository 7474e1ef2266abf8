"""Raw export tables -> the normalised frames of `schema.py`.

Export schemas by nsys version (METRICS.md, "Inputs"): 2022.x writes `EXPORT_META_DATA`,
2023.4+ `META_DATA_EXPORT`; 2026.x adds kernel columns (`graphId`, `qmd*`, clusters);
graph node events live in `CUDA_GRAPH_EVENTS` (2022-2024) or `CUDA_GRAPH_NODE_EVENTS`.
Only the columns below are read, so extra columns of newer versions cost nothing.
"""

from __future__ import annotations

import polars as pl

from k3trace.errors import ReportError
from k3trace.ingest import schema, validate
from k3trace.ingest.tables import TRUNCATED, WRONG_TYPE, TableSource
from k3trace.ordering import sorted_by

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
GRAPH_TABLES = ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
METRICS_TABLE, METRIC_NAMES_TABLE = "GPU_METRICS", "TARGET_INFO_GPU_METRICS"

#: The GPU metrics read, by name: ids are not stable across nsys versions or GPUs (the
#: export says so), names are. nsys 2023.4 on the H200: `DRAM Read Bandwidth [Throughput %]`,
#: `DRAM Write Bandwidth [Throughput %]`. Only percentages are read (their unit is in the name).
DRAM_METRICS = {"dram_read": r"(?i)^DRAM Read Bandwidth\b.*%", "dram_write": r"(?i)^DRAM Write Bandwidth\b.*%"}
#: The CUDA device of a GPU-metrics type id: its low byte (nsys numbers the sampled GPUs so;
#: with one GPU recorded here, the type id's low byte is 0 as the device's id).
_DEVICE_BITS = 0xFF

NVTX_DOMAIN_CREATE = 75


def _strings(src: TableSource) -> tuple[pl.DataFrame, list[dict]]:
    raw = src.read("StringIds", ["id", "value"], text=["value"], integers=["id"])
    found = []
    if raw[TRUNCATED].sum():
        found.append(validate.finding("StringIds", validate.TRUNCATED_ISSUE, int((raw[TRUNCATED] > 0).sum()),
                                      raw.height, excluded=False))
    strings = raw.filter(pl.col("id").is_not_null()).select(
        pl.col("id").cast(pl.Int64), pl.col("value").alias("string")).unique("id", keep="first")
    return strings, found


def _resolve(frame: pl.DataFrame, strings: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
    lookup = strings.rename({"id": id_col, "string": out})
    return frame.with_columns(pl.col(id_col).cast(pl.Int64)).join(lookup, on=id_col, how="left")


def _cast(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    target = schema.TABLES[table]
    # Not strict: a value that does not fit its column (a damaged id) becomes null, not a crash.
    return frame.select(pl.col(name).cast(dtype, strict=False) for name, dtype in target.items())


_LAUNCH = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
_KERNEL_INTS = ["start", "end", "deviceId", "streamId", "globalPid", "correlationId", "shortName", "demangledName",
                "graphNodeId", "graphId", *_LAUNCH]


#: The launch fields packed into two integers, with the bits each takes (CUDA's limits: grid
#: x below 2^31, grid y and z below 2^16, block x and y at most 1024, block z at most 64).
_PACKED = ((("_name_id", 31), ("gridX", 31)),
           (("gridY", 16), ("gridZ", 16), ("blockX", 11), ("blockY", 11), ("blockZ", 7)))
#: The second packing, as the table source makes it while reading (one column, not five).
_DIMS = "_launch1"
_DIM_COLUMNS = [c for c, _ in _PACKED[1]]
#: Pairs of columns the source packs too, each into one integer, unpacked as soon as read
#: (string ids below 2^31; CUDA device ids below 2^16, stream ids below 2^32): of the
#: read's per-value work (SQLite's and ADBC's, about 30 ns a value, a tenth of the read
#: per column at 2.5M kernels) the packing in SQL and the unpacking cost about half.
_PAIRS = {"_names": (("shortName", 31), ("demangledName", 31)), "_place": (("deviceId", 16), ("streamId", 32))}
_PAIRED = [c for pair in _PAIRS.values() for c, _ in pair]
_KERNEL_READ = [c for c in _KERNEL_INTS if c not in _DIM_COLUMNS and c not in _PAIRED]


def _read_kernels(src: TableSource) -> pl.DataFrame:
    """The kernel table, its launch dimensions past grid x packed by the source into one
    column (`_DIMS`): four columns fewer for SQLite and ADBC to hand over (a fifth of the
    read); and two pairs of id columns packed the same way, then unpacked (`_PAIRS`).
    Where a row's do not pack (null, not integers, past the bits: a damaged export), the
    table is read again with every column of its own, as validation expects."""
    packs = {_DIMS: _PACKED[1], **_PAIRS}
    raw = src.read(KERNEL_TABLE, _KERNEL_READ, integers=_KERNEL_READ, packed=packs)
    if all(raw[c].dtype.is_integer() and not raw[c].null_count() for c in packs):
        return _unpaired(raw)
    return src.read(KERNEL_TABLE, _KERNEL_INTS, integers=_KERNEL_INTS)


def _unpaired(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with each `_PAIRS` column as its two columns again."""
    columns = []
    for packed, ((high, _), (low, bits)) in _PAIRS.items():
        columns += [(pl.col(packed) // (1 << bits)).alias(high), (pl.col(packed) % (1 << bits)).alias(low)]
    return frame.with_columns(columns).drop(*_PAIRS)


def _unpacked(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its launch dimensions as columns again (where `_read_kernels` packed them)."""
    if _DIMS not in frame.columns:
        return frame
    shift, dims = 0, {}
    for col, bits in reversed(_PACKED[1]):
        dims[col] = (pl.col(_DIMS) // (1 << shift)) % (1 << bits)
        shift += bits
    return frame.with_columns(expr.alias(col) for col, expr in dims.items()).drop(_DIMS)


def _packed_launch(raw: pl.DataFrame) -> pl.DataFrame | None:
    """The launch columns (name id, grid, block) as two integers packing them losslessly, or
    None where a value is null or past the limits (a damaged export)."""
    for group in _PACKED:
        if _DIMS in raw.columns and group is _PACKED[1]:
            continue  # packed as read, each value checked there
        for col, bits in group:
            values = raw[col]
            if values.null_count() or (values.len() and not (values.min() >= 0 and values.max() < 1 << bits)):
                return None
    packed = []
    for i, group in enumerate(_PACKED):
        if _DIMS in raw.columns and group is _PACKED[1]:
            packed.append(pl.col(_DIMS))
            continue
        expr = pl.lit(0, pl.Int64)
        for col, bits in group:
            expr = expr * (1 << bits) + pl.col(col)
        packed.append(expr.alias(f"_launch{i}"))
    return raw.select(packed)


def kernels(src: TableSource, strings: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, list[dict]]:
    """(kernels, rejected kernel rows, findings)."""
    raw = _read_kernels(src)
    # Membership tests, not joins: a join gathers every column of the 400k-row table again.
    known = strings["id"].implode()
    raw = raw.with_columns(pl.col("shortName").is_in(known).alias("_has_name"))
    checks = validate.interval_checks(ids=("deviceId", "streamId", "globalPid", "correlationId"), negative=True)
    checks.append((validate.DANGLING_ISSUE, ~pl.col("_has_name")))
    # Rows equal on the packed dimensions are equal on the dimensions.
    ints = [c for c in [*_KERNEL_INTS, _DIMS] if c in raw.columns]
    raw, bad, found = validate.split(raw, checks, "kernels", duplicates_on=ints)
    rejected = bad.select(pl.col("globalPid").alias("global_pid"), pl.col("correlationId").alias("correlation_id"),
                          pl.col("graphNodeId").alias("graph_node_id"), "start", "issue")
    # Signatures per distinct (name id, grid, block), resolved and hashed there, joined back;
    # a demangled name id with no string falls back to the short name.
    keys = ["_name_id", *_LAUNCH]
    raw = raw.with_columns(
        pl.when(pl.col("demangledName").is_in(known)).then(pl.col("demangledName")).otherwise(pl.col("shortName"))
        .cast(pl.Int64).alias("_name_id")).drop("_has_name")
    # The hash covers the name's text and the launch shape, never the report's own string id.
    # Distinct launches and the join back go by two integers packing the seven columns (a
    # row encoding of seven took 600 MB at 2.5M kernels), or by the columns themselves.
    keyed = _packed_launch(raw)
    if keyed is None:
        raw = _unpacked(raw)
        keyed = raw.select(keys)
    firsts = keyed.with_row_index("_row").unique(keyed.columns, keep="any")["_row"]
    distinct = _resolve(_unpacked(raw[firsts]).select(keys), strings, "_name_id", "_full_name")
    signed = keyed[firsts].with_columns(schema.with_kernel_signature(distinct.select("_full_name", *_LAUNCH))["signature"])
    # Joined on the key columns alone (a left join keeps the row order), then set beside the
    # rest: joining the whole table would gather all its columns twice more (peak memory).
    name = _resolve(raw.select("shortName"), strings, "shortName", "name")["name"]
    signature = keyed.join(signed, on=keyed.columns, how="left", nulls_equal=True)["signature"]
    del keyed
    frame = raw.drop(*keys, _DIMS, strict=False).with_columns(name, signature)
    frame = frame.rename(
        {"deviceId": "device_id", "streamId": "stream_id", "globalPid": "global_pid",
         "correlationId": "correlation_id", "graphNodeId": "graph_node_id", "graphId": "graph_id"}
    )
    # Rows are not guaranteed to be in time order (METRICS.md, "Inputs").
    return sorted_by(_cast(frame, "kernels"), "start", "end"), _cast_rejected(rejected), found


def _cast_rejected(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(pl.col(n).cast(t) for n, t in schema.REJECTED_KERNELS.items())


def runtime(src: TableSource, strings: pl.DataFrame) -> tuple[pl.DataFrame, list[dict]]:
    if RUNTIME_TABLE not in src.tables():
        return schema.empty("runtime"), []
    cols = ["start", "end", "globalTid", "correlationId", "nameId", "returnValue"]
    raw = _resolve(src.read(RUNTIME_TABLE, cols, integers=cols), strings, "nameId", "name")
    checks = validate.interval_checks(ids=("globalTid",))
    checks.append((validate.DANGLING_ISSUE, pl.col("name").is_null()))
    raw, _, found = validate.split(raw, checks, "runtime", duplicates_on=cols)
    frame = raw.rename(
        {"globalTid": "global_tid", "correlationId": "correlation_id", "returnValue": "return_value"}
    )
    frame = frame.with_columns(schema.global_pid(pl.col("global_tid").cast(pl.Int64)).alias("global_pid"))
    return sorted_by(_cast(frame, "runtime"), "start"), found


def nvtx(src: TableSource, strings: pl.DataFrame) -> tuple[pl.DataFrame, list[dict]]:
    if NVTX_TABLE not in src.tables():
        return schema.empty("nvtx"), []
    ints = ["start", "end", "eventType", "textId", "domainId", "globalTid"]
    raw = src.read(NVTX_TABLE, ["start", "end", "eventType", "text", "textId", "domainId", "globalTid"],
                   text=["text"], integers=ints)
    raw, _, found = validate.split(raw, validate.interval_checks(end_may_be_null=True), "nvtx")
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
    return sorted_by(_cast(frame, "nvtx"), "start"), found


def graph_nodes(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    table = next((t for t in GRAPH_TABLES if t in src.tables()), None)
    if table is None:
        return schema.empty("graph_nodes")
    cols = ["start", "globalTid", "graphNodeId", "originalGraphNodeId", "nameId"]
    raw = src.read(table, cols, integers=cols)
    frame = _resolve(raw, strings, "nameId", "event").rename(
        {"globalTid": "global_tid", "graphNodeId": "graph_node_id", "originalGraphNodeId": "original_graph_node_id"}
    ).with_columns(pl.lit(None, dtype=pl.String).alias("kernel"))
    return sorted_by(_cast(frame, "graph_nodes"), "start")


def sync(src: TableSource) -> pl.DataFrame:
    if SYNC_TABLE not in src.tables():
        return schema.empty("sync")
    cols = ["start", "end", "globalPid", "streamId", "correlationId", "syncType"]
    raw = src.read(SYNC_TABLE, cols, integers=cols)
    frame = raw.rename({"globalPid": "global_pid", "streamId": "stream_id",
                        "correlationId": "correlation_id", "syncType": "sync_type"})
    return _cast(frame, "sync").sort("start")


def gpus(src: TableSource) -> pl.DataFrame:
    if "TARGET_INFO_GPU" not in src.tables():
        return schema.empty("gpus")
    ints = ["id", "smCount", "memoryBandwidth"]
    raw = src.read("TARGET_INFO_GPU", ["id", "name", "smCount", "memoryBandwidth"], text=["name"], integers=ints)
    return _cast(raw.rename({"id": "device_id", "smCount": "sm_count", "memoryBandwidth": "memory_bandwidth"}),
                 "gpus")


def gpu_metrics(src: TableSource) -> tuple[pl.DataFrame, list[dict]]:
    """The DRAM metrics' samples (schema.GPU_METRICS) and what validation found. Only their
    rows are read: a report holds about twenty metrics, one row each per 5-us sample (two
    million rows in 0.4 s of capture). Absent tables (no `--gpu-metrics-device`): empty."""
    tables = src.tables()
    if METRICS_TABLE not in tables or METRIC_NAMES_TABLE not in tables:
        return schema.empty("gpu_metrics"), []
    for table, cols in validate.OPTIONAL.items():
        missing = [c for c in cols if c not in src.columns(table)]
        if missing:  # another nsys's layout: the trace stays readable, its DRAM numbers go
            issue = f"without column {', '.join(missing)}: DRAM numbers left out"
            return schema.empty("gpu_metrics"), [validate.finding(table, issue, 1, 1, excluded=False)]
    names = src.read(METRIC_NAMES_TABLE, ["typeId", "metricId", "metricName"], text=["metricName"],
                     integers=["typeId", "metricId"])
    metric = pl.lit(None, pl.String)
    for key, pattern in reversed(DRAM_METRICS.items()):
        metric = pl.when(pl.col("metricName").str.contains(pattern)).then(pl.lit(key)).otherwise(metric)
    wanted = (names.filter(pl.col("typeId").is_not_null() & pl.col("metricId").is_not_null())
              .select("typeId", "metricId", metric.alias("metric")).drop_nulls("metric").unique(["typeId", "metricId"]))
    if wanted.is_empty():
        return schema.empty("gpu_metrics"), []
    cols = ["timestamp", "typeId", "metricId", "value"]
    raw = src.read(METRICS_TABLE, cols, integers=cols, only=("metricId", sorted(set(wanted["metricId"].to_list()))))
    # A type's other metrics may share an id with another type's DRAM metric: keep the pairs.
    raw = raw.join(wanted, on=["typeId", "metricId"], how="semi")
    checks = [(validate.WRONG_TYPE_ISSUE, pl.col(WRONG_TYPE) > 0),
              (validate.NULL_SAMPLE_ISSUE, pl.col("timestamp").is_null() | pl.col("value").is_null()),
              (validate.NEGATIVE_VALUE_ISSUE, pl.col("value") < 0)]
    raw, _, found = validate.split(raw, checks, METRICS_TABLE, duplicates_on=cols)
    frame = raw.join(wanted, on=["typeId", "metricId"], how="left").select(
        "timestamp", pl.col("typeId").alias("type_id"),
        (pl.col("typeId") & _DEVICE_BITS).alias("device_id"), "metric", "value")
    # One series per (GPU, metric), each in time order (every column: one defined order).
    return _cast(frame, "gpu_metrics").sort("type_id", "metric", "timestamp", "value"), found


def streams(src: TableSource) -> pl.DataFrame:
    if "TARGET_INFO_CUDA_STREAM" not in src.tables():
        return schema.empty("streams")
    cols = ["streamId", "processId", "priority"]
    raw = src.read("TARGET_INFO_CUDA_STREAM", cols, integers=cols)
    return _cast(raw.rename({"streamId": "stream_id", "processId": "pid"}), "streams")


def export_metadata(src: TableSource) -> dict[str, str]:
    """The exporter's name/value rows (nsys version, schema version)."""
    table = next((t for t in META_TABLES if t in src.tables()), None)
    if table is None:
        return {}
    rows = src.read(table, ["name", "value"], text=["name", "value"]).select("name", "value")
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
    """Every normalised table of one report, keyed as in `schema.TABLES`, plus `findings`
    (what validation excluded or cut) and `rejected_kernels` (the excluded kernel rows)."""
    check_is_export(src, label)
    validate.check_columns(src, label, validate.schema_version(export_metadata(src)))
    strings, found = _strings(src)
    kernel_frame, rejected, k_found = kernels(src, strings)
    if kernel_frame.is_empty() and not rejected.is_empty():
        issues = ", ".join(f"{n} {issue}" for issue, n in rejected.group_by("issue").len().sort("len", descending=True)
                           .iter_rows())
        raise ReportError(f"{label}: none of its {rejected.height} kernel records is usable ({issues})",
                          "export the report again with `nsys export -t sqlite`; the export is damaged")
    runtime_frame, r_found = runtime(src, strings)
    nvtx_frame, n_found = nvtx(src, strings)
    metrics_frame, m_found = gpu_metrics(src)
    return {
        "kernels": kernel_frame,
        "runtime": runtime_frame,
        "nvtx": nvtx_frame,
        "graph_nodes": graph_nodes(src, strings),
        "sync": sync(src),
        "gpus": gpus(src),
        "streams": streams(src),
        "gpu_metrics": metrics_frame,
        "findings": validate.findings_frame(found + k_found + r_found + n_found + m_found),
        "rejected_kernels": rejected,
    }
