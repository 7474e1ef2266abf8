"""The bs1 campaign's table (kernels/README.md): per change, k3trace's ITL delta and attribution
beside the standalone saving, from recordings of the cumulative builds.

    python3 bench/campaign_table.py DIR --changes router_fork mla_combine_wide ... \
        [--ops ops_b1.json] [--json OUT] [--markdown OUT]

DIR holds `k3_full_c<i>_<run>.sqlite` (or .nsys-rep) for build i = 0 (baseline) .. n, runs
a, b, ... (repeats: `k3trace diff` takes its noise band from them); change i turns build
i-1 into build i. For each change:
- ITL delta and noise band: `k3trace diff --old c<i-1>_* --new c<i>_* --json`;
- "the change's edits": the sum of the Shapley contributions of the structural edits
  (replacement, dependency) -- what the change did to the kernels and their order -- and of
  the rows k3trace reads with a replacement as the rest of its work (`released` groups);
- "elsewhere": the duration and gap edits of kernels it did not replace (slack used, a
  kernel slowed by the bandwidth a new neighbour takes), with the largest named;
- "read together": k3trace's groups of rows whose recorded time traded across a PDL edge,
  each with its sum (docs/metrics.md; the largest two in the markdown);
- standalone: bench/bench_k3_ops.py's old -> new per-layer time (its JSON) times the layers.
The standalone figure and the change's own edits should agree within the noise; where they
do not, the "elsewhere" column says what else moved.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

#: change -> (layers at full depth, the bench_k3_ops case, its old and new key prefixes)
STANDALONE = {
    "router_fork": (92, "router_fork", "baseline: front GEMM", "router_fork:"),
    "mla_combine_wide": (24, "mla_combine_wide", "combine", "mla_combine_wide"),
    "attn_res_fused": (186, "attn_res_fused", "score + combine", "attn_res_fused"),
    "fmha_short_splits": (24, "fmha_short_splits", "fmha + wide combine", "fmha_short_splits"),
    "router_align_fused": (92, "router_align_fused", "router -> align", "router_align_fused"),
    "mlp_residual_folded": (92, "mlp_residual_folded", "add3 -> score", "mlp_residual_folded"),
    "moe_tail_fused": (92, "moe_tail_fused", "weighted sum -> norm -> up", "moe_tail_fused"),
    "latent_norm_folded": (92, "moe_tail_fused", "weighted sum -> norm -> up", "latent_norm_folded"),
    "kda_conv_fused": (69, "kda_conv_fused", "conv -> kda_step", "kda_conv_fused"),
    "mla_proj_merged": (24, "mla_proj_merged", "q_a, kv_a, g_proj", "mla_proj_merged"),
    "moe_sum_norm_fused": (92, "moe_tail_fused", "weighted sum -> norm -> up", "moe_sum_norm_fused"),
    "router_in_front": (92, "router_in_front", "c20 head", "router_in_front (64, 128, 4, 4) x(8, 2)"),
    "attn_res_in_o_proj": (93, "attn_res_in_o_proj", "o_proj -> score -> combine", "attn_res_in_o_proj:"),
    # Round eleven (bench_k3_ops.py cases mla_round, mla_q_skinny), back to back.
    "fmha_one_tile+fmha_early_kv": (24, "mla_round", "c51: fmha + wide combine, 65 x 128 || g_proj (S2)",
                                    "fmha_one_tile+fmha_early_kv || g_proj (S2)"),
    "mla_q_skinny": (24, "mla_q_skinny", "c57: q_a, q_b by cuBLAS", "mla_q_skinny: split-K skinny"),
    # Round twelve: the routed chain with the down GEMM at the defaults and at the table's blocks.
    "moe_grouped_tuned": (92, "moe_grouped_tuned", "c64: down GEMM at (64, 128, 4, 4), back to back",
                          "moe_grouped_tuned: down GEMM at (64, 64, 4, 4), back to back"),
    # The pair's mean over the step's aggregations (1..8 bank rows each), back to back.
    "attn_res_wide": (186, "attn_res_wide", "c68: pair at the default chunk, back to back",
                      "attn_res_wide: pair at 1024 columns, back to back"),
    # Round seventeen (case mla_hops): the MLA segment's two legs up to the FMHA, back to back.
    "mla_absorb_concat": (24, "mla_hops", "c69: both legs -> reader", "mla_absorb_concat: both legs -> reader"),
    "mla_kv_norm_insert": (24, "mla_hops", "c69: both legs -> reader", "mla_kv_norm_insert: both legs -> reader"),
    "mla_absorb_concat+mla_kv_norm_insert": (24, "mla_hops", "c69: both legs -> reader",
                                             "mla_absorb_concat+mla_kv_norm_insert: both legs -> reader"),
    # Round eighteen: one latency window, the o_proj issuing; the step has 185 such GEMM-issued
    # windows (qkvg, the MLA o_proj, up), each timed as this one.
    "gemm_prefetch:8": (185, "window_prefetch", "one call: no prefetch, 1", "one call: o_proj, lines 8 MB, 1"),
    "prefetch:8+prefetch_lines": (186, "window_prefetch", "one call: no prefetch, 1", "one call: score, lines 8 MB, 1"),
    "mla_gate_in_o_proj": (24, "mla_hops", "c69: V-up -> gate_mul -> o_proj",
                           "mla_gate_in_o_proj: V-up -> o_proj with the gate"),
}
#: Changes whose standalone figure sums several chains of one case: (layers, case, old keys, new keys).
STANDALONE_SUMS = {
    "mla_head_bmm": (24, "mla_round", ("c51: absorb (cuBLAS BMM)", "c51: V-up (cuBLAS BMM) -> gate_mul"),
                     ("mla_head_bmm: absorb", "mla_head_bmm: V-up -> gate_mul")),
}
#: Changes that keep their kernels' names (other code inside): k3trace reports them as
#: duration edits of these kernels, which are then the change's own edits too.
OWN_KERNELS = {
    "attn_res_dot": ("attn_res_score_kernel", "attn_res_combine_kernel"),
    "moe_tail_fused": ("skinny_mm_kernel",),
    "latent_norm_folded": ("skinny_mm_kernel", "moe_weighted_sum_kernel"),
    "linear_early_weights": ("skinny_mm_kernel",),
    "kda_conv_fused": ("kda_step_kernel",),
    "linear_split_k": ("skinny_mm_kernel",),
    "linear_tma": ("skinny_mm_kernel",),
    "linear_tma_x+linear_tma_tuned": ("skinny_mm_kernel",),
    "linear_gluon": ("skinny_mm_kernel", "skinny_gl_kernel"),
    # The kernels the change edits: the down GEMM adds, the norm reads fp32 and clears.
    "moe_down_atomic": ("moe_grouped_gemm_kernel", "rmsnorm_kernel"),
    "situ_in_gate_up": ("moe_grouped_gemm_kernel",),
    "moe_grouped_tuned": ("moe_grouped_gemm_kernel",),  # the same kernel at other blocks
    "attn_res_wide": ("attn_res_score_kernel", "attn_res_combine_kernel"),  # other chunks
}
#: triton_linear: the sweep's shapes it takes (plan.SKINNY_SUBOPS; the front is its rest
#: once router_fork has split off the router columns).
LINEAR_SHAPES = ("moe front (rest, router_fork)", "kda qkvg", "moe up")
O_PROJ_SHAPES = ("kda o_proj", "mla o_proj")  # triton_o_proj
STRUCTURAL = ("replacement", "dependency", "structure")
#: linear_split_k on the campaign build: of the split table's shapes, only the MoE front's rest runs.
SPLIT_SHAPE = "moe front (rest, router_fork)"


def runs(folder: Path, build: int | str) -> list[Path]:
    """The runs of build i (`k3_full_c<i>_*`), or of a named one (`k3_full_<name>_*`)."""
    prefix = f"k3_full_c{build}_" if isinstance(build, int) else f"k3_full_{build}_"
    by_run: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):  # one file per run: the export where both are there
        if p.name.startswith(prefix) and p.suffix in (".sqlite", ".nsys-rep"):
            if p.suffix == ".sqlite" or p.stem not in by_run:
                by_run[p.stem] = p
    found = list(by_run.values())
    if not found:
        sys.exit(f"campaign_table: no {prefix}<run>.sqlite in {folder}; record them with "
                 "kernels/scripts/h200_k3.sh campaign_rec (campaign_neg for named builds)")
    return found


def diff(old: list[Path], new: list[Path]) -> dict:
    exe = Path(sys.executable).with_name("k3trace")  # the console script beside this Python
    cmd = [str(exe) if exe.exists() else "k3trace", "diff", "--json"]
    for p in old:
        cmd += ["--old", str(p)]
    for p in new:
        cmd += ["--new", str(p)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):
        sys.exit(f"campaign_table: k3trace diff failed: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout)


def standalone(ops: dict | None, change: str) -> tuple[float, float, float] | None:
    """(old us, new us, saving ms at full depth) from bench_k3_ops.py's JSON."""
    shapes = {"triton_linear": LINEAR_SHAPES, "triton_o_proj": O_PROJ_SHAPES}.get(change)
    if ops and shapes and all(k in ops.get("sweeps", {}).get("linear", {}) for k in shapes):
        lin = ops["sweeps"]["linear"]
        old = sum(lin[k]["cublas_us"] for k in shapes)
        new = sum(lin[k]["skinny_us"] for k in shapes)
        return old, new, sum((lin[k]["skinny_us"] - lin[k]["cublas_us"]) * lin[k]["layers"]
                             for k in shapes) / 1e3
    if ops and change == "linear_split_k" and ops.get("sweeps", {}).get("split"):
        # The shapes the split table takes and the build runs (mla_proj_merged's is not in it).
        r = ops["sweeps"]["split"][SPLIT_SHAPE]
        return r["unsplit_us"], r["split_us"], (r["split_us"] - r["unsplit_us"]) * r["layers"] / 1e3
    if ops and change == "attn_res_dot" and ops["cases"].get("attn_res_rows"):
        # The old score loops over the bank rows: weigh each row count by how often the
        # step aggregates over it (K3's 186 aggregations read 1..8 rows).
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from kernels.k3.config import K3Config

        cfg, r = K3Config(), ops["cases"]["attn_res_rows"]
        rows = [cfg.bank_rows(l, site) for l in cfg.layers for site in ("attn", "mlp")]
        old = sum(r[f"pair, {n} rows"] for n in rows)
        new = sum(r[f"attn_res_dot, {n} rows"] for n in rows)
        return old / len(rows), new / len(rows), (new - old) / 1e3
    if ops and change in STANDALONE_SUMS:
        layers, case, old_keys, new_keys = STANDALONE_SUMS[change]
        res = ops["cases"].get(case, {})
        if all(k in res for k in (*old_keys, *new_keys)):
            old, new = sum(res[k] for k in old_keys), sum(res[k] for k in new_keys)
            return old, new, (new - old) * layers / 1e3
    if not ops or change not in STANDALONE:
        return None
    layers, case, old_key, new_key = STANDALONE[change]
    res = ops["cases"].get(case, {})
    old = next((v for k, v in res.items() if k.startswith(old_key)), None)
    new = next((v for k, v in res.items() if k.startswith(new_key)), None)
    if old is None or new is None:
        return None
    return old, new, (new - old) * layers / 1e3


def _key(a: dict) -> tuple:
    return a["edit"], a["kind"], a["family"]


def row(change: str, d: dict, ops: dict | None) -> dict:
    """The change's edits: the structural rows and OWN_KERNELS' durations, and the rows
    k3trace reads with a replacement as its released work (the unchanged kernels after it
    that record the rest of it: `read_together` groups of reason `released`)."""
    released = {_key(r) for g in d.get("read_together", []) if g.get("reason") == "released" for r in g["rows"]}
    own = [a for a in d["attribution"] if any(k in a["kind"] for k in STRUCTURAL)
           or (a["kind"] == "duration" and a["edit"] in OWN_KERNELS.get(change, ())) or _key(a) in released]
    other = [a for a in d["attribution"] if a not in own]
    other.sort(key=lambda a: -abs(a["contribution_us"]))
    return {
        "change": change,
        "itl_delta_us": d["itl_delta_us"],
        "noise_band_us": d["noise_band_us"],
        "noise_source": d["noise_source"],
        "verdict": d["verdict_itl"],
        "replayed_us": sum(a["contribution_us"] for a in d["attribution"]),
        "own_edits_us": sum(a["contribution_us"] for a in own),
        "own_top": [(a["edit"], a["contribution_us"]) for a in own[:2]],
        "elsewhere_us": sum(a["contribution_us"] for a in other),
        "elsewhere_top": [(a["edit"], a["family"], a["contribution_us"]) for a in other[:3]],
        "read_together": [([r["edit"] for r in g["rows"]], g["sum_us"]) for g in d.get("read_together", [])],
        "standalone": standalone(ops, change),
    }


def markdown(rows: list[dict]) -> str:
    out = ["| change | ITL delta (band) | standalone x layers | k3trace: the change's edits | elsewhere (largest) "
           "| read together |", "|---|---|---|---|---|---|"]
    for r in rows:
        band = f"{r['noise_band_us']:.0f}" if r["noise_band_us"] is not None else "?"
        sa = r["standalone"]
        sa_txt = f"{sa[0]:.1f} -> {sa[1]:.1f} us: {sa[2] * 1e3:+.0f} us" if sa else "n/a"
        top = "; ".join(f"{e} {c:+.0f}" for e, _, c in r["elsewhere_top"][:2])
        together = "; ".join(" + ".join(edits) + f" = {s:+.0f} us"
                             for edits, s in r.get("read_together", [])[:2]) or "-"
        out.append(f"| {r['change']} | {r['itl_delta_us']:+.0f} us ({band}) | {sa_txt} | "
                   f"{r['own_edits_us']:+.0f} us | {r['elsewhere_us']:+.0f} us ({top}) | {together} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("--changes", nargs="*", default=[], help="the chain: change i turns build i-1 into build i")
    p.add_argument("--ops", type=Path, nargs="+", help="bench_k3_ops.py JSON files (merged; --sweep ones too)")
    p.add_argument("--single", nargs="*", default=[], metavar="CHANGE=NAME:BUILD",
                   help="a change recorded alone on build BUILD as k3_full_<NAME>_<run> (not in the chain)")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    ops = None
    for path in args.ops or ():
        part = json.loads(path.read_text())
        ops = part if ops is None else {**ops, "cases": {**ops["cases"], **part["cases"]},
                                        "sweeps": {**ops.get("sweeps", {}), **part.get("sweeps", {})}}
    rows = []
    for i, change in enumerate(args.changes, start=1):
        d = diff(runs(args.folder, i - 1), runs(args.folder, i))
        rows.append(row(change, d, ops))
        print(f"{change}: ITL {d['itl_delta_us']:+.1f} us (band {d['noise_band_us']}), "
              f"its edits {rows[-1]['own_edits_us']:+.1f}, elsewhere {rows[-1]['elsewhere_us']:+.1f}",
              file=sys.stderr)
    for spec in args.single:
        change, _, rest = spec.partition("=")
        name, _, base = rest.partition(":")
        if not (change and name and base.isdigit()):
            sys.exit(f"campaign_table: bad --single {spec!r}; expected CHANGE=NAME:BUILD")
        d = diff(runs(args.folder, int(base)), runs(args.folder, name))
        rows.append({**row(change, d, ops), "on_build": int(base)})
        print(f"{change} (alone on build {base}): ITL {d['itl_delta_us']:+.1f} us", file=sys.stderr)
    text = markdown(rows)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
