"""Plotly figures, shared by the HTML reports and the notebooks. They draw frames the
analyses computed (bins, medians, rows, extents come with the data); nothing here computes
a metric. Tables are HTML (render/tables.py), never plotly tables."""

from __future__ import annotations

import zlib
from typing import Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from k3trace.text import layer_text

FAMILY_COLOURS = {
    "kda": "#1f77b4", "mla": "#d62728", "moe": "#2ca02c", "attn_res": "#9467bd", "dense": "#8c564b",
    "other": "#7f7f7f", "unlabelled": "#bcbd22",
    # transformers' module families (kernels/hf_llama.py)
    "attn": "#e377c2", "mlp": "#17becf", "head": "#ff7f0e", "embed": "#aec7e8", "norm": "#98df8a",
}
_PALETTE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
#: Latency: longer is bad (red), shorter good (green).
LONGER, SHORTER, NEUTRAL = "#c62828", "#2e7d32", "#757575"
OLD_COLOUR, NEW_COLOUR = "#5c6bc0", "#ef6c00"
PATH_COLOUR, PDL_COLOUR, WAIT_COLOUR = "#111111", "#8e24aa", "#e53935"
WAITS_ROW = "path waits"
LAYOUT = {"template": "plotly_white", "font": {"size": 13}, "hoverlabel": {"font": {"family": "monospace"}}}


def colour(family: str | None) -> str:
    """A family's colour; families outside the table get a stable one from a palette."""
    family = family or "unlabelled"
    return FAMILY_COLOURS.get(family) or _PALETTE[zlib.crc32(family.encode()) % len(_PALETTE)]


def wrap(text: str, width: int = 64) -> str:
    """Break a long label into lines of about `width` characters at spaces (plotly labels
    take <br>); a kernel name is never split."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "<br>".join(lines)


# -- one build -------------------------------------------------------------------------------

def step_distribution(steps: pl.DataFrame, hist: pl.DataFrame, quantiles: dict[str, float | None],
                      title: str) -> go.Figure:
    """Left: every step's period in order, stable and dropped (by reason). Right: the stable
    steps' periods binned, with their median, p90 and p99. `steps` from
    distribution.steps_us, `hist` from distribution.histogram, `quantiles` step_stats['period']."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.58, 0.42], horizontal_spacing=0.1,
                        subplot_titles=("period of every step, in order", "stable steps' period"))
    markers = {"stable": ("#1565c0", "circle"), "warm-up": ("#9e9e9e", "x"), "outlier": ("#e53935", "diamond"),
               "incomplete": ("#6d4c41", "square"), "other signature": ("#fb8c00", "triangle-up")}
    for (status,), rows in steps.group_by("status", maintain_order=True):
        c, symbol = markers.get(status, ("#000000", "cross"))
        fig.add_trace(go.Scatter(
            x=rows["step"].to_list(), y=rows["period_us"].to_list(), mode="markers",
            name=f"{status}: {rows.height} step{'s' if rows.height != 1 else ''}",
            marker={"color": c, "symbol": symbol, "size": 7 if status == "stable" else 9},
            hovertemplate="step %{x}<br>period %{y:,.2f} us<extra>" + status + "</extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=[(a + b) / 2 for a, b in zip(hist["left"], hist["right"])], y=hist["count"].to_list(),
                         width=[b - a for a, b in zip(hist["left"], hist["right"])], marker_color="#1565c0",
                         name="stable steps", showlegend=False,
                         customdata=list(zip(hist["left"].to_list(), hist["right"].to_list())),
                         hovertemplate="%{customdata[0]:,.2f} - %{customdata[1]:,.2f} us: %{y} steps<extra></extra>"),
                  row=1, col=2)
    for i, (key, dash) in enumerate((("median", "solid"), ("p90", "dash"), ("p99", "dot"))):
        if quantiles.get(key) is not None:
            fig.add_vline(x=quantiles[key], line_dash=dash, line_color="#212121", row=1, col=2,
                          annotation_text=f"{key} {quantiles[key]:,.2f}", annotation_position="top right",
                          annotation_yshift=-16 * (i + 1), annotation_font_size=11,
                          annotation_bgcolor="rgba(255,255,255,0.8)")
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="period (us)", row=1, col=1)
    fig.update_xaxes(title_text="period (us)", row=1, col=2)
    fig.update_yaxes(title_text="steps", row=1, col=2)
    fig.update_layout(**LAYOUT, title=title, height=420, legend={"orientation": "h", "y": -0.22}, bargap=0.02)
    return fig


def family_bars(families: pl.DataFrame, title: str) -> go.Figure:
    fig = go.Figure()
    for col, label, c in (("device_busy_us", "device busy", "#90a4ae"),
                          ("two_stream_residency_us", "two-stream residency", "#1e88e5"),
                          ("exposed_us", "exposed", "#fb8c00"), ("critical_us", "on the critical path", "#37474f")):
        fig.add_trace(go.Bar(x=families["family"].to_list(), y=families[col].to_list(), name=label, marker_color=c,
                             hovertemplate="%{x}: %{y:,.1f} us per step<extra>" + label + "</extra>"))
    fig.update_layout(**LAYOUT, title=title, barmode="group", yaxis_title="us per stable step (median)", height=400)
    return fig


def per_layer_bars(table: pl.DataFrame, title: str) -> go.Figure:
    """Kernel time per layer, stacked by family (layer_family_table)."""
    fig = go.Figure()
    layers = [f"L{x}" for x in table["layer"].unique().sort().to_list()]
    for (family,), rows in table.group_by("family", maintain_order=True):
        fig.add_trace(go.Bar(
            x=[f"L{x}" for x in rows["layer"].to_list()], y=rows["kernel_us"].to_list(), name=family,
            marker_color=colour(family),
            customdata=list(zip(rows["kernels"].to_list(), rows["critical_us"].to_list())),
            hovertemplate="%{x} " + family + ": %{y:,.2f} us of kernels (%{customdata[0]:g} per step), "
                          "%{customdata[1]:,.2f} us on the critical path<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title, barmode="stack", yaxis_title="kernel time per stable step (us, median)",
                      xaxis={"title": "layer", "categoryorder": "array", "categoryarray": layers}, height=420,
                      legend_title="family")
    return fig


def dram_profile(profile: pl.DataFrame, peak_tbs: float, title: str) -> go.Figure:
    """Mean DRAM read throughput by time since a segment's start, one line per segment kind
    (dram.profile's bins), the peak as a dashed line."""
    fig = go.Figure()
    seen: dict[str, int] = {}   # kinds of one family: its colour, each with its own dash
    for (kind,), rows in profile.group_by("kind", maintain_order=True):
        family = kind.split(" > ")[0]
        seen[family] = seen.get(family, -1) + 1
        fig.add_trace(go.Scatter(
            x=rows["t_us"].to_list(), y=rows["read_tbs"].to_list(), mode="lines", name=kind,
            line={"color": colour(family), "dash": ("solid", "dot", "dash", "dashdot")[seen[family] % 4]},
            customdata=rows["instances"].to_list(),
            hovertemplate=kind + ": %{x:g}-us bin, %{y:.2f} TB/s over %{customdata} segments<extra></extra>"))
    fig.add_hline(y=peak_tbs, line_dash="dash", line_color="#212121", annotation_text=f"peak {peak_tbs:.2f} TB/s",
                  annotation_position="top left")
    fig.update_layout(**LAYOUT, title=title, xaxis_title="time since the segment's first kernel started (us)",
                      yaxis_title="DRAM read (TB/s, mean)", height=440, legend_title="segment")
    return fig


def segment_anatomy(kernels: pl.DataFrame, families: Sequence[str], title: str) -> go.Figure:
    """Each family's usual segment (anatomy.Anatomy.dominant()), one row per kernel in launch
    order, families stacked in the order given: a bar from the median start to the median end,
    solid where the kernel is on the critical path in most segments, muted where it rarely is."""
    fig = go.Figure()
    order: list[str] = []
    for family in families:
        rows = kernels.filter(pl.col("family") == family)
        if rows.is_empty():
            continue
        labels = [f"{family} {p}: {n}" for p, n in zip(rows["position"].to_list(), rows["name"].to_list())]
        order += labels
        fig.add_trace(go.Bar(
            base=rows["start_us"].to_list(), x=(rows["end_us"] - rows["start_us"]).to_list(), y=labels,
            orientation="h", name=family, width=0.7,
            marker={"color": colour(family), "opacity": [0.3 + 0.7 * v for v in rows["on_path_share"].to_list()],
                    "line": {"color": "#ffffff", "width": 0.6}},
            customdata=list(zip(rows["name"].to_list(), rows["role"].to_list(), rows["duration_us"].to_list(),
                                rows["on_path_share"].to_list(), rows["critical_us"].to_list())),
            hovertemplate="<b>%{customdata[0]}</b> (" + family + ", %{customdata[1]})<br>%{base:,.2f} -> "
                          "%{x:,.2f} us later; duration %{customdata[2]:,.2f} us (medians)<br>on the critical path in "
                          "%{customdata[3]:.0%} of the segments, %{customdata[4]:,.2f} us there (mean)<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title, barmode="overlay",
                      xaxis_title="time since the segment's first kernel started (us, median)",
                      yaxis={"categoryorder": "array", "categoryarray": order, "autorange": "reversed", "title": None,
                             "automargin": True},
                      height=200 + 22 * len(order), legend_title="family (muted: rarely on the critical path)")
    return fig


def pre_attention_bars(by_layer: pl.DataFrame, summary: dict | None, title: str) -> go.Figure:
    """The window per full-attention layer: median over stable steps, p90 as the whisker."""
    fig = go.Figure(go.Bar(
        x=[f"L{x}" for x in by_layer["layer"].to_list()], y=by_layer["median_us"].to_list(), marker_color=colour("mla"),
        error_y={"type": "data", "symmetric": False, "array": (by_layer["p90_us"] - by_layer["median_us"]).to_list(),
                 "arrayminus": [0] * by_layer.height, "color": "#424242"},
        text=[f"{v:.2f}" for v in by_layer["median_us"].to_list()], textposition="inside",
        customdata=list(zip(by_layer["p90_us"].to_list(), by_layer["steps"].to_list())),
        hovertemplate="%{x}: median %{y:.2f} us, p90 %{customdata[0]:.2f} us over %{customdata[1]} steps"
                      "<extra></extra>", name="median (whisker: p90)"))
    if summary:
        fig.add_hline(y=summary["median"], line_dash="dash", line_color="#212121",
                      annotation_text=f"median over {summary['count']} layer x step pairs: {summary['median']:.2f} us",
                      annotation_position="top left")
    fig.update_layout(**LAYOUT, title=title, yaxis_title="window (us)", xaxis_title="full-attention layer",
                      height=380, showlegend=False)
    return fig


def critical_bars(frame: pl.DataFrame, label_col: str, title: str, top: int = 20) -> go.Figure:
    """Time on the critical path per family or per kernel (horizontal, largest on top), with
    the rest of each one's busy time and its slack in the hover."""
    f = frame.sort("critical_us", descending=True, nulls_last=True).head(top)
    labels = [wrap(f"{n} ({fam})" if label_col == "name" else n, 70)
              for n, fam in zip(f[label_col].to_list(), f["family"].to_list())]
    extra = (list(zip(f["slack_us"].to_list(), f["calls_per_step"].to_list())) if "slack_us" in f.columns
             else [(None, None)] * f.height)
    fig = go.Figure(go.Bar(
        y=labels, x=f["critical_us"].to_list(), orientation="h", marker_color=[colour(x) for x in f["family"]],
        text=[f"{v:,.1f}" for v in f["critical_us"].to_list()], textposition="outside", cliponaxis=False,
        customdata=extra,
        hovertemplate="%{y}<br>%{x:,.2f} us per step on the critical path"
                      + ("<br>%{customdata[1]:g} calls per step, slack %{customdata[0]:,.2f} us" if "slack_us" in
                         f.columns else "") + "<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title, xaxis_title="us on the critical path per stable step (median)",
                      yaxis={"autorange": "reversed", "automargin": True}, height=160 + 30 * f.height,
                      margin={"l": 20, "r": 60})
    return fig


def step_timeline(tl, title: str, x_range: tuple[float, float] | None = None) -> go.Figure:
    """One step (analyses.timeline.Timeline): a row per stream role, main on top; kernels
    coloured by family, the critical path solid with a dark outline and joined by a line,
    the rest muted; PDL edges as purple marks at the dependent's start; the path's waits
    on their own row; alternating bands per layer; a menu zooms to one layer."""
    rows = [*tl.rows, WAITS_ROW]
    k = tl.kernels
    fig = go.Figure()
    for (family,), fam in k.group_by("family", maintain_order=True):
        for on_path in (False, True):
            part = fam.filter(pl.col("on_path") == on_path)
            if part.is_empty():
                continue
            fig.add_trace(go.Bar(
                base=part["start_us"].to_list(), x=part["duration_us"].to_list(), y=part["role"].to_list(),
                orientation="h", name=family, legendgroup=family, showlegend=on_path or fam["on_path"].sum() == 0,
                opacity=1.0 if on_path else 0.3, width=0.7,
                marker={"color": colour(family), "line": {"color": "#ffffff", "width": 0.6}},
                customdata=list(zip(part["name"].to_list(), part["layer"].to_list(), part["stream_id"].to_list(),
                                    part["critical_us"].to_list(), part["bubble_us"].to_list(),
                                    part["pdl"].to_list())),
                hovertemplate="<b>%{customdata[0]}</b><br>" + family + ", layer %{customdata[1]}, %{y} "
                              "(recorded stream %{customdata[2]})<br>start %{base:,.3f} us, %{x:,.3f} us<br>"
                              + ("on the critical path: %{customdata[3]:,.3f} us, wait before %{customdata[4]:,.3f} us"
                                 if on_path else "off the critical path") +
                              "<br>released by PDL: %{customdata[5]}<extra></extra>"))
    if tl.path.height:
        xs, ys = [], []
        for r in tl.path.iter_rows(named=True):
            xs += [r["start_us"], r["end_us"]]
            ys += [r["role"], r["role"]]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": PATH_COLOUR, "width": 1.6},
                                 name="critical path (solid bars)", hoverinfo="skip"))
    if tl.pdl_edges.height:
        e = tl.pdl_edges
        fig.add_trace(go.Scatter(
            x=e["dependent_start_us"].to_list(), y=e["dependent_role"].to_list(), mode="markers",
            marker={"symbol": "triangle-right", "size": 7, "color": PDL_COLOUR, "line": {"width": 0}},
            name=f"PDL edge ({e.height})",
            customdata=list(zip(e["producer"].to_list(), e["dependent"].to_list(), e["producer_role"].to_list())),
            hovertemplate="PDL: %{customdata[0]} (%{customdata[2]}) -> %{customdata[1]} (%{y})<br>dependent starts "
                          "%{x:,.3f} us<extra></extra>"))
    if tl.bubbles.height:
        b = tl.bubbles
        fig.add_trace(go.Scatter(
            x=b["start_us"].to_list(), y=[WAITS_ROW] * b.height, mode="markers",
            # a tick's height grows with the wait: 1 ns and 5 us must not look alike
            marker={"symbol": "line-ns", "size": [4 + 26 * min(1.0, w / 5.0) ** 0.5 for w in b["wait_us"].to_list()],
                    "color": WAIT_COLOUR, "line": {"width": 2, "color": WAIT_COLOUR}},
            name=f"wait on the critical path ({b.height})",
            customdata=list(zip(b["wait_us"].to_list(), b["before"].to_list(), b["role"].to_list())),
            hovertemplate="wait of %{customdata[0]:,.3f} us on %{customdata[2]} before %{customdata[1]}"
                          "<br>at %{x:,.3f} us<extra></extra>"))
    show_labels = tl.layers.height <= 40
    for i, r in enumerate(tl.layers.iter_rows(named=True)):
        if i % 2 == 0:
            fig.add_vrect(x0=r["start_us"], x1=r["end_us"], fillcolor="#000000", opacity=0.045, line_width=0,
                          layer="below")
        if show_labels or i % 5 == 0:
            fig.add_annotation(x=(r["start_us"] + r["end_us"]) / 2, y=1.0, yref="paper", yanchor="bottom",
                               text=f"L{r['layer']}", showarrow=False, font={"size": 10, "color": "#616161"})
    buttons = [{"label": "whole step", "method": "relayout",
                "args": [{"xaxis.range": list(x_range) if x_range else [0, tl.span_us]}]}]
    buttons += [{"label": f"layer {r['layer']} ({', '.join(r['families'])})", "method": "relayout",
                 "args": [{"xaxis.range": [r["start_us"] - 0.5, r["end_us"] + 0.5]}]}
                for r in tl.layers.iter_rows(named=True)]
    fig.update_layout(
        **LAYOUT, barmode="overlay",
        title={"text": title, "subtitle": {"text": tl.roles.describe()}},
        xaxis={"title": "time in the step (us)", "range": list(x_range) if x_range else [0, tl.span_us]},
        yaxis={"categoryorder": "array", "categoryarray": rows, "autorange": "reversed", "title": None,
               "automargin": True},
        height=250 + 70 * len(rows), margin={"t": 120, "b": 130},
        legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom",
                "title": "family (muted: off the critical path)"},
        updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.22,
                      "yanchor": "bottom", "showactive": True}] if tl.layers.height else [],
    )
    return fig


# -- two builds -------------------------------------------------------------------------------

def attribution_waterfall(rows: pl.DataFrame, title: str, band_us: float | None = None,
                          band_source: str | None = None) -> go.Figure:
    """The step span from the old build to the new, one bar per edit (named by kernel,
    family and layers), measured from the old span (Diff.waterfall's change_us); longer red,
    shorter green; the span's noise band shaded around the old span."""
    labels = []
    for r in rows.iter_rows(named=True):
        if r["kind"] == "absolute":
            labels.append(f"<b>old span {r['value_us']:,.2f} us</b>")
        elif r["kind"] == "total":
            labels.append(f"<b>new span {r['value_us']:,.2f} us</b>")
        elif r["edit"] is not None:
            kind = r["edit_kind"] + (f": {r['detail']}" if r["detail"] else "")
            labels.append(f"{wrap(r['edit'])}<br><span style='font-size:11px;color:#616161'>{wrap(kind, 70)} · "
                          f"{r['family']} · layers {layer_text(r['layers'])}</span>")
        else:
            labels.append(f"<i>{r['label']}</i>")
    text = []
    for r in rows.iter_rows(named=True):
        if r["kind"] == "absolute":
            text.append("")
        elif r["stderr_us"] is not None and r["stderr_us"] >= 0.005:
            text.append(f"{r['change_us']:+,.2f} ±{r['stderr_us']:.2f}")
        else:
            text.append(f"{r['change_us']:+,.2f}")
    lines = [label.count("<br>") + 1 for label in labels]
    fig = go.Figure(go.Waterfall(
        orientation="h", y=labels, x=rows["change_us"].to_list(), measure=rows["kind"].to_list(), text=text,
        textposition="auto", textangle=0, cliponaxis=False, connector={"line": {"color": "#bdbdbd", "width": 1}},
        increasing={"marker": {"color": LONGER}}, decreasing={"marker": {"color": SHORTER}},
        totals={"marker": {"color": NEUTRAL}},
        hovertemplate="%{y}<br>%{x:+,.3f} us<extra></extra>"))
    if band_us:
        fig.add_vrect(x0=-band_us, x1=band_us, fillcolor="#fdd835", opacity=0.35, line_width=0, layer="below",
                      annotation_text=f"noise band ±{band_us:.2f} us ({band_source})", annotation_position="top right",
                      annotation_font_size=11)
    fig.add_vline(x=0, line_color="#424242", line_width=1)
    fig.update_layout(
        **LAYOUT, title={"text": title, "subtitle": {"text": "bars: each edit's Shapley contribution to the step span; "
                                                           "red makes the step longer, green shorter"}},
        xaxis={"title": "change of the step span from the old build (us per step)", "zeroline": False},
        yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
        height=170 + sum(max(36, 18 + 19 * n) for n in lines), showlegend=False, margin={"t": 100, "r": 90})
    return fig


def step_distributions(dists: dict[str, pl.DataFrame], centrals: dict[str, dict[str, float]],
                       bands: dict[str, float | None], title: str) -> go.Figure:
    """Old and new stable steps, period and span, on shared bins (diff.sides); each side's
    central value marked, the new one with the metric's noise band around the old."""
    # A run of one step has no period: that panel is left out.
    metrics = [m for m in ("period", "span") if m in dists and None not in centrals[m].values()]
    names = {"period": "period (ITL proxy)", "span": "GPU span"}
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[names[m] for m in metrics],
                        horizontal_spacing=0.08)
    for col, metric in enumerate(metrics, start=1):
        h = dists[metric]
        for side, c in (("old", OLD_COLOUR), ("new", NEW_COLOUR)):
            part = h.filter(pl.col("series") == side)
            fig.add_trace(go.Bar(
                x=[(a + b) / 2 for a, b in zip(part["left"], part["right"])], y=part["count"].to_list(),
                width=[b - a for a, b in zip(part["left"], part["right"])], name=side, legendgroup=side,
                showlegend=col == 1, marker_color=c, opacity=0.6,
                customdata=list(zip(part["left"].to_list(), part["right"].to_list())),
                hovertemplate=side + ": %{customdata[0]:,.2f} - %{customdata[1]:,.2f} us: %{y} steps<extra></extra>"),
                row=1, col=col)
        band = bands.get(metric)
        old_c, new_c = centrals[metric]["old"], centrals[metric]["new"]
        if band:
            fig.add_vrect(x0=old_c - band, x1=old_c + band, fillcolor="#fdd835", opacity=0.3, line_width=0,
                          row=1, col=col)
        for side, value, c in (("old", old_c, OLD_COLOUR), ("new", new_c, NEW_COLOUR)):
            fig.add_vline(x=value, line_color=c, line_width=2, row=1, col=col,
                          annotation_text=f"{side} {value:,.2f}", annotation_font_color=c,
                          annotation_position="top right" if side == "new" else "top left", annotation_font_size=11)
        fig.update_xaxes(title_text="us", row=1, col=col)
    fig.update_yaxes(title_text="stable steps", row=1, col=1)
    fig.update_layout(**LAYOUT, barmode="overlay", bargap=0.02, height=420,
                      title={"text": title, "subtitle": {"text": "lines: each build's median (the diff's central "
                                                                 "value); shaded: the noise band around the old"}},
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 110})
    return fig


def pre_attention_compare(frame: pl.DataFrame, title: str) -> go.Figure:
    """The window per full-attention layer, old vs new (diff.sides.pre_attention_by_layer)."""
    layers = [f"L{x}" for x in frame["layer"].to_list()]
    fig = go.Figure()
    for side, c in (("old", OLD_COLOUR), ("new", NEW_COLOUR)):
        fig.add_trace(go.Bar(x=layers, y=frame[f"{side}_us"].to_list(), name=side, marker_color=c,
                             text=[f"{v:.2f}" if v is not None else "" for v in frame[f"{side}_us"].to_list()],
                             textposition="outside", cliponaxis=False,
                             customdata=frame[f"{side}_p90_us"].to_list(),
                             hovertemplate=side + " %{x}: median %{y:.2f} us, p90 %{customdata:.2f} us<extra></extra>"))
    for layer, new_v, delta in zip(layers, frame["new_us"].to_list(), frame["delta_us"].to_list()):
        if delta is not None:
            fig.add_annotation(x=layer, y=0, yref="paper", yanchor="top", yshift=-22, showarrow=False,
                               text=f"{delta:+.2f} us", font={"color": LONGER if delta > 0 else SHORTER, "size": 12})
    fig.update_layout(**LAYOUT, title=title, barmode="group", yaxis_title="window (us, median)",
                      height=400, margin={"b": 90}, legend={"orientation": "h", "y": 1.08, "x": 1, "xanchor": "right"})
    return fig
