"""Shapes and the layer schedule of one TP8 rank of Kimi K3 decode (kernels/README.md).

Pure Python (no torch): the launch plan, the structure tests and the analyser side can
all read it without a GPU stack.

Layers are numbered 1..93 as in the model card and in NVTX (`layer.<i>.<family>`). A
reduced-depth build (`num_layers` < 93) runs layers 1..num_layers of the same schedule, so
layer i is the same kind of layer whatever the depth.

Attention-residual bookkeeping (block size 12): the bank holds one row per completed
block plus the running partial sum of the current block. The token embedding opens the
partial of block 0, so the bank never has more than 8 rows for 93 layers (7 completed
blocks + 1 partial at layers 85..93). Block k >= 1 opens at layer 12k+1: before that
layer's attention the new partial is still empty, so the pre-attention aggregation reads
only the k completed rows and the attention output becomes the partial (written there
directly by the o_proj GEMM: no residual add). Every other sub-layer output is added to
the partial: attention outputs in the pre-MLP attn_res segment (folded into
attn_res_score, or a separate residual_add), MLP outputs by add3 / residual_add.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import k3names

#: Depth of the full model.
FULL_DEPTH = 93


def _family(name: str) -> str:
    # Family names are shared with the analyser: fail at import if k3names drops one.
    if name not in k3names.FAMILIES:
        raise ImportError(f"k3names.FAMILIES has no {name!r}")
    return name


KDA, MLA, MOE, DENSE, ATTN_RES = map(_family, ("kda", "mla", "moe", "dense", "attn_res"))


@dataclass(frozen=True)
class K3Config:
    # Run shape.
    batch: int = 1
    context: int = 8192          # tokens of history per request in the MLA cache
    num_layers: int = FULL_DEPTH  # reduced-depth recordings run layers 1..num_layers
    n_expert_banks: int = 4      # routed-expert banks; layer l uses bank l % n
    page_size: int = 64          # MLA cache page (tokens)
    seed: int = 0

    # Model (per TP8 rank).
    hidden: int = 7168
    depth: int = FULL_DEPTH      # the schedule's depth: MLA on every 4th layer and the last
    mla_every: int = 4
    dense_layers: int = 1        # first_k_dense_replace
    norm_eps: float = 1e-6

    # Attention residuals.
    block_size: int = 12
    bank_capacity: int = 8       # rows allocated (= max rows used at full depth)

    # KDA.
    kda_heads: int = 12
    kda_head_dim: int = 128
    conv_width: int = 4
    kda_f_rank: int = 128        # f_a 7168->128, f_b 128->1536

    # MLA.
    mla_heads: int = 12
    q_lora: int = 1536
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128

    # MoE.
    experts: int = 896
    top_k: int = 16
    expert_inter: int = 384      # per-rank routed expert width (gate|up = 2x)
    latent: int = 3584
    shared_inter: int = 768      # per-rank shared expert width (gate|up = 2x)
    routed_scale: float = 1.0
    router_group: int = 128      # router_multipass: experts per pass-1 program (7 groups)

    # Dense MLP (layer 1).
    dense_inter: int = 2304

    # Launch shapes.
    sm_count: int = 132          # H200
    fmha_split_tokens: int = 128  # fewest cache tokens per split-KV program

    def __post_init__(self) -> None:
        if not 1 <= self.num_layers <= self.depth:
            raise ValueError(f"num_layers must be in 1..{self.depth}, got {self.num_layers}")
        if self.batch < 1 or self.context < 1:
            raise ValueError("batch and context must be positive")
        if self.bank_rows_max > self.bank_capacity:
            raise ValueError(f"{self.bank_rows_max} bank rows needed > capacity {self.bank_capacity}")

    # ---- derived shapes -------------------------------------------------------------
    @property
    def layers(self) -> range:
        return range(1, self.num_layers + 1)

    @property
    def kda_width(self) -> int:          # one of q, k, v, g: 12 x 128 = 1536
        return self.kda_heads * self.kda_head_dim

    @property
    def qkvg_width(self) -> int:         # 6144
        return 4 * self.kda_width

    @property
    def conv_channels(self) -> int:      # q, k, v go through the short conv: 4608
        return 3 * self.kda_width

    @property
    def fab_width(self) -> int:          # [f_a | b] = 128 + 12 = 140
        return self.kda_f_rank + self.kda_heads

    @property
    def qk_head(self) -> int:            # 192
        return self.qk_nope + self.qk_rope

    @property
    def q_b_width(self) -> int:          # 12 x 192 = 2304
        return self.mla_heads * self.qk_head

    @property
    def kv_a_width(self) -> int:         # 512 latent + 64 rope = 576
        return self.kv_lora + self.qk_rope

    @property
    def mla_out_width(self) -> int:      # 12 x 128 = 1536 (g_proj, o_proj input)
        return self.mla_heads * self.v_head

    @property
    def x_proj_width(self) -> int:       # q_a 1536 + kv_a 576 + g_proj 1536 = 3648 (mla_proj_merged)
        return self.q_lora + self.kv_a_width + self.mla_out_width

    @property
    def front_width(self) -> int:        # router 896 + latent 3584 + shared gate/up 1536 = 6016
        return self.experts + self.latent + 2 * self.shared_inter

    @property
    def front_slices(self) -> dict[str, tuple[int, int]]:
        """Column ranges of the MoE front GEMM output: router logits, latent, shared gate|up."""
        r, lat = self.experts, self.latent
        return {"router": (0, r), "latent": (r, r + lat), "shared": (r + lat, self.front_width)}

    @property
    def pages_per_request(self) -> int:  # history + the token each step appends
        return -(-self.seq_len // self.page_size)

    @property
    def seq_len(self) -> int:            # tokens each step attends over: history + itself
        return self.context + 1

    @property
    def fmha_splits(self) -> int:
        """Split-KV programs per token: enough (B x splits) to cover the SMs once, but no
        split shorter than `fmha_split_tokens` (the combine re-reads every split)."""
        want = -(-self.sm_count // self.batch)
        return max(1, min(want, -(-self.seq_len // self.fmha_split_tokens)))

    @property
    def sm_scale(self) -> float:         # softmax scale of the un-absorbed 192-wide head
        return self.qk_head ** -0.5

    # ---- layer schedule -------------------------------------------------------------
    def _check(self, layer: int) -> None:
        if not 1 <= layer <= self.depth:
            raise ValueError(f"layer {layer} outside 1..{self.depth}")

    def attention_family(self, layer: int) -> str:
        """'mla' on 4, 8, ..., 92 and the last layer; 'kda' elsewhere."""
        self._check(layer)
        return MLA if layer % self.mla_every == 0 or layer == self.depth else KDA

    def mlp_family(self, layer: int) -> str:
        self._check(layer)
        return DENSE if layer <= self.dense_layers else MOE

    def expert_bank(self, layer: int) -> int:
        return layer % self.n_expert_banks

    @property
    def banks_used(self) -> tuple[int, ...]:
        """Expert banks the run's MoE layers touch (only those are allocated)."""
        return tuple(sorted({self.expert_bank(l) for l in self.layers if self.mlp_family(l) == MOE}))

    # ---- attention-residual bank ------------------------------------------------------
    def block_of(self, layer: int) -> int:
        self._check(layer)
        return (layer - 1) // self.block_size

    def opens_block(self, layer: int) -> bool:
        """The first layer of block k >= 1: its attention output starts the new partial."""
        return layer > 1 and (layer - 1) % self.block_size == 0

    def bank_rows(self, layer: int, site: str) -> int:
        """Bank rows the aggregation before `site` ('attn' or 'mlp') of `layer` reads.

        Rows 0..k-1 are completed blocks, row k (k = block_of(layer)) the running partial.
        """
        k = self.block_of(layer)
        if site == "attn":
            return k if self.opens_block(layer) else k + 1
        if site == "mlp":
            return k + 1
        raise ValueError(f"site must be 'attn' or 'mlp', got {site!r}")

    def partial_row(self, layer: int) -> int:
        return self.block_of(layer)

    @property
    def bank_rows_max(self) -> int:
        return self.block_of(self.num_layers) + 1

    # ---- counts -----------------------------------------------------------------------
    def count(self, family: str) -> int:
        """How many of the run's layers have this attention or MLP family."""
        return sum(1 for l in self.layers
                   if family in (self.attention_family(l), self.mlp_family(l)))

    # ---- memory (bytes, bf16 = 2, fp32 = 4) ---------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Device memory the model allocates, by kind (activations are negligible).

        Full depth at B = 64 with the full 8192-token context: expert banks 29.6 GB, other
        weights 23.6 GB, MLA cache 14.6 GB, KDA state 3.5 GB, conv windows 0.1 GB: 71 GB,
        under the ~100 GB budget, so the context is not reduced at any batch size."""
        H, bf, f32 = self.hidden, 2, 4
        n_kda, n_mla, n_moe = self.count(KDA), self.count(MLA), self.count(MOE)
        n_dense = self.count(DENSE)
        kda_w = H * self.qkvg_width + H * self.fab_width + self.kda_f_rank * self.kda_width \
            + self.kda_width * H + self.conv_channels * self.conv_width + 2 * self.kda_width
        mla_w = H * self.q_lora + H * self.kv_a_width + self.q_lora * self.q_b_width \
            + 2 * self.mla_heads * self.qk_nope * self.kv_lora + H * self.mla_out_width \
            + self.mla_out_width * H
        moe_w = H * self.front_width + self.shared_inter * H + self.latent * H
        dense_w = H * 2 * self.dense_inter + self.dense_inter * H
        bank = self.experts * (2 * self.expert_inter * self.latent + self.latent * self.expert_inter)
        banks_used = len(self.banks_used)
        B = self.batch
        return {
            "expert_banks": banks_used * bank * bf,
            "dense_weights": (n_kda * kda_w + n_mla * mla_w + n_moe * moe_w + n_dense * dense_w) * bf,
            "mla_cache": n_mla * B * self.pages_per_request * self.page_size * self.kv_a_width * bf,
            "kda_state": n_kda * B * self.kda_heads * self.kda_head_dim ** 2 * f32,
            "conv_state": n_kda * B * (self.conv_width - 1) * self.conv_channels * bf,
        }

    def read_bytes(self, layer: int, routed_experts: int | None = None) -> dict[str, int]:
        """What one layer's decode step must read from HBM, by part: the HBM floor's terms
        (bench/bench_k3_step.py sums them over the layers). `routed_experts`: the distinct
        experts the layer's routing activated (default min(B x top_k, experts), exact at B = 1)."""
        H, B, bf, f32 = self.hidden, self.batch, 2, 4
        parts = {"attention weights": 0, "dense/moe weights": 0, "routed experts": 0, "mla cache": 0,
                 "kda state": 0, "attn-res banks": 0}
        if self.attention_family(layer) == KDA:
            parts["attention weights"] = (H * self.qkvg_width + H * self.fab_width + self.kda_f_rank * self.kda_width
                                          + self.kda_width * H) * bf
            parts["kda state"] = B * self.kda_heads * self.kda_head_dim ** 2 * f32
        else:
            parts["attention weights"] = (H * self.q_lora + H * self.kv_a_width + self.q_lora * self.q_b_width
                                          + self.mla_heads * (self.qk_nope + self.v_head) * self.kv_lora  # W_UK, W_UV
                                          + H * self.mla_out_width + self.mla_out_width * H) * bf
            parts["mla cache"] = B * self.seq_len * self.kv_a_width * bf
        if self.mlp_family(layer) == DENSE:
            parts["dense/moe weights"] = (H * 2 * self.dense_inter + self.dense_inter * H) * bf
        else:
            parts["dense/moe weights"] = (H * self.front_width + self.latent * H + self.shared_inter * H) * bf
            experts = min(B * self.top_k, self.experts) if routed_experts is None else routed_experts
            parts["routed experts"] = experts * (2 * self.expert_inter * self.latent
                                                 + self.latent * self.expert_inter) * bf
        # Both aggregations (before attention and before the MLP), each at most every row.
        parts["attn-res banks"] = 2 * self.bank_rows_max * B * H * bf
        return parts

    def with_(self, **changes) -> K3Config:
        return replace(self, **changes)


def tiny_config(**changes) -> K3Config:
    """A shrunk model for CPU (Triton interpreter) tests.

    Same layer schedule, bank bookkeeping and launch plan as the real model (every launch
    is exercised); widths, head counts, experts and top-k shrink. Power-of-two widths
    where the kernels need them (head dims, cache row = 64 latent + 16 rope).
    """
    base = {"hidden": 256, "experts": 32, "top_k": 4, "expert_inter": 32, "latent": 128,
            "shared_inter": 32, "dense_inter": 64, "kda_heads": 2, "kda_head_dim": 32,
            "kda_f_rank": 16, "mla_heads": 2, "q_lora": 64, "kv_lora": 64, "qk_nope": 32,
            "qk_rope": 16, "v_head": 32, "context": 100, "page_size": 16, "n_expert_banks": 2,
            "num_layers": 4, "router_group": 16, "fmha_split_tokens": 32}
    base.update(changes)
    return K3Config(**base)
