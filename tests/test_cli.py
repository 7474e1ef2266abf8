"""The CLI surface: analyze's JSON contract, the terminal tables, diff's JSON and HTML,
record's dry run, demo on the bundled traces."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from k3trace.cli import app

runner = CliRunner()

ANALYZE_KEYS = {
    "steps": {"count", "dropped", "source", "period_median_us", "span_median_us", "busy_median_us"},
    "families": {"name", "segments_per_step", "device_busy_us", "two_stream_residency_us", "share_of_busy",
                 "exposed_us"},
    "kernels": {"name", "family", "calls_per_step", "mean_us", "median_us", "hidden_share"},
}


def invoke(*args: str):
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result


def test_analyze_json_contract(trace_sqlite, cache_dir):
    result = invoke("analyze", str(trace_sqlite("small_inside_a")), "--json", "--cache-dir", str(cache_dir))
    assert result.exit_code == 0
    j = json.loads(result.stdout)
    assert ANALYZE_KEYS["steps"] <= set(j["steps"])
    assert all(ANALYZE_KEYS["families"] <= set(f) for f in j["families"])
    assert all(ANALYZE_KEYS["kernels"] <= set(k) for k in j["kernels"])
    assert "residency_median_us" in j and set(j["pre_attention_window_us"]) >= {"median", "count"}
    sources = {"nvtx", "module", "graph_capture", "aligned_eager", "donor", "inferred", "name_rule", "unlabelled"}
    assert set(j["labels"]["sources"]) == set(j["labels"]["time_share"]) == sources
    assert sum(j["labels"]["time_share"].values()) == pytest.approx(1.0)
    assert j["labels"]["convention"] == "k3trace" and j["steps"]["nvtx_range"]["form"] == "decode_step"
    assert {lay["index"] for lay in j["layers"]} == set(range(1, 9))
    assert all(set(lay) == {"index", "families", "kernels_per_step", "device_busy_us", "critical_us"}
               for lay in j["layers"])
    assert "edges_per_step" in j["pdl"]
    assert set(j["completeness"]) == {"ok", "problems", "excluded_rows", "affected_steps", "truncated"}
    assert j["caveats"] == [] and j["completeness"]["ok"]


def test_analyze_terminal(trace_sqlite, cache_dir):
    result = invoke("analyze", str(trace_sqlite("small_before")), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0
    for text in ("decode steps", "families", "kda", "mla", "moe", "attn_res", "pre-attention window", "PDL edges",
                 "critical path:", "capture complete"):
        assert text in result.stdout


def test_diff_json_and_html(trace_sqlite, cache_dir, tmp_path):
    page = tmp_path / "report.html"
    result = invoke("diff", str(trace_sqlite("small_inside_a")), str(trace_sqlite("small_delay_kda_step")),
                    "--json", "--html", str(page), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0
    j = json.loads(result.stdout)
    assert j["verdict"] == "slower" and j["attribution"][0]["edit"] == "kda_step_kernel"
    html = page.read_text()
    assert html.count("plotly-graph-div") >= 4
    assert not re.search(r"<script[^>]+src=", html)  # self-contained: plotly.js is inlined
    assert len(html) > 3_000_000


def test_diff_with_repeated_runs(trace_sqlite, cache_dir):
    args = ["diff", "--old", str(trace_sqlite("small_inside_a")), "--old", str(trace_sqlite("small_inside_b")),
            "--new", str(trace_sqlite("small_inside_c")), "--json", "--cache-dir", str(cache_dir)]
    j = json.loads(invoke(*args).stdout)
    assert j["noise_source"] == "repeats" and j["verdict"] == "within_noise"


def test_diff_fail_on_slower_and_markdown(trace_sqlite, cache_dir):
    base, slow = str(trace_sqlite("small_inside_a")), str(trace_sqlite("small_delay_kda_step"))
    cache = ["--cache-dir", str(cache_dir)]
    assert invoke("diff", base, slow, "--fail-on", "slower", *cache).exit_code == 1
    assert invoke("diff", slow, base, "--fail-on", "slower", *cache).exit_code == 0
    assert invoke("diff", base, str(trace_sqlite("small_inside_b")), "--fail-on", "slower", *cache).exit_code == 0
    md = invoke("diff", base, slow, "--format", "markdown", *cache)
    assert md.exit_code == 0 and "| edit | kind | family | layers | us/step | share |" in md.stdout
    for bad in (["--format", "yaml"], ["--fail-on", "faster"]):
        result = invoke("diff", base, slow, *bad, *cache)
        assert result.exit_code == 2


def test_record_dry_run_prints_the_nsys_command():
    result = invoke("record", "--dry-run", "--batch", "8", "--variant", "no_attn_forks", "-o", "run")
    line = result.stdout.strip()
    for flag in ("-t cuda,nvtx", "--cuda-graph-trace=node", "--sample=none", "--capture-range=cudaProfilerApi",
                 "kernels.record_loop", "--batch 8", "--variant no_attn_forks"):
        assert flag in line


def test_record_dry_run_external_engine():
    result = invoke("record", "--dry-run", "-o", "vllm", "--capture-range-end", "repeat", "--", "vllm", "serve", "M")
    line = result.stdout.strip()
    assert re.search(r"--capture-range-end=repeat .*--trace-fork-before-exec=true .* vllm serve M$", line)


def test_demo_runs_on_bundled_traces(cache_dir):
    result = invoke("demo", "--cache-dir", str(cache_dir))
    assert result.exit_code == 0
    assert "k3trace analyze" in result.stdout and "k3trace diff" in result.stdout
    assert "FASTER" in result.stdout and "gemv_kernel" in result.stdout
    assert "vectorized_layer_norm_kernel" in result.stdout  # the third-party fusion pair
