"""Shared fixtures: the bundled H200 recordings (scrubbed, xz-compressed SQLite exports in
k3trace/data) decompressed once per session, and the public samples beside the project."""

from __future__ import annotations

import lzma
import os
import shutil
from pathlib import Path

import pytest

# The commands wait for their cache writes (else a detached writer finishes them after the
# command returns, and a test reading the cache next would race it); test_detached_cache.py
# runs them without.
os.environ.setdefault("K3TRACE_CACHE_WAIT", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "k3trace" / "data"
SAMPLES = ROOT.parent / "shared" / "samples" / "nsys-public"


def bundled(name: str) -> Path:
    """Path of a bundled (compressed) recording, e.g. bundled("small_inside_a")."""
    path = DATA / f"{name}.sqlite.xz"
    if not path.exists():
        pytest.skip(f"bundled trace {name} is not in k3trace/data")
    return path


@pytest.fixture(scope="session")
def bench_script():
    """Name -> bench/<name>.py loaded as a module (the bench scripts are not a package)."""
    import importlib.util

    made = {}

    def get(name: str):
        if name not in made:
            spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
            made[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(made[name])
        return made[name]

    return get


@pytest.fixture(scope="session")
def trace_sqlite(tmp_path_factory):
    """Function name -> plain SQLite path of a bundled recording (decompressed once)."""
    folder = tmp_path_factory.mktemp("traces")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            out = folder / f"{name}.sqlite"
            with lzma.open(bundled(name)) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            out.chmod(0o444)  # tests must never write to an input
            made[name] = out
        return made[name]

    return get


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip("../shared/samples/nsys-public is not beside the project")
    return SAMPLES


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def analysis(trace_sqlite):
    """Function name -> the Analysis of a bundled recording (computed once per session)."""
    from k3trace.analyses import analyze
    from k3trace.config import load_config
    from k3trace.ingest import load_report

    made = {}

    def get(name: str):
        if name not in made:
            made[name] = analyze(load_report(trace_sqlite(name)), load_config())
        return made[name]

    return get


@pytest.fixture(scope="session")
def reference_of(trace_sqlite):
    """Function name -> tests/reference.py's plain-Python reading of a bundled recording (once per session)."""
    import reference  # tests/reference.py

    made = {}

    def get(name: str):
        if name not in made:
            made[name] = reference.compute(trace_sqlite(name))
        return made[name]

    return get
