"""Kimi Delta Attention decode: short conv + SiLU, the gated delta-rule step, gated RMSNorm.

Per rank: NH = 12 heads, DK = DV = 128 (sizes come from tensor shapes, so the tiny test
model works too). Layouts:
- qkvg `[B, 4*NH*D]` = q | k | v | g (the qkvg GEMM output); the conv runs over q, k, v.
- conv_state `[slots, 3, C]` (C = 2*NH*DK + NH*DV): the 3 previous inputs, oldest first;
  conv_w `[C, 4]`, tap 3 multiplies the new input (causal_conv1d_update's convention).
- fab `[B, F + NH]` = f_a (F, consumed by the f_b GEMM) | b (NH beta logits).
- fb `[B, NH*DK]` = f, the gate pre-activation; A_log `[NH]`, dt_bias `[NH*DK]` fp32.
- state `[slots, NH, DV, DK]` fp32, indexed by slot_idx `[B]` int32.

The step, per (token, head), state S[v, k]:
    q^ = q * rsqrt(sum q^2 + 1e-6) * DK^-1/2,  k^ = k * rsqrt(sum k^2 + 1e-6)
    alpha[k] = exp(-5 * sigmoid(exp(A_log[h]) * (f[k] + dt_bias[k]))),  beta = sigmoid(b[h])
    S *= alpha[None, :];  u = beta * (v - S @ k^);  S += u[:, None] * k^[None, :];  o = S @ q^
    out = o * rsqrt(mean(o^2) + eps) * norm_w * sigmoid(g)      (gated RMSNorm)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.k3.ops.common import (INTERPRET, cdiv, group_barrier, l2_prefetch, launch, next_pow2, pdl_trigger,
                                   pdl_wait, prefetch_args, spin, to_dtype)

EPS = 1e-6
L2_EPS = 1e-6
CONV_BLOCK = 256   # 18 programs per token at C = 4608
SPLIT_BV = 32      # unfused step: V split in 4 -> 48 programs at B = 1


# --------------------------------------------------------------------------------------
# Short convolution (width 4) + SiLU over the q, k, v channels.
# --------------------------------------------------------------------------------------
@triton.jit
def _conv_window(sp, conv_w, cs, cm, stride_sj):
    """Channels cs of one slot's window (its 3 older inputs, oldest first) and their taps:
    older data, read before the PDL wait. Returns the taps' sum over the 3 older inputs,
    the two inputs the shift keeps, and the newest input's tap."""
    s0 = tl.load(sp, mask=cm, other=0.0)
    s1 = tl.load(sp + stride_sj, mask=cm, other=0.0)
    s2 = tl.load(sp + 2 * stride_sj, mask=cm, other=0.0)
    w0 = tl.load(conv_w + cs * 4 + 0, mask=cm, other=0.0).to(tl.float32)
    w1 = tl.load(conv_w + cs * 4 + 1, mask=cm, other=0.0).to(tl.float32)
    w2 = tl.load(conv_w + cs * 4 + 2, mask=cm, other=0.0).to(tl.float32)
    w3 = tl.load(conv_w + cs * 4 + 3, mask=cm, other=0.0).to(tl.float32)
    older = w0 * s0.to(tl.float32) + w1 * s1.to(tl.float32) + w2 * s2.to(tl.float32)
    return older, s1, s2, w3


@triton.jit
def _conv_silu_shift(sp, stride_sj, x, older, s1, s2, w3, store_mask):
    """SiLU(conv4 over [window, x]) in fp32; the window shifts in place where store_mask."""
    acc = older + w3 * x.to(tl.float32)
    # Each program owns its channels of this slot's window, so programs cannot race; within
    # one, an element held by several threads must be loaded by all of them first (kda_step's
    # barrier; kda_conv_silu's 4 warps hold each of its 256 channels once).
    _conv_shift(sp, stride_sj, x, s1, s2, store_mask)
    return acc * tl.sigmoid(acc)


@triton.jit
def _conv_shift(sp, stride_sj, x, s1, s2, store_mask):
    """The window moves on by one input: [s1, s2, x], where store_mask."""
    tl.store(sp, s1, mask=store_mask)
    tl.store(sp + stride_sj, s2, mask=store_mask)
    tl.store(sp + 2 * stride_sj, to_dtype(x, sp.dtype.element_ty), mask=store_mask)


@triton.jit
def kda_conv_silu_kernel(qkvg, conv_state, conv_w, slot_idx, out, C,
                         stride_x, stride_ss, stride_sj, stride_out, pf, pf_bytes,
                         BLOCK: tl.constexpr, PF_CHUNKS: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = cs < C
    slot = tl.load(slot_idx + b).to(tl.int64)
    sp = conv_state + slot * stride_ss + cs
    older, s1, s2, w3 = _conv_window(sp, conv_w, cs, cm, stride_sj)
    pdl_wait(USE_PDL)
    x = tl.load(qkvg + b.to(tl.int64) * stride_x + cs, mask=cm, other=0.0)
    l2_prefetch(pf, pf_bytes, PF_CHUNKS)  # o_proj's weight, read after kda_step (prefetch:<MB>)
    y = _conv_silu_shift(sp, stride_sj, x, older, s1, s2, w3, cm)
    tl.store(out + b.to(tl.int64) * stride_out + cs, to_dtype(y, out.dtype.element_ty), mask=cm)
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def kda_conv_silu(qkvg: torch.Tensor, conv_state: torch.Tensor, conv_w: torch.Tensor,
                  slot_idx: torch.Tensor, out: torch.Tensor, *, prefetch: torch.Tensor | None = None,
                  prefetch_bytes: int = 0, delay_ns: int = 0) -> torch.Tensor:
    """out = SiLU(causal depthwise conv4 over [window, new]); the window shifts in place.
    `prefetch`: the first `prefetch_bytes` of this weight into L2 (common.l2_prefetch)."""
    B = qkvg.shape[0]
    _, taps, C = conv_state.shape
    assert taps == 3 and conv_w.shape == (C, 4) and conv_w.is_contiguous()
    assert qkvg.shape[1] >= C and qkvg.stride(1) == 1 and conv_state.stride(2) == 1
    assert out.shape == (B, C) and out.stride(1) == 1 and slot_idx.shape == (B,)
    launch(kda_conv_silu_kernel, (B, cdiv(C, CONV_BLOCK)), qkvg, conv_state, conv_w, slot_idx,
           out, C, qkvg.stride(0), conv_state.stride(0), conv_state.stride(1), out.stride(0),
           **prefetch_args(prefetch, prefetch_bytes, B * cdiv(C, CONV_BLOCK), out), BLOCK=CONV_BLOCK, num_warps=4, delay_ns=delay_ns)
    return out


# --------------------------------------------------------------------------------------
# Delta-rule step (+ fused gated RMSNorm epilogue).
# --------------------------------------------------------------------------------------
@triton.jit
def kda_step_kernel(qkv, fab, fb, A_log, dt_bias, g_out, state, slot_idx, norm_w, out,
                    conv_state, conv_w, partials, o_part, counters,
                    stride_qkv, stride_fab, stride_fb, stride_g, stride_out,
                    stride_ss, stride_sh, stride_cs, stride_cj, B_OFF, q_scale, eps,
                    NH: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                    FUSE_NORM: tl.constexpr, CONV: tl.constexpr, SPLIT: tl.constexpr, PHASE: tl.constexpr,
                    USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # CONV (variant kda_conv_fused, FUSE_NORM): qkv is the qkvg GEMM's output and the short conv +
    # SiLU of this head's q, k, v channels runs here, rounded to qkv's dtype as
    # kda_conv_silu's output is: the same numbers as the pair, one launch fewer.
    # SPLIT (variant kda_split_v, FUSE_NORM): DV / BV programs per head, each its V rows of the
    # state, meeting at a barrier of the head's programs for the norm's sum of squares; only
    # after it does the first one shift the q and k window rows all of them read. PHASE 1 / 2
    # (the interpreter, which runs programs one at a time): what comes before / after the
    # barrier, as two launches, o in o_part between them.
    if SPLIT:
        # A head's programs are neighbours in the launch order: they are resident together.
        vb = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
    else:
        b = tl.program_id(0)
        h = tl.program_id(1)
        vb = tl.program_id(2)
    ks = tl.arange(0, DK)
    vs = vb * BV + tl.arange(0, BV)
    slot = tl.load(slot_idx + b).to(tl.int64)
    sp = state + slot * stride_ss + h * stride_sh + vs[:, None] * DK + ks[None, :]
    qc = h * DK + ks
    kc = NH * DK + h * DK + ks
    vc = 2 * NH * DK + h * DV + vs
    row = qkv + b.to(tl.int64) * stride_qkv
    ob = out + b.to(tl.int64) * stride_out + h * DV + vs
    if CONV:
        win = conv_state + slot * stride_cs
        all_k = ks < DK
        all_v = vs < DV
    if PHASE != 2:
        # The recurrent state is last step's data: issue its (large) load before the wait.
        S = tl.load(sp)
        a_h = tl.exp(tl.load(A_log + h).to(tl.float32))
        dtb = tl.load(dt_bias + h * DK + ks).to(tl.float32)
        if FUSE_NORM:
            nw = tl.load(norm_w + vs).to(tl.float32)
            if not CONV:
                # g comes from the qkvg GEMM, which precedes the conv kernel: older than our producer.
                gate = tl.load(g_out + b.to(tl.int64) * stride_g + h * DV + vs).to(tl.float32)
        if CONV:
            q_old, q_s1, q_s2, q_w3 = _conv_window(win + qc, conv_w, qc, all_k, stride_cj)
            k_old, k_s1, k_s2, k_w3 = _conv_window(win + kc, conv_w, kc, all_k, stride_cj)
            v_old, v_s1, v_s2, v_w3 = _conv_window(win + vc, conv_w, vc, all_v, stride_cj)
        # fab / fb come from the S2 GEMMs: with forks off one may be our direct producer.
        pdl_wait(USE_PDL)
        if CONV:
            if FUSE_NORM:
                # g: our producer's output now (the qkvg GEMM), so after the wait.
                gate = tl.load(g_out + b.to(tl.int64) * stride_g + h * DV + vs).to(tl.float32)
            # One program per head (the fused norm's grid): it owns the head's window rows. But at
            # 8 warps a 128-wide vector is held twice over (256 threads), and the store of an
            # element comes from one holder while the other may not have loaded it yet: every
            # window load completes in the CTA before any shift is stored. Without the barrier
            # plain launches (no_pdl, where the wait above compiles out) gave run-to-run
            # different states; the PDL wait only made the race unlikely.
            tl.debug_barrier()
            if SPLIT:
                qk_shift = ks < 0  # every program of the head reads them: shifted after the barrier
            else:
                qk_shift = all_k
            x_q = tl.load(row + qc)
            q = _conv_silu_shift(win + qc, stride_cj, x_q, q_old, q_s1, q_s2, q_w3, qk_shift)
            x_k = tl.load(row + kc)
            k = _conv_silu_shift(win + kc, stride_cj, x_k, k_old, k_s1, k_s2, k_w3, qk_shift)
            v = _conv_silu_shift(win + vc, stride_cj, tl.load(row + vc), v_old, v_s1, v_s2, v_w3, all_v)
            q = to_dtype(q, qkv.dtype.element_ty).to(tl.float32)
            k = to_dtype(k, qkv.dtype.element_ty).to(tl.float32)
            v = to_dtype(v, qkv.dtype.element_ty).to(tl.float32)
        else:
            q = tl.load(row + qc).to(tl.float32)
            k = tl.load(row + kc).to(tl.float32)
            v = tl.load(row + vc).to(tl.float32)
        f = tl.load(fb + b.to(tl.int64) * stride_fb + h * DK + ks).to(tl.float32)
        beta = tl.sigmoid(tl.load(fab + b.to(tl.int64) * stride_fab + B_OFF + h).to(tl.float32))
        q = q * (tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * q_scale)
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        alpha = tl.exp(-5.0 * tl.sigmoid(a_h * (f + dtb)))
        S = S * alpha[None, :]
        u = beta * (v - tl.sum(S * k[None, :], 1))
        S = S + u[:, None] * k[None, :]
        o = tl.sum(S * q[None, :], 1)
        tl.store(sp, S)
    if SPLIT:
        head = b.to(tl.int64) * NH + h
        pp = partials + head * (DV // BV)
        if PHASE != 2:
            tl.store(pp + vb, tl.sum(o * o, 0))
        if PHASE == 1:
            tl.store(o_part + head * DV + vs, o)
        if PHASE == 0:
            group_barrier(counters + head, tl.num_programs(0), vb == 0)
        if PHASE == 2:
            o = tl.load(o_part + head * DV + vs)
            nw = tl.load(norm_w + vs).to(tl.float32)
            gate = tl.load(g_out + b.to(tl.int64) * stride_g + h * DV + vs).to(tl.float32)
            if CONV:
                x_q = tl.load(row + qc)
                x_k = tl.load(row + kc)
                q_old, q_s1, q_s2, q_w3 = _conv_window(win + qc, conv_w, qc, all_k, stride_cj)
                k_old, k_s1, k_s2, k_w3 = _conv_window(win + kc, conv_w, kc, all_k, stride_cj)
        if PHASE != 1:
            # The head's sum of squares: its programs' partials, added in program order.
            ss = tl.sum(tl.load(pp + tl.arange(0, DV // BV)), 0)
            y = o * tl.rsqrt(ss / DV + eps) * nw * tl.sigmoid(gate)
            tl.store(ob, to_dtype(y, out.dtype.element_ty))
            if CONV:
                first = all_k & (vb == 0)
                _conv_shift(win + qc, stride_cj, x_q, q_s1, q_s2, first)
                _conv_shift(win + kc, stride_cj, x_k, k_s1, k_s2, first)
    elif FUSE_NORM:
        # Normalise the fp32 accumulator directly (no o round trip through memory).
        y = o * tl.rsqrt(tl.sum(o * o, 0) / DV + eps) * nw * tl.sigmoid(gate)
        tl.store(ob, to_dtype(y, out.dtype.element_ty))
    else:
        tl.store(ob, to_dtype(o, out.dtype.element_ty))
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


@triton.jit
def kda_gated_rmsnorm_kernel(o, g_out, norm_w, out, stride_o, stride_g, stride_out, eps,
                             DV: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vs = tl.arange(0, DV)
    nw = tl.load(norm_w + vs).to(tl.float32)
    # g comes from the qkvg GEMM, two kernels before our producer (kda_step): older data.
    gate = tl.load(g_out + b * stride_g + h * DV + vs).to(tl.float32)
    pdl_wait(USE_PDL)
    x = tl.load(o + b * stride_o + h * DV + vs).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 0) / DV + eps) * nw * tl.sigmoid(gate)
    tl.store(out + b * stride_out + h * DV + vs, to_dtype(y, out.dtype.element_ty))
    spin(DELAY_NS)  # before the trigger: the delay must show as this kernel's own time
    pdl_trigger(USE_PDL)


def _step_shapes(qkv, fab, fb, A_log, dt_bias, state, slot_idx, conv=None):
    B = qkv.shape[0]
    _, NH, DV, DK = state.shape
    C = 2 * NH * DK + NH * DV
    assert state.dtype == torch.float32 and state.stride(3) == 1 and state.stride(2) == DK
    assert DK == next_pow2(DK) and DV == next_pow2(DV)
    if conv is None:
        assert qkv.shape == (B, C) and qkv.stride(1) == 1
    else:  # qkvg: q | k | v | g, of which the conv reads the first C channels
        conv_state, conv_w = conv
        assert qkv.shape[0] == B and qkv.shape[1] >= C and qkv.stride(1) == 1
        assert conv_state.shape[1:] == (3, C) and conv_state.stride(2) == 1 and conv_state.dtype == qkv.dtype
        assert conv_w.shape == (C, 4) and conv_w.is_contiguous()
    assert fab.shape[0] == B and fab.shape[1] >= NH and fab.stride(1) == 1
    assert fb.shape == (B, NH * DK) and fb.stride(1) == 1
    assert A_log.shape == (NH,) and dt_bias.shape == (NH * DK,) and slot_idx.shape == (B,)
    return B, NH, DV, DK


@dataclass(frozen=True)
class SplitScratch:
    """kda_split_v's buffers: the programs' partial sums of squares `[B * NH * DV / SPLIT_BV]`,
    one barrier counter per (token, head) `[B * NH]` int32 (zeroed once, never reset: every
    crossing adds 2^31), and o `[B, NH * DV]` fp32 between the interpreter's two launches."""

    partials: torch.Tensor
    counters: torch.Tensor
    o_part: torch.Tensor

    @classmethod
    def allocate(cls, batch: int, heads: int, dv: int, device) -> "SplitScratch":
        return cls(torch.zeros(batch * heads * (dv // min(SPLIT_BV, dv)), device=device, dtype=torch.float32),
                   torch.zeros(batch * heads, device=device, dtype=torch.int32),
                   torch.zeros(batch, heads * dv, device=device, dtype=torch.float32))


def kda_step(qkv: torch.Tensor, fab: torch.Tensor, fb: torch.Tensor, A_log: torch.Tensor,
             dt_bias: torch.Tensor, g_out: torch.Tensor, state: torch.Tensor,
             slot_idx: torch.Tensor, norm_w: torch.Tensor, out: torch.Tensor, *,
             fuse_norm: bool = True, o_scratch: torch.Tensor | None = None, eps: float = EPS,
             conv: tuple[torch.Tensor, torch.Tensor] | None = None, split: SplitScratch | None = None,
             delay_ns: int = 0) -> torch.Tensor:
    """One delta-rule step per (token, head), state updated in place.

    fuse_norm=True: out = gated RMSNorm of o (grid (B, NH): the norm needs all of V).
    fuse_norm=False: o (fp32 or bf16) goes to o_scratch; grid (B, NH, DV/32) keeps more
    programs busy at small B; run `kda_gated_rmsnorm(o_scratch, g_out, norm_w, out)` next.
    conv = (conv_state, conv_w) (variant kda_conv_fused; fuse_norm only): qkv is the qkvg
    GEMM's output and kda_conv_silu runs inside, window shift included; bit for bit the
    pair's results. (With V split, every program of a head reads q's and k's window, so
    none could shift it in place without the split form's barrier.)
    split (variant kda_split_v; fuse_norm only): the fused norm on the V-split grid
    (DV/32, NH, B), a head's programs meeting at a barrier for the sum of squares, the
    first of them shifting the q and k window rows after it (with conv). The state, and
    o before the norm, are the V-split step's bit for bit; the norm adds the head's four
    partial sums, not 128 squares in one reduction.
    Returns the tensor written (out or o_scratch).
    """
    B, NH, DV, DK = _step_shapes(qkv, fab, fb, A_log, dt_bias, state, slot_idx, conv)
    assert conv is None or fuse_norm, "the conv runs inside the step on the fused norm's grid only"
    assert split is None or fuse_norm, "the split step fuses the norm"
    phases = (0,)
    if split is not None:
        assert out.shape == (B, NH * DV) and out.stride(1) == 1
        assert g_out.shape == (B, NH * DV) and g_out.stride(1) == 1 and norm_w.shape == (DV,)
        BV = min(SPLIT_BV, DV)
        assert split.partials.numel() >= B * NH * (DV // BV) and split.counters.numel() >= B * NH
        assert split.o_part.shape[0] >= B and split.o_part.shape[1] == NH * DV
        dst, grid, warps = out, (DV // BV, NH, B), 4
        # The interpreter runs one program at a time: a barrier would never release.
        phases = (1, 2) if INTERPRET else (0,)
    elif fuse_norm:
        assert out.shape == (B, NH * DV) and out.stride(1) == 1
        assert g_out.shape == (B, NH * DV) and g_out.stride(1) == 1 and norm_w.shape == (DV,)
        dst, BV, warps = out, DV, 8  # [128, 128] fp32 state tile: 64 registers/thread at 8 warps
        grid = (B, NH, 1)
    else:
        assert o_scratch is not None and o_scratch.shape == (B, NH * DV) and o_scratch.stride(1) == 1
        dst, BV, warps = o_scratch, min(SPLIT_BV, DV), 4
        grid = (B, NH, DV // BV)
    conv_state, conv_w = conv if conv is not None else (state, state)
    partials, o_part, counters = (split.partials, split.o_part, split.counters) if split else (state, state, slot_idx)
    for phase in phases:
        launch(kda_step_kernel, grid, qkv, fab, fb, A_log, dt_bias, g_out, state,
               slot_idx, norm_w, dst, conv_state, conv_w, partials, o_part, counters, qkv.stride(0), fab.stride(0),
               fb.stride(0), g_out.stride(0), dst.stride(0), state.stride(0), state.stride(1), conv_state.stride(0),
               conv_state.stride(1), fab.shape[1] - NH, DK ** -0.5, eps,
               NH=NH, DK=DK, DV=DV, BV=BV, FUSE_NORM=fuse_norm, CONV=conv is not None, SPLIT=split is not None,
               PHASE=phase, num_warps=warps, delay_ns=delay_ns)
    return dst


def kda_gated_rmsnorm(o: torch.Tensor, g_out: torch.Tensor, norm_w: torch.Tensor, out: torch.Tensor,
                      *, eps: float = EPS, delay_ns: int = 0) -> torch.Tensor:
    """out = RMSNorm_DV(o) * norm_w * sigmoid(g_out), per head of DV = norm_w.shape[0]."""
    B, N = o.shape
    DV = norm_w.shape[0]
    assert N % DV == 0 and DV == next_pow2(DV) and o.stride(1) == 1
    assert g_out.shape == (B, N) and g_out.stride(1) == 1 and out.shape == (B, N) and out.stride(1) == 1
    launch(kda_gated_rmsnorm_kernel, (B, N // DV), o, g_out, norm_w, out, o.stride(0),
           g_out.stride(0), out.stride(0), eps, DV=DV, num_warps=1 if DV <= 128 else 4,
           delay_ns=delay_ns)
    return out
