"""Rich tables for the terminal. Renders what the analysis computed; computes nothing."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from k3trace.analyses import Analysis
from k3trace.analyses.dram import DIP_KERNELS_SHOWN
from k3trace.diff.coupling import READ_TOGETHER, REASONS
from k3trace.errors import printable
from k3trace.text import layer_text


def _name(value: str | None) -> Text:
    """A name from the trace, shown as is: control characters escaped, no markup."""
    return Text(printable("-" if value is None else str(value)))


def _us(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def steps_panel(a: Analysis) -> RenderableType:
    q = a.step_stats
    t = Table(title=None, show_edge=False, box=None, pad_edge=False)
    t.add_column("per stable step (us)")
    for col in ("median", "p90", "p99"):
        t.add_column(col, justify="right")
    for label, key in (("period (ITL proxy)", "period"), ("span", "span"), ("host share", "host"),
                       ("GPU busy", "busy"), ("two-stream residency", "residency")):
        t.add_row(label, *(_us(q[key][c], 2) for c in ("median", "p90", "p99")))
    dropped = ", ".join(f"{n} {r}" for r, n in sorted(a.dropped.items())) or "none"
    if a.config.warmup_steps == 0:
        dropped += ", warm-up kept"
    pieces = a.step_range.get("graph_replays_per_step")
    source = a.step_source + (f", {pieces:g} graph replays a step" if pieces else "")
    head = Text.assemble(
        (printable(a.report), "bold"), f"  {printable(a.recorded_with)}\n",
        f"{a.stable_steps} stable steps of {a.steps.height} (source: {source}; dropped: {dropped}; "
        f"k = {a.config.mad_k:g} MAD), {int(a.steps['kernels_expected'][0])} kernels per step",
    )
    return Panel(Group(head, t), title="decode steps", expand=False)


def family_table(a: Analysis) -> RenderableType:
    t = Table(title="families (median over stable steps)")
    for col, just in (("family", "left"), ("segments per step", "right"), ("device busy us", "right"),
                      ("2-stream residency us", "right"), ("share of busy", "right"), ("exposed us", "right"),
                      ("critical us", "right")):
        t.add_column(col, justify=just)
    for r in a.families.iter_rows(named=True):
        t.add_row(_name(r["family"]), f"{r['segments_per_step']:g}", _us(r["device_busy_us"]),
                  _us(r["two_stream_residency_us"]), _share(r["share_of_busy"]), _us(r["exposed_us"]),
                  _us(r["critical_us"]))
    return t


def kernel_table(a: Analysis, top: int = 15) -> RenderableType:
    t = Table(title=f"kernels, top {top} by busy time (us)", box=box.SIMPLE_HEAD, collapse_padding=True,
              show_edge=False, pad_edge=False,
              caption="mean, median: per call; busy, critical (on the critical path): per step; "
                      "slack: how much longer it could run before the step grows; by site: the lowest and "
                      "highest median of its call sites (positions in the step's launch order), where it has several")
    for col, just in (("kernel", "left"), ("family", "left"), ("calls", "right"), ("mean", "right"),
                      ("median", "right"), ("busy", "right"), ("hidden", "right"), ("critical", "right"),
                      ("slack", "right"), ("by site", "right")):
        # Names wrap when the table is too wide, never cut: the distinguishing part is often the tail.
        t.add_column(col, justify=just, overflow="fold", min_width=16 if col == "kernel" else None,
                     no_wrap=col not in ("kernel", "family"))
    for r in a.kernel_table.head(top).iter_rows(named=True):
        t.add_row(_name(r["name"]), _name(r["family"]), f"{r['calls_per_step']:g}", _us(r["mean_us"], 2),
                  _us(r["median_us"], 2), _us(r["busy_per_step_us"]), _share(r["hidden_share"]),
                  _us(r["critical_us"], 2), _us(r["slack_us"], 2), _site_range(r))
    return t


def _site_range(r: dict) -> str:
    if (r.get("sites") or 0) < 2:
        return ""
    return f"{_us(r['site_median_min_us'], 2)}-{_us(r['site_median_max_us'], 2)}"


def anatomy_table(a: Analysis) -> RenderableType | None:
    """Each family's most frequent segment kind, kernel by kernel, families as the family table orders them."""
    if a.anatomy is None or a.anatomy.kernels.is_empty():
        return None
    kinds = a.anatomy.kinds
    t = Table(title="segment anatomy: each family's usual segment (one layer's kernels of the family), in launch order",
              box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False, pad_edge=False,
              caption="per step: the segments of this kind (its share of the family's, where it has others); "
                      "start, end: us from the segment's first kernel start; duration: us (medians over the "
                      "family's segments of this kind); on path: share of them where the kernel is on the critical "
                      "path; critical: its mean us there. Under PDL a kernel records from its launch, its "
                      "producer's tail included")
    for col, just in (("family", "left"), ("per step", "right"), ("#", "right"), ("kernel", "left"),
                      ("stream", "left"), ("start", "right"), ("end", "right"), ("duration", "right"),
                      ("on path", "right"), ("critical", "right")):
        t.add_column(col, justify=just, overflow="fold", min_width=16 if col == "kernel" else None,
                     no_wrap=col not in ("kernel", "family"))
    dominant = a.anatomy.dominant()
    for family in a.families["family"].to_list():
        rows = dominant.filter(dominant["family"] == family)
        if rows.is_empty():
            continue
        kind = kinds.filter((kinds["family"] == family) & (kinds["kind"] == 0)).row(0, named=True)
        # The kind's segments per step, and where the family has other kinds the share this one is.
        count = f"{kind['segments_per_step']:g}" + ("" if kind["share"] == 1 else f" ({kind['share']:.0%})")
        for i, r in enumerate(rows.iter_rows(named=True)):
            t.add_row(_name(family) if i == 0 else "", count if i == 0 else "", str(r["position"]), _name(r["name"]),
                      _name(r["role"]), _us(r["start_us"], 2), _us(r["end_us"], 2), _us(r["duration_us"], 2),
                      _share(r["on_path_share"]), _us(r["critical_us"], 2), end_section=i == rows.height - 1)
    return t


def details(a: Analysis) -> RenderableType:
    lines = []
    pre = a.pre_attention_summary
    lines.append(
        "pre-attention window: " + ("no full-attention layer" if pre is None else
                                    f"median {pre['median']:.2f} us over {pre['count']} layer x step pairs "
                                    f"({pre['layers']} layers)")
    )
    p = a.pdl_summary
    lines.append(f"PDL edges: {p['edges_per_step']:g} per step; other same-stream gaps: {p['gaps_per_step']:g} "
                 f"per step, {p['gap_us_per_step']:.1f} us summed over streams")
    c = a.critical_summary()
    lines.append(f"critical path: {c['kernels_on_path_median']:g} kernels per step, {c['bubbles_median']:g} bubbles "
                 f"({c['bubble_us_median']:.1f} us), {c['pdl_edges_on_path_median']:g} PDL edges on it")
    shares = a.label_summary.time_share
    lines.append(f"labels ({a.label_summary.convention} convention, from {a.label_summary.evidence}): "
                 + ", ".join(f"{s} {n} ({shares.get(s, 0.0):.0%} of kernel time)"
                             for s, n in a.label_sources.items() if n))
    lines.extend(f"note: {n}" for n in a.notes)
    return Text("\n".join(printable(line) for line in lines))


def completeness(a: Analysis) -> RenderableType:
    caveats = [Text(f"caveat: {printable(c)}", style="yellow") for c in a.completeness.caveats]
    if a.completeness.ok:
        return Group(Text("capture complete: every step holds the dominant step's kernels, every launch has a GPU "
                          "record", style="green"), *caveats)
    return Group(Panel(Text("\n".join(f"- {printable(p)}" for p in a.completeness.problems)),
                       title="INCOMPLETE CAPTURE", border_style="red", expand=False), *caveats)


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} GB"


def _tbs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def dram_tables(a: Analysis) -> RenderableType | None:
    """The DRAM metrics' numbers (only where the report has them)."""
    d = a.dram
    if d is None:
        return None
    s = d.summary()
    covered = f"{s['steps']} stable steps" + (f" ({s['steps_uncovered']} not covered)" if s["steps_uncovered"] else "")
    head = Text(
        f"reads per step {_gb(s['read_gb_per_step'])} in a {_us(s['span_us'], 2)}-us span: {_tbs(s['read_tbs'])} TB/s "
        f"mean, {_share(s['fraction_of_peak'])} of the {s['peak_tbs']:.2f} TB/s peak\n"
        f"HBM idle-equivalent {_us(s['idle_equivalent_us'], 1)} us per step (span - bytes/peak); "
        f"writes {_gb(s['write_gb_per_step'])} per step\n"
        f"GPU {s['device_id']}, {s['sample_period_us']:.2f}-us samples, medians over {covered}; bytes at the "
        "report's peak read about 1.9% low (docs/metrics.md, \"DRAM\")")
    fam = Table(title="DRAM reads by family (median over stable steps)", box=box.SIMPLE_HEAD, show_edge=False)
    for col, just in (("family", "left"), ("device busy us", "right"), ("read MB", "right"), ("TB/s", "right"),
                      ("share of reads", "right")):
        fam.add_column(col, justify=just)
    for r in d.families.iter_rows(named=True):
        fam.add_row(_name(r["family"]), _us(r["device_busy_us"]), _us(r["read_mb"]), _tbs(r["read_tbs"]),
                    _share(r["share_of_reads"]))
    parts: list[RenderableType] = [Panel(head, title="DRAM (GPU metrics)", expand=False), fam]
    if d.kinds.height:
        seg = Table(title="DRAM reads by segment: a (layer, family)'s first kernel to the next one's (median)",
                    box=box.SIMPLE_HEAD, show_edge=False)
        for col, just in (("segment", "left"), ("per step", "right"), ("time us", "right"), ("read MB", "right"),
                          ("TB/s", "right")):
            seg.add_column(col, justify=just)
        for r in d.kinds.iter_rows(named=True):
            seg.add_row(_name(r["kind"]), f"{r['per_step']:g}", _us(r["time_us"]), _us(r["read_mb"]),
                        _tbs(r["read_tbs"]))
        parts.append(seg)
    if d.dips.height:
        dips = Table(title="Where HBM idles: the segment profile's runs under 80% of its best 1-us bin (mean over "
                           "the segments; samples smooth it over ~5 us)", box=box.SIMPLE_HEAD, show_edge=False)
        for col, just in (("segment", "left"), ("from us", "right"), ("to us", "right"), ("lowest TB/s", "right"),
                          ("idle-eq us", "right"), ("kernels starting there", "left")):
            dips.add_column(col, justify=just)
        for r in d.dips.iter_rows(named=True):
            named = r["kernels"][:DIP_KERNELS_SHOWN]
            more = len(r["kernels"]) - len(named)
            dips.add_row(_name(r["kind"]), f"{r['from_us']:g}", f"{r['to_us']:g}", _tbs(r["min_tbs"]),
                         _us(r["idle_equivalent_us"], 1),
                         printable(", ".join(named) + (f" +{more}" if more > 0 else "")))
        parts.append(dips)
    return Group(*parts)


def render_analysis(a: Analysis) -> RenderableType:
    dram = dram_tables(a)
    anatomy = anatomy_table(a)
    return Group(steps_panel(a), family_table(a), *([dram] if dram is not None else []), kernel_table(a),
                 *([anatomy] if anatomy is not None else []), details(a), completeness(a))


# -- diff ----------------------------------------------------------------------------------

def _signed(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+,.{digits}f}"


_VERDICT_STYLE = {"faster": "green", "slower": "red"}


def _verdict(v: str) -> str:
    return v.replace("_", " ").upper()


def _band(value: float | None, source: str | None) -> str:
    return "n/a" if value is None else f"+-{value:.2f} us ({source})"


def diff_header(d) -> RenderableType:
    text = Text.assemble(
        "old: ", ", ".join(a.report for a in d.old), "\nnew: ", ", ".join(a.report for a in d.new), "\n",
        ("ITL (step period) ", "bold"), f"{_signed(d.itl_delta_us)} us/step   noise band "
        f"{_band(d.noise_band_us, d.noise_source)}   ",
        (_verdict(d.verdict_itl), f"bold {_VERDICT_STYLE.get(d.verdict_itl, 'yellow')}"),
        ("\nGPU step span ", "bold"), f"{_signed(d.span_delta_us)} us   noise band "
        f"{_band(d.span_noise_band_us, d.noise_source)}   ",
        (_verdict(d.verdict_span), f"bold {_VERDICT_STYLE.get(d.verdict_span, 'yellow')}"),
        f"\nhost share {_signed(d.host_delta_us)} us",
    )
    if d.verdict_span != d.verdict_itl:
        text.append(f"\n{d.summary()}", style="bold")
    for c in d.caveats():
        text.append(f"\nnote: {c}", style="yellow")
    return Panel(text, title="k3trace diff", expand=False)


def attribution_table(d, top: int = 15) -> RenderableType:
    partial = "" if d.explained else " -- PARTIAL: the replay does not explain the measured change"
    t = Table(title=f"what moved the step span: edits, Shapley contributions on the replayed step graph "
                    f"(top {top}){partial}")
    for col, just in (("edit", "left"), ("kind", "left"), ("family", "left"), ("layers", "left"),
                      ("us/step", "right"), ("+-", "right"), ("share", "right"), ("recorded", "right"),
                      ("by layer", "right")):
        t.add_column(col, justify=just, overflow="fold" if col == "edit" else "ellipsis",
                     max_width=60 if col == "edit" else None)
    for r in d.attribution.head(top).iter_rows(named=True):
        kind = r["kind"] + (f" ({r['detail']})" if r["detail"] and "replacement" in r["kind"] else "")
        t.add_row(r["edit"], kind, r["family"], layer_text(r["layers"]), _signed(r["contribution_us"]),
                  "" if d.exact else f"{r['stderr_us']:.2f}", _share(r["share"]),
                  "" if r["recorded_us"] is None else _signed(r["recorded_us"]), _recorded_range(r["recorded_by_layer"]))
    rest = d.attribution.tail(max(d.attribution.height - top, 0))
    t.caption = (f"recorded: the row's kernels' own duration change (us/step), and by layer its lowest and "
                 f"highest; {rest.height} more edits {_signed(float(rest['contribution_us'].sum()))} us; "
                 f"all edits replayed {_signed(d.modelled_us)} us = sum of contributions; mean step "
                 f"{_signed(d.mean_span_delta_us)} us (residual {_signed(d.residual_us)} us); median step "
                 f"{_signed(d.span_delta_us)} us (median vs mean {_signed(d.skew_us)} us)")
    return t


def _recorded_range(by_layer: list[dict]) -> str:
    if len(by_layer) < 2:
        return ""
    values = [x["recorded_us"] for x in by_layer]
    return f"{_signed(min(values))}..{_signed(max(values))}"


def not_taken_table(d) -> RenderableType | None:
    rows = d.not_taken()
    if rows.is_empty():
        return None
    t = Table(title="recorded changes the step did not take: the rows' kernels changed, the replayed step "
                    "took under a quarter of it (beside the other stream, or ahead of a wait that holds the step)")
    for col, just in (("edit", "left"), ("kind", "left"), ("family", "left"), ("layers", "left"),
                      ("recorded us/step", "right"), ("by layer", "right"), ("taken us/step", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for r in rows.iter_rows(named=True):
        t.add_row(r["edit"], r["kind"], r["family"], layer_text(r["layers"]), _signed(r["recorded_us"]),
                  _recorded_range(r["recorded_by_layer"]), _signed(r["contribution_us"]))
    return t


def read_together_table(d) -> RenderableType | None:
    groups = d.read_together()
    if not groups:
        return None
    t = Table(title=f"read together: {READ_TOGETHER}")
    for col, just in (("rows", "left"), ("why", "left"), ("family", "left"), ("each us/step", "right"),
                      ("together us/step", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for g in groups:
        rows = g["rows"]
        t.add_row(" + ".join(f"{r['edit']} ({r['kind']})" for r in rows), "; ".join(REASONS[x] for x in g["reasons"]),
                  ", ".join(dict.fromkeys(r["family"] for r in rows)),
                  " / ".join(_signed(r["contribution_us"]) for r in rows), _signed(g["sum_us"]))
    return t


def diff_families(d) -> RenderableType:
    t = Table(title="families, old -> new (median over stable steps, us)")
    t.add_column("family")
    for label in ("segments", "device busy", "2-stream residency", "exposed", "critical"):
        t.add_column(label, justify="right")
    for r in d.families.iter_rows(named=True):
        t.add_row(r["family"], *(f"{r[f'{f}_old']:,.1f} -> {r[f'{f}_new']:,.1f}" for f in (
            "segments_per_step", "device_busy_us", "two_stream_residency_us", "exposed_us", "critical_us")))
    pre = d.pre_attention
    if pre["old"] and pre["new"]:
        t.caption = f"pre-attention window: {pre['old']['median']:.2f} -> {pre['new']['median']:.2f} us"
    return t


def diff_dram(d) -> RenderableType | None:
    """Where HBM idled in each build, by segment kind (only where both have DRAM metrics)."""
    if d.dram is None:
        return None
    t = Table(title="DRAM (GPU metrics), old -> new: time, bytes read and HBM idle-equivalent (time - bytes/peak) "
                    "per segment (median, us), and that idle times the segments per step", box=box.SIMPLE_HEAD,
              show_edge=False)
    for col, just in (("segment", "left"), ("per step", "right"), ("time us", "right"), ("read MB", "right"),
                      ("idle-eq us", "right"), ("idle-eq us per step", "right"), ("change", "right")):
        t.add_column(col, justify=just)

    def pair(r, f, fmt):
        return " -> ".join("-" if r[f"{f}_{s}"] is None else format(r[f"{f}_{s}"], fmt) for s in ("old", "new"))

    for r in d.dram.iter_rows(named=True):
        t.add_row(_name(r["kind"]), pair(r, "per_step", "g"), pair(r, "time_us", ",.1f"), pair(r, "read_mb", ",.1f"),
                  pair(r, "idle_us", ",.1f"), pair(r, "idle_us_per_step", ",.1f"), _signed(r["idle_us_per_step_delta"]))
    return t


def diff_segments(d) -> RenderableType | None:
    """Where along the model the step moved: per segment kind, by the size of its change."""
    if d.segments is None:
        return None
    total = d.segments_total
    t = Table(title="segments, old -> new: from a (layer, family)'s first kernel to the next one's (median us), and "
                    "that times the segments per step", box=box.SIMPLE_HEAD, show_edge=False,
              caption=f"the segments together: {total['old']:,.1f} -> {total['new']:,.1f} us per step "
                      f"({_signed(total['delta'])}), against the span's {_signed(d.span_delta_us)}")
    for col, just in (("segment", "left"), ("per step", "right"), ("time us", "right"), ("us per step", "right"),
                      ("change", "right")):
        t.add_column(col, justify=just)
    for r in d.segments.iter_rows(named=True):
        t.add_row(_name(r["kind"]), f"{r['per_step_old']:g} -> {r['per_step_new']:g}",
                  f"{r['time_us_old']:,.2f} -> {r['time_us_new']:,.2f}",
                  f"{r['us_per_step_old']:,.1f} -> {r['us_per_step_new']:,.1f}", _signed(r["us_per_step_delta"]))
    return t


def render_diff(d) -> RenderableType:
    together = read_together_table(d)
    untaken = not_taken_table(d)
    dram = diff_dram(d)
    segments = diff_segments(d)
    return Group(diff_header(d), attribution_table(d), *([together] if together else []),
                 *([untaken] if untaken else []), diff_families(d),
                 *([segments] if segments is not None else []), *([dram] if dram is not None else []))


def diff_markdown(d, top: int = 10) -> str:
    """The verdict and the top edits as a Markdown table, to paste into a pull request."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    band = "n/a" if d.noise_band_us is None else f"±{d.noise_band_us:.2f} us ({d.noise_source})"
    lines = [
        f"**k3trace diff**: {cell(d.summary())}",
        "",
        f"- ITL (step period): **{_signed(d.itl_delta_us)} us/step**, noise band {band}: {_verdict(d.verdict_itl)}",
        f"- GPU step span: {d.span_delta_us:+.2f} us: {_verdict(d.verdict_span)}; host share {_signed(d.host_delta_us)} us",
        f"- replayed: {d.modelled_us:+.2f} us of the mean step's {d.mean_span_delta_us:+.2f} us "
        f"(residual {d.residual_us:+.2f} us; the median step moved {d.skew_us:+.2f} us more)",
        *(f"- note: {cell(c)}" for c in d.caveats()),
        "",
        "| edit | kind | family | layers | us/step | share | recorded us/step |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for r in d.attribution.head(top).iter_rows(named=True):
        kind = r["kind"] + (f" ({r['detail']})" if r["detail"] else "")
        recorded = "" if r["recorded_us"] is None else f"{r['recorded_us']:+.2f}"
        lines.append(f"| {cell(r['edit'])} | {cell(kind)} | {cell(r['family'])} | {layer_text(r['layers'])} | "
                     f"{r['contribution_us']:+.2f} | {_share(r['share'])} | {recorded} |")
    rest = d.attribution.tail(max(d.attribution.height - top, 0))
    if rest.height:
        lines.append(f"| {rest.height} more edits | | | | {float(rest['contribution_us'].sum()):+.2f} | | |")
    lines.append(f"| residual (not modelled) | | | | {d.residual_us:+.2f} | | |")
    lines.append(f"| median vs mean step | | | | {d.skew_us:+.2f} | | |")
    groups = d.read_together()
    if groups:
        lines += ["", f"Read together: {READ_TOGETHER}."]
        lines += [f"- " + " + ".join(f"{cell(r['edit'])} ({r['contribution_us']:+.2f})" for r in g["rows"])
                  + f" = **{g['sum_us']:+.2f} us/step** ({'; '.join(REASONS[x] for x in g['reasons'])})" for g in groups]
    if d.segments is not None and d.segments.height:
        total = d.segments_total
        lines += ["", f"Where along the model (segments from a (layer, family)'s first kernel to the next one's; "
                      f"together {_signed(total['delta'])} us/step of the span's {d.span_delta_us:+.2f}):", "",
                  "| segment | per step | time us | us/step |", "|---|---:|---:|---:|"]
        lines += [f"| {cell(r['kind'])} | {r['per_step_old']:g} -> {r['per_step_new']:g} | "
                  f"{r['time_us_old']:,.2f} -> {r['time_us_new']:,.2f} | {r['us_per_step_delta']:+.2f} |"
                  for r in d.segments.head(top).iter_rows(named=True)]
    return "\n".join(lines) + "\n"


# -- what-if ---------------------------------------------------------------------------------

def render_whatif(w) -> RenderableType:
    head = Text.assemble(
        ("what if: ", "bold"), "; ".join(c.describe() for c in w.changes), f"  ({w.kernels_changed} kernels per step)\n",
        ("predicted step span change ", "bold"),
        (f"{_signed(w.delta_us)} us", f"bold {'green' if w.delta_us < 0 else 'red' if w.delta_us > 0 else 'yellow'}"),
        f" (median over {w.steps} stable steps; p10 {_signed(w.delta_p10_us)}, p90 {_signed(w.delta_p90_us)}; "
        f"+-{w.uncertainty_us:.2f} us 95% interval of the median)\n",
        f"span {w.base_span_us:,.2f} -> {w.base_span_us + w.delta_us:,.2f} us",
    )
    for n in w.notes:
        head.append(f"\nnote: {n}", style="yellow")
    parts: list[RenderableType] = [Panel(head, title=f"k3trace whatif {w.report}", expand=False)]
    if w.slack.height:
        t = Table(title="the change and the slack it used up (mean step)")
        for col in ("kernel", "family", "added us", "slack us", "slack used us"):
            t.add_column(col, justify="left" if col in ("kernel", "family") else "right", overflow="fold")
        for r in w.slack.iter_rows(named=True):
            t.add_row(r["name"], r["family"], _signed(r["added_us"]), _us(r["slack_us"], 2), _us(r["slack_used_us"], 2))
        parts.append(t)
    if w.critical.height:
        t = Table(title="kernels whose time on the critical path changes (mean step, top 10)")
        for col in ("kernel", "family", "before us", "after us", "change us"):
            t.add_column(col, justify="left" if col in ("kernel", "family") else "right", overflow="fold")
        for r in w.critical.head(10).iter_rows(named=True):
            t.add_row(r["name"], r["family"], _us(r["critical_us_before"], 2), _us(r["critical_us_after"], 2),
                      _signed(r["change_us"]))
        parts.append(t)
    if w.segments is not None and w.segments.height:
        t = Table(title="where along the model (the diff's segments on the replayed steps): windows per step, their "
                        "median time before and after, and the change per step")
        for col in ("segment", "per step", "time us", "change us/step"):
            t.add_column(col, justify="left" if col == "segment" else "right")
        for r in w.segments.iter_rows(named=True):
            t.add_row(_name(r["kind"]), f"{r['per_step']:g}", f"{r['time_us_before']:,.2f} -> {r['time_us_after']:,.2f}",
                      _signed(r["change_us_per_step"]))
        parts.append(t)
    parts.append(_opportunities(w.opportunities))
    return Group(*parts)


def _opportunities(frame) -> RenderableType:
    t = Table(title="top opportunities: step time gained if every call of the kernel ran 2x faster")
    for col in ("kernel", "family", "calls/step", "gain us"):
        t.add_column(col, justify="left" if col in ("kernel", "family") else "right", overflow="fold")
    for r in frame.iter_rows(named=True):
        t.add_row(r["name"], r["family"], _us(r["calls_per_step"], 0), _us(r["gain_us_if_2x_faster"], 2))
    return t


def render_ranking(r) -> RenderableType:
    head = Text.assemble(
        ("no change given: ", "bold"), "what each kernel is worth, replayed on the step graph "
        f"(span {r.base_span_us:,.2f} us, median over {r.steps} stable steps)\n",
        "name one with --scale, --delta, --fuse, --remove, --no-pdl or --pdl for its prediction",
    )
    return Group(Panel(head, title=f"k3trace whatif {r.report}", expand=False), _opportunities(r.opportunities))


# -- several ranks ------------------------------------------------------------------------

def render_ranks(r) -> RenderableType:
    t = Table(title="ranks (median over each rank's stable steps, us)")
    for col in ("rank", "report", "steps", "period", "span", "busy", "residency", "all-reduce exposed", "complete"):
        t.add_column(col, justify="left" if col == "report" else "right")
    ar = {row["rank"]: row for row in r.all_reduce.iter_rows(named=True)}
    for i, a in enumerate(r.ranks):
        q = a.step_stats
        t.add_row(str(i), a.report, str(a.stable_steps), _us(q["period"]["median"], 2), _us(q["span"]["median"], 2),
                  _us(q["busy"]["median"], 2), _us(q["residency"]["median"], 2), _us(ar[i]["exposed_us"], 2),
                  "yes" if a.completeness.ok else "NO")
    s = r.skew_summary
    skew = ("rank skew: n/a (one rank)" if s["median_us"] is None else
            f"rank skew per step and layer (latest minus earliest layer finish): median {s['median_us']:.2f} us, "
            f"p90 {s['p90_us']:.2f} us; rank finishing a layer last: "
            + ", ".join(f"rank {k} {v}x" for k, v in s["last_rank_counts"].items()))
    return Group(t, Text(skew))
