"""What-if predictions from the old build alone, checked against the new build's measured
span on real A/B pairs recorded on the H200. The change each prediction is given comes from
what an engineer knows before writing it: an injected delay's length (the recording
scripts), a fused kernel's standalone time (kernels/hf_llama.py --microbench), or a
replacement kernel's time (taken from the new build's own rows by tests/reference.py, never
from the code under test). Goal: within max(5% of the measured delta, the noise band) for
duration changes and delays, 15% for fusions.
"""

from __future__ import annotations

import statistics

import polars as pl
import pytest

from k3trace.analyses import stepgraph
from k3trace.analyses.whatif import (NO_PDL, Change, parse_change, parse_layers, parse_time_ns, ranking, step_model,
                                     what_if)
from k3trace.diff import diff
from k3trace.errors import ReportError

import reference  # tests/reference.py (pytest puts tests/ on sys.path)

HF_RMSNORM_FUSED_US = 2.61   # kernels/hf_llama.py --microbench on the H200, per call
HF_RMSNORM = ("unrolled_elementwise,vectorized_elementwise,reduce_kernel,vectorized_elementwise,"
              "vectorized_elementwise,^elementwise_kernel$,vectorized_elementwise,vectorized_elementwise")


def mean_call_us(trace, names) -> float:
    """Mean duration of one call of the named kernels over stable steps (raw rows)."""
    r = reference.compute(trace)
    durs = [k.dur for s in r.stable for k in s.kernels if k.name in names]
    return statistics.mean(durs) / 1e3


def check(w, d, share):
    tolerance = max(share * abs(d.span_delta_us), d.span_noise_band_us)
    assert abs(w.delta_us - d.span_delta_us) <= tolerance, (w.delta_us, d.span_delta_us, tolerance)


def test_an_unchanged_step_replays_exactly(analysis):
    for name in ("k3_bs1_base_a", "hf_mlp_side_stream_a", "small_inside_d"):
        m = step_model(analysis(name))
        start, end = stepgraph.replay(m.graph, m.duration, m.lags, m.launch)
        assert stepgraph.span(start, end) == pytest.approx(m.span, abs=1e-6)


@pytest.mark.parametrize("old, new, spec, share", [
    ("k3_bs1_base_a", "k3_bs1_delay_kda_step", "^kda_step_kernel$=+3us", 0.05),           # delay:...:3000
    ("small_inside_a", "small_delay_kda_step", "^kda_step_kernel$=+4us", 0.05),          # --delay-ns 4000
    ("small_inside_a", "small_delay_gate", "^kda_gate_kernel$=+3us", 0.05),              # --delay-ns 3000
])
def test_delays_on_the_critical_path(analysis, old, new, spec, share):
    w = what_if(analysis(old), [parse_change("delta", spec)])
    check(w, diff([analysis(old)], [analysis(new)]), share)


def test_a_side_stream_delay_within_its_slack_moves_nothing(analysis):
    # kda_conv_silu_kernel runs on the aux stream with ~17 us of slack per call.
    old = analysis("small_inside_d")
    w = what_if(old, [parse_change("delta", "^kda_conv_silu_kernel$=+8us")])
    assert w.delta_us == pytest.approx(0.0, abs=0.05)
    assert w.slack["slack_used_us"][0] == pytest.approx(w.slack["added_us"][0])
    check(w, diff([old], [analysis("small_delay_conv_8us")]), 0.05)


def test_a_side_stream_delay_past_its_slack_moves_the_step_by_the_excess(analysis):
    old = analysis("small_inside_d")
    w = what_if(old, [parse_change("delta", "^kda_conv_silu_kernel$=+25us")])
    d = diff([old], [analysis("small_delay_conv_25us")])
    added = 6 * 25.0
    assert 0.2 * added < w.delta_us < 0.5 * added  # partial: the slack absorbs the rest
    assert w.slack["slack_used_us"][0] < w.slack["added_us"][0] == pytest.approx(added)
    check(w, d, 0.05)
    assert "kda_conv_silu_kernel" in w.critical.filter(w.critical["change_us"] > 0)["name"].to_list()


def test_replacing_a_kernel_by_a_faster_one(analysis, trace_sqlite):
    # The CuTe DSL KDA step: the time of one call as the new build's rows show it.
    old, new = "k3_bs1_base_a", "k3_bs1_kda_cute"
    cute = {k.name for k in reference.compute(trace_sqlite(new)).stable[0].kernels if k.name.startswith("kernel_cutlass")}
    delta = mean_call_us(trace_sqlite(new), cute) - mean_call_us(trace_sqlite(old), {"kda_step_kernel"})
    w = what_if(analysis(old), [parse_change("delta", f"^kda_step_kernel$={delta:+.4f}us")])
    check(w, diff([analysis(old)], [analysis(new)]), 0.05)


def test_fusing_transformers_rmsnorm(analysis):
    # Eight eager kernels per RMSNorm fused into one of its standalone time, 17 norms a step.
    w = what_if(analysis("hf_base_a"), [parse_change("fuse", f"{HF_RMSNORM}={HF_RMSNORM_FUSED_US}us")])
    assert w.kernels_changed == 17 * 8
    check(w, diff([analysis("hf_base_a")], [analysis("hf_norm_fused_a")]), 0.15)


def test_fusing_the_kda_norm_into_the_step(analysis, trace_sqlite):
    # kda_norm_separate -> baseline: step + gated norm fused, at the fused kernel's time per call.
    old, new = "k3_bs1_kda_norm_separate", "k3_bs1_base_a"
    fused = mean_call_us(trace_sqlite(new), {"kda_step_kernel"})
    w = what_if(analysis(old), [parse_change("fuse", f"^kda_step_kernel$,^kda_gated_rmsnorm_kernel$={fused:.4f}us")])
    assert w.kernels_changed == 12
    d = diff([analysis(old)], [analysis(new)])
    # The fusion edit itself, apart from the untouched kernels' drift between the two runs.
    edit = d.attribution.filter(d.attribution["kind"] == "replacement")["contribution_us"][0]
    assert w.delta_us == pytest.approx(edit, rel=0.15)


def test_top_opportunities_skip_kernels_with_slack(analysis):
    w = what_if(analysis("small_inside_d"), [parse_change("scale", "^kda_gate_kernel$=0.5")])
    top = w.opportunities
    gains = dict(zip(top["name"], top["gain_us_if_2x_faster"]))
    assert gains["kda_gate_kernel"] == pytest.approx(w.delta_us * -1, rel=1e-6, abs=0.5)
    assert gains.get("kda_conv_silu_kernel", 0.0) == pytest.approx(0.0, abs=1e-6)  # all slack
    assert list(top["gain_us_if_2x_faster"]) == sorted(top["gain_us_if_2x_faster"], reverse=True)


def test_the_ranking_without_a_change_on_a_one_stream_step(analysis, reference_of):
    """`whatif REPORT` with no change. The transformers Llama runs on one stream with no kernel
    beside another, so every kernel sits on the path with no slack and halving all of one
    kernel's calls shortens the mean step by half its summed time there (raw rows). --family
    ranks that family's kernels only, the same numbers."""
    import collections

    r = reference_of("hf_base_a")
    assert len({k.stream for s in r.stable for k in s.kernels}) == 1
    per_step = collections.defaultdict(list)
    for s in r.stable:
        summed = collections.Counter()
        for k in s.kernels:
            summed[(k.name, k.family)] += k.end - k.start
        for key, ns in summed.items():
            per_step[key].append(ns)
    half_us = {key: statistics.mean(v) / 2e3 for key, v in per_step.items()}
    a = analysis("hf_base_a")
    for family in (None, "mlp"):
        rows = ranking(a, family).opportunities
        expected = sorted(((us, key) for key, us in half_us.items() if family in (None, key[1])), reverse=True)
        assert rows.height == min(15, len(expected))
        for row, (us, key) in zip(rows.iter_rows(named=True), expected):
            assert (row["name"], row["family"]) == key
            assert row["gain_us_if_2x_faster"] == pytest.approx(us, abs=1e-3)
    with pytest.raises(ReportError, match="no kernel of family 'moe'"):
        ranking(a, "moe")


def test_no_pdl_costs_the_measured_gap_on_pdl_edges(analysis):
    a = analysis("k3_bs1_base_a")
    w = what_if(a, [Change(NO_PDL)])
    assert w.delta_us > 0 and w.kernels_changed > 50 and w.notes


def _plain_launch_gap_us(trace) -> float:
    """Median gap between consecutive kernels of one stream in the stable steps of a trace
    with no PDL and one stream (raw rows): what a plain launch records on the H200."""
    r = reference.compute(trace)
    gaps = [b.start - a.end for s in r.stable for a, b in zip(s.kernels, s.kernels[1:])
            if a.stream == b.stream and b.start >= a.end]
    return statistics.median(gaps) / 1e3


def test_no_pdl_charges_a_plain_launch_not_a_side_stream_wait(analysis, trace_sqlite):
    # c20 has side-stream kernels released by their stream predecessor that start several us
    # later, waiting for SMs (the MoE shared experts' GEMM beside the routed GEMMs). The gap
    # --no-pdl gives each PDL edge must be a plain launch's, as the transformers Llama (no
    # PDL, one stream) records it on the same H200 and nsys: about 0.13 us. Taken over every
    # plain release it read 0.32 us on c20 and 16 us at full depth on c51.
    import re

    plain = _plain_launch_gap_us(trace_sqlite("hf_base_a"))
    r = reference.compute(trace_sqlite("k3_bs1_c20"))
    waits = [b.start - a.end for s in r.stable for a, b in zip(s.kernels, s.kernels[1:]) if a.stream == b.stream]
    assert sum(w > 5_000 for w in waits) >= len(r.stable)  # at least one such wait per step
    w = what_if(analysis("k3_bs1_c20"), [Change(NO_PDL)])
    gap = float(re.search(r"plain launch's gap, ([0-9.]+) us", " ".join(w.notes)).group(1))
    assert abs(gap - plain) < 0.05, (gap, plain)


def test_restrictions_and_bad_changes(analysis):
    a = analysis("k3_bs1_base_a")
    only_mla = what_if(a, [parse_change("delta", "rmsnorm_kernel=+1us", family="mla", layers=parse_layers("4"))])
    assert only_mla.kernels_changed == 2
    assert parse_layers("1..3,7") == (1, 2, 3, 7) and parse_time_ns("-300ns") == -300 and parse_time_ns("1.5ms") == 1.5e6
    for kind, spec in (("scale", "kda=fast"), ("scale", "kda=-1"), ("delta", "kda=3 weeks"), ("fuse", "a,b")):
        with pytest.raises(ReportError):
            parse_change(kind, spec)
    with pytest.raises(ReportError, match="no kernel matches"):
        what_if(a, [parse_change("delta", "no_such_kernel=+1us")])
    with pytest.raises(ReportError, match="not a valid regular expression"):
        what_if(a, [parse_change("delta", "(?=look)ahead=+1us")])


def _pdl_neighbours(trace, name: str, family: str | None, before: str | None = None) -> tuple[range, range]:
    """Per stable step (raw rows), how many calls of the kernel (those right before a `before`
    call on their stream, if given) start within a PDL gap of an other kernel's end on their
    stream, and how many end within one of an other's start: the range over steps of each."""
    r = reference.compute(trace)
    gap = reference.settings()["pdl_max_gap_ns"]
    holds, lends = [], []
    for s in r.stable:
        streams: dict[int, list] = {}
        for k in sorted(s.kernels, key=lambda k: k.start):
            streams.setdefault(k.stream, []).append(k)
        h = l = 0
        for ks in streams.values():
            for prev, k, nxt in zip([None] + ks[:-1], ks, ks[1:] + [None]):
                if k.name != name or (family and k.family != family) or (before and (nxt is None or nxt.name != before)):
                    continue
                h += prev is not None and prev.name != name and k.start - prev.end <= gap
                l += nxt is not None and nxt.name != name and nxt.start - k.end <= gap
        holds.append(h)
        lends.append(l)
    return range(min(holds), max(holds) + 1), range(min(lends), max(lends) + 1)


def _flagged(w) -> tuple[int, int]:
    import re

    note = " ".join(n for n in w.notes if "PDL predecessor" in n or "PDL dependent" in n)
    counts = [re.search(rf"(\d+) {what}", note) for what in ("start at an unchanged PDL predecessor",
                                                             "release an unchanged PDL dependent")]
    return tuple(int(m.group(1)) if m else 0 for m in counts)


def test_a_shortened_pdl_neighbour_is_flagged(analysis, trace_sqlite):
    # c7 triggers every dependent right after its wait: situ_mul's recorded time holds the
    # routed grouped GEMM's tail (31 -> 254 us per step from c6, the GEMM 261 -> 118).
    holds, lends = _pdl_neighbours(trace_sqlite("k3_bs1_c7"), "situ_mul_kernel", "moe")
    held, lent = _flagged(what_if(analysis("k3_bs1_c7"), [parse_change("remove", "^situ_mul_kernel$", family="moe")]))
    assert held in holds and lent in lends and held > 0 and lent > 0, (held, lent, holds, lends)
    # Fused with the GEMM before it, the tail situ_mul may hold is inside the change; the
    # fused kernel itself still starts at its own predecessor's end.
    gemm_holds, _ = _pdl_neighbours(trace_sqlite("k3_bs1_c7"), "moe_grouped_gemm_kernel", "moe", before="situ_mul_kernel")
    fused = what_if(analysis("k3_bs1_c7"), [parse_change("fuse", "^moe_grouped_gemm_kernel$,^situ_mul_kernel$=5us",
                                                         family="moe")])
    assert _flagged(fused)[0] in gemm_holds and min(gemm_holds) > 0, (_flagged(fused), gemm_holds)
    # A kernel made longer is not a gain to bound, and a --delta states the saving itself.
    for spec in ("^situ_mul_kernel$=+1us", "^situ_mul_kernel$=-1us"):
        assert _flagged(what_if(analysis("k3_bs1_c7"), [parse_change("delta", spec)])) == (0, 0)
    assert _flagged(what_if(analysis("k3_bs1_c7"), [parse_change("scale", "^situ_mul_kernel$=0.5", family="moe")])) \
        == (held, lent)
    # The transformers Llama launches without PDL, but cuBLAS chains its own kernels on Hopper:
    # one reduce_kernel per step starts 1 ns after the GEMM before it.
    holds, lends = _pdl_neighbours(trace_sqlite("hf_base_a"), "reduce_kernel", None)
    held, lent = _flagged(what_if(analysis("hf_base_a"), [parse_change("scale", "^reduce_kernel$=0.5")]))
    assert held in holds and lent in lends and max(holds) > 0, (held, lent, holds, lends)


def test_segments_of_a_kernel_without_slack(analysis):
    """c72: every kda_step 2 us shorter. kda_step has no slack, so each window holding one (`kda > moe`,
    `kda > dense`) is 2 us shorter in the replayed steps, every other window as it was, and the windows'
    changes add up to the predicted span change (no kda_step sits in a step's last, unwindowed segment)."""
    w = what_if(analysis("k3_bs1_c72"), [parse_change("delta", "kda_step_kernel=-2us")])
    seg = {r["kind"]: r for r in w.segments.iter_rows(named=True)}
    assert set(seg) >= {"kda > moe", "kda > dense", "moe > kda", "mla > moe"}
    for kind, r in seg.items():
        expected = -2.0 * r["per_step"] if kind.startswith("kda >") else 0.0
        assert r["change_us_per_step"] == pytest.approx(expected, abs=1e-6), kind
        assert r["time_us_after"] - r["time_us_before"] == pytest.approx(-2.0 if expected else 0.0, abs=1e-6)
    assert sum(r["change_us_per_step"] for r in seg.values()) == pytest.approx(w.delta_us, abs=1e-6)
    assert "segments" in w.to_json()


def test_segments_predicted_against_the_diff_of_the_fusion(analysis):
    """The transformers Llama's eager RMSNorm fused (its standalone time): the prediction's segment kinds are
    the diff's of the build that made the change, each within 15% of what the diff measured there."""
    w = what_if(analysis("hf_base_a"), [parse_change("fuse", f"{HF_RMSNORM}={HF_RMSNORM_FUSED_US}us")])
    d = diff([analysis("hf_base_a")], [analysis("hf_norm_fused_a")])
    measured = dict(zip(d.segments["kind"], d.segments["us_per_step_delta"]))
    predicted = dict(zip(w.segments["kind"], w.segments["change_us_per_step"]))
    assert set(predicted) == set(measured) and len(measured) == 3
    for kind, m in measured.items():
        assert abs(predicted[kind] - m) <= max(0.15 * abs(m), d.span_noise_band_us), (kind, predicted[kind], m)


def test_a_gemm_waiting_in_its_run_is_released_by_the_other_streams_producer(analysis, trace_sqlite):
    # The K3 MoE gate|up GEMM (c72) follows the router on its stream and needs the front GEMM's
    # output from the other stream. The raw rows: where it launches by PDL at the router's end,
    # it waits inside its run and ends within 1 us after a kernel of the other stream that
    # started before it, 7-17 us after the router ended; where it starts later, a kernel of the
    # other stream ends by its start or within 2 us after it (the front's tail under early
    # triggers), again after the router's end. So the router releases it in no layer, and a
    # faster router buys nothing (round twenty-four measured a 2.06 us faster router at
    # +0.001 ms a full-depth step on the H100).
    settings = reference.settings()
    r = reference.compute(trace_sqlite("k3_bs1_c72"))
    in_run, after, gemms = [], [], set()
    for s in r.stable:
        ks = sorted(s.kernels, key=lambda k: (k.start, k.end))
        for i, k in enumerate(ks):
            if k.name != "moe_router_kernel":
                continue
            gemm = next(g for g in ks[i + 1:] if g.stream == k.stream)
            assert gemm.name == "moe_grouped_gemm_kernel"
            gemms.add(gemm.start)
            others = [p for p in ks if p.stream != k.stream and p.start < gemm.start]
            if gemm.start - k.end <= settings["pdl_max_gap_ns"]:
                producer = max((p for p in others if p.end <= gemm.end), key=lambda p: p.end)
                in_run.append((gemm.end - producer.end, producer.end - k.end))
            else:
                producer = max((p for p in others if p.end <= gemm.start + 2000), key=lambda p: p.end)
                after.append(producer.end - k.end)
    assert len(gemms) == 7 * len(r.stable) and in_run and after
    assert max(t for t, _ in in_run) <= 1000 and min(lead for _, lead in in_run) > 5000
    assert min(after) > 0
    a = analysis("k3_bs1_c72")
    routers = set(a.path.filter(pl.col("name") == "moe_router_kernel")["kernel_id"].to_list())
    released = a.path.filter(pl.col("name") == "moe_grouped_gemm_kernel", pl.col("start").is_in(list(gemms)))
    assert released.height == len(gemms) and not set(released["pred"].to_list()) & routers
    w = what_if(a, [parse_change("delta", "^moe_router_kernel$=-2.06us")])
    assert abs(w.delta_us) < 0.05, w.delta_us
