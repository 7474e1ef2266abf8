"""Streams, event fork/join and NVTX ranges shared by the workloads.

The main stream is whatever stream is current when a step runs: under
`torch.cuda.graph` that is the capture stream, so it cannot be fixed up front.
On a CPU (Triton interpreter tests) every stream is one null stream and NVTX is off.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch


class _HostStream:
    """Stand-in stream for CPU runs: work is synchronous, so ordering is free."""

    def wait_stream(self, other) -> None:
        pass


_HOST = _HostStream()


@dataclass(frozen=True)
class Streams:
    aux1: object  # S1: MLA KV chain, MoE shared experts
    aux2: object  # S2: KDA gate GEMVs, MLA g_proj, cache staging
    aux3: object = _HOST  # S3: L2 prefetches of the next weight (variant prefetch_leg:<MB>)

    @classmethod
    def create(cls, device: str, side_priority: int = 0) -> "Streams":
        """`side_priority`: CUDA stream priority of S1 and S2 (negative: above main's 0);
        graph capture keeps it on their kernel nodes."""
        if torch.device(device).type != "cuda":
            return cls(_HOST, _HOST, _HOST)
        return cls(torch.cuda.Stream(device, priority=side_priority),
                   torch.cuda.Stream(device, priority=side_priority), torch.cuda.Stream(device))

    @property
    def main(self):
        return _HOST if self.aux1 is _HOST else torch.cuda.current_stream()


def on(stream):
    """`with on(s):` runs launches on stream `s` (nothing to switch on a CPU)."""
    return nullcontext() if stream is _HOST else torch.cuda.stream(stream)


def fork(main, side, *, enabled: bool):
    """Make `side` wait for `main`'s work so far; return the stream the forked leg runs on."""
    if not enabled:
        return main
    side.wait_stream(main)
    return side


def join(main, side, *, enabled: bool) -> None:
    """Make `main` wait for the forked leg (a no-op when the fork was off)."""
    if enabled and side is not main:
        main.wait_stream(side)


@contextmanager
def nvtx_range(name: str):
    # torch's own NVTX binding: the GPU machine has no `nvtx` package.
    if not torch.cuda.is_available():
        yield
        return
    # torch.profiler (Kineto) does not record NVTX: under it the same range is also a
    # record_function, which Kineto writes as a `user_annotation` on this thread.
    annotation = torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else None
    if annotation is not None:
        annotation.__enter__()
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
        if annotation is not None:
            annotation.__exit__(None, None, None)
