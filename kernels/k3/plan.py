"""The launch plan of one K3 decode step, as data (kernels/README.md, "Streams and the
launch plan of one layer").

`build_plan(cfg, variant)` lists, per layer segment and in host issue order, every launch
(family, sub-op NVTX name, stream, kind, launcher, Triton kernel names), the fork/join
points and the all-reduce placeholders. `K3Decode.step()` checks each of its launches
against this list as it issues them (a mismatch raises), so the plan is what runs; the
GPU test compares the captured graph's kernel nodes with `triton_kernels` /
`cublas_calls`, and the trace analyser can read the expected counts from here.

Pure Python (no torch): importable by CPU tests and by k3trace.

Fork points. A side leg forks where its input is ready, which for the KDA gate GEMVs, the
MLA KV chain and g_proj is the pre-attention aggregation that ends the previous segment;
the KDA and KV legs fork at the start of the segment (they overlap qkvg / the Q chain,
seed 001), g_proj forks just before the FMHA it overlaps, the MoE shared-expert leg right
after the front GEMM it reads. Host issue order follows the README listing; with forks
off every leg runs inline on main in that same order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import k3names

from .config import ATTN_RES, DENSE, KDA, MLA, MOE, K3Config
from .variants import BASELINE, Variant

MAIN, AUX1, AUX2, AUX3 = "main", "aux1", "aux2", "aux3"
STREAMS = (MAIN, AUX1, AUX2, AUX3)
#: AUX3 (variant prefetch_leg:<MB>) is the one side stream forked per segment and joined
#: once, at the end of the step: nothing on the critical path waits for its prefetches.
TRITON, CUBLAS, CUTE = "triton", "cublas", "cute"

# ---- sub-op NVTX range names (one range around each launch) ------------------------------
# attn_res segments
RESIDUAL_ADD = "residual_add"
SCORE = "score"
COMBINE = "combine"
SCORE_COMBINE = "score_combine"  # variant attn_res_fused: both in one launch
# KDA
QKVG, FAB, F_B, CONV, KDA_STEP, KDA_NORM, O_PROJ = (
    "qkvg", "fab", "f_b", "conv", "kda_step", "kda_norm", "o_proj")
# MLA
Q_A, Q_A_NORM, Q_B, ABSORB = "q_a", "q_a_norm", "q_b", "absorb"
KV_A, KV_A_NORM, CACHE_INSERT, Q_CONCAT = "kv_a", "kv_a_norm", "cache_insert", "q_concat"
G_PROJ, FMHA, FMHA_COMBINE, V_UP, GATE_MUL = "g_proj", "fmha", "fmha_combine", "v_up", "gate_mul"
X_PROJ = "x_proj"  # variant mla_proj_merged: q_a | kv_a | g_proj, the three GEMMs that read x
L2_PREFETCH = "l2_prefetch"  # variant prefetch_leg:<MB>: the next GEMM's weight into L2, on AUX3
# MoE
FRONT, SHARED_ACT, SHARED_DOWN = "front", "shared_act", "shared_down"
SHARED_GATE_UP = "shared_gate_up"  # variant shared_front_leg: the front's shared columns, on S1
ROUTER_GEMV = "router_gemv"
ROUTER, ALIGN, EXPERT_GATE_UP, EXPERT_ACT, EXPERT_DOWN = (
    "router", "align", "expert_gate_up", "expert_act", "expert_down")
WEIGHTED_SUM, LATENT_NORM, UP, ADD3 = "weighted_sum", "latent_norm", "up", "add3"
# dense MLP
GATE_UP, ACT, DOWN = "gate_up", "act", "down"

#: Triton kernel function names behind each launcher of kernels/k3/ops (what a trace's
#: kernel names and the `delay:<kernel>:<ns>` variant refer to). A launcher that issues
#: several kernels lists them in launch order; variants pick between entries below.
TRITON_KERNELS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("rmsnorm_kernel",),
    "attn_res_score": ("attn_res_score_kernel",),
    "attn_res_combine": ("attn_res_combine_kernel",),
    # score + combine in one launch (grid barrier); launches the pair above instead when
    # its B*NC programs exceed the SM count (B = 64).
    "attn_res_fused": ("attn_res_fused_kernel",),
    "attn_res_one_pass": ("attn_res_one_pass_kernel",),  # attn_res_one_pass: score + combine, no exchange
    "residual_add": ("residual_add_kernel",),
    "add3": ("residual_add_kernel",),            # the same kernel with HAS_B
    "kda_conv_silu": ("kda_conv_silu_kernel",),
    "kda_step": ("kda_step_kernel",),
    "kda_gated_rmsnorm": ("kda_gated_rmsnorm_kernel",),
    "mla_q_concat": ("mla_q_concat_kernel",),
    "mla_cache_insert": ("mla_q_concat_kernel",),  # the same kernel with no query rows
    "mla_kv_norm_insert": ("rmsnorm_kernel",),   # mla_kv_norm_insert: the norm writing the cache row
    "mla_decode_fmha": ("mla_decode_fmha_kernel",),
    "mla_decode_combine": ("mla_decode_combine_kernel",),
    "mla_decode_combine/wide": ("mla_decode_combine_wide_kernel",),
    "gate_mul": ("gate_mul_kernel",),
    "head_bmm": ("head_bmm_kernel",),            # mla_head_bmm: the absorb and V-up BMMs (mla_gate_in_v: + gate)
    "moe_router": ("moe_router_kernel",),
    "moe_router/multipass": ("moe_router_group_kernel", "moe_router_merge_kernel"),
    "moe_align": ("moe_align_kernel",),
    "moe_front_router": ("moe_front_router_kernel",),  # router_in_front: the front GEMM + router
    "moe_grouped_gemm": ("moe_grouped_gemm_kernel",),
    "situ_mul": ("situ_mul_kernel",),
    "moe_weighted_sum": ("moe_weighted_sum_kernel",),
    "moe_weighted_sum_norm": ("moe_weighted_sum_norm_kernel",),  # moe_sum_norm_fused
    "moe_down_mix": ("moe_down_mix_kernel",),    # moe_down_mixed: the down GEMM + the weighted sum
    "gemv": ("gemv_kernel",),
    "skinny_mm": ("skinny_mm_kernel",),
    "skinny_gl": ("skinny_gl_kernel",),          # linear_gluon: the Gluon skinny GEMM
    "skinny_ws": ("skinny_ws_kernel",),          # linear_ws: the same, warp-specialized
    "skinny_mm_mixnorm": ("skinny_mm_kernel",),  # the same kernel with MIX_K (moe_tail_fused)
    "l2_prefetch_weight": ("l2_prefetch_kernel",),
}
#: Variant triton_linear takes these dense GEMMs up to this batch: the wide ones, where the
#: skinny kernel streamed 13-20% faster than cuBLAS alone on the H200 (bench_k3_ops.py
#: --sweep); on the narrow ones (q_a, g_proj: N = 1536) it was slower, on the rest even.
#: shared_gate_up is the front's shared columns cut out (variant shared_front_leg).
SKINNY_MAX_B = 16
SKINNY_SUBOPS = frozenset({"front", "qkvg", "up", "shared_gate_up"})
#: Variant triton_mla_proj: the MLA's narrow GEMMs (N = 576 .. 2304: too few column blocks
#: alone), which the skinny GEMM takes split over K (gemv.MLA_SPLITS).
MLA_SKINNY = frozenset({"q_a", "kv_a", "g_proj", "q_b"})
#: Variant mla_q_skinny: those on main, the Q chain's. On c57 (the absorb a PDL kernel) q_a and
#: q_b together ran the step 0.08 ms faster, with kv_a too 0.02, with g_proj (beside the FMHA)
#: 0.01, all four even (bench_k3_step.py @mlasub=, campaign37/38).
MLA_Q_SKINNY = frozenset({"q_a", "q_b"})
#: The CuTe DSL KDA step (variant kda_cute).
CUTE_KDA_KERNEL = "kda_step_cute"


@dataclass(frozen=True)
class Launch:
    subop: str                   # sub-op NVTX range around this launch
    stream: str                  # main / aux1 / aux2
    kind: str                    # triton / cublas / cute
    launcher: str                # kernels.k3.ops function, or torch op ("mm", "bmm")
    kernels: tuple[str, ...] = ()  # Triton (or CuTe) kernel names it issues, in order

    @property
    def delayed_kernel(self) -> str:
        """The kernel a `delay:` variant slows when it names this launch: the last one
        (a multi-kernel launcher spins in the kernel whose stores the consumer reads)."""
        return self.kernels[-1] if self.kernels else ""

    def matches_delay(self, variant: Variant) -> bool:
        return bool(self.kernels) and variant.delay_for(self.delayed_kernel, self.launcher) > 0


@dataclass(frozen=True)
class Fork:
    side: str                    # the side stream that waits on main


@dataclass(frozen=True)
class Join:
    side: str                    # main waits on this side stream


@dataclass(frozen=True)
class AllReduce:
    """NVTX-only placeholder for the tensor-parallel all-reduce (one GPU stands in)."""
    range_name: str = k3names.ALL_REDUCE_RANGE


Item = Launch | Fork | Join | AllReduce


@dataclass(frozen=True)
class Segment:
    layer: int
    family: str
    items: tuple[Item, ...]

    @property
    def range_name(self) -> str:
        return k3names.layer_range(self.layer, self.family)

    @property
    def launches(self) -> tuple[Launch, ...]:
        return tuple(i for i in self.items if isinstance(i, Launch))


@dataclass(frozen=True)
class StepPlan:
    cfg: K3Config
    variant: Variant
    segments: tuple[Segment, ...]
    # The step first copies the fixed input embedding into bank row 0 (a device memcpy,
    # not a kernel: a graph replay must start every step from the same input).
    prologue: tuple[str, ...] = field(default=("embed_copy",))

    def launches(self) -> list[tuple[Segment, Launch]]:
        return [(s, l) for s in self.segments for l in s.launches]

    @property
    def triton_kernels(self) -> int:
        """Triton kernels per step, exact."""
        return sum(len(l.kernels) for _, l in self.launches() if l.kind == TRITON)

    @property
    def cute_kernels(self) -> int:
        return sum(len(l.kernels) for _, l in self.launches() if l.kind == CUTE)

    @property
    def cublas_calls(self) -> int:
        """cuBLAS GEMM/BMM calls per step; each may emit 1-2 kernels (split-K reduction)."""
        return sum(1 for _, l in self.launches() if l.kind == CUBLAS)

    @property
    def kernel_bounds(self) -> tuple[int, int]:
        """(min, max) kernel nodes a captured step may hold."""
        fixed = self.triton_kernels + self.cute_kernels
        return fixed + self.cublas_calls, fixed + 2 * self.cublas_calls

    def triton_kernel_names(self) -> Counter:
        return Counter(k for _, l in self.launches() if l.kind == TRITON for k in l.kernels)

    def range_names(self) -> list[str]:
        """Every NVTX range a step opens (besides `decode_step`, which the loop opens)."""
        names = []
        for s in self.segments:
            names.append(s.range_name)
            for i in s.items:
                if isinstance(i, Launch):
                    names.append(i.subop)
                elif isinstance(i, AllReduce):
                    names.append(i.range_name)
        return names

    def delayed_launches(self) -> list[tuple[Segment, Launch]]:
        return [(s, l) for s, l in self.launches() if l.matches_delay(self.variant)]

    def family_counts(self) -> Counter:
        return Counter(s.family for s in self.segments)

    def forks(self) -> Counter:
        return Counter(i.side for s in self.segments for i in s.items if isinstance(i, Fork))


# ---- segment builders --------------------------------------------------------------------
def _t(subop: str, stream: str, launcher: str, key: str | None = None) -> Launch:
    return Launch(subop, stream, TRITON, launcher, TRITON_KERNELS[key or launcher])


def _mm(subop: str, stream: str, op: str = "mm") -> Launch:
    return Launch(subop, stream, CUBLAS, op)


def prefetch_leg(v: Variant) -> list[Item]:
    """prefetch_leg:<MB>: fork AUX3 here and launch the prefetch of the next GEMM's weight
    there. It starts when main's work so far has completed, i.e. when the GEMM before this
    point is done and the latency-bound kernels that follow it leave HBM idle."""
    return [Fork(AUX3), _t(L2_PREFETCH, AUX3, "l2_prefetch_weight")] if v.prefetch_leg_mb else []


def attn_res_items(cfg: K3Config, v: Variant, layer: int, site: str) -> list[Item]:
    """Aggregation before attention (site 'attn') or before the MLP (site 'mlp')."""
    items: list[Item] = prefetch_leg(v)
    # The attention output joins the partial here, unless it opened a new block (o_proj
    # wrote the partial directly).
    if site == "mlp" and not cfg.opens_block(layer) and not v.residual_folded:
        items.append(_t(RESIDUAL_ADD, MAIN, "residual_add"))
    if site == "mlp" and score_in_o_proj(cfg, v):
        items.append(_t(COMBINE, MAIN, "attn_res_combine"))  # the o_proj before it scored
    elif attn_res_one_pass(cfg, v):
        items.append(_t(SCORE_COMBINE, MAIN, "attn_res_one_pass"))
    elif attn_res_fuses(cfg, v):
        items.append(_t(SCORE_COMBINE, MAIN, "attn_res_fused"))
    else:
        items.append(_t(SCORE, MAIN, "attn_res_score"))
        items.append(_t(COMBINE, MAIN, "attn_res_combine"))
    return items


def score_in_o_proj(cfg: K3Config, v: Variant) -> bool:
    """attn_res_in_o_proj: at one token, where the attention's o_proj is the skinny Triton GEMM
    (triton_o_proj) and the aggregation is attn_res_dot's pair with the residual folded, the
    o_proj's epilogue does the pre-MLP score kernel's work on its columns (the residual add,
    the Gram partial): the score launch and its dependent hop go; the combine sums the
    o_proj's per-column-block partials. Not with the variants that change the score kernel
    (early rows, prefetch) or replace the pair (attn_res_fused)."""
    return (v.attn_res_in_o_proj and cfg.batch == 1 and linear_is_triton(cfg, v, O_PROJ) and v.attn_res_dot
            and v.residual_folded and not v.attn_res_early_rows and not v.prefetch_mb
            and not attn_res_fuses(cfg, v))


def attn_res_one_pass(cfg: K3Config, v: Variant) -> bool:
    """attn_res_one_pass: at one token each aggregation is one launch whose programs each form
    the whole Gram matrix (reading the token's valid rows from L2) and write their chunk of the
    output: no partials, no barrier. Not with the variants that take the score elsewhere
    (attn_res_in_o_proj, attn_res_fused) or change the score kernel (early rows, prefetch)."""
    return (v.attn_res_one_pass and cfg.batch == 1 and not score_in_o_proj(cfg, v)
            and not attn_res_fuses(cfg, v) and not v.attn_res_early_rows and not v.prefetch_mb)


def attn_res_fuses(cfg: K3Config, v: Variant) -> bool:
    """Variant attn_res_fused launches one kernel when its (token, 512-column chunk)
    programs fit one per SM (its grid barrier needs them all resident); else the pair.
    The same rule as kernels.k3.ops.attn_res.attn_res_fused_fits (a test keeps them equal)."""
    chunk = min(512, 1 << max(cfg.hidden - 1, 0).bit_length())
    # Not with mlp_residual_folded: the fused kernel takes one addend, not add3's two.
    return (v.attn_res_fused and not v.mlp_residual_folded
            and cfg.batch * -(-cfg.hidden // chunk) <= cfg.sm_count)


def kda_items(cfg: K3Config, v: Variant) -> list[Item]:
    side = AUX2 if v.attn_forks else MAIN
    items: list[Item] = []
    if v.attn_forks:
        items.append(Fork(AUX2))
    items.append(_mm(QKVG, MAIN))
    # [f_a | b] as a Triton GEMV: cuBLAS's dot_kernel took 28 us there (first H200 trace).
    items += [_t(FAB, side, "gemv"), _mm(F_B, side)]
    if not kda_conv_fuses(cfg, v):
        items.append(_t(CONV, MAIN, "kda_conv_silu"))
    if v.attn_forks:
        items.append(Join(AUX2))
    items += prefetch_leg(v)  # o_proj's weight, during the step kernel
    if v.kda_cute:
        items.append(Launch(KDA_STEP, MAIN, CUTE, "kda_step_cute", (CUTE_KDA_KERNEL,)))
    else:
        items.append(_t(KDA_STEP, MAIN, "kda_step"))
    if not v.kda_norm_fused:
        items.append(_t(KDA_NORM, MAIN, "kda_gated_rmsnorm"))
    items += [_mm(O_PROJ, MAIN), AllReduce()]
    return items


def kda_conv_fuses(cfg: K3Config, v: Variant) -> bool:
    """kda_conv_fused: the Triton kda_step runs the short conv + SiLU of its head's q, k, v
    channels itself on the fused norm's grid: one program per head, or with kda_split_v four,
    the first of which shifts the q and k window rows only after the head's barrier (every one
    of them reads those rows). The CuTe DSL step keeps the conv launch."""
    return v.kda_conv_fused and not v.kda_cute and v.kda_norm_fused


def kda_splits_v(cfg: K3Config, v: Variant) -> bool:
    """kda_split_v: at B = 1 the Triton kda_step (fused norm, conv fused or not) runs a
    quarter of V per program, 48 programs, a head's four meeting at a barrier (they must be
    resident together: at B = 1 all 48 are). In the bundled k3_bs1_base_a and
    k3_bs1_kda_norm_separate recordings (H200, medians over stable steps) the V-split step
    took 3.33 us against the fused step's 5.97; the barrier replaces the separate norm's
    launch and hop (1.31 us and more)."""
    return v.kda_split_v and cfg.batch == 1 and v.kda_norm_fused and not v.kda_cute


def mla_proj_merges(cfg: K3Config, v: Variant) -> bool:
    """mla_proj_merged: at B <= SKINNY_MAX_B, q_a, kv_a and g_proj (all x @ W) run as one
    skinny Triton GEMM over their weights side by side, on main before the KV leg forks; the
    g_proj leg beside the FMHA goes (in the c8 trace it stretched the FMHA + combine from
    ~12 us alone to ~19)."""
    return v.mla_proj_merged and cfg.batch <= SKINNY_MAX_B


def head_bmms(cfg: K3Config, v: Variant) -> bool:
    """mla_head_bmm: at B <= SKINNY_MAX_B (the batch rides in the MMA's rows) the absorb and
    V-up BMMs run as head_bmm_kernel, a Triton kernel in the PDL chain with its weights
    loaded before its wait, where cuBLAS's BMM launched only after its producer completed
    (3.2 and 3.8 us on the c51 path for 1.5 MB each)."""
    return v.mla_head_bmm and cfg.batch <= SKINNY_MAX_B


def gate_in_v(cfg: K3Config, v: Variant) -> bool:
    """mla_gate_in_v: with head_bmms, V-up multiplies by sigmoid(g) in its epilogue, so the
    g_proj leg joins before V-up and the gate_mul launch (and its dependent hop) goes."""
    return v.mla_gate_in_v and head_bmms(cfg, v)


def fmha_early_kv(cfg: K3Config, v: Variant) -> bool:
    """fmha_early_kv: with fmha_one_tile, the FMHA loads its tile's cache rows before its PDL
    wait. Safe only where the step's new cache row comes from the KV leg (forks on): its
    insert completed before q_concat, the FMHA's producer, started. Forks off, q_concat
    itself writes that row, so the rows stay after the wait."""
    return v.fmha_early_kv and v.fmha_one_tile and v.attn_forks


def g_proj_early(cfg: K3Config, v: Variant) -> bool:
    """g_proj_early: the g_proj leg (S2, x @ W_g) forks at the segment's start beside the Q
    chain and the KV leg, which leave HBM half idle (q_a and kv_a stream 30 MB in ~12 us on
    the c57 path), instead of at q_concat beside the FMHA, where its CTAs and the FMHA's
    share the SMs (the one-tile FMHA's 149 KB of shared memory per CTA kept g_proj off them
    until it drained: c60). Needs the forks and a g_proj of its own (not mla_proj_merged)."""
    return v.g_proj_early and v.attn_forks and not mla_proj_merges(cfg, v)


def gate_in_o_proj(cfg: K3Config, v: Variant) -> bool:
    """mla_gate_in_o_proj: where the MLA o_proj is the skinny Triton GEMM (not the Gluon one)
    and V-up does not take the gate already (mla_gate_in_v), the o_proj forms its operand
    o * sigmoid(g) as it loads each K block, rounded as gate_mul stores it (bit for bit), so
    the gate_mul launch and its hop go. Unlike mla_gate_in_v, the g_proj leg still joins
    right before the o_proj, where gate_mul joined it (mla_gate_in_v moved that join up to
    V-up and measured even on c57). k3trace whatif --remove gate_mul_kernel on c69: -18 us."""
    return (v.mla_gate_in_o_proj and not gate_in_v(cfg, v) and linear_is_triton(cfg, v, O_PROJ)
            and not linear_is_gluon(cfg, v, O_PROJ, MLA))


def absorb_concats(cfg: K3Config, v: Variant) -> bool:
    """mla_absorb_concat: with head_bmms, the absorb kernel stores its output straight into
    the FMHA's query rows and copies each head's rope part beside it, so q_concat's launch
    and its hop leave the Q chain. Forks on only: forks off, q_concat also writes the cache
    row. The KV leg then joins the FMHA itself (a plain edge beside the absorb's PDL one).
    On c69 the KV leg ended a median 0.35 us before q_concat started, so the FMHA starts
    where q_concat did: k3trace whatif predicts -33 us per step (kernels/README.md, round
    fifteen)."""
    return v.mla_absorb_concat and head_bmms(cfg, v) and v.attn_forks


def kv_norm_inserts(cfg: K3Config, v: Variant) -> bool:
    """mla_kv_norm_insert: the KV leg's RMSNorm stores the normalised latent and the rope
    part straight into the step's cache row (mla_kv_norm_insert, the same rmsnorm_kernel),
    so the leg's insert launch and its hop go. Forks on only: forks off, q_concat writes the
    row. On c69 the leg ends 0.35 us before q_concat starts, off the path (k3trace whatif: 0);
    it matters once the Q chain is shorter than the leg (kernels/README.md, round fifteen)."""
    return v.mla_kv_norm_insert and v.attn_forks


def mla_items(cfg: K3Config, v: Variant) -> list[Item]:
    f, merged = v.attn_forks, mla_proj_merges(cfg, v)
    kv = AUX1 if f else MAIN
    bmm = (lambda subop: _t(subop, MAIN, "head_bmm")) if head_bmms(cfg, v) else (lambda subop: _mm(subop, MAIN, "bmm"))
    items: list[Item] = [_t(X_PROJ, MAIN, "skinny_mm")] if merged else []
    early_gate = g_proj_early(cfg, v)
    if f:
        items.append(Fork(AUX1))
    if early_gate:
        items += [Fork(AUX2), _mm(G_PROJ, AUX2)]
    items += [*([] if merged else [_mm(Q_A, MAIN)]), _t(Q_A_NORM, MAIN, "rmsnorm"), _mm(Q_B, MAIN), bmm(ABSORB)]
    norm_insert = kv_norm_inserts(cfg, v)
    items += [*([] if merged else [_mm(KV_A, kv)]),
              _t(KV_A_NORM, kv, "mla_kv_norm_insert" if norm_insert else "rmsnorm")]
    if f:  # forked: the KV leg writes its cache row itself; unforked: fused into q_concat
        items += [*([] if norm_insert else [_t(CACHE_INSERT, kv, "mla_cache_insert")]), Join(AUX1)]
    if not absorb_concats(cfg, v):
        items.append(_t(Q_CONCAT, MAIN, "mla_q_concat"))
    gate_leg = f and not merged
    if gate_leg and not early_gate:
        items.append(Fork(AUX2))
    if not merged and not early_gate:
        items.append(_mm(G_PROJ, AUX2 if f else MAIN))
    combine = "mla_decode_combine/wide" if v.mla_combine_wide else None
    items += [_t(FMHA, MAIN, "mla_decode_fmha"), _t(FMHA_COMBINE, MAIN, "mla_decode_combine", combine)]
    gated = gate_in_v(cfg, v)
    if gate_leg and gated:  # V-up reads g
        items.append(Join(AUX2))
    items.append(bmm(V_UP))
    if gate_leg and not gated:
        items.append(Join(AUX2))
    if not gated and not gate_in_o_proj(cfg, v):
        items.append(_t(GATE_MUL, MAIN, "gate_mul"))
    items += [_mm(O_PROJ, MAIN), AllReduce()]
    return items


def router_forks(cfg: K3Config, v: Variant) -> bool:
    """router_fork applies at B = 1 only: at B = 8 the forked head measured 42.8 us against
    37.8 (cuBLAS on the router columns beside the rest of the front; the GEMV would read
    the weights once per token), so larger batches keep the baseline head."""
    return v.router_fork and cfg.batch == 1


def router_aligns(cfg: K3Config, v: Variant) -> bool:
    """router_align_fused: one token's top-k are distinct experts, so the single-pass router
    writes the align's segments itself (B = 1 only; the multi-pass router keeps the align)."""
    return v.router_align_fused and cfg.batch == 1 and not v.router_multipass


def router_in_front(cfg: K3Config, v: Variant) -> bool:
    """router_in_front: where the forked router leg runs its single-pass router with the align
    (router_fork, router_align_fused, B = 1) and the front is the skinny Triton GEMM
    (triton_linear), that GEMM's launch takes the leg: its first programs stream the router
    columns split over K and the last of them routes, while the rest streams. No S2 leg, no
    join: the grouped GEMM follows the front on main, through PDL."""
    return (v.router_in_front and router_forks(cfg, v) and router_aligns(cfg, v)
            and linear_is_triton(cfg, v, FRONT))


def shared_front_leg(cfg: K3Config, v: Variant) -> bool:
    """shared_front_leg: where the router leg forks (router_fork, B = 1; not router_in_front,
    whose launch streams the whole front), main's front GEMM streams the latent columns only
    and the shared experts' gate|up columns (1536 of the rest's 5120, 22 MB) become their own
    GEMM at the head of the S1 leg, which forks after the latent GEMM as before after the
    front. Main reaches the routed chain 22 MB sooner; S1 streams them beside the router's
    top-k and the routed GEMMs, where the GPU metrics showed HBM below its rate (kernels/
    README.md, round nineteen), and joins main at the end of the segment as before. The same
    kernel on the same columns at the front's config: bit for bit (at gemv.SHARED_LEG's small
    config split over K: near)."""
    return v.shared_front_leg and router_forks(cfg, v) and not router_in_front(cfg, v)


def moe_tail_fuses(cfg: K3Config, v: Variant) -> bool:
    """moe_tail_fused: at B = 1 the up GEMM, when it is the skinny Triton GEMM
    (triton_linear), forms its operand from the down GEMM's expert rows itself (weighted
    sum, latent RMSNorm), so those two launches go (seed 003's fused tails)."""
    return v.moe_tail_fused and cfg.batch == 1 and linear_is_triton(cfg, v, UP)


def latent_norm_folds(cfg: K3Config, v: Variant) -> bool:
    """latent_norm_folded: where the up GEMM is the skinny Triton GEMM (triton_linear, B <=
    16), the latent RMSNorm's gamma lives in a copy of the up weights and its 1/rms is
    applied in the GEMM's epilogue, from sums of squares the weighted sum writes: the norm's
    launch goes."""
    return v.latent_norm_folded and linear_is_triton(cfg, v, UP) and not moe_tail_fuses(cfg, v)


def down_mixes(cfg: K3Config, v: Variant) -> bool:
    """moe_down_mixed: at B = 1 (one token's experts are distinct, so each program reads every
    weight column it needs once) the routed down GEMM forms the weighted sum of its expert
    rows itself, so the sum's launch and its dependent hop go. Not with the tails that read
    the expert rows or the sum's sums of squares (moe_tail_fused, latent_norm_folded)."""
    return (v.moe_down_mixed and cfg.batch == 1 and not moe_tail_fuses(cfg, v)
            and not latent_norm_folds(cfg, v))


def sum_norm_fuses(cfg: K3Config, v: Variant) -> bool:
    """moe_sum_norm_fused: at B <= SKINNY_MAX_B one program per token forms the weighted sum
    of its expert rows and the latent RMSNorm of it (the row fits its registers), so the
    norm's launch and its dependent hop go. Not with the two tails that already take the
    norm (moe_tail_fused, latent_norm_folded), nor where the down GEMM forms the sum
    (moe_down_mixed)."""
    return (v.moe_sum_norm_fused and cfg.batch <= SKINNY_MAX_B and not moe_tail_fuses(cfg, v)
            and not latent_norm_folds(cfg, v) and not down_mixes(cfg, v))


def down_sums(cfg: K3Config, v: Variant) -> bool:
    """moe_down_atomic: at B = 1 the routed down GEMM, on its own grid, adds each expert row
    times its router weight into an fp32 latent row by atomic adds, and the latent RMSNorm
    reads it and clears it for the next layer: the weighted sum's launch and its dependent
    hop go. Not with the tails that read the expert rows or the sum's sums of squares
    (moe_tail_fused, latent_norm_folded), nor where the down GEMM mixes (moe_down_mixed) or
    one program sums and norms (moe_sum_norm_fused)."""
    return (v.moe_down_atomic and cfg.batch == 1 and not moe_tail_fuses(cfg, v)
            and not latent_norm_folds(cfg, v) and not down_mixes(cfg, v) and not sum_norm_fuses(cfg, v))


def weights_ahead(cfg: K3Config, v: Variant) -> bool:
    """moe_weights_ahead: where the down GEMM sums atomically (B = 1), the routed situ_mul and
    the latent norm trigger their dependents before their own wait, and the grouped GEMMs load
    their expert's first weight blocks before theirs (moe.AHEAD_BLOCKS): each GEMM's weights
    stream while the short kernel before it, and the tail of the GEMM before that, still run,
    where HBM otherwise idles (kernels/README.md, round nineteen: the GPU metrics' dips). Not
    with situ_in_gate_up or situ_fused (their GEMMs' operands are formed as they load).
    Unsound, kept for the record: the early loads read the routing (each segment's expert)
    before the wait, and on the GPU it is not finished then although the router leg joins
    main before the gate|up GEMM; they load a stale expert's blocks and the model leaves the
    reference (kernels/README.md, round twenty-one; kernels/scripts/ahead_parts.py)."""
    return v.moe_weights_ahead and down_sums(cfg, v) and not v.situ_fused and not gate_up_acts(cfg, v)


def mla_o_proj_ahead(cfg: K3Config, v: Variant) -> bool:
    """mla_o_proj_ahead: at B = 1 the MLA's V-up and gate_mul trigger their dependents before
    their own wait, so that the o_proj launches (and, as the Gluon GEMM, copies its first weight
    slots) while the FMHA's combine runs, in the 8 us where c72's HBM idles at 0.2-0.3 TB/s
    (kernels/README.md, round nineteen). At B = 1 only: B = 8 and 64 must not regress, and
    nothing has measured them."""
    return v.mla_o_proj_ahead and cfg.batch == 1


def grouped_tuned(cfg: K3Config, v: Variant) -> bool:
    """moe_grouped_tuned: the routed grouped GEMMs take their blocks from moe.GROUPED_CONFIGS
    (picked in the step, kernels/README.md round twelve), not moe_grouped_gemm's defaults,
    which were picked back to back. At every batch: the down GEMM's six K blocks of 64
    gained at B = 1, 8 and 64 alike."""
    return v.moe_grouped_tuned


def attn_res_wide(cfg: K3Config, v: Variant) -> bool:
    """attn_res_wide: at B = 1 the score -> combine pair runs in chunks of 1024 columns (7
    programs per token at H = 7168), not 512: fewer partials to sum, each program's loads
    longer. Where the pair runs: not with the one-launch forms (attn_res_fused,
    attn_res_one_pass) nor where the o_proj scores (attn_res_in_o_proj)."""
    return (v.attn_res_wide and cfg.batch == 1 and not attn_res_fuses(cfg, v)
            and not attn_res_one_pass(cfg, v) and not score_in_o_proj(cfg, v))


def gate_up_acts(cfg: K3Config, v: Variant) -> bool:
    """situ_in_gate_up: at B = 1 the routed gate|up GEMM takes each gate row with its up row
    in one tile and stores SiTU of the pair (bit for bit situ_mul's h), so the routed
    situ_mul's launch and its dependent hop go. Not with situ_fused (its down GEMM reads
    gate|up)."""
    return v.situ_in_gate_up and cfg.batch == 1 and not v.situ_fused


def shared_in_up(cfg: K3Config, v: Variant) -> bool:
    """shared_in_up: at B = 1, where the up GEMM is the skinny Triton GEMM reading the latent
    norm's output, it reads [normed latent | shared experts' h] against [up ; shared down]
    stacked along K, so its output is the routed plus the shared experts' (one rounding), and
    the shared experts' cuBLAS down GEMM on S1 goes; S1 joins main before the up GEMM. Not
    with the tails that form the up GEMM's operand otherwise (moe_tail_fused,
    latent_norm_folded, moe_sum_norm_fused, moe_down_mixed)."""
    return (v.shared_in_up and cfg.batch == 1 and linear_is_triton(cfg, v, UP) and not moe_tail_fuses(cfg, v)
            and not latent_norm_folds(cfg, v) and not sum_norm_fuses(cfg, v) and not down_mixes(cfg, v))


def _moe_tail(cfg: K3Config, v: Variant) -> list[Item]:
    """Weighted sum -> latent RMSNorm -> up GEMM, or one of the variants that fuse them."""
    if moe_tail_fuses(cfg, v):
        return [_t(UP, MAIN, "skinny_mm_mixnorm")]
    if sum_norm_fuses(cfg, v):
        return [_t(WEIGHTED_SUM, MAIN, "moe_weighted_sum_norm"), _mm(UP, MAIN)]
    if down_mixes(cfg, v) or (down_sums(cfg, v) and not shared_in_up(cfg, v)):  # the down GEMM formed the sum
        return [_t(LATENT_NORM, MAIN, "rmsnorm"), _mm(UP, MAIN)]
    if shared_in_up(cfg, v):  # the up GEMM reads S1's shared h too
        head = [] if down_sums(cfg, v) else [_t(WEIGHTED_SUM, MAIN, "moe_weighted_sum")]
        return [*head, _t(LATENT_NORM, MAIN, "rmsnorm"), Join(AUX1), _mm(UP, MAIN)]
    norm = [] if latent_norm_folds(cfg, v) else [_t(LATENT_NORM, MAIN, "rmsnorm")]
    return [_t(WEIGHTED_SUM, MAIN, "moe_weighted_sum"), *norm, _mm(UP, MAIN)]


def moe_items(cfg: K3Config, v: Variant) -> list[Item]:
    # The shared-expert fork stays on in every variant (no_attn_forks is attention only).
    key = "moe_router/multipass" if v.router_multipass else None
    fused = router_aligns(cfg, v)
    shared_down = [] if shared_in_up(cfg, v) else [_mm(SHARED_DOWN, AUX1)]  # else in the up GEMM
    if router_in_front(cfg, v):
        head = [_t(FRONT, MAIN, "moe_front_router"), Fork(AUX1), _t(SHARED_ACT, AUX1, "situ_mul"),
                *shared_down]
    elif router_forks(cfg, v):
        # Seed 003: the router logits get their own streaming GEMV on S2, so the top-k and
        # the align run there while main streams the rest of the front GEMM.
        shared_gate_up = [_mm(SHARED_GATE_UP, AUX1)] if shared_front_leg(cfg, v) else []
        head = [Fork(AUX2), _t(ROUTER_GEMV, AUX2, "gemv"), _t(ROUTER, AUX2, "moe_router", key),
                *([] if fused else [_t(ALIGN, AUX2, "moe_align")]),
                _mm(FRONT, MAIN), Fork(AUX1), *shared_gate_up, _t(SHARED_ACT, AUX1, "situ_mul"),
                *shared_down, Join(AUX2)]
    else:
        head = [_mm(FRONT, MAIN), Fork(AUX1), _t(SHARED_ACT, AUX1, "situ_mul"),
                *shared_down, _t(ROUTER, MAIN, "moe_router", key),
                *([] if fused else [_t(ALIGN, MAIN, "moe_align")])]
    return [
        *head,
        _t(EXPERT_GATE_UP, MAIN, "moe_grouped_gemm"),
        *([] if v.situ_fused or gate_up_acts(cfg, v) else [_t(EXPERT_ACT, MAIN, "situ_mul")]),
        _t(EXPERT_DOWN, MAIN, "moe_down_mix" if down_mixes(cfg, v) else "moe_grouped_gemm"),
        *prefetch_leg(v),  # the up GEMM's weight, during the weighted sum and the norm
        *_moe_tail(cfg, v),
        *([] if shared_in_up(cfg, v) else [Join(AUX1)]), _t(ADD3, MAIN, "add3"), AllReduce(),
    ]


def dense_items(cfg: K3Config, v: Variant) -> list[Item]:
    return [_mm(GATE_UP, MAIN), _t(ACT, MAIN, "situ_mul"), _mm(DOWN, MAIN), AllReduce(),
            _t(RESIDUAL_ADD, MAIN, "residual_add")]


_ATTENTION = {KDA: kda_items, MLA: mla_items}
_MLP = {MOE: moe_items, DENSE: dense_items}


def mlp_output_folded(cfg: K3Config, v: Variant, layer: int) -> bool:
    """mlp_residual_folded: this layer's MLP output joins its partial in the next layer's
    pre-attention score kernel (add3 / residual_add there, folded; seed 003). The last
    layer keeps its add: no aggregation follows it."""
    return v.mlp_residual_folded and layer < cfg.layers[-1]


def layer_segments(cfg: K3Config, v: Variant, layer: int) -> list[Segment]:
    attn, mlp = cfg.attention_family(layer), cfg.mlp_family(layer)
    mlp_items = _MLP[mlp](cfg, v)
    if mlp_output_folded(cfg, v, layer):
        mlp_items = [i for i in mlp_items if not (isinstance(i, Launch) and i.subop in (ADD3, RESIDUAL_ADD))]
    return [
        Segment(layer, ATTN_RES, tuple(attn_res_items(cfg, v, layer, "attn"))),
        Segment(layer, attn, tuple(_ATTENTION[attn](cfg, v))),
        Segment(layer, ATTN_RES, tuple(attn_res_items(cfg, v, layer, "mlp"))),
        Segment(layer, mlp, tuple(mlp_items)),
    ]


def linear_is_triton(cfg: K3Config, v: Variant, subop: str) -> bool:
    """Whether this dense GEMM runs as the skinny Triton GEMM (variant triton_linear; with
    triton_o_proj the attention output projections too: cuBLAS streamed them about as fast
    alone, but the Triton kernel joins the PDL chain with early triggers)."""
    subops = (SKINNY_SUBOPS | ({O_PROJ} if v.triton_o_proj else set()) | (MLA_SKINNY if v.triton_mla_proj else set())
              | (MLA_Q_SKINNY if v.mla_q_skinny else set()))
    return v.triton_linear and cfg.batch <= SKINNY_MAX_B and subop in subops


#: Variant linear_gluon: the skinny GEMMs the Gluon kernel takes at one token. Alone on the
#: H200 it ran the o_proj one call at a time in 13.8 us against the Triton kernel's 18.6, the
#: front's rest in 26.5 against 27.1 (bench_k3_ops.py --cases linear_gluon, round 9); in the
#: step only the o_proj gained (-0.06 ms; with the front too -0.01, qkvg +0.03), and the KDA
#: layers' more (k3trace diff: the KDA swap -99 us, the MLA one +15; the KDA o_proj alone
#: -0.09 ms unprofiled, campaign29). Entries are subops, or `family.subop` for one family's;
#: a set, so that bench_k3_step.py can time others (`@glsub=`).
GLUON_SUBOPS = {f"{KDA}.{O_PROJ}"}


def linear_is_gluon(cfg: K3Config, v: Variant, subop: str, family: str) -> bool:
    """Whether this dense GEMM of `family`'s segment runs as the Gluon skinny GEMM (variant
    linear_gluon, B = 1)."""
    return (v.linear_gluon and cfg.batch == 1 and (subop in GLUON_SUBOPS or f"{family}.{subop}" in GLUON_SUBOPS)
            and linear_is_triton(cfg, v, subop))


def _skinny_launcher(cfg: K3Config, v: Variant, subop: str, family: str) -> str:
    if not linear_is_gluon(cfg, v, subop, family):
        return "skinny_mm"
    return "skinny_ws" if v.linear_ws else "skinny_gl"


def _linear_as_triton(cfg: K3Config, v: Variant, seg: Segment) -> Segment:
    items = tuple(_t(i.subop, i.stream, _skinny_launcher(cfg, v, i.subop, seg.family))
                  if isinstance(i, Launch) and i.launcher == "mm" and linear_is_triton(cfg, v, i.subop)
                  else i for i in seg.items)
    return Segment(seg.layer, seg.family, items)


def build_plan(cfg: K3Config, variant: Variant = BASELINE) -> StepPlan:
    segments = [s for layer in cfg.layers for s in layer_segments(cfg, variant, layer)]
    if variant.triton_linear:
        segments = [_linear_as_triton(cfg, variant, s) for s in segments]
    if variant.prefetch_leg_mb:  # the prefetch stream joins main once, at the end
        last = segments[-1]
        segments[-1] = Segment(last.layer, last.family, (*last.items, Join(AUX3)))
    return StepPlan(cfg, variant, tuple(segments))
