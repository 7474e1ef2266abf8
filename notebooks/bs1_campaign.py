# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The bs1 campaign, read through k3trace
#
# Seed 003's way of working on our K3 decode path (kernels/README.md, "The bs1 campaign"):
# one change at a time, each a variant, each build recorded on the H200 and diffed against
# the one before. Here: the bundled 8-layer recordings of the cumulative builds c0
# (baseline), c1 `router_fork`, c2 `+mla_combine_wide`, c3 `+triton_linear`, c5
# `+router_align_fused`, c6 `+mlp_residual_folded`, diffed live; then the full-depth table (93
# layers, two runs per build) from `kernels/campaign_full_depth.json`, with each change's
# standalone micro-benchmark beside k3trace's attribution.

# %% tags=["parameters"]
#: (old build, new build, the change between them)
PAIRS = [("c0", "c1", "router_fork"), ("c1", "c2", "mla_combine_wide"), ("c2", "c3", "triton_linear"),
         ("c3", "c5", "router_align_fused"), ("c5", "c6", "mlp_residual_folded")]

# %%
import json
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import polars as pl

import k3trace
from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.diff import diff
from k3trace.ingest import load_report

pio.renderers.default = "plotly_mimetype+notebook_connected"
cfg = load_config()
names = sorted({b for old, new, _ in PAIRS for b in (old, new)})
builds = {b: analyze(load_report(bundled_trace(f"k3_bs1_{b}")), cfg) for b in names}
pl.DataFrame({"build": names, "period_us": [builds[b].step_stats["period"]["median"] for b in names]})

# %% [markdown]
# ## Each change, 8 layers (one run per build, recorded on the H200)
# The diff of build i-1 against build i: the ITL delta, its noise band (resampling: one run
# per build here), and the edits that carry it. A change's own edits are replacements and
# dependency changes; duration edits of other kernels are what the change did to them.

# %%
diffs = [diff([builds[old]], [builds[new]]) for old, new, _ in PAIRS]
CHANGES = [c for _, _, c in PAIRS]
pl.DataFrame({"change": CHANGES,
              "itl_delta_us": [d.itl_delta_us for d in diffs],
              "noise_band_us": [d.noise_band_us for d in diffs],
              "verdict": [d.verdict_itl for d in diffs]})

# %%
for change, d in zip(CHANGES, diffs):
    print(change)
    print(d.attribution.select("edit", "kind", "family", "contribution_us").head(4))

# %% [markdown]
# ## Full depth: the campaign's table
# From the H200 recordings (93 layers; the noise band from two runs per build). The
# standalone column is bench/bench_k3_ops.py's per-layer saving times the layers.

# %%
full = json.loads((Path(k3trace.__file__).resolve().parents[1] / "kernels" / "campaign_full_depth.json").read_text())
table = pl.DataFrame([{
    "change": r["change"],
    "itl_delta_us": r["itl_delta_us"],
    "noise_band_us": r["noise_band_us"],
    "standalone_us": r["standalone"][2] * 1e3 if r["standalone"] else None,
    "own_edits_us": r["own_edits_us"],
    "elsewhere_us": r["elsewhere_us"],
    "largest_elsewhere": f"{r['elsewhere_top'][0][0]} ({r['elsewhere_top'][0][1]}) {r['elsewhere_top'][0][2]:+.0f}",
} for r in [*full["diff_rows"], *(r for key in ("round3", "round4", "round5") for r in full[key]["table"])]])
table

# %%
fig = go.Figure()
for col, name in (("itl_delta_us", "ITL delta (k3trace diff)"), ("standalone_us", "standalone x layers"),
                  ("own_edits_us", "the change's edits"), ("elsewhere_us", "elsewhere")):
    fig.add_bar(x=table["change"].to_list(), y=table[col].to_list(), name=name)
fig.update_layout(barmode="group", yaxis_title="us per step (full depth)",
                  title="bs1 campaign: what each change did to the step, and where k3trace puts it")
fig

# %% [markdown]
# ## Against the floor
# Step time unprofiled (bench/bench_k3_step.py, builds interleaved in one process) and the
# HBM floor measured in the same run.

# %%
u = full["unprofiled_b1"]["interleaved"]
last = full["unprofiled_b1"]["early_trigger"][-1]  # c7, timed after c6 in the same process
c8 = full["round3"]["unprofiled"]["campaign3_rec"][-1]  # c8, timed after c7 in the same process
c14 = full["round4"]["unprofiled"]["campaign7_test"][5]  # c14, timed after c8 in the same process
c20 = full["round4"]["unprofiled"]["campaign11"][3]  # c20, timed after c14 in the same process
{"baseline_ms": min(u["baseline"]), "baseline_ratio": min(u["baseline"]) / u["floor_ms"],
 "c3_ms": u["c3"], "c3_ratio": u["c3"] / u["floor_ms"],
 "c7_ms": last["step_ms"], "c7_ratio": last["step_ms"] / last["floor_ms"],
 "c8_ms": c8["step_ms"], "c8_ratio": c8["step_ms"] / c8["floor_ms"],
 "c14_ms": c14["step_ms"], "c14_ratio": c14["step_ms"] / c14["floor_ms"],
 "c20_ms": c20["step_ms"], "c20_ratio": c20["step_ms"] / c20["floor_ms"]}

# %% [markdown]
# ## Round seven, read without each process's first build
# The seventh round's unprofiled lists (bench/bench_k3_step.py, builds interleaved in one
# process). Whatever build is timed first in a process runs about 0.17 ms fast at B = 1, so a
# build's figure here is the median over its later positions.

# %%
r7 = full["round7"]["unprofiled"]
runs = pl.DataFrame([{"list": name, "position": i, "batch": r["batch"], "step_ms": r["step_ms"],
                      "floor_ms": r["floor_ms"],
                      "build": "c20" + ("" if r["variant_suffix"] == "(c20)" else r["variant_suffix"])}
                     for name, rows in r7.items() for i, r in enumerate(rows)])
runs = runs.with_columns(first=pl.col("position") == pl.col("position").min().over("list", "batch"),
                         ratio=pl.col("step_ms") / pl.col("floor_ms"))
(runs.filter(~pl.col("first"))
 .group_by("batch", "build").agg(pl.col("step_ms").median(), pl.col("ratio").median(), pl.len().alias("runs"))
 .sort("batch", "step_ms"))

# %% [markdown]
# ## Round eight: every list behind an untimed warm-up build
# Since round seven bench_k3_step.py times one build untimed before each list, so every
# position counts. Builds named from c20 or c24 (the list's own baseline); the ratio is
# against the floor measured in the same list. The k3trace diff rows of the two kept changes
# come from pairs recorded in one call (record_ab).

# %%
def unprofiled_runs(rnd: dict) -> pl.DataFrame:
    """A round's unprofiled lists, one row per timed build, named from its base build."""
    return pl.DataFrame([{"list": name, "batch": r["batch"], "step_ms": r["step_ms"], "floor_ms": r["floor_ms"],
                          "build": r["base"] + ("" if r["variant_suffix"].startswith("(") else r["variant_suffix"])}
                         for name, rows in rnd["unprofiled"].items() for r in rows])


def per_build(runs: pl.DataFrame) -> pl.DataFrame:
    """Each list's builds: median step and ratio against the list's own floor."""
    return (runs.with_columns(ratio=pl.col("step_ms") / pl.col("floor_ms"))
            .group_by("list", "batch", "build", maintain_order=True)
            .agg(pl.col("step_ms").median(), pl.col("ratio").median(), pl.len().alias("runs")))


def against_base(builds: pl.DataFrame, bases: list[str]) -> pl.DataFrame:
    """Each list's builds (one row per build) against the list's base: the first of `bases`,
    in name order, that the list timed."""
    base = (builds.filter(pl.col("build").is_in(bases))
            .sort("build").group_by("list", "batch").agg(pl.col("step_ms").first().alias("base_ms"),
                                                         pl.col("build").first().alias("base")))
    return builds.join(base, on=["list", "batch"], how="left").with_columns(delta_ms=pl.col("step_ms") - pl.col("base_ms"))


def diff_rows(rnd: dict) -> pl.DataFrame:
    """A round's k3trace diff rows (bench/campaign_table.py): the ITL delta, the change's own
    edits, the largest rows elsewhere, the rows read together."""
    return pl.DataFrame([{"build": name, "itl_delta_us": d["itl_delta_us"], "noise_band_us": d["noise_band_us"],
                          "own_edits_us": d["own_edits_us"], "elsewhere_us": d["elsewhere_us"],
                          "largest_elsewhere": "; ".join(f"{k} ({f}) {v:+.0f}" for k, f, v in d["elsewhere_top"]),
                          "read_together": "; ".join(" + ".join(e) + f" = {s:+.0f}" for e, s in d["read_together"])}
                         for name, d in rnd["diff"].items()])


def forms_in_turn(case: dict) -> pl.DataFrame:
    """A standalone case timed as "<form>, <mode>, <round>": back to back and one call side by side."""
    return pl.DataFrame([dict(zip(("form", "mode", "round"), k.rsplit(", ", 2)), us=v)  # a form's blocks hold commas
                         for k, v in case.items()]).pivot(on="mode", index=["form", "round"], values="us")


r8 = full["round8"]
per_build(unprofiled_runs(r8))

# %%
diff_rows(r8)

# %% [markdown]
# ## Round nine: the fused tail by MMA rows, the front's split, the Gluon o_proj
# Builds named from c44 (or c24 for the split sweep); each list's own c44 is its baseline, and
# the last list ran on another H200 (c44 12.04 against 12.12-12.16 ms). In two lists one c44
# sample ran 13.53 ms (the first build of a later round; round eight saw one such too), so the
# baseline here is each list's fastest c44. The k3trace diff rows come from pairs recorded in
# one call (record_ab c44 cNN).

# %%
r9 = full["round9"]
runs9 = unprofiled_runs(r9)
base9 = runs9.filter(pl.col("build") == "c44").group_by("list").agg(pl.col("step_ms").min().alias("c44_ms"))
per_build(runs9).join(base9, on="list", how="left").with_columns(delta_ms=pl.col("step_ms") - pl.col("c44_ms"))

# %%
diff_rows(r9)

# %% [markdown]
# ## Round ten: the warp-specialized Gluon GEMM, the MoE tail's two hops
# Builds named from c49; each list's own c49 (or, in the last list, c51 = c49 +
# moe_down_atomic) is its baseline. The k3trace diff rows come from pairs recorded in one call
# (record_ab c49 c51, record_ab c51 c52).

# %%
r10 = full["round10"]
against_base(per_build(unprofiled_runs(r10)), ["c49", "c49+moe_down_atomic"])

# %%
diff_rows(r10)

# %%
hops = r10["standalone_us"]["campaign32 (moe_hops case)"]
pl.DataFrame([{"form": k.split(", ")[1], "mode": k.split(", ")[2], "us": v} for k, v in hops.items()]).pivot(
    on="mode", index="form", values="us")

# %% [markdown]
# ## Round eleven: the MLA segment
# Builds named from c51 (c57 = c51 + mla_head_bmm, c64 = c57 + mla_q_skinny, the campaign build
# since). In every list of 11 builds or more the 11th build timed read 13.2-13.3 ms whatever it was,
# so each build here is read at its fastest sample, against its list's fastest c51 (c57 in the
# lists without c51). The k3trace diff rows come from builds recorded in one call.

# %%
r11 = full["round11"]
runs11 = unprofiled_runs(r11)
fastest11 = runs11.group_by("list", "batch", "build", maintain_order=True).agg(
    pl.col("step_ms").min(), pl.col("floor_ms").first(), pl.len().alias("runs"))
against_base(fastest11, ["c51", "c51+mla_head_bmm"]).with_columns(ratio=pl.col("step_ms") / pl.col("floor_ms"))

# %%
diff_rows(r11)

# %%
mla = r11["standalone_us"]["campaign34 (mla_round case)"] | r11["standalone_us"]["campaign39_final (mla_q_skinny case)"]
pl.DataFrame([{"chain": k.removesuffix(", one call"), "mode": "one call" if k.endswith(", one call") else "back to back",
               "us": v} for k, v in mla.items()]).pivot(on="mode", index="chain", values="us")

# %% [markdown]
# ## Round twelve: the routed grouped GEMMs' blocks
# c68 = c64 + moe_grouped_tuned: the down GEMM (K = 384) in six K blocks of 64, not three of 128.
# Each list's builds against its c64 (or, in the lists without c64, its c68); `@grouped=`,
# `@skcfg=` and `@tmacfg=` are configs tried in the step and not kept. Lists from campaign46 on ran
# on a fresh machine. The B = 8 and 64 lists compare c64 with c68 applied at every batch.

# %%
r12 = full["round12"]
against_base(per_build(unprofiled_runs(r12)), ["c64", "c64+moe_grouped_tuned"])

# %%
diff_rows(r12)

# %%
forms_in_turn(r12["standalone_us"]["campaign45 (moe_grouped_tuned case)"])


# %% [markdown]
# ## Round thirteen: attn_res_wide kept; the latency-bound kernels' warps
# c69 = c68 + attn_res_wide: the attention residuals' score -> combine pair in 1024-column chunks
# (B = 1). Each list's builds against its c68 (or, in the list without c68, its c69); `@launch=`
# and `@attnres=` are launch parameters tried in the step and not kept. k3trace's diff of c68 and
# c69 reads the pair with the GEMMs it releases, whose rows hold the pair's gain (`released`).

# %%
r13 = full["round13"]
against_base(per_build(unprofiled_runs(r13)), ["c68", "c68+attn_res_wide"])

# %%
diff_rows(r13).with_columns(standalone_x186_us=pl.lit(r13["diff"]["c69 (attn_res_wide on c68)"]["standalone"][2] * 1e3))

# %%
forms_in_turn(r13["standalone_us"]["campaign53 (attn_res_wide case)"])


# %% [markdown]
# ## Round fourteen: where the step sits against its floor, by segment
# No device this round. `bench/floor_segments.py` on full-depth recordings already made: each kind
# of segment between the layers' first attention and MLP kernels, its median against the bytes it
# must read at the copy bandwidth. The MoE segments run at 1.23-1.25x their floor; the MLA segment
# at 2.3x and the KDA one at 1.4x keep the step at 1.35x. The same script places a change:
# attn_res_wide's gain sits mostly in the MoE segments, mla_q_skinny's in the MoE segment before
# each MLA layer (the hop before q_a).

# %%
r14 = full["round14"]
pl.DataFrame(r14["floor_segments"]["c69"]).with_columns(ratio=pl.col("median_us") / pl.col("floor_us"))

# %%
pl.concat([pl.DataFrame(rows).with_columns(change=pl.lit(name)) for name, rows in r14["floor_segments"].items()
           if "->" in name]).select("change", "kind", "per_step", "old_us", "new_us", "delta_us", "delta_us_per_step")


# %% [markdown]
# ## Round seventeen: the MLA hop removals measured, c72 kept; the hop floor
# c72 = c69 + mla_absorb_concat + mla_kv_norm_insert (the two copies before the FMHA go). Alone,
# neither gains unprofiled: the two legs into the FMHA are co-critical, so shortening one leaves
# the other binding (k3trace's diff of c70 shows the FMHA recording the wait, +11 us). Both
# together gain 0.04-0.08 ms, as the standalone chain says (-57 us). The gated o_proj (c73) is
# 0.33 ms slower. A hop costs about 0.8 us even with an early PDL trigger.

# %%
r17 = full["round17"]
against_base(per_build(unprofiled_runs(r17)), ["c69", "c69+mla_absorb_concat+mla_kv_norm_insert"])

# %%
diff_rows(r17)

# %%
pl.DataFrame({"chain": list(r17["standalone_us"]), "us": list(r17["standalone_us"].values())})

# %%
pl.DataFrame({"chain of 32 launches": list(r17["hop_floor_us_per_hop"]),
              "us_per_launch": list(r17["hop_floor_us_per_hop"].values())})


# %% [markdown]
# ## Round eighteen: what a dependency costs however it is carried; the latency windows
# A grid barrier on a global-memory counter (the persistent-kernel way to follow a producer)
# costs 1.06-1.15 us per stage against 0.83-0.97 for a PDL-early launch, so that direction is
# dropped. Filling the latency-bound stretches with the next GEMM's first weight bytes (asked of
# L2 per line by the score kernel or by the GEMM before the window) loses in every form: the
# issuing grid waits for its lines, and the GEMM that finds them in L2 gains a quarter of their
# time. The Gluon up GEMM loses too. c72 stays the campaign build.

# %%
r18 = full["round18"]
against_base(per_build(unprofiled_runs(r18)), ["c72"])

# %%
pl.DataFrame({"chain": list(r18["hop_floor_us_per_hop"]), "us_per_hop": list(r18["hop_floor_us_per_hop"].values())})

# %%
# window_prefetch's keys are "<mode>: <form>, <round>".
pl.DataFrame([{"mode": k.split(": ", 1)[0], "form": k.split(": ", 1)[1].rsplit(", ", 1)[0],
               "round": k.rsplit(", ", 1)[1], "us": v}
              for k, v in r18["standalone_us"]["window_prefetch"].items()]).pivot(on="mode", index=["form", "round"],
                                                                                   values="us")

# %%
diff_rows(r18)


# %% [markdown]
# ## Round nineteen: where HBM idles, from nsys's GPU metrics
# c72 recorded with DRAM read throughput sampled every 5 us beside the trace (`k3trace record
# --gpu-metrics`). Averaged over every instance of a segment kind the samples resolve the
# transitions: the GEMMs stream at 4.5-4.6 TB/s and the rate falls at every GEMM -> short
# kernel(s) -> GEMM hand-over; the MLA segment is one long dip. The bundled 8-layer recording
# (B = 1, 28 stable steps) first, read live; then the full-depth figures.

# %%
from k3trace.render.figures import dram_profile

gm = analyze(load_report(bundled_trace("k3_bs1_c72_gm")), cfg).dram
steps = gm.steps.select(pl.col("read_bytes").median() / 1e9, pl.col("read_tbs").median(),
                        pl.col("idle_equivalent_ns").median() / 1e3)
steps.columns = ["read_gb_per_step", "read_tbs", "idle_equivalent_us"]
steps

# %%
gm.kinds

# %%
dram_profile(gm.profile.filter(pl.col("kind").is_in(["kda > moe", "moe > kda", "mla > moe"])),
             gm.peak_bytes_per_s / 1e12, "c72, 8 layers: DRAM read rate by time since each segment's start")

# %% [markdown]
# At full depth (93 layers, 20 steps): the idle-equivalent of each segment (its time less its
# bytes at the GEMMs' 4.6 TB/s) and the dips it is made of. The prepared builds that load the
# next GEMM's weights during a dip (C78-C82: `moe_weights_ahead`, `mla_o_proj_ahead`, the Gluon
# GEMMs with early slots) were measured in a later session: every one slower (the table at the end).

# %%
r19 = full["round19"]
pl.DataFrame([{"segment": k, "per_step": v["per_step"], "time_us": v["time"], "idle_equivalent_us": v["idle_equivalent"],
               **{f"dip: {d}": us for d, us in v["dips"].items()}} for k, v in r19["segments_us"].items()],
             strict=False)

# %%
pl.DataFrame([{"config": k, **v} for k, v in r19["compile_audit_sm90a"].items()], strict=False)

# %% [markdown]
# ## Round twenty: kda_step over V quarters
# kda_step holds 773 us of c72's critical path per step (69 calls, 2.6% hidden). Its own time
# shows in the first session's 8-layer recordings, whose kernels triggered after their last
# store: the fused step (one program per head) against the V-split step of kda_norm_separate
# (four per head) and its separate norm, read live from the bundled recordings.
# `kda_split_v` keeps the split and the norm in one kernel, the head's four programs meeting at
# a barrier; measured with round nineteen (below).

# %%
kda_runs = {"fused step (baseline)": "base_a", "V-split step + norm kernel": "kda_norm_separate"}
pl.concat([analyze(load_report(bundled_trace(f"k3_bs1_{name}")), cfg).kernel_table
           .filter(pl.col("name").str.starts_with("kda"))
           .select(pl.lit(form).alias("form"), "name", "calls_per_step", "median_us")
           for form, name in kda_runs.items()])

# %%
r20 = full["round20"]
pl.DataFrame([{"kernel": k, **v} for k, v in r20["compile_audit_sm90a_triton36"].items()])

# %%
r20["whatif_c72_us_per_step"]

# %% [markdown]
# ## Rounds nineteen and twenty on the H200
# One call (`campaign63`; the builds as kernels/scripts/h200_k3.sh names them): the step, unprofiled, B = 1, two rounds; then C72 / C83 again on the
# same machine. Every build is slower than c72, so nothing is kept. `moe_weights_ahead` also fails
# the model's reference test; `kda_split_v` is faster back to back, slower as one call.

# %%
m19 = r19["measured"]
steps = pl.DataFrame(m19["campaign63_steps"] + m19["c72_c83_repeat_steps"])
build = pl.col("build").str.contains
(steps.with_columns(pl.when(build("moe.front")).then(pl.lit("C82"))
                    .when(build("kda_split_v") & build("moe_weights_ahead")).then(pl.lit("C84"))
                    .when(build("kda_split_v")).then(pl.lit("C83"))
                    .when(build("mla_o_proj_ahead")).then(pl.lit("C81"))
                    .when(build("moe_weights_ahead")).then(pl.lit("C78"))
                    .otherwise(pl.lit("C72")).alias("build"))
 .group_by("build", maintain_order=True)
 .agg(pl.len().alias("runs"), pl.col("step_ms").min().alias("min_ms"), pl.col("step_ms").median().alias("median_ms"),
      pl.col("step_ms").max().alias("max_ms"))
 .with_columns((pl.col("median_ms") - pl.col("median_ms").first()).round(3).alias("vs_c72_ms")))

# %%
pl.DataFrame([{"case": k, "us": v} for k, v in m19["ops_us"].items()])

# %% [markdown]
# ## Round twenty-one: the shared experts' front columns on S1 (`shared_front_leg`), on an H100
# The call that started was given an H100 (2.99 TB/s copy: its floor for the same 36.02 GB is
# 12.03 ms, so its ratios are not the H200's). The step, unprofiled, B = 1, 100 replays: C85
# (S1's GEMM at the front's config) and C87 (split over K) are slower than c72. Nothing kept.

# %%
r21 = full["round21"]
(pl.DataFrame(r21["steps"])
 .group_by("build", maintain_order=True)
 .agg(pl.len().alias("runs"), pl.col("step_ms").median().alias("median_ms"), pl.col("ratio").median().alias("ratio"))
 .with_columns((pl.col("median_ms") - pl.col("median_ms").first()).round(3).alias("vs_c72_ms")))

# %%
pl.DataFrame([{"case": k, "us": v} for k, v in r21["ops_us"].items()])

# %% [markdown]
# The bundled 8-layer pair from the same machine, read live. S1's SiTU row holds the new S1 GEMM's
# work (it launched at the GEMM's early trigger), and the MoE join row undoes most of it: the latent
# norm and the up GEMM had taken S1's shared down GEMM as their join from timing alone. The diff
# reads them together (`joined`).

# %%
leg = diff([analyze(load_report(bundled_trace("k3_bs1_c72_h100")), cfg)],
           [analyze(load_report(bundled_trace("k3_bs1_c85_h100")), cfg)])
print(f"ITL {leg.itl_delta_us:+.2f} us/step (band +-{leg.noise_band_us:.2f}); span {leg.span_delta_us:+.2f}")
pl.DataFrame([{"rows": " + ".join(r["edit"] for r in g["rows"]), "reasons": ", ".join(g["reasons"]),
               "each_us": " / ".join(f"{r['contribution_us']:+.2f}" for r in g["rows"]), "together_us": round(g["sum_us"], 2)}
              for g in leg.read_together()])

# %% [markdown]
# Round nineteen's `moe_weights_ahead`, part by part on the GPU (`kernels/scripts/ahead_parts.py`,
# H100): with its early weight loads off it is c72 bit for bit; with them on the model leaves the
# reference, triggers or not. The loads read the routing before it is finished: the variant is
# marked unsound.

# %%
pl.DataFrame([{"build": k, "hidden_rel_err_max": max(v["hidden_rel_err"]), "worst_margin": v["worst_margin"],
               "against_c72": v.get("against_c72")} for k, v in r21["ahead_parts_h100"].items() if k != "note"])

# %% [markdown]
# The same reading on code nobody here wrote: transformers' Llama with a spin beside each MLP
# (`side_work`, joined at the MLP's output), 1000 cycles against longer ones. The step moves
# little (at 20000 cycles -4.4 us, from other kernels' durations); the spin's row and the join
# row are each large and cancel.

# %%
pl.DataFrame([{"cycles": int(k), **v} for k, v in r21["hf_side_work_h100"].items() if k != "note"])

# %% [markdown]
# ## Round twenty-five: a faster router that bought nothing, and why k3trace said it would
# Round twenty-four's `router_bitonic` made the router 2.06 us faster a call and the H100's step
# did not move (+0.001 ms at full depth), while `whatif` predicted -2.70 us per 8-layer step.
# The raw rows of the c72 recording: the gate|up GEMM that follows the router on its stream ends
# a fixed 0.3-0.5 us after the front GEMM on the other stream, wherever the router ends. It waits
# inside its run for the front (a PDL launch at the router's end), so the router releases
# nothing. The walk now reads such in-run waits (docs/metrics.md, "PDL"); the prediction is 0.

# %%
from k3trace.analyses.whatif import parse_change, what_if

c72 = analyze(load_report(bundled_trace("k3_bs1_c72")), cfg)
step = c72.representative_step()
k = c72.path.filter(pl.col("step") == step).sort("start")
t0 = k["start"].min()
rows = []
for i, r in enumerate(k.iter_rows(named=True)):
    if r["name"] != "moe_router_kernel":
        continue
    gemm = k.slice(i + 1).filter(pl.col("stream_id") == r["stream_id"]).row(0, named=True)
    by = k.filter(pl.col("kernel_id") == gemm["pred"]).row(0, named=True)
    rows.append({"layer": r["layer"], "router_end_us": (r["end"] - t0) / 1e3,
                 "gemm_start_us": (gemm["start"] - t0) / 1e3, "gemm_end_us": (gemm["end"] - t0) / 1e3,
                 "released_by": by["name"], "same_stream": by["stream_id"] == gemm["stream_id"],
                 "releaser_end_us": (by["end"] - t0) / 1e3, "gemm_end_after_it_us": (gemm["end"] - by["end"]) / 1e3})
pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(2))

# %%
w = what_if(c72, [parse_change("delta", "^moe_router_kernel$=-2.06us")])
print(f"whatif, router 2.06 us faster a call: {w.delta_us:+.2f} us per 8-layer step (round twenty-four's walk: -2.70)")
critical = c72.kernel_table.filter(pl.col("name").is_in(["moe_router_kernel", "moe_grouped_gemm_kernel"]))
critical.select("name", "family", "calls_per_step", "busy_per_step_us", "critical_us")

# %% [markdown]
# The recorded pair (c72 -> c89 at 8 layers, an H100, round twenty-five; run a of four each,
# bundled): the router's rows fell by more than 1 us a call and the diff gives the router
# nothing (the walk before the in-run rule gave it -3.7 us and the GEMM a +3.6 us gap). One run
# a side has only the resampling band, which misses run-to-run drift; the four runs a side of
# the same call (not bundled) give the span -1.47 us against a band of +-2.26 from repeats.

# %%
bitonic = diff([analyze(load_report(bundled_trace("k3_bs1_c72_h100_r25")), cfg)],
               [analyze(load_report(bundled_trace("k3_bs1_c89_h100_r25")), cfg)])
print(f"span {bitonic.span_delta_us:+.2f} us/step (band +-{bitonic.span_noise_band_us:.2f})")
bitonic.attribution.filter(pl.col("edit").str.contains("router|grouped")).select(
    "edit", "kind", "family", pl.col("contribution_us").round(2))

# %% [markdown]
# ## Round twenty-seven: the H200 standing, and the grouped GEMMs by TMA
# The step list round twenty-five left for the H200 ran there: the two router selections are
# 11-14 us slower than c72, which is the campaign build again (1.36x). `moe_grouped_tma` (C90,
# bit for bit) ran on an H100 (the H200 did not start again): slower at B = 1 in every list,
# and the routed chain alone is slower too. Not kept.

# %%
r27 = full["round27"]
pl.concat([pl.DataFrame(r27[machine]["steps"]).with_columns(pl.lit(r27[machine]["device"]).alias("device"))
           for machine in ("h200", "h100")]).group_by("device", "batch", "build", maintain_order=True).agg(
    pl.len().alias("runs"), pl.col("step_ms").median().alias("median_ms"), pl.col("ratio").median()).with_columns(
    (pl.col("median_ms") - pl.col("median_ms").first().over("device", "batch")).round(3).alias("vs_c72_ms"))

# %%
chain = next(v for k, v in r27["h100"].items() if k.startswith("routed_chain_us"))
pl.DataFrame([dict(zip(("form", "mode", "round"), k.rsplit(", ", 2)), us=v) for k, v in chain.items()]).pivot(
    on="mode", index=["form", "round"], values="us")

# %% [markdown]
# ## Round twenty-eight: the router's call sites
# No device machine started. `analyze` now gives each kernel's call sites (positions in the
# step's launch order) and the lowest and highest of their medians: the router's row hides two
# kinds of site. Per MoE layer below: the router's record, the gate|up GEMM's start after the
# router's end, and its end after the front GEMM's (the hand-over), on the H200 c72 recording
# and the H100 c72 -> c89 pair (medians over the stable steps, us). Layer 2 (after the dense
# layer) has another front. At the MoE layers followed by an MLA layer (3 and 7) the GEMM
# launches at the router's end and hands over in 0.32 us. Elsewhere it waits for the front,
# and c89's faster router changes nothing the GEMM waits on.

# %%
def moe_sites(a) -> pl.DataFrame:
    stable = a.steps.filter("stable")["step"].implode()
    k = a.kernels.filter(pl.col("family") == "moe", pl.col("step").is_in(stable))

    def first(name: str) -> pl.DataFrame:  # the layer's first call of the kernel (the front, the gate|up GEMM)
        return k.filter(pl.col("name") == name).sort("launch_rank").group_by("step", "layer", maintain_order=True).first()

    j = (first("moe_router_kernel").join(first("skinny_mm_kernel"), on=["step", "layer"], suffix="_front")
         .join(first("moe_grouped_gemm_kernel"), on=["step", "layer"], suffix="_gemm"))
    return j.filter(pl.col("layer") > 2).group_by("layer").agg(
        ((pl.col("end") - pl.col("start")).median() / 1e3).alias("router_us"),
        ((pl.col("start_gemm") - pl.col("end")).median() / 1e3).alias("gemm_after_router_us"),
        ((pl.col("end_gemm") - pl.col("end_front")).median() / 1e3).alias("hand_over_us"),
    ).sort("layer")


sites = {label: moe_sites(analyze(load_report(bundled_trace(name)), cfg))
         for label, name in (("H200 c72", "k3_bs1_c72"), ("H100 c72", "k3_bs1_c72_h100_r25"),
                             ("H100 c89", "k3_bs1_c89_h100_r25"))}
with pl.Config(tbl_rows=-1):  # all 18 rows
    print(pl.concat([s.with_columns(pl.lit(label).alias("recording")) for label, s in sites.items()]).select(
        "layer", "recording", pl.col(pl.Float64).round(2)).sort("layer", maintain_order=True))

# %%
c72.kernel_table.filter(pl.col("family") == "moe").select(
    "name", "sites", "median_us", "site_median_min_us", "site_median_max_us", "critical_us").with_columns(
    pl.col(pl.Float64).round(2))
