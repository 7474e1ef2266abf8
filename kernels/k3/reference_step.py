"""An unfused float reference of one whole `K3Decode.step()`, from the model's weights.

    ref = ReferenceDecode(model)      # snapshots the model's state *before* its step
    model.step(); out = ref.step(routing=model.routing)
    rel_err(model.hidden(), out.hidden)

Activations are float32 (GEMMs) / float64 (norms, attention, small reductions: the per-op
references of `kernels.k3.reference`); nothing is fused and no stream or variant applies.
Persistent state keeps the contract's storage dtypes, because storing is part of the math
the model defines: KDA state fp32, conv window and latent cache bf16 (the appended cache
row is rounded to bf16 like the model's). The reference carries its own copy of that
state from step to step, so several steps can be compared.

Routing is the one discontinuity: a bf16 logit one ulp off can swap the 16th and 17th
expert, after which outputs legitimately differ. `step(routing=...)` takes the model's
selection, checks that every expert it chose is within `route_tol` of the reference's own
top-k threshold (a near tie, not a bug), records the check, and computes the layer with
that selection (weights still from the reference's own scores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kernels.k3 import reference as R
from kernels.k3.model import DenseLayer, K3Decode, KDALayer, MLALayer, MoELayer

F32 = torch.float32


@dataclass
class RoutingCheck:
    layer: int
    differing_tokens: int        # tokens whose expert set differs from the reference's
    worst_margin: float          # max over chosen experts of (ref k-th key - chosen key), >= 0 when a swap


@dataclass
class StepResult:
    hidden: torch.Tensor         # [rows, B, H] float32: the bank after the step
    routing: list[RoutingCheck] = field(default_factory=list)

    @property
    def worst_route_margin(self) -> float:
        return max((r.worst_margin for r in self.routing), default=0.0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.float() @ w.float()


class ReferenceDecode:
    """Float reference of K3Decode: same weights (read from the model), own state copy."""

    def __init__(self, model: K3Decode, route_tol: float = 2e-2) -> None:
        self.m, self.cfg, self.route_tol = model, model.cfg, route_tol
        self.kda_state, self.conv_state, self.cache = {}, {}, {}
        for l, L in model.layers.items():
            if isinstance(L.attn, KDALayer):
                self.kda_state[l] = L.attn.state.clone()
                self.conv_state[l] = L.attn.conv_state.clone()
            else:
                self.cache[l] = L.attn.cache.clone()

    # ---- one step --------------------------------------------------------------------------
    def step(self, routing: Callable[[int], torch.Tensor] | None = None) -> StepResult:
        """One decode step; `routing(layer)` -> [B, top_k] ids to use (the model's)."""
        cfg, m = self.cfg, self.m
        res = StepResult(hidden=torch.empty(0))
        bank = torch.zeros(cfg.bank_capacity, cfg.batch, cfg.hidden, device=m.device, dtype=F32)
        bank[0] = m.embed.float()
        for l in cfg.layers:
            L = m.layers[l]
            k = cfg.partial_row(l)
            x = self._attn_res(bank, cfg.bank_rows(l, "attn"), L.pre_attn)
            a = self._kda(l, L.attn, x) if isinstance(L.attn, KDALayer) else self._mla(l, L.attn, x)
            bank[k] = a if cfg.opens_block(l) else bank[k] + a
            x = self._attn_res(bank, cfg.bank_rows(l, "mlp"), L.pre_mlp)
            if isinstance(L.mlp, MoELayer):
                y = self._moe(l, L.mlp, x, routing(l) if routing else None, res)
            else:
                y = self._dense(L.mlp, x)
            bank[k] = bank[k] + y
        res.hidden = bank[:cfg.bank_rows_max]
        return res

    # ---- sub-layers --------------------------------------------------------------------------
    def _attn_res(self, bank: torch.Tensor, n: int, w) -> torch.Tensor:
        logits, _ = R.ref_attn_res_score(bank, n, w.query)
        return R.ref_attn_res_combine(bank, n, logits, w.gamma, self.cfg.norm_eps).float()

    def _kda(self, l: int, w: KDALayer, x: torch.Tensor) -> torch.Tensor:
        cfg, m = self.cfg, self.m
        qkvg = _mm(x, w.qkvg)
        fab = _mm(x, w.fab_t.t())
        fb = _mm(fab[:, :cfg.kda_f_rank], w.f_b)
        conv, self.conv_state[l] = R.ref_kda_conv_silu(qkvg, self.conv_state[l], w.conv_w,
                                                       m.slot_idx)
        out, self.kda_state[l] = R.ref_kda_step(conv, fab, fb, w.A_log, w.dt_bias,
                                                qkvg[:, cfg.conv_channels:], self.kda_state[l],
                                                m.slot_idx, w.norm_w, cfg.norm_eps)
        return _mm(out, w.o_proj)

    def _mla(self, l: int, w: MLALayer, x: torch.Tensor) -> torch.Tensor:
        cfg, m = self.cfg, self.m
        B, NH = cfg.batch, cfg.mla_heads
        q_a = R.ref_rmsnorm(_mm(x, w.q_a), w.q_a_norm, cfg.norm_eps)
        q_b = _mm(q_a, w.q_b).view(B, NH, cfg.qk_head)
        q_abs = torch.einsum("bhn,hnl->bhl", q_b[:, :, :cfg.qk_nope], w.w_uk.float())
        kv_a = _mm(x, w.kv_a)
        kv_lat = R.ref_rmsnorm(kv_a[:, :cfg.kv_lora], w.kv_a_norm, cfg.norm_eps)
        self.cache[l] = R.ref_mla_cache_insert(kv_lat, kv_a[:, cfg.kv_lora:], self.cache[l],
                                               m.slot_mapping)
        q = torch.cat([q_abs, q_b[:, :, cfg.qk_nope:]], dim=-1)
        lat = R.ref_mla_decode(q, self.cache[l], m.block_table, m.seq_lens, cfg.sm_scale,
                               cfg.kv_lora, cfg.page_size)
        o = torch.einsum("bhl,hlv->bhv", lat, w.w_uv.double()).reshape(B, cfg.mla_out_width)
        return _mm(o.float() * torch.sigmoid(_mm(x, w.g_proj)), w.o_proj)

    def _moe(self, l: int, w: MoELayer, x: torch.Tensor, model_ids: torch.Tensor | None,
             res: StepResult) -> torch.Tensor:
        cfg = self.cfg
        sl = cfg.front_slices
        front = _mm(x, w.front)
        logits = front[:, slice(*sl["router"])]
        ids, weights = R.ref_moe_router(logits, w.router_bias, cfg.top_k, cfg.routed_scale)
        if model_ids is not None:
            ids, weights = self._check_routing(l, logits, w.router_bias, ids, model_ids, res)
        h = R.ref_situ_mul(R.ref_moe_grouped_gemm(front[:, slice(*sl["latent"])], w.w13, ids, True))
        y = R.ref_moe_grouped_gemm(h.float(), w.w2, ids, False)
        routed = R.ref_moe_weighted_sum(y, weights)
        routed = _mm(R.ref_rmsnorm(routed, w.latent_norm, cfg.norm_eps), w.up)
        shared = _mm(R.ref_situ_mul(front[:, slice(*sl["shared"])]), w.shared_down)
        return routed + shared

    def _check_routing(self, l, logits, bias, ref_ids, model_ids, res):
        cfg = self.cfg
        model_ids = model_ids.long()
        s = torch.sigmoid(logits.float())
        key = s + bias.float()
        kth = key.gather(1, ref_ids.long())[:, -1:]            # the reference's k-th key
        margin = float((kth - key.gather(1, model_ids)).max().clamp_min(0.0))
        same = (torch.sort(model_ids, 1).values == torch.sort(ref_ids.long(), 1).values).all(1)
        res.routing.append(RoutingCheck(l, int((~same).sum()), margin))
        if margin > self.route_tol:
            raise AssertionError(f"layer {l}: the model routed to an expert {margin:.3g} below "
                                 f"the reference's top-{cfg.top_k} threshold (tol {self.route_tol})")
        w = s.gather(1, model_ids)
        return model_ids.to(torch.int32), w / w.sum(-1, keepdim=True) * cfg.routed_scale

    def _dense(self, w: DenseLayer, x: torch.Tensor) -> torch.Tensor:
        return _mm(R.ref_situ_mul(_mm(x, w.gate_up)), w.down)
