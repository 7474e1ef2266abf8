"""The variants of kernels/README.md as a frozen set of switches, parsed from a name.

    parse("baseline")
    parse("no_attn_forks+router_multipass")
    parse("delay:kda_step_kernel:4000")      # the named Triton kernel spins 4 us longer
    parse("prefetch:24")                     # latency-bound kernels prefetch 24 MB of the next weight
    parse("linear_prefetch:16")              # skinny GEMMs prefetch 16 MB of their own weight first
    parse("gemm_prefetch:16")                # skinny GEMMs prefetch 16 MB of the next GEMM's weight last

A variant changes scheduling or fusion only, never the math (kernels/README.md); the
plan test checks that the sub-ops of every variant compute the same things.
Pure Python: the trace analyser and CPU tests import it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

#: Flag names -> the Variant field each one sets to its non-default value.
_FLAGS: dict[str, tuple[str, bool]] = {
    "mla_epilogue_split": ("mla_epilogue_split", True),   # seed 000
    "no_attn_forks": ("attn_forks", False),               # seed 001
    "router_multipass": ("router_multipass", True),       # seed 003
    "kda_norm_separate": ("kda_norm_fused", False),       # seed 003
    "residual_separate": ("residual_folded", False),      # seed 003
    "kda_cute": ("kda_cute", True),
    # The bs1 campaign (kernels/README.md, "The bs1 campaign"), one change per flag.
    "router_fork": ("router_fork", True),                 # seed 003
    "mla_combine_wide": ("mla_combine_wide", True),
    "attn_res_fused": ("attn_res_fused", True),           # seed 003
    "triton_linear": ("triton_linear", True),
    "situ_fused": ("situ_fused", True),                   # seed 003 (fused tails)
    "fmha_short_splits": ("fmha_short_splits", True),
    "router_align_fused": ("router_align_fused", True),   # seed 003
    "mlp_residual_folded": ("mlp_residual_folded", True),  # seed 003
    "pdl_early_trigger": ("pdl_early_trigger", True),      # seed 000's early trigger, everywhere
    "attn_res_dot": ("attn_res_dot", True),
    "attn_res_early_rows": ("attn_res_early_rows", True),  # seed 000's loads before the wait
    "moe_tail_fused": ("moe_tail_fused", True),            # seed 003 (fused tails)
    "latent_norm_folded": ("latent_norm_folded", True),    # the norm weight folded into up
    "linear_early_weights": ("linear_early_weights", True),  # seed 000's loads before the wait
    "kda_conv_fused": ("kda_conv_fused", True),            # seed 003 (fused KDA step)
    "mla_proj_merged": ("mla_proj_merged", True),          # q_a | kv_a | g_proj: one GEMM
    "moe_sum_norm_fused": ("moe_sum_norm_fused", True),    # seed 003 (fused tails)
    "linear_split_k": ("linear_split_k", True),            # every SM streaming the skinny GEMMs
    "triton_o_proj": ("triton_o_proj", True),              # o_proj as the skinny GEMM too
    "triton_mla_proj": ("triton_mla_proj", True),          # the MLA's narrow GEMMs, split-K skinny
    "router_in_front": ("router_in_front", True),          # the router inside the front GEMM's launch
    "attn_res_in_o_proj": ("attn_res_in_o_proj", True),    # the pre-MLP score in the o_proj's epilogue
    "linear_tma": ("linear_tma", True),                    # the skinny GEMMs' weights by TMA descriptor
    "side_priority": ("side_priority", True),              # S1 and S2 above main's stream priority
    "moe_down_mixed": ("moe_down_mixed", True),            # seed 003 (fused tails): the sum in the down GEMM
    "attn_res_one_pass": ("attn_res_one_pass", True),      # score + combine, each program the whole Gram
    "pdl_trigger_first": ("pdl_trigger_first", True),      # latency-bound kernels trigger before their wait
    "linear_tma_x": ("linear_tma_x", True),                # linear_tma on the GEMMs that read x only
    "linear_tma_tuned": ("linear_tma_tuned", True),        # linear_tma's front at the TMA sweep's best config
    "moe_tail_mma": ("moe_tail_mma", True),                # moe_tail_fused with the expert rows as MMA rows
    "linear_gluon": ("linear_gluon", True),                # B = 1: the KDA o_proj as the Gluon GEMM
    "linear_ws": ("linear_ws", True),                      # linear_gluon's GEMMs warp-specialized (loader warp)
    "moe_down_atomic": ("moe_down_atomic", True),          # B = 1: the down GEMM adds the weighted sum atomically
    "situ_in_gate_up": ("situ_in_gate_up", True),          # B = 1: the routed SiTU in the gate|up GEMM's epilogue
    "shared_in_up": ("shared_in_up", True),                # B = 1: the shared experts' down GEMM inside the up GEMM
    "fmha_one_tile": ("fmha_one_tile", True),              # split-KV programs of one 64-token tile, look-ups early
    "fmha_early_kv": ("fmha_early_kv", True),              # with fmha_one_tile: the cache rows before the wait
    "mla_head_bmm": ("mla_head_bmm", True),                # B <= 16: the absorb and V-up BMMs as a Triton PDL kernel
    "mla_gate_in_v": ("mla_gate_in_v", True),              # with mla_head_bmm: the output gate in V-up's epilogue
    "g_proj_early": ("g_proj_early", True),                # the g_proj leg forks with the KV leg, beside the Q chain
    "mla_q_skinny": ("mla_q_skinny", True),                # with triton_linear: q_a and q_b as split-K skinny GEMMs
    "moe_grouped_tuned": ("moe_grouped_tuned", True),      # the routed grouped GEMMs at moe.GROUPED_CONFIGS' blocks
    "attn_res_wide": ("attn_res_wide", True),              # B = 1: the attention residuals' pair in 1024-column chunks
    "mla_absorb_concat": ("mla_absorb_concat", True),  # with mla_head_bmm: the absorb writes the FMHA's q rows
    "mla_kv_norm_insert": ("mla_kv_norm_insert", True),  # the KV leg's RMSNorm writes the cache row itself
    "mla_gate_in_o_proj": ("mla_gate_in_o_proj", True),  # the skinny o_proj forms o * sigmoid(g) as it loads
    "prefetch_lines": ("prefetch_lines", True),  # with prefetch:<MB>: one prefetch.global.L2 per line, not bulk
    "moe_weights_ahead": ("moe_weights_ahead", True),  # B = 1: the grouped GEMMs load weights before their wait
    "mla_o_proj_ahead": ("mla_o_proj_ahead", True),  # V-up and gate_mul trigger first: the o_proj launches early
    "kda_split_v": ("kda_split_v", True),  # B = 1: kda_step over V quarters, the fused norm across a barrier
    "shared_front_leg": ("shared_front_leg", True),  # B = 1: the shared experts' front columns as S1's own GEMM
    "router_top4": ("router_top4", True),  # the router's top-k four a selection round, not one (bit for bit)
    "router_bitonic": ("router_bitonic", True),  # the router's top-k one bitonic top-k network, no rounds (bit for bit)
    "moe_grouped_tma": ("moe_grouped_tma", True),  # the routed grouped GEMMs' weight tiles by TMA (bit for bit)
    "no_pdl": ("pdl", False),                              # every Triton launch a plain one (what PDL is worth)
}

DELAY_PREFIX = "delay"
PREFETCH_PREFIX = "prefetch"
PREFETCH_LEG_PREFIX = "prefetch_leg"
LINEAR_PREFETCH_PREFIX = "linear_prefetch"
GEMM_PREFETCH_PREFIX = "gemm_prefetch"


@dataclass(frozen=True)
class Variant:
    attn_forks: bool = True          # KDA gate GEMVs on S2, MLA KV chain on S1, g_proj on S2
    mla_epilogue_split: bool = False  # q-concat/cache rows split across 3 programs
    router_multipass: bool = False   # two-pass grouped top-16 instead of the single-CTA one
    kda_norm_fused: bool = True      # gated RMSNorm in kda_step's epilogue
    residual_folded: bool = True     # attention residual add folded into attn_res_score
    kda_cute: bool = False           # KDA step in CuTe DSL
    router_fork: bool = False        # router logits by a GEMV on S2; top-k + align hidden there
    mla_combine_wide: bool = False   # split-KV combine over (head, 64-column) programs
    attn_res_fused: bool = False     # score + combine in one launch (grid barrier)
    triton_linear: bool = False      # dense GEMMs as the skinny Triton GEMM at B <= 16
    situ_fused: bool = False         # routed SiTU applied in the down GEMM's operand load
    fmha_short_splits: bool = False  # split-KV programs of >= 64 cache tokens, not 128
    router_align_fused: bool = False  # B = 1: the router writes the align's segments itself
    mlp_residual_folded: bool = False  # MLP output added in the next layer's pre-attention score
    pdl_early_trigger: bool = False  # every Triton kernel triggers its dependents after its wait
    attn_res_dot: bool = False       # attn_res Gram matrix by tl.dot; combine loads in one shot
    attn_res_early_rows: bool = False  # attn_res bank rows but the last load before the PDL wait
    moe_tail_fused: bool = False     # B = 1: weighted sum + latent RMSNorm in the up GEMM's load
    latent_norm_folded: bool = False  # latent RMSNorm: gamma in the up weights, 1/rms in its epilogue
    linear_early_weights: bool = False  # skinny GEMMs load their first weight block before the wait
    kda_conv_fused: bool = False     # short conv + SiLU inside kda_step (one launch fewer)
    mla_proj_merged: bool = False    # B <= 16: x's three MLA projections as one skinny GEMM on main
    moe_sum_norm_fused: bool = False  # B <= 16: weighted sum + latent RMSNorm, one program per token
    linear_split_k: bool = False     # skinny GEMMs split K over programs where the sweep says so
    triton_o_proj: bool = False      # with triton_linear: the KDA and MLA o_proj as the skinny GEMM
    triton_mla_proj: bool = False    # with triton_linear: q_a, kv_a, g_proj, q_b as split-K skinny GEMMs
    router_in_front: bool = False    # with router_fork + router_align_fused + triton_linear: the front
                                     # GEMM's first programs make the logits, its last one routes
    attn_res_in_o_proj: bool = False  # B = 1, skinny o_proj + attn_res_dot: the o_proj's epilogue adds
                                      # its output to the partial and scores its columns (no score launch)
    linear_tma: bool = False         # with triton_linear: the skinny GEMMs stream their weight tiles by TMA
    side_priority: bool = False      # the side streams (S1, S2) at high CUDA stream priority
    moe_down_mixed: bool = False     # B = 1: the routed down GEMM forms the weighted sum itself
    attn_res_one_pass: bool = False  # B = 1: score + combine in one launch, each program the whole Gram
    pdl_trigger_first: bool = False  # the attention residuals' score and combine, the MoE weighted sum and
                                     # latent norm trigger their dependents before their own wait
    prefetch_mb: int = 0             # MB of the next GEMM's weight a latency-bound kernel asks L2 for
    prefetch_lines: bool = False     # with prefetch:<MB>: those prefetches one hint per 128-byte line
                                     # (prefetch.global.L2) instead of bulk copies the grid waits for
    prefetch_leg_mb: int = 0         # MB of the next GEMM's weight a kernel on a third stream asks L2 for
    linear_tma_x: bool = False       # with linear_tma: TMA only where K is the hidden size (MoE front, KDA
                                     # qkvg); the o_proj and MoE up GEMMs keep pointer loads
    linear_tma_tuned: bool = False   # with linear_tma: the MoE front's rest at TMA_CONFIGS' block (64, 256, 4 warps)
    moe_tail_mma: bool = False       # with moe_tail_fused: the 16 expert rows (times gamma) are the up GEMM's
                                     # MMA rows, the weighted sum taken once on the accumulator
    linear_gluon: bool = False       # B = 1, with triton_linear: the skinny GEMMs of plan.GLUON_SUBOPS as the
                                     # Gluon kernel (gemv_gluon), its weight copies issued before its wait
    linear_ws: bool = False          # with linear_gluon: those GEMMs as the warp-specialized Gluon kernel (a
                                     # loader warp streams every slot, never waiting for the PDL producer)
    moe_down_atomic: bool = False    # B = 1: the routed down GEMM adds each expert row times its weight into
                                     # an fp32 latent (atomics), the norm reads and clears it: no weighted sum
    situ_in_gate_up: bool = False    # B = 1: the routed gate|up GEMM tiles gate rows with their up rows and
                                     # stores SiTU of them: no routed situ_mul launch
    shared_in_up: bool = False       # B = 1, with triton_linear: the up GEMM reads [latent | shared h] against
                                     # [up ; shared down], so the shared experts' cuBLAS GEMM on S1 goes
    fmha_one_tile: bool = False      # split-KV programs of one tile (64 tokens at K3) whose page look-ups
                                     # come before the PDL wait
    fmha_early_kv: bool = False      # with fmha_one_tile: the tile's cache rows before the wait too (forks on:
                                     # the KV leg wrote the new row before the FMHA's producer started)
    mla_head_bmm: bool = False       # B <= 16: the absorb and V-up BMMs as head_bmm_kernel (Triton, PDL), not cuBLAS
    mla_gate_in_v: bool = False      # with mla_head_bmm: V-up applies the output gate (no gate_mul launch)
    pdl: bool = True                 # Triton kernels PDL-launched (no_pdl: plain launches, griddepcontrol off)
    mla_q_skinny: bool = False       # with triton_linear (B <= 16): the Q chain's q_a and q_b as split-K skinny
                                     # GEMMs (triton_mla_proj's two on main; kv_a and g_proj stay cuBLAS)
    moe_grouped_tuned: bool = False  # the routed gate|up and down GEMMs at moe.GROUPED_CONFIGS' blocks
    attn_res_wide: bool = False      # B = 1: the score and combine in chunks of attn_res.WIDE_BLOCK_H columns
    g_proj_early: bool = False       # the g_proj leg (S2) forks at the MLA segment's start, beside the Q and KV
                                     # chains, not at q_concat beside the FMHA
    mla_absorb_concat: bool = False  # with mla_head_bmm and the forks: the absorb writes the FMHA's query rows,
                                     # rope part included, so the Q chain's q_concat launch (and hop) goes
    mla_kv_norm_insert: bool = False  # with the forks: the KV leg's RMSNorm writes the step's cache row (latent
                                      # and rope) itself, so the leg's insert launch (and hop) goes
    mla_gate_in_o_proj: bool = False  # with the MLA o_proj a skinny Triton GEMM: its operand is o * sigmoid(g),
                                      # formed as it loads, so the gate_mul launch (and hop) goes; the g_proj
                                      # leg still joins before the o_proj
    linear_prefetch_mb: int = 0      # MB of its own weight's first rows a skinny GEMM asks L2 for before its wait
    gemm_prefetch_mb: int = 0        # MB of the next GEMM's weight a skinny Triton GEMM asks L2 for after its
                                     # stores (per line), across the latency-bound kernels between them
    moe_weights_ahead: bool = False  # B = 1, with moe_down_atomic: the routed situ_mul and the latent norm trigger
                                     # before their wait; the grouped GEMMs load their first weight blocks (the
                                     # down GEMM all of K) before theirs, streaming beside the kernels before them
    mla_o_proj_ahead: bool = False   # B = 1: the MLA's V-up and gate_mul trigger before their wait, so the o_proj launches
                                     # (and, as the Gluon GEMM, copies its first slots) during the FMHA's combine
    kda_split_v: bool = False        # B = 1, with the fused norm: kda_step's programs take a quarter of V each (48, not
                                     # 12), the head's four meet at a barrier for the norm's sum of squares
    shared_front_leg: bool = False   # B = 1, with router_fork: the shared experts' gate|up columns of the front GEMM
                                     # as their own GEMM at the head of the S1 leg, forked after the latent columns
    router_top4: bool = False        # the router's selection rounds keep the top 4 (a bitonic merge in the reduction),
                                     # 4 rounds for top-16, not 16; the same routing, bit for bit
    router_bitonic: bool = False     # the router's selection (single pass, the groups of multipass) is one bitonic
                                     # top-k network (tl.topk), no rounds; the same routing, bit for bit
    moe_grouped_tma: bool = False    # the routed grouped GEMMs' weight tiles by TMA bulk copies (a descriptor over
                                     # each bank as [E * N, K]), not pointer loads; bit for bit
    delay_kernel: str = ""           # Triton kernel (function or launcher name) to slow down
    delay_ns: int = 0

    @property
    def name(self) -> str:
        """The canonical name; `parse(v.name) == v`."""
        parts = [flag for flag, (field, value) in _FLAGS.items() if getattr(self, field) == value]
        if self.prefetch_mb:
            parts.append(f"{PREFETCH_PREFIX}:{self.prefetch_mb}")
        if self.prefetch_leg_mb:
            parts.append(f"{PREFETCH_LEG_PREFIX}:{self.prefetch_leg_mb}")
        if self.linear_prefetch_mb:
            parts.append(f"{LINEAR_PREFETCH_PREFIX}:{self.linear_prefetch_mb}")
        if self.gemm_prefetch_mb:
            parts.append(f"{GEMM_PREFETCH_PREFIX}:{self.gemm_prefetch_mb}")
        if self.delay_kernel and self.delay_ns:
            parts.append(f"{DELAY_PREFIX}:{self.delay_kernel}:{self.delay_ns}")
        return "+".join(parts) or "baseline"

    def delay_for(self, *kernel_names: str) -> int:
        """Extra spin (ns) for a launch whose kernel is known by any of `kernel_names`."""
        return self.delay_ns if self.delay_kernel and self.delay_kernel in kernel_names else 0

    def with_delay(self, kernel: str, ns: int) -> Variant:
        if ns < 0:
            raise ValueError("delay must be >= 0 ns")
        return replace(self, delay_kernel=kernel if ns else "", delay_ns=ns if kernel else 0)


BASELINE = Variant()

#: The `<prefix>:<MB>` parts: prefix -> (the Variant field, what the error calls it, its rule).
_MB_PARTS = {PREFETCH_PREFIX: ("prefetch_mb", "prefetch", "MB a whole number"),
             PREFETCH_LEG_PREFIX: ("prefetch_leg_mb", "prefetch leg", "MB > 0"),
             LINEAR_PREFETCH_PREFIX: ("linear_prefetch_mb", "linear prefetch", "MB > 0"),
             GEMM_PREFETCH_PREFIX: ("gemm_prefetch_mb", "GEMM prefetch", "MB > 0")}


def parse(name: str) -> Variant:
    """`baseline`, any flag of the table, `prefetch:<MB>`, `prefetch_leg:<MB>`,
    `linear_prefetch:<MB>`, `gemm_prefetch:<MB>`, `delay:<kernel>:<ns>`, joined with `+`."""
    v = BASELINE
    for part in (p.strip() for p in (name or "baseline").split("+")):
        if part in ("", "baseline"):
            continue
        prefix, _, mb = part.partition(":")
        if prefix in _MB_PARTS and ":" in part:
            field, what, rule = _MB_PARTS[prefix]
            if not mb.isdigit() or (rule == "MB > 0" and int(mb) == 0) or getattr(v, field):
                raise ValueError(f"bad {what} {part!r}: expected one {prefix}:<MB>, {rule}")
            v = replace(v, **{field: int(mb)})
            continue
        if part.startswith(DELAY_PREFIX + ":"):
            try:
                _, kernel, ns = part.split(":")
                ns_i = int(ns)
            except ValueError:
                raise ValueError(f"bad delay {part!r}: expected delay:<kernel>:<ns>") from None
            if not kernel or ns_i < 0:
                raise ValueError(f"bad delay {part!r}: expected delay:<kernel>:<ns>")
            if v.delay_kernel:
                raise ValueError("only one delay:<kernel>:<ns> per variant")
            v = v.with_delay(kernel, ns_i)
            continue
        if part not in _FLAGS:
            raise ValueError(f"unknown variant {part!r}; known: baseline, {', '.join(_FLAGS)}, "
                             f"{PREFETCH_PREFIX}:<MB>, {PREFETCH_LEG_PREFIX}:<MB>, {LINEAR_PREFETCH_PREFIX}:<MB>, "
                             f"{GEMM_PREFETCH_PREFIX}:<MB>, "
                             f"{DELAY_PREFIX}:<kernel>:<ns>")
        field, value = _FLAGS[part]
        v = replace(v, **{field: value})
    return v


def known_flags() -> tuple[str, ...]:
    return tuple(_FLAGS)


def switch_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Variant))
