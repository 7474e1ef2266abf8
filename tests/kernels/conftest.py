"""Kernel tests run compiled on a GPU and under the Triton interpreter on a CPU.

TRITON_INTERPRET must be set before triton is first imported, so it is decided here,
when pytest loads this directory, and only when no CUDA device is present.

Without torch or triton the test modules skip themselves (importorskip), except under
K3TRACE_KERNEL_TESTS=required (what `make test` sets): there a missing install fails the run.
"""

import os

import pytest

try:
    import torch
except ImportError:  # the test modules skip themselves via importorskip
    torch = None

if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _missing() -> list[str]:
    missing = [] if torch is not None else ["torch"]
    try:
        import triton  # noqa: F401
    except ImportError:
        missing.append("triton")
    return missing


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (H200 shapes); skipped on CPU")
    if os.environ.get("K3TRACE_KERNEL_TESTS") == "required" and _missing():
        raise pytest.UsageError(f"the kernel tests need {' and '.join(_missing())} (K3TRACE_KERNEL_TESTS=required); "
                                "install them with `make test` (torch 2.13.0 and triton 3.7.1, CPU builds)")
