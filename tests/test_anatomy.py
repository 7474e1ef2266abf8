"""Segment anatomy (k3trace/analyses/anatomy.py) on bundled H200 recordings: our K3 path at
c72 (CUDA graph, PDL chains, two side streams) and a transformers Llama decode (code nobody
here wrote, one CUDA graph, labelled by its module ranges).

The segments, their kernel sequences, kinds and per-position medians are recomputed from
tests/reference.py (plain Python over the raw SQLite rows: stable steps, labels, kernels in
capture order). The critical-path columns are aggregated here with plain loops from the
analysis' own path frame (the walk itself is tested in test_analyze_real / test_critical_path).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import pytest

CASES = ["k3_bs1_c72", "hf_base_a"]


@pytest.fixture(scope="module")
def made(analysis, reference_of):
    """name -> (the analysis, its anatomy over every stable step, the reference)."""
    from k3trace.analyses.anatomy import segment_anatomy

    def get(name):
        a = analysis(name)
        return a, segment_anatomy(a.path, a.graph.nodes, max_steps=10**9), reference_of(name)

    return get


def raw_segments(ref):
    """(step first start, layer, family) -> its kernels in capture order."""
    segs = defaultdict(list)
    for step in ref.stable:
        for k in step.kernels:
            if k.layer is not None and k.family is not None:
                segs[(step.first, k.layer, k.family)].append(k)
    return segs


def raw_kinds(segs):
    """family -> [(sequence, [segment keys])], most frequent first, ties by the sequence."""
    by = defaultdict(lambda: defaultdict(list))
    for key, ks in segs.items():
        by[key[2]]["\x1f".join(k.name for k in ks)].append(key)
    return {fam: sorted(seqs.items(), key=lambda kv: (-len(kv[1]), kv[0])) for fam, seqs in by.items()}


@pytest.mark.parametrize("name", CASES)
def test_kinds_and_medians_match_the_raw_rows(made, name):
    _, anatomy, ref = made(name)
    segs = raw_segments(ref)
    kinds = raw_kinds(segs)
    assert kinds, "the recording has labelled segments"
    got_kinds = {(r["family"], r["kind"]): r for r in anatomy.kinds.iter_rows(named=True)}
    assert len(got_kinds) == sum(len(v) for v in kinds.values())
    rows = {(r["family"], r["kind"], r["position"]): r for r in anatomy.kernels.iter_rows(named=True)}
    assert len(rows) == sum(len(seq.split("\x1f")) for v in kinds.values() for seq, _ in v)
    for fam, seqs in kinds.items():
        total = sum(len(keys) for _, keys in seqs)
        for kind, (seq, keys) in enumerate(seqs):
            g = got_kinds[(fam, kind)]
            assert g["kernels"] == len(seq.split("\x1f"))
            assert g["segments_per_step"] == pytest.approx(len(keys) / len(ref.stable), rel=1e-12)
            assert g["share"] == pytest.approx(len(keys) / total, rel=1e-12)
            spans = [max(k.end for k in segs[key]) - min(k.start for k in segs[key]) for key in keys]
            assert g["span_us"] == pytest.approx(statistics.median(spans) / 1e3, rel=1e-9)
            for pos, kname in enumerate(seq.split("\x1f")):
                r = rows[(fam, kind, pos)]
                assert r["name"] == kname
                t0 = {key: min(k.start for k in segs[key]) for key in keys}
                start = statistics.median(segs[key][pos].start - t0[key] for key in keys)
                end = statistics.median(segs[key][pos].end - t0[key] for key in keys)
                dur = statistics.median(segs[key][pos].dur for key in keys)
                assert (r["start_us"], r["end_us"], r["duration_us"]) == pytest.approx(
                    (start / 1e3, end / 1e3, dur / 1e3), rel=1e-9, abs=1e-9), (fam, kind, pos, kname)


@pytest.mark.parametrize("name", CASES)
def test_critical_columns_are_the_path_rows_per_position(made, name):
    a, anatomy, _ = made(name)
    per = defaultdict(list)
    for r in a.path.sort("step", "layer", "family", "launch_rank").iter_rows(named=True):
        if r["layer"] is not None and r["family"] is not None:
            per[(r["step"], r["layer"], r["family"])].append(r)
    seq_count = Counter()
    for key, ks in per.items():
        seq_count[(key[2], tuple(k["name"] for k in ks))] += 1
    dominant = {}
    for (fam, seq), n in sorted(seq_count.items(), key=lambda kv: (-kv[1], "\x1f".join(kv[0][1]))):
        dominant.setdefault(fam, (seq, n))  # the most frequent; ties: the lower sequence
    got = {(r["family"], r["position"]): r for r in anatomy.dominant().iter_rows(named=True)}
    for fam, (seq, n) in dominant.items():
        segs = [ks for key, ks in per.items() if key[2] == fam and tuple(k["name"] for k in ks) == seq]
        assert len(segs) == n
        for pos in range(len(seq)):
            on = sum(bool(ks[pos]["on_path"]) for ks in segs) / n
            crit = sum(ks[pos]["critical_ns"] for ks in segs) / n / 1e3
            r = got[(fam, pos)]
            assert r["on_path_share"] == pytest.approx(on, rel=1e-12, abs=1e-12)
            assert r["critical_us"] == pytest.approx(crit, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("most", [None, 4])
def test_the_analysis_reads_evenly_spaced_steps(made, name, most):
    """The anatomy reads at most MAX_STEPS stable steps (analyze's; or `max_steps`), evenly spaced from the
    first to the last (index round(i (n - 1) / (most - 1))), plus the representative step its roles come
    from: the same numbers as the anatomy of those steps alone, roles included."""
    from k3trace.analyses.anatomy import MAX_STEPS, segment_anatomy

    a, full, ref = made(name)
    got = a.anatomy if most is None else segment_anatomy(a.path, a.graph.nodes, max_steps=most)
    most = most or MAX_STEPS
    n = len(ref.stable)
    assert n > MAX_STEPS, "the case must need the sampling"
    firsts = [s.first for s in ref.stable]  # time order
    wanted = {firsts[round(i * (n - 1) / (most - 1))] for i in range(most)}
    wanted.add(int(a.step_times.filter(a.step_times["step"] == a.representative_step())["first_start"][0]))
    ids = a.step_times.filter(a.step_times["first_start"].is_in(sorted(wanted)))["step"]
    assert ids.len() == len(wanted)
    alone = segment_anatomy(a.path.filter(a.path["step"].is_in(ids.implode())), a.graph.nodes, max_steps=10**9)
    assert got.kinds.equals(alone.kinds) and got.kernels.equals(alone.kernels)
    assert got.kernels["role"].null_count() == 0
    assert not got.kernels.equals(full.kernels)  # the sampling changed the medians somewhere


def test_k3_roles_follow_the_capture_streams(made):
    """c72's KDA segment: the gate GEMVs on the side stream between qkvg and kda_step, the rest on main;
    the MLA KV leg and g_proj on two side streams (the plan in kernels/README.md)."""
    a, _, _ = made("k3_bs1_c72")
    d = a.anatomy.dominant()
    kda = d.filter(d["family"] == "kda")
    assert kda["name"].to_list()[0] == "skinny_mm_kernel" and kda["name"].to_list()[3] == "kda_step_kernel"
    roles = kda["role"].to_list()
    assert roles[0] == roles[3] == roles[4] == "main" and roles[1] == roles[2] != "main"
    mla = d.filter(d["family"] == "mla")
    side = mla.filter(mla["role"] != "main")
    assert set(side["role"]) == {"side 1", "side 2"} and side.height == 5  # kv_a, its reduce, norm; g_proj, reduce
    assert mla.filter(mla["name"] == "mla_decode_fmha_kernel")["role"].to_list() == ["main"]


def test_llama_segments_are_its_modules(made):
    """The transformers Llama: attention and MLP segments, every layer alike (one kind each, per step as
    many as the model has layers), its kernels all on one stream."""
    a, _, ref = made("hf_base_a")
    kinds = a.anatomy.kinds
    layers = {k.layer for k in ref.stable[0].kernels if k.family == "mlp"}
    for fam in ("attn", "mlp"):
        row = kinds.filter((kinds["family"] == fam) & (kinds["kind"] == 0)).row(0, named=True)
        assert row["segments_per_step"] == len(layers) and row["share"] == 1.0
    assert set(a.anatomy.kernels["role"].drop_nulls()) <= {"main"}


def test_json_terminal_and_html_carry_it(made, tmp_path):
    from k3trace.render.html import write_analysis_page
    from k3trace.render.terminal import anatomy_table
    from rich.console import Console

    a, _, _ = made("k3_bs1_c72")
    j = a.to_json()["segment_anatomy"]
    assert {r["family"] for r in j["kinds"]} == set(a.families["family"])
    assert len(j["kernels"]) == a.anatomy.kernels.height
    console = Console(width=160, record=True)
    console.print(anatomy_table(a))
    text = console.export_text()
    assert "segment anatomy" in text and "kda_step_kernel" in text and "side 1" in text
    page = tmp_path / "a.html"
    write_analysis_page(a, page)
    assert "Segment anatomy" in page.read_text()


def test_equal_kinds_are_numbered_by_their_sequence():
    """Two kinds as frequent as each other: kind 0 is the one whose name sequence sorts first, in whatever
    order the segments come (the numbering must not vary from run to run)."""
    import polars as pl

    from k3trace.analyses.anatomy import segment_anatomy

    def path(layers_first):
        rows = []
        for step in (1, 2):
            for layer in layers_first:
                names = ["b_kernel", "a_kernel"] if layer % 2 else ["a_kernel"]
                for rank, name in enumerate(names):
                    t = step * 1000 + layer * 100 + rank * 10
                    rows.append({"kernel_id": len(rows), "step": step, "layer": layer, "family": "f", "name": name,
                                 "launch_rank": layer * 10 + rank, "start": t, "end": t + 5, "on_path": True,
                                 "critical_ns": 5})
        return pl.DataFrame(rows)

    for order in ((1, 2), (2, 1)):
        kinds = segment_anatomy(path(order)).kinds
        assert kinds["kind"].to_list() == [0, 1] and kinds["kernels"].to_list() == [1, 2]
        assert kinds["segments_per_step"].to_list() == [1.0, 1.0] and kinds["share"].to_list() == [0.5, 0.5]


def test_vllm_gpt_oss_on_mi300x_has_its_two_attention_kinds(tmp_path):
    """A public torch.profiler trace of vLLM serving gpt-oss on an MI300X (one graph replay, layers inferred,
    nothing of ours): its decoder layers alternate full attention (kernel_unified_attention_3d, then
    reduce_segments) and sliding-window attention (kernel_unified_attention_2d). Each attention kernel is
    in the segments of the attention family's kinds as often as in the raw replay, its most frequent kind
    holds the full-attention pair in order, and where one kind holds them all (the 3d kernel) its median
    duration is the raw events'."""
    from test_kineto import ns, public, raw_events, replays

    from k3trace.analyses import analyze
    from k3trace.config import load_config
    from k3trace.ingest import load_report

    path = public("tracelens_vllm_decode_full_graph_mi300x.json.gz")
    [run] = replays(raw_events(path))
    durations = defaultdict(list)
    for e in run:
        durations[e["name"].removeprefix("void ").split("(")[0].split("<")[0]].append(ns(e["dur"]))
    cfg = tmp_path / "w0.toml"
    cfg.write_text("[steps]\nwarmup = 0\n")
    a = analyze(load_report(path), load_config(cfg))
    kinds, kernels = a.anatomy.kinds, a.anatomy.kernels
    attention = kernels.filter(kernels["family"] == "attention").join(kinds, on=["family", "kind"])
    for name in ("kernel_unified_attention_3d", "kernel_unified_attention_2d"):
        holding = attention.filter(attention["name"] == name)
        assert holding["segments_per_step"].sum() == len(durations[name]) > 1
    full = attention.filter(attention["name"] == "kernel_unified_attention_3d").row(0, named=True)
    assert full["segments_per_step"] == len(durations["kernel_unified_attention_3d"])  # one kind holds them all
    assert full["duration_us"] == pytest.approx(statistics.median(durations["kernel_unified_attention_3d"]) / 1e3,
                                                rel=1e-9)
    names = attention.filter(attention["kind"] == full["kind"])["name"].to_list()
    assert names[names.index("kernel_unified_attention_3d") + 1] == "reduce_segments"
    assert kinds.filter(kinds["family"] == "attention")["segments_per_step"].sum() == 24  # gpt-oss-20b's layers
