"""bench/loaded_hop.py's stream: each program reads and sums its own slice, `reps` times.

The probe's loaded forms only load HBM (or L2) if every program reads a distinct slice of the
buffer, all of it; a kernel that skipped blocks or read one slice twice would stream fewer bytes
than the rate it prints. Under the interpreter (a CPU) the sums say which elements each program
read."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize("programs,reps,evict_first", [(4, 1, False), (3, 2, True), (8, 1, False)])
def test_each_program_sums_its_own_slice(bench_script, programs, reps, evict_first):
    lh = bench_script("loaded_hop")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n_per = lh.STREAM_BLOCK * 2  # two blocks: the loop over a slice is what is tested
    # Distinct integers per element (exact in bf16 up to 256): a slice's sum names its slice.
    vals = (torch.arange(programs * n_per) % 251).to(torch.bfloat16)
    buf = vals.to(dev)
    sums = torch.full((programs + 1,), -1.0, device=dev)
    lh.stream(buf, programs, sums, reps=reps, evict_first=evict_first)
    want = vals.float().view(programs, n_per).sum(1) * reps
    assert torch.equal(sums.cpu()[:programs], want)
    assert sums.cpu()[programs] == -1.0  # no program past the grid


def test_a_slice_that_is_not_whole_blocks_is_refused(bench_script):
    lh = bench_script("loaded_hop")
    buf = torch.zeros(3 * (lh.STREAM_BLOCK + 1), dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="whole blocks"):
        lh.stream(buf, 3, torch.zeros(3))


@pytest.mark.parametrize("stamps,loaded", [
    ([100, 200, 900, 50], True),    # the stream around the chain
    ([100, 200, 200, 100], True),   # touching at both ends
    ([100, 200, 150, 50], False),   # the stream ended inside the chain (round 22's first form)
    ([100, 200, 900, 150], False),  # the stream started after the chain did
    ([100, 200, 900, 0], False),    # the flag never turned: the lead timed out
])
def test_a_replay_counts_as_loaded_only_when_the_stream_spans_the_chain(bench_script, stamps, loaded):
    assert bench_script("loaded_hop").spans_the_chain(stamps) is loaded
