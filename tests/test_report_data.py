"""The data the reports draw (analyses/streams, timeline, per_layer, distribution,
pdl.edge_table; diff/sides; Diff.waterfall), each checked against numbers computed here
from the raw rows or from first principles, never by calling the code a second way."""

from __future__ import annotations

import bisect
import sqlite3
import statistics
from collections import defaultdict

import polars as pl
import pytest

import reference
from k3trace.analyses.distribution import histogram, steps_us
from k3trace.analyses.pdl import edge_table
from k3trace.analyses.per_layer import layer_family_table
from k3trace.analyses.streams import EAGER, INFERRED, RECORDED, stream_roles
from k3trace.analyses.timeline import step_timeline
from k3trace.diff import diff
from k3trace.diff import sides


# -- stream roles ----------------------------------------------------------------------------

def _eager_streams(path) -> list[int]:
    """The eager step's kernel streams in launch order, from the raw rows: kernels outside any
    graph whose launch call lies inside the first `decode_step` NVTX range holding any."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        strings = dict(db.execute("SELECT id, value FROM StringIds"))
        steps = [(s, e) for s, e, text, tid in db.execute(
            "SELECT start, end, text, textId FROM NVTX_EVENTS WHERE end IS NOT NULL")
            if (text if text is not None else strings.get(tid)) == "decode_step"]
        rows = db.execute(
            "SELECT r.start, k.streamId FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON k.correlationId = r.correlationId AND k.globalPid = (r.globalTid & ?) "
            "WHERE k.graphNodeId IS NULL ORDER BY r.start", (reference.PID_MASK,)).fetchall()
    finally:
        db.close()
    for s, e in sorted(steps):
        inside = [stream for t, stream in rows if s <= t <= e]
        if inside:
            return inside
    return []


def test_replay_rows_are_the_eager_steps_capture_streams(trace_sqlite, analysis):
    path = trace_sqlite("k3_bs1_base_a")
    a = analysis("k3_bs1_base_a")
    step = a.representative_step()
    roles = stream_roles(a.kernels, a.path, step)
    assert roles.source == EAGER and roles.labels == ["main", "side 1", "side 2"]
    # The replay in capture order, from the raw rows (tests/reference.py), position by position.
    ref = reference.compute(path)
    first = a.steps.filter(pl.col("step") == step)["first_start"][0]
    replay = next(s for s in ref.steps if s.first == first)
    expected = _eager_streams(path)
    assert len(expected) == len(replay.kernels) == 198
    got = dict(zip(roles.rows["kernel_id"].to_list(), roles.rows["capture_stream"].to_list()))
    by_start = {(k["start"], k["end"]): k["kernel_id"] for k in a.kernels.filter(pl.col("step") == step).to_dicts()}
    assert [got[by_start[(k.start, k.end)]] for k in replay.kernels] == expected
    # main holds the most kernels
    counts = {s: expected.count(s) for s in set(expected)}
    main = max(counts, key=counts.get)
    assert set(roles.rows.filter(pl.col("role") == "main")["capture_stream"].to_list()) == {main}


@pytest.mark.parametrize("name", ["k3_bs1_base_a", "k3_bs1_no_attn_forks", "small_inside_a"])
def test_a_capture_stream_runs_its_kernels_one_after_another(analysis, name):
    """A stream executes in order: on one row, a kernel may start before the previous one
    ends only by a PDL prologue (at most `pdl_max_overlap_ns`)."""
    a = analysis(name)
    tl = step_timeline(a)
    for (role,), rows in tl.kernels.sort("start_us").group_by("role"):
        starts, ends = rows["start_us"].to_list(), rows["end_us"].to_list()
        worst = max((ends[i] - starts[i + 1] for i in range(len(starts) - 1)), default=0.0)
        assert worst * 1e3 <= a.config.pdl_max_overlap_ns, (name, role, worst)


def test_attention_forks_put_kda_and_mla_kernels_on_a_side_stream(analysis):
    """kernels/README.md: without the forks every KDA and MLA launch is on the main stream;
    with them the KDA gate GEMVs run on a side stream."""
    single = step_timeline(analysis("k3_bs1_no_attn_forks")).kernels
    forked = step_timeline(analysis("k3_bs1_base_a")).kernels
    assert single.filter(pl.col("family").is_in(["kda", "mla"]))["role"].unique().to_list() == ["main"]
    gemv = forked.filter(pl.col("family") == "kda", pl.col("name") == "gemv_kernel")
    assert gemv.height == 6 and "main" not in gemv["role"].to_list()


def test_one_stream_and_inferred_rows(analysis):
    hf = analysis("hf_base_a")
    roles = stream_roles(hf.kernels, hf.path, hf.representative_step())
    assert roles.source == RECORDED and roles.labels == ["main"]
    # Without the eager twin, rows are packed: no overlap on a row, main holds the most kernels.
    a = analysis("small_inside_a")
    graph_only = a.kernels.filter(pl.col("graph_node_id").is_not_null())
    inferred = stream_roles(graph_only, a.path, a.representative_step())
    assert inferred.source == INFERRED and len(inferred.labels) >= 2
    k = a.kernels.join(inferred.rows, on="kernel_id")
    for (_,), rows in k.sort("start").group_by("row"):
        assert all(e <= s for e, s in zip(rows["end"].to_list(), rows["start"].to_list()[1:]))
    sizes = k.group_by("role").len()
    assert sizes.sort("len", descending=True)["role"][0] == "main"


# -- timeline --------------------------------------------------------------------------------

def test_timeline_matches_the_step(analysis):
    a = analysis("k3_bs1_base_a")
    tl = step_timeline(a)
    raw = a.path.filter(pl.col("step") == tl.step)
    t0 = raw["start"].min()
    assert tl.kernels["start_us"].min() == 0.0
    assert tl.span_us == pytest.approx((raw["end"].max() - t0) / 1e3)
    on = [r for r in raw.to_dicts() if r["on_path"]]
    assert tl.path.height == len(on)
    assert tl.bubbles["wait_us"].sum() == pytest.approx(sum(r["bubble_ns"] for r in on) / 1e3)
    ids = set(raw["kernel_id"].to_list())
    assert tl.pdl_edges.height == sum(1 for r in raw.to_dicts() if r["pdl"] and r["pred"] in ids)
    extents: dict[int, list] = {}
    for r in raw.to_dicts():
        if r["layer"] is not None:
            lo, hi = extents.get(r["layer"], (r["start"], r["end"]))
            extents[r["layer"]] = (min(lo, r["start"]), max(hi, r["end"]))
    assert tl.layers["layer"].to_list() == sorted(extents)
    for r in tl.layers.to_dicts():
        assert (r["start_us"], r["end_us"]) == pytest.approx(tuple((x - t0) / 1e3 for x in extents[r["layer"]]))


# -- per layer, distributions, PDL pairs -----------------------------------------------------------

def test_layer_family_table(analysis):
    a = analysis("k3_bs1_base_a")
    per: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    steps = set()
    for r in a.path.to_dicts():
        steps.add(r["step"])
        if r["layer"] is not None:
            cell = per[(r["layer"], r["family"])][r["step"]]
            cell[0] += r["end"] - r["start"]
            cell[1] += r["critical_ns"]
    got = {(r["layer"], r["family"]): r for r in layer_family_table(a.path).to_dicts()}
    assert set(got) == set(per)
    for key, by_step in per.items():
        kernel = statistics.median(by_step.get(s, [0, 0])[0] for s in steps) / 1e3
        critical = statistics.median(by_step.get(s, [0, 0])[1] for s in steps) / 1e3
        assert got[key]["kernel_us"] == pytest.approx(kernel) and got[key]["critical_us"] == pytest.approx(critical)


def test_histogram_on_shared_bins():
    old, new = [1.0, 2.0, 2.5, 9.0], [4.0, 10.0, 10.0]
    h = histogram({"old": old, "new": new}, bins=3)
    edges = [1.0, 4.0, 7.0, 10.0]
    for side, values in (("old", old), ("new", new)):
        part = h.filter(pl.col("series") == side)
        assert part["left"].to_list() == pytest.approx(edges[:-1]) and part["right"].to_list() == pytest.approx(edges[1:])
        expected = [0, 0, 0]
        for v in values:  # the last bin holds its right edge
            expected[min(bisect.bisect_right(edges, v) - 1, 2)] += 1
        assert part["count"].to_list() == expected
    one = histogram({"x": [5.0, 5.0]})
    assert one["count"].to_list() == [2] and one["left"][0] < 5.0 < one["right"][0]
    assert histogram({"x": []}).is_empty()


def test_steps_in_us_keep_the_dropped_ones(analysis):
    a = analysis("small_inside_a")
    s = steps_us(a.steps)
    assert s.height == a.steps.height
    assert (s["status"] == "stable").sum() == a.stable_steps
    dropped = {r: n for r, n in s.filter(pl.col("status") != "stable").group_by("status").len().iter_rows()}
    assert dropped == a.dropped


def test_pdl_pairs(trace_sqlite, analysis):
    a = analysis("k3_bs1_base_a")
    n = a.stable_steps
    # Same-stream neighbours of the stable steps, from the path frame's raw rows.
    by_stream = defaultdict(list)
    for r in a.path.to_dicts():
        by_stream[(r["step"], r["stream_id"])].append(r)
    pairs: dict[tuple, list] = defaultdict(list)
    for rows in by_stream.values():
        rows.sort(key=lambda r: r["start"])
        for prev, cur in zip(rows, rows[1:]):
            pairs[(prev["name"], cur["name"], cur["family"])].append(cur["start"] - prev["end"])
    t = {(r["producer"], r["dependent"], r["family"]): r for r in edge_table(a.path, a.config, n).to_dicts()}
    assert set(t) == set(pairs)
    limit = a.config.pdl_max_gap_ns
    for key, gaps in pairs.items():
        pdl = [g for g in gaps if g <= limit]
        assert t[key]["pairs_per_step"] == pytest.approx(len(gaps) / n)
        assert t[key]["pdl_per_step"] == pytest.approx(len(pdl) / n)
        other = [g for g in gaps if g > limit]
        assert t[key]["gap_us_median"] == (pytest.approx(statistics.median(other) / 1e3) if other else None)
    total = sum(r["pdl_per_step"] for r in t.values())
    assert total == pytest.approx(a.pdl_steps["pdl_edges"].mean())


# -- diff ------------------------------------------------------------------------------------

def test_diff_sides_and_waterfall(analysis):
    old, new = analysis("k3_bs1_no_attn_forks"), analysis("k3_bs1_base_a")
    d = diff([old], [new])
    pre = sides.pre_attention_by_layer(old, new)
    o, n = old.pre_attention_by_layer(), new.pre_attention_by_layer()
    assert pre["layer"].to_list() == o["layer"].to_list() == n["layer"].to_list() == [4, 8]
    for r, ro, rn in zip(pre.to_dicts(), o.to_dicts(), n.to_dicts()):
        assert (r["old_us"], r["new_us"]) == (ro["median_us"], rn["median_us"])
        assert r["delta_us"] == pytest.approx(rn["median_us"] - ro["median_us"])
    dists = sides.step_distributions([old], [new])
    for metric in ("period", "span"):
        h = dists[metric]
        for side, a in (("old", old), ("new", new)):
            assert h.filter(pl.col("series") == side)["count"].sum() == a.step_times[metric].drop_nulls().len()
        assert h.filter(pl.col("series") == "old")["left"].to_list() == h.filter(pl.col("series") == "new")["left"].to_list()
    assert sides.central([old], "span") == old.step_stats["span"]["median"]
    w = d.waterfall(top=4)
    rel = w.filter(pl.col("kind") == "relative")
    assert w["change_us"][0] == 0.0 and w["change_us"][-1] == pytest.approx(d.span_delta_us)
    assert rel["change_us"].sum() == pytest.approx(d.span_delta_us, abs=1e-6)
    edits = w.filter(pl.col("edit").is_not_null())
    assert edits.height == 4
    top = d.attribution.head(4)
    assert edits["edit"].to_list() == top["edit"].to_list() and edits["layers"].to_list() == top["layers"].to_list()
    fam = sides.family_changes(d.families)
    for r in fam.to_dicts():
        assert r["device_busy_us_delta"] == pytest.approx(r["device_busy_us_new"] - r["device_busy_us_old"])


def test_diff_json_counts_edits_by_kind(analysis):
    d = diff([analysis("k3_bs1_no_attn_forks")], [analysis("k3_bs1_base_a")])
    j = d.to_json()
    assert j["version"] == 3
    for row in j["attribution"]:
        assert sum(row["kinds"].values()) == row["edits"]
        assert " + ".join(k for k in row["kind"].split(" + ")) == row["kind"]
        assert set(row["kinds"]) == set(row["kind"].split(" + "))
        assert row["details"] == sorted(set(x for x in row["detail"].split(", ") if x))
        assert isinstance(row["layers"], list)
