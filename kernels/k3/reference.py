"""Float torch references of every K3 op in `kernels.k3.ops`.

Conventions:
- Inputs are never modified: every reference works on copies and returns its results
  (including the updated state / cache / bank where the kernel updates in place).
- Math in float64 where it is cheap (norms, attention, small reductions), float32 for the
  large elementwise/GEMM ones; results are returned as float (compare with a tolerance)
  unless the op is a pure copy or a bf16 rounding point the kernel shares, in which case
  the reference returns the same dtype as the kernel's output and is exact.
- Rounding points that variants rely on are modelled: a residual add is fp32 add then one
  rounding to the partial's dtype; the folded attn_res scores the rounded partial.
- Semantics (see the op modules for layouts): RMSNorm eps 1e-6; KDA l2norm
  x * rsqrt(sum x^2 + 1e-6); router ties go to the lower expert id.
"""

from __future__ import annotations

import torch

F64 = torch.float64


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# ---- norm -------------------------------------------------------------------------------
def ref_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _rms(x.to(F64), eps) * weight.to(F64)


# ---- attention residuals ------------------------------------------------------------------
def ref_residual_add(partial: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
    """partial + addend in fp32, rounded once to partial's dtype (exact, like the kernel)."""
    return (partial.float() + addend.float()).to(partial.dtype)


def ref_add3(partial: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (partial.float() + (a.float() + b.float())).to(partial.dtype)


def ref_attn_res_score(bank: torch.Tensor, n_rows: int, query: torch.Tensor,
                       addend: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (logits [B, n_rows] float64, the updated bank copy)."""
    bank = bank.clone()
    if addend is not None:
        bank[n_rows - 1] = ref_residual_add(bank[n_rows - 1], addend)
    rows = bank[:n_rows].to(F64)                                  # [n, B, H]
    logits = (_rms(rows, 1e-6) * query.to(F64)).sum(-1)            # [n, B]
    return logits.transpose(0, 1).contiguous(), bank


def ref_attn_res_combine(bank: torch.Tensor, n_rows: int, logits: torch.Tensor,
                         gamma: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    p = torch.softmax(logits.to(F64), dim=-1)                      # [B, n]
    mix = torch.einsum("bn,nbh->bh", p, bank[:n_rows].to(F64))
    return _rms(mix, eps) * gamma.to(F64)


def ref_attn_res(bank: torch.Tensor, n_rows: int, query: torch.Tensor, gamma: torch.Tensor,
                 addend: torch.Tensor | None = None, eps: float = 1e-6):
    """Score + combine: returns (out [B, H] float64, updated bank copy)."""
    logits, bank = ref_attn_res_score(bank, n_rows, query, addend)
    return ref_attn_res_combine(bank, n_rows, logits, gamma, eps), bank


# ---- KDA ----------------------------------------------------------------------------------
def ref_kda_conv_silu(qkvg: torch.Tensor, conv_state: torch.Tensor, conv_w: torch.Tensor,
                      slot_idx: torch.Tensor):
    """Returns (out [B, C] float32, updated conv_state copy)."""
    state = conv_state.clone()
    C = state.shape[2]
    slots = slot_idx.long()
    x = qkvg[:, :C]
    window = torch.cat([state[slots].float(), x.float()[:, None, :]], dim=1)  # [B, 4, C]
    acc = (window * conv_w.float().t()[None]).sum(1)
    state[slots] = torch.cat([state[slots][:, 1:], x[:, None, :].to(state.dtype)], dim=1)
    return acc * torch.sigmoid(acc), state


def ref_kda_step(qkv: torch.Tensor, fab: torch.Tensor, fb: torch.Tensor, A_log: torch.Tensor,
                 dt_bias: torch.Tensor, g_out: torch.Tensor | None, state: torch.Tensor,
                 slot_idx: torch.Tensor, norm_w: torch.Tensor | None, eps: float = 1e-6):
    """Returns (o or gated-normed out [B, NH*DV] float64, updated state copy (fp32)).

    With norm_w None the raw o is returned (the unfused kernel's o_scratch)."""
    new_state = state.clone()
    B = qkv.shape[0]
    _, NH, DV, DK = state.shape
    slots = slot_idx.long()
    q = qkv[:, :NH * DK].to(F64).view(B, NH, DK)
    k = qkv[:, NH * DK:2 * NH * DK].to(F64).view(B, NH, DK)
    v = qkv[:, 2 * NH * DK:].to(F64).view(B, NH, DV)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * DK ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    f = fb.to(F64).view(B, NH, DK)
    gk = -5.0 * torch.sigmoid(torch.exp(A_log.to(F64))[None, :, None]
                              * (f + dt_bias.to(F64).view(1, NH, DK)))
    alpha = torch.exp(gk)                                          # [B, NH, DK]
    beta = torch.sigmoid(fab[:, fab.shape[1] - NH:].to(F64))       # [B, NH]
    S = state[slots].to(F64) * alpha[:, :, None, :]                # [B, NH, DV, DK]
    u = beta[..., None] * (v - torch.einsum("bhvk,bhk->bhv", S, k))
    S = S + u[..., None] * k[:, :, None, :]
    o = torch.einsum("bhvk,bhk->bhv", S, q)
    new_state[slots] = S.to(state.dtype)
    if norm_w is None:
        return o.reshape(B, NH * DV), new_state
    return ref_kda_gated_rmsnorm(o.reshape(B, NH * DV), g_out, norm_w, eps), new_state


def ref_kda_gated_rmsnorm(o: torch.Tensor, g_out: torch.Tensor, norm_w: torch.Tensor,
                          eps: float = 1e-6) -> torch.Tensor:
    B, N = o.shape
    DV = norm_w.shape[0]
    x = _rms(o.to(F64).view(B, N // DV, DV), eps) * norm_w.to(F64)
    return (x * torch.sigmoid(g_out.to(F64).view(B, N // DV, DV))).view(B, N)


# ---- MLA ----------------------------------------------------------------------------------
def ref_mla_q_concat(q_nope_abs: torch.Tensor, q_rope: torch.Tensor) -> torch.Tensor:
    return torch.cat([q_nope_abs, q_rope], dim=-1)  # exact copy


def ref_mla_cache_insert(kv_latent: torch.Tensor, k_rope: torch.Tensor, cache: torch.Tensor,
                         slot_mapping: torch.Tensor) -> torch.Tensor:
    """Returns the updated cache copy; slots < 0 (padded entries) are skipped."""
    cache = cache.clone()
    rows = cache.view(-1, kv_latent.shape[1] + k_rope.shape[1])
    keep = slot_mapping >= 0
    rows[slot_mapping[keep].long()] = torch.cat([kv_latent, k_rope], dim=-1)[keep].to(cache.dtype)
    return cache


def ref_mla_decode(q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
                   seq_lens: torch.Tensor, sm_scale: float, dl: int, page_size: int = 64):
    """Decode attention over the paged latent cache: out [B, NH, dl] float64 (K = the
    whole row, V = its first dl columns). Loops over requests (host lengths: test-only)."""
    B, NH, ROW = q.shape
    rows = cache.view(-1, ROW)
    out = torch.zeros(B, NH, dl, dtype=F64, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        t = torch.arange(n, device=q.device)
        slots = block_table[b, t // page_size].long() * page_size + t % page_size
        kv = rows[slots].to(F64)                                   # [n, ROW]
        s = q[b].to(F64) @ kv.t() * sm_scale                       # [NH, n]
        out[b] = torch.softmax(s, -1) @ kv[:, :dl]
    return out


def ref_gate_mul(o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return o.float() * torch.sigmoid(g.float())


# ---- MoE ----------------------------------------------------------------------------------
def ref_moe_router(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scale: float = 1.0):
    """Returns (ids [B, k] int32 in selection order, weights [B, k] float32)."""
    s = torch.sigmoid(logits.float())
    key = s + bias.float()
    # stable sort: among equal keys the lower expert id comes first, like the kernels
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = torch.gather(s, 1, order)
    return order.to(torch.int32), w / w.sum(-1, keepdim=True) * scale


def ref_moe_align(topk_ids: torch.Tensor, num_experts: int):
    """Returns (sorted_pairs, seg_expert, seg_start, num_segs) as the kernel lays them out."""
    ids = topk_ids.reshape(-1).long().cpu()
    P = ids.numel()
    G = min(P, num_experts)
    sorted_pairs = torch.sort(ids * P + torch.arange(P)).values % P
    experts, counts = torch.unique(ids, sorted=True, return_counts=True)
    n = experts.numel()
    seg_expert = torch.full((G,), -1, dtype=torch.int32)
    seg_start = torch.full((G + 1,), P, dtype=torch.int32)
    seg_expert[:n] = experts.to(torch.int32)
    seg_start[:n] = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    return sorted_pairs.to(torch.int32), seg_expert, seg_start, torch.tensor([n], dtype=torch.int32)


def ref_moe_grouped_gemm(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor,
                         x_is_per_token: bool = True) -> torch.Tensor:
    """out[pair] = x_row(pair) @ w[topk_ids.flat[pair]].T, float32 [B*k, N]."""
    B, K = topk_ids.shape
    ids = topk_ids.reshape(-1).long()
    out = torch.empty(B * K, w.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():  # per expert: never materialise w[ids]
        pairs = (ids == e).nonzero().view(-1)
        rows = pairs // K if x_is_per_token else pairs
        out[pairs] = x[rows].float() @ w[e].float().t()
    return out


def ref_situ_mul(gu: torch.Tensor) -> torch.Tensor:
    n = gu.shape[1] // 2
    g, u = gu[:, :n].to(F64), gu[:, n:].to(F64)
    return 4 * torch.tanh(g / 4) * torch.sigmoid(g) * 25 * torch.tanh(u / 25)


def ref_moe_weighted_sum(y: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
    B, K = topk_w.shape
    return (y.to(F64).view(B, K, -1) * topk_w.to(F64)[..., None]).sum(1)


__all__ = [name for name in dir() if name.startswith("ref_")]
