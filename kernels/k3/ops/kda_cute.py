"""KDA delta-rule decode step (+ fused gated RMSNorm) in CuTe DSL: the `kda_cute` variant.

Same signature, layouts and semantics as `kernels.k3.ops.kda.kda_step(..., fuse_norm=True)`
(see that module's docstring); DK = DV = 128 only (the K3 head size).

One CTA of 128 threads per (token, head), grid (B, NH) like the Triton kernel. Thread
t = 32 * w + l (warp w, lane l) holds the fp32 state tile S[v, k] for the 32 rows
v = 32 w + r (r = 0..31) and the 4 columns k = 4 l + c (c = 0..3), loaded with one 128-bit
load per row: each warp instruction reads one contiguous 512-byte row (coalesced), and the
thread's 4 channels of q, k, f, dt_bias are all it needs on the K side:
- ||q||^2, ||k||^2: in-thread sum of 4, then a warp all-reduce (the warp sees all 128 k).
- S @ k^ and S @ q^ (sums over k per row): 4 in-thread products per row, then a butterfly
  reduce-scatter over the 32 lanes (31 shuffles for 32 rows) leaves lane l with row 32 w + l.
- u (one row per lane) goes back to every lane of the warp by 32 index shuffles.
- The RMSNorm over V: warp all-reduce of o^2, then the 4 warp sums through shared memory.

PDL: the slot index, the state tile, A_log, dt_bias and norm_w are loaded before
`griddepcontrol.wait` (older data; the 64 KiB state load overlaps the producer's tail);
qkv, fab, fb and g_out after it. (The Triton kernel reads g_out before its wait, since the
qkvg GEMM precedes our producer; this kernel reads it after, which is always safe.)
`griddepcontrol.launch_dependents` follows the last store; `delay_ns > 0` first spins on
%globaltimer for that long (the injected-delay variant).

The launcher compiles once per (shapes, strides, dtypes, delay, eps) with static layouts
(`from_dlpack`), caches the compiled function and launches it on torch's current stream
with `use_pdl=True`: no host sync, CUDA-graph capturable once compiled (compile outside
the capture, e.g. by a warm-up call).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import torch
from cutlass import Float32, Int64, cute
from cutlass.cute.runtime import from_dlpack

EPS = 1e-6
L2_EPS = 1e-6
HEAD = 128            # DK = DV
NUM_WARPS = 4
THREADS = 32 * NUM_WARPS
ROWS = HEAD // NUM_WARPS    # 32 state rows (v) per warp: one per lane after a reduce-scatter
COLS = HEAD // 32           # 4 state columns (k) per lane: one 128-bit load per row

# --------------------------------------------------------------------------------------
# Trace-time helpers (plain Python: their loops unroll while the kernel is traced).
# --------------------------------------------------------------------------------------
def _sigmoid(x):
    return 1.0 / (1.0 + cute.math.exp(-x))


def _warp_allreduce_sum(x):
    return cute.arch.warp_reduction(x, lambda a, b: a + b)


def _warp_reduce_scatter(vals, lane):
    """vals: ROWS per-lane partial sums (row r = vals[r]). Returns, in lane l, the sum over
    the warp's lanes of row l. Butterfly: at each step a lane keeps the half of its rows on
    its side of the step's lane bit, sends the other half to its partner and adds."""
    n = len(vals)
    offset = n // 2
    while offset >= 1:
        upper = (lane & offset) != 0          # this lane keeps rows [offset, 2 * offset)
        nxt = []
        for j in range(offset):
            lo, hi = vals[j], vals[j + offset]
            keep = Float32(cutlass.select_(upper, hi, lo))
            send = Float32(cutlass.select_(upper, lo, hi))
            nxt.append(keep + cute.arch.shuffle_sync_bfly(send, offset=offset))
        vals = nxt
        offset //= 2
    return vals[0]


# --------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------
@cute.kernel
def _kda_step_kernel(mQKV: cute.Tensor, mFab: cute.Tensor, mFb: cute.Tensor,
                     mAlog: cute.Tensor, mDtb: cute.Tensor, mG: cute.Tensor,
                     mState: cute.Tensor, mSlot: cute.Tensor, mNw: cute.Tensor,
                     mOut: cute.Tensor, tiled_copy: cute.TiledCopy,
                     NH: cutlass.Constexpr, B_OFF: cutlass.Constexpr,
                     q_scale: cutlass.Constexpr, eps: cutlass.Constexpr,
                     DELAY_NS: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    b, h, _ = cute.arch.block_idx()
    warp = tidx // 32
    lane = tidx % 32
    v_own = warp * ROWS + lane           # the state row this lane ends up owning
    k0 = lane * COLS                     # this lane's first state column

    smem = cutlass.memory.SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout(NUM_WARPS), byte_alignment=16)

    # ---- older data, before the dependency wait -------------------------------------
    slot = Int64(mSlot[b])                             # 64-bit: slot * 192 KiB overflows int32
    gS = mState[slot, h, None, None]                     # (DV, DK) tile of this head
    thr_copy = tiled_copy.get_slice(tidx)
    tSg = thr_copy.partition_S(gS)
    tSr = cute.make_fragment_like(tSg)
    cute.copy(tiled_copy, tSg, tSr)                      # 32 x 128-bit loads in flight

    a_h = cute.math.exp(mAlog[h].to(Float32))
    dtb = [mDtb[h * HEAD + k0 + c].to(Float32) for c in range(COLS)]
    nw = mNw[v_own].to(Float32)

    # ---- producer outputs ------------------------------------------------------------
    cute.arch.griddepcontrol_wait()
    col_q = h * HEAD + k0
    col_k = NH * HEAD + h * HEAD + k0
    q = [mQKV[b, col_q + c].to(Float32) for c in range(COLS)]
    k = [mQKV[b, col_k + c].to(Float32) for c in range(COLS)]
    f = [mFb[b, h * HEAD + k0 + c].to(Float32) for c in range(COLS)]
    v = mQKV[b, 2 * NH * HEAD + h * HEAD + v_own].to(Float32)
    gate = mG[b, h * HEAD + v_own].to(Float32)
    beta = _sigmoid(mFab[b, B_OFF + h].to(Float32))

    # l2 norms over K (the warp holds all 128 channels), gate, decay
    sq = q[0] * q[0]
    sk = k[0] * k[0]
    for c in cutlass.range_constexpr(1, COLS):
        sq = sq + q[c] * q[c]
        sk = sk + k[c] * k[c]
    sq = _warp_allreduce_sum(sq)
    sk = _warp_allreduce_sum(sk)
    rq = cute.math.rsqrt(sq + L2_EPS) * q_scale
    rk = cute.math.rsqrt(sk + L2_EPS)
    q = [x * rq for x in q]
    k = [x * rk for x in k]
    alpha = [cute.math.exp(-5.0 * _sigmoid(a_h * (f[c] + dtb[c]))) for c in range(COLS)]

    # S *= alpha (per column); partial (S @ k^) per row
    for i in cutlass.range_constexpr(ROWS * COLS):
        tSr[i] = tSr[i] * alpha[i % COLS]
    part = []
    for r in cutlass.range_constexpr(ROWS):
        acc = tSr[r * COLS] * k[0]
        for c in cutlass.range_constexpr(1, COLS):
            acc = acc + tSr[r * COLS + c] * k[c]
        part.append(acc)
    sk_own = _warp_reduce_scatter(part, lane)
    u_own = beta * (v - sk_own)

    # S += u k^T: u of each row from the lane that owns it; partial (S @ q^) per row
    part = []
    for r in cutlass.range_constexpr(ROWS):
        u_r = cute.arch.shuffle_sync(u_own, offset=r)
        s = tSr[r * COLS] + u_r * k[0]
        tSr[r * COLS] = s
        acc = s * q[0]
        for c in cutlass.range_constexpr(1, COLS):
            s = tSr[r * COLS + c] + u_r * k[c]
            tSr[r * COLS + c] = s
            acc = acc + s * q[c]
        part.append(acc)
    cute.copy(tiled_copy, tSr, tSg)                      # state back in place
    o = _warp_reduce_scatter(part, lane)

    # gated RMSNorm over V = the 4 warps' rows
    ss = _warp_allreduce_sum(o * o)
    if lane == 0:
        red[warp] = ss
    cute.arch.sync_threads()
    tot = red[0]
    for w in cutlass.range_constexpr(1, NUM_WARPS):
        tot = tot + red[w]
    y = o * cute.math.rsqrt(tot / HEAD + eps) * nw * _sigmoid(gate)
    mOut[b, h * HEAD + v_own] = y.to(mOut.element_type)

    # The delay spins before the trigger: work after it is reported as the dependent's time.
    if cutlass.const_expr(DELAY_NS > 0):
        t0 = cute.arch.globaltimer()
        t = t0
        while t - t0 < Int64(DELAY_NS):
            t = cute.arch.globaltimer()
    cute.arch.griddepcontrol_launch_dependents()


@cute.jit
def _kda_step_host(mQKV: cute.Tensor, mFab: cute.Tensor, mFb: cute.Tensor,
                   mAlog: cute.Tensor, mDtb: cute.Tensor, mG: cute.Tensor,
                   mState: cute.Tensor, mSlot: cute.Tensor, mNw: cute.Tensor,
                   mOut: cute.Tensor, stream: cuda.CUstream,
                   B: cutlass.Constexpr, NH: cutlass.Constexpr, B_OFF: cutlass.Constexpr,
                   q_scale: cutlass.Constexpr, eps: cutlass.Constexpr,
                   DELAY_NS: cutlass.Constexpr):
    # Thread t = (w, l) = (t // 32, t % 32) covers rows 32 w .. 32 w + 31 and columns
    # 4 l .. 4 l + 3 of the (DV, DK) tile, one 128-bit copy per row.
    thr_layout = cute.make_ordered_layout((NUM_WARPS, 32), order=(1, 0))
    val_layout = cute.make_ordered_layout((ROWS, COLS), order=(1, 0))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32,
                               num_bits_per_copy=COLS * 32)
    tiled_copy = cute.make_tiled_copy_tv(atom, thr_layout, val_layout)
    _kda_step_kernel(mQKV, mFab, mFb, mAlog, mDtb, mG, mState, mSlot, mNw, mOut,
                     tiled_copy, NH, B_OFF, q_scale, eps, DELAY_NS).launch(
        grid=[B, NH, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=True)


# --------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_COMPILED: dict = {}   # (device, tensor signatures, eps, delay) -> compiled host function
_DESCS: dict = {}      # (device, ptr, shape, stride, dtype, align) -> cute tensor (from_dlpack)
_DESCS_MAX = 1024     # > the distinct tensors of one model step (69 KDA layers x ~4 + shared)


def _sig(t: torch.Tensor):
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


def _desc(t: torch.Tensor, align: int | None) -> cute.Tensor:
    """from_dlpack(t) with a static layout, memoised: a descriptor is only a pointer and a
    layout, so one made for the same address, shape, strides and dtype is interchangeable.
    Saves most of the per-call host cost (the workload reuses its buffers every step)."""
    key = (t.device.index, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, align)
    d = _DESCS.get(key)
    if d is None:
        d = from_dlpack(t.detach(), assumed_align=align)
        if len(_DESCS) >= _DESCS_MAX:
            _DESCS.pop(next(iter(_DESCS)))
        _DESCS[key] = d
    return d


def clear_descriptor_cache() -> None:
    """Drop the memoised descriptors (each may keep its tensor's storage alive)."""
    _DESCS.clear()


def kda_step_cute(qkv: torch.Tensor, fab: torch.Tensor, fb: torch.Tensor, A_log: torch.Tensor,
                  dt_bias: torch.Tensor, g_out: torch.Tensor, state: torch.Tensor,
                  slot_idx: torch.Tensor, norm_w: torch.Tensor, out: torch.Tensor, *,
                  fuse_norm: bool = True, o_scratch: torch.Tensor | None = None,
                  eps: float = EPS, delay_ns: int = 0) -> torch.Tensor:
    """`kda.kda_step(..., fuse_norm=True)` in CuTe DSL: one delta-rule step per (token, head)
    with the state updated in place and out = gated RMSNorm of o. Returns out.
    (`fuse_norm` / `o_scratch` are accepted for drop-in use; only the fused form exists.)

    The state is read before `griddepcontrol.wait`: it must not be written by the kernel(s)
    this launch may overlap (true in the model, where the previous writer of a layer's state
    is that layer's step one decode step earlier). The first call per shape compiles
    (about a second); do it outside CUDA-graph capture."""
    if delay_ns < 0:
        raise ValueError("delay_ns must be >= 0")
    if not fuse_norm:
        raise NotImplementedError("kda_step_cute implements the fused step (fuse_norm=True) only")
    B = qkv.shape[0]
    _, NH, DV, DK = state.shape
    assert DK == HEAD and DV == HEAD, "kda_step_cute supports DK = DV = 128 only"
    assert state.dtype == torch.float32 and state.stride(3) == 1 and state.stride(2) == DK
    assert state.data_ptr() % 16 == 0 and state.stride(1) % 4 == 0 and state.stride(0) % 4 == 0
    assert qkv.shape == (B, 2 * NH * DK + NH * DV) and qkv.stride(1) == 1
    assert fab.shape[0] == B and fab.shape[1] >= NH and fab.stride(1) == 1
    assert fb.shape == (B, NH * DK) and fb.stride(1) == 1
    assert A_log.shape == (NH,) and dt_bias.shape == (NH * DK,) and slot_idx.shape == (B,)
    assert out.shape == (B, NH * DV) and out.stride(1) == 1
    assert g_out.shape == (B, NH * DV) and g_out.stride(1) == 1 and norm_w.shape == (DV,)
    assert slot_idx.dtype in (torch.int32, torch.int64)
    tensors = (qkv, fab, fb, A_log, dt_bias, g_out, state, slot_idx, norm_w, out)
    for t in tensors:
        assert t.is_cuda and t.device == state.device, "all tensors on one CUDA device"
        assert t is slot_idx or t.dtype in _FLOATS, f"unsupported dtype {t.dtype}"
    if B == 0:
        return out
    args = [_desc(t, 16 if t is state else None) for t in tensors]
    stream = cuda.CUstream(torch.cuda.current_stream(state.device).cuda_stream)
    key = (state.device.index, tuple(_sig(t) for t in tensors), float(eps), int(delay_ns))
    fn = _COMPILED.get(key)
    if fn is None:
        fn = cute.compile(_kda_step_host, *args, stream, B, NH, fab.shape[1] - NH, DK ** -0.5,
                          float(eps), int(delay_ns))
        _COMPILED[key] = fn
    fn(*args, stream)
    return out
