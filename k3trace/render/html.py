"""The self-contained HTML report of a diff: plotly's JavaScript is inlined, so the page
renders without a network connection. All figures come from render/figures.py."""

from __future__ import annotations

import html
import os
from pathlib import Path

from k3trace.render import figures


def diff_page(d) -> str:
    first = True

    def embed(fig) -> str:
        nonlocal first
        out = fig.to_html(full_html=False, include_plotlyjs=True if first else False)
        first = False
        return out

    old, new = d.old[0], d.new[0]
    band = "n/a" if d.noise_band_us is None else f"&plusmn;{d.noise_band_us:.2f} us ({d.noise_source})"
    notes = "".join(f"<li>{html.escape(c)}</li>" for c in d.caveats())
    table = d.attribution.head(40).select("edit", "kind", "detail", "family", "layer_scope", "contribution_us",
                                          "stderr_us", "share")
    fam = d.families.select(
        "family", "segments_per_step_old", "segments_per_step_new", "device_busy_us_old", "device_busy_us_new",
        "two_stream_residency_us_old", "two_stream_residency_us_new", "exposed_us_old", "exposed_us_new",
        "critical_us_old", "critical_us_new",
    )
    parts = [
        f"<h1>k3trace diff</h1><p>old: {html.escape(', '.join(a.report for a in d.old))}<br>"
        f"new: {html.escape(', '.join(a.report for a in d.new))}</p>",
        f"<p><b>ITL (step period) {d.itl_delta_us:+.2f} us/step</b>, noise band {band}: "
        f"<b>{d.verdict_itl.replace('_', ' ')}</b>. GPU step span {d.span_delta_us:+.2f} us: "
        f"<b>{d.verdict_span.replace('_', ' ')}</b>; host share {d.host_delta_us:+.2f} us.</p>"
        f"<p><b>{html.escape(d.summary())}</b></p>" + (f"<ul>{notes}</ul>" if notes else ""),
        embed(figures.attribution_waterfall(d.waterfall(), "step span, old to new: counterfactual attribution")),
        embed(figures.step_timeline(old.step_timeline(), f"old: {old.report}, representative stable step")),
        embed(figures.step_timeline(new.step_timeline(), f"new: {new.report}, representative stable step")),
        embed(figures.table(fam, "families, old vs new (us per step, median over stable steps)")),
        embed(figures.table(table, "attribution by edit (Shapley contribution, us per step)", digits=3)),
    ]
    body = "\n".join(f"<section>{p}</section>" for p in parts)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>k3trace diff</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}</style></head>"
        f"<body>{body}</body></html>"
    )


def write_diff_page(d, path: Path) -> None:
    """Write the page atomically; the temporary file is removed on every exit path."""
    path = Path(path)
    page = diff_page(d)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
