"""The skinny GEMV ([f_a | b] projection) against torch, on CPU (interpreter) and the H200."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels.k3.ops.gemv import gemv  # noqa: E402


def run(B, K, N, device):
    g = torch.Generator(device="cpu").manual_seed(B * 1000 + N)
    x = torch.randn(B, K, generator=g).to(device, torch.bfloat16)
    w_t = (torch.randn(N, K, generator=g) * K ** -0.5).to(device, torch.bfloat16)
    out = torch.empty(B, N, device=device, dtype=torch.bfloat16)
    gemv(x, w_t, out)
    want = x.double() @ w_t.double().t()
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("B,K,N", [(1, 300, 7), (3, 2048, 140)])
def test_gemv_cpu(B, K, N):
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test")
    run(B, K, N, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 64])
def test_gemv_k3_shape(B):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run(B, 7168, 140, "cuda")


def run_skinny(B, K, N, device, w_cols=None):
    from kernels.k3.ops.gemv import skinny_mm

    g = torch.Generator(device="cpu").manual_seed(B * 1000 + N)
    x = torch.randn(B, K, generator=g).to(device, torch.bfloat16)
    wide = (torch.randn(K, w_cols or N, generator=g) * K ** -0.5).to(device, torch.bfloat16)
    w = wide[:, -N:]  # a column slice, as the router_fork front takes it
    out = torch.empty(B, N, device=device, dtype=torch.bfloat16)
    skinny_mm(x, w, out)
    torch.testing.assert_close(out.double(), x.double() @ w.double(), rtol=2e-2, atol=2e-2)
    early = torch.empty_like(out)  # variant linear_early_weights: the same sums, bit for bit
    skinny_mm(x, w, early, early_weights=True)
    assert torch.equal(early, out)
    if w.data_ptr() % 16 == 0 and w.stride(0) % 8 == 0:  # TMA's alignment (every K3 weight has it)
        tma = torch.empty_like(out)  # variant linear_tma: the same tiles, by descriptor
        skinny_mm(x, w, tma, tma=True)
        assert torch.equal(tma, out)
        pre = torch.empty_like(out)  # variant linear_prefetch (with linear_tma): a hint, the same bits
        skinny_mm(x, w, pre, tma=True, prefetch_bytes=1 << 20)
        assert torch.equal(pre, out)
    pre = torch.empty_like(out)  # variant linear_prefetch: its first rows into L2 first, the same bits
    skinny_mm(x, w, pre, prefetch_bytes=K * w.stride(0) * 2 + 4096)  # more than its rows span
    assert torch.equal(pre, out)
    run_split(x, w, out)
    run_gated(x, w, g)


def run_gated(x, w, g):
    """Variant mla_gate_in_o_proj: the GEMM gating its own operand == gate_mul then the GEMM,
    bit for bit (the operand rounded alike), by pointer loads, with the first block before the
    wait, by TMA, and split over K."""
    from kernels.k3.ops.gemv import alloc_split_k, skinny_mm
    from kernels.k3.ops.mla import gate_mul

    B, K = x.shape
    gate = torch.randn(B, K + 4, generator=g).to(x.device, torch.bfloat16)[:, 2:K + 2]  # a strided view
    gated = torch.empty_like(x)
    gate_mul(x, gate, gated)
    buf = alloc_split_k(w.shape[1], x.device)
    forms = [{}, {"early_weights": True}, {"config": (32, 64, 4, 2), "split_k": buf, "splits": 3}]
    if w.data_ptr() % 16 == 0 and w.stride(0) % 8 == 0:
        forms.append({"tma": True})
    for kw in forms:
        two, one = (torch.empty(B, w.shape[1], device=x.device, dtype=torch.bfloat16) for _ in range(2))
        skinny_mm(gated, w, two, **kw)
        skinny_mm(x, w, one, gate=gate, **kw)
        assert torch.equal(one, two), kw


def run_split(x, w, unsplit, splits=(2, 3, 5)):
    """Variant linear_split_k: K split over programs, the partials summed in split order by
    the last program of each column block: within bf16 of the unsplit kernel, the same bits
    on a second call, every ticket back at 0 after each call (the next launch counts from 0)."""
    from kernels.k3.ops.gemv import alloc_split_k, skinny_mm

    buf = alloc_split_k(w.shape[1], x.device)
    for s in splits:
        a, b = torch.empty_like(unsplit), torch.empty_like(unsplit)
        skinny_mm(x, w, a, config=(32, 64, 4, 2), split_k=buf, splits=s)
        assert not buf.tickets.any()
        skinny_mm(x, w, b, config=(32, 64, 4, 2), split_k=buf, splits=s)
        assert torch.equal(a, b) and not buf.tickets.any()
        torch.testing.assert_close(a.double(), unsplit.double(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("B,K,N,cols", [(1, 300, 40, None), (3, 512, 100, 130), (16, 256, 64, None),
                                        (2, 260, 72, 136)])
def test_skinny_mm_cpu(B, K, N, cols):
    """Variant triton_linear's GEMM vs float64 (ragged K and N, a strided column slice)."""
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test")
    run_skinny(B, K, N, "cpu", cols)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 16])
def test_skinny_mm_k3_shapes(B):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for K, N, cols in ((7168, 5120, 6016), (7168, 6144, None), (3584, 7168, None), (1536, 7168, None)):
        run_skinny(B, K, N, "cuda", cols)


def run_mixnorm(E, K, N, device, config=None, mma=0):
    """Variant moe_tail_fused (mma 0) and moe_tail_mma (1, 2: the rows as the MMA's M
    side): weighted sum -> latent RMSNorm -> up GEMM in one launch, vs the three steps in
    float64 (the expert rows a strided view, as the down GEMM leaves them in its [16 * B,
    K] output)."""
    from kernels.k3 import reference as R
    from kernels.k3.ops.gemv import skinny_mm_mixnorm

    g = torch.Generator(device="cpu").manual_seed(E * 100 + K)
    y = torch.randn(E, K + 8, generator=g).to(device, torch.bfloat16)[:, :K]
    topk_w = torch.rand(1, E, generator=g).to(device)
    gamma = (1.0 + 0.1 * torch.randn(K, generator=g)).to(device, torch.bfloat16)
    w = (torch.randn(K, N, generator=g) * K ** -0.5).to(device, torch.bfloat16)
    out = torch.empty(1, N, device=device, dtype=torch.bfloat16)
    skinny_mm_mixnorm(y, topk_w, gamma, w, out, 1e-6, config=config, mma=mma)
    lat = (topk_w.double()[0, :, None] * y.double()).sum(0, keepdim=True)
    want = R.ref_rmsnorm(lat, gamma).double() @ w.double()
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("E,K,N,config,mma", [(16, 512, 96, (64, 128, 4, 2), 0), (4, 300, 40, (32, 128, 4, 2), 0),
                                               (16, 512, 96, (64, 128, 4, 2), 1), (16, 300, 40, (32, 128, 4, 2), 2),
                                               (4, 300, 40, (32, 128, 4, 2), 1), (8, 512, 96, (64, 128, 4, 2), 2)])
def test_skinny_mm_mixnorm_cpu(E, K, N, config, mma):
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test")
    run_mixnorm(E, K, N, "cpu", config, mma)


def test_skinny_mm_mixnorm_mma_takes_at_most_sixteen_rows():
    from kernels.k3.ops.gemv import skinny_mm_mixnorm

    y, w = torch.zeros(32, 64, dtype=torch.bfloat16), torch.zeros(64, 32, dtype=torch.bfloat16)
    with pytest.raises(AssertionError):
        skinny_mm_mixnorm(y, torch.zeros(1, 32), torch.ones(64, dtype=torch.bfloat16), w,
                          torch.empty(1, 32, dtype=torch.bfloat16), mma=1)


@pytest.mark.gpu
@pytest.mark.parametrize("mma", [0, 1, 2])
def test_skinny_mm_mixnorm_k3_shape(mma):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_mixnorm(16, 3584, 7168, "cuda", mma=mma)


def run_rms_folded(B, K, N, device, config=None):
    """Variant latent_norm_folded: moe_weighted_sum's sums of squares + skinny_mm with
    rms_of on gamma-folded weights = the weighted sum -> RMSNorm -> GEMM, in float64."""
    from kernels.k3 import reference as R
    from kernels.k3.ops.gemv import skinny_mm
    from kernels.k3.ops.moe import moe_weighted_sum, weighted_sum_chunks

    E = 4
    g = torch.Generator(device="cpu").manual_seed(B * 10 + K)
    y = torch.randn(B * E, K, generator=g).to(device, torch.bfloat16)
    topk_w = torch.rand(B, E, generator=g).to(device)
    gamma = (1.0 + 0.1 * torch.randn(K, generator=g)).to(device, torch.bfloat16)
    w = (torch.randn(K, N, generator=g) * K ** -0.5).to(device, torch.bfloat16)
    lat = torch.empty(B, K, device=device, dtype=torch.bfloat16)
    sumsq = torch.empty(B, weighted_sum_chunks(K), device=device, dtype=torch.float32)
    moe_weighted_sum(y, topk_w, lat, sumsq=sumsq)
    torch.testing.assert_close(sumsq.sum(1).double(), (lat.double() ** 2).sum(1), rtol=1e-5, atol=1e-5)
    out = torch.empty(B, N, device=device, dtype=torch.bfloat16)
    w_g = (gamma.float()[:, None] * w.float()).to(torch.bfloat16)
    skinny_mm(lat, w_g, out, config=config, rms_of=(sumsq, 1e-6))
    want = R.ref_rmsnorm(lat, gamma).double() @ w.double()
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("B,K,N", [(1, 1100, 96), (3, 512, 40)])
def test_latent_norm_folded_cpu(B, K, N):
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test")
    run_rms_folded(B, K, N, "cpu", (32, 128, 4, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 16])
def test_latent_norm_folded_k3_shape(B):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_rms_folded(B, 3584, 7168, "cuda")
