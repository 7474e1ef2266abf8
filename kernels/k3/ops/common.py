"""Shared pieces of the K3 Triton ops: the PDL switch, the injected-delay spin, launch.

Under `TRITON_INTERPRET=1` (CPU tests) there is no griddepcontrol, no globaltimer and a
bf16 `tl.dot` that multiplies raw bit patterns, so:
- `PDL` is False: kernels take `USE_PDL: tl.constexpr` and the gdc calls compile out;
- delays are forced to 0 (the spin reads globaltimer);
- `DOT_F32` is True: `dot` upcasts its operands (exact for bf16 inputs) before `tl.dot`;
- `to_dtype` rounds fp32 -> bf16 to nearest even (the interpreter's cast truncates).
On a GPU none of these workarounds is compiled in.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# The Triton interpreter (CPU tests) has no griddepcontrol; on a GPU every kernel uses it.
PDL = not INTERPRET
# The interpreter's bf16 tl.dot is wrong (numpy matmul over uint16 storage): upcast there.
DOT_F32 = INTERPRET
# Visible inside @triton.jit functions (module globals there must be constexpr).
INTERPRET_C: tl.constexpr = tl.constexpr(INTERPRET)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


@triton.jit
def spin(DELAY_NS: tl.constexpr):
    # Injected-delay variant: hold every program DELAY_NS longer, after its last store and
    # before its PDL trigger. Measured on the H200: work after the trigger is reported as
    # the *dependent* kernel's time, so a spin there would not lengthen this kernel.
    if DELAY_NS > 0:
        t0 = tl.extra.cuda.globaltimer()
        while tl.extra.cuda.globaltimer() - t0 < DELAY_NS:
            pass


@triton.jit
def grid_barrier(counter):
    # Every program of the launch meets here; all must be co-resident.
    nprog = tl.num_programs(0) * tl.num_programs(1)
    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    group_barrier(counter, nprog, first)


@triton.jit
def group_barrier(counter, nprog, first):
    # nprog programs meet here (one of them `first`); all must be co-resident. Cooperative-
    # groups style, on one int32 in global memory that is never reset: the first program adds
    # 2^31 - (nprog - 1), every other program 1 (release, gpu scope), so each crossing adds
    # exactly 2^31 and the sign bit flips once, at the last arrival; a program spins
    # (acquire) until the sign differs from what it saw on arrival. A launch may cross it
    # any number of times: the next flip needs every program's next arrival, so a slow
    # program still sees the last one. The CTA barrier before the release orders every
    # thread's stores before the (single-thread) arrival; the one after the acquire orders
    # every thread's later loads after it. One counter per group and stream of serialised
    # launches.
    lead = (2147483649 - nprog.to(tl.int64)).to(tl.int32)  # 2^31 - (nprog - 1), wrapped
    inc = tl.where(first, lead, 1)
    tl.debug_barrier()
    old = tl.atomic_add(counter, inc, sem="release", scope="gpu")
    while (tl.atomic_add(counter, 0, sem="acquire", scope="gpu") ^ old) >= 0:
        pass
    tl.debug_barrier()


#: USE_PDL values: off (interpreter), trigger after the last store, trigger right after
#: the wait (variant pdl_early_trigger), trigger before the wait (variant pdl_trigger_first).
PDL_OFF, PDL_LATE, PDL_EARLY, PDL_FIRST = 0, 1, 2, 3


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL == 3:
        # Trigger first: the next kernel launches (and runs its prologue, a GEMM's L2
        # prefetch) while this one still waits for its own producer. Safe as long as every
        # kernel waits before it reads: the next one's wait returns only once this grid has
        # completed, and this grid completes only after its own wait has returned.
        tl.extra.cuda.gdc_launch_dependents()
    # Everything the previous kernel wrote is visible after this; load it only after.
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    if USE_PDL == 2:
        # Early trigger: the next kernel launches and runs its prologue while this one works;
        # its own gdc_wait still waits for this grid to complete, so this is always safe.
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_trigger(USE_PDL: tl.constexpr):
    # Lets the next PDL kernel launch; its own gdc_wait still waits for our completion.
    if USE_PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def dot(a, b, acc, F32: tl.constexpr):
    """acc + a @ b with f32 accumulation; F32 upcasts the operands (interpreter only)."""
    if F32:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def to_dtype(x, dtype: tl.constexpr):
    """x.to(dtype). The interpreter's fp32 -> bf16 cast truncates; round to nearest even
    there by hand (integer carry into the upper 16 bits) so CPU results match the GPU's
    cvt.rn bit for bit. Compiled out on a GPU."""
    if INTERPRET_C and dtype == tl.bfloat16 and x.dtype == tl.float32:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = bits.to(tl.float32, bitcast=True)  # representable in bf16: the cast is exact
    return x.to(dtype)


@triton.jit
def tanh(x):
    # exp-based (the interpreter has no libdevice); odd Taylor series near 0 where
    # 1 - exp(-2|x|) would cancel. Both branches are accurate to ~1e-6 relative.
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    t = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    p = ax * (1.0 - x2 * (0.3333333333333333 - x2 * (0.13333333333333333 - x2 * 0.05396825396825397)))
    t = tl.where(ax < 0.125, p, t)
    return tl.where(x < 0, -t, t)


#: Bytes per bulk L2 prefetch instruction (variant prefetch:<MB>).
PF_CHUNK = 16384
PF_CHUNK_C: tl.constexpr = tl.constexpr(PF_CHUNK)


@triton.jit
def l2_prefetch(pf, pf_bytes, PF_CHUNKS: tl.constexpr):
    """Variant prefetch:<MB>: a latency-bound kernel asks L2 for the first `pf_bytes` of the
    weight the next GEMM streams, so HBM works while the chain it sits in waits on
    latency. `pf` is the weight's bytes (uint8), in PF_CHUNK-byte chunks, in one of two forms
    (prefetch_args picks):
    - PF_CHUNKS > 0: each program PF_CHUNKS consecutive chunks, one bulk prefetch each
      (cp.async.bulk.prefetch, sm_90). Measured in round three: the grid does not complete,
      for its dependent's wait, until they land.
    - PF_CHUNKS = -1 (variant prefetch_lines): the chunks dealt out to the programs in turn,
      one `prefetch.global.L2` per 128-byte line spread over the threads: a hint on the
      load/store path that no instruction waits on.
    Fire and forget either way: no result and no effect on any value. Compiled out with
    PF_CHUNKS = 0 and under the interpreter."""
    if PF_CHUNKS > 0 and not INTERPRET_C:
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        offs = (pid * PF_CHUNKS + tl.arange(0, PF_CHUNKS)).to(tl.int64) * PF_CHUNK_C
        size = tl.minimum(tl.maximum(pf_bytes - offs, 0), PF_CHUNK_C).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; "
            "mov.u32 $0, 0; }",
            "=r,l,r", [pf + offs, size], dtype=tl.int32, is_pure=False, pack=1)
    if PF_CHUNKS < 0 and not INTERPRET_C:
        # Chunk c to program c mod nprog, a chunk's 128 lines per iteration (one per thread
        # at 4 warps). The bound is a runtime value: a constant per-program count was
        # unrolled at 128 chunks and spilled.
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        nprog = tl.num_programs(0) * tl.num_programs(1)
        lines = tl.arange(0, PF_CHUNK_C // 128).to(tl.int64) * 128
        for c in range(pid, tl.cdiv(pf_bytes, PF_CHUNK_C), nprog):
            offs = c.to(tl.int64) * PF_CHUNK_C + lines
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [pf + offs, (offs < pf_bytes).to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


_prefetch_lines = False


@contextmanager
def prefetch_lines(enabled: bool = True):
    """Kernels launched inside that prefetch the next GEMM's weight (prefetch:<MB>) do it in
    the line form (variant prefetch_lines; l2_prefetch). A launch-time choice, as
    early_trigger's."""
    global _prefetch_lines
    prev, _prefetch_lines = _prefetch_lines, enabled
    try:
        yield
    finally:
        _prefetch_lines = prev


def prefetch_args(weight, nbytes: int, programs: int, dummy) -> dict:
    """The kernel arguments of `l2_prefetch` for the first `nbytes` of `weight` (contiguous)
    split over `programs` programs; `weight=None` or nbytes <= 0: off (`dummy` fills the
    pointer). Sizes round down to 16 bytes, the bulk prefetch's granule. Inside
    `prefetch_lines` PF_CHUNKS is -1: the line form."""
    if weight is None or nbytes <= 0:
        return dict(pf=dummy, pf_bytes=0, PF_CHUNKS=0)
    assert weight.is_contiguous()
    nbytes = min(nbytes, weight.numel() * weight.element_size()) // 16 * 16
    # The line form deals the chunks out at run time: one specialisation (-1) for any size.
    chunks = -1 if _prefetch_lines else next_pow2(cdiv(cdiv(nbytes, PF_CHUNK), programs))
    return dict(pf=weight.view(-1).view(torch.uint8), pf_bytes=nbytes, PF_CHUNKS=chunks)


_trigger = PDL_LATE
_pdl_on = True


def pdl_launch() -> bool:
    """Whether launches go out PDL-style now: on a GPU, outside pdl_off."""
    return PDL and _pdl_on


def current_trigger() -> int:
    """The USE_PDL value launches take now (PDL_LATE, or as early_trigger / trigger_first set;
    PDL_OFF under the interpreter and inside pdl_off)."""
    return _trigger if pdl_launch() else PDL_OFF


@contextmanager
def pdl_off(enabled: bool = True):
    """Kernels launched inside go out as plain launches, their griddepcontrol compiled out
    (variant no_pdl: what PDL is worth, the control for k3trace whatif --no-pdl). Safe for
    every kernel: without PDL a launch starts once its producer has completed, so loads
    placed before the wait read finished data too."""
    global _pdl_on
    prev = _pdl_on
    if enabled:
        _pdl_on = False
    try:
        yield
    finally:
        _pdl_on = prev


@contextmanager
def early_trigger(enabled: bool = True):
    """Kernels launched inside trigger their dependents right after their wait (variant
    pdl_early_trigger; K3Decode.step opens it). A launch-time choice: each mode is its own
    compiled kernel, so models of both kinds can share a process."""
    global _trigger
    prev, _trigger = _trigger, (PDL_EARLY if enabled else PDL_LATE)
    try:
        yield
    finally:
        _trigger = prev


@contextmanager
def trigger_first(enabled: bool = True):
    """Kernels launched inside trigger their dependents before their own wait (variant
    pdl_trigger_first): the latency-bound kernels in front of a skinny GEMM, so that the GEMM
    launches, and asks L2 for its first weight rows (linear_prefetch), while they run."""
    global _trigger
    prev = _trigger
    if enabled:
        _trigger = PDL_FIRST
    try:
        yield
    finally:
        _trigger = prev


#: num_warps / num_stages by Triton kernel name, over what the launchers pass: how
#: bench_k3_step.py's `@launch=` tries them in the step (kernels/README.md, round twelve: a
#: config only the step can rank). Empty outside that bench.
LAUNCH_META: dict[str, dict[str, int]] = {}


def launch(kernel, grid, *args, delay_ns: int = 0, **meta) -> None:
    """Launch `kernel` PDL-style with the USE_PDL / DELAY_NS constexprs every K3 kernel takes."""
    if delay_ns < 0:
        raise ValueError("delay_ns must be >= 0")
    meta.update(LAUNCH_META.get(kernel.fn.__name__, {}))
    kernel[grid](*args, **meta, USE_PDL=current_trigger(),
                 DELAY_NS=int(delay_ns) if PDL else 0, launch_pdl=pdl_launch())
