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
# # Compare two builds
#
# Which kernel change moved the ITL, and by how much? Each side is one report or several
# repeated runs of one build. The attribution splits the step's change into edits (fusions,
# splits, swaps, duration, dependency and gap changes) by their Shapley values on the
# replayed union of both builds' step graphs (docs/metrics.md, "Diff");
# `k3trace diff OLD NEW --html FILE` writes the same views as one page.

# %% tags=["parameters"]
OLD = None  # list of report paths for the old build; None: bundled traces
NEW = None
BUNDLED_OLD = ["hf_base_a", "hf_base_b"]   # transformers' Llama, one CUDA graph
BUNDLED_NEW = ["hf_norm_fused_a"]          # its RMSNorm fused

# %%
from pathlib import Path

import plotly.io as pio
from IPython.display import HTML

from k3trace.analyses import analyze
from k3trace.analyses.timeline import step_timeline
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.diff import diff, sides
from k3trace.ingest import load_report
from k3trace.render import figures
from k3trace.render.html import ATTRIBUTION_COLUMNS, completeness_block
from k3trace.render.tables import STYLE, Column, html_table

# JupyterLab draws the plotly mimetype; an HTML export (nbconvert) loads plotly.js from its CDN.
pio.renderers.default = "plotly_mimetype+notebook_connected"

cfg = load_config()
old_paths = [Path(p) for p in OLD] if OLD else [bundled_trace(n) for n in BUNDLED_OLD]
new_paths = [Path(p) for p in NEW] if NEW else [bundled_trace(n) for n in BUNDLED_NEW]
old = [analyze(load_report(p), cfg) for p in old_paths]
new = [analyze(load_report(p), cfg) for p in new_paths]
d = diff(old, new)
HTML(f"<style>{STYLE}</style>" + "".join(completeness_block(a, side) for side, runs in (("old", old), ("new", new))
                                         for a in runs))

# %%
{k: d.to_json()[k] for k in ("itl_delta_us", "span_delta_us", "host_delta_us", "noise_band_us", "noise_source",
                             "verdict_itl", "verdict_span", "caveats")}

# %% [markdown]
# ## From the old step to the new one

# %%
figures.attribution_waterfall(d.waterfall(), "step span, old to new: counterfactual attribution",
                              d.span_noise_band_us, d.noise_source)

# %%
HTML(html_table(d.attribution, ATTRIBUTION_COLUMNS, max_rows=20))

# %%
{"all edits replayed (= sum of contributions)": d.modelled_us, "mean step delta": d.mean_span_delta_us,
 "residual": d.residual_us, "median step delta": d.span_delta_us, "median vs mean": d.skew_us,
 "explained": d.explained}

# %% [markdown]
# ## Step times of both builds

# %%
figures.step_distributions(sides.step_distributions(old, new),
                           {m: {"old": sides.central(old, m), "new": sides.central(new, m)} for m in ("period", "span")},
                           {"period": d.noise_band_us, "span": d.span_noise_band_us}, "stable-step times, old vs new")

# %% [markdown]
# ## Matched kernels: what was added or removed, per segment

# %%
HTML(html_table(d.segment_changes(), [Column("layer", "layer", "int"), Column("family", "family"),
                                      Column("matched", "matched", "int"), Column("added", "added", "list"),
                                      Column("removed", "removed", "list")]))

# %% [markdown]
# ## Families, old vs new (us per step)

# %%
sides.family_changes(d.families)

# %% [markdown]
# ## Where along the model the step moved
# Per segment kind (a (layer, family)'s first kernel to the next one's: `moe > kda`), its median
# time old and new and what it adds to a step, whichever kernel recorded the time.

# %%
d.segments if d.segments is None else d.segments.select(
    "kind", "per_step_old", "per_step_new", "time_us_old", "time_us_new", "us_per_step_delta")

# %%
d.segments_total, d.span_delta_us

# %% [markdown]
# ## One step of the new build

# %%
figures.step_timeline(step_timeline(sides.representative(new)), f"new build: {sides.representative(new).report}")
