"""The diff HTML report the way a person sees it: rendered by headless Chromium (Debian's
`chromium`), offline. Fails on a blank or broken page: plotly must have drawn every figure
and the page must log no JavaScript error."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from k3trace.analyses import analyze
from k3trace.config import load_config
from k3trace.diff import diff
from k3trace.ingest import load_report
from k3trace.render.html import write_diff_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_diff_page_renders_offline_without_errors(trace_sqlite, tmp_path):
    runs = [analyze(load_report(trace_sqlite(n)), load_config()) for n in ("small_nofork", "small_inside_a")]
    page = tmp_path / "diff.html"
    write_diff_page(diff(runs[:1], runs[1:]), page)
    figures = page.read_text().count('class="plotly-graph-div"')
    assert figures >= 5
    profile = tmp_path / "profile"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    dom, log = done.stdout, done.stderr
    assert "Uncaught" not in log and "SyntaxError" not in log, log[-2000:]
    # plotly replaces each figure div's content with an SVG drawing once its JS ran
    assert dom.count('class="main-svg"') >= figures, "plotly did not draw every figure"
    shot = tmp_path / "diff.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,3200",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 50_000, "blank screenshot"
