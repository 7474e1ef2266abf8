"""Structure of the K3 decode path without torch or a GPU: schedule, shapes, the launch
plan per variant, NVTX names. Imports only pure modules (CI runs this with no torch)."""

from __future__ import annotations

from collections import Counter

import pytest

import k3names
from kernels.k3 import plan as P
from kernels.k3.config import FULL_DEPTH, K3Config, tiny_config
from kernels.k3.variants import BASELINE, Variant, known_flags, parse

FULL = K3Config()
ALL_VARIANTS = ["baseline", *known_flags(), "delay:kda_step_kernel:4000", "prefetch:24", "prefetch_leg:8",
                "no_attn_forks+kda_norm_separate+residual_separate+router_multipass"]


# ---- schedule ----------------------------------------------------------------------------
def test_attention_schedule():
    mla = [l for l in range(1, 94) if FULL.attention_family(l) == "mla"]
    assert mla == list(range(4, 93, 4)) + [93]
    assert len(mla) == 24
    assert sum(FULL.attention_family(l) == "kda" for l in range(1, 94)) == 69


def test_mlp_schedule():
    assert FULL.mlp_family(1) == "dense"
    assert all(FULL.mlp_family(l) == "moe" for l in range(2, 94))
    assert (FULL.count("kda"), FULL.count("mla"), FULL.count("moe"), FULL.count("dense")) == (69, 24, 92, 1)


def test_schedule_is_independent_of_depth():
    short = K3Config(num_layers=8)
    assert list(short.layers) == list(range(1, 9))
    assert [short.attention_family(l) for l in short.layers] == \
        [FULL.attention_family(l) for l in range(1, 9)]
    with pytest.raises(ValueError):
        K3Config(num_layers=0)
    with pytest.raises(ValueError):
        K3Config(num_layers=94)


def test_expert_banks_alias_round_robin():
    assert [FULL.expert_bank(l) for l in (2, 3, 4, 5, 6)] == [2, 3, 0, 1, 2]


# ---- shapes ------------------------------------------------------------------------------
def test_shapes():
    c = FULL
    assert c.hidden == 7168
    assert (c.kda_width, c.qkvg_width, c.conv_channels, c.fab_width) == (1536, 6144, 4608, 140)
    assert (c.q_lora, c.q_b_width, c.kv_a_width, c.mla_out_width) == (1536, 2304, 576, 1536)
    assert c.front_width == 6016
    assert c.front_slices == {"router": (0, 896), "latent": (896, 4480), "shared": (4480, 6016)}
    assert (c.experts, c.top_k, 2 * c.expert_inter, c.latent) == (896, 16, 768, 3584)
    assert 2 * c.dense_inter == 4608
    assert c.page_size == 64 and c.context == 8192
    assert c.pages_per_request == 129  # 8192 history + the appended token
    assert c.sm_scale == pytest.approx(192 ** -0.5)


def test_memory_fits_the_h200_at_b64():
    m = K3Config(batch=64).memory_bytes()
    assert m["mla_cache"] == 24 * 64 * 129 * 64 * 1152
    assert m["kda_state"] == 69 * 64 * 768 * 1024
    assert 29e9 < m["expert_banks"] < 31e9
    assert sum(m.values()) < 100e9


# ---- attention-residual bank ----------------------------------------------------------------
def test_bank_rows():
    c = FULL
    assert c.bank_rows_max == 8 == c.bank_capacity
    assert c.bank_rows(1, "attn") == 1 and c.bank_rows(1, "mlp") == 1
    assert c.bank_rows(12, "mlp") == 1
    assert c.opens_block(13) and not c.opens_block(1) and not c.opens_block(12)
    assert c.bank_rows(13, "attn") == 1 and c.bank_rows(13, "mlp") == 2
    assert c.bank_rows(93, "attn") == 8 and c.bank_rows(93, "mlp") == 8
    for l in c.layers:
        assert 1 <= c.bank_rows(l, "attn") <= c.bank_rows(l, "mlp") <= 8
        assert c.partial_row(l) == c.bank_rows(l, "mlp") - 1
    assert sum(c.opens_block(l) for l in c.layers) == 7


# ---- variants ------------------------------------------------------------------------------
def test_variant_parsing():
    assert parse("baseline") == BASELINE == parse("") == Variant()
    assert parse("no_attn_forks").attn_forks is False
    assert parse("mla_epilogue_split").mla_epilogue_split
    assert parse("router_multipass").router_multipass
    assert parse("kda_norm_separate").kda_norm_fused is False
    assert parse("residual_separate").residual_folded is False
    assert parse("kda_cute").kda_cute
    d = parse("delay:kda_step_kernel:4000")
    assert (d.delay_kernel, d.delay_ns) == ("kda_step_kernel", 4000)
    assert d.delay_for("kda_step", "kda_step_kernel") == 4000 and d.delay_for("x") == 0
    combo = parse("no_attn_forks+router_multipass+delay:moe_router_kernel:10")
    assert not combo.attn_forks and combo.router_multipass and combo.delay_ns == 10
    for name in ALL_VARIANTS:
        assert parse(parse(name).name) == parse(name)
    for bad in ("nope", "delay:x", "delay::5", "delay:x:-1", "delay:a:1+delay:b:2"):
        with pytest.raises(ValueError):
            parse(bad)


# ---- launch plan -----------------------------------------------------------------------------
def test_baseline_counts():
    p = P.build_plan(FULL)
    per = {"attn_res": 2, "kda": 3, "mla": 7, "moe": 9, "dense": 2}  # kda: gemv, conv, step
    fam = p.family_counts()
    assert fam == Counter({"attn_res": 186, "moe": 92, "kda": 69, "mla": 24, "dense": 1})
    assert p.triton_kernels == sum(per[f] * n for f, n in fam.items()) == 1577
    assert p.cublas_calls == 69 * 3 + 24 * 7 + 92 * 3 + 2 == 653
    assert p.kernel_bounds == (1577 + 653, 1577 + 2 * 653)


@pytest.mark.parametrize("name, delta", [
    ("mla_epilogue_split", 0), ("delay:kda_step_kernel:4000", 0),
    ("no_attn_forks", -24),             # cache insert fused into q_concat
    ("kda_norm_separate", +69),         # gated RMSNorm as its own kernel
    ("residual_separate", +93 - 7),     # not on the 7 layers that open a block
    ("router_multipass", +92 * (len(P.TRITON_KERNELS["moe_router/multipass"]) - 1)),
    ("router_fork", +92),               # the router GEMV; the front GEMM stays one call
    ("mla_combine_wide", 0),
    ("situ_fused", -92),                # the routed SiTU launch
    ("fmha_short_splits", 0),
    ("attn_res_fused", -186),           # one launch per aggregation, not two
    ("router_align_fused", -92),        # the align launch (B = 1)
    ("mlp_residual_folded", -92),       # add3 / residual_add of layers 1..92 (93 keeps its add)
    ("attn_res_dot", 0), ("attn_res_early_rows", 0),  # the same two kernels, other code inside
    ("prefetch:24", 0),                 # prefetches ride in launches the step already has
    ("moe_tail_fused", 0),              # needs triton_linear's up GEMM (below)
    ("latent_norm_folded", 0),          # likewise
    ("linear_early_weights", 0),        # the same skinny GEMMs, a load moved
    ("kda_conv_fused", -69),            # the conv launch, now inside kda_step
    ("moe_sum_norm_fused", -92),        # the latent RMSNorm, now in the weighted sum's program
    ("linear_split_k", 0),              # the same skinny GEMMs, K split inside
    ("triton_o_proj", 0),               # needs triton_linear's GEMM (below)
    ("triton_mla_proj", 0),             # likewise
    ("prefetch_leg:8", 186 + 69 + 92),  # a prefetch kernel before every GEMM after a latency-bound stretch
    ("router_in_front", 0),             # needs the forked, aligned router and triton_linear (below)
    ("attn_res_in_o_proj", 0),          # needs the skinny o_proj and attn_res_dot (below)
    ("linear_tma", 0),                  # the same kernels, their weight loads by TMA
    ("side_priority", 0),               # the same kernels, the side streams at high priority
    ("moe_down_mixed", -92),            # the weighted sum, now in the down GEMM (B = 1)
    ("attn_res_one_pass", -186),        # one launch per aggregation, not two (B = 1)
    ("linear_prefetch:16", 0),          # the same skinny GEMMs, an L2 prefetch before their wait
    ("pdl_trigger_first", 0),           # the same kernels, their trigger before their wait
    ("linear_tma_x", 0), ("linear_tma_tuned", 0),  # the same skinny GEMMs, other loads or warps
    ("moe_tail_mma", 0),                # moe_tail_fused's kernel, other code inside (needs it)
    ("linear_gluon", 0),                # needs triton_linear's GEMMs (below)
    ("linear_ws", 0),                   # needs linear_gluon's (below)
    ("moe_down_atomic", -92),           # the weighted sum, added by the down GEMM (B = 1)
    ("situ_in_gate_up", -92),           # the routed SiTU, in the gate|up GEMM's epilogue (B = 1)
    ("shared_in_up", 0),                # needs triton_linear's up GEMM (below)
    ("fmha_one_tile", 0), ("fmha_one_tile+fmha_early_kv", 0),  # the same FMHA, other tiles and loads
    ("fmha_early_kv", 0),               # needs fmha_one_tile
    ("mla_gate_in_v", 0),               # needs mla_head_bmm (below)
    ("g_proj_early", 0),                # the same launches, g_proj's leg forked earlier
    ("mla_q_skinny", 0),                # needs triton_linear (below)
    ("no_pdl", 0),                      # the same launches, plain instead of PDL-style
    ("moe_grouped_tuned", 0),           # the same grouped GEMMs, other blocks
    ("attn_res_wide", 0),               # the same pair, wider chunks (B = 1)
    ("mla_absorb_concat", 0),           # needs mla_head_bmm (below)
    ("mla_kv_norm_insert", -24),        # the KV leg's insert, now in its norm
    ("mla_gate_in_o_proj", 0),          # needs the skinny o_proj (below)
    ("moe_weights_ahead", 0),           # needs moe_down_atomic: the same launches, loads before the wait
    ("mla_o_proj_ahead", 0),            # the same launches, two of them triggering first
])
def test_variant_kernel_deltas(name, delta):
    base, p = P.build_plan(FULL), P.build_plan(FULL, parse(name))
    assert p.triton_kernels - base.triton_kernels == delta
    assert p.cublas_calls == base.cublas_calls


def test_mla_head_bmm_takes_the_two_bmms_and_gate_in_v_the_gate_mul():
    # B = 1: the absorb and V-up of the 24 MLA layers leave cuBLAS for head_bmm_kernel; with
    # mla_gate_in_v the gate_mul launch goes and the g_proj leg joins before V-up. B = 64:
    # the batch does not fit the MMA's rows, nothing changes.
    base, p = P.build_plan(FULL), P.build_plan(FULL, parse("mla_head_bmm"))
    g = P.build_plan(FULL, parse("mla_head_bmm+mla_gate_in_v"))
    assert p.triton_kernels - base.triton_kernels == 48 and base.cublas_calls - p.cublas_calls == 48
    assert (p.triton_kernel_names() - base.triton_kernel_names()) == Counter({"head_bmm_kernel": 48})
    assert g.triton_kernels - p.triton_kernels == -24 and g.cublas_calls == p.cublas_calls
    assert (p.triton_kernel_names() - g.triton_kernel_names()) == Counter({"gate_mul_kernel": 24})
    mla = next(seg for seg in g.segments if seg.family == "mla")
    order = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in mla.items]
    assert order.index(("Join", P.AUX2)) == order.index(("Launch", P.V_UP)) - 1
    b64 = FULL.with_(batch=64)
    assert P.build_plan(b64, parse("mla_head_bmm+mla_gate_in_v")).segments == P.build_plan(b64).segments


def test_mla_absorb_concat_and_kv_norm_insert_take_the_two_copies():
    # B = 1 on mla_head_bmm: the absorb writes the query rows (q_concat goes, the KV leg then
    # joins right before the FMHA); the KV norm writes the cache row (cache_insert goes, its
    # launch is the norm's kernel). Forks off: q_concat writes the row, neither applies;
    # B = 64: the absorb is cuBLAS's BMM, only the norm's change applies.
    hb = P.build_plan(FULL, parse("mla_head_bmm"))
    both = P.build_plan(FULL, parse("mla_head_bmm+mla_absorb_concat+mla_kv_norm_insert"))
    assert (hb.triton_kernel_names() - both.triton_kernel_names()) == Counter({"mla_q_concat_kernel": 48})
    assert both.triton_kernel_names() - hb.triton_kernel_names() == Counter()
    assert both.cublas_calls == hb.cublas_calls
    mla = next(seg for seg in both.segments if seg.family == "mla")
    order = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in mla.items]
    assert ("Launch", P.Q_CONCAT) not in order and ("Launch", P.CACHE_INSERT) not in order
    # Nothing on main between the KV leg's join and the FMHA (the gate leg forks there).
    between = order[order.index(("Join", P.AUX1)) + 1:order.index(("Launch", P.FMHA))]
    assert between == [("Fork", P.AUX2), ("Launch", P.G_PROJ)]
    norm = next(l for l in mla.launches if l.subop == P.KV_A_NORM)
    assert (norm.stream, norm.launcher, norm.kernels) == (P.AUX1, "mla_kv_norm_insert", ("rmsnorm_kernel",))
    forks_off = "no_attn_forks+mla_head_bmm"
    assert (P.build_plan(FULL, parse(f"{forks_off}+mla_absorb_concat+mla_kv_norm_insert")).segments
            == P.build_plan(FULL, parse(forks_off)).segments)
    b64 = FULL.with_(batch=64)
    assert P.build_plan(b64, parse("mla_head_bmm+mla_absorb_concat")).segments == P.build_plan(b64).segments


def test_mla_gate_in_o_proj_takes_gate_mul_where_the_o_proj_is_skinny():
    # With the skinny o_proj (triton_linear + triton_o_proj, B <= 16) the 24 gate_mul launches
    # go and the g_proj leg still joins right before the o_proj; with mla_gate_in_v (V-up has
    # the gate) or a cuBLAS o_proj, nothing changes.
    base = "triton_linear+triton_o_proj"
    b, p = P.build_plan(FULL, parse(base)), P.build_plan(FULL, parse(f"{base}+mla_gate_in_o_proj"))
    assert (b.triton_kernel_names() - p.triton_kernel_names()) == Counter({"gate_mul_kernel": 24})
    assert p.triton_kernel_names() - b.triton_kernel_names() == Counter() and p.cublas_calls == b.cublas_calls
    mla = next(seg for seg in p.segments if seg.family == "mla")
    order = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in mla.items]
    assert order.index(("Join", P.AUX2)) == order.index(("Launch", P.O_PROJ)) - 1
    for name in (f"{base}+mla_head_bmm+mla_gate_in_v", "triton_linear", "mla_head_bmm"):
        assert (P.build_plan(FULL, parse(f"{name}+mla_gate_in_o_proj")).segments
                == P.build_plan(FULL, parse(name)).segments)
    b64 = FULL.with_(batch=64)
    assert (P.build_plan(b64, parse(f"{base}+mla_gate_in_o_proj")).segments
            == P.build_plan(b64, parse(base)).segments)


def test_g_proj_early_forks_the_gate_leg_with_the_kv_leg():
    # The g_proj leg forks right after the KV leg, before q_a, and joins where it did (before
    # gate_mul, or before V-up under mla_gate_in_v); forks off or merged projections: no change.
    for extra, joined_before in (("", P.GATE_MUL), ("+mla_head_bmm+mla_gate_in_v", P.V_UP)):
        p = P.build_plan(FULL, parse(f"g_proj_early{extra}"))
        mla = next(seg for seg in p.segments if seg.family == "mla")
        order = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in mla.items]
        assert order[:4] == [("Fork", P.AUX1), ("Fork", P.AUX2), ("Launch", P.G_PROJ), ("Launch", P.Q_A)]
        assert order.count(("Fork", P.AUX2)) == 1
        assert order.index(("Join", P.AUX2)) == order.index(("Launch", joined_before)) - 1
    for other in ("no_attn_forks", "mla_proj_merged"):
        assert P.build_plan(FULL, parse(f"{other}+g_proj_early")).segments == P.build_plan(FULL, parse(other)).segments


def test_mla_q_skinny_takes_q_a_and_q_b_only():
    # On triton_linear at B <= 16: the 24 MLA layers' q_a and q_b leave cuBLAS for the split-K
    # skinny GEMM (kv_a and g_proj, on the side legs, stay); B = 64: no change.
    base, p = P.build_plan(FULL, parse("triton_linear")), P.build_plan(FULL, parse("triton_linear+mla_q_skinny"))
    assert base.cublas_calls - p.cublas_calls == 48 and p.triton_kernels - base.triton_kernels == 48
    assert (p.triton_kernel_names() - base.triton_kernel_names()) == Counter({"skinny_mm_kernel": 48})
    mla = next(seg for seg in p.segments if seg.family == "mla")
    kinds = {i.subop: i.kind for i in mla.launches}
    assert (kinds[P.Q_A], kinds[P.Q_B], kinds[P.KV_A], kinds[P.G_PROJ]) == (P.TRITON, P.TRITON, P.CUBLAS, P.CUBLAS)
    b64 = FULL.with_(batch=64)
    assert P.build_plan(b64, parse("triton_linear+mla_q_skinny")).segments == P.build_plan(b64, parse("triton_linear")).segments


def test_fmha_early_kv_needs_the_kv_leg():
    # The cache rows before the wait only where the KV leg, not q_concat, writes the new row.
    from kernels.k3.config import K3Config

    cfg = K3Config()
    assert P.fmha_early_kv(cfg, parse("fmha_one_tile+fmha_early_kv"))
    assert not P.fmha_early_kv(cfg, parse("fmha_early_kv"))
    assert not P.fmha_early_kv(cfg, parse("fmha_one_tile+fmha_early_kv+no_attn_forks"))


def test_moe_tail_fused_drops_two_launches_per_moe_layer():
    # On triton_linear at B = 1: the weighted sum and the latent RMSNorm go, the up GEMM
    # stays one skinny_mm_kernel; at B = 8 the variant does not apply.
    base, p = P.build_plan(FULL, parse("triton_linear")), P.build_plan(FULL, parse("triton_linear+moe_tail_fused"))
    assert p.triton_kernels - base.triton_kernels == -2 * 92 and p.cublas_calls == base.cublas_calls
    names = p.triton_kernel_names() - base.triton_kernel_names()
    assert not names and (base.triton_kernel_names() - p.triton_kernel_names()) == Counter(
        {"moe_weighted_sum_kernel": 92, "rmsnorm_kernel": 92})
    b8 = FULL.with_(batch=8)
    assert P.build_plan(b8, parse("triton_linear+moe_tail_fused")).triton_kernels == \
        P.build_plan(b8, parse("triton_linear")).triton_kernels


def test_router_in_front_takes_the_router_leg_into_the_front():
    # On router_fork + router_align_fused + triton_linear at B = 1: the router GEMV, the
    # router and the front's skinny GEMM become one launch on main, and the S2 leg (its fork
    # and join) goes; at B = 8 (no fork) or without triton_linear it does not apply.
    head = "router_fork+router_align_fused+triton_linear"
    base, p = P.build_plan(FULL, parse(head)), P.build_plan(FULL, parse(head + "+router_in_front"))
    assert p.triton_kernels - base.triton_kernels == -2 * 92 and p.cublas_calls == base.cublas_calls
    assert base.triton_kernel_names() - p.triton_kernel_names() == Counter(
        {"gemv_kernel": 92, "moe_router_kernel": 92, "skinny_mm_kernel": 92})
    assert p.triton_kernel_names() - base.triton_kernel_names() == Counter({"moe_front_router_kernel": 92})
    moe = [s for s in p.segments if s.family == "moe"]
    assert all(P.AUX2 not in {getattr(i, "side", None) for i in s.items} for s in moe)
    assert all(l.stream == P.MAIN for s, l in p.launches() if l.subop == P.FRONT)
    for cfg, name in ((FULL.with_(batch=8), head), (FULL, "router_fork+router_align_fused")):
        assert P.build_plan(cfg, parse(name + "+router_in_front")).segments == P.build_plan(cfg, parse(name)).segments


def test_shared_front_leg_moves_the_shared_columns_to_s1():
    # On router_fork at B = 1: one GEMM more per MoE layer, the shared experts' gate|up columns
    # at the head of the S1 leg, which still forks right after main's front GEMM; main's front
    # keeps its place. At B = 8 (no router fork) or under router_in_front it does not apply.
    for head in ("router_fork", "router_fork+triton_linear"):
        base, p = P.build_plan(FULL, parse(head)), P.build_plan(FULL, parse(head + "+shared_front_leg"))
        assert p.triton_kernels + p.cublas_calls - base.triton_kernels - base.cublas_calls == 92
        for seg in (s for s in p.segments if s.family == "moe"):
            order = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in seg.items]
            fork = order.index(("Fork", P.AUX1))
            assert order[fork - 1] == ("Launch", P.FRONT) and order[fork + 1] == ("Launch", P.SHARED_GATE_UP)
            on = {l.subop: l.stream for l in seg.launches}
            assert on[P.FRONT] == P.MAIN and on[P.SHARED_GATE_UP] == on[P.SHARED_ACT] == P.AUX1
    skinny = P.build_plan(FULL, parse("router_fork+triton_linear+shared_front_leg"))
    assert skinny.triton_kernel_names()["skinny_mm_kernel"] - P.build_plan(
        FULL, parse("router_fork+triton_linear")).triton_kernel_names()["skinny_mm_kernel"] == 92
    front = "router_fork+router_align_fused+triton_linear+router_in_front"
    for cfg, name in ((FULL.with_(batch=8), "router_fork"), (FULL, front), (FULL, "triton_linear")):
        assert P.build_plan(cfg, parse(name + "+shared_front_leg")).segments == P.build_plan(cfg, parse(name)).segments


def test_attn_res_in_o_proj_drops_the_pre_mlp_score():
    # On triton_linear + triton_o_proj + attn_res_dot at B = 1: every layer's pre-MLP score
    # launch goes (its work is in the o_proj's epilogue), the pre-attention ones stay; at
    # B = 8, or with the score kernel's other variants, it does not apply.
    on = "triton_linear+triton_o_proj+attn_res_dot"
    base, p = P.build_plan(FULL, parse(on)), P.build_plan(FULL, parse(on + "+attn_res_in_o_proj"))
    assert p.triton_kernels - base.triton_kernels == -93 and p.cublas_calls == base.cublas_calls
    assert base.triton_kernel_names() - p.triton_kernel_names() == Counter({"attn_res_score_kernel": 93})
    assert p.triton_kernel_names()["attn_res_score_kernel"] == 93  # the pre-attention ones
    for cfg, name in ((FULL.with_(batch=8), on), (FULL, on + "+attn_res_early_rows"), (FULL, on + "+prefetch:8"),
                      (FULL, "triton_linear+attn_res_dot")):
        assert P.build_plan(cfg, parse(name + "+attn_res_in_o_proj")).segments == P.build_plan(cfg, parse(name)).segments


def test_latent_norm_folded_drops_the_norm_launch():
    # On triton_linear (B <= 16): the latent rmsnorm goes; at B = 64 (cuBLAS up) it stays.
    for B, delta in ((1, -92), (16, -92), (64, 0)):
        cfg = FULL.with_(batch=B)
        base = P.build_plan(cfg, parse("triton_linear"))
        p = P.build_plan(cfg, parse("triton_linear+latent_norm_folded"))
        assert p.triton_kernels - base.triton_kernels == delta, B
        assert base.triton_kernel_names()["rmsnorm_kernel"] - p.triton_kernel_names()["rmsnorm_kernel"] == -delta


def test_streams_baseline():
    p = P.build_plan(FULL)
    on = {(s.family, l.subop): l.stream for s, l in p.launches()}
    assert on[("kda", P.FAB)] == on[("kda", P.F_B)] == P.AUX2
    assert on[("mla", P.KV_A)] == on[("mla", P.KV_A_NORM)] == on[("mla", P.CACHE_INSERT)] == P.AUX1
    assert on[("mla", P.G_PROJ)] == P.AUX2
    assert on[("moe", P.SHARED_ACT)] == on[("moe", P.SHARED_DOWN)] == P.AUX1
    side = {k for k, v in on.items() if v != P.MAIN}
    assert side == {("kda", P.FAB), ("kda", P.F_B), ("mla", P.KV_A), ("mla", P.KV_A_NORM),
                    ("mla", P.CACHE_INSERT), ("mla", P.G_PROJ), ("moe", P.SHARED_ACT),
                    ("moe", P.SHARED_DOWN)}
    assert p.forks() == Counter({P.AUX1: 24 + 92, P.AUX2: 69 + 24})


def test_streams_no_attn_forks():
    p = P.build_plan(FULL, parse("no_attn_forks"))
    for seg, l in p.launches():
        if seg.family in ("kda", "mla", "attn_res", "dense"):
            assert l.stream == P.MAIN, (seg.range_name, l)
    assert {l.subop for s, l in p.launches() if l.stream != P.MAIN} == {P.SHARED_ACT, P.SHARED_DOWN}
    assert p.forks() == Counter({P.AUX1: 92})


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_forks_and_joins_are_balanced(name):
    """Every side leg is joined in the segment that forked it, except AUX3 (prefetch_leg),
    forked again and again and joined once, at the end of the step."""
    prefetch_open = False
    for seg in P.build_plan(K3Config(num_layers=8), parse(name)).segments:
        open_: set[str] = set()
        for item in seg.items:
            if isinstance(item, P.Fork) and item.side == P.AUX3:
                prefetch_open = True
            elif isinstance(item, P.Join) and item.side == P.AUX3:
                assert prefetch_open and item is seg.items[-1]
                prefetch_open = False
            elif isinstance(item, P.Fork):
                assert item.side not in open_
                open_.add(item.side)
            elif isinstance(item, P.Join):
                open_.remove(item.side)
            elif isinstance(item, P.Launch) and item.stream == P.AUX3:
                assert prefetch_open and item.subop == P.L2_PREFETCH, (seg.range_name, item)
            elif isinstance(item, P.Launch) and item.stream != P.MAIN:
                assert item.stream in open_, (seg.range_name, item)
        assert not open_, seg.range_name
    assert not prefetch_open


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_nvtx_names(name):
    p = P.build_plan(FULL, parse(name))
    for seg in p.segments:
        assert k3names.parse_layer_range(seg.range_name) == (seg.layer, seg.family)
        assert seg.family in k3names.FAMILIES
    subops = {n for n in p.range_names() if k3names.parse_layer_range(n) is None}
    assert k3names.STEP_RANGE not in p.range_names()
    assert all(n.isidentifier() for n in subops)
    ar = Counter(s.layer for s in p.segments for i in s.items if isinstance(i, P.AllReduce))
    assert all(ar[l] == 2 for l in FULL.layers)  # attention + MLP (placeholders, NVTX only)
    # Each layer: attn_res, attention, attn_res, MLP.
    fams = [s.family for s in p.segments if s.layer == 4]
    assert fams == ["attn_res", "mla", "attn_res", "moe"]
    assert [s.family for s in p.segments if s.layer == 1] == ["attn_res", "kda", "attn_res", "dense"]


def test_every_triton_launch_names_its_kernel():
    for name in ALL_VARIANTS:
        for _, l in P.build_plan(FULL, parse(name)).launches():
            assert (l.kind == P.CUBLAS) == (not l.kernels), l
            assert l.stream in P.STREAMS and l.kind in (P.TRITON, P.CUBLAS, P.CUTE)


def _math(plan: P.StepPlan) -> list[tuple[int, str, tuple[str, ...]]]:
    """Sub-ops per segment with fusions expanded: what is computed, not how it is scheduled."""
    v, cfg, out = plan.variant, plan.cfg, []
    for seg in plan.segments:
        ops = [l.subop for l in seg.launches if l.subop != P.L2_PREFETCH]  # a cache hint, no math
        if seg.family == "kda" and v.kda_norm_fused:
            ops.append(P.KDA_NORM)
        if seg.family == "mla" and not v.attn_forks:
            ops.append(P.CACHE_INSERT)  # fused into q_concat
        if seg.family == "mla" and P.kv_norm_inserts(cfg, v):
            ops.append(P.CACHE_INSERT)  # the KV norm stores the row itself
        if seg.family == "mla" and P.absorb_concats(cfg, v):
            ops.append(P.Q_CONCAT)  # the absorb stores the query rows itself
        if seg.family == "mla" and P.gate_in_o_proj(cfg, v):
            ops.append(P.GATE_MUL)  # in the o_proj's operand load
        if seg.family == "moe" and v.router_fork:
            ops.remove(P.ROUTER_GEMV)  # the front's router columns, read on their own
        if P.SCORE_COMBINE in ops:  # attn_res_fused: both sub-ops in one launch
            ops.remove(P.SCORE_COMBINE)
            ops += [P.SCORE, P.COMBINE]
        if seg.family == "moe" and P.router_aligns(cfg, v):
            ops.append(P.ALIGN)  # written by the router kernel
        if seg.family in ("moe", "dense") and P.mlp_output_folded(cfg, v, seg.layer):
            ops.append(P.ADD3 if seg.family == "moe" else P.RESIDUAL_ADD)  # in the next score
        if seg.family == "moe" and v.situ_fused:
            ops.append(P.EXPERT_ACT)  # inside the down GEMM's operand load
        if seg.family == "moe" and P.gate_up_acts(cfg, v):
            ops.append(P.EXPERT_ACT)  # in the gate|up GEMM's epilogue
        if seg.family == "moe" and P.shared_in_up(cfg, v):
            ops.append(P.SHARED_DOWN)  # its weights stacked under the up GEMM's
        if seg.family == "moe" and P.sum_norm_fuses(cfg, v):
            ops.append(P.LATENT_NORM)  # in the weighted sum's program
        if seg.family == "moe" and (P.down_mixes(cfg, v) or P.down_sums(cfg, v)):
            ops.append(P.WEIGHTED_SUM)  # in the down GEMM's program (mixed, or added atomically)
        if seg.family == "kda" and P.kda_conv_fuses(cfg, v):
            ops.append(P.CONV)  # inside kda_step
        if P.X_PROJ in ops:  # mla_proj_merged: x's three projections in one GEMM
            ops.remove(P.X_PROJ)
            ops += [P.Q_A, P.KV_A, P.G_PROJ]
        out.append((seg.layer, seg.family, ops))
    # A folded residual add lives inside the pre-MLP score (segment 2 of each layer's 4).
    for i, (layer, fam, ops) in enumerate(out):
        if fam == "attn_res" and i % 4 == 2 and v.residual_folded and not cfg.opens_block(layer):
            ops.insert(0, P.RESIDUAL_ADD)
    return [(l, f, tuple(sorted(o))) for l, f, o in out]


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_variants_change_scheduling_only(name):
    cfg = K3Config(num_layers=16)  # crosses a block boundary (layer 13)
    assert _math(P.build_plan(cfg, parse(name))) == _math(P.build_plan(cfg))


def test_variant_specific_launchers():
    cfg = K3Config(num_layers=4)
    router = [l for _, l in P.build_plan(cfg, parse("router_multipass")).launches()
              if l.subop == P.ROUTER]
    assert all(l.kernels == P.TRITON_KERNELS["moe_router/multipass"] for l in router)
    cute = [l for _, l in P.build_plan(cfg, parse("kda_cute")).launches() if l.subop == P.KDA_STEP]
    assert all(l.kind == P.CUTE for l in cute)


def test_triton_linear_takes_the_dense_gemms():
    base, p = P.build_plan(FULL), P.build_plan(FULL, parse("triton_linear"))
    skinny = [(s.family, l.subop) for s, l in p.launches() if l.launcher == "skinny_mm"]
    assert sorted(set(skinny)) == [("kda", P.QKVG), ("moe", P.FRONT), ("moe", P.UP)]
    assert p.triton_kernels - base.triton_kernels == len(skinny) == 69 + 2 * 92
    assert p.cublas_calls == base.cublas_calls - len(skinny)
    # Beyond one MMA tile of tokens the variant keeps cuBLAS.
    big = K3Config(batch=P.SKINNY_MAX_B + 1)
    assert P.build_plan(big, parse("triton_linear")).cublas_calls == P.build_plan(big).cublas_calls


def test_kda_conv_fused_keeps_the_conv_where_it_cannot_fuse():
    """With the norm separate (V split across programs) or the CuTe DSL step, the conv
    launch stays."""
    for extra in ("kda_norm_separate", "kda_cute"):
        base = P.build_plan(FULL, parse(extra))
        assert P.build_plan(FULL, parse(f"{extra}+kda_conv_fused")).triton_kernels == base.triton_kernels


def test_moe_sum_norm_fused_applies_up_to_b16_and_alone():
    """B <= 16 and not with the tails that already take the norm; at B = 64 the pair stays."""
    for B, delta in ((1, -92), (16, -92), (64, 0)):
        cfg = FULL.with_(batch=B)
        assert P.build_plan(cfg, parse("moe_sum_norm_fused")).triton_kernels - P.build_plan(cfg).triton_kernels == delta
    for other in ("triton_linear+latent_norm_folded", "triton_linear+moe_tail_fused"):
        assert P.build_plan(FULL, parse(f"{other}+moe_sum_norm_fused")).segments == P.build_plan(FULL, parse(other)).segments


def test_moe_down_atomic_applies_at_b1_where_no_other_tail_takes_the_sum():
    """B = 1 only; the down GEMM keeps its kernel and grid, the weighted sum goes and the norm
    stays; with the tails that read the expert rows or form the sum otherwise, nothing changes."""
    for B, delta in ((1, -92), (8, 0), (64, 0)):
        cfg = FULL.with_(batch=B)
        assert P.build_plan(cfg, parse("moe_down_atomic")).triton_kernels - P.build_plan(cfg).triton_kernels == delta
    names = P.build_plan(FULL, parse("moe_down_atomic")).triton_kernel_names()
    assert (P.build_plan(FULL).triton_kernel_names() - names) == Counter({"moe_weighted_sum_kernel": 92})
    for other in ("triton_linear+latent_norm_folded", "triton_linear+moe_tail_fused", "moe_down_mixed",
                  "moe_sum_norm_fused"):
        assert P.build_plan(FULL, parse(f"{other}+moe_down_atomic")).segments == P.build_plan(FULL, parse(other)).segments


def test_situ_in_gate_up_applies_at_b1_without_situ_fused():
    for B, delta in ((1, -92), (8, 0), (64, 0)):
        cfg = FULL.with_(batch=B)
        assert P.build_plan(cfg, parse("situ_in_gate_up")).triton_kernels - P.build_plan(cfg).triton_kernels == delta
    names = P.build_plan(FULL, parse("situ_in_gate_up")).triton_kernel_names()
    assert (P.build_plan(FULL).triton_kernel_names() - names) == Counter({"situ_mul_kernel": 92})  # the shared one stays
    assert P.build_plan(FULL, parse("situ_fused+situ_in_gate_up")).segments == P.build_plan(FULL, parse("situ_fused")).segments


def test_shared_in_up_takes_the_shared_down_gemm_at_b1():
    """With the skinny up GEMM at B = 1 the shared experts' cuBLAS GEMM goes (92 calls) and S1
    joins main before the up GEMM, not after it; at B = 8, without triton_linear or with a tail
    that forms the up GEMM's operand otherwise, nothing changes."""
    base, p = P.build_plan(FULL, parse("triton_linear")), P.build_plan(FULL, parse("triton_linear+shared_in_up"))
    assert base.cublas_calls - p.cublas_calls == 92 and p.triton_kernels == base.triton_kernels
    for seg in p.segments:
        if seg.family == "moe":
            names = [type(i).__name__ if not isinstance(i, P.Launch) else i.subop for i in seg.items]
            assert P.SHARED_DOWN not in names and names.index("Join") == names.index(P.UP) - 1
    for other in ("triton_linear+shared_in_up@8", "shared_in_up", "triton_linear+moe_tail_fused+shared_in_up",
                  "triton_linear+latent_norm_folded+shared_in_up", "triton_linear+moe_sum_norm_fused+shared_in_up"):
        name, _, b = other.partition("@")
        cfg = FULL.with_(batch=int(b or 1))
        plain = name.replace("+shared_in_up", "").replace("shared_in_up", "baseline")
        assert P.build_plan(cfg, parse(name)).segments == P.build_plan(cfg, parse(plain)).segments, other


def test_moe_down_mixed_applies_at_b1_and_before_the_sum_norm():
    """B = 1 only (B = 8 keeps the grouped GEMM and the sum); not with the tails that read the
    expert rows or the sum's sums of squares; with moe_sum_norm_fused it takes the sum and the
    norm keeps its own launch; with situ_fused the routed SiTU goes as well."""
    for B, delta in ((1, -92), (8, 0), (64, 0)):
        cfg = FULL.with_(batch=B)
        assert P.build_plan(cfg, parse("moe_down_mixed")).triton_kernels - P.build_plan(cfg).triton_kernels == delta
    for other in ("triton_linear+latent_norm_folded", "triton_linear+moe_tail_fused"):
        assert P.build_plan(FULL, parse(f"{other}+moe_down_mixed")).segments == P.build_plan(FULL, parse(other)).segments
    assert (P.build_plan(FULL, parse("moe_sum_norm_fused+moe_down_mixed")).segments
            == P.build_plan(FULL, parse("moe_down_mixed")).segments)
    both = P.build_plan(FULL, parse("situ_fused+moe_down_mixed"))
    assert both.triton_kernels - P.build_plan(FULL).triton_kernels == -2 * 92
    moe_kernels = {k for seg in both.segments if seg.family == "moe" for l in seg.launches for k in l.kernels}
    assert "moe_down_mix_kernel" in moe_kernels and "moe_weighted_sum_kernel" not in moe_kernels


def test_attn_res_one_pass_applies_at_b1_and_alone():
    """B = 1 only; not where the score goes elsewhere (attn_res_in_o_proj, attn_res_fused)
    or its kernel changes (early rows, prefetch): those plans stay as they were."""
    for B, delta in ((1, -186), (8, 0), (64, 0)):
        cfg = FULL.with_(batch=B)
        assert P.build_plan(cfg, parse("attn_res_one_pass")).triton_kernels - P.build_plan(cfg).triton_kernels == delta
    for other in ("triton_linear+triton_o_proj+attn_res_dot+attn_res_in_o_proj", "attn_res_fused",
                  "attn_res_early_rows", "prefetch:8"):
        assert (P.build_plan(FULL, parse(f"{other}+attn_res_one_pass")).segments
                == P.build_plan(FULL, parse(other)).segments)
    kernels = {k for seg in P.build_plan(FULL, parse("attn_res_one_pass")).segments
               if seg.family == "attn_res" for l in seg.launches for k in l.kernels}
    assert kernels == {"attn_res_one_pass_kernel"}


def test_mla_proj_merged_takes_three_gemms_and_the_gate_leg():
    """B <= 16: per MLA layer one skinny GEMM for three cuBLAS calls, before the KV fork;
    no g_proj leg on S2. B = 64 keeps the baseline plan."""
    base, p = P.build_plan(FULL), P.build_plan(FULL, parse("mla_proj_merged"))
    assert p.triton_kernels - base.triton_kernels == 24
    assert base.cublas_calls - p.cublas_calls == 3 * 24
    assert p.forks() == Counter({P.AUX1: 24 + 92, P.AUX2: 69})
    mla = next(s for s in p.segments if s.family == "mla")
    first = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in mla.items[:3]]
    assert first == [("Launch", P.X_PROJ), ("Fork", P.AUX1), ("Launch", P.Q_A_NORM)]
    assert mla.items[0].launcher == "skinny_mm" and mla.items[0].stream == P.MAIN
    assert not {P.Q_A, P.KV_A, P.G_PROJ} & {l.subop for l in mla.launches}
    b64 = FULL.with_(batch=64)
    assert P.build_plan(b64, parse("mla_proj_merged")).segments == P.build_plan(b64).segments
    assert FULL.x_proj_width == 1536 + 576 + 1536


def test_triton_o_proj_takes_the_attention_outputs():
    base, p = P.build_plan(FULL, parse("triton_linear")), P.build_plan(FULL, parse("triton_linear+triton_o_proj"))
    assert base.cublas_calls - p.cublas_calls == p.triton_kernels - base.triton_kernels == 69 + 24
    assert {(s.family, l.subop) for s, l in p.launches() if l.launcher == "skinny_mm"} == {
        ("kda", P.QKVG), ("moe", P.FRONT), ("moe", P.UP), ("kda", P.O_PROJ), ("mla", P.O_PROJ)}
    assert P.build_plan(FULL, parse("triton_o_proj")).segments == P.build_plan(FULL).segments  # needs triton_linear


def test_linear_gluon_takes_the_kda_o_proj_at_one_token():
    name = "triton_linear+triton_o_proj+linear_gluon"
    base, p = P.build_plan(FULL, parse("triton_linear+triton_o_proj")), P.build_plan(FULL, parse(name))
    assert p.triton_kernels == base.triton_kernels and p.cublas_calls == base.cublas_calls
    assert {(s.family, l.subop) for s, l in p.launches() if l.launcher == "skinny_gl"} == {("kda", P.O_PROJ)}
    assert (base.triton_kernel_names() - p.triton_kernel_names()) == Counter({"skinny_mm_kernel": 69})
    assert (p.triton_kernel_names() - base.triton_kernel_names()) == Counter({"skinny_gl_kernel": 69})
    # B = 8, or without the skinny GEMMs: nothing changes.
    b8 = FULL.with_(batch=8)
    assert P.build_plan(b8, parse(name)).segments == P.build_plan(b8, parse("triton_linear+triton_o_proj")).segments
    assert P.build_plan(FULL, parse("linear_gluon")).segments == P.build_plan(FULL).segments


def test_linear_ws_warp_specializes_linear_gluons_gemms():
    name = "triton_linear+triton_o_proj+linear_gluon"
    gl, ws = P.build_plan(FULL, parse(name)), P.build_plan(FULL, parse(f"{name}+linear_ws"))
    assert {(s.family, l.subop) for s, l in ws.launches() if l.launcher == "skinny_ws"} == {("kda", P.O_PROJ)}
    assert not any(l.launcher == "skinny_gl" for _, l in ws.launches())
    assert (ws.triton_kernel_names() - gl.triton_kernel_names()) == Counter({"skinny_ws_kernel": 69})
    assert (gl.triton_kernel_names() - ws.triton_kernel_names()) == Counter({"skinny_gl_kernel": 69})
    # Without linear_gluon, or at B = 8, it changes nothing.
    assert P.build_plan(FULL, parse("triton_linear+triton_o_proj+linear_ws")).segments == \
        P.build_plan(FULL, parse("triton_linear+triton_o_proj")).segments
    b8 = FULL.with_(batch=8)
    assert P.build_plan(b8, parse(f"{name}+linear_ws")).segments == P.build_plan(b8, parse(name)).segments


def test_linear_gluon_subops_name_a_family_or_all(monkeypatch):
    monkeypatch.setattr(P, "GLUON_SUBOPS", {P.O_PROJ})
    p = P.build_plan(FULL, parse("triton_linear+triton_o_proj+linear_gluon"))
    assert {(s.family, l.subop) for s, l in p.launches() if l.launcher == "skinny_gl"} == {
        ("kda", P.O_PROJ), ("mla", P.O_PROJ)}


def test_triton_mla_proj_takes_the_narrow_mla_gemms():
    base, p = P.build_plan(FULL, parse("triton_linear")), P.build_plan(FULL, parse("triton_linear+triton_mla_proj"))
    assert base.cublas_calls - p.cublas_calls == p.triton_kernels - base.triton_kernels == 4 * 24
    mla = {l.subop for s, l in p.launches() if s.family == "mla" and l.launcher == "skinny_mm"}
    assert mla == {P.Q_A, P.KV_A, P.G_PROJ, P.Q_B}
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kernels.k3.ops.gemv import MLA_SPLITS

    c = FULL  # every one of them has a split (too few column blocks unsplit)
    assert set(MLA_SPLITS) == {(c.hidden, c.q_lora), (c.hidden, c.kv_a_width), (c.q_lora, c.q_b_width)}


def test_attn_res_fused_fits_like_the_op():
    """The plan's rule for the fused launch is the op's (its programs fit one per SM)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kernels.k3.ops.attn_res import attn_res_fused_fits

    for B in (1, 8, 9, 10, 64):
        cfg = K3Config(batch=B)
        assert P.attn_res_fuses(cfg, parse("attn_res_fused")) == attn_res_fused_fits(B, cfg.hidden, cfg.sm_count)
    assert not P.attn_res_fuses(K3Config(batch=1), parse("baseline"))


def test_router_fork_streams():
    """Seed 003: router GEMV, top-k and align on S2, forked before the front GEMM and joined
    before the first grouped GEMM; the shared-expert leg stays on S1."""
    p = P.build_plan(FULL, parse("router_fork"))
    moe = next(s for s in p.segments if s.family == "moe")
    order = [(type(i).__name__, getattr(i, "subop", getattr(i, "side", ""))) for i in moe.items]
    assert order[:4] == [("Fork", P.AUX2), ("Launch", P.ROUTER_GEMV), ("Launch", P.ROUTER),
                         ("Launch", P.ALIGN)]
    assert all(l.stream == P.AUX2 for l in moe.launches[:3])
    assert order.index(("Join", P.AUX2)) < order.index(("Launch", P.EXPERT_GATE_UP))
    assert order.index(("Launch", P.FRONT)) < order.index(("Fork", P.AUX1))
    assert p.forks()[P.AUX2] - P.build_plan(FULL).forks()[P.AUX2] == 92
    # B > 1 keeps the baseline head (measured slower forked at B = 8).
    b8 = K3Config(batch=8)
    assert P.build_plan(b8, parse("router_fork")).segments == P.build_plan(b8).segments


def test_tiny_config_keeps_the_structure():
    t = tiny_config()
    assert [t.attention_family(l) for l in t.layers] == ["kda", "kda", "kda", "mla"]
    assert t.kv_a_width == t.kv_lora + t.qk_rope
    assert P.build_plan(t).family_counts()["attn_res"] == 8


def test_full_depth_constant():
    assert FULL_DEPTH == 93 == FULL.num_layers


def test_model_spec_maps_record_loop_args():
    from argparse import Namespace

    from kernels.k3 import model_spec

    base = {"batch": 8, "layers": 0, "variant": "baseline", "delay_kernel": "", "delay_ns": 0,
            "no_fork": False}
    cfg, v = model_spec(Namespace(**base))
    assert (cfg.batch, cfg.num_layers, cfg.context, v) == (8, 93, 8192, BASELINE)
    cfg, v = model_spec(Namespace(**{**base, "layers": 4, "no_fork": True,
                                     "variant": "router_multipass"}))
    assert cfg.num_layers == 4 and not v.attn_forks and v.router_multipass
    _, v = model_spec(Namespace(**{**base, "delay_kernel": "kda_step_kernel", "delay_ns": 4000}))
    assert v == parse("delay:kda_step_kernel:4000")
    with pytest.raises(ValueError):
        model_spec(Namespace(**{**base, "variant": "delay_kda_step"}))  # not a K3 variant name
