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
# # The seeds' tables, from traces
#
# The three pull requests k3trace comes from (../shared/seeds/) built these tables by hand
# from Nsight Systems timelines. Here they come from k3trace on the project's own H200
# recordings of the matching variants of the K3 decode path (kernels/README.md). By default
# the bundled traces (8 layers, B=1); pass full-depth recordings (`k3trace record --variant
# ...`, 93 layers) in `TRACES` for the 24-layer / 69-layer figures.

# %% tags=["parameters"]
TRACES = {}  # variant name -> report path; missing ones come from the bundled traces
FULL_DEPTH = {"kda": 69, "mla": 24, "moe": 92}

# %%
from pathlib import Path

import plotly.io as pio

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.diff import diff, sides
from k3trace.diff import tables
from k3trace.ingest import load_report
from k3trace.render import figures

# JupyterLab draws the plotly mimetype; an HTML export (nbconvert) loads plotly.js from its CDN.
pio.renderers.default = "plotly_mimetype+notebook_connected"

cfg = load_config()
BUNDLED = {"baseline": "k3_bs1_base_a", "baseline_repeat": "k3_bs1_base_b", "mla_epilogue_split": "k3_bs1_mla_split",
           "no_attn_forks": "k3_bs1_no_attn_forks", "router_multipass": "k3_bs1_router_multipass",
           "kda_norm_separate": "k3_bs1_kda_norm_separate", "residual_separate": "k3_bs1_residual_separate",
           "kda_cute": "k3_bs1_kda_cute"}
runs = {name: analyze(load_report(Path(TRACES[name]) if name in TRACES else bundled_trace(trace)), cfg)
        for name, trace in BUNDLED.items()}
{name: a.report for name, a in runs.items()}

# %% [markdown]
# ## Seed 000: the MLA decode q-concat + latent-cache epilogue
# One warp per 576-wide row (old) against the row split over 3 warps with the
# producer-independent loads before the dependency wait and an early trigger (new): the
# kernel's mean, the pre-attention window (median over full-attention layers x stable
# steps), the stable step and the ITL.

# %%
tables.epilogue_table(runs["baseline"], runs["mla_epilogue_split"], "mla_q_concat_kernel")

# %%
d000 = diff([runs["baseline"]], [runs["mla_epilogue_split"]])
{k: d000.to_json()[k] for k in ("itl_delta_us", "noise_band_us", "verdict")}

# %%
figures.pre_attention_compare(sides.pre_attention_by_layer(runs["baseline"], runs["mla_epilogue_split"]),
                              "seed 000: pre-attention window per full-attention layer, old vs new")

# %% [markdown]
# ## Seed 001: the attention forks onto the aux stream
# Per family: segments per step, device busy, two-stream residency and its share of busy,
# before (every attention launch on the main stream) and after, with the noise from two
# zero-change runs of the baseline.

# %%
tables.residency_table([runs["no_attn_forks"]], [runs["baseline"]],
                       zero_change=[runs["baseline"], runs["baseline_repeat"]])

# %%
figures.family_bars(runs["baseline"].families, "after: per family, median over stable steps")

# %%
d001 = diff([runs["no_attn_forks"]], [runs["baseline"], runs["baseline_repeat"]])
{k: d001.to_json()[k] for k in ("itl_delta_us", "noise_band_us", "noise_source", "verdict")}

# %% [markdown]
# ## Seed 003: a campaign of kernel changes
# Each change's measured ITL delta against its noise band, next to the standalone estimate
# the campaign used: per-layer kernel time difference x the layers it touches at full depth.

# %%
tables.change_table([
    ("single-CTA top-16 router (was multipass)", runs["router_multipass"], runs["baseline"],
     ["moe_router_group_kernel", "moe_router_merge_kernel"], ["moe_router_kernel"], FULL_DEPTH["moe"]),
    ("KDA gated-RMSNorm fused into the step", runs["kda_norm_separate"], runs["baseline"],
     ["kda_step_kernel", "kda_gated_rmsnorm_kernel"], ["kda_step_kernel"], FULL_DEPTH["kda"]),
    ("residual add folded into attn_res score", runs["residual_separate"], runs["baseline"],
     # two aggregations per layer, each with its score kernel
     ["residual_add_kernel", "attn_res_score_kernel"], ["attn_res_score_kernel"],
     2 * (FULL_DEPTH["kda"] + FULL_DEPTH["mla"])),
    ("KDA step in CuTe DSL (was Triton)", runs["baseline"], runs["kda_cute"],
     ["kda_step_kernel"], [k for k in runs["kda_cute"].kernel_table["name"] if k.startswith("kernel_cutlass__kda_step")],
     FULL_DEPTH["kda"]),
])
