"""The self-contained HTML reports: one trace (`analyze --html`) and a diff of two builds
(`diff --html`). plotly's JavaScript is inlined once per page, so a page renders without a
network connection. Figures come from render/figures.py, tables from render/tables.py;
every number was computed by the analyses or the diff."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Sequence

import polars as pl

from k3trace import __version__
from k3trace.analyses import Analysis
from k3trace.analyses.distribution import histogram, step_values, steps_us
from k3trace.analyses.pdl import edge_table
from k3trace.analyses.per_layer import layer_family_table
from k3trace.analyses.timeline import step_timeline
from k3trace.diff import sides
from k3trace.diff.coupling import READ_TOGETHER, REASONS
from k3trace.errors import printable
from k3trace.render import figures
from k3trace.render.tables import SORT_SCRIPT, STYLE, Column, html_table, key_values

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def esc(text: object) -> str:
    return html.escape(printable(str(text)))


class _Page:
    """Sections in order; plotly.js goes into the first figure only."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.sections: list[tuple[str, str, str]] = []   # id, heading, html
        self.figures = 0

    def figure(self, fig) -> str:
        first = self.figures == 0
        self.figures += 1
        out = fig.to_html(full_html=False, include_plotlyjs=True if first else False, config=PLOTLY_CONFIG,
                          div_id=f"figure-{self.figures}")
        return f"<div class='figure'>{out}</div>"

    def add(self, ident: str, heading: str, body: str) -> None:
        self.sections.append((ident, heading, body))

    def render(self, header: str) -> str:
        nav = "".join(f"<a href='#{i}'>{esc(h)}</a>" for i, h, _ in self.sections)
        body = "".join(f"<section id='{i}'><h2>{esc(h)}</h2>{b}</section>" for i, h, b in self.sections)
        return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                "<meta name='viewport' content='width=device-width, initial-scale=1'>"
                f"<title>{esc(self.title)}</title><style>{STYLE}</style></head><body>"
                f"<nav>{nav}</nav><main>{header}{body}"
                f"<p class='meta'>k3trace {esc(__version__)}; every number is defined in docs/metrics.md.</p>"
                f"</main><script>{SORT_SCRIPT}</script></body></html>")


def _lead(text: str) -> str:
    return f"<p class='lead'>{text}</p>"


# -- shared pieces ----------------------------------------------------------------------------

FAMILY_COLUMNS = [
    Column("family", "family"),
    Column("segments_per_step", "segments / step", "num", 0, "contiguous runs of one (layer, family) per step"),
    Column("device_busy_us", "device busy (us/step)", "num", 1, "union of the family's kernel intervals"),
    Column("two_stream_residency_us", "two-stream residency (us/step)", "num", 1,
           "time inside the family's segments with kernels on two or more streams"),
    Column("share_of_busy", "residency share of busy", "share"),
    Column("exposed_us", "exposed (us/step)", "num", 1, "the family's kernel time with no other stream running"),
    Column("critical_us", "on the critical path (us/step)", "num", 1),
]

DRAM_FAMILY_COLUMNS = [
    Column("family", "family"),
    Column("device_busy_us", "device busy (us/step)", "num", 1, "union of the family's kernel intervals"),
    Column("read_mb", "read (MB/step)", "num", 1, "DRAM bytes read while the family's kernels run"),
    Column("read_tbs", "read (TB/s)", "num", 2, "bytes read / device busy, per step"),
    Column("share_of_reads", "share of the step's reads", "share"),
]
DRAM_SEGMENT_COLUMNS = [
    Column("kind", "segment"), Column("per_step", "per step", "num", 0),
    Column("time_us", "time (us)", "num", 1, "from the (layer, family)'s first kernel start to the next one's"),
    Column("read_mb", "read (MB)", "num", 1), Column("read_tbs", "read (TB/s)", "num", 2),
]
DRAM_DIP_COLUMNS = [
    Column("kind", "segment"),
    Column("from_us", "from (us)", "num", 0, "since the segment's first kernel started"), Column("to_us", "to (us)", "num", 0),
    Column("min_tbs", "lowest (TB/s)", "num", 2, "the dip's lowest 1-us bin, mean over the segments"),
    Column("idle_equivalent_us", "idle-equivalent (us)", "num", 1, "the dip's time less its bytes at the peak"),
    Column("kernels", "kernels starting there", "list", title="by median start, in the dip or the bin before it"),
]

ANATOMY_COLUMNS = [
    Column("family", "family"), Column("kind", "kind", "int", title="0: the family's most frequent kernel sequence"),
    Column("position", "#", "int", title="in launch order within the segment"), Column("name", "kernel", "name"),
    Column("role", "stream"),
    Column("start_us", "start (us)", "num", 2, "median, from the segment's first kernel start"),
    Column("end_us", "end (us)", "num", 2, "median, from the segment's first kernel start"),
    Column("duration_us", "duration (us)", "num", 2, "median"),
    Column("on_path_share", "on the critical path", "share", title="share of the kind's segments"),
    Column("critical_us", "critical (us)", "num", 2, "mean time on the critical path per segment"),
]
ANATOMY_KIND_COLUMNS = [
    Column("family", "family"), Column("kind", "kind", "int"), Column("kernels", "kernels", "int"),
    Column("segments_per_step", "segments / step", "num", 2), Column("share", "share of the family's", "share"),
    Column("span_us", "span (us)", "num", 2, "median, the first kernel's start to the last one's end"),
]

KERNEL_COLUMNS = [
    Column("name", "kernel", "name"), Column("family", "family"),
    Column("calls_per_step", "calls / step", "num", 0), Column("mean_us", "mean (us)", "num", 2),
    Column("median_us", "median (us)", "num", 2), Column("busy_per_step_us", "busy (us/step)", "num", 1),
    Column("exposed_per_step_us", "exposed (us/step)", "num", 1),
    Column("hidden_share", "hidden", "share", title="share of the kernel's time overlapped by another stream"),
    Column("critical_us", "on the critical path (us/step)", "num", 2),
    Column("slack_us", "slack (us)", "num", 2, "how much longer the kernel could run before the step grows"),
    Column("site_median_min_us", "fastest site (us)", "num", 2,
           "the lowest of the kernel's call-site medians (a site: one position in the step's launch order)"),
    Column("site_median_max_us", "slowest site (us)", "num", 2, "the highest of the kernel's call-site medians"),
]


def completeness_block(a: Analysis, side: str | None = None) -> str:
    """The capture's completeness first: problems (red), caveats (amber), or a green line."""
    who = f"{side}: {esc(a.report)} — " if side else ""
    c = a.completeness
    parts = []
    if c.ok:
        parts.append(f"<div class='banner ok'>{who}<b>capture complete</b>: every step holds the dominant step's "
                     "kernels, every launch has a GPU record.</div>")
    else:
        items = "".join(f"<li>{esc(p)}</li>" for p in c.problems)
        parts.append(f"<div class='banner bad'>{who}<b>INCOMPLETE CAPTURE</b>: the numbers below rest on damaged "
                     f"data; record again.<ul class='findings'>{items}</ul></div>")
    if c.caveats:
        items = "".join(f"<li>{esc(x)}</li>" for x in c.caveats)
        parts.append(f"<div class='banner warn'>{who}<b>caveats</b><ul class='findings'>{items}</ul></div>")
    return "".join(parts)


def _timeline(page: _Page, a: Analysis, title: str, x_range: tuple[float, float] | None = None) -> str:
    tl = step_timeline(a)
    return page.figure(figures.step_timeline(tl, title, x_range))


# -- one trace --------------------------------------------------------------------------------

def analysis_page(a: Analysis) -> str:
    page = _Page(f"k3trace analyze {a.report}")
    q = a.step_stats
    pre = a.pre_attention_summary
    meta = key_values([
        ("report", printable(a.report)), ("recorded with", printable(a.recorded_with)),
        ("steps", f"{a.stable_steps} stable of {a.steps.height} (found by {a.step_source}"
                  + (f", {a.step_range['graph_replays_per_step']:g} graph replays a step"
                     if a.step_range.get("graph_replays_per_step") else "") + "; dropped: "
                  + (", ".join(f"{n} {r}" for r, n in sorted(a.dropped.items())) or "none")
                  + (", warm-up kept" if a.config.warmup_steps == 0 else "")
                  + f"; outliers beyond median ± {a.config.mad_k:g} MAD)"),
        ("kernels per step", f"{int(a.steps['kernels_expected'][0]):,}"),
        ("labels", ", ".join(f"{s} {n:,}" for s, n in a.label_sources.items())),
    ])
    def us(key: str) -> str:   # a one-step trace has no period and no host share
        value = q[key]["median"]
        return "-" if value is None else f"{value:,.2f} us"

    header = (f"<h1>k3trace analyze: {esc(a.report)}</h1>"
              f"<p class='verdict'>step period (ITL proxy) <b>{us('period')}</b> median, "
              f"GPU span {us('span')}, host share {us('host')}, two-stream residency {us('residency')}"
              + (f"; pre-attention window {pre['median']:.2f} us" if pre else "") + "</p>"
              + completeness_block(a) + meta
              + "".join(f"<p class='meta'>note: {esc(n)}</p>" for n in a.notes))

    stats = pl.DataFrame([{"metric": label, **q[key]} for label, key in (
        ("period (ITL proxy)", "period"), ("GPU span", "span"), ("host share", "host"), ("GPU busy", "busy"),
        ("two-stream residency", "residency"))])
    hist = histogram({"stable": step_values(a.step_times, "period")})
    page.add("steps", "Step times",
             _lead("Every decode step in order; warm-up steps, outliers and steps of another signature are dropped "
                   "before any number is taken. The ITL proxy is the stable steps' period.")
             + html_table(stats, [Column("metric", "per stable step"), Column("median", "median (us)", "num"),
                                  Column("p90", "p90 (us)", "num"), Column("p99", "p99 (us)", "num")], sortable=False)
             + page.figure(figures.step_distribution(steps_us(a.steps), hist, q["period"],
                                                     f"step period, {a.report}")))
    page.add("families", "Families",
             _lead("Per family, median over stable steps (the table of seed 001): how much of each family's busy "
                   "time runs beside another stream, and how much of it stays exposed or on the critical path.")
             + html_table(a.families, FAMILY_COLUMNS)
             + page.figure(figures.family_bars(a.families, "per family, us per stable step")))
    if a.dram is not None:
        _dram_section(page, a)
    if a.anatomy is not None and a.anatomy.kernels.height:
        page.add("anatomy", "Segment anatomy",
                 _lead("A segment is one layer's kernels of one family in one step; the segments of a family whose "
                       "kernels have the same names in the same launch order are one kind. For each family's most "
                       "frequent kind: each kernel's median start and end from the segment's first kernel start (the "
                       "origin of the DRAM profile's time axis), and how often it is on the critical path. Under PDL "
                       "a kernel records from its launch, so its bar holds its producer's tail.")
                 + page.figure(figures.segment_anatomy(a.anatomy.dominant(), a.families["family"].to_list(),
                                                       "each family's usual segment, kernel by kernel"))
                 + html_table(a.anatomy.kinds, ANATOMY_KIND_COLUMNS, caption="the kinds of segment per family")
                 + html_table(a.anatomy.kernels, ANATOMY_COLUMNS, caption="every kind, kernel by kernel",
                              max_rows=400))
    layers = layer_family_table(a.path)
    if layers.height:
        page.add("layers", "Per layer",
                 _lead("Kernel time per layer, stacked by family (median over stable steps): the per-layer cost a "
                       "kernel change multiplies by the model's layer count.")
                 + page.figure(figures.per_layer_bars(layers, "kernel time per layer and family")))
    by_layer = a.pre_attention_by_layer()
    if by_layer.is_empty():
        page.add("pre-attention", "Pre-attention window",
                 _lead("No full-attention layer (families " + esc(", ".join(a.config.full_attention_families))
                       + " with an FMHA kernel): no pre-attention window."))
    else:
        page.add("pre-attention", "Pre-attention window",
                 _lead("Per full-attention layer: from the end of the kernel that completed the residual stream to "
                       "the start of the layer's FMHA (the number of seed 000), median over stable steps; the "
                       "whisker reaches the p90.")
                 + page.figure(figures.pre_attention_bars(by_layer, pre, "pre-attention window per layer"))
                 + html_table(by_layer, [Column("layer", "layer", "int"), Column("median_us", "median (us)", "num"),
                                         Column("p90_us", "p90 (us)", "num"), Column("steps", "steps", "int")]))
    c = a.critical_summary()
    page.add("critical-path", "Critical path",
             _lead(f"Walked back from each stable step's last kernel: {c['kernels_on_path_median']:g} kernels per "
                   f"step (median), {c['bubbles_median']:g} waits on it summing to {c['bubble_us_median']:.2f} us, "
                   f"{c['pdl_edges_on_path_median']:g} PDL edges along it. Slack: how much longer a kernel could "
                   "run before the step's span grows.")
             + page.figure(figures.critical_bars(a.families, "family", "time on the critical path by family"))
             + page.figure(figures.critical_bars(a.kernel_table, "name", "time on the critical path by kernel "
                                                                         "(top 20)"))
             + html_table(a.kernel_table.sort("critical_us", descending=True, nulls_last=True), KERNEL_COLUMNS,
                          caption="every kernel (name and family) of the stable steps; click a header to sort"))
    p = a.pdl_summary
    edges = edge_table(a.path, a.config, a.stable_steps)
    page.add("pdl", "PDL edges",
             _lead(f"Inferred from the trace (docs/metrics.md, \"PDL\"): {p['edges_per_step']:g} same-stream PDL "
                   f"edges per step; {p['gaps_per_step']:g} other same-stream gaps per step summing to "
                   f"{p['gap_us_per_step']:,.1f} us over the streams.")
             + html_table(edges, [
                 Column("producer", "producer", "name"), Column("dependent", "dependent", "name"),
                 Column("family", "family"), Column("pairs_per_step", "pairs / step", "num", 1),
                 Column("pdl_per_step", "PDL edges / step", "num", 1), Column("pdl_share", "PDL share", "share"),
                 Column("gap_us_median", "gap without PDL (us, median)", "num", 3)],
                 caption="same-stream kernel pairs, by PDL edges per step", max_rows=60))
    page.add("timeline", "One step",
             _lead(f"Stable step {a.representative_step()}, the one whose span is nearest the median. Hover a kernel "
                   "for its name, layer and time on the critical path; drag to zoom, or pick a layer in the menu.")
             + _timeline(page, a, f"representative stable step of {a.report}"))
    return page.render(header)


def _dram_section(page: _Page, a: Analysis) -> None:
    d = a.dram
    s = d.summary()

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    uncovered = f" ({s['steps_uncovered']} not covered)" if s["steps_uncovered"] else ""
    lead = _lead(
        f"From nsys's DRAM metrics ({s['sample_period_us']:.2f}-us samples of GPU {s['device_id']}), median over "
        f"{s['steps']} stable steps{uncovered}: "
        f"<b>{num(s['read_gb_per_step'], '.3f')} GB</b> read per step in a {num(s['span_us'], ',.2f')}-us span, "
        f"{num(s['read_tbs'], '.2f')} TB/s mean, {num(s['fraction_of_peak'], '.1%')} of the {s['peak_tbs']:.2f} TB/s "
        f"peak; HBM idle-equivalent <b>{num(s['idle_equivalent_us'], ',.1f')} us</b> (span - bytes/peak); writes "
        f"{num(s['write_gb_per_step'], '.3f')} GB. The metric is a percentage of the report's DRAM peak, and reads "
        "about 1.9% low against known bytes (docs/metrics.md, \"DRAM\").")
    body = lead + html_table(d.families, DRAM_FAMILY_COLUMNS,
                             caption="per family: time when two families' kernels run together counts for both")
    if d.kinds.height:
        body += html_table(d.kinds, DRAM_SEGMENT_COLUMNS,
                           caption="per segment kind (median): `moe > mla` is an MoE segment followed by an MLA one")
        body += page.figure(figures.dram_profile(
            d.profile, s["peak_tbs"], "DRAM read by time since the segment's start (1-us bins, mean over the "
                                      "segments; samples smooth it over about 5 us)"))
        if d.dips.height:
            body += html_table(d.dips, DRAM_DIP_COLUMNS,
                               caption="where HBM idles: runs of the profile under 80% of the segment's best bin")
        body += html_table(d.segments, [Column("layer", "layer", "int"), Column("family", "family"),
                                        *DRAM_SEGMENT_COLUMNS[:1], Column("steps", "steps", "int"),
                                        *DRAM_SEGMENT_COLUMNS[2:]],
                           caption="per (layer, family) segment, median over stable steps")
    page.add("dram", "DRAM", body)


# -- two builds -------------------------------------------------------------------------------

ATTRIBUTION_COLUMNS = [
    Column("edit", "edit", "name"), Column("kind", "kind", min_em=7), Column("detail", "detail", min_em=11),
    Column("family", "family"),
    Column("layers", "layers", "layers"),
    Column("contribution_us", "contribution (us/step)", "signed", 3, "Shapley value on the replayed step graph",
           latency=True),
    Column("stderr_us", "± stderr (us)", "num", 3, "0 when the contributions are exact"),
    Column("share", "share", "share", title="of the measured span change"),
    Column("edits", "edits", "int", title="elementary edits (one per layer and kernel) in this row"),
    Column("kernels", "kernels", "int"),
    Column("recorded_us", "recorded (us/step)", "signed", 2,
           "the row's kernels' own duration change (a replacement's: added less removed), summed over layers; "
           "empty where the row owns no kernel"),
]


def _read_together(d) -> str:
    groups = d.read_together()
    if not groups:
        return ""
    items = "".join(
        "<li>" + " + ".join(f"{esc(r['edit'])} ({esc(r['kind'])}, {r['contribution_us']:+,.2f})" for r in g["rows"])
        + f" = <b>{g['sum_us']:+,.2f} us/step</b> ({esc('; '.join(REASONS[x] for x in g['reasons']))})</li>" for g in groups)
    return f"<p>Read together: {esc(READ_TOGETHER)}.</p><ul class='findings'>{items}</ul>"


def _not_taken(d) -> str:
    rows = d.not_taken()
    if rows.is_empty():
        return ""
    items = "".join(
        f"<li>{esc(r['edit'])} ({esc(r['kind'])}, {esc(r['family'])}): recorded <b>{r['recorded_us']:+,.2f} us/step</b>"
        f", the step took {r['contribution_us']:+,.2f}</li>" for r in rows.iter_rows(named=True))
    return ("<p>Recorded changes the step did not take (the replayed step took under a quarter of them: beside the "
            f"other stream, or ahead of a wait that holds the step):</p><ul class='findings'>{items}</ul>")


def _verdict(label: str, delta: float | None, band: float | None, source: str | None, verdict: str) -> str:
    band_text = "no noise band" if band is None else f"noise band ±{band:.2f} us ({esc(source)})"
    shown = "-" if delta is None else f"{delta:+,.2f} us"
    return (f"<p class='verdict'>{label} <b class='{esc(verdict)}'>{shown}</b> per step, {band_text}: "
            f"<b class='{esc(verdict)}'>{esc(verdict.replace('_', ' '))}</b></p>")


def _sides_table(d) -> str:
    rows = [{"side": side, **a.trust()} for side, runs in (("old", d.old), ("new", d.new)) for a in runs]
    frame = pl.DataFrame(rows).select("side", "report", "ok", "problems", "missing_launches", "incomplete_steps",
                                      "excluded_rows", "truncated")
    return html_table(frame, [
        Column("side", "side"), Column("report", "report", "name"), Column("ok", "complete", "bool", bad=False),
        Column("problems", "problems", "int"), Column("missing_launches", "launches without GPU record", "int"),
        Column("incomplete_steps", "incomplete steps", "int"), Column("excluded_rows", "rows excluded", "int"),
        Column("truncated", "cut short", "bool", bad=True)], sortable=False)


def diff_page(d) -> str:
    page = _Page("k3trace diff")
    old, new = sides.representative(d.old), sides.representative(d.new)
    caveats = "".join(f"<li>{esc(c)}</li>" for c in d.caveats())
    header = (
        "<h1>k3trace diff</h1>"
        + key_values([("old", ", ".join(printable(a.report) for a in d.old)),
                      ("new", ", ".join(printable(a.report) for a in d.new))])
        + _verdict("ITL (step period)", d.itl_delta_us, d.noise_band_us, d.noise_source, d.verdict_itl)
        + _verdict("GPU step span", d.span_delta_us, d.span_noise_band_us, d.noise_source, d.verdict_span)
        + ("" if d.host_delta_us is None else f"<p class='verdict'>host share {d.host_delta_us:+,.2f} us per step</p>")
        + (f"<p><b>{esc(d.summary())}</b></p>" if d.verdict_span != d.verdict_itl else "")
        + (f"<div class='banner warn'><b>read before trusting the ranking</b><ul class='findings'>{caveats}</ul>"
           "</div>" if caveats else "")
    )
    page.add("completeness", "Completeness of both sides",
             "".join(completeness_block(a, side) for side, runs in (("old", d.old), ("new", d.new)) for a in runs)
             + _sides_table(d))
    partial = "" if d.explained else (" The replay does not explain the measured change: the ranking is "
                                      "partial (see the residual bar).")
    page.add("attribution", "What moved the step",
             _lead("Each edit (a fusion, split or swap of kernels, a duration change, a kernel moved to another "
                   "stream, a gap) is credited its Shapley value on the replayed union of both builds' step graphs; "
                   f"the contributions add up to the replayed change ({d.modelled_us:+,.2f} us), the residual is "
                   f"what the replay misses ({d.residual_us:+,.2f} us).{partial}")
             + page.figure(figures.attribution_waterfall(
                 d.waterfall(), "step span, old to new: counterfactual attribution by edit",
                 d.span_noise_band_us, d.noise_source))
             + html_table(d.attribution, ATTRIBUTION_COLUMNS, caption="every edit, by |contribution|")
             + _read_together(d)
             + _not_taken(d)
             + _matching(d))
    dists = sides.step_distributions(d.old, d.new)
    centrals = {m: {"old": sides.central(d.old, m), "new": sides.central(d.new, m)} for m in ("period", "span")}
    page.add("distributions", "Step times of both builds",
             _lead("Stable steps of every run of each build, on shared bins. A shift of the whole distribution is a "
                   "change; a change of its shape shows as the median moving apart from the mean (see the "
                   "'median vs mean step' bar).")
             + page.figure(figures.step_distributions(dists, centrals, {"period": d.noise_band_us,
                                                                        "span": d.span_noise_band_us},
                                                      "stable-step times, old vs new")))
    fam = sides.family_changes(d.families)
    fam_cols = [Column("family", "family")]
    for f, label, digits in (("segments_per_step", "segments / step", 0), ("device_busy_us", "device busy (us)", 1),
                             ("two_stream_residency_us", "two-stream residency (us)", 1),
                             ("exposed_us", "exposed (us)", 1), ("critical_us", "on the critical path (us)", 1)):
        fam_cols += [Column(f"{f}_old", "old", "num", digits, group=label),
                     Column(f"{f}_new", "new", "num", digits, group=label),
                     Column(f"{f}_delta", "change", "signed", digits, group=label,
                            latency=f in ("device_busy_us", "exposed_us", "critical_us"))]
    page.add("families", "Families, old vs new",
             _lead("Per family, median over stable steps (us per step).") + html_table(fam, fam_cols))
    if d.segments is not None:
        seg_cols = [Column("kind", "segment")]
        for f, label, digits in (("per_step", "per step", 0), ("time_us", "time (us)", 2),
                                 ("us_per_step", "time x per step (us)", 1)):
            seg_cols += [Column(f"{f}_old", "old", "num", digits, group=label),
                         Column(f"{f}_new", "new", "num", digits, group=label)]
        seg_cols.append(Column("us_per_step_delta", "change", "signed", 1, latency=True,
                               title="what the segment kind adds to a step, new - old"))
        total = d.segments_total
        page.add("segments", "Segments, old vs new",
                 _lead("Where along the model the step moved: per segment kind (from a (layer, family)'s first kernel "
                       "start to the next one's; `moe &gt; kda` is an MoE segment followed by a KDA one) its median "
                       "time and, times the segments per step, what it adds to a step, whichever kernel recorded the "
                       f"time. Together {total['old']:,.1f} -&gt; {total['new']:,.1f} us per step "
                       f"({total['delta']:+,.1f}) against the span's {d.span_delta_us:+,.1f} (docs/metrics.md, "
                       "\"Segments\").")
                 + html_table(d.segments, seg_cols))
    if d.dram is not None:
        dram_cols = [Column("kind", "segment")]
        for f, label, digits in (("per_step", "per step", 0), ("time_us", "time (us)", 1), ("read_mb", "read (MB)", 1),
                                 ("idle_us", "idle-equivalent (us)", 1),
                                 ("idle_us_per_step", "idle-equivalent x per step (us)", 1)):
            dram_cols += [Column(f"{f}_old", "old", "num", digits, group=label),
                          Column(f"{f}_new", "new", "num", digits, group=label)]
        dram_cols.append(Column("idle_us_per_step_delta", "change", "signed", 1, latency=True,
                                title="the segment kind's idle-equivalent per step, new - old"))
        page.add("dram", "DRAM, old vs new",
                 _lead("From both builds' GPU metrics: per segment kind (the step first) its median time, DRAM bytes "
                       "read and HBM idle-equivalent (time - bytes/peak); times the segments per step, what the "
                       "kind adds to the step's idle-equivalent (docs/metrics.md, \"DRAM\").")
                 + html_table(d.dram, dram_cols))
    pre = sides.pre_attention_by_layer(old, new)
    if pre.is_empty():
        page.add("pre-attention", "Pre-attention window per layer",
                 _lead("Neither build has a full-attention layer (families "
                       + esc(", ".join(old.config.full_attention_families)) + " with an FMHA kernel), so there is no "
                       "pre-attention window to compare."))
    else:
        po, pn = d.pre_attention["old"], d.pre_attention["new"]
        summary = (f"median over layers x stable steps: {po['median']:.2f} -> {pn['median']:.2f} us"
                   if po and pn else "")
        page.add("pre-attention", "Pre-attention window per layer",
                 _lead("Per full-attention layer, residual done -> FMHA start, median over stable steps; "
                       + esc(summary) + ".")
                 + page.figure(figures.pre_attention_compare(pre, "pre-attention window, old vs new"))
                 + html_table(pre, [Column("layer", "layer", "int"), Column("old_us", "old (us)", "num"),
                                    Column("new_us", "new (us)", "num"),
                                    Column("delta_us", "change (us)", "signed", latency=True),
                                    Column("old_p90_us", "old p90 (us)", "num"),
                                    Column("new_p90_us", "new p90 (us)", "num")]))
    span = max(old.step_stats["span"]["median"], new.step_stats["span"]["median"]) * 1.01
    page.add("timelines", "One step of each build",
             _lead("The representative stable step of each build, on the same time axis.")
             + _timeline(page, old, f"old: {old.report}", (0.0, span))
             + _timeline(page, new, f"new: {new.report}", (0.0, span)))
    return page.render(header)


def _matching(d) -> str:
    counts = d.to_json()["matching"]
    changes = d.segment_changes()
    text = _lead("Kernels matched across the builds: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                 + ". Segments where kernels were added or removed:")
    if changes.is_empty():
        return _lead("Kernels matched across the builds: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                     + "; no kernel was added or removed.")
    return text + html_table(changes, [Column("layer", "layer", "int"), Column("family", "family"),
                                       Column("matched", "matched", "int"), Column("added", "added", "list"),
                                       Column("removed", "removed", "list")])


# -- files ------------------------------------------------------------------------------------

def index_page(entries: Sequence[tuple[str, str]]) -> str:
    items = "".join(f"<li><a href='{html.escape(href, quote=True)}'>{esc(text)}</a></li>" for href, text in entries)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>k3trace reports</title>"
            f"<style>{STYLE}</style></head><body><main><h1>k3trace reports</h1><ul>{items}</ul></main></body></html>")


def _write(page: str, path: Path) -> None:
    """Write atomically; the temporary file is removed on every exit path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_analysis_page(a: Analysis, path: Path) -> None:
    _write(analysis_page(a), path)


def write_diff_page(d, path: Path) -> None:
    _write(diff_page(d), path)


def write_index_page(path: Path, entries: Sequence[tuple[str, str]]) -> None:
    _write(index_page(entries), path)
