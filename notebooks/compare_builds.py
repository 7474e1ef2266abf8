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
# replayed union of both builds' step graphs (docs/metrics.md, "Diff").

# %% tags=["parameters"]
OLD = None  # list of report paths for the old build; None: bundled traces
NEW = None
BUNDLED_OLD = ["hf_base_a", "hf_base_b"]   # transformers' Llama, one CUDA graph
BUNDLED_NEW = ["hf_norm_fused_a"]          # its RMSNorm fused

# %%
from pathlib import Path

import plotly.io as pio
import polars as pl

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.diff import diff
from k3trace.ingest import load_report
from k3trace.render import figures

# JupyterLab draws the plotly mimetype; an HTML export (nbconvert) needs the inline-JS form.
pio.renderers.default = "plotly_mimetype+notebook"

cfg = load_config()
old_paths = [Path(p) for p in OLD] if OLD else [bundled_trace(n) for n in BUNDLED_OLD]
new_paths = [Path(p) for p in NEW] if NEW else [bundled_trace(n) for n in BUNDLED_NEW]
old = [analyze(load_report(p), cfg) for p in old_paths]
new = [analyze(load_report(p), cfg) for p in new_paths]
d = diff(old, new)
{k: d.to_json()[k] for k in ("itl_delta_us", "span_delta_us", "host_delta_us", "noise_band_us", "noise_source",
                             "verdict")}

# %% [markdown]
# ## From the old step to the new one

# %%
figures.attribution_waterfall(d.waterfall(), "step span: counterfactual attribution")

# %%
d.attribution.head(20)

# %%
{"all edits replayed (= sum of contributions)": d.modelled_us, "mean step delta": d.mean_span_delta_us,
 "residual": d.residual_us, "median step delta": d.span_delta_us, "median vs mean": d.skew_us,
 "explained": d.explained, "caveats": d.caveats()}

# %% [markdown]
# ## Matched kernels: what was added or removed, per segment

# %%
d.matching.group_by("kind").len()

# %%
d.segment_changes()

# %% [markdown]
# ## Residency and exposed time per family, old vs new

# %%
d.families.select(
    "family",
    (pl.col("two_stream_residency_us_new") - pl.col("two_stream_residency_us_old")).alias("residency_delta_us"),
    (pl.col("exposed_us_new") - pl.col("exposed_us_old")).alias("exposed_delta_us"),
    (pl.col("device_busy_us_new") - pl.col("device_busy_us_old")).alias("busy_delta_us"),
    (pl.col("critical_us_new") - pl.col("critical_us_old")).alias("critical_delta_us"),
)

# %%
figures.step_timeline(new[0].step_timeline(), f"new build: {new[0].report}")
