"""Kernel names as nsys (EDG) and torch.profiler (GNU) demangle them: one spelling for the
same kernel, distinct spellings for distinct kernels (k3trace/ingest/spelling.py)."""

from __future__ import annotations

import collections
import sqlite3
from pathlib import Path

import pytest

from k3trace.ingest.spelling import canonical
from test_kineto import FIXTURE, raw_events, replays

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "k3trace" / "data"
SAMPLES = ROOT.parent / "shared" / "samples" / "nsys-public"


def demangled_names(path) -> list[tuple[int, str, str]]:
    """(correlation id, demangled name, short name) of every kernel, in start order."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT k.correlationId, coalesce(d.value, s.value), s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "LEFT JOIN StringIds d ON d.id = k.demangledName LEFT JOIN StringIds s ON s.id = k.shortName "
            "ORDER BY k.start").fetchall()


def test_one_spelling_for_both_profilers(trace_sqlite):
    """The transformers Llama's replay under nsys and under torch.profiler, kernel by kernel
    in launch order (the same graph): the same short name at every position, most full names
    spelled differently, every pair spelled alike here."""
    by_replay = collections.defaultdict(list)
    for corr, full, short in demangled_names(trace_sqlite("hf_base_a")):
        by_replay[corr].append((full, short))
    nsys = max(by_replay.values(), key=len)
    kineto = [e["name"] for e in max(replays(raw_events(FIXTURE)), key=len)]
    assert len(nsys) == len(kineto) == 429

    def short(name: str) -> str:
        bare = name.replace("(anonymous namespace)::", "").removeprefix("void ")
        return bare.split("(")[0].split("<")[0].split("::")[-1]

    assert [s for _, s in nsys] == [short(n) for n in kineto]
    assert sum(full != other for (full, _), other in zip(nsys, kineto)) > 300
    assert [canonical(full) for full, _ in nsys] == [canonical(n) for n in kineto]


def test_no_two_kernels_of_a_trace_share_a_spelling(trace_sqlite):
    """Every bundled recording and public sample: as many spellings as distinct names."""
    paths = [trace_sqlite(p.name.removesuffix(".sqlite.xz")) for p in sorted(DATA.glob("*.sqlite.xz"))]
    paths += sorted(SAMPLES.glob("*.sqlite")) if SAMPLES.is_dir() else []
    names = 0
    for path in paths:
        distinct = {full for _, full, _ in demangled_names(path)}
        assert len({canonical(n) for n in distinct}) == len(distinct), path.name
        names += len(distinct)
    assert names > 1000


#: Kernels that differ in an element type, a vector width, a lambda instance or a boolean.
DIFFERENT = [
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctorOnSelf_add<float>, "
     "std::array<char *, (unsigned long)2>>(int, T2, T3)",
     "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctorOnSelf_add<long>, "
     "std::array<char *, (unsigned long)2>>(int, T2, T3)"),
    ("void k<(int)4>(int)", "void k<(int)2>(int)"),
    ("void f<[lambda() (instance 3)]>(T1)", "void f<[lambda() (instance 7)]>(T1)"),
    ("void g<(bool)0>(int)", "void g<(bool)1>(int)"),
]


@pytest.mark.parametrize("one, other", DIFFERENT)
def test_distinct_kernels_keep_distinct_spellings(one, other):
    assert canonical(one) != canonical(other)


def test_casts_suffixes_and_lambdas():
    assert canonical("void k<(unsigned long)2, (bool)1>(T1 *)") == canonical("void k<2ul, true>(float*)") == "k 2 true"
    assert canonical("void f<[lambda(float) (instance 2)]>(T1)") == canonical("void f<{lambda(float)#2}>(float)")
    for name in ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "triton_poi_fused_0", "gemv_kernel"):
        assert canonical(name) == name
