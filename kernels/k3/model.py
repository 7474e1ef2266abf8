"""One TP8 rank of Kimi K3 decode on one GPU: random weights, paged state, one step.

    model = K3Decode(K3Config(batch=8), parse("baseline"), "cuda")
    model.step()            # eager, or inside torch.cuda.graph(...) and replayed

`step()` issues the launches of `kernels.k3.plan.build_plan(cfg, variant)` in order and
checks each against it (a divergence raises `PlanMismatch`), so the plan is exactly what
runs: same sub-ops, streams, fork/join points, kernel counts.

Graph replay. Every buffer is allocated in `__init__`; `step()` allocates nothing, never
syncs with the host and launches fixed grids (the MoE segment count lives on the device),
so it can be captured and replayed. A replay repeats identical work, so positions are
fixed: each step appends its token's latent row at position `context` (slot_mapping) and
attends over `context + 1` tokens (seq_lens); the KDA recurrent state and conv window do
advance every step, as they would in serving. The step input is a fixed per-request
embedding copied into bank row 0 (a device memcpy, not a kernel) at the start of each
step; the sampled token is not fed back (the LM head is outside this path).

Weights. Random, seeded, scaled so activations stay O(1) over 93 layers: every GEMM weight
has std 1/sqrt(fan_in) and every sub-layer input is RMS-normalised by the attention-
residual aggregation, so no layer's output grows with depth. bf16 everywhere except
A_log, dt_bias, the router bias and the KDA state (fp32, as in the contract). GEMM weights
are stored [in, out] (y = x @ W); expert banks [E, out, in] as the grouped GEMM reads them.
`n_expert_banks` banks are allocated and layer l uses bank l % n (kernels/README.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kernels.k3 import plan as P
from kernels.k3.config import ATTN_RES, DENSE, KDA, MLA, MOE, K3Config
from kernels.k3.ops.attn_res import (
    add3,
    alloc_attn_res_counter,
    alloc_attn_res_scores,
    alloc_partial_copies,
    attn_res_combine,
    attn_res_fused,
    attn_res_one_pass,
    attn_res_score,
    WIDE_BLOCK_H,
    gemm_scores_shape,
    residual_add,
)
from kernels.k3.ops.common import early_trigger, pdl_off, prefetch_lines, trigger_first
from kernels.k3.ops.kda import SplitScratch, kda_conv_silu, kda_gated_rmsnorm, kda_step
from kernels.k3.ops.mla import (FMHA_BLOCK_N, gate_mul, head_bmm, mla_cache_insert, mla_decode_combine,
                                  mla_decode_fmha, mla_kv_norm_insert, mla_q_concat)
from kernels.k3.ops.moe import (
    alloc_front_router_done,
    grouped_config,
    moe_align,
    moe_down_mix,
    moe_front_router,
    moe_grouped_gemm,
    moe_router,
    moe_weighted_sum,
    moe_weighted_sum_norm,
    router_scratch_shape,
    situ_mul,
    weighted_sum_chunks,
)
from kernels.k3.ops.gemv import (SKINNY_CONFIGS, SKINNY_DEFAULT, alloc_split_k, gemv, skinny_mm,
                                 skinny_mm_mixnorm)
from kernels.k3.ops import gemv as gemv_ops  # its module constants, read at capture
from kernels.k3.ops.gemv_gluon import skinny_gl, skinny_ws
from kernels.k3.ops.norm import rmsnorm
from kernels.k3.ops.prefetch import l2_prefetch_weight
from kernels.k3.variants import BASELINE, Variant
from kernels.streams import Streams, fork, join, nvtx_range, on

#: The module each segment's code sits in in the engine ports (ENGINES.md): KDA and MLA are
#: both `self_attn`, the MoE block `block_sparse_moe`, layer 1's dense MLP `mlp`.
ENGINE_MODULE = {KDA: "self_attn", MLA: "self_attn", MOE: "block_sparse_moe", DENSE: "mlp", ATTN_RES: "attn_res"}

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32

__all__ = ["K3Decode", "PlanMismatch"]


class PlanMismatch(RuntimeError):
    """step() issued something other than what kernels.k3.plan says comes next."""


# ---- weights and per-layer state ----------------------------------------------------------
@dataclass
class AttnResWeights:
    query: torch.Tensor          # [H] pseudo-query of the block-attention residual
    gamma: torch.Tensor          # [H] RMSNorm weight of the aggregated input


@dataclass
class KDALayer:
    qkvg: torch.Tensor           # [H, 4*1536]
    fab_t: torch.Tensor          # [128 + 12, H]   f_a | b, stored transposed for the GEMV
    f_b: torch.Tensor            # [128, 1536]
    conv_w: torch.Tensor         # [4608, 4]
    A_log: torch.Tensor          # [12] fp32
    dt_bias: torch.Tensor        # [1536] fp32
    norm_w: torch.Tensor         # [128] gated RMSNorm weight
    o_proj: torch.Tensor         # [1536, H]
    state: torch.Tensor          # [slots, 12, 128(V), 128(K)] fp32, paged by slot_idx
    conv_state: torch.Tensor     # [slots, 3, 4608] bf16: the last 3 conv inputs


@dataclass
class MLALayer:
    q_a: torch.Tensor            # [H, 1536]
    q_a_norm: torch.Tensor       # [1536]
    q_b: torch.Tensor            # [1536, 12*192]
    w_uk: torch.Tensor           # [12, 128, 512] absorb: q_nope -> latent space
    kv_a: torch.Tensor           # [H, 576]
    kv_a_norm: torch.Tensor      # [512]
    w_uv: torch.Tensor           # [12, 512, 128] latent -> v
    g_proj: torch.Tensor         # [H, 1536] output gate
    o_proj: torch.Tensor         # [1536, H]
    cache: torch.Tensor          # [pages, page_size, 576] bf16 latent cache
    # mla_proj_merged: [H, 1536 + 576 + 1536] = q_a | kv_a | g_proj, which are its column views
    x_proj: torch.Tensor | None = None


@dataclass
class MoELayer:
    front: torch.Tensor          # [H, 896 + 3584 + 1536] router | latent | shared gate|up
    router_bias: torch.Tensor    # [896] fp32 correction bias (selects, does not weight)
    w13: torch.Tensor            # [896, 768, 3584] routed gate|up (an aliased bank)
    w2: torch.Tensor             # [896, 3584, 384] routed down (same bank)
    latent_norm: torch.Tensor    # [3584]
    up: torch.Tensor             # [3584, H]
    shared_down: torch.Tensor    # [768, H]
    # latent_norm_folded: diag(latent_norm) @ up, the norm's gamma folded into the weights.
    up_g: torch.Tensor | None = None
    up_cat: torch.Tensor | None = None  # shared_in_up: [up ; shared_down], [latent + 768, H]
    # router_fork: the router columns of `front`, transposed ([896, H], each expert's K
    # contiguous) for the streaming GEMV; a copy, so every variant draws the same weights.
    router_t: torch.Tensor | None = None


@dataclass
class DenseLayer:
    gate_up: torch.Tensor        # [H, 2*2304]
    down: torch.Tensor           # [2304, H]


@dataclass
class Layer:
    index: int
    pre_attn: AttnResWeights
    pre_mlp: AttnResWeights
    attn: KDALayer | MLALayer
    mlp: MoELayer | DenseLayer


def x_proj_parts(t: torch.Tensor, cfg: K3Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mla_proj_merged: the q_a | kv_a | g_proj column views of a merged weight or output."""
    a, b = cfg.q_lora, cfg.q_lora + cfg.kv_a_width
    return t[:, :a], t[:, a:b], t[:, b:]


# ---- activations (one set, reused by every layer) ------------------------------------------
class Scratch:
    """Preallocated activations: nothing is allocated inside step()."""

    def __init__(self, cfg: K3Config, device: torch.device) -> None:
        B, H = cfg.batch, cfg.hidden
        e = lambda *shape, dtype=BF16: torch.empty(shape, device=device, dtype=dtype)
        self.x = e(B, H)                         # the aggregated sub-layer input
        self.attn_out = e(B, H)                  # o_proj output, added to the partial later
        # KDA
        self.qkvg = e(B, cfg.qkvg_width)
        self.fab = e(B, cfg.fab_width)
        self.fb = e(B, cfg.kda_width)
        self.conv_out = e(B, cfg.conv_channels)
        self.kda_o = e(B, cfg.kda_width)         # unnormalised o (kda_norm_separate)
        self.kda_out = e(B, cfg.kda_width)
        self.kda_split = SplitScratch.allocate(B, cfg.kda_heads, cfg.kda_head_dim, device)  # kda_split_v
        # MLA
        NH = cfg.mla_heads
        self.q_a = e(B, cfg.q_lora)
        self.q_a_n = e(B, cfg.q_lora)
        self.q_b = e(B, cfg.q_b_width)
        self.q_abs = e(NH, B, cfg.kv_lora)       # absorb BMM output, head-major for cuBLAS
        self.kv_a = e(B, cfg.kv_a_width)
        self.kv_lat = e(B, cfg.kv_lora)          # normalised latent (the cache row's head)
        self.q_full = e(B, NH, cfg.kv_a_width)
        S = cfg.fmha_splits
        self.fmha_partial = e(B, NH, S, cfg.kv_lora, dtype=F32)
        self.fmha_lse = e(B, NH, S, dtype=F32)
        self.attn_lat = e(NH, B, cfg.kv_lora)    # combine output, head-major for the V BMM
        self.mla_o = e(B, NH, cfg.v_head)        # V BMM writes its head-major view
        self.g = e(B, cfg.mla_out_width)
        self.x_proj: torch.Tensor | None = None
        self.mla_gated = e(B, cfg.mla_out_width)
        # MoE
        K, P = cfg.top_k, B * cfg.top_k
        G = min(P, cfg.experts)
        self.front = e(B, cfg.front_width)
        # router_fork: the logits and the rest of the front in buffers of their own (a
        # column view of `front` would be strided at B > 1, and torch.mm would copy).
        r0, r1 = cfg.front_slices["router"]
        self.router_logits = e(B, r1 - r0)
        self.front_rest = e(B, cfg.front_width - (r1 - r0))
        self.shared_h = e(B, cfg.shared_inter)
        # Zero under shared_in_up, where the up GEMM's output holds the shared experts' too
        # (the last layer's add3 still reads it).
        self.shared_out = torch.zeros(B, H, device=device, dtype=BF16)
        self.up_in = e(B, cfg.latent + cfg.shared_inter)  # shared_in_up: [normed latent | shared h]
        # Routing per layer (cheap; lets a test check every layer's selection).
        self.topk_ids = e(cfg.num_layers + 1, B, K, dtype=I32)
        self.topk_w = e(cfg.num_layers + 1, B, K, dtype=F32)
        self.router_scratch = e(*router_scratch_shape(B, cfg.experts, K, cfg.router_group),
                                dtype=torch.int64)
        self.sorted_pairs = e(P, dtype=I32)
        self.seg_expert = e(G, dtype=I32)
        self.seg_start = e(G + 1, dtype=I32)
        self.num_segs = e(1, dtype=I32)
        self.expert_gu = e(P, 2 * cfg.expert_inter)
        self.expert_h = e(P, cfg.expert_inter)
        self.expert_y = e(P, cfg.latent)
        self.routed_lat = e(B, cfg.latent)
        self.routed_lat_n = e(B, cfg.latent)
        self.lat_sumsq = e(B, weighted_sum_chunks(cfg.latent), dtype=torch.float32)  # latent_norm_folded
        # moe_down_atomic: the down GEMM's atomic weighted sum; zero between uses (the norm clears it).
        self.routed_sum = torch.zeros(B, cfg.latent, device=device, dtype=torch.float32)
        self.routed_out = e(B, H)
        # Dense MLP
        self.dense_gu = e(B, 2 * cfg.dense_inter)
        self.dense_h = e(B, cfg.dense_inter)
        self.dense_out = e(B, H)


    def merge_mla_projections(self, cfg: K3Config) -> None:
        """mla_proj_merged: q_a, kv_a and g as column views of the one GEMM's output."""
        self.x_proj = torch.empty(cfg.batch, cfg.x_proj_width, device=self.x.device, dtype=self.x.dtype)
        self.q_a, self.kv_a, self.g = x_proj_parts(self.x_proj, cfg)


class K3Decode:
    """Weights, paged caches and one decode step of one TP8 rank of Kimi K3."""

    def __init__(self, cfg: K3Config, variant: Variant = BASELINE,
                 device: str | torch.device = "cuda") -> None:
        if variant.fmha_short_splits or variant.fmha_one_tile:
            # Twice the split-KV programs at B = 1 (129, not 65: the SMs covered once); the
            # wide combine reads the extra partials cheaply. fmha_one_tile: each split one tile.
            cfg = cfg.with_(fmha_split_tokens=max(1, cfg.fmha_split_tokens // 2))
        self.cfg, self.variant = cfg, variant
        self.device = torch.device(device)
        self.plan = P.build_plan(cfg, variant)
        if not variant.pdl and variant.kda_cute:  # the CuTe DSL step always launches PDL-style
            raise ValueError("no_pdl does not cover kda_cute's CuTe DSL launch; time one without the other")
        if variant.delay_kernel and not self.plan.delayed_launches():
            raise ValueError(f"delay names {variant.delay_kernel!r}, which no launch of the "
                             f"plan issues (kernel or launcher names: kernels/k3/plan.py)")
        # Variant side_priority: the side legs' blocks go to SMs before main's waiting ones.
        self.streams = Streams.create(str(self.device), side_priority=-1 if variant.side_priority else 0)
        self._gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._build_state()
        self.layers = {l: self._build_layer(l) for l in cfg.layers}
        self.s = Scratch(cfg, self.device)
        if P.mla_proj_merges(cfg, variant):
            self.s.merge_mla_projections(cfg)
        # linear_split_k / triton_mla_proj: partials and tickets per stream (the skinny GEMMs of
        # one stream run one after another; kv_a on S1 runs beside q_a on main).
        splits = variant.linear_split_k or variant.triton_mla_proj or variant.mla_q_skinny
        self._split_k = {label: alloc_split_k(max(cfg.hidden, cfg.front_width), self.device)
                         for label in (P.MAIN, P.AUX1, P.AUX2)} if splits else {}
        if P.router_in_front(cfg, variant):  # the front's own split-K buffers: main's
            self._split_k.setdefault(P.MAIN, alloc_split_k(max(cfg.hidden, cfg.front_width), self.device))
            self.front_router_done = alloc_front_router_done(self.device)
        if P.shared_front_leg(cfg, variant):  # SHARED_LEG may split the S1 GEMM
            self._split_k.setdefault(P.AUX1, alloc_split_k(max(cfg.hidden, cfg.front_width), self.device))
        # attn_res_wide: the pair's column chunk (0: attn_res's default)
        self.attn_res_block_h = WIDE_BLOCK_H if P.attn_res_wide(cfg, variant) else 0
        self.attn_res_scores = alloc_attn_res_scores(self.bank, self.attn_res_block_h)
        if P.score_in_o_proj(cfg, variant):  # one partial per o_proj column block
            bn = SKINNY_CONFIGS.get((cfg.kda_width, cfg.hidden), SKINNY_DEFAULT)[0]
            assert all(SKINNY_CONFIGS.get((k, cfg.hidden), SKINNY_DEFAULT)[0] == bn
                       for k in (cfg.kda_width, cfg.mla_out_width))
            self.gemm_scores = torch.empty(gemm_scores_shape(cfg.hidden, bn, cfg.bank_capacity),
                                           device=self.device, dtype=torch.float32)
        self.attn_res_counter = alloc_attn_res_counter(self.device)  # attn_res_fused's barrier
        if P.attn_res_one_pass(cfg, variant):  # the running partial's two copies, alternating
            self.partial_copies = alloc_partial_copies(self.bank)
            self._copy_of: tuple[int, int] | None = None  # (copy, bank row) the last aggregation wrote
        # Plan cursor (see _expect).
        self._seg_i = 0
        self._seg: P.Segment | None = None
        self._items = iter(())
        self._label = P.MAIN
        self._main = None
        #: Layer NVTX: k3trace's `layer.<i>.<family>` ("k3"), or vLLM's layerwise module tree
        #: ("vllm": `{'Module': 'top.model.layers.<i-1>.self_attn', ...}`, ENGINES.md).
        self.nvtx_style = "k3"
        self._module: str | None = None

    # ---- construction --------------------------------------------------------------------
    def _randn(self, *shape: int, std: float = 1.0, dtype=BF16, mean: float = 0.0) -> torch.Tensor:
        t = torch.randn(shape, generator=self._gen, device=self.device, dtype=dtype)
        if std != 1.0:
            t.mul_(std)
        if mean:
            t.add_(mean)
        return t

    def _w(self, fan_in: int, *shape: int) -> torch.Tensor:
        return self._randn(*shape, std=fan_in ** -0.5)

    def _norm_w(self, n: int) -> torch.Tensor:
        return self._randn(n, std=0.1, mean=1.0)

    def _build_state(self) -> None:
        cfg, B, H = self.cfg, self.cfg.batch, self.cfg.hidden
        # Attention-residual bank: completed blocks + the running partial.
        self.bank = torch.zeros(cfg.bank_capacity, B, H, device=self.device, dtype=BF16)
        self.embed = self._randn(B, H)
        # KDA slots and MLA pages are permuted so every kernel goes through the indirection.
        self.slot_idx = torch.randperm(B, generator=self._gen, device=self.device).to(I32)
        n_pages = B * cfg.pages_per_request
        pages = torch.randperm(n_pages, generator=self._gen, device=self.device).to(I32)
        self.block_table = pages.view(B, cfg.pages_per_request).contiguous()
        pos = cfg.context  # this step's token (see the module docstring)
        self.slot_mapping = (self.block_table[:, pos // cfg.page_size] * cfg.page_size
                             + pos % cfg.page_size).to(I32).contiguous()
        self.seq_lens = torch.full((B,), cfg.seq_len, device=self.device, dtype=I32)
        # Routed-expert banks, aliased round-robin across the MoE layers.
        E, I, L = cfg.experts, cfg.expert_inter, cfg.latent
        self.banks = {b: (self._w(L, E, 2 * I, L), self._w(I, E, L, I)) for b in cfg.banks_used}

    def _attn_res_weights(self) -> AttnResWeights:
        # query std 1/sqrt(H): logits against unit-RMS rows are O(1), so the softmax mixes.
        return AttnResWeights(self._randn(self.cfg.hidden, std=self.cfg.hidden ** -0.5),
                              self._norm_w(self.cfg.hidden))

    def _build_layer(self, l: int) -> Layer:
        cfg = self.cfg
        attn = self._build_kda() if cfg.attention_family(l) == KDA else self._build_mla()
        mlp = self._build_moe(l) if cfg.mlp_family(l) == MOE else self._build_dense()
        return Layer(l, self._attn_res_weights(), self._attn_res_weights(), attn, mlp)

    def _build_kda(self) -> KDALayer:
        c, H, B = self.cfg, self.cfg.hidden, self.cfg.batch
        NH, D = c.kda_heads, c.kda_head_dim
        return KDALayer(
            qkvg=self._w(H, H, c.qkvg_width), fab_t=self._w(H, H, c.fab_width).t().contiguous(),
            f_b=self._w(c.kda_f_rank, c.kda_f_rank, c.kda_width),
            conv_w=self._randn(c.conv_channels, c.conv_width, std=0.5),
            # alpha = exp(-5 sigmoid(exp(A_log) (f + dt_bias))): dt_bias ~ -2 keeps most
            # channels' decay in 0.4..0.9, so the state carries history.
            A_log=torch.log(torch.rand(NH, generator=self._gen, device=self.device) + 0.5),
            dt_bias=self._randn(c.kda_width, std=0.5, dtype=F32, mean=-2.0),
            norm_w=self._norm_w(D), o_proj=self._w(c.kda_width, c.kda_width, H),
            state=self._randn(B, NH, D, D, std=0.05, dtype=F32),
            conv_state=self._randn(B, c.conv_width - 1, c.conv_channels))

    def _build_mla(self) -> MLALayer:
        c, H = self.cfg, self.cfg.hidden
        NH = c.mla_heads
        # History rows ~ N(0, 1): the scale of the normalised latents the model writes.
        cache = self._randn(c.batch * c.pages_per_request, c.page_size, c.kv_a_width)
        w = MLALayer(
            q_a=self._w(H, H, c.q_lora), q_a_norm=self._norm_w(c.q_lora),
            q_b=self._w(c.q_lora, c.q_lora, c.q_b_width),
            w_uk=self._w(c.qk_nope, NH, c.qk_nope, c.kv_lora),
            kv_a=self._w(H, H, c.kv_a_width), kv_a_norm=self._norm_w(c.kv_lora),
            w_uv=self._w(c.kv_lora, NH, c.kv_lora, c.v_head),
            g_proj=self._w(H, H, c.mla_out_width),
            o_proj=self._w(c.mla_out_width, c.mla_out_width, H), cache=cache)
        if P.mla_proj_merges(c, self.variant):
            # The same weights (drawn as above), side by side; the three become views.
            w.x_proj = torch.cat([w.q_a, w.kv_a, w.g_proj], dim=1)
            w.q_a, w.kv_a, w.g_proj = x_proj_parts(w.x_proj, c)
        return w

    def _build_moe(self, l: int) -> MoELayer:
        c, H = self.cfg, self.cfg.hidden
        w13, w2 = self.banks[c.expert_bank(l)]
        layer = MoELayer(
            front=self._w(H, H, c.front_width),
            router_bias=self._randn(c.experts, std=0.05, dtype=F32),
            w13=w13, w2=w2, latent_norm=self._norm_w(c.latent), up=self._w(c.latent, c.latent, H),
            shared_down=self._w(c.shared_inter, c.shared_inter, H))
        if P.latent_norm_folds(c, self.variant):
            layer.up_g = (layer.latent_norm.float()[:, None] * layer.up.float()).to(layer.up.dtype)
        if P.shared_in_up(c, self.variant):  # the same weights, stacked along K
            layer.up_cat = torch.cat([layer.up, layer.shared_down], dim=0)
        if P.router_forks(c, self.variant) and not P.router_in_front(c, self.variant):  # the GEMV's
            layer.router_t = layer.front[:, slice(*c.front_slices["router"])].t().contiguous()
        return layer

    def _build_dense(self) -> DenseLayer:
        c, H = self.cfg, self.cfg.hidden
        return DenseLayer(gate_up=self._w(H, H, 2 * c.dense_inter),
                          down=self._w(c.dense_inter, c.dense_inter, H))

    # ---- plan-checked launching ----------------------------------------------------------
    def _expect(self, item_type: type, **fields) -> P.Item:
        item = next(self._items, None)
        if not isinstance(item, item_type) or any(getattr(item, k) != v for k, v in fields.items()):
            where = self._seg.range_name if self._seg else "step"
            raise PlanMismatch(f"{where}: plan has {item!r}, model issued {item_type.__name__}{fields}")
        return item

    @contextmanager
    def _segment(self, layer: int, family: str):
        if self._seg_i >= len(self.plan.segments):
            raise PlanMismatch(f"layer.{layer}.{family}: the plan has no more segments")
        seg = self.plan.segments[self._seg_i]
        if (seg.layer, seg.family) != (layer, family):
            raise PlanMismatch(f"plan has {seg.range_name}, model opened layer.{layer}.{family}")
        self._seg, self._items = seg, iter(seg.items)
        module = f"top.model.layers.{layer - 1}.{ENGINE_MODULE[family]}"
        with self._range(seg.range_name, module):
            prev, self._module = self._module, module
            try:
                yield
            finally:
                self._module = prev
        left = next(self._items, None)
        if left is not None:
            raise PlanMismatch(f"{seg.range_name}: model skipped {left!r}")
        self._seg_i += 1
        self._seg = None

    @contextmanager
    def _range(self, name: str, module: str | None):
        """`name` in k3trace's style; in the engine style the module's range, then its
        zero-length output range."""
        if self.nvtx_style == "k3" or module is None:
            if not name:  # the decoder layer has no range of its own in k3trace's style
                yield
                return
            with nvtx_range(name):
                yield
            return
        with nvtx_range(str({"Module": module, "TrainableParams": {}, "Inputs": [[self.cfg.batch, self.cfg.hidden]]})):
            yield
        with nvtx_range(str({"Module": module, "Outputs": [[self.cfg.batch, self.cfg.hidden]]})):
            pass

    def _subop(self, subop: str):
        return self._range(subop, f"{self._module}.{subop}" if self._module else None)

    def _stream(self, label: str):
        return {P.MAIN: self._main, P.AUX1: self.streams.aux1, P.AUX2: self.streams.aux2,
                P.AUX3: self.streams.aux3}[label]

    @contextmanager
    def _on(self, label: str):
        prev, self._label = self._label, label
        try:
            with on(self._stream(label)):
                yield
        finally:
            self._label = prev

    def _fork(self, side: str, enabled: bool = True) -> str:
        """Fork `side` off main here; returns the stream label the leg runs on."""
        if not enabled:
            return P.MAIN
        self._expect(P.Fork, side=side)
        fork(self._main, self._stream(side), enabled=True)
        return side

    def _join(self, side: str) -> None:
        if side == P.MAIN:
            return
        self._expect(P.Join, side=side)
        join(self._main, self._stream(side), enabled=True)

    def _all_reduce(self) -> None:
        item = self._expect(P.AllReduce)
        with nvtx_range(item.range_name):
            pass  # one GPU stands in for the TP group: the range marks where it would run

    def _triton(self, subop: str, fn, *args, **kwargs) -> None:
        item = self._expect(P.Launch, subop=subop, stream=self._label, kind=P.TRITON,
                            launcher=fn.__name__)
        delay = self.variant.delay_ns if item.matches_delay(self.variant) else 0
        with self._subop(subop):
            fn(*args, **kwargs, delay_ns=delay)

    def _cute(self, subop: str, fn, *args, **kwargs) -> None:
        item = self._expect(P.Launch, subop=subop, stream=self._label, kind=P.CUTE, launcher=fn.__name__)
        delay = self.variant.delay_ns if item.matches_delay(self.variant) else 0
        with self._subop(subop):
            fn(*args, **kwargs, delay_ns=delay)

    def _prefetch(self, weight: torch.Tensor) -> dict:
        """Variant prefetch:<MB>: the launch asks L2 for the first MB of `weight`, the next
        GEMM's, while the latency-bound kernels before that GEMM run (common.l2_prefetch)."""
        mb = self.variant.prefetch_mb
        return {"prefetch": weight, "prefetch_bytes": mb << 20} if mb else {}

    def _prefetch_leg(self, weight: torch.Tensor) -> None:
        """Variant prefetch_leg:<MB>: the first MB of `weight` (the next GEMM's) into L2, from
        a kernel on AUX3 that starts when main's work so far has completed (plan.prefetch_leg)."""
        if not self.variant.prefetch_leg_mb:
            return
        leg = self._fork(P.AUX3)
        with self._on(leg):
            self._triton(P.L2_PREFETCH, l2_prefetch_weight, weight, self.variant.prefetch_leg_mb << 20)

    def _end_prefetch_leg(self, l: int) -> None:
        if self.variant.prefetch_leg_mb and l == self.cfg.layers[-1]:
            self._join(P.AUX3)

    def _split_for(self, subop: str):
        """The split-K buffers of the current stream where this GEMM may split: every skinny
        GEMM under linear_split_k (SKINNY_SPLITS), the MLA's under triton_mla_proj and mla_q_skinny
        (MLA_SPLITS)."""
        v = self.variant
        if (v.linear_split_k or (v.triton_mla_proj and subop in P.MLA_SKINNY)
                or (v.mla_q_skinny and subop in P.MLA_Q_SKINNY)):
            return self._split_k[self._label]
        return None

    def _mm(self, subop: str, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
            gate: torch.Tensor | None = None, after: torch.Tensor | None = None,
            tuned_as: tuple[int, int] | None = None) -> None:
        """A dense GEMM; `after`: the weight of the GEMM that follows it on the path, past
        latency-bound kernels, which gemm_prefetch:<MB> asks L2 for as this one ends;
        `tuned_as`: the (K, N) of the GEMM whose columns these are (shared_front_leg: the
        front's rest), whose tuned skinny config they keep, so each column's sums are that
        GEMM's."""
        v = self.variant
        if P.linear_is_gluon(self.cfg, v, subop, self._seg.family):
            assert gate is None and tuned_as is None
            self._triton(subop, skinny_ws if v.linear_ws else skinny_gl, a, w, out)
            return
        if P.linear_is_triton(self.cfg, v, subop):
            tma = v.linear_tma and (not v.linear_tma_x or a.shape[1] == self.cfg.hidden)
            shape = tuned_as or tuple(w.shape)
            config = gemv_ops.TMA_CONFIGS.get(shape) if tma and v.linear_tma_tuned else None
            if config is None and tuned_as is not None:
                config = gemv_ops.SKINNY_CONFIGS.get(tuned_as)
            ahead = (dict(next_weight=after, next_bytes=v.gemm_prefetch_mb << 20)
                     if v.gemm_prefetch_mb and after is not None else {})
            with prefetch_lines(bool(ahead) or v.prefetch_lines):  # gemm_prefetch is the line form
                self._triton(subop, skinny_mm, a, w, out, early_weights=v.linear_early_weights,
                             split_k=self._split_for(subop), tma=tma, config=config,
                             prefetch_bytes=v.linear_prefetch_mb << 20, **ahead,
                             **({"gate": gate} if gate is not None else {}))
            return
        assert gate is None
        self._expect(P.Launch, subop=subop, stream=self._label, kind=P.CUBLAS, launcher="mm")
        with self._subop(subop):
            torch.mm(a, w, out=out)

    def _head_bmm(self, subop: str, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                  gate: torch.Tensor | None = None, rope: tuple | None = None) -> None:
        """The MLA's per-head products: head_bmm_kernel under mla_head_bmm (with the output
        gate under mla_gate_in_v, the rope copy under mla_absorb_concat), else cuBLAS's BMM."""
        if P.head_bmms(self.cfg, self.variant):
            extra = {**({"gate": gate} if gate is not None else {}), **({"rope": rope} if rope is not None else {})}
            self._triton(subop, head_bmm, a, w, out, **extra)
            return
        assert gate is None and rope is None
        self._bmm(subop, a, w, out)

    def _bmm(self, subop: str, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        # a, out may be strided views; cuBLAS takes them as they are (no copy kernels:
        # the graph-node test would count them).
        self._expect(P.Launch, subop=subop, stream=self._label, kind=P.CUBLAS, launcher="bmm")
        with self._subop(subop):
            torch.bmm(a, w, out=out)

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> None:
        """One decode step (all layers). The caller opens the `decode_step` range."""
        cfg = self.cfg
        self._main = self.streams.main  # the capture stream under torch.cuda.graph
        self._seg_i, self._label = 0, P.MAIN
        self._mlp_out: tuple = ()  # mlp_residual_folded: the MLP output the next score adds
        self.bank[0].copy_(self.embed)  # the step's input opens block 0's partial
        with pdl_off(not self.variant.pdl), early_trigger(self.variant.pdl_early_trigger), \
                prefetch_lines(self.variant.prefetch_lines):
            for l in cfg.layers:
                with self._range("", f"top.model.layers.{l - 1}"):
                    self._layer(l)
        if self._seg_i != len(self.plan.segments):
            raise PlanMismatch(f"step ended after {self._seg_i} of {len(self.plan.segments)} segments")

    def _layer(self, l: int) -> None:
        L = self.layers[l]
        self._attn_res(l, "attn", L.pre_attn)
        if isinstance(L.attn, KDALayer):
            self._kda(l, L.attn)
        else:
            self._mla(l, L.attn)
        self._attn_res(l, "mlp", L.pre_mlp)
        if isinstance(L.mlp, MoELayer):
            self._moe(l, L.mlp)
        else:
            self._dense(l, L.mlp)

    def _partial(self, l: int) -> torch.Tensor:
        return self.bank[self.cfg.partial_row(l)]

    def _attn_out(self, l: int) -> torch.Tensor:
        # A layer that opens a block writes its attention output straight into the new
        # partial row; any other layer's output is added in the pre-MLP segment.
        return self._partial(l) if self.cfg.opens_block(l) else self.s.attn_out

    def _o_proj(self, l: int, a: torch.Tensor, w: torch.Tensor, gate: torch.Tensor | None = None) -> None:
        """The attention's output projection; under attn_res_in_o_proj its epilogue also does
        the pre-MLP score's work (plan.score_in_o_proj); with `gate` (mla_gate_in_o_proj) its
        operand is a * sigmoid(gate)."""
        out = self._attn_out(l)
        if not P.score_in_o_proj(self.cfg, self.variant):
            mlp = self.layers[l].mlp
            self._mm(P.O_PROJ, a, w, out, gate=gate, after=mlp.front if isinstance(mlp, MoELayer) else mlp.gate_up)
            return
        n = self.cfg.bank_rows(l, "mlp")
        gram = (self.bank, n, self.layers[l].pre_mlp.query, self.gemm_scores, not self.cfg.opens_block(l))
        self._triton(P.O_PROJ, skinny_mm, a, w, out, gram=gram, **({"gate": gate} if gate is not None else {}))

    def _first_attn_weight(self, l: int) -> torch.Tensor | None:
        """The weight of layer l's first attention GEMM (None past the last layer)."""
        if l not in self.layers:
            return None
        attn = self.layers[l].attn
        if isinstance(attn, KDALayer):
            return attn.qkvg
        return attn.x_proj if attn.x_proj is not None else attn.q_a

    def _attn_res(self, l: int, site: str, w: AttnResWeights) -> None:
        cfg, s = self.cfg, self.s
        n = cfg.bank_rows(l, site)
        pending = site == "mlp" and not cfg.opens_block(l)  # attention output to add
        with self._segment(l, ATTN_RES):
            L = self.layers[l]
            nxt = self._first_attn_weight(l)
            if site == "mlp":
                nxt = L.mlp.front if isinstance(L.mlp, MoELayer) else L.mlp.gate_up
            self._prefetch_leg(nxt)
            addend = addend2 = None
            if pending and self.variant.residual_folded:
                addend = s.attn_out
            elif pending:
                self._triton(P.RESIDUAL_ADD, residual_add, self._partial(l), s.attn_out)
            if site == "attn" and self._mlp_out:
                # mlp_residual_folded: the previous layer's MLP output joins its partial,
                # which is this aggregation's last row (a completed block's, at a boundary).
                assert self._partial(l - 1).data_ptr() == self.bank[n - 1].data_ptr()
                addend, addend2 = self._mlp_out
                self._mlp_out = ()
            if P.attn_res_fuses(cfg, self.variant):
                self._triton(P.SCORE_COMBINE, attn_res_fused, self.bank, n, w.query,
                             self.attn_res_scores, w.gamma, s.x, addend=addend, eps=cfg.norm_eps,
                             counter=self.attn_res_counter, sm_count=cfg.sm_count)
                return
            v = self.variant
            if P.attn_res_one_pass(cfg, v):
                # Aggregation j = 2l (+1 before the MLP) reads copy j % 2 and writes the other:
                # the one before it wrote this one's, in this step (layer 0's first folds nothing).
                j = 2 * l + (site == "mlp")
                row = self.bank[n - 1].data_ptr()
                assert addend is None or self._copy_of == (j % 2, row), "the copy read is not this partial's"
                self._copy_of = ((j + 1) % 2, row)
                self._triton(P.SCORE_COMBINE, attn_res_one_pass, self.bank, n, w.query, w.gamma, s.x,
                             self.partial_copies[j % 2], self.partial_copies[(j + 1) % 2],
                             addend=addend, addend2=addend2, eps=cfg.norm_eps)
                return
            if site == "mlp" and P.score_in_o_proj(cfg, v):  # the o_proj scored and added (its epilogue)
                self._triton(P.COMBINE, attn_res_combine, self.bank, n, self.gemm_scores, w.gamma, s.x,
                             eps=cfg.norm_eps, one_shot=True)
                return
            # pdl_trigger_first: the GEMM after the pair launches while the score runs.
            with trigger_first(v.pdl_trigger_first):
                self._triton(P.SCORE, attn_res_score, self.bank, n, w.query, self.attn_res_scores,
                             addend=addend, addend2=addend2, gram_dot=v.attn_res_dot,
                             early_rows=v.attn_res_early_rows, block_h=self.attn_res_block_h, **self._prefetch(nxt))
                self._triton(P.COMBINE, attn_res_combine, self.bank, n, self.attn_res_scores,
                             w.gamma, s.x, eps=cfg.norm_eps, one_shot=v.attn_res_dot,
                             early_rows=v.attn_res_early_rows, block_h=self.attn_res_block_h)

    def _kda(self, l: int, w: KDALayer) -> None:
        cfg, s, v = self.cfg, self.s, self.variant
        gate_in = s.qkvg[:, cfg.conv_channels:]  # g: the output gate, not convolved
        with self._segment(l, KDA):
            side = self._fork(P.AUX2, v.attn_forks)
            self._mm(P.QKVG, s.x, w.qkvg, s.qkvg, after=w.o_proj)  # kda_step between them
            with self._on(side):  # gate/beta GEMVs: read only x
                self._triton(P.FAB, gemv, s.x, w.fab_t, s.fab)
                self._mm(P.F_B, s.fab[:, :cfg.kda_f_rank], w.f_b, s.fb)
            conv_fused = P.kda_conv_fuses(cfg, v)
            if not conv_fused:
                self._triton(P.CONV, kda_conv_silu, s.qkvg, w.conv_state, w.conv_w, self.slot_idx,
                             s.conv_out, **self._prefetch(w.o_proj))
            self._join(side)
            self._prefetch_leg(w.o_proj)  # during the step kernel
            fused = v.kda_norm_fused
            if v.kda_cute:
                # Imported only for this variant: it needs cutlass and cuda.bindings.
                from kernels.k3.ops.kda_cute import kda_step_cute

                self._cute(P.KDA_STEP, kda_step_cute, s.conv_out, s.fab, s.fb, w.A_log, w.dt_bias,
                           gate_in, w.state, self.slot_idx, w.norm_w, s.kda_out, eps=cfg.norm_eps)
                self._o_proj(l, s.kda_out, w.o_proj)
                self._all_reduce()
                return
            self._triton(P.KDA_STEP, kda_step, s.qkvg if conv_fused else s.conv_out, s.fab, s.fb,
                         w.A_log, w.dt_bias, gate_in, w.state, self.slot_idx, w.norm_w, s.kda_out,
                         fuse_norm=fused, o_scratch=None if fused else s.kda_o, eps=cfg.norm_eps,
                         conv=(w.conv_state, w.conv_w) if conv_fused else None,
                         split=s.kda_split if P.kda_splits_v(cfg, v) else None)
            if not fused:
                self._triton(P.KDA_NORM, kda_gated_rmsnorm, s.kda_o, gate_in, w.norm_w,
                             s.kda_out, eps=cfg.norm_eps)
            self._o_proj(l, s.kda_out, w.o_proj)
            self._all_reduce()

    def _mla(self, l: int, w: MLALayer) -> None:
        cfg, s, v = self.cfg, self.s, self.variant
        B, NH = cfg.batch, cfg.mla_heads
        q_b = s.q_b.view(B, NH, cfg.qk_head)
        q_nope, q_rope = q_b[:, :, :cfg.qk_nope], q_b[:, :, cfg.qk_nope:]
        kv_lat_in, k_rope = s.kv_a[:, :cfg.kv_lora], s.kv_a[:, cfg.kv_lora:]
        cache_args = {"cache": w.cache, "kv_latent": s.kv_lat, "k_rope": k_rope,
                      "slot_mapping": self.slot_mapping}
        merged = P.mla_proj_merges(cfg, v)
        with self._segment(l, MLA):
            if merged:  # before the fork: the KV leg reads this GEMM's output
                self._triton(P.X_PROJ, skinny_mm, s.x, w.x_proj, s.x_proj, split_k=self._split_for(P.X_PROJ))
            kv = self._fork(P.AUX1, v.attn_forks)  # Q chain || KV chain (both read only x)
            early_gate = P.g_proj_early(cfg, v)
            if early_gate:  # g_proj_early: the gate leg beside both chains, from the start
                gate = self._fork(P.AUX2)
                with self._on(gate):
                    self._mm(P.G_PROJ, s.x, w.g_proj, s.g)
            if not merged:
                self._mm(P.Q_A, s.x, w.q_a, s.q_a)
            self._triton(P.Q_A_NORM, rmsnorm, s.q_a, w.q_a_norm, s.q_a_n, cfg.norm_eps)
            self._mm(P.Q_B, s.q_a_n, w.q_b, s.q_b)
            if P.absorb_concats(cfg, v):  # mla_absorb_concat: straight into the FMHA's query rows
                self._head_bmm(P.ABSORB, q_nope.transpose(0, 1), w.w_uk, s.q_full[:, :, :cfg.kv_lora].transpose(0, 1),
                               rope=(q_rope.transpose(0, 1), s.q_full[:, :, cfg.kv_lora:].transpose(0, 1)))
            else:
                self._head_bmm(P.ABSORB, q_nope.transpose(0, 1), w.w_uk, s.q_abs)
            with self._on(kv):
                if not merged:
                    self._mm(P.KV_A, s.x, w.kv_a, s.kv_a)
                if P.kv_norm_inserts(cfg, v):  # the norm writes the cache row itself
                    self._triton(P.KV_A_NORM, mla_kv_norm_insert, kv_lat_in, w.kv_a_norm, k_rope, w.cache,
                                 self.slot_mapping, cfg.norm_eps)
                else:
                    self._triton(P.KV_A_NORM, rmsnorm, kv_lat_in, w.kv_a_norm, s.kv_lat, cfg.norm_eps)
                    if v.attn_forks:  # forked: the KV leg writes its own cache row
                        self._triton(P.CACHE_INSERT, mla_cache_insert, s.kv_lat, k_rope, w.cache,
                                     self.slot_mapping)
            self._join(kv)
            if not P.absorb_concats(cfg, v):
                self._triton(P.Q_CONCAT, mla_q_concat, s.q_abs.transpose(0, 1), q_rope, s.q_full,
                             split_rows=v.mla_epilogue_split,
                             # Forks off: the KV norm ran just before on this stream, so the
                             # split variant's cache programs must wait for it too.
                             **({} if v.attn_forks else {**cache_args, "cache_wait": True}))
            if not early_gate:
                gate = self._fork(P.AUX2, v.attn_forks and not merged)
                if not merged:
                    with self._on(gate):  # overlaps the FMHA
                        self._mm(P.G_PROJ, s.x, w.g_proj, s.g)
            # fmha_one_tile: each split one tile of cfg.fmha_split_tokens (halved above).
            tile = cfg.fmha_split_tokens if v.fmha_one_tile else FMHA_BLOCK_N
            self._triton(P.FMHA, mla_decode_fmha, s.q_full, w.cache, self.block_table,
                         self.seq_lens, s.fmha_partial, s.fmha_lse, cfg.sm_scale,
                         num_splits=cfg.fmha_splits, page_size=cfg.page_size, block_n=tile,
                         first_early=v.fmha_one_tile, early_kv=P.fmha_early_kv(cfg, v))
            self._triton(P.FMHA_COMBINE, mla_decode_combine, s.fmha_partial, s.fmha_lse,
                         self.seq_lens, s.attn_lat.transpose(0, 1), wide=v.mla_combine_wide, block_n=tile)
            gated = P.gate_in_v(cfg, v)
            if not merged and gated:
                self._join(gate)
            # mla_gate_in_v: V-up writes o * sigmoid(g) straight into the o_proj's input.
            v_out = s.mla_gated.view(B, NH, -1) if gated else s.mla_o
            # mla_o_proj_ahead: V-up and gate_mul trigger first, so the o_proj launches (and copies
            # its first weight slots, as the Gluon GEMM) while the FMHA's combine still runs.
            with trigger_first(P.mla_o_proj_ahead(cfg, v)):
                self._head_bmm(P.V_UP, s.attn_lat, w.w_uv, v_out.transpose(0, 1), gate=s.g if gated else None)
            if not merged and not gated:
                self._join(gate)
            if P.gate_in_o_proj(cfg, v):  # the o_proj gates its own operand
                self._o_proj(l, s.mla_o.view(B, cfg.mla_out_width), w.o_proj, gate=s.g)
            else:
                if not gated:
                    with trigger_first(P.mla_o_proj_ahead(cfg, v)):
                        self._triton(P.GATE_MUL, gate_mul, s.mla_o.view(B, cfg.mla_out_width), s.g,
                                     s.mla_gated)
                self._o_proj(l, s.mla_gated, w.o_proj)
            self._all_reduce()

    def _moe(self, l: int, w: MoELayer) -> None:
        cfg, s, v = self.cfg, self.s, self.variant
        sl = cfg.front_slices
        weights = s.topk_w[l]
        seg = (s.sorted_pairs, s.seg_expert, s.seg_start, s.num_segs)
        with self._segment(l, MOE):
            in_front = P.router_in_front(cfg, v)
            leg = P.shared_front_leg(cfg, v)
            rest_shape = (cfg.hidden, cfg.front_width - sl["router"][1])  # the front's rest (router_fork)
            if P.router_forks(cfg, v):
                # The router and the rest of the front are separate reads of the same
                # weights; the rest starts right after the router columns.
                r1 = sl["router"][1]
                latent = s.front_rest[:, sl["latent"][0] - r1:sl["latent"][1] - r1]
                shared_gu = s.front_rest[:, sl["shared"][0] - r1:sl["shared"][1] - r1]
            if in_front:
                self._triton(P.FRONT, moe_front_router, s.x, w.front, s.front_rest, s.router_logits,
                             w.router_bias, s.topk_ids[l], s.topk_w[l], seg, self._split_k[P.MAIN],
                             self.front_router_done, scale=cfg.routed_scale)
            elif P.router_forks(cfg, v):
                router = self._fork(P.AUX2)
                with self._on(router):
                    self._triton(P.ROUTER_GEMV, gemv, s.x, w.router_t, s.router_logits)
                    self._route(l, w, s.router_logits)
                if leg:  # the latent columns only; S1 takes the shared ones
                    self._mm(P.FRONT, s.x, w.front[:, slice(*sl["latent"])], latent, tuned_as=rest_shape)
                else:
                    self._mm(P.FRONT, s.x, w.front[:, r1:], s.front_rest)
            else:
                latent = s.front[:, slice(*sl["latent"])]
                shared_gu = s.front[:, slice(*sl["shared"])]
                self._mm(P.FRONT, s.x, w.front, s.front)
            shares = P.shared_in_up(cfg, v)  # then the up GEMM takes the shared experts' down GEMM
            lat_n = s.up_in[:, :cfg.latent] if shares else s.routed_lat_n
            shared = self._fork(P.AUX1)  # shared experts on S1 in every variant
            with self._on(shared):
                if leg:  # shared_front_leg: their gate|up columns of the front, here
                    self._shared_gate_up(w.front[:, slice(*sl["shared"])], shared_gu, rest_shape)
                self._triton(P.SHARED_ACT, situ_mul, shared_gu, s.up_in[:, cfg.latent:] if shares else s.shared_h)
                if not shares:
                    self._mm(P.SHARED_DOWN, s.shared_h, w.shared_down, s.shared_out)
            if not P.router_forks(cfg, v):
                self._route(l, w, s.front[:, slice(*sl["router"])])
            elif not in_front:  # in front: routed inside the front's own launch
                self._join(router)
            acts = P.gate_up_acts(cfg, v)  # then the GEMM stores h = SiTU(gate, up) itself
            # moe_grouped_tuned: both grouped GEMMs at moe.GROUPED_CONFIGS' blocks
            tuned, ahead = P.grouped_tuned(cfg, v), P.weights_ahead(cfg, v)
            gu_blocks, down_blocks = (grouped_config(w.w13, ahead), grouped_config(w.w2, ahead)) if tuned or ahead \
                else ({}, {})
            if v.moe_grouped_tma:  # the weight tiles by TMA where the blocks allow (moe_grouped_gemm says)
                gu_blocks, down_blocks = {**gu_blocks, "tma": True}, {**down_blocks, "tma": True}
            self._triton(P.EXPERT_GATE_UP, moe_grouped_gemm, latent, w.w13, *seg,
                         s.expert_h if acts else s.expert_gu, top_k=cfg.top_k, x_is_per_token=True, act_out=acts,
                         **gu_blocks)
            mixed = P.down_mixes(cfg, v)
            if mixed:  # the down GEMM forms the weighted sum (with situ_fused, from gate|up)
                if not v.situ_fused and not acts:
                    self._triton(P.EXPERT_ACT, situ_mul, s.expert_gu, s.expert_h)
                self._triton(P.EXPERT_DOWN, moe_down_mix, s.expert_gu if v.situ_fused else s.expert_h,
                             w.w2, s.topk_ids[l], weights, s.routed_lat, act_in=v.situ_fused)
            elif v.situ_fused:  # the down GEMM applies SiTU as it loads gate|up
                self._triton(P.EXPERT_DOWN, moe_grouped_gemm, s.expert_gu, w.w2, *seg, s.expert_y,
                             top_k=cfg.top_k, x_is_per_token=False, act_in=True, **down_blocks)
            elif P.down_sums(cfg, v):  # the down GEMM adds the weighted sum into routed_sum
                if not acts:
                    with trigger_first(ahead):  # moe_weights_ahead: the down GEMM loads its weights meanwhile
                        self._triton(P.EXPERT_ACT, situ_mul, s.expert_gu, s.expert_h)
                self._triton(P.EXPERT_DOWN, moe_grouped_gemm, s.expert_h, w.w2, *seg, s.routed_sum,
                             top_k=cfg.top_k, x_is_per_token=False, sum_weights=weights, **down_blocks)
            else:
                if not acts:
                    self._triton(P.EXPERT_ACT, situ_mul, s.expert_gu, s.expert_h)
                self._triton(P.EXPERT_DOWN, moe_grouped_gemm, s.expert_h, w.w2, *seg, s.expert_y,
                             top_k=cfg.top_k, x_is_per_token=False, **down_blocks)
            self._prefetch_leg(w.up_g if P.latent_norm_folds(cfg, v) else w.up)  # during the sum and norm
            if P.moe_tail_fuses(cfg, v):
                self._triton(P.UP, skinny_mm_mixnorm, s.expert_y, weights, w.latent_norm, w.up,
                             s.routed_out, cfg.norm_eps, mma=gemv_ops.TAIL_MMA if v.moe_tail_mma else 0)
            elif P.sum_norm_fuses(cfg, v):
                self._triton(P.WEIGHTED_SUM, moe_weighted_sum_norm, s.expert_y, weights, w.latent_norm,
                             s.routed_lat_n, cfg.norm_eps)
                self._mm(P.UP, s.routed_lat_n, w.up, s.routed_out)
            elif mixed:
                self._triton(P.LATENT_NORM, rmsnorm, s.routed_lat, w.latent_norm, s.routed_lat_n,
                             cfg.norm_eps)
                self._mm(P.UP, s.routed_lat_n, w.up, s.routed_out)
            elif P.down_sums(cfg, v):
                with trigger_first(ahead):  # moe_weights_ahead: the up GEMM launches (early copies) meanwhile
                    self._triton(P.LATENT_NORM, rmsnorm, s.routed_sum, w.latent_norm, lat_n,
                                 cfg.norm_eps, clear_input=True)
                self._up(l, w, s, lat_n, shared, shares)
            elif P.latent_norm_folds(cfg, v):
                self._triton(P.WEIGHTED_SUM, moe_weighted_sum, s.expert_y, weights, s.routed_lat,
                             sumsq=s.lat_sumsq, **self._prefetch(w.up))
                self._triton(P.UP, skinny_mm, s.routed_lat, w.up_g, s.routed_out,
                             rms_of=(s.lat_sumsq, cfg.norm_eps))
            else:
                with trigger_first(v.pdl_trigger_first):  # the up GEMM launches during the sum
                    self._triton(P.WEIGHTED_SUM, moe_weighted_sum, s.expert_y, weights, s.routed_lat,
                                 **self._prefetch(w.up))
                    self._triton(P.LATENT_NORM, rmsnorm, s.routed_lat, w.latent_norm, lat_n,
                                 cfg.norm_eps)
                self._up(l, w, s, lat_n, shared, shares)
            if not shares:
                self._join(shared)
            if P.mlp_output_folded(cfg, v, l):
                self._mlp_out = (s.routed_out, None if shares else s.shared_out)
            else:
                self._triton(P.ADD3, add3, self._partial(l), s.routed_out, s.shared_out)
            self._all_reduce()
            self._end_prefetch_leg(l)

    def _shared_gate_up(self, w: torch.Tensor, out: torch.Tensor, rest_shape: tuple[int, int]) -> None:
        """shared_front_leg's GEMM on S1: at the front's config (gemv.SHARED_LEG None), or as the
        skinny GEMM at SHARED_LEG's config split over K, small enough to sit beside main's
        grouped GEMM programs."""
        leg = gemv_ops.SHARED_LEG
        if leg is None or not P.linear_is_triton(self.cfg, self.variant, P.SHARED_GATE_UP):
            self._mm(P.SHARED_GATE_UP, self.s.x, w, out, tuned_as=rest_shape)
            return
        config, splits = leg
        tma = self.variant.linear_tma and config[0] * w.element_size() >= 128
        self._triton(P.SHARED_GATE_UP, skinny_mm, self.s.x, w, out, config=config, tma=tma,
                     split_k=self._split_k[P.AUX1] if splits > 1 else None, splits=splits)

    def _up(self, l: int, w: MoELayer, s, lat_n: torch.Tensor, shared, shares: bool) -> None:
        """The MoE up GEMM; under shared_in_up it reads [normed latent | shared h] (S1's output
        too, so S1 joins first) against [up ; shared down]. The next layer's first attention
        GEMM follows it past the pre-attention aggregation."""
        after = self._first_attn_weight(l + 1)
        if shares:
            self._join(shared)
            self._mm(P.UP, s.up_in, w.up_cat, s.routed_out, after=after)
        else:
            self._mm(P.UP, lat_n, w.up, s.routed_out, after=after)

    def _route(self, l: int, w: MoELayer, logits: torch.Tensor) -> None:
        """Top-k of the router logits, then the pairs grouped by expert."""
        cfg, s = self.cfg, self.s
        seg = (s.sorted_pairs, s.seg_expert, s.seg_start, s.num_segs)
        fused = P.router_aligns(cfg, self.variant)
        self._triton(P.ROUTER, moe_router, logits, w.router_bias, s.topk_ids[l], s.topk_w[l],
                     scale=cfg.routed_scale, multipass=self.variant.router_multipass,
                     scratch=s.router_scratch, group_size=cfg.router_group,
                     align=seg if fused else None, by4=self.variant.router_top4,
                     sort=self.variant.router_bitonic)
        if not fused:
            self._triton(P.ALIGN, moe_align, s.topk_ids[l], cfg.experts, *seg)

    def _dense(self, l: int, w: DenseLayer) -> None:
        s = self.s
        with self._segment(l, DENSE):
            self._mm(P.GATE_UP, s.x, w.gate_up, s.dense_gu)
            self._triton(P.ACT, situ_mul, s.dense_gu, s.dense_h)
            self._mm(P.DOWN, s.dense_h, w.down, s.dense_out)
            self._all_reduce()
            if P.mlp_output_folded(self.cfg, self.variant, l):
                self._mlp_out = (s.dense_out, None)
            else:
                self._triton(P.RESIDUAL_ADD, residual_add, self._partial(l), s.dense_out)
            self._end_prefetch_leg(l)

    # ---- results ------------------------------------------------------------------------
    def hidden(self) -> torch.Tensor:
        """The bank rows the step filled: [rows, B, H] (completed blocks + the partial)."""
        return self.bank[:self.cfg.bank_rows_max]

    def routing(self, layer: int) -> torch.Tensor:
        """topk ids [B, top_k] the last step chose at `layer` (a MoE layer)."""
        return self.s.topk_ids[layer]

    def mutable_state(self) -> dict[str, torch.Tensor]:
        """Everything step() updates in place besides activations (for cloning/restoring)."""
        out: dict[str, torch.Tensor] = {"bank": self.bank}
        for l, L in self.layers.items():
            if isinstance(L.attn, KDALayer):
                out[f"{l}.state"], out[f"{l}.conv_state"] = L.attn.state, L.attn.conv_state
            else:
                out[f"{l}.cache"] = L.attn.cache
        return out

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {k: t.clone() for k, t in self.mutable_state().items()}

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        for k, t in self.mutable_state().items():
            t.copy_(snap[k])

