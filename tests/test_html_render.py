"""Every HTML report the way a person sees it: rendered by headless Chromium (Debian's
`chromium`), offline. A page fails when a figure stayed blank, a script failed, it drew a
plotly table, or it carries the machine's paths; completeness comes before any figure."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.diff import diff
from k3trace.ingest import load_report
from k3trace.render.html import write_analysis_page, write_diff_page, write_index_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


def render(page: Path, tmp_path: Path) -> tuple[str, str]:
    """(the DOM after the page's scripts ran, Chromium's log); also a screenshot beside it."""
    profile = tmp_path / f"profile-{page.stem}"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=180)
    shot = page.with_suffix(".png")
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1500,6000", "--hide-scrollbars",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 50_000, "blank screenshot"
    return done.stdout, done.stderr


def check_page(page: Path, tmp_path: Path, *, figures: int, tables: int,
               texts: tuple[str, ...] = ()) -> tuple[str, str]:
    """(the page's source, its drawn DOM without scripts)."""
    source = page.read_text(encoding="utf-8")
    assert source.count('class="plotly-graph-div"') == figures
    assert source.count("<table class='k3t") >= tables
    assert not re.search(r"<script[^>]+src=", source), "not self-contained"
    assert str(tmp_path) not in source and "/home/" not in source, "a path of this machine in the page"
    for text in texts:
        assert text in source, text
    dom, log = render(page, tmp_path)
    for bad in ("Uncaught", "SyntaxError", "TypeError", "ReferenceError"):
        assert bad not in log, log[-3000:]
    dom = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)  # the drawing, not plotly's own code
    assert "table-control-view" not in dom, "a plotly table: tables are HTML"
    # plotly replaces each figure div's content with an SVG drawing once its script ran
    chunks = dom.split('id="figure-')[1:]
    assert len(chunks) == figures
    blank = [c[:12] for c in chunks if 'class="main-svg"' not in c]
    assert not blank, f"figures not drawn: {blank}"
    return source, dom


@pytest.fixture(scope="module")
def runs(trace_sqlite):
    return {n: analyze(load_report(trace_sqlite(n)), load_config())
            for n in ("small_nofork", "small_inside_a", "k3_bs1_no_attn_forks", "k3_bs1_base_a", "hf_base_a",
                      "hf_norm_fused_a")}


@needs_chromium
@pytest.mark.parametrize("name", ["k3_bs1_base_a", "hf_base_a"])
def test_analysis_page(runs, name, tmp_path):
    page = tmp_path / f"{name}.html"
    write_analysis_page(runs[name], page)
    full_attention = name.startswith("k3")
    # the figures: step times, families, segment anatomy, per layer, pre-attention (full attention only), the
    # critical path by family and by kernel, the timeline
    source, _ = check_page(page, tmp_path, figures=8 if full_attention else 7, tables=4, texts=(
        "capture complete", "Families", "Segment anatomy", "Per layer", "Pre-attention window", "Critical path", "PDL edges",
        "two-stream residency (us/step)", "slack (us)", "on the critical path (us/step)"))
    # completeness is read first
    assert source.index("capture complete") < source.index('class="plotly-graph-div"')
    if not full_attention:
        assert "No full-attention layer" in source


@needs_chromium
@pytest.mark.parametrize("pair", [("small_nofork", "small_inside_a"), ("k3_bs1_no_attn_forks", "k3_bs1_base_a"),
                                  ("hf_base_a", "hf_norm_fused_a")])
def test_diff_page(runs, pair, tmp_path):
    old, new = runs[pair[0]], runs[pair[1]]
    d = diff([old], [new])
    page = tmp_path / "diff.html"
    write_diff_page(d, page)
    has_pre = any(d.pre_attention[side] for side in ("old", "new"))
    source, dom = check_page(page, tmp_path, figures=4 + has_pre, tables=4, texts=(
        "Completeness of both sides", "What moved the step", "Step times of both builds", "noise band",
        "contribution (us/step)"))
    assert source.index("Completeness of both sides") < source.index('class="plotly-graph-div"')
    # every edit of the top of the waterfall is named with its family and layers
    for r in d.attribution.head(3).iter_rows(named=True):
        assert f"· {r['family']} · layers" in dom


@needs_chromium
def test_incomplete_capture_leads_the_page(trace_sqlite, tmp_path):
    damaged = tmp_path / "cut.sqlite"
    shutil.copyfile(trace_sqlite("small_inside_a"), damaged)
    damaged.chmod(0o644)
    with sqlite3.connect(damaged) as con:  # one replay loses three kernel records
        corr = con.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL "
                           "GROUP BY correlationId ORDER BY min(start) LIMIT 1 OFFSET 20").fetchone()[0]
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid IN (SELECT rowid FROM "
                    "CUPTI_ACTIVITY_KIND_KERNEL WHERE correlationId = ? LIMIT 3)", (corr,))
    con.close()
    a = analyze(load_report(damaged), load_config())
    assert not a.completeness.ok
    page = tmp_path / "cut.html"
    write_analysis_page(a, page)
    source, _ = check_page(page, tmp_path, figures=7 if a.pre_attention.is_empty() else 8, tables=4)
    assert source.index("INCOMPLETE CAPTURE") < source.index('class="plotly-graph-div"')


def test_index_page_links_the_pages(tmp_path):
    page = tmp_path / "index.html"
    write_index_page(page, [("a.html", "analyze <a>"), ("b.html", "diff")])
    source = page.read_text()
    assert "href='a.html'" in source and "analyze &lt;a&gt;" in source
