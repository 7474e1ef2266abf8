"""Variant linear_gluon: the Gluon skinny GEMM (one token) against float64 at the K3 shapes.

Gluon has no interpreter, so every test here needs a Hopper GPU; on the CPU only the
launcher's argument checks run (they raise before any launch)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton.experimental.gluon")

from kernels.k3.ops.gemv_gluon import GLUON_SHAPES, skinny_gl, skinny_ws  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _inputs(K, N, wide, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(1, K, generator=g).to("cuda", torch.bfloat16)
    w = (torch.randn(K, wide, generator=g) * K ** -0.5).to("cuda", torch.bfloat16)[:, wide - N:]
    return x, w


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (TMA)")
@pytest.mark.parametrize("K, N, wide", GLUON_SHAPES)
@pytest.mark.parametrize("config", [None, (64, 128, 8, 8, 0), (64, 128, 8, 8, 8), (64, 256, 8, 4, 2),
                                    (128, 128, 8, 6, 3), (64, 64, 4, 16, 8)])
def test_skinny_gl_matches_float64(K, N, wide, config):
    x, w = _inputs(K, N, wide, K + N)
    out = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    skinny_gl(x, w, out, config=config)
    torch.testing.assert_close(out.double(), x.double() @ w.double(), rtol=2e-2, atol=2e-2)
    again = torch.empty_like(out)  # deterministic: the same sums in the same order
    skinny_gl(x, w, again, config=config)
    assert torch.equal(again, out)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (TMA)")
def test_skinny_gl_near_the_triton_kernel():
    from kernels.k3.ops.gemv import skinny_mm

    x, w = _inputs(7168, 5120, 6016, 3)
    a, b = (torch.empty(1, 5120, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    skinny_gl(x, w, a)
    skinny_mm(x, w, b, tma=True)
    torch.testing.assert_close(a.double(), b.double(), rtol=1e-2, atol=1e-2)


def test_skinny_gl_refuses_what_it_cannot_stream():
    x, w = torch.zeros(1, 100, dtype=torch.bfloat16), torch.zeros(100, 64, dtype=torch.bfloat16)
    with pytest.raises(AssertionError):  # K not a whole number of blocks
        skinny_gl(x, w, torch.empty(1, 64, dtype=torch.bfloat16))
    x2 = torch.zeros(2, 128, dtype=torch.bfloat16)
    with pytest.raises(AssertionError):  # one token only
        skinny_gl(x2, torch.zeros(128, 64, dtype=torch.bfloat16), torch.empty(2, 64, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (TMA, warp specialization)")
@pytest.mark.parametrize("K, N, wide", GLUON_SHAPES)
@pytest.mark.parametrize("config", [None, (64, 128, 4, 8, 0, 128), (64, 128, 4, 4, 1, 128), (64, 64, 4, 16, 1, 128),
                                    (128, 128, 4, 6, 1, 128), (32, 128, 4, 8, 1, 128), (64, 128, 8, 8, 1, 80)])
def test_skinny_ws_matches_float64(K, N, wide, config):
    # Variant linear_ws. At every shape and config here K has more blocks than the ring has
    # slots, so the loader waits for released ones; deterministic like the other Gluon kernel.
    x, w = _inputs(K, N, wide, K + N + 1)
    out = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    skinny_ws(x, w, out, config=config)
    torch.testing.assert_close(out.double(), x.double() @ w.double(), rtol=2e-2, atol=2e-2)
    again = torch.empty_like(out)
    skinny_ws(x, w, again, config=config)
    assert torch.equal(again, out)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (TMA, warp specialization)")
def test_skinny_ws_near_the_triton_kernel():
    from kernels.k3.ops.gemv import skinny_mm

    x, w = _inputs(3584, 7168, 7168, 5)
    a, b = (torch.empty(1, 7168, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    skinny_ws(x, w, a)
    skinny_mm(x, w, b)
    torch.testing.assert_close(a.double(), b.double(), rtol=1e-2, atol=1e-2)


def test_skinny_ws_refuses_what_it_cannot_stream():
    x, w = torch.zeros(1, 100, dtype=torch.bfloat16), torch.zeros(100, 64, dtype=torch.bfloat16)
    with pytest.raises(AssertionError):  # K not a whole number of blocks
        skinny_ws(x, w, torch.empty(1, 64, dtype=torch.bfloat16))
    with pytest.raises(AssertionError):  # consumers: whole warp groups
        skinny_ws(torch.zeros(1, 128, dtype=torch.bfloat16), torch.zeros(128, 64, dtype=torch.bfloat16),
                  torch.empty(1, 64, dtype=torch.bfloat16), config=(64, 128, 2, 8, 1, 128))
