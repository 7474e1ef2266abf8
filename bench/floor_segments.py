"""Where a K3 decode step's time above its HBM floor sits, by segment between the layers'
first kernels (kernels/README.md, thirteenth round).

Under early PDL triggers a kernel's recorded duration holds the tail of its primary, so per
kernel rows cannot place the time above the floor. The starts of each layer's first
attention and first MLP kernel can: they are launched where the work before them lets them.
A layer's attention segment runs from the start of its attention family's first kernel (the
KDA qkvg GEMM, the MLA q_a) to the start of its MLP family's first kernel (the MoE front),
so it holds the pre-MLP residual pair; its MLP segment runs from there to the start of the
next layer's attention, holding the pre-attention pair. Each kind's median over the stable
steps and layers is set against the bytes it must read (`K3Config.read_bytes`, the HBM
floor's terms) at the copy bandwidth measured beside the step (bench_k3_step.py).

    python3 bench/floor_segments.py REPORT [REPORT ...] --copy-tbs 4.21 [--batch 1] \
        [--new REPORT ...] [--json OUT]

With --new, the second build's medians beside the first's: which segments a change moved.
Each segment's tail (from its last kernel's start, the output GEMM, to the next segment's
first kernel) is reported beside it: in K3's segments it holds most of the time above the
floor (kernels/README.md, fourteenth round).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

#: The families whose first kernel in a layer opens a segment (the residual pairs never do).
ANCHORS = ("kda", "mla", "moe", "dense")
ATTENTION, MLP = ("kda", "mla"), ("moe", "dense")


def segment_times(kernels: pl.DataFrame, stable_steps: list[int]) -> pl.DataFrame:
    """step, layer, family, kind, time_ns, tail_ns: each segment of a stable step that has a
    next anchor, from its (layer, family)'s first kernel start to the next anchor's; the tail
    from its last kernel's start (K3's output GEMM: o_proj, the MoE up GEMM) to the same
    anchor, which holds that kernel, the residual pair after it and the hop to the next GEMM.
    An MLP segment's kind names the attention after it ("moe > mla"): the pre-attention pair it
    ends with releases a different first kernel there (a cuBLAS GEMM or a PDL one)."""
    anchors = (kernels.filter(pl.col("step").is_in(stable_steps) & pl.col("family").is_in(ANCHORS)
                              & pl.col("layer").is_not_null())
               .group_by("step", "layer", "family").agg(pl.col("start").min(), pl.col("start").max().alias("last"))
               .sort("step", "start"))
    nxt = pl.col("start").shift(-1).over("step"), pl.col("family").shift(-1).over("step")
    return (anchors.with_columns(time_ns=nxt[0] - pl.col("start"), tail_ns=nxt[0] - pl.col("last"),
                                 kind=pl.when(pl.col("family").is_in(MLP))
                                 .then(pl.concat_str("family", pl.lit(" > "), nxt[1]))
                                 .otherwise(pl.col("family")))
            .drop_nulls("time_ns").select("step", "layer", "family", "kind", "time_ns", "tail_ns"))


def segment_bytes(cfg) -> dict[str, int]:
    """family -> bytes one segment of it reads: the attention segment its layer's attention
    terms, the MLP segment its MLP terms; the residual pairs' bank rows split between them."""
    out: dict[str, int] = {}
    for layer in cfg.layers:
        parts = cfg.read_bytes(layer)
        banks = parts["attn-res banks"] // 2
        out.setdefault(cfg.attention_family(layer),
                       parts["attention weights"] + parts["kda state"] + parts["mla cache"] + banks)
        out.setdefault(cfg.mlp_family(layer), parts["dense/moe weights"] + parts["routed experts"] + banks)
    return out


def floor_table(segments: pl.DataFrame, nbytes: dict[str, int], copy_bytes_per_ns: float) -> pl.DataFrame:
    """Per kind: segments per step, the median segment and its median tail (segment_times),
    its bytes at copy bandwidth, and the time above that per segment and per step (median x
    segments)."""
    per_step = segments.group_by("step", "kind").len().group_by("kind").agg(pl.col("len").median())
    table = (segments.group_by("kind").agg(pl.col("family").first(),
                                           (pl.col("time_ns").median() / 1e3).alias("median_us"),
                                           (pl.col("tail_ns").median() / 1e3).alias("tail_us"))
             .join(per_step.rename({"len": "per_step"}), on="kind")
             .with_columns(mb=pl.col("family").replace_strict(nbytes, default=None) / 1e6))
    table = table.with_columns(floor_us=pl.col("mb") * 1e3 / copy_bytes_per_ns)
    order = pl.col("family").replace_strict({f: i for i, f in enumerate(ANCHORS)}, default=len(ANCHORS))
    return (table.with_columns(above_us=pl.col("median_us") - pl.col("floor_us"))
            .with_columns(above_ms_per_step=pl.col("above_us") * pl.col("per_step") / 1e3)
            .sort(order, "kind").drop("family"))


class NoSegments(ValueError):
    """The reports hold no labelled K3 layers."""


def _load(paths: list[Path]):
    from k3trace.analyses.pipeline import analyze_report
    from k3trace.config import load_config

    cfg = load_config()
    frames, spans = [], []
    for i, path in enumerate(paths):
        a = analyze_report(path, cfg)
        stable = a.step_times["step"].to_list()
        frames.append(segment_times(a.kernels, stable).with_columns(step=pl.col("step") + i * 1_000_000))
        spans += (a.step_times["span"] / 1e3).to_list()
    segments = pl.concat(frames)
    if segments.is_empty():
        raise NoSegments(f"no K3 layer segments in {paths[0].name}: give K3 decode recordings "
                         "(layer.<i>.<family> NVTX ranges), as `k3trace record --workload k3-decode` makes")
    return segments, spans


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--new", nargs="*", type=Path, default=[], help="the other build's runs")
    p.add_argument("--copy-tbs", type=float, required=True,
                   help="copy bandwidth measured beside the step, TB/s (bench_k3_step.py's floor)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    for path in [*args.reports, *args.new]:
        if not path.is_file():
            print(f"error: {path} not found: give the exported reports (.sqlite or .nsys-rep)", file=sys.stderr)
            return 2
    from k3trace.errors import ReportError
    from kernels.k3.config import K3Config

    try:
        old, old_spans = _load(args.reports)
        new, new_spans = _load(args.new) if args.new else (None, [])
    except (NoSegments, ReportError) as e:  # bad input: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = K3Config(batch=args.batch, num_layers=int(old["layer"].max()))
    nbytes = segment_bytes(cfg)
    table = floor_table(old, nbytes, args.copy_tbs * 1e3)  # TB/s = 1e3 bytes per ns
    pl.Config.set_tbl_rows(20)
    pl.Config.set_float_precision(2)
    print(f"{len(old_spans)} stable steps, span median {sorted(old_spans)[len(old_spans) // 2]:.1f} us; "
          f"copy bandwidth {args.copy_tbs} TB/s; bytes at B = {args.batch}")
    print(table)
    out = {"old": table.to_dicts()}
    if new is not None:
        moved = (table.select("kind", "per_step", pl.col("median_us").alias("old_us"))
                 .join(floor_table(new, nbytes, args.copy_tbs * 1e3).select("kind", pl.col("median_us").alias("new_us")),
                       on="kind", maintain_order="left")
                 .with_columns(delta_us=pl.col("new_us") - pl.col("old_us"))
                 .with_columns(delta_us_per_step=pl.col("delta_us") * pl.col("per_step")))
        print(f"the other build: span median {sorted(new_spans)[len(new_spans) // 2]:.1f} us")
        print(moved)
        out["moved"] = moved.to_dicts()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
