"""Rich tables for the terminal. Renders what the analysis computed; computes nothing."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from k3trace.analyses import Analysis
from k3trace.errors import printable


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
    head = Text.assemble(
        (printable(a.report), "bold"), f"  nsys {printable(a.nsys_version)}\n",
        f"{a.stable_steps} stable steps of {a.steps.height} (source: {a.step_source}; dropped: {dropped}; "
        f"k = {a.config.mad_k:g} MAD), {int(a.steps['kernels_expected'][0])} kernels per step",
    )
    return Panel(Group(head, t), title="decode steps", expand=False)


def family_table(a: Analysis) -> RenderableType:
    t = Table(title="families (median over stable steps)")
    for col, just in (("family", "left"), ("segments/step", "right"), ("device busy us", "right"),
                      ("2-stream residency us", "right"), ("share of busy", "right"), ("exposed us", "right"),
                      ("critical us", "right")):
        t.add_column(col, justify=just)
    for r in a.families.iter_rows(named=True):
        t.add_row(_name(r["family"]), f"{r['segments_per_step']:g}", _us(r["device_busy_us"]),
                  _us(r["two_stream_residency_us"]), _share(r["share_of_busy"]), _us(r["exposed_us"]),
                  _us(r["critical_us"]))
    return t


def kernel_table(a: Analysis, top: int = 15) -> RenderableType:
    t = Table(title=f"kernels (top {top} by busy time per step)")
    for col, just in (("kernel", "left"), ("family", "left"), ("calls/step", "right"), ("mean us", "right"),
                      ("median us", "right"), ("busy us/step", "right"), ("hidden", "right")):
        t.add_column(col, justify=just, overflow="ellipsis", max_width=48 if col == "kernel" else None)
    for r in a.kernel_table.head(top).iter_rows(named=True):
        t.add_row(_name(r["name"]), _name(r["family"]), f"{r['calls_per_step']:g}", _us(r["mean_us"], 2),
                  _us(r["median_us"], 2),
                  _us(r["busy_per_step_us"]), _share(r["hidden_share"]))
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
    lines.append("labels: " + ", ".join(f"{s} {n}" for s, n in a.label_sources.items()))
    lines.extend(f"note: {n}" for n in a.notes)
    return Text("\n".join(printable(line) for line in lines))


def completeness(a: Analysis) -> RenderableType:
    caveats = [Text(f"caveat: {printable(c)}", style="yellow") for c in a.completeness.caveats]
    if a.completeness.ok:
        return Group(Text("capture complete: every step holds the dominant step's kernels, every launch has a GPU "
                          "record", style="green"), *caveats)
    return Group(Panel(Text("\n".join(f"- {printable(p)}" for p in a.completeness.problems)),
                       title="INCOMPLETE CAPTURE", border_style="red", expand=False), *caveats)


def render_analysis(a: Analysis) -> RenderableType:
    return Group(steps_panel(a), family_table(a), kernel_table(a), details(a), completeness(a))


# -- diff ----------------------------------------------------------------------------------

def _signed(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+,.{digits}f}"


def diff_header(d) -> RenderableType:
    band = "n/a" if d.noise_band_us is None else f"+-{d.noise_band_us:.2f} us ({d.noise_source})"
    style = {"faster": "green", "slower": "red"}.get(d.verdict, "yellow")
    text = Text.assemble(
        "old: ", ", ".join(a.report for a in d.old), "\nnew: ", ", ".join(a.report for a in d.new), "\n",
        ("ITL (step period) ", "bold"), f"{_signed(d.itl_delta_us)} us/step   noise band {band}   ",
        (d.verdict.replace("_", " ").upper(), f"bold {style}"),
        f"\nspan {_signed(d.span_delta_us)} us   host share {_signed(d.host_delta_us)} us",
    )
    return Panel(text, title="k3trace diff", expand=False)


def attribution_table(d, top: int = 15) -> RenderableType:
    t = Table(title=f"what moved the step span (counterfactual replay; top {top})")
    for col, just in (("kernel", "left"), ("family", "left"), ("layers", "left"), ("us/step", "right"),
                      ("share", "right"), ("changes", "left")):
        t.add_column(col, justify=just, overflow="ellipsis", max_width=44 if col == "kernel" else None)
    for r in d.attribution.head(top).iter_rows(named=True):
        t.add_row(r["kernel"], r["family"], r["layer_scope"], _signed(r["delta_us_per_step"]), _share(r["share"]),
                  r["kinds"])
    attributed = float(d.attribution["delta_us_per_step"].sum())
    t.caption = (f"sum of single changes {_signed(attributed)} us; interaction {_signed(d.interaction_us)} us; "
                 f"all changes replayed {_signed(d.modelled_us)} us; measured span {_signed(d.span_delta_us)} us; "
                 f"residual {_signed(d.residual_us)} us")
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


def render_diff(d) -> RenderableType:
    return Group(diff_header(d), attribution_table(d), diff_families(d))


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
