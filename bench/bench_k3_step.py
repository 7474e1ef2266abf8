"""K3 decode step time on the H200 against the HBM floor, measured side by side in one run.

    python3 bench/bench_k3_step.py [--batches 1 8 64] [--layers 0] [--replays 30] [--json OUT]
                                   [--variants baseline router_fork+mla_combine_wide]

HBM floor = bytes one decode step must read (every weight it touches, the MLA latent cache
over the context, the KDA state, the experts the router actually picked) / the
device-to-device copy bandwidth measured in this same run (bytes read + written per second,
the same way KINDS.md reports the H200's 4.3 TB/s). Goal: within 1.25x at B=1.
Runs on a GPU only; CI never runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

import torch

BF16 = 2


def copy_bandwidth(gib: float = 4.0, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (median of repeats)."""
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * BF16 / statistics.median(times[2:])


def bytes_read_per_step(model) -> dict[str, int]:
    """What one decode step must read from HBM, by part (from the config and the routing the
    step just did)."""
    cfg = model.cfg
    parts: dict[str, int] = {}
    for layer in cfg.layers:
        routed = int(torch.unique(model.routing(layer)).numel()) if cfg.mlp_family(layer) == "moe" else 0
        for part, n in cfg.read_bytes(layer, routed).items():
            parts[part] = parts.get(part, 0) + n
    return parts


@contextmanager
def patched(module, **values):
    """`module`'s tables and constants set to `values` within the block (None: left as
    they are). Dicts and sets change in place, since the model imports some by name."""
    saved = {}
    for name, value in values.items():
        if value is None:
            continue
        old = getattr(module, name)
        saved[name] = old.copy() if isinstance(old, (dict, set)) else old
        if isinstance(old, (dict, set)):
            old.clear()
            old.update(value)
        else:
            setattr(module, name, value)
    try:
        yield
    finally:
        for name, old in saved.items():
            now = getattr(module, name)
            if isinstance(now, (dict, set)):
                now.clear()
                now.update(old)
            else:
                setattr(module, name, old)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _shape_table(table: dict, text: str) -> dict:
    """`KxN:a,b,c/KxN:...` over a config table keyed by (K, N)."""
    table = dict(table)
    for part in text.split("/"):
        shape, cfg = part.split(":")
        table[tuple(int(v) for v in shape.split("x"))] = _ints(cfg)
    return table


def overrides(spec: dict[str, str], skinny_table: str) -> ExitStack:
    """The `BUILD@key=value` parts of a build (bench_k3_step.py --help), applied around its
    model's build and capture (the plan reads its tables at build, the launches at capture):
    - front=BN,BK,WARPS,STAGES/SR,SF: router_in_front's config and splits;
    - downmix=BN,BK,WARPS,STAGES: moe_down_mixed's config;
    - split=BN,BK,WARPS,STAGES/SPLIT: under linear_split_k, the MoE front's rest (7168 x 5120);
    - leg=BN,BK,WARPS,STAGES/SPLIT: shared_front_leg's S1 GEMM (gemv.SHARED_LEG);
    - tailmma=1|2: moe_tail_mma's sum of squares (gemv.TAIL_MMA);
    - glsub=o_proj,front: linear_gluon's GEMMs (plan.GLUON_SUBOPS);
    - mlasub=q_b,kv_a: triton_mla_proj's GEMMs (plan.MLA_SKINNY);
    - glcfg=KxN:BN,BK,WARPS,STAGES,EARLY/...: linear_gluon's configs (gemv_gluon.GL_CONFIGS);
    - wscfg=KxN:BN,BK,WARPS,STAGES,MMA,MAXNREG/...: linear_ws's configs (gemv_gluon.WS_CONFIGS);
    - skcfg=KxN:BN,BK,WARPS,STAGES/...: the skinny GEMM's configs (gemv.SKINNY_CONFIGS);
    - tmacfg=KxN:BN,BK,WARPS,STAGES/...: linear_tma_tuned's (gemv.TMA_CONFIGS; 7168x5120 the front's rest);
    - attnres=BLOCK_H,SCORE_WARPS,COMBINE_WARPS: the attention residuals' column chunk and warps
      (attn_res.BLOCK_H_MAX, PAIR_WARPS);
    - launch=KERNEL:WARPS[,STAGES]/...: a Triton kernel's num_warps (and num_stages) at every
      launch (common.LAUNCH_META), e.g. launch=rmsnorm_kernel:4/kda_step_kernel:4;
    - grouped=NxK:BN,BK,WARPS,STAGES/...: moe_grouped_tuned's blocks by expert weight shape
      (moe.GROUPED_CONFIGS; 768x3584 the gate|up GEMM, 3584x384 the down GEMM);
    - skinny (a suffix): the skinny GEMM's configs from a bench_k3_ops.py --latency sweep."""
    from kernels.k3 import plan
    from kernels.k3.ops import attn_res, common, gemv, gemv_gluon, moe

    stack = ExitStack()
    if "front" in spec:
        cfg, splits = spec["front"].split("/")
        stack.enter_context(patched(moe, FRONT_ROUTER_CONFIG=_ints(cfg), FRONT_ROUTER_SPLITS=_ints(splits)))
    if "downmix" in spec:
        stack.enter_context(patched(moe, DOWN_MIX_CONFIG=_ints(spec["downmix"])))
    if "split" in spec:
        cfg, split = spec["split"].split("/")
        stack.enter_context(patched(gemv, SKINNY_SPLITS={**gemv.SKINNY_SPLITS, (7168, 5120): (_ints(cfg), int(split))}))
    if "leg" in spec:
        cfg, split = spec["leg"].split("/")
        stack.enter_context(patched(gemv, SHARED_LEG=(_ints(cfg), int(split))))
    if "tailmma" in spec:
        stack.enter_context(patched(gemv, TAIL_MMA=int(spec["tailmma"])))
    if "glsub" in spec:
        stack.enter_context(patched(plan, GLUON_SUBOPS=set(spec["glsub"].split(","))))
    if "mlasub" in spec:
        stack.enter_context(patched(plan, MLA_SKINNY=frozenset(spec["mlasub"].split(","))))
    if "glcfg" in spec:
        stack.enter_context(patched(gemv_gluon, GL_CONFIGS=_shape_table(gemv_gluon.GL_CONFIGS, spec["glcfg"])))
    if "wscfg" in spec:
        stack.enter_context(patched(gemv_gluon, WS_CONFIGS=_shape_table(gemv_gluon.WS_CONFIGS, spec["wscfg"])))
    if "skcfg" in spec:
        stack.enter_context(patched(gemv, SKINNY_CONFIGS=_shape_table(gemv.SKINNY_CONFIGS, spec["skcfg"])))
    if "tmacfg" in spec:
        stack.enter_context(patched(gemv, TMA_CONFIGS=_shape_table(gemv.TMA_CONFIGS, spec["tmacfg"])))
    if "attnres" in spec:
        block_h, *warps = _ints(spec["attnres"])
        stack.enter_context(patched(attn_res, BLOCK_H_MAX=block_h, PAIR_WARPS=tuple(warps)))
    if "launch" in spec:
        table = {}
        for part in spec["launch"].split("/"):
            name, values = part.split(":")
            table[name] = dict(zip(("num_warps", "num_stages"), _ints(values)))
        stack.enter_context(patched(common, LAUNCH_META=table))
    if "grouped" in spec:
        stack.enter_context(patched(moe, GROUPED_CONFIGS=_shape_table(moe.GROUPED_CONFIGS, spec["grouped"])))
    if "skinny" in spec and skinny_table:
        table = dict(gemv.SKINNY_CONFIGS)
        for r in json.load(open(skinny_table))["sweeps"]["linear_latency"].values():
            table[(r["K"], r["N"])] = tuple(r["best_config"])
        stack.enter_context(patched(gemv, SKINNY_CONFIGS=table))
    return stack


def parse_build(variant: str) -> tuple[str, dict[str, str]]:
    """`BUILD@key=value@key=value...` (and a bare `@skinny`) -> (BUILD, {key: value})."""
    build, *parts = variant.split("@")
    spec = {}
    for part in parts:
        key, _, value = part.partition("=")
        spec[key] = value
    return build, spec


def time_step(model, replays: int) -> float:
    from kernels.record_loop import capture, time_replays

    for _ in range(2):
        model.step()
    torch.cuda.synchronize()
    graph = capture(model)
    ms = time_replays(graph, replays)
    return statistics.median(ms)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--json", default="")
    p.add_argument("--variants", nargs="+", default=["baseline"],
                   help="builds to time side by side in this run (the floor uses each build's routing); "
                        "BUILD@front=BN,BK,WARPS,STAGES/SR,SF times router_in_front at that config and split; "
                        "BUILD@downmix=BN,BK,WARPS,STAGES moe_down_mixed at that config; "
                        "BUILD@split=BN,BK,WARPS,STAGES/SPLIT the MoE front's rest at that split (linear_split_k); "
                        "BUILD@tailmma=1|2 moe_tail_mma's sum of squares by reduction or Gram matrix; "
                        "BUILD@glsub=o_proj,front linear_gluon on those GEMMs; "
                        "BUILD@mlasub=q_b,kv_a triton_mla_proj on those GEMMs; BUILD@glcfg=KxN:BN,BK,W,S,E/... its configs; "
                        "BUILD@wscfg=KxN:BN,BK,W,S,MMA,MAXNREG/... linear_ws's; "
                        "BUILD@grouped=NxK:BN,BK,W,S/... moe_grouped_tuned's blocks; "
                        "BUILD@skcfg=KxN:BN,BK,W,S/... and @tmacfg=... the skinny GEMM's and linear_tma_tuned's configs")
    p.add_argument("--skinny-table", default="",
                   help="bench_k3_ops.py --latency sweep JSON: builds suffixed @skinny take its best unsplit "
                        "skinny-GEMM configs (one call at a time), to time them in the step beside the committed table")
    p.add_argument("--split-table", default="",
                   help="bench_k3_ops.py --split-sweep JSON: linear_split_k takes its splits from it "
                        "(the shapes where splitting won), to time a candidate table before it is committed")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs of the first build per batch before the list (0: none): the first "
                        "build timed in a process runs ~0.17 ms fast at B = 1 (kernels/README.md, round 7)")
    args = p.parse_args()
    from kernels.k3 import build_model

    if args.split_table:
        from kernels.k3.ops import gemv

        for r in json.load(open(args.split_table))["sweeps"]["split"].values():
            if r["split_us"] < r["unsplit_us"]:
                gemv.SKINNY_SPLITS[(r["K"], r["N"])] = (tuple(r["split_config"]), r["splits"])
        print("split table:", gemv.SKINNY_SPLITS)

    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s (read + written)")
    rows = []

    def save() -> None:
        # After every build: a list cut short by its call's time limit keeps what it timed.
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)

    for batch in args.batches:
        for i, variant in enumerate([args.variants[0]] * args.warmup + args.variants):
            warmup = i < args.warmup
            build, spec = parse_build(variant)
            try:
                with overrides(spec, args.skinny_table):
                    model = build_model(SimpleNamespace(batch=batch, layers=args.layers, variant=build,
                                                        delay_kernel="", delay_ns=0, no_fork=False))
                    step_ms = time_step(model, args.replays)
            except Exception as exc:  # a build never run before (a compile error, a launch failure)
                # One failed build must not take the list's other numbers with it; a faulted
                # CUDA context fails every build after it, so the list stops there.
                line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                print(f"B={batch:3d} {variant}: FAILED {line}")
                rows.append({"batch": batch, "variant": variant, "error": line})
                save()
                model = None
                try:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                except Exception:
                    print("the CUDA context is lost: the list stops here")
                    return 1
                continue
            if warmup:
                print(f"B={batch:3d} {variant}: warm-up {step_ms:8.3f} ms (not a sample)")
                del model
                torch.cuda.empty_cache()
                continue
            parts = bytes_read_per_step(model)
            total = sum(parts.values())
            floor_ms = total / bw * 1e3
            row = {"batch": batch, "variant": variant, "step_ms": step_ms, "bytes_read": total,
                   "floor_ms": floor_ms, "ratio": step_ms / floor_ms,
                   "parts_gb": {k: v / 1e9 for k, v in parts.items()}, "copy_tb_s": bw / 1e12}
            rows.append(row)
            save()
            print(f"B={batch:3d} {variant}: step {step_ms:8.3f} ms   reads {total / 1e9:7.2f} GB   "
                  f"HBM floor {floor_ms:8.3f} ms   ratio {step_ms / floor_ms:5.2f}"
                  + ("  (goal <= 1.25)" if batch == 1 else ""))
            print("        " + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in parts.items()))
            del model
            torch.cuda.empty_cache()
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
