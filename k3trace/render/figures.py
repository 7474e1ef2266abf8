"""Plotly figures, shared by the HTML report and the notebooks. They draw frames the
analyses computed; nothing here computes a metric."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

FAMILY_COLOURS = {
    "kda": "#1f77b4", "mla": "#d62728", "moe": "#2ca02c", "attn_res": "#9467bd", "dense": "#8c564b",
    "other": "#7f7f7f", "unlabelled": "#bcbd22",
}


def _colour(family: str) -> str:
    return FAMILY_COLOURS.get(family, "#17becf")


def step_timeline(timeline: pl.DataFrame, title: str) -> go.Figure:
    """Streams as rows, kernels as bars coloured by family, the critical path outlined."""
    fig = go.Figure()
    streams = [str(s) for s in sorted(timeline["stream_id"].unique().to_list())]
    for family, rows in timeline.group_by("family", maintain_order=True):
        family = family[0]
        fig.add_trace(go.Bar(
            base=rows["start_us"].to_list(), x=rows["duration_us"].to_list(),
            y=[str(s) for s in rows["stream_id"].to_list()], orientation="h", name=family,
            marker={"color": _colour(family),
                    "line": {"color": ["black" if p else "rgba(0,0,0,0)" for p in rows["on_path"].to_list()],
                             "width": 2}},
            customdata=list(zip(rows["name"].to_list(), rows["layer"].to_list(), rows["on_path"].to_list(),
                                rows["pdl"].to_list(), rows["bubble_us"].to_list())),
            hovertemplate="%{customdata[0]}<br>layer %{customdata[1]}<br>start %{base:.2f} us, "
                          "%{x:.2f} us<br>critical path: %{customdata[2]}, PDL edge: %{customdata[3]}"
                          "<br>bubble before: %{customdata[4]:.2f} us<extra></extra>",
        ))
    fig.update_layout(title=title, barmode="overlay", xaxis_title="time in step (us)", yaxis_title="stream",
                      yaxis={"categoryorder": "array", "categoryarray": streams}, height=max(320, 140 + 28 * len(streams)),
                      legend_title="family (outlined: critical path)")
    return fig


def attribution_waterfall(rows: pl.DataFrame, title: str) -> go.Figure:
    fig = go.Figure(go.Waterfall(
        x=rows["label"].to_list(), y=rows["value_us"].to_list(), measure=rows["kind"].to_list(),
        text=[f"{v:+.2f}" if k == "relative" else f"{v:.1f}" for v, k in zip(rows["value_us"], rows["kind"])],
        textposition="outside",
        # Latency: a bar that makes the step longer is bad (red), one that shortens it good.
        increasing={"marker": {"color": "#d62728"}}, decreasing={"marker": {"color": "#2ca02c"}},
        totals={"marker": {"color": "#7f7f7f"}},
    ))
    # Zoom the axis onto the span range the bars move through: from 0 the deltas vanish.
    levels, level = [], 0.0
    for value, kind in zip(rows["value_us"].to_list(), rows["kind"].to_list()):
        level = level + value if kind == "relative" else value
        levels.append(level)
    pad = max(max(levels) - min(levels), 1.0) * 0.3
    fig.update_layout(title=title, yaxis_title="step span (us)", showlegend=False, height=520,
                      yaxis_range=[min(levels) - pad, max(levels) + pad])
    return fig


def table(frame: pl.DataFrame, title: str, digits: int = 2) -> go.Figure:
    def fmt(v):
        return f"{v:,.{digits}f}" if isinstance(v, float) else v

    fig = go.Figure(go.Table(
        header={"values": frame.columns, "align": "left"},
        cells={"values": [[fmt(v) for v in frame[c].to_list()] for c in frame.columns], "align": "left"},
    ))
    fig.update_layout(title=title, height=220 + 36 * frame.height)
    return fig


def step_distribution(steps: pl.DataFrame, title: str) -> go.Figure:
    """Step periods in order, stable steps and dropped ones (by reason) apart."""
    fig = go.Figure()
    for reason, rows in steps.with_columns(pl.col("drop_reason").fill_null("stable")).group_by(
            "drop_reason", maintain_order=True):
        fig.add_trace(go.Scatter(x=rows["step"].to_list(), y=(rows["period"] / 1e3).to_list(), mode="markers",
                                 name=reason[0]))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="period (us)")
    return fig


def family_bars(families: pl.DataFrame, title: str) -> go.Figure:
    fig = go.Figure()
    for col, label in (("device_busy_us", "device busy"), ("two_stream_residency_us", "two-stream residency"),
                       ("exposed_us", "exposed"), ("critical_us", "on critical path")):
        fig.add_trace(go.Bar(x=families["family"].to_list(), y=families[col].to_list(), name=label))
    fig.update_layout(title=title, barmode="group", yaxis_title="us per step")
    return fig


def sortable_table(frame: pl.DataFrame, sort_by: list[str], title: str, digits: int = 2) -> go.Figure:
    """A table with one button per column in `sort_by` that orders the rows by it
    (descending). Each ordering is the frame sorted, precomputed; no metric is computed."""
    def cells(f: pl.DataFrame) -> list[list]:
        return [[f"{v:,.{digits}f}" if isinstance(v, float) else v for v in f[c].to_list()] for c in f.columns]

    orders = {col: frame.sort(col, descending=True, nulls_last=True) for col in sort_by}
    first = orders[sort_by[0]] if sort_by else frame
    fig = go.Figure(go.Table(header={"values": frame.columns, "align": "left"},
                             cells={"values": cells(first), "align": "left"}))
    fig.update_layout(
        title=title, height=220 + 30 * min(frame.height, 40),
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0, "y": 1.08, "xanchor": "left",
                      "buttons": [{"label": f"sort by {col}", "method": "restyle",
                                   "args": [{"cells.values": [cells(orders[col])]}]} for col in sort_by]}],
    )
    return fig
