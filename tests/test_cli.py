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
    assert md.exit_code == 0 and "| edit | kind | family | layers | us/step | share | recorded us/step |" in md.stdout
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
    # A fixed width: kernel names wrap at the width of whatever ran the test before.
    result = invoke("demo", "--cache-dir", str(cache_dir), "--width", "200")
    assert result.exit_code == 0
    assert "k3trace analyze" in result.stdout and "k3trace diff" in result.stdout
    assert "FASTER" in result.stdout and "gemv_kernel" in result.stdout
    assert "vectorized_layer_norm_kernel" in result.stdout  # the third-party fusion pair
    assert "read together" in result.stdout  # the early-trigger pair's traded rows
    assert "Where HBM idles" in result.stdout and "rmsnorm_kernel" in result.stdout  # c72's DRAM metrics


def test_whatif_json_and_bad_changes(trace_sqlite, cache_dir):
    report = str(trace_sqlite("small_inside_d"))
    done = invoke("whatif", report, "--delta", "^kda_conv_silu_kernel$=+25us", "--json", "--cache-dir", str(cache_dir))
    assert done.exit_code == 0
    j = json.loads(done.stdout)
    assert j["kernels_changed"] == 6 and j["delta_us"] > 0 and j["opportunities"]
    assert j["predicted_span_us"] == pytest.approx(j["base_span_us"] + j["delta_us"])
    terminal = invoke("whatif", report, "--scale", "kda_gate_kernel=0.5", "--cache-dir", str(cache_dir))
    assert terminal.exit_code == 0 and "top opportunities" in terminal.stdout
    for bad in (["--scale", "kda=fast"], ["--delta", "nothing_matches=+1us"], ["--layers", "x..y", "--remove", "kda"],
                ["--stream", "sideways", "--remove", "kda"], ["--layers", "3"], ["--stream", "main"],
                ["--family", "no_such_family"]):
        assert invoke("whatif", report, *bad, "--cache-dir", str(cache_dir)).exit_code == 2, bad
    # No change: the ranking every prediction ends with, alone.
    ranked = invoke("whatif", report, "--json", "--cache-dir", str(cache_dir))
    assert ranked.exit_code == 0
    r = json.loads(ranked.stdout)
    assert r["changes"] == [] and r["opportunities"] == j["opportunities"] and "delta_us" not in r
    shown = invoke("whatif", report, "--cache-dir", str(cache_dir))
    assert shown.exit_code == 0 and "no change given" in shown.stdout and "top opportunities" in shown.stdout


# -- the command line itself -----------------------------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import k3trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def k3(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The installed command as a user runs it: its own process, stdout piped."""
    base = {k: v for k, v in os.environ.items() if k not in ("K3TRACE_NSYS", "COLUMNS")}
    return subprocess.run([sys.executable, "-m", "k3trace.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**base, **(env or {})}, stdin=subprocess.DEVNULL, timeout=300)


def test_json_answers_leave_the_terminal_renderer_unimported(trace_sqlite, tmp_path):
    """analyze and diff printing JSON never import rich's tables, nor any command its
    spinner where stderr is no terminal (start-up every such command would pay): the
    command's own import trace, as a user runs it."""
    report, other = str(trace_sqlite("small_inside_a")), str(trace_sqlite("small_delay_kda_step"))
    for args in (["analyze", report, "--json"], ["diff", report, other, "--json"], ["analyze", report]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "k3trace.cli", *args, "--no-cache"],
                              capture_output=True, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=300)
        assert done.returncode == 0, done.stderr[-500:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        assert ("k3trace.render.terminal" in imported) == ("--json" not in args), args
        # stderr is a pipe: no spinner; where the answer is JSON, no rich at all.
        assert "rich.progress" not in imported and ("rich.console" in imported) == ("--json" not in args), args


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads counted in /proc (Linux)")
def test_command_loads_numpy_without_blas_threads():
    """numpy's OpenBLAS starts a spinning thread per extra core when it loads; the command
    makes no BLAS call, so it loads numpy without them (heap.OPENBLAS_THREADS), and leaves
    a count the user set alone."""
    probe = ("import os, k3trace.cli, numpy; "
             "print(len(os.listdir('/proc/self/task')), os.environ['OPENBLAS_NUM_THREADS'])")
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=base, timeout=120)
    assert done.stdout.split() == ["1", "1"], done.stderr[-500:]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**base, "OPENBLAS_NUM_THREADS": "2"}, timeout=120)
    assert done.stdout.split()[1] == "2", done.stderr[-500:]


def test_version_and_short_help():
    assert invoke("--version").stdout.strip() == f"k3trace {k3trace.__version__}"
    for command in ([], ["analyze"], ["diff"], ["whatif"], ["record"], ["demo"], ["scrub"]):
        done = invoke(*command, "-h")
        assert done.exit_code == 0 and "Usage" in done.stdout, command


@pytest.mark.parametrize("args, option", [
    (["record", "--workload", "nope", "--dry-run"], "--workload"),
    (["record", "--variant", "bogus", "--dry-run"], "variant"),
    (["record", "--variant", "prefetch:8+prefetch:24", "--dry-run"], "prefetch"),
    (["record", "--workload", "small", "--variant", "no_attn_forks", "--dry-run"], "variant"),
    (["record", "--capture", "sideways", "--dry-run"], "--capture"),
    (["record", "--capture-range-end", "bogus", "--dry-run"], "--capture-range-end"),
    (["record", "--profiler", "perf", "--dry-run"], "--profiler"),
    (["analyze", "x.sqlite", "--engine", "foo"], "--engine"),
    (["diff", "a", "b", "--format", "yaml"], "--format"),
    (["whatif", "x.sqlite", "--stream", "sideways"], "--stream"),
    (["analyze", "--no-such-option"], "--no-such-option"),
])
def test_bad_choices_are_one_line_before_anything_runs(args, option, tmp_path):
    done = k3(*args, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("k3trace: ") and ";" in lines[0], done.stderr
    assert option in lines[0] and done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written


def test_good_variants_pass():
    for workload, variant in (("k3-decode", "no_attn_forks+router_multipass"), ("k3-decode", "delay:kda_step_kernel:4000"),
                              ("k3-decode", "triton_linear+attn_res_dot+prefetch:24"),
                              ("small", "nofork"), ("small", "delay:kda_gate_kernel:3000")):
        done = invoke("record", "--dry-run", "--workload", workload, "--variant", variant)
        assert done.exit_code == 0 and f"--variant {variant}" in done.stdout


def test_variant_flags_match_the_workload():
    from k3trace.cli import K3_VARIANT_FLAGS
    from kernels.k3.variants import known_flags

    assert set(K3_VARIANT_FLAGS) == set(known_flags())


FAKE_NSYS = """#!{python}
import shutil, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
shutil.copyfile({report!r}, out + ".nsys-rep")
"""


def test_record_uses_its_config_and_says_what_it_wrote(trace_sqlite, tmp_path):
    nsys = tmp_path / "nsys"
    nsys.write_text(FAKE_NSYS.format(python=sys.executable, report=str(trace_sqlite("small_inside_a"))))
    nsys.chmod(0o755)
    cfg = tmp_path / "k3.toml"
    cfg.write_text("[steps]\nwarmup = 7\n")
    done = k3("record", "-o", "run", "--config", str(cfg), "--cache-dir", str(tmp_path / "cache"), "--", "true",
              env={"K3TRACE_NSYS": str(nsys)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "k3trace: wrote Nsight Systems report run.nsys-rep" in done.stderr
    assert "7 warm-up" in done.stdout  # the analysis after the recording used --config
    bad = tmp_path / "bad.toml"
    bad.write_text("[steps]\nwarmup = 'many'\n")
    (tmp_path / "run.nsys-rep").unlink()
    done = k3("record", "-o", "run", "--config", str(bad), "--", "true", env={"K3TRACE_NSYS": str(nsys)},
              cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run.nsys-rep").exists(), "a bad config must fail before recording"


def test_analyze_html_announces_the_file(trace_sqlite, tmp_path):
    done = k3("analyze", str(trace_sqlite("small_inside_a")), "--html", "page.html", "--no-cache", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "k3trace: wrote HTML report page.html"
    assert (tmp_path / "page.html").stat().st_size > 3_000_000 and "decode steps" in done.stdout
    two = k3("analyze", str(trace_sqlite("small_inside_a")), str(trace_sqlite("small_inside_b")), "--html", "p.html",
             "--no-cache", cwd=tmp_path)
    assert two.returncode == 2 and "--html" in two.stderr and not (tmp_path / "p.html").exists()


def test_demo_html_writes_every_page(tmp_path):
    done = k3("demo", "--html", "pages", "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = [line.rsplit(" ", 1)[1] for line in done.stderr.strip().splitlines()]
    assert all(line.startswith("k3trace: wrote HTML") for line in done.stderr.strip().splitlines())
    assert sorted(Path(p).name for p in written) == sorted(p.name for p in (tmp_path / "pages").iterdir())
    assert len(written) == 7 and "pages/index.html" in written
    index = (tmp_path / "pages" / "index.html").read_text()
    assert all(f"href='{Path(p).name}'" in index for p in written if not p.endswith("index.html"))


def test_piped_output_keeps_kernel_names_whole(trace_sqlite, tmp_path):
    report = str(trace_sqlite("k3_bs1_base_a"))
    wide = k3("analyze", report, "--no-cache")
    assert "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_NNT" in wide.stdout
    assert "critical" in wide.stdout and "slack" in wide.stdout
    for args, env, width in ((["--width", "90"], None, 90), ([], {"COLUMNS": "100"}, 100)):
        done = k3("analyze", report, "--no-cache", *args, env=env)
        assert done.returncode == 0 and max(len(line) for line in done.stdout.splitlines()) <= width
        # a name too long for its column wraps onto the next line instead of being cut
        assert "…" not in done.stdout
        joined = "".join(line.split()[0] if line.split() else "" for line in done.stdout.splitlines())
        assert "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_NNT" in joined


def test_internal_error_keeps_its_traceback_under_debug(trace_sqlite, monkeypatch):
    """An internal error prints one line; with K3TRACE_DEBUG it propagates as itself (the
    CLI's own exception handling once raised an AttributeError over it under typer 0.28)."""
    import k3trace.cli as cli

    def broken(opts):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "_run_analyze", broken)
    path = str(trace_sqlite("small_inside_a"))
    quiet = runner.invoke(app, ["analyze", path, "--no-cache"])
    assert quiet.exit_code == 1 and "internal error: RuntimeError: boom" in quiet.output
    loud = runner.invoke(app, ["analyze", path, "--no-cache"], env={"K3TRACE_DEBUG": "1"})
    assert isinstance(loud.exception, RuntimeError) and str(loud.exception) == "boom"
