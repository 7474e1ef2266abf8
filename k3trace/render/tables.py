"""HTML tables for the reports and the notebooks: headers in words with their units, full
names (wrapped, never cut), numbers right-aligned, sortable by clicking a header (the
page's small script orders rows by the raw value each cell carries; it computes nothing)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Sequence

import polars as pl

from k3trace.errors import printable
from k3trace.text import layer_text


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    format: str = "text"      # text | name | num | int | signed | share | layers | list | bool
    digits: int = 2
    title: str | None = None  # what the column means (shown on hover)
    group: str | None = None  # a header spanning this column and its neighbours of the same group
    bad: bool | None = None   # format bool: the value flagged in red (True: `yes` is bad)
    latency: bool = False     # format signed: a time where more is worse (red) and less better (green)
    min_em: float | None = None  # the column's least width (text that wraps)

    @property
    def numeric(self) -> bool:
        return self.format in ("num", "int", "signed", "share", "layers")


#: Names longer than this may wrap; shorter ones stay on one line.
LONG_NAME = 60


def _cell(value: Any, col: Column) -> tuple[str, str, str]:
    """(sort key, shown text, css class)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", "-", "num" if col.format not in ("text", "name", "list") else ""
    f = col.format
    if f in ("num", "int", "signed", "share"):
        v = float(value)
        if f == "int":
            shown = f"{v:,.0f}"
        elif f == "signed":
            shown = f"{v:+,.{col.digits}f}"
        elif f == "share":
            shown = f"{v:.1%}"
        else:
            shown = f"{v:,.{col.digits}f}"
        css = "num"
        if f == "signed" and col.latency and v != 0:
            css += " longer" if v > 0 else " shorter"
        return repr(v), shown, css
    if f == "layers":
        layers = list(value)
        return str(min(layers)) if layers else "", layer_text(layers), "num"
    if f == "list":
        return ", ".join(map(str, value)), ", ".join(map(str, value)), ""
    if f == "bool":
        return "1" if value else "0", "yes" if value else "no", "flag" if col.bad is bool(value) else ""
    text = printable(str(value))
    if f == "name":
        return text, text, "name long" if len(text) > LONG_NAME else "name"
    return text, text, ""


def html_table(frame: pl.DataFrame, columns: Sequence[Column], *, caption: str | None = None,
               max_rows: int | None = None, sortable: bool = True) -> str:
    """`frame`'s rows in the given columns. Rows past `max_rows` are left out and counted in
    the caption."""
    shown = frame if max_rows is None else frame.head(max_rows)
    head = _header(columns)
    body = []
    for row in shown.select([c.key for c in columns]).iter_rows():
        cells = []
        for value, col in zip(row, columns):
            key, text, css = _cell(value, col)
            cells.append(f"<td class='{css}' data-v='{html.escape(key, quote=True)}'>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = caption or ""
    if max_rows is not None and frame.height > max_rows:
        note += f" ({frame.height - max_rows} more rows not shown)"
    cap = f"<caption>{html.escape(note.strip())}</caption>" if note.strip() else ""
    cls = "k3t sortable" if sortable else "k3t"
    return (f"<div class='table-wrap'><table class='{cls}'>{cap}<thead>{head}</thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _header(columns: Sequence[Column]) -> str:
    """One header row; with groups, two (the group over its columns, the others spanning
    both rows). Each column's header carries its index for the sort script."""
    def leaf(i: int, c: Column, rowspan: int = 1) -> str:
        attrs = f" data-col='{i}' class='{'num' if c.numeric else ''}'"
        attrs += f" rowspan='{rowspan}'" if rowspan > 1 else ""
        attrs += f" style='min-width:{c.min_em:g}em'" if c.min_em else ""
        attrs += f" title='{html.escape(c.title, quote=True)}'" if c.title else ""
        return f"<th{attrs}>{html.escape(c.header)}</th>"

    if not any(c.group for c in columns):
        return "<tr>" + "".join(leaf(i, c) for i, c in enumerate(columns)) + "</tr>"
    top, bottom, i = [], [], 0
    while i < len(columns):
        c = columns[i]
        if c.group is None:
            top.append(leaf(i, c, rowspan=2))
            i += 1
            continue
        j = i
        while j < len(columns) and columns[j].group == c.group:
            bottom.append(leaf(j, columns[j]))
            j += 1
        top.append(f"<th class='group' colspan='{j - i}'>{html.escape(c.group)}</th>")
        i = j
    return "<tr>" + "".join(top) + "</tr><tr>" + "".join(bottom) + "</tr>"


def key_values(pairs: Sequence[tuple[str, str]]) -> str:
    """A two-column table of labels and already formatted values."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in pairs)
    return f"<table class='k3t kv'><tbody>{rows}</tbody></table>"


#: Click a header to order the rows by it (numbers by value); click again to reverse.
SORT_SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('thead th[data-col]').forEach(function (th) {
    var index = parseInt(th.getAttribute('data-col'), 10);
    th.addEventListener('click', function () {
      var numeric = th.classList.contains('num');
      var down = th.getAttribute('data-order') !== 'desc';
      table.querySelectorAll('thead th').forEach(function (o) { o.removeAttribute('data-order'); });
      th.setAttribute('data-order', down ? 'desc' : 'asc');
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[index].getAttribute('data-v'), y = b.cells[index].getAttribute('data-v');
        if (numeric) {
          var fx = x === '' ? -Infinity : parseFloat(x), fy = y === '' ? -Infinity : parseFloat(y);
          return down ? fy - fx : fx - fy;
        }
        return down ? y.localeCompare(x) : x.localeCompare(y);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#212121;background:#fafafa}
main{max-width:1500px;margin:0 auto;padding:1.2em 2em 4em}
h1{font-size:1.6em;margin:.2em 0}
h2{font-size:1.25em;margin:.5em 0 .4em;border-bottom:1px solid #e0e0e0;padding-bottom:.2em}
p.lead{color:#424242;margin:.3em 0 .8em;max-width:75em}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #e0e0e0;padding:.5em 2em;z-index:10;
    font-size:.92em}
nav a{margin-right:1.1em;color:#1565c0;text-decoration:none}
section{background:#fff;border:1px solid #eeeeee;border-radius:6px;padding:.6em 1.2em 1em;margin:1em 0}
.meta{color:#616161;font-size:.95em}
.banner{border-radius:6px;padding:.7em 1em;margin:.6em 0;border-left:6px solid}
.banner.ok{background:#e8f5e9;border-color:#2e7d32}
.banner.bad{background:#ffebee;border-color:#c62828}
.banner.warn{background:#fff8e1;border-color:#f9a825}
.verdict{font-size:1.15em;margin:.25em 0}
.verdict b.faster{color:#2e7d32}.verdict b.slower{color:#c62828}.verdict b.within_noise{color:#6d4c41}
.table-wrap{overflow-x:auto;margin:.4em 0 1em}
table.k3t{border-collapse:collapse;font-size:.9em;min-width:40%}
table.k3t caption{caption-side:bottom;text-align:left;color:#616161;font-size:.9em;padding-top:.3em}
table.k3t th,table.k3t td{border-bottom:1px solid #eeeeee;padding:.28em .7em;vertical-align:top;text-align:left}
table.k3t thead th{background:#f5f5f5;position:sticky;top:0;font-weight:600;white-space:normal}
table.sortable thead th[data-col]{cursor:pointer}
table.k3t thead th.group{text-align:center;border-bottom:1px solid #bdbdbd}
table.sortable thead th[data-order=desc]::after{content:' \\25BE'}
table.sortable thead th[data-order=asc]::after{content:' \\25B4'}
table.k3t .num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.k3t td.name{font-family:ui-monospace,'SFMono-Regular',Menlo,monospace;font-size:.92em;white-space:nowrap}
table.k3t td.name.long{white-space:normal;min-width:22em;max-width:40em}
table.k3t td.longer{color:#c62828}table.k3t td.shorter{color:#2e7d32}
table.k3t td.flag{color:#c62828;font-weight:600}
table.kv th{background:none;font-weight:500;color:#616161}
ul.findings li{margin:.2em 0}
.figure{margin:.4em 0}
"""
