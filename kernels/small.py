"""A small decode-shaped workload: the seed of the K3 path, sized to record in seconds.

Each layer has the K3 segment layout (attn_res before attention, KDA or MLA attention,
attn_res before the MLP, MoE), two side streams with event fork/join, PDL-launched
Triton kernels between cuBLAS GEMMs, and NVTX ranges named by `k3names`. The math is
real but small (hidden 1024); timing structure, not model quality, is the point.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import k3names
from kernels.k3.ops.common import spin as _spin  # spins before the trigger (see there)
from kernels.streams import Streams, fork, join, nvtx_range, on

# The Triton interpreter (CPU tests) has no griddepcontrol; on a GPU every kernel uses it.
PDL = os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def attn_res_score_kernel(bank, w, scores, R: tl.constexpr, H: tl.constexpr,
                          USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.arange(0, H)
    wv = tl.load(w + offs).to(tl.float32)  # weights do not depend on the producer
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    for r in tl.static_range(R):
        row = tl.load(bank + (r * tl.num_programs(0) + b) * H + offs).to(tl.float32)
        rms = tl.sqrt(tl.sum(row * row) / H + 1e-6)
        tl.store(scores + b * R + r, tl.sum(row * wv) / rms)
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def attn_res_combine_kernel(bank, scores, gamma, out, R: tl.constexpr, H: tl.constexpr,
                            USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.arange(0, H)
    g = tl.load(gamma + offs).to(tl.float32)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    rs = tl.arange(0, R)
    s = tl.load(scores + b * R + rs)
    p = tl.exp(s - tl.max(s, 0))
    p = p / tl.sum(p, 0)
    acc = tl.zeros([H], dtype=tl.float32)
    for r in tl.static_range(R):
        pr = tl.sum(tl.where(rs == r, p, 0.0), 0)
        acc += pr * tl.load(bank + (r * tl.num_programs(0) + b) * H + offs).to(tl.float32)
    rms = tl.sqrt(tl.sum(acc * acc) / H + 1e-6)
    tl.store(out + b * H + offs, (acc / rms * g).to(out.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def kda_conv_silu_kernel(x, conv_state, y, C: tl.constexpr, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    # Older state is producer-independent: read it before the wait.
    s0 = tl.load(conv_state + (b * 3 + 0) * C + offs).to(tl.float32)
    s1 = tl.load(conv_state + (b * 3 + 1) * C + offs).to(tl.float32)
    s2 = tl.load(conv_state + (b * 3 + 2) * C + offs).to(tl.float32)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    xv = tl.load(x + b * C + offs).to(tl.float32)
    acc = 0.1 * s0 + 0.2 * s1 + 0.3 * s2 + 0.4 * xv
    tl.store(conv_state + (b * 3 + 0) * C + offs, s1.to(conv_state.dtype.element_ty))
    tl.store(conv_state + (b * 3 + 1) * C + offs, s2.to(conv_state.dtype.element_ty))
    tl.store(conv_state + (b * 3 + 2) * C + offs, xv.to(conv_state.dtype.element_ty))
    tl.store(y + b * C + offs, (acc * tl.sigmoid(acc)).to(y.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def kda_gate_kernel(x, w, gate, H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    g = tl.zeros([BLOCK_D], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        wv = tl.load(w + hs[:, None] * D + ds[None, :]).to(tl.float32)
        xv = tl.load(x + b * H + hs).to(tl.float32)
        g += tl.sum(xv[:, None] * wv, 0)
    tl.store(gate + b * D + ds, tl.exp(-5.0 * tl.sigmoid(g)))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def kda_step_kernel(qkv, gate, state, out, D: tl.constexpr,
                    USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # One head of size D per program: S <- diag(a) S; u = v - S^T k; S += k u^T; o = S^T q.
    b = tl.program_id(0)
    h = tl.program_id(1)
    nh = tl.num_programs(1)
    ks = tl.arange(0, D)
    base = ((b * nh + h) * D) * D
    S = tl.load(state + base + ks[:, None] * D + ks[None, :])
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    row = (b * 3 * nh) * D
    q = tl.load(qkv + row + h * D + ks).to(tl.float32)
    k = tl.load(qkv + row + (nh + h) * D + ks).to(tl.float32)
    v = tl.load(qkv + row + (2 * nh + h) * D + ks).to(tl.float32)
    a = tl.load(gate + (b * nh + h) * D + ks)
    q = q / tl.sqrt(tl.sum(q * q) + 1e-6)
    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    S = S * a[:, None]
    u = v - tl.sum(S * k[:, None], 0)
    S = S + k[:, None] * u[None, :]
    o = tl.sum(S * q[:, None], 0)
    tl.store(state + base + ks[:, None] * D + ks[None, :], S)
    tl.store(out + (b * nh + h) * D + ks, o.to(out.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def mla_qconcat_cache_kernel(q, kv, cache, q_out, pos, D: tl.constexpr,
                             USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    ds = tl.arange(0, D)
    p = tl.load(pos + b)  # slot mapping: older data, read before the wait
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    qv = tl.load(q + b * D + ds)
    kvv = tl.load(kv + b * D + ds)
    tl.store(q_out + b * D + ds, qv)
    tl.store(cache + (b * 1024 + p) * D + ds, kvv)
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def mla_decode_fmha_kernel(q, cache, out, ctx, D: tl.constexpr, BLOCK_N: tl.constexpr,
                           USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    ds = tl.arange(0, D)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    qv = tl.load(q + b * D + ds).to(tl.float32)
    m = tl.zeros([], dtype=tl.float32) - float("inf")
    l = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    for start in range(0, ctx, BLOCK_N):
        ns = start + tl.arange(0, BLOCK_N)
        kblk = tl.load(cache + (b * 1024 + ns[:, None]) * D + ds[None, :],
                       mask=ns[:, None] < ctx, other=0.0).to(tl.float32)
        s = tl.where(ns < ctx, tl.sum(kblk * qv[None, :], 1) * 0.03, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        alpha = tl.exp(m - m_new)
        pexp = tl.exp(s - m_new)
        l = l * alpha + tl.sum(pexp, 0)
        acc = acc * alpha + tl.sum(pexp[:, None] * kblk, 0)
        m = m_new
    tl.store(out + b * D + ds, (acc / l).to(out.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def gate_mul_kernel(x, g, y, N: tl.constexpr, USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    ns = tl.arange(0, N)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    xv = tl.load(x + b * N + ns).to(tl.float32)
    gv = tl.load(g + b * N + ns).to(tl.float32)
    tl.store(y + b * N + ns, (xv * tl.sigmoid(gv)).to(y.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def moe_router_kernel(logits, bias, weights, E: tl.constexpr, K: tl.constexpr,
                      USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    es = tl.arange(0, E)
    bv = tl.load(bias + es)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    s = tl.sigmoid(tl.load(logits + b * E + es).to(tl.float32))
    sel = s + bv
    w = tl.zeros([E], dtype=tl.float32)
    for _ in tl.static_range(K):
        best = tl.argmax(sel, 0)
        w = tl.where(es == best, s, w)
        sel = tl.where(es == best, -float("inf"), sel)
    tl.store(weights + b * E + es, w / tl.sum(w, 0))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def moe_expert_kernel(x, weights, wexp, y, E: tl.constexpr, H: tl.constexpr,
                      USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    # Dense stand-in for routed experts: y = sum_e w_e * (x * wexp_e).
    b = tl.program_id(0)
    hs = tl.arange(0, H)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    xv = tl.load(x + b * H + hs).to(tl.float32)
    acc = tl.zeros([H], dtype=tl.float32)
    for e in range(E):
        we = tl.load(weights + b * E + e)
        acc += we * xv * tl.load(wexp + e * H + hs).to(tl.float32)
    tl.store(y + b * H + hs, acc.to(y.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def residual_add_kernel(acc, a, b_in, H: tl.constexpr, HAS_B: tl.constexpr,
                        USE_PDL: tl.constexpr, DELAY_NS: tl.constexpr):
    b = tl.program_id(0)
    hs = tl.arange(0, H)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    v = tl.load(acc + b * H + hs).to(tl.float32) + tl.load(a + b * H + hs).to(tl.float32)
    if HAS_B:
        v += tl.load(b_in + b * H + hs).to(tl.float32)
    tl.store(acc + b * H + hs, v.to(acc.dtype.element_ty))
    _spin(DELAY_NS)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@dataclass(frozen=True)
class SmallConfig:
    batch: int = 1
    layers: int = 8
    hidden: int = 1024
    heads: int = 4
    head_dim: int = 64
    experts: int = 64
    top_k: int = 4
    bank_rows: int = 4
    context: int = 512
    aux_fork: bool = True           # side-stream forks on (seed 001) or all on main
    delay_kernel: str = ""          # injected-delay variant: kernel function name
    delay_ns: int = 0

    def attention_family(self, layer: int) -> str:
        return "mla" if layer % 4 == 0 else "kda"


class SmallDecode:
    """Weights, caches and one decode step of the small workload."""

    def __init__(self, cfg: SmallConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = device
        g = torch.Generator(device="cpu").manual_seed(0)
        H, B, D, nh = cfg.hidden, cfg.batch, cfg.head_dim, cfg.heads

        def w(*shape, scale=None):
            t = torch.randn(*shape, generator=g) * (scale or shape[0] ** -0.5)
            return t.to(device=device, dtype=torch.bfloat16)

        self.layers = []
        for i in range(1, cfg.layers + 1):
            L = {
                "res_w": w(H, scale=0.1), "res_g": torch.ones(H, device=device, dtype=torch.bfloat16),
                "mlp_w": w(H, scale=0.1), "mlp_g": torch.ones(H, device=device, dtype=torch.bfloat16),
                "o": w(nh * D, H), "front": w(H, cfg.experts + H), "shared": w(H, H),
                "experts": w(cfg.experts, H, scale=1.0), "bias": torch.zeros(cfg.experts, device=device),
            }
            if cfg.attention_family(i) == "kda":
                L["qkv"] = w(H, 3 * nh * D)
                L["gate"] = w(H, nh * D)
                L["conv"] = torch.randn(B, 3, 3 * nh * D, generator=g).to(device, torch.bfloat16)
                L["state"] = torch.zeros(B, nh, D, D, device=device, dtype=torch.float32)
            else:
                L["q"] = w(H, nh * D)
                L["kv"] = w(H, nh * D)
                L["g"] = w(H, nh * D)
                L["cache"] = w(B * 1024, nh * D, scale=1.0)
            self.layers.append(L)
        self.pos = torch.full((B,), cfg.context - 1, device=device, dtype=torch.int32)
        self.bank = torch.randn(cfg.bank_rows, B, H, generator=g).to(device, torch.bfloat16)
        self.x = torch.empty(B, H, device=device, dtype=torch.bfloat16)
        self.scores = torch.empty(B, cfg.bank_rows, device=device, dtype=torch.float32)
        self.weights = torch.empty(B, cfg.experts, device=device, dtype=torch.float32)
        self.streams = Streams.create(device)

    def _launch(self, kernel, grid, *args, **meta):
        delay = self.cfg.delay_ns if kernel.fn.__name__ == self.cfg.delay_kernel else 0
        kernel[grid](*args, **meta, USE_PDL=PDL, DELAY_NS=delay, launch_pdl=PDL)

    def attn_res(self, layer: int, L: dict, w: str, gamma: str) -> torch.Tensor:
        cfg, B = self.cfg, self.cfg.batch
        acc = self.bank[-1]  # the partial block sum is the bank's last row
        with nvtx_range(k3names.layer_range(layer, "attn_res")):
            self._launch(attn_res_score_kernel, (B,), self.bank, L[w], self.scores,
                         R=cfg.bank_rows, H=cfg.hidden)
            self._launch(attn_res_combine_kernel, (B,), self.bank, self.scores, L[gamma], self.x,
                         R=cfg.bank_rows, H=cfg.hidden)
        return acc

    def kda(self, layer: int, L: dict, acc: torch.Tensor) -> None:
        cfg, B, nh, D = self.cfg, self.cfg.batch, self.cfg.heads, self.cfg.head_dim
        s = self.streams
        with nvtx_range(k3names.layer_range(layer, "kda")):
            side = fork(s.main, s.aux2, enabled=cfg.aux_fork)
            with on(side):
                gate = torch.empty(B, nh * D, device=self.device, dtype=torch.float32)
                self._launch(kda_gate_kernel, (B, nh * D // 64), self.x, L["gate"], gate, H=cfg.hidden,
                             D=nh * D, BLOCK_H=64, BLOCK_D=64)
            qkv = self.x @ L["qkv"]
            y = torch.empty_like(qkv)
            C = 3 * nh * D
            self._launch(kda_conv_silu_kernel, (B, C // 128), qkv, L["conv"], y, C=C, BLOCK=128)
            join(s.main, side, enabled=cfg.aux_fork)
            o = torch.empty(B, nh * D, device=self.device, dtype=torch.bfloat16)
            self._launch(kda_step_kernel, (B, nh), y, gate, L["state"], o, D=D)
            out = o @ L["o"]
            self._launch(residual_add_kernel, (B,), acc, out, out, H=cfg.hidden, HAS_B=False)

    def mla(self, layer: int, L: dict, acc: torch.Tensor) -> None:
        cfg, B, nh, D = self.cfg, self.cfg.batch, self.cfg.heads, self.cfg.head_dim
        s = self.streams
        with nvtx_range(k3names.layer_range(layer, "mla")):
            q = self.x @ L["q"]
            kv = self.x @ L["kv"]
            qc = torch.empty_like(q)
            self._launch(mla_qconcat_cache_kernel, (B,), q, kv, L["cache"], qc, self.pos, D=nh * D)
            side = fork(s.main, s.aux2, enabled=cfg.aux_fork)
            with on(side):
                g = self.x @ L["g"]
            o = torch.empty_like(q)
            self._launch(mla_decode_fmha_kernel, (B,), qc, L["cache"], o, cfg.context,
                         D=nh * D, BLOCK_N=16)
            join(s.main, side, enabled=cfg.aux_fork)
            og = torch.empty_like(o)
            self._launch(gate_mul_kernel, (B,), o, g, og, N=nh * D)
            out = og @ L["o"]
            self._launch(residual_add_kernel, (B,), acc, out, out, H=cfg.hidden, HAS_B=False)

    def moe(self, layer: int, L: dict, acc: torch.Tensor) -> None:
        cfg, B, E = self.cfg, self.cfg.batch, self.cfg.experts
        s = self.streams
        with nvtx_range(k3names.layer_range(layer, "moe")):
            front = self.x @ L["front"]
            side = fork(s.main, s.aux1, enabled=cfg.aux_fork)
            with on(side):
                shared = self.x @ L["shared"]
            logits = front[:, :E].contiguous()
            latent = front[:, E:].contiguous()
            self._launch(moe_router_kernel, (B,), logits, L["bias"], self.weights, E=E, K=cfg.top_k)
            routed = torch.empty_like(latent)
            self._launch(moe_expert_kernel, (B,), latent, self.weights, L["experts"], routed,
                         E=E, H=cfg.hidden)
            join(s.main, side, enabled=cfg.aux_fork)
            self._launch(residual_add_kernel, (B,), acc, routed, shared, H=cfg.hidden, HAS_B=True)

    def step(self) -> None:
        for i, L in enumerate(self.layers, start=1):
            acc = self.attn_res(i, L, "res_w", "res_g")
            getattr(self, self.cfg.attention_family(i))(i, L, acc)
            acc = self.attn_res(i, L, "mlp_w", "mlp_g")
            self.moe(i, L, acc)
