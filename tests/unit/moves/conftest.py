"""Tests here run the Triton kernels in Triton's CPU interpreter (fp32, tiny shapes).

TRITON_INTERPRET is set before any kernel module is imported (the dispatchers import them
lazily), so the folder runs on a machine without a GPU. Without Triton installed, the Triton
cases are skipped and the PyTorch fallbacks are still checked against the reference.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator per test (its seed is printed, so a failure can be replayed)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")  # shown with the captured output of a failing test
    return torch.Generator().manual_seed(seed)
