"""Layer labels on serving-engine traces (issue 10), on real H200 recordings of transformers'
Llama (kernels/hf_llama.py: 8 layers, bs1, one CUDA graph) with layerwise NVTX in each
engine's format, and on the K3 decode path.

Expected labels come from the raw SQLite rows: tests/reference.py (plain Python, the
engines' documented module-path layout, the settings in defaults.toml), or a hand-written
rule set below; never from k3trace itself.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import reference as ref_mod
from k3trace.analyses import analyze
from k3trace.analyses.pipeline import label_donor
from k3trace.config import load_config
from k3trace.ingest import load_report

ENGINE_INSIDE = ["hf_vllm_inside", "hf_trtllm_inside"]
K3 = ["k3_bs1_base_a", "k3_bs1_base_b", "k3_bs1_base_before", "k3_bs1_mla_split", "k3_bs1_no_attn_forks",
      "k3_bs1_router_multipass", "k3_bs1_kda_norm_separate", "k3_bs1_residual_separate", "k3_bs1_kda_cute",
      "k3_bs1_delay_kda_step", "k3_bs8_base", "k3_bs8_mla_split"]
LAYERS = 8   # kernels/hf_llama.py and the K3 fixtures: 8 decoder layers


def key(k):
    return (k.start, k.end, k.stream, k.corr)


def labels_of(a) -> dict:
    return {(r["start"], r["end"], r["stream_id"], r["correlation_id"]): r
            for r in a.kernels.select("start", "end", "stream_id", "correlation_id", "layer", "family",
                                      "label_source").to_dicts()}


def assert_labels_equal(a, ref):
    """Every kernel's (layer, family, source) equals the reference's, kernel by kernel."""
    got = labels_of(a)
    assert len(got) == len(ref.kernels)
    bad = []
    for k in ref.kernels:
        r = got[key(k)]
        mine = (r["layer"], r["family"] if k.source != "unlabelled" else None, r["label_source"])
        if mine != (k.layer, k.family, k.source):
            bad.append((k.name, k.start, mine, (k.layer, k.family, k.source)))
    assert not bad, f"{len(bad)} kernels labelled differently, first: {bad[:3]}"
    assert a.label_sources == ref.label_sources


def copy_of(trace_sqlite, tmp_path: Path, name: str) -> Path:
    out = tmp_path / f"{name}.sqlite"
    shutil.copyfile(trace_sqlite(name), out)
    out.chmod(0o644)
    return out


@pytest.fixture(scope="session")
def donor(trace_sqlite):
    """The eager-only recording (--enforce-eager style), as k3trace's donor and as the reference's."""
    path = trace_sqlite("hf_vllm_eager_donor")
    return label_donor(analyze(load_report(path), load_config())), ref_mod.donor_step(ref_mod.compute(path))


# ----------------------------------------------------------------------------- module paths

@pytest.mark.parametrize("name", ENGINE_INSIDE + ["hf_vllm_before_eager", "hf_vllm_eager_donor"])
def test_module_labels_match_reference(analysis, trace_sqlite, name):
    """Module-path ranges, captured inside the window (graph_capture), around eager launches
    (module) and aligned from two eager steps onto replays captured before the window."""
    a = analysis(name)
    ref = ref_mod.compute(trace_sqlite(name))
    assert_labels_equal(a, ref)
    layered = [k for k in ref.kernels if k.layer is not None]
    assert {k.layer for k in layered} == set(range(LAYERS))
    assert {k.family for k in layered} == {"attention", "dense", "other"}
    want_source = {"hf_vllm_before_eager": "aligned_eager", "hf_vllm_eager_donor": "module"}.get(name, "graph_capture")
    replayed = [k for s in ref.steps for k in s.kernels]
    assert all(k.source == want_source for k in (replayed or layered) if k.layer is not None)


#: What an engineer would configure by hand for a vLLM trace of transformers' Llama: the
#: innermost `top.model.layers.N[.child...]` range, `self_attn` -> attention, `mlp` -> dense,
#: anything else under the layer (norms, and the layer's own residual adds) -> other.
HAND_PATH = re.compile(r"^\{'Module': 'top\.model\.layers\.(\d+)(?:\.(\w+))?[\w.]*', 'TrainableParams'")
HAND_FAMILY = {"self_attn": "attention", "mlp": "dense"}
HAND_CONFIG = r"""
[labels]
module_pattern = '^\{\x27Module\x27: \x27(?P<prefix>top\.model\.)layers\.(?P<index>\d+)(?P<rest>(\.\w+)*)\x27, \x27TrainableParams\x27'
[[labels.modules]]
pattern = '^self_attn$'
family = "attention"
[[labels.modules]]
pattern = '^mlp$'
family = "dense"
"""


def hand_labels(path: Path) -> dict:
    """(start, end, stream, correlation) -> (layer, family) of each replay kernel, from the
    hand-written rule over the innermost range open at its graph node's creation."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    ranges = []
    for start, end, text, text_id in db.execute("SELECT start, end, text, textId FROM NVTX_EVENTS"):
        m = HAND_PATH.match(text if text is not None else strings[text_id])
        if m and end is not None and end > start:
            ranges.append((start, end, int(m.group(1)), HAND_FAMILY.get(m.group(2), "other")))
    created = {node: start for start, node, orig in db.execute(
        "SELECT start, graphNodeId, originalGraphNodeId FROM CUDA_GRAPH_EVENTS") if orig is None}
    origin = {node: orig for node, orig in db.execute(
        "SELECT graphNodeId, originalGraphNodeId FROM CUDA_GRAPH_EVENTS WHERE originalGraphNodeId IS NOT NULL")}
    out = {}
    for start, end, stream, corr, node in db.execute(
            "SELECT start, end, streamId, correlationId, graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL "
            "WHERE graphNodeId IS NOT NULL"):
        t = created.get(origin.get(node))
        inner = max((r for r in ranges if r[0] <= t <= r[1]), default=None, key=lambda r: r[0]) if t else None
        out[(start, end, stream, corr)] = (inner[2], inner[3]) if inner else (None, None)
    db.close()
    return out


def test_zero_config_equals_hand_written_config(analysis, trace_sqlite, tmp_path):
    path = trace_sqlite("hf_vllm_inside")
    want = hand_labels(path)
    assert sum(1 for v in want.values() if v[0] is not None) == 60 * LAYERS * 50   # replays x layers x kernels
    for a in (analysis("hf_vllm_inside"), analyze(load_report(path), load_config(_write(tmp_path, HAND_CONFIG)))):
        got = labels_of(a)
        bad = [(k, v, (got[k]["layer"], got[k]["family"])) for k, v in want.items()
               if v[0] is not None and (got[k]["layer"], got[k]["family"]) != v]
        assert not bad, f"{len(bad)} kernels differ from the hand-written labels, first {bad[:3]}"
        unlabelled = [k for k, v in want.items() if v[0] is None]
        assert all(got[k]["layer"] is None for k in unlabelled)
    assert analysis("hf_vllm_inside").label_summary.convention == "vllm"


def _write(tmp_path: Path, text: str) -> Path:
    out = tmp_path / "hand.toml"
    out.write_text(text)
    return out


def test_module_layers_agree_with_own_format_recording(trace_sqlite):
    """The same model recorded with k3trace's own ranges (hf_base_a: `layer.<i>.attn` from the
    decoder layer's start, `layer.<i>.mlp` from its post-attention norm) and with vLLM's module
    tree (hf_vllm_inside): kernel for kernel in capture order, the same layer; the attention
    module's kernels inside `attn`, the MLP's inside `mlp`."""
    own = ref_mod.compute(trace_sqlite("hf_base_a")).stable[0].kernels
    mod = ref_mod.compute(trace_sqlite("hf_vllm_inside")).stable[0].kernels
    assert [k.name for k in own] == [k.name for k in mod]
    for o, m in zip(own, mod):
        if m.layer is not None:
            assert o.layer == m.layer
            assert (m.family, o.family) in {("attention", "attn"), ("dense", "mlp"), ("other", "attn"),
                                            ("other", "mlp")}
        else:
            assert o.layer in (None, LAYERS) and o.family in (None, "head")   # embedding, final norm, LM head


# ----------------------------------------------------------------------------- donor

@pytest.mark.parametrize("name", ["hf_sglang_before", "hf_nonvtx_before", "hf_before_base_b"])
def test_labels_from_eager_recording(trace_sqlite, donor, name):
    """Graphs captured before the window (SGLang format, no NVTX at all, own format without an
    eager step) take their labels from a separate eager recording (`--labels-from`)."""
    lent, ref_donor = donor
    path = trace_sqlite(name)
    a = analyze(load_report(path), load_config(), donor=lent)
    ref = ref_mod.compute(path, donor=ref_donor)
    assert_labels_equal(a, ref)
    assert ref.label_sources["donor"] == 60 * LAYERS * 50
    assert a.label_summary.donor == "hf_vllm_eager_donor.sqlite" and a.label_summary.donor_coverage == 1.0


def test_labels_from_cli(trace_sqlite, tmp_path):
    import json

    done = run_cli("analyze", str(trace_sqlite("hf_sglang_before")), "--json", "--no-cache",
                   "--labels-from", str(trace_sqlite("hf_vllm_eager_donor")))
    assert done.returncode == 0, done.stderr
    j = json.loads(done.stdout)
    assert j["labels"]["sources"]["donor"] == 60 * LAYERS * 50 and j["labels"]["convention"] == "sglang"
    assert [lay["index"] for lay in j["layers"]] == list(range(LAYERS))
    done = run_cli("diff", str(trace_sqlite("hf_sglang_before")), str(trace_sqlite("hf_nonvtx_before")), "--json",
                   "--no-cache", "--labels-from", str(trace_sqlite("hf_vllm_eager_donor")))
    assert done.returncode == 0, done.stderr
    assert {f["name"] for f in json.loads(done.stdout)["families"]} >= {"attention", "dense", "other"}
    # A donor without layer labels, and a missing one: one line naming the fix, exit 2.
    for donor_path in (trace_sqlite("hf_nonvtx_before"), tmp_path / "missing.sqlite"):
        done = run_cli("analyze", str(trace_sqlite("hf_sglang_before")), "--no-cache", "--labels-from", str(donor_path))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--labels-from" in done.stderr


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k3trace.cli", *args], capture_output=True, text=True, timeout=300)


# ----------------------------------------------------------------------------- inferred

def stripped(trace_sqlite, tmp_path: Path, name: str) -> Path:
    path = copy_of(trace_sqlite, tmp_path, name)
    db = sqlite3.connect(path)
    db.execute("DELETE FROM NVTX_EVENTS")
    db.commit()
    db.close()
    return path


def agreement(a, ref) -> float:
    """Share of the replays' kernel time whose (layer, family) equals the reference's."""
    got = labels_of(a)
    total = same = 0
    for s in ref.steps:
        for k in s.kernels:
            r = got[key(k)]
            total += k.dur
            same += k.dur * ((r["layer"], r["family"]) == (k.layer, k.family))
    return same / total


@pytest.mark.parametrize("name", K3)
def test_inferred_layers_on_k3_without_nvtx(trace_sqlite, tmp_path, name):
    """With every NVTX range removed, the layers and families inferred from the kernel
    sequence agree with the original labels (as reference.py reads them from the original
    file) for at least 98% of the replays' kernel time."""
    ref = ref_mod.compute(trace_sqlite(name))
    a = analyze(load_report(stripped(trace_sqlite, tmp_path, name)), load_config())
    assert a.label_sources["nvtx"] == a.label_sources["graph_capture"] == 0
    assert agreement(a, ref) >= 0.98
    [unit] = a.label_summary.inferred
    assert unit["layers"] == LAYERS and unit["kinds"] == 3   # KDA+dense, KDA+MoE, MLA+MoE
    assert any("layers inferred" in n for n in a.notes)


@pytest.mark.parametrize("name", ["hf_sglang_before", "hf_nonvtx_before", "hf_before_base_b"])
def test_inferred_layers_on_llama(analysis, trace_sqlite, name):
    """No label reaches these replays: inferred layers agree, kernel for kernel in capture
    order, with the module-path layers of the same model recorded with vLLM's ranges."""
    a = analysis(name)
    truth = ref_mod.compute(trace_sqlite("hf_vllm_inside")).stable[0].kernels
    step = a.kernels.filter(a.kernels["step"] == a.representative_step()).sort("launch_rank")
    assert step["name"].to_list() == [k.name for k in truth]
    offset = 0 if a.label_summary.convention in ("sglang", "vllm") else 1   # K3 counts layers from 1
    got = [None if x is None else x - offset for x in step["layer"].to_list()]
    assert got == [k.layer for k in truth]
    # The attention module's kernels fall in the inferred attention segment, the MLP's in the
    # dense one (the inferred segments also hold the norms and residual adds around them).
    for family, k in zip(step["family"].to_list(), truth):
        if k.family in ("attention", "dense"):
            assert family == k.family
    assert a.label_summary.inferred[0]["kinds"] == 1


# ----------------------------------------------------------------------------- K3 in engine style

def engine_style(trace_sqlite, tmp_path: Path, name: str) -> Path:
    """A K3 recording whose own layer ranges are rewritten the way the engine ports name the
    modules (ENGINES.md): KDA and MLA both `self_attn`, MoE `block_sparse_moe`, layer 1's MLP
    `mlp`, the attention residuals `attn_res`, under a range for the whole decoder layer, each
    module followed by an output range; layers from 0 in vLLM's `top.model.layers.N`."""
    path = copy_of(trace_sqlite, tmp_path, name)
    db = sqlite3.connect(path)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    child = {"kda": "self_attn", "mla": "self_attn", "moe": "block_sparse_moe", "dense": "mlp", "attn_res": "attn_res"}
    rows = db.execute("SELECT rowid, start, end, text, textId, globalTid FROM NVTX_EVENTS WHERE eventType = 59").fetchall()
    spans: dict[tuple, list] = {}
    for rowid, start, end, text, text_id, tid in sorted(rows, key=lambda r: r[1]):
        m = re.fullmatch(r"layer\.(\d+)\.(\w+)", text if text is not None else strings.get(text_id, ""))
        if not m:
            continue
        layer = int(m.group(1)) - 1
        module = f"top.model.layers.{layer}.{child[m.group(2)]}"
        db.execute("UPDATE NVTX_EVENTS SET text = ?, textId = NULL WHERE rowid = ?",
                   (str({"Module": module, "TrainableParams": {}, "Inputs": [[1, 7168]]}), rowid))
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                   (end + 1, end + 3001, str({"Module": module, "Outputs": [[1, 7168]]}), tid))
        run = spans.setdefault((tid, layer), [])
        if run and start - run[-1][1] < 1_000_000:   # the same pass through the layer
            run[-1][1] = end
        else:
            run.append([start, end])
    for (tid, layer), runs in spans.items():
        for start, end in runs:
            db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                       (start - 1, end + 1, str({"Module": f"top.model.layers.{layer}", "TrainableParams": {},
                                                 "Inputs": [[1, 7168]]}), tid))
    db.commit()
    db.close()
    return path


@pytest.mark.parametrize("name", ["k3_bs1_base_a", "k3_bs8_base"])
def test_k3_engine_style_modules_split_kda_from_mla(trace_sqlite, tmp_path, name):
    """`self_attn` holds KDA in some layers and MLA in others: the kernels inside decide."""
    ref = ref_mod.compute(trace_sqlite(name))
    path = engine_style(trace_sqlite, tmp_path, name)
    a = analyze(load_report(path), load_config())
    assert a.label_summary.convention == "vllm" and a.completeness.ok, a.completeness.problems
    got = labels_of(a)
    want_family = {"kda": "kda", "mla": "mla", "moe": "moe", "dense": "dense", "attn_res": "attn_res"}  # defaults.toml maps attn_res modules
    bad = [(k.name, k.layer, k.family, got[key(k)]["layer"], got[key(k)]["family"]) for k in ref.kernels
           if k.layer is not None and (got[key(k)]["layer"], got[key(k)]["family"]) != (k.layer - 1, want_family[k.family])]
    assert not bad, f"{len(bad)} kernels differ, first {bad[:3]}"
    assert {r["name"]: r["segments_per_step"] for r in a.to_json()["families"]}.items() >= \
        {"kda": 6.0, "mla": 2.0, "moe": 7.0, "dense": 1.0}.items()


# ----------------------------------------------------------------------------- steps, completeness

@pytest.mark.parametrize("text,form", [("decode_step {i}", "decode_step N"), ("scheduler.run_batch", None),
                                        ("[Executor] _forward_step {i}: 0 ctx reqs, 1 gen reqs", None)])
def test_step_ranges_searched(trace_sqlite, tmp_path, text, form):
    """The eager-only recording's step ranges renamed to a user's `decode_step 7` or another
    engine's form: still 20 steps, and the report says which form matched."""
    path = copy_of(trace_sqlite, tmp_path, "hf_vllm_eager_donor")
    db = sqlite3.connect(path)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    rows = db.execute("SELECT rowid, text, textId FROM NVTX_EVENTS ORDER BY start").fetchall()
    steps = [r[0] for r in rows if (r[1] or strings.get(r[2], "")).startswith("execute_context_")]
    for i, rowid in enumerate(steps):
        db.execute("UPDATE NVTX_EVENTS SET text = ?, textId = NULL WHERE rowid = ?", (text.format(i=i), rowid))
    db.commit()
    db.close()
    j = analyze(load_report(path), load_config()).to_json()
    assert len(steps) == 20 and j["steps"]["source"] == "nvtx" and j["steps"]["total"] == 20
    assert j["steps"]["nvtx_range"]["form"] == (form or text.replace("{i}", "N")).replace("0", "N").replace("1", "N")
    assert j["labels"]["sources"]["module"] == 20 * LAYERS * 50


def test_a_range_around_the_whole_loop_is_no_piecewise_step(trace_sqlite, tmp_path):
    """A user's `decode_step` range around the whole decode loop holds every replay, all of one
    graph: a loop, not piecewise graphs (whose ranges hold pieces of several graphs). Each
    replay stays a step. (The recording's own per-step ranges are taken out first.)"""
    path = copy_of(trace_sqlite, tmp_path, "hf_base_a")
    db = sqlite3.connect(path)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    own = [rowid for rowid, text, text_id in db.execute("SELECT rowid, text, textId FROM NVTX_EVENTS")
           if (text or strings.get(text_id, "")).startswith("decode_step")]
    db.executemany("DELETE FROM NVTX_EVENTS WHERE rowid = ?", [(r,) for r in own])
    replays, tid, first, last = db.execute(
        "SELECT COUNT(DISTINCT r.correlationId), MIN(r.globalTid), MIN(r.start), MAX(r.end) "
        "FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
        "ON k.correlationId = r.correlationId WHERE k.graphNodeId IS NOT NULL").fetchone()
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
               (first - 1, last + 1, "decode_step", tid))
    db.commit()
    db.close()
    a = analyze(load_report(path), load_config())
    assert len(own) == 60 and replays > 50 and a.step_source == "graph" and a.steps.height == replays


def test_aligned_eager_found_by_content(trace_sqlite, tmp_path):
    """The two annotated eager steps lend their labels whatever their step range is called,
    and with none at all."""
    ref = ref_mod.compute(trace_sqlite("hf_vllm_before_eager"))
    for rename in ("my_step", None):
        path = copy_of(trace_sqlite, tmp_path, "hf_vllm_before_eager")
        db = sqlite3.connect(path)
        if rename is None:
            db.execute("DELETE FROM NVTX_EVENTS WHERE text LIKE 'execute_%'")
        else:
            db.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text LIKE 'execute_%'", (rename,))
        db.commit()
        db.close()
        a = analyze(load_report(path), load_config())
        assert a.label_sources["aligned_eager"] == ref.label_sources["aligned_eager"] == 60 * LAYERS * 50
        got = labels_of(a)
        assert all((got[key(k)]["layer"], got[key(k)]["family"]) == (k.layer, k.family)
                   for s in ref.steps for k in s.kernels if k.layer is not None)


@pytest.mark.parametrize("name", ENGINE_INSIDE + ["hf_vllm_before_eager", "hf_vllm_eager_donor"])
def test_output_ranges_are_not_missing_data(analysis, name):
    """Each module's output range holds no launch by design: not reported as dropped records."""
    assert analysis(name).completeness.ok, analysis(name).completeness.problems


def test_empty_layer_module_range_is_missing_data(trace_sqlite, tmp_path):
    path = copy_of(trace_sqlite, tmp_path, "hf_vllm_eager_donor")
    db = sqlite3.connect(path)
    tid, end = db.execute("SELECT globalTid, max(end) FROM NVTX_EVENTS").fetchone()
    last_call = db.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    at = max(end, last_call) + 10_000   # a decoder layer's range after the last CUDA call
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
               (at, at + 2_000_000, "{'Module': 'top.model.layers.3', 'TrainableParams': {}, 'Inputs': []}", tid))
    db.commit()
    db.close()
    problems = analyze(load_report(path), load_config()).completeness.problems
    assert any(p.startswith("1 of ") and "hold no CUDA call" in p for p in problems)


# ----------------------------------------------------------------------------- the JSON

def test_layers_and_time_share_against_reference(analysis, trace_sqlite):
    """`layers[]`: kernels per step and device busy per layer (median over stable steps of the
    union of its kernels), and each source's share of all kernel time, from the raw rows."""
    a = analysis("k3_bs1_base_a")
    j = a.to_json()
    ref = ref_mod.compute(trace_sqlite("k3_bs1_base_a"))
    rows = {lay["index"]: lay for lay in j["layers"]}
    assert set(rows) == set(range(1, LAYERS + 1))
    for layer, row in rows.items():
        per_step = [[(k.start, k.end) for k in s.kernels if k.layer == layer] for s in ref.stable]
        assert row["kernels_per_step"] == ref_mod.median([len(p) for p in per_step])
        assert row["device_busy_us"] == pytest.approx(
            ref_mod.median([ref_mod.length(ref_mod.union(p)) for p in per_step]) / 1e3, rel=1e-9)
        assert 0 <= row["critical_us"] <= row["device_busy_us"] + 1e-9
        want = {"attn_res", "dense" if layer == 1 else "moe", "mla" if layer in (4, 8) else "kda"}
        assert set(row["families"]) == want
    total = sum(k.dur for k in ref.kernels)
    for source, share in j["labels"]["time_share"].items():
        assert share == pytest.approx(sum(k.dur for k in ref.kernels if k.source == source) / total, abs=1e-12)
    assert j["labels"]["convention"] == "k3trace"


# ----------------------------------------------------------------------------- Kineto

def test_kineto_labels_agree_with_nsys(trace_sqlite):
    """The K3 path under torch.profiler (a cut of the same configuration as k3_bs1_base_a:
    8 layers, B=1, graph captured inside the window, layer ranges as record_function): the
    capture-time annotations label every replay kernel, each kernel name with the same layer
    and family as in the nsys recording (the two profilers order a fork's two streams apart)."""
    from collections import Counter

    a = analyze(load_report(Path(__file__).parents[1] / "k3trace" / "data" / "k3_bs1_kineto.pt.trace.json.gz"),
                load_config())
    ref = ref_mod.compute(trace_sqlite("k3_bs1_base_a"))
    truth = ref.stable[0].kernels
    step = a.kernels.filter(a.kernels["step"] == a.representative_step()).sort("launch_rank")
    assert step.height == len(truth) == 198
    got = Counter(zip(step["name"].to_list(), step["layer"].to_list(), step["family"].to_list()))
    assert got == Counter((k.name, k.layer, k.family) for k in truth)
    assert set(step["label_source"]) == {"graph_capture"}
    per_family = {f["name"]: f["segments_per_step"] for f in a.to_json()["families"]}
    assert per_family == {"kda": 6, "mla": 2, "moe": 7, "dense": 1, "attn_res": 16}
    assert a.to_json()["steps"]["kernels_per_step"] == 198


def test_k3_recorded_in_vllm_module_style_labels_like_its_own_ranges(analysis, trace_sqlite):
    # The K3 path recorded on the H200 with vLLM-style module-tree NVTX (KDA and MLA both
    # `self_attn`, MoE `block_sparse_moe`): zero-config labels split KDA from MLA by kernel
    # content and match, kernel by kernel in launch order, the labels the same code's own
    # `layer.N.family` ranges give (tests/reference.py on k3_bs1_base_a).
    engine = analysis("k3_vllm_inside")
    assert engine.to_json()["labels"]["convention"] == "vllm"
    ref = ref_mod.compute(trace_sqlite("k3_bs1_base_a"))
    truth = [(k.layer, k.family) for k in ref.stable[0].kernels]
    step = engine.kernels.filter(engine.kernels["step"] == engine.representative_step()).sort("launch_rank")
    # Engines number modules from 0 (`layers.0`), k3trace's own ranges from 1: one offset.
    offset = step["layer"].drop_nulls()[0] - next(t[0] for t in truth if t[0] is not None)
    got = [(None if la is None else la - offset, fam) for la, fam in zip(step["layer"].to_list(), step["family"].to_list())]
    assert len(got) == len(truth)
    agree = sum(g == t for g, t in zip(got, truth))
    assert agree >= 0.99 * len(truth), (agree, len(truth))
