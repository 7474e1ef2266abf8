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
# # Explore one decode trace
#
# What a K3 performance engineer opens after `k3trace record`: the step-time distribution
# and the stable-step cut, the family table, one step's timeline with the critical path,
# the kernels sortable by busy, exposed and critical time, and the pre-attention window per
# full-attention layer. Every number comes from `k3trace.analyses.analyze` (docs/metrics.md).

# %% tags=["parameters"]
REPORT = None  # a report path (.nsys-rep, SQLite, parquetdir); None: a trace bundled with k3trace
BUNDLED = "small_inside_a"

# %%
from pathlib import Path

import plotly.io as pio
import polars as pl

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.ingest import load_report
from k3trace.render import figures

# JupyterLab draws the plotly mimetype; an HTML export (nbconvert) needs the inline-JS form.
pio.renderers.default = "plotly_mimetype+notebook"

path = Path(REPORT) if REPORT else bundled_trace(BUNDLED)
a = analyze(load_report(path), load_config())
summary = a.to_json()
summary["steps"]

# %% [markdown]
# ## Step times and the stable-step cut
# Warm-up steps, outliers beyond median ± k·MAD, and steps of another signature are dropped;
# the ITL proxy is the median period of the stable ones.

# %%
figures.step_distribution(a.steps, f"step period, {a.report} (stable vs dropped)")

# %%
pl.DataFrame([{"metric": k, **v} for k, v in a.step_stats.items()])

# %% [markdown]
# ## Families

# %%
a.families

# %%
figures.family_bars(a.families, "per family, median over stable steps")

# %% [markdown]
# ## One step: streams as rows, kernels coloured by family, the critical path outlined
# Zoom with the mouse; hover a kernel for its layer, PDL edge and the bubble before it.

# %%
figures.step_timeline(a.step_timeline(), f"representative stable step {a.representative_step()} of {a.report}")

# %%
a.path_steps.select(pl.col("path_kernels", "bubbles", "pdl_edges_on_path").median(),
                    (pl.col("bubble_ns").median() / 1e3).alias("bubble_us"))

# %% [markdown]
# ## Kernels, sortable by busy, exposed and critical time

# %%
columns = ["name", "family", "calls_per_step", "mean_us", "busy_per_step_us", "exposed_per_step_us",
           "critical_us", "slack_us", "hidden_share"]
figures.sortable_table(a.kernel_table.select(columns), ["busy_per_step_us", "exposed_per_step_us", "critical_us"],
                       "kernels per stable step (us)")

# %% [markdown]
# ## Pre-attention window per full-attention layer

# %%
a.pre_attention_by_layer()

# %%
summary["pre_attention_window_us"], summary["labels"], summary["completeness"]
