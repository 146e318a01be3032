"""Fixtures of the GPU tests (`make gpu-test`; every test there is marked `gpu` and skips without CUDA)."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture
def dev() -> torch.device:
    """The GPU, with torch seeded afresh for each test (fresh random inputs every run)."""
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return torch.device("cuda")
