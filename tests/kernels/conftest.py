"""Kernel tests run compiled on a GPU and under the Triton interpreter on a CPU.

TRITON_INTERPRET must be set before triton is first imported, so it is decided here,
when pytest loads this directory, and only when no CUDA device is present.
"""

import os

try:
    import torch
except ImportError:  # the test modules skip themselves via importorskip
    torch = None

if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (H200 shapes); skipped on CPU")
