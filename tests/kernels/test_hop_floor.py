"""bench/hop_floor.py's chain: each hop reads what the hop before it wrote.

The probe times chains of hop_kernel on the H200; what it times must be a chain of
dependent launches, or the per-hop figure would be a launch rate. Under the interpreter
(a CPU) the launches run in order: after n reading hops each program's value is n more
than it started; without the read, the last hop's program index."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize("hops", [1, 4, 7])
def test_each_hop_reads_its_producers_value(bench_script, hops):
    hf = bench_script("hop_floor")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bufs = (torch.arange(7, dtype=torch.int32, device=dev) * 10, torch.zeros(7, dtype=torch.int32, device=dev))
    hf.hop_chain(bufs, hops, 7, read=True)
    # Hop h writes buffer (h + 1) % 2; the last hop wrote buffer hops % 2.
    assert torch.equal(bufs[hops % 2].cpu(), torch.arange(7, dtype=torch.int32) * 10 + hops)


def test_without_the_read_each_hop_writes_its_program_index(bench_script):
    hf = bench_script("hop_floor")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bufs = tuple(torch.full((7,), -1, dtype=torch.int32, device=dev) for _ in range(2))
    hf.hop_chain(bufs, 2, 5, read=False)
    assert torch.equal(bufs[0].cpu()[:5], torch.arange(5, dtype=torch.int32))
    assert (bufs[0].cpu()[5:] == -1).all()  # programs past the grid wrote nothing


@pytest.mark.parametrize("hops", [1, 3, 7])
def test_chained_stages_read_their_neighbours_value(bench_script, hops):
    # The chained kernel's stages: stage h writes bufs[(h + 1) % 2][p] from bufs[h % 2] at
    # program (p + 1) % grid, plus 1; after `hops` stages each program holds the value that
    # started `hops` programs on, plus hops. (On a CPU one launch per stage; on a GPU one
    # launch with a grid barrier between stages, the same values.)
    hf = bench_script("hop_floor")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    grid = 7
    start = torch.arange(9, dtype=torch.int32) * 10
    bufs = torch.stack([start, torch.full((9,), -1, dtype=torch.int32)]).to(dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    hf.chained(bufs, counter, hops, grid)
    want = torch.tensor([int(start[(p + hops) % grid]) + hops for p in range(grid)], dtype=torch.int32)
    assert torch.equal(bufs[hops % 2].cpu()[:grid], want)
    assert (bufs.cpu()[:, grid:] == torch.stack([start[grid:], torch.full((2,), -1, dtype=torch.int32)])).all()
