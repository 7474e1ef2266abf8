"""Plain-Python reference for the numbers `k3trace analyze` reports (METRICS.md).

Independent of k3trace: stdlib only (sqlite3, re, statistics, tomllib), integer nanoseconds,
lists and dicts, simple loops. It reads one nsys 2023.4.4 SQLite export and recomputes

- the decode steps (graph replays), their period/span/host, the stable set;
- every kernel's layer/family label and which source gave it: k3trace's own `layer.N.family`
  ranges, serving engines' module-path ranges (`{'Module': 'top.model.layers.3.self_attn', ...}`),
  both at launch or at graph-node creation, an annotated eager step aligned by name, and a
  donor's labelled step (`--labels-from`);
- per family and per kernel name the busy / residency / exposed numbers;
- PDL edges per step and the pre-attention window.

Only k3trace's *settings* are shared (k3trace/defaults.toml, read with tomllib), never its code.
"""

from __future__ import annotations

import re
import sqlite3
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULTS = Path(__file__).resolve().parents[1] / "k3trace" / "defaults.toml"
PID_MASK = ~0xFFFFFF  # nsys: globalPid = globalTid with the low 24 bits cleared
NVTX_RANGE = 59


def settings(path: Path = DEFAULTS) -> dict:
    with open(path, "rb") as f:
        t = tomllib.load(f)
    return {
        "warmup": int(t["steps"]["warmup"]),
        "mad_k": float(t["steps"]["mad_k"]),
        "layer_pattern": re.compile(t["labels"]["layer_pattern"]),
        "name_rules": [(re.compile(r["pattern"]), r["family"]) for r in t["labels"].get("name_rules", [])],
        "module_rules": [(re.compile(r["pattern"]), r["family"]) for r in t["labels"].get("modules", [])],
        "attention_families": list(t["labels"]["attention_families"]),
        "fmha": re.compile(t["patterns"]["fmha"]),
        "residual": re.compile(t["patterns"]["residual"]),
        "full_attention_families": list(t["patterns"]["full_attention_families"]),
        "pdl_max_gap_ns": int(t["pdl"]["max_gap_ns"]),
    }


# ----------------------------------------------------------------------------- intervals

def union(intervals):
    """Sorted, merged list of [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def length(merged) -> int:
    return sum(e - s for s, e in merged)


def intersect(a, b):
    """Intersection of two merged interval lists."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_with(s: int, e: int, merged) -> int:
    """Length of [s, e) covered by a merged interval list."""
    total = 0
    for a, b in merged:
        if b <= s:
            continue
        if a >= e:
            break
        total += min(b, e) - max(a, s)
    return total


def at_least_two(per_stream_merged):
    """Time where intervals of at least two distinct streams are active at once."""
    events = []
    for merged in per_stream_merged:
        for s, e in merged:
            events.append((s, 1))
            events.append((e, -1))
    events.sort(key=lambda x: (x[0], x[1]))  # ends before starts at one time: touching is not overlap
    out = []
    active = 0
    opened = None
    for t, d in events:
        before = active
        active += d
        if before < 2 <= active:
            opened = t
        elif before >= 2 > active:
            if t > opened:
                out.append([opened, t])
            opened = None
    return union(out)


def median(values):
    return statistics.median(values)


# ----------------------------------------------------------------------------- raw rows

@dataclass
class Kernel:
    kid: int
    start: int
    end: int
    stream: int
    corr: int
    pid: int
    name: str
    exec_node: int | None
    launch_tid: int | None = None
    launch_start: int | None = None
    capture_node: int | None = None
    layer: int | None = None
    family: str | None = None
    source: str = "unlabelled"

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class Step:
    key: tuple
    kernels: list                 # in capture order (captured node id)
    first: int
    last: int
    period: int | None = None
    stable: bool = False
    reason: str | None = None

    @property
    def span(self) -> int:
        return self.last - self.first


@dataclass
class Reference:
    steps: list                   # every replay, by first kernel start
    stable: list                  # the stable steps
    kernels: list
    label_sources: dict
    step_rows: dict = field(default_factory=dict)      # first_start -> per-step numbers
    families: dict = field(default_factory=dict)       # family -> summary
    kernel_table: dict = field(default_factory=dict)   # (name, family) -> summary
    pdl_edges_median: float | None = None
    pdl_edges_per_step: list = field(default_factory=list)
    pre_attention: list = field(default_factory=list)  # (step first start, layer, window ns)
    medians: dict = field(default_factory=dict)        # period/span/host/busy/residency, ns

    @property
    def dropped(self) -> int:
        return len(self.steps) - len(self.stable)


def _strings(db):
    return dict(db.execute("SELECT id, value FROM StringIds"))


def _nvtx_rows(db):
    """Push/pop ranges (none when the report has no NVTX table: recorded without NVTX)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone():
        return []
    return db.execute("SELECT start, end, text, textId, globalTid FROM NVTX_EVENTS WHERE eventType = ?", (NVTX_RANGE,))


def _nvtx_layer_ranges(db, strings, pattern):
    """thread -> list of (start, end, layer, family) for every range matching the pattern."""
    by_tid: dict[int, list] = {}
    for start, end, text, text_id, tid in _nvtx_rows(db):
        if end is None:
            continue
        label = text if text is not None else strings.get(text_id)
        if label is None:
            continue
        m = pattern.match(label)
        if not m:
            continue
        by_tid.setdefault(tid, []).append((start, end, int(m.group("index")), m.group("family")))
    return by_tid


MODULE_DICT = re.compile(r"^\{'Module': '([^']*)'(, '(\w+)')?")
PLAIN_PATH = re.compile(r"[A-Za-z_]\w*(\.\w+)*")


def module_path(text):
    """(layer, child, names below the child) of a module-path range text, or None. The
    engines' output ranges (`{'Module': ..., 'Outputs': ...}`) are not layer ranges."""
    m = MODULE_DICT.match(text)
    if m:
        if m.group(3) == "Outputs":
            return None
        path = m.group(1)
    elif PLAIN_PATH.fullmatch(text):
        path = text
    else:
        return None
    parts = path.split(".")
    for i in range(len(parts) - 1):
        if parts[i] == "layers" and parts[i + 1].isdigit():
            child = parts[i + 2] if len(parts) > i + 2 else None
            return int(parts[i + 1]), child, tuple(parts[i + 3:])
    return None


def _nvtx_module_ranges(db, strings):
    """thread -> list of (start, end, layer, child, below) for every module-path layer range."""
    by_tid: dict[int, list] = {}
    for start, end, text, text_id, tid in _nvtx_rows(db):
        if end is None or end <= start:
            continue
        label = text if text is not None else strings.get(text_id)
        parsed = module_path(label) if label is not None else None
        if parsed:
            by_tid.setdefault(tid, []).append((start, end, *parsed))
    return by_tid


def innermost_many(ranges, points):
    """For (key, t) points on one thread: key -> the innermost range (latest start) enclosing t.
    A stack sweep: nested ranges end inner-first."""
    ranges = sorted(ranges, key=lambda r: (r[0], -r[1]))
    out, stack, i = {}, [], 0
    for key, t in sorted(points, key=lambda p: p[1]):
        while i < len(ranges) and ranges[i][0] <= t:
            stack.append(ranges[i])
            i += 1
        while stack and stack[-1][1] < t:
            stack.pop()
        # ranges that ended under a still-open one (start/end ranges) are skipped too
        live = [r for r in reversed(stack) if r[0] <= t <= r[1]][:1]
        if live:
            out[key] = live[0]
    return out


def _enclosing(ranges, t):
    """Innermost (latest-starting) range enclosing time t."""
    best = None
    for s, e, layer, fam in ranges:
        if s <= t <= e and (best is None or s > best[0]):
            best = (s, e, layer, fam)
    return best


def compute(path, cfg: dict | None = None, donor: list | None = None) -> Reference:
    """`donor`: (name, layer, family) of a donor's labelled step, in launch order (donor_step)."""
    cfg = cfg or settings()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _compute(db, cfg, donor)
    finally:
        db.close()


def donor_step(ref: "Reference") -> list:
    """A labelled eager recording as a donor: (name, layer, family) of its eager launches in
    launch order (labels from its layer or module ranges only); a replay takes the first run
    of them with its names."""
    eager = sorted((k for k in ref.kernels if k.exec_node is None and k.launch_start is not None),
                   key=lambda k: (k.launch_start, k.start))
    return [(k.name, k.layer if k.source in ("nvtx", "module") else None,
             k.family if k.source in ("nvtx", "module") else None) for k in eager]


def _module_labels(kernels, steps, created, modules, cfg) -> None:
    """Module-path labels: the innermost module range carrying `layers.N` around the launch
    (eager) or the node's creation (replays); the family of the layer's child module from
    the module table (its name or any name below it, first entry wins), `other` for the
    layer's own launches or a child matching no entry; an `attention` child becomes the
    attention family most of its kernels' name rules give."""
    points: dict[int, list] = {}
    for k in kernels:
        if k.exec_node is None and k.launch_tid is not None and k.source == "unlabelled":
            points.setdefault(k.launch_tid, []).append((("k", k.kid), k.launch_start))
    node_kernels: dict[int, list] = {}
    for s in steps:
        for k in s.kernels:
            if k.source == "unlabelled" and k.capture_node in created:
                node_kernels.setdefault(k.capture_node, []).append(k)
    for node, (t, tid) in created.items():
        if node in node_kernels:
            points.setdefault(tid, []).append((("n", node), t))
    found = {}
    for tid, pts in points.items():
        found.update(innermost_many(modules.get(tid, []), pts))
    below: dict[tuple, set] = {}
    for rs in modules.values():
        for _, _, layer, child, rest in rs:
            if child is not None:
                below.setdefault((layer, child), {child}).update(rest)
    family_of = {}
    for key, names in below.items():
        family_of[key] = "other"
        for pattern, family in cfg["module_rules"]:
            if any(pattern.search(n) for n in names):
                family_of[key] = family
                break
    by_kid = {k.kid: k for k in kernels}
    labelled = []   # (kernels it labels, source, name, layer, child)
    for (kind, ident), r in found.items():
        layer, child = r[2], r[3]
        if kind == "k":
            labelled.append(([by_kid[ident]], "module", by_kid[ident].name, layer, child))
        else:
            ks = node_kernels[ident]
            labelled.append((ks, "graph_capture", ks[0].name, layer, child))
    votes: dict[tuple, dict] = {}
    for _, _, name, layer, child in labelled:
        if child is not None and family_of.get((layer, child)) == "attention":
            for pattern, family in cfg["name_rules"]:
                if pattern.search(name):
                    if family in cfg["attention_families"]:
                        v = votes.setdefault((layer, child), {})
                        v[family] = v.get(family, 0) + 1
                    break
    for ks, source, _, layer, child in labelled:
        family = "other" if child is None else family_of.get((layer, child), "other")
        if family == "attention" and votes.get((layer, child)):
            v = votes[(layer, child)]
            family = max(v, key=lambda f: (v[f], -cfg["attention_families"].index(f)))
        for k in ks:
            k.layer, k.family, k.source = layer, family, source


def _stable(steps, cfg) -> list:
    counts: dict[int, int] = {}
    for s in steps:
        counts[len(s.kernels)] = counts.get(len(s.kernels), 0) + 1
    dominant = max(counts, key=lambda n: (counts[n], n))
    complete = [s for s in steps if len(s.kernels) == dominant]
    for s in steps:
        if len(s.kernels) != dominant:
            s.reason = "incomplete"
    for s in complete[:cfg["warmup"]]:
        s.reason = "warm-up"
    candidates = complete[cfg["warmup"]:]

    def bounds(values):
        m = median(values)
        mad = median([abs(v - m) for v in values])
        half = cfg["mad_k"] * max(mad, 0.001 * m)
        return m - half, m + half

    span_lo, span_hi = bounds([s.span for s in candidates])
    periods = [s.period for s in candidates if s.period is not None]
    per_lo, per_hi = bounds(periods)
    for s in candidates:
        ok = span_lo <= s.span <= span_hi
        if s.period is not None:
            ok = ok and per_lo <= s.period <= per_hi
        s.stable = ok
        if not ok:
            s.reason = "outlier"
    stable = [s for s in candidates if s.stable]

    return stable


def _compute(db, cfg, donor=None) -> Reference:
    strings = _strings(db)
    kernels = []
    for i, (start, end, stream, corr, pid, short, node) in enumerate(db.execute(
            "SELECT start, end, streamId, correlationId, globalPid, shortName, graphNodeId "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start, end")):
        kernels.append(Kernel(i, start, end, stream, corr, pid, strings[short], node))

    launches = {}
    for start, tid, corr in db.execute(
            "SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        launches[(tid & PID_MASK, corr)] = (start, tid)
    for k in kernels:
        hit = launches.get((k.pid, k.corr))
        if hit:
            k.launch_start, k.launch_tid = hit

    exec_to_orig = {}
    created = {}
    for start, tid, node, orig in db.execute(
            "SELECT start, globalTid, graphNodeId, originalGraphNodeId FROM CUDA_GRAPH_EVENTS"):
        if orig is None:
            created[node] = (start, tid)
        else:
            exec_to_orig[node] = orig
    ranges = _nvtx_layer_ranges(db, strings, cfg["layer_pattern"])
    modules = _nvtx_module_ranges(db, strings)

    # --- steps: graph replays, one per (process, cudaGraphLaunch correlationId)
    groups: dict[tuple, list] = {}
    for k in kernels:
        if k.exec_node is not None:
            k.capture_node = exec_to_orig.get(k.exec_node)
            groups.setdefault((k.pid, k.corr), []).append(k)
    steps = []
    for key, ks in groups.items():
        ks.sort(key=lambda k: (k.capture_node if k.capture_node is not None else -1, k.start))
        steps.append(Step(key, ks, min(k.start for k in ks), max(k.end for k in ks)))
    steps.sort(key=lambda s: s.first)
    for a, b in zip(steps, steps[1:]):
        a.period = b.first - a.first

    # --- stable steps (an eager-only recording, such as a label donor, has none: labels only)
    stable = _stable(steps, cfg) if steps else []

    # --- labels
    # 1. eager kernels: the layer range enclosing the launch call on the launching thread
    for k in kernels:
        if k.exec_node is None and k.launch_tid is not None:
            r = _enclosing(ranges.get(k.launch_tid, []), k.launch_start)
            if r:
                k.layer, k.family, k.source = r[2], r[3], "nvtx"
    # 2. replays: the layer range open on the capturing thread when the node was created
    for s in steps:
        for k in s.kernels:
            c = created.get(k.capture_node)
            if c is None:
                continue
            r = _enclosing(ranges.get(c[1], []), c[0])
            if r:
                k.layer, k.family, k.source = r[2], r[3], "graph_capture"
    # 1b/2b. module-path ranges, the same two ways, for kernels still unlabelled
    _module_labels(kernels, steps, created, modules, cfg)
    # 3. replays without labels: a run of eager launches with the replay's names in capture
    # order, some of them labelled, lends its labels position by position
    eager = sorted((k for k in kernels if k.exec_node is None and k.launch_start is not None),
                   key=lambda k: (k.launch_start, k.start))
    eager_names = [k.name for k in eager]
    for s in steps:
        if any(k.source != "unlabelled" for k in s.kernels):
            continue
        names = [k.name for k in s.kernels]
        for i in range(len(eager) - len(names) + 1):
            run = eager[i:i + len(names)]
            if eager_names[i:i + len(names)] == names and any(e.source in ("nvtx", "module") for e in run):
                for k, e in zip(s.kernels, run):
                    if e.source in ("nvtx", "module"):
                        k.layer, k.family, k.source = e.layer, e.family, "aligned_eager"
                break
    # 5. a donor's labelled step (--labels-from), for replays still without labels
    if donor is not None:
        donor_names = [d[0] for d in donor]
        for s in steps:
            if any(k.source != "unlabelled" for k in s.kernels):
                continue
            names = [k.name for k in s.kernels]
            at = next((i for i in range(len(donor) - len(names) + 1) if donor_names[i:i + len(names)] == names
                       and any(d[2] is not None for d in donor[i:i + len(names)])), None)
            if at is None:
                raise AssertionError("no step of the donor aligns with the replay by name")
            for k, (_, layer, family) in zip(s.kernels, donor[at:at + len(names)]):
                if family is not None:
                    k.layer, k.family, k.source = layer, family, "donor"
    # 7. name rules for the rest
    for k in kernels:
        if k.source == "unlabelled":
            for pattern, family in cfg["name_rules"]:
                if pattern.search(k.name):
                    k.family, k.source = family, "name_rule"
                    break
    sources = {"nvtx": 0, "module": 0, "graph_capture": 0, "aligned_eager": 0, "donor": 0, "inferred": 0,
               "name_rule": 0, "unlabelled": 0}
    for k in kernels:
        sources[k.source] += 1

    ref = Reference(steps=steps, stable=stable, kernels=kernels, label_sources=sources)
    if stable:
        _per_step(ref, cfg)
    return ref


def _segments(step):
    """Contiguous runs of one (layer, family) in capture order: list of (family, kernels)."""
    out = []
    for k in step.kernels:
        if out and out[-1][0] == (k.layer, k.family):
            out[-1][1].append(k)
        else:
            out.append(((k.layer, k.family), [k]))
    return [(lf[1], ks) for lf, ks in out]


def _per_step(ref: Reference, cfg) -> None:
    fam_rows: dict[str, dict[int, dict]] = {}   # family -> step first -> numbers
    fam_segments: dict[str, list] = {}
    kern: dict[tuple, dict] = {}
    families_seen = set()
    for s in ref.stable:
        ks = s.kernels
        families_seen.update(k.family for k in ks)
        by_stream: dict[int, list] = {}
        for k in ks:
            by_stream.setdefault(k.stream, []).append(k)
        stream_union = {st: union([(k.start, k.end) for k in v]) for st, v in by_stream.items()}
        other_union = {st: union([(k.start, k.end) for k in ks if k.stream != st]) for st in by_stream}
        multi = at_least_two(list(stream_union.values()))
        busy = length(union([(k.start, k.end) for k in ks]))
        ref.step_rows[s.first] = {
            "span": s.span, "period": s.period, "host": None if s.period is None else s.period - s.span,
            "busy": busy, "residency": length(multi),
        }
        exposed = {k.kid: k.dur - overlap_with(k.start, k.end, other_union[k.stream]) for k in ks}

        segs = _segments(s)
        for fam in {f for f, _ in segs}:
            fks = [k for k in ks if k.family == fam]
            windows = union([(min(k.start for k in sk), max(k.end for k in sk)) for f, sk in segs if f == fam])
            dev = length(union([(k.start, k.end) for k in fks]))
            res = length(intersect(windows, multi))
            fam_rows.setdefault(fam, {})[s.first] = {
                "device_busy": dev, "residency": res, "exposed": sum(exposed[k.kid] for k in fks),
                "segments": sum(1 for f, _ in segs if f == fam),
                "share": res / dev if dev else 0.0,
            }
        for site, k in enumerate(ks):  # a call site: the position in the step's launch order
            row = kern.setdefault((k.name, k.family), {"durs": [], "exposed": 0, "sites": {}})
            row["durs"].append(k.dur)
            row["exposed"] += exposed[k.kid]
            row["sites"].setdefault(site, []).append(k.dur)

        # PDL edges: consecutive kernels on one stream with start - previous end <= max gap
        edges = 0
        for v in by_stream.values():
            v = sorted(v, key=lambda k: (k.start, k.end))
            for a, b in zip(v, v[1:]):
                if b.start - a.end <= cfg["pdl_max_gap_ns"]:
                    edges += 1
        ref.pdl_edges_per_step.append(edges)

        # pre-attention window per full-attention layer
        layer_family = {}
        for k in ks:
            if k.layer is not None and k.family in cfg["full_attention_families"]:
                layer_family[k.layer] = k.family
        for layer in sorted(layer_family):
            fmha = [k for k in ks if k.layer == layer and cfg["fmha"].search(k.name)]
            resid = [k for k in ks if k.layer == layer - 1 and cfg["residual"].search(k.name)]
            # METRICS.md: the kernel that completed the residual stream is the previous
            # layer's last when none of its kernels is a residual add (the MLP output folded
            # into the next aggregation: variant mlp_residual_folded).
            resid = resid or [k for k in ks if k.layer == layer - 1]
            if not fmha or not resid:
                continue
            first = min(fmha, key=lambda k: (k.start, k.end))
            last = max(resid, key=lambda k: k.end)
            ref.pre_attention.append((s.first, layer, first.start - last.end))

    n = len(ref.stable)
    for fam in families_seen:
        rows = [fam_rows.get(fam, {}).get(s.first) for s in ref.stable]
        zero = {"device_busy": 0, "residency": 0, "exposed": 0, "segments": 0, "share": 0.0}
        rows = [r if r is not None else zero for r in rows]
        ref.families[fam] = {
            "segments_per_step": sum(r["segments"] for r in rows) / n,
            "device_busy": median([r["device_busy"] for r in rows]),
            "residency": median([r["residency"] for r in rows]),
            "exposed": median([r["exposed"] for r in rows]),
            "share_median": median([r["share"] for r in rows]),
            "per_step": rows,
        }
    for key, row in kern.items():
        durs = row["durs"]
        ref.kernel_table[key] = {
            "calls_per_step": len(durs) / n,
            "mean": sum(durs) / len(durs),
            "median": median(durs),
            "hidden_share": 1 - row["exposed"] / sum(durs) if sum(durs) else 0.0,
            "sites": len(row["sites"]),
            "site_median_min": min(median(d) for d in row["sites"].values()),
            "site_median_max": max(median(d) for d in row["sites"].values()),
        }
    ref.pdl_edges_median = median(ref.pdl_edges_per_step)
    for col in ("period", "span", "host", "busy", "residency"):
        vals = [r[col] for r in ref.step_rows.values() if r[col] is not None]
        ref.medians[col] = median(vals)
