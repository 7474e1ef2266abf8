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
# What a K3 performance engineer opens after `k3trace record`: the completeness of the
# capture, the step-time distribution and the stable-step cut, the family table, the
# kernel time per layer, the pre-attention window per full-attention layer, the critical
# path by family and kernel, PDL edges, and one step's timeline. Every number comes from
# `k3trace.analyses` (docs/metrics.md); `k3trace analyze REPORT --html FILE` writes the
# same views as one page.

# %% tags=["parameters"]
REPORT = None  # a report path (.nsys-rep, SQLite, parquetdir); None: a trace bundled with k3trace
BUNDLED = "small_inside_a"

# %%
from pathlib import Path

import plotly.io as pio
import polars as pl
from IPython.display import HTML

from k3trace.analyses import analyze
from k3trace.analyses.distribution import histogram, step_values, steps_us
from k3trace.analyses.pdl import edge_table
from k3trace.analyses.per_layer import layer_family_table
from k3trace.analyses.timeline import step_timeline
from k3trace.config import load_config
from k3trace.demo import bundled_trace
from k3trace.ingest import load_report
from k3trace.render import figures
from k3trace.render.html import ANATOMY_COLUMNS, FAMILY_COLUMNS, KERNEL_COLUMNS, completeness_block
from k3trace.render.tables import STYLE, Column, html_table

# JupyterLab draws the plotly mimetype; an HTML export (nbconvert) loads plotly.js from its CDN.
pio.renderers.default = "plotly_mimetype+notebook_connected"

path = Path(REPORT) if REPORT else bundled_trace(BUNDLED)
a = analyze(load_report(path), load_config())
HTML(f"<style>{STYLE}</style>" + completeness_block(a))

# %%
a.to_json()["steps"]

# %% [markdown]
# ## Step times and the stable-step cut
# Warm-up steps, outliers beyond median ± k·MAD, and steps of another signature are dropped;
# the ITL proxy is the median period of the stable ones.

# %%
figures.step_distribution(steps_us(a.steps), histogram({"stable": step_values(a.step_times, "period")}),
                          a.step_stats["period"], f"step period, {a.report}")

# %%
pl.DataFrame([{"metric": k, **v} for k, v in a.step_stats.items()])

# %% [markdown]
# ## Families (the table of seed 001)

# %%
HTML(html_table(a.families, FAMILY_COLUMNS))

# %%
figures.family_bars(a.families, "per family, us per stable step")

# %% [markdown]
# ## Segment anatomy: each family's usual segment, kernel by kernel
# One layer's kernels of a family, in launch order: median start and end from the segment's
# first kernel, over every layer and stable step; muted where the kernel is rarely on the
# critical path. Under PDL a kernel's bar starts at its launch, its producer's tail included.

# %%
figures.segment_anatomy(a.anatomy.dominant(), a.families["family"].to_list(), "each family's usual segment")

# %%
HTML(html_table(a.anatomy.kernels, ANATOMY_COLUMNS))

# %% [markdown]
# ## Per layer

# %%
figures.per_layer_bars(layer_family_table(a.path), "kernel time per layer and family")

# %% [markdown]
# ## Pre-attention window per full-attention layer (the number of seed 000)

# %%
figures.pre_attention_bars(a.pre_attention_by_layer(), a.pre_attention_summary, "pre-attention window per layer")

# %% [markdown]
# ## The critical path, by family and by kernel
# Slack: how much longer a kernel could run before the step's span grows. Click a header to sort.

# %%
figures.critical_bars(a.kernel_table, "name", "time on the critical path by kernel (top 20)")

# %%
HTML(html_table(a.kernel_table.sort("critical_us", descending=True, nulls_last=True), KERNEL_COLUMNS))

# %%
a.path_steps.select(pl.col("path_kernels", "bubbles", "pdl_edges_on_path").median(),
                    (pl.col("bubble_ns").median() / 1e3).alias("bubble_us"))

# %% [markdown]
# ## PDL edges

# %%
HTML(html_table(edge_table(a.path, a.config, a.stable_steps), [
    Column("producer", "producer", "name"), Column("dependent", "dependent", "name"), Column("family", "family"),
    Column("pairs_per_step", "pairs / step", "num", 1), Column("pdl_per_step", "PDL edges / step", "num", 1),
    Column("pdl_share", "PDL share", "share")], max_rows=15))

# %% [markdown]
# ## One step: a row per capture stream, the critical path solid and joined, the rest muted
# Hover a kernel for its layer, PDL edge and the wait before it; pick a layer in the menu to zoom.

# %%
figures.step_timeline(step_timeline(a), f"representative stable step {a.representative_step()} of {a.report}")
